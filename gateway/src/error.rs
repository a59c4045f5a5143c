//! The errors the request path can produce, and the one place that turns any of them into a
//! `metav1.Status` answer (the *rescue* step at the top of the stack).

use std::time::Duration;

use http::StatusCode;

use crate::body::{BoxError, Response};
use crate::status::{status_response, StatusDetails};

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the core server at {url} is unreachable: {}", chain(.source.as_ref()))]
    CoreUnavailable {
        url: String,
        #[source]
        source: BoxError,
    },
    #[error("{api_service}: backend unavailable: {reason}")]
    BackendUnavailable { api_service: String, reason: String },
    #[error("{api_service}: the backend attempted to redirect this request ({status} with a Location), which is not permitted (--aggregator-reject-forwarding-redirect)")]
    BackendRedirect { api_service: String, status: u16 },
    #[error("the request has been made before all known HTTP paths have been installed, please try again")]
    RoutesNotReady,
    #[error("the request did not complete within {}s; retry, or narrow it (e.g. a smaller ?limit=)", .0.as_secs())]
    Timeout(Duration),
    #[error("too many requests in flight ({kind}), please try again later")]
    TooManyRequests { kind: &'static str },
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("the gateway is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Internal(String),
}

/// `a: b: c` from an error and its sources, the way Go errors read in kube's messages.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

impl GatewayError {
    pub fn code(&self) -> StatusCode {
        match self {
            Self::CoreUnavailable { .. }
            | Self::BackendUnavailable { .. }
            | Self::RoutesNotReady
            | Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::BackendRedirect { .. } => StatusCode::BAD_GATEWAY,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn retry_after(&self) -> Option<u32> {
        match self {
            Self::RoutesNotReady => Some(5),
            Self::TooManyRequests { .. } => Some(1),
            Self::ShuttingDown => Some(1),
            _ => None,
        }
    }

    pub fn into_response(self) -> Response {
        let details = self.retry_after().map(|s| StatusDetails {
            retry_after_seconds: Some(s),
            ..Default::default()
        });
        status_response(self.code(), &self.to_string(), details)
    }
}

/// Turns whatever error reached the top of the stack into a Status.
pub fn rescue(err: BoxError) -> Response {
    let err = match err.downcast::<GatewayError>() {
        Ok(e) => return e.into_response(),
        Err(e) => e,
    };
    tracing::error!(error = %chain(err.as_ref()), "unexpected error on the request path");
    GatewayError::Internal(format!("internal error: {}", chain(err.as_ref()))).into_response()
}
