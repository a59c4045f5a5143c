//! Answers from prepared bytes with their ETag: `200` with the body, or `304` without it when the
//! client's `If-None-Match` names the ETag. The documents the gateway serves (discovery, OpenAPI)
//! are prepared off the request path by the control side; this is how each request answers them.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;

use crate::body::{self, Response};

/// Whether `If-None-Match` names exactly this ETag (kube compares the raw header string).
pub fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
}

/// A prepared document with its ETag: 200 with the body, or 304 without when the client
/// already has it. `vary` adds `Vary: Accept` and `Cache-Control: public` (the discovery
/// documents, which have several representations).
pub fn prepared(
    request: &HeaderMap,
    content_type: &'static str,
    body: &Bytes,
    etag: &str,
    vary: bool,
) -> Response {
    let matched = not_modified(request, etag);
    let mut resp = if matched {
        let mut r = Response::new(body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(body::full(body.clone()))
    };
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The ETag comes from `etag_for` (quoted hex), always a valid header value.
    if let Ok(v) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, v);
    }
    if vary {
        headers.insert(header::VARY, HeaderValue::from_static("Accept"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    }
    resp
}
