//! `metav1.Status` answers. Every error the gateway produces reaches the client as a Status with
//! the right code and reason, so kubectl prints a message a person can act on instead of
//! "the server is currently unable to handle the request".

use http::{header, HeaderValue, StatusCode};
use serde::Serialize;

use crate::body::{full, Response};

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    message: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a StatusDetails>,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

/// Kubernetes' reason for a status code (apimachinery's `StatusReason` table).
pub fn reason_for(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

pub fn status_json(code: StatusCode, message: &str, details: Option<&StatusDetails>) -> Vec<u8> {
    serde_json::to_vec(&StatusBody {
        kind: "Status",
        api_version: "v1",
        metadata: Empty {},
        status: "Failure",
        message,
        reason: reason_for(code),
        details,
        code: code.as_u16(),
    })
    .expect("a Status always serializes")
}

/// A Status response; `Retry-After` mirrors `retryAfterSeconds` as kube-apiserver does.
pub fn status_response(
    code: StatusCode,
    message: &str,
    details: Option<StatusDetails>,
) -> Response {
    let retry = details.as_ref().and_then(|d| d.retry_after_seconds);
    let mut resp = Response::new(full(status_json(code, message, details.as_ref())));
    *resp.status_mut() = code;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    if let Some(secs) = retry {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

pub fn service_unavailable(message: &str, retry_after_seconds: Option<u32>) -> Response {
    let details = retry_after_seconds.map(|s| StatusDetails {
        retry_after_seconds: Some(s),
        ..Default::default()
    });
    status_response(StatusCode::SERVICE_UNAVAILABLE, message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_has_kubernetes_shape() {
        let v: serde_json::Value = serde_json::from_slice(&status_json(
            StatusCode::SERVICE_UNAVAILABLE,
            "core down",
            None,
        ))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"core down","reason":"ServiceUnavailable","code":503})
        );
    }

    #[test]
    fn retry_after_is_mirrored_in_a_header() {
        let resp = service_unavailable("wait", Some(5));
        assert_eq!(resp.headers()[header::RETRY_AFTER], "5");
    }
}
