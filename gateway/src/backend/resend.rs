//! Sending a request again when the server refused it unprocessed.
//!
//! A Go server (kube-apiserver, sample-apiserver, every k8s.io/apiserver backend) closes busy
//! HTTP/2 connections with a GOAWAY; the streams above its last stream id were never processed,
//! and a request queued on the closing connection was never sent. Go's transport sends those
//! again on another connection, so kube-aggregator's callers never see them; without that, every
//! such close turned the requests in flight into 503s (1 898 of about 10 000 flunders lists
//! under 32 anonymous connections, before anonymous callers moved to HTTP/1.1). Only requests no server acts on twice are sent again: safe methods with an empty
//! body.

use std::error::Error;

use crate::body::{self, Request};

/// Sends of one request at most: a server restarting its connections one after another refuses
/// a stream on each at most once.
pub const MAX_ATTEMPTS: usize = 5;

/// A copy of `req` to send again if it is refused: only for safe methods (GET, HEAD, ...) with
/// nothing in the body. The headers are copied up front because sending consumes the request.
pub fn resendable(req: &Request) -> Option<Request> {
    if !req.method().is_safe() || !http_body::Body::is_end_stream(req.body()) {
        return None;
    }
    let mut copy = Request::new(body::empty());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

/// Whether `e` (or an error it wraps) says the server never processed the request (RFC 9113
/// §6.8, §8.7): hyper cancelled it before sending (its connection closed first), the server's
/// GOAWAY refused its stream (a safe request cut by the close that follows may be sent again
/// too), or the server reset it with REFUSED_STREAM.
pub fn refused_unprocessed(e: &(dyn Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return (h2.is_go_away() && h2.is_remote())
                || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_requests_without_a_body_are_sent_again() {
        let mut get = http::Request::get("https://127.0.0.1:1/apis/x")
            .body(body::empty())
            .unwrap();
        get.headers_mut()
            .insert("x-remote-user", http::HeaderValue::from_static("alice"));
        let copy = resendable(&get).expect("a GET without a body");
        assert_eq!(copy.uri(), get.uri());
        assert_eq!(copy.headers()["x-remote-user"], "alice");
        let post = http::Request::post("https://127.0.0.1:1/apis/x")
            .body(body::empty())
            .unwrap();
        assert!(resendable(&post).is_none(), "a POST may have been acted on");
        let get_with_body = http::Request::get("https://127.0.0.1:1/apis/x")
            .body(body::full("{}"))
            .unwrap();
        assert!(resendable(&get_with_body).is_none());
    }
}
