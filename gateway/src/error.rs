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
    #[error("{api_service}: backend unavailable: {cause}")]
    BackendUnavailable {
        api_service: String,
        #[source]
        cause: Unreachable,
    },
    #[error("{api_service}: the backend attempted to redirect this request ({status} with a Location), which is not permitted (--aggregator-reject-forwarding-redirect)")]
    BackendRedirect { api_service: String, status: u16 },
    #[error("the request has been made before all known HTTP paths have been installed, please try again")]
    RoutesNotReady,
    #[error("the request did not complete within {}s; retry, or narrow it (e.g. a smaller ?limit=)", .0.as_secs())]
    Timeout(Duration),
    #[error("the request body did not arrive within {}s of its headers; send the whole body its Content-Length declares without pausing", .0.as_secs())]
    RequestBodyTimeout(Duration),
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

/// Why no backend of an aggregated APIService answered: kept typed, as the error's source,
/// until [`GatewayError::into_response`] words it (the words are kube-aggregator's where it has
/// them).
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    /// The APIService takes no requests: its spec is broken, or its availability check failed.
    #[error("{0}")]
    NotAvailable(String),
    /// Its Service did not resolve (not present, no port, no ready endpoint).
    #[error(transparent)]
    Resolve(#[from] apiservice::resolve::ResolveError),
    /// No endpoint could be picked, or the one picked has no valid address.
    #[error("{0}")]
    Pick(#[source] BoxError),
    /// The backend did not answer within one of the gateway's own bounds.
    #[error("{what} did not answer within {}s", .after.as_secs())]
    Timeout { what: String, after: Duration },
    /// No connection or stream could be had within its wait (every stream busy, connecting
    /// failed for the requests before this one).
    #[error("{0}")]
    Pool(#[source] BoxError),
    /// The request failed in transport: connect or TLS refused, the connection reset or closed.
    #[error("error trying to reach service: {}", chain(.0.as_ref()))]
    Transport(#[source] BoxError),
}

/// `a: b: c` from an error and its sources, the way Go errors read in kube's messages.
pub use apiservice::outage::chain;

/// What a caller can check when the core does not answer: the flag, never the address (these
/// answers reach unauthenticated callers; the log has the URL).
const CHECK_THE_CORE: &str = "check that the core server is running and that --core-url names it";

/// The answer to a request that needed the core while it did not answer: what failed and what
/// to check, without the core's address.
pub fn core_unreachable(cause: &str) -> String {
    without_addresses(&format!(
        "the core server (--core-url) is unreachable: {cause}; {CHECK_THE_CORE}"
    ))
}

/// What a caller reads about a failed call of the gateway's kube client to the core (a
/// TokenReview, a SubjectAccessReview): [`core_unreachable`] when the core did not answer,
/// otherwise the error without addresses.
pub fn kube_client_message(err: &kube::Error) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(gateway) = e.downcast_ref::<GatewayError>() {
            return gateway.public_message();
        }
        cur = e.source();
    }
    without_addresses(&err.to_string())
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
            Self::RequestBodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
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

    /// kube's `apiserver_request_terminations_total` counts what the server refused in
    /// self-defense (too busy, too slow, too large) and what the aggregator could not proxy;
    /// `None` for every other error.
    fn termination(&self) -> Option<Terminated> {
        match self {
            Self::Timeout(_)
            | Self::RequestBodyTimeout(_)
            | Self::TooManyRequests { .. }
            | Self::BodyTooLarge { .. }
            | Self::BackendUnavailable { .. }
            | Self::BackendRedirect { .. } => Some(Terminated),
            _ => None,
        }
    }

    /// What the caller reads: the error without the addresses it may name (the core's URL, a
    /// backend's endpoint). The log line written where the error happened keeps them.
    pub fn public_message(&self) -> String {
        match self {
            Self::CoreUnavailable { source, .. } => core_unreachable(&chain(source.as_ref())),
            other => without_addresses(&other.to_string()),
        }
    }

    pub fn into_response(self) -> Response {
        let details = self.retry_after().map(|s| StatusDetails {
            retry_after_seconds: Some(s),
            ..Default::default()
        });
        let terminated = self.termination();
        let mut resp = status_response(self.code(), &self.public_message(), details);
        if let Some(t) = terminated {
            resp.extensions_mut().insert(t);
        }
        resp
    }
}

/// Set on a response the gateway answered itself with an error kube counts as a termination
/// (see `GatewayError::termination`); read by the request metrics.
#[derive(Clone, Copy, Debug)]
pub struct Terminated;

/// What stands in for an address in a message.
const ADDRESS: &str = "<address>";

/// `message` with every network address replaced by `<address>`: the scheme and authority of a
/// URL (`https://10.0.0.7:8443/apis/x` keeps its path: `<address>/apis/x`), and IP addresses
/// with or without a port (`dial tcp 10.0.0.7:8443: ...`). Error bodies and health answers reach
/// unauthenticated callers, who learn from them which APIService or check failed and why, but
/// not where the gateway's backends and core live. Service DNS names (`api.wardle.svc`) stay:
/// they come from the APIService, not from the network.
pub fn without_addresses(message: &str) -> String {
    let mut urls_out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("://") {
        let scheme_start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let after = &rest[at + 3..];
        let authority_len = after
            .find(|c: char| c == '/' || c == '"' || c == '\'' || c == ')' || c.is_whitespace())
            .unwrap_or(after.len());
        if scheme_start == at {
            // No scheme before "://": not a URL.
            urls_out.push_str(&rest[..at + 3]);
        } else {
            urls_out.push_str(&rest[..scheme_start]);
            urls_out.push_str(ADDRESS);
        }
        rest = &after[if scheme_start == at { 0 } else { authority_len }..];
    }
    urls_out.push_str(rest);

    // Bare IP addresses and socket addresses, token by token.
    let mut out = String::with_capacity(urls_out.len());
    let is_separator =
        |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | ')' | ',' | ';' | '=');
    let mut token_start = None;
    let flush = |out: &mut String, token: &str| {
        // "10.0.0.7:8443:" (Go's "dial tcp 10.0.0.7:8443: connect: ...") keeps its colon.
        let (core, tail) = match token.strip_suffix(':') {
            Some(t) => (t, ":"),
            None => (token, ""),
        };
        if core.parse::<std::net::SocketAddr>().is_ok() || core.parse::<std::net::IpAddr>().is_ok()
        {
            out.push_str(ADDRESS);
            out.push_str(tail);
        } else {
            out.push_str(token);
        }
    };
    for (i, c) in urls_out.char_indices() {
        if is_separator(c) {
            if let Some(start) = token_start.take() {
                flush(&mut out, &urls_out[start..i]);
            }
            out.push(c);
        } else if token_start.is_none() {
            token_start = Some(i);
        }
    }
    if let Some(start) = token_start {
        flush(&mut out, &urls_out[start..]);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_taken_out_of_messages() {
        let cases = [
            (
                "failing or missing response from https://10.0.0.7:8443/apis/wardle.example.com/v1alpha1: Get \"https://10.0.0.7:8443/apis/wardle.example.com/v1alpha1\": dial tcp 10.0.0.7:8443: connect: connection refused",
                "failing or missing response from <address>/apis/wardle.example.com/v1alpha1: Get \"<address>/apis/wardle.example.com/v1alpha1\": dial tcp <address>: connect: connection refused",
            ),
            (
                "core server at http://127.0.0.1:8080 answered /readyz with 500",
                "core server at <address> answered /readyz with 500",
            ),
            ("dial [::1]:443 failed", "dial <address> failed"),
            ("endpoint 10.96.0.10 is gone", "endpoint <address> is gone"),
            (
                "certificate not valid for api.wardle.svc (UnknownIssuer)",
                "certificate not valid for api.wardle.svc (UnknownIssuer)",
            ),
            ("v1.wardle: 503 at 12:30", "v1.wardle: 503 at 12:30"),
            ("odd ://thing", "odd ://thing"),
        ];
        for (message, want) in cases {
            assert_eq!(without_addresses(message), want, "{message}");
        }
    }

    #[test]
    fn a_core_outage_answers_without_the_core_url() {
        let err = GatewayError::CoreUnavailable {
            url: "http://10.1.2.3:8080".into(),
            source: "tcp connect error: Connection refused".into(),
        };
        assert!(err.to_string().contains("10.1.2.3"), "the log keeps it");
        assert_eq!(
            err.public_message(),
            "the core server (--core-url) is unreachable: tcp connect error: Connection refused; \
             check that the core server is running and that --core-url names it"
        );
    }

    #[test]
    fn a_kube_client_call_the_core_did_not_answer_names_the_flag() {
        let err = kube::Error::Service(Box::new(GatewayError::CoreUnavailable {
            url: "http://10.1.2.3:8080".into(),
            source: "tcp connect error: Connection refused".into(),
        }));
        let message = kube_client_message(&err);
        assert!(
            message.starts_with("the core server (--core-url) is unreachable: tcp connect error")
                && message.ends_with("--core-url names it")
                && !message.contains("10.1.2.3"),
            "{message}"
        );
        let other = kube::Error::Service("answered http://10.1.2.3:8080 with nonsense".into());
        assert_eq!(
            kube_client_message(&other),
            "ServiceError: answered <address> with nonsense"
        );
    }
}
