//! When a request that failed on its way to a backend is sent again, and what it is sent from.
//!
//! kube-aggregator's users lose requests the backend never saw (kubernetes#141318, #135285):
//! Go's transport hides some of it, not all. Here a failure is sorted by what the backend can
//! have done with the request ([`Failure`]):
//! * **Unprocessed**: it never reached the backend, or the backend says it did not act on it: no
//!   connection could be made, the stream was above the last one a GOAWAY accepted (RFC 9113
//!   §6.8), it was reset with REFUSED_STREAM (§8.7), or hyper cancelled it before writing it.
//!   Any method is sent again, on another connection (and another endpoint when there is one).
//!   A server restarting its connections one after another may refuse one stream on each, so
//!   this happens up to [`MAX_ATTEMPTS`] times.
//! * **After sending**: the connection failed before the response headers (reset, closed, a
//!   ping unanswered). The backend may have acted, so only a request it can act on twice
//!   without harm is sent again, once: safe methods (GET, HEAD, OPTIONS, TRACE), as Go's
//!   transport does. PUT and DELETE are idempotent in HTTP's sense, but a DELETE sent twice
//!   answers 404 to a delete that worked, so they are not.
//! * **Not the backend's doing**: the caller's own body failed, or the pool had no free stream.
//!
//! Sending again needs the request again, and hyper consumes it: [`Replay`] keeps its head and,
//! for a body of at most [`REPLAY_BODY_LIMIT`] bytes with a declared length, the body itself,
//! read before the first attempt, within [`REPLAY_BODY_TIMEOUT`]. Longer or streamed bodies are
//! sent once, and so is the body of a watch or another long-running request: nothing of theirs
//! is held back waiting for a body (a watch that waited would hold the caller's connection and
//! the backend's stream for as long as the caller cared to withhold it).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use apiservice::resolve::Endpoint;
use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, Method, Uri, Version};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::pool::{self, refused_unprocessed, PoolError};
use crate::body::{self, Request};
use crate::error::GatewayError;

/// Sends of one request at most.
pub const MAX_ATTEMPTS: usize = 5;

/// The largest body kept to be sent again: kube objects are mostly a few KiB; a larger body is
/// not held in memory for a retry that rarely comes.
pub const REPLAY_BODY_LIMIT: u64 = 64 * 1024;

/// How long a body kept for sending again may take to arrive. The request's own timeout bounds
/// it too, but a caller trickling a small body would otherwise hold its priority-and-fairness
/// seats and a request slot for all of it with nothing sent on; 64 KiB in 10 s is a slow link.
pub const REPLAY_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What a failed attempt says about the backend and the request; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The backend never acted on the request, and was not at fault (it refused politely).
    Refused,
    /// The request never reached the backend because the endpoint could not be reached.
    Unreachable,
    /// The connection failed after the request was written, before the response headers.
    AfterSending,
    /// Not the endpoint's doing: the caller's body failed, or the pool was full.
    NotTheBackend,
}

// === impl PoolError ===

impl PoolError {
    /// What this failure says about the backend and the request, which decides whether it is
    /// sent again (see [`Attempts::again`]).
    pub fn failure(&self) -> Failure {
        match self {
            PoolError::Exhausted { .. } => Failure::NotTheBackend,
            PoolError::Connect(_) | PoolError::NoConnection { .. } => Failure::Unreachable,
            PoolError::Upgrade(e) if e.is_connect() => Failure::Unreachable,
            _ if caused_by_request_body(self) => Failure::NotTheBackend,
            PoolError::Upgrade(e) if refused_unprocessed(e) => Failure::Refused,
            PoolError::Request(e) if refused_unprocessed(e) => Failure::Refused,
            PoolError::Upgrade(_) | PoolError::Request(_) => Failure::AfterSending,
        }
    }
}

// === impl Failure ===

impl Failure {
    /// Whether the endpoint it happened on counts it against its health (see `balance`).
    pub fn is_endpoint_failure(self) -> bool {
        matches!(self, Self::Unreachable | Self::AfterSending)
    }

    /// Whether a request with `method` may be sent again after this failure.
    pub fn may_send_again(self, method: &Method) -> bool {
        match self {
            Self::Refused | Self::Unreachable => true,
            Self::AfterSending => is_replayable_after_sending(method),
            Self::NotTheBackend => false,
        }
    }
}

/// The attempts of one request so far, and what they allow next (see the module docs).
pub struct Attempts {
    method: Method,
    made: usize,
    started: Instant,
    /// Set at the first failure: every attempt after it must have its connection by then, so a
    /// frozen backend costs a request at most `DIAL_TIMEOUT` of dialing in all, or the PING that
    /// found its connection dead and `RETRY_DIAL_BUDGET` (see the README).
    dial_deadline: Option<Instant>,
    /// Endpoints no connection could be made to within this request, or whose kept connection
    /// failed: not tried again.
    unreachable: Vec<Authority>,
    sent_again_after_sending: bool,
}

// === impl Attempts ===

impl Attempts {
    pub fn new(method: Method) -> Self {
        Self {
            method,
            made: 0,
            started: Instant::now(),
            dial_deadline: None,
            unreachable: Vec::new(),
            sent_again_after_sending: false,
        }
    }

    /// How many attempts have failed.
    pub fn failed(&self) -> usize {
        self.made
    }

    /// By when the next attempt must have its connection (none before the first failure).
    pub fn dial_deadline(&self) -> Option<Instant> {
        self.dial_deadline
    }

    /// After an attempt on `endpoint` failed with `failure`: whether the request may be sent
    /// again, on one of `endpoints` not found unreachable. `frozen`: the endpoint's kept
    /// connection failed too, so no new connection to it would be answered either.
    pub fn again(
        &mut self,
        failure: Failure,
        endpoint: &Authority,
        frozen: bool,
        endpoints: &[Endpoint],
    ) -> bool {
        self.made += 1;
        let deadline = *self.dial_deadline.get_or_insert_with(|| {
            (Instant::now() + pool::RETRY_DIAL_BUDGET).min(self.started + pool::DIAL_TIMEOUT)
        });
        if failure == Failure::Unreachable || frozen {
            self.unreachable.push(endpoint.clone());
        }
        let another = endpoints
            .iter()
            .filter_map(|e| e.authority().parse::<Authority>().ok())
            .any(|a| !self.unreachable.contains(&a));
        let again = self.made < MAX_ATTEMPTS
            && another
            && Instant::now() < deadline
            && failure.may_send_again(&self.method)
            && !(failure == Failure::AfterSending && self.sent_again_after_sending);
        self.sent_again_after_sending |= again && failure == Failure::AfterSending;
        again
    }
}

/// Safe methods: a backend that acted on one has changed nothing.
fn is_replayable_after_sending(method: &Method) -> bool {
    method.is_safe()
}

/// What a request is sent again from: its head, and its body when it was kept.
pub struct Replay {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

// === impl Replay ===

impl Replay {
    /// `req` ready to send, and a copy to send again, unless its body is too long to keep (or
    /// of unknown length), or it is `long_running` (a watch) with a body at all. A body kept is
    /// read here, before the first attempt, within [`REPLAY_BODY_TIMEOUT`].
    pub async fn keep(
        req: Request,
        long_running: bool,
    ) -> Result<(Request, Option<Replay>), GatewayError> {
        let declared = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let empty = http_body::Body::is_end_stream(req.body());
        if !empty && (long_running || declared.is_none_or(|n| n > REPLAY_BODY_LIMIT)) {
            return Ok((req, None));
        }
        let (parts, body) = req.into_parts();
        let bytes = if empty {
            Bytes::new()
        } else {
            tokio::time::timeout(REPLAY_BODY_TIMEOUT, body.collect())
                .await
                .map_err(|_| GatewayError::RequestBodyTimeout(REPLAY_BODY_TIMEOUT))?
                .map_err(|e| GatewayError::BadRequest(format!("reading the request body: {e}")))?
                .to_bytes()
        };
        let replay = Replay {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            body: bytes.clone(),
        };
        let body = if bytes.is_empty() {
            body::empty()
        } else {
            body::full(bytes)
        };
        Ok((Request::from_parts(parts, body), Some(replay)))
    }

    /// Another copy of the request.
    pub fn request(&self) -> Request {
        let body = if self.body.is_empty() {
            body::empty()
        } else {
            body::full(self.body.clone())
        };
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// `req` with its body watched: [`CallerBody::failure`] tells afterwards whether the caller's
/// body failed while it was being sent. hyper's HTTP/2 client reports such a failure as a reset
/// of its own stream, which reads like the backend's connection failing after sending, so the
/// error alone cannot tell the caller's doing from the backend's.
pub fn watch_body(req: Request) -> (Request, CallerBody) {
    // A body already at its end cannot fail: nothing to watch, nothing to allocate.
    if http_body::Body::is_end_stream(req.body()) {
        return (req, CallerBody(None));
    }
    let seen = Arc::new(std::sync::OnceLock::new());
    let failure = CallerBody(Some(seen.clone()));
    let req = req.map(|inner| body::boxed(Watched { inner, seen }));
    (req, failure)
}

/// What [`watch_body`] saw of the caller's body (`None`: it had none to watch).
#[derive(Clone)]
pub struct CallerBody(Option<Arc<std::sync::OnceLock<String>>>);

impl CallerBody {
    /// Why the caller's body failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.0.as_ref()?.get().map(String::as_str)
    }
}

pin_project_lite::pin_project! {
    struct Watched {
        #[pin]
        inner: body::Body,
        seen: Arc<std::sync::OnceLock<String>>,
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, body::BoxError>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if let std::task::Poll::Ready(Some(Err(e))) = &frame {
            let _ = this.seen.set(crate::error::chain(e.as_ref()));
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A copy of `req` to send again if it is refused, for a safe request with no body (the core's
/// path, which sends to one address and keeps no body).
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

/// Whether a transport error came from the request body the caller sent (it failed, or was
/// aborted), rather than from the backend's side of the connection.
pub fn caused_by_request_body(e: &PoolError) -> bool {
    if let PoolError::Request(h) = e {
        return h.is_user() || h.is_body_write_aborted();
    }
    let mut source = Error::source(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_user() || h.is_body_write_aborted();
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_requests_without_a_body_are_resendable() {
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
    }

    #[tokio::test]
    async fn a_small_body_is_kept_and_a_long_or_streamed_one_is_not() {
        let post = |body: &'static str, length: Option<usize>| {
            let mut b = http::Request::post("https://127.0.0.1:1/apis/x");
            if let Some(n) = length {
                b = b.header("content-length", n);
            }
            b.body(body::full(body)).unwrap()
        };
        let (req, replay) = Replay::keep(post("{\"a\":1}", Some(7)), false)
            .await
            .unwrap();
        let replay = replay.expect("a 7-byte body is kept");
        let first = req.into_body().collect().await.unwrap().to_bytes();
        let again = replay.request();
        assert_eq!(again.method(), Method::POST);
        let second = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            (&first[..], &second[..]),
            (&b"{\"a\":1}"[..], &b"{\"a\":1}"[..])
        );
        let (_, replay) = Replay::keep(post("{}", None), false).await.unwrap();
        assert!(
            replay.is_none(),
            "a body of unknown length is streamed once"
        );
        let long = (REPLAY_BODY_LIMIT + 1) as usize;
        let (_, replay) = Replay::keep(post("{}", Some(long)), false).await.unwrap();
        assert!(replay.is_none(), "a body over the limit is streamed once");
        let (_, replay) = Replay::keep(post("{}", Some(2)), true).await.unwrap();
        assert!(
            replay.is_none(),
            "a long-running request's body is streamed once"
        );
    }

    /// Issue 39, row 1: a watch declaring a body it never sends was held before anything was
    /// sent, with no deadline; now a watch's body is never waited for, and an ordinary
    /// request's small body has [`REPLAY_BODY_TIMEOUT`] to arrive.
    #[tokio::test(start_paused = true)]
    async fn no_body_is_waited_for_without_a_deadline() {
        let withheld = || {
            http::Request::get("https://127.0.0.1:1/apis/x?watch=1")
                .header("content-length", "10")
                .body(body::boxed(http_body_util::StreamBody::new(
                    futures::stream::pending::<Result<http_body::Frame<Bytes>, body::BoxError>>(),
                )))
                .unwrap()
        };
        let started = tokio::time::Instant::now();
        let (req, replay) = Replay::keep(withheld(), true).await.unwrap();
        assert!(replay.is_none());
        assert_eq!(started.elapsed(), Duration::ZERO, "a watch is sent at once");
        drop(req);
        let err = Replay::keep(withheld(), false).await.err().unwrap();
        assert_eq!(started.elapsed(), REPLAY_BODY_TIMEOUT);
        assert_eq!(err.code(), http::StatusCode::REQUEST_TIMEOUT);
        assert!(
            err.to_string().contains("did not arrive within 10s"),
            "{err}"
        );
        // A watch without a body can still be sent again when a backend refuses it.
        let watch = http::Request::get("https://127.0.0.1:1/apis/x?watch=1")
            .body(body::empty())
            .unwrap();
        assert!(Replay::keep(watch, true).await.unwrap().1.is_some());
    }

    #[test]
    fn only_refusals_and_unreachable_endpoints_resend_any_method() {
        let refused = Failure::Refused;
        let unreachable = PoolError::Connect("refused".into()).failure();
        assert_eq!(unreachable, Failure::Unreachable);
        for f in [refused, unreachable] {
            assert!(f.may_send_again(&Method::POST));
            assert!(f.may_send_again(&Method::DELETE));
        }
        let after = Failure::AfterSending;
        assert!(after.may_send_again(&Method::GET));
        assert!(!after.may_send_again(&Method::POST));
        assert!(!after.may_send_again(&Method::DELETE));
        assert!(!Failure::NotTheBackend.may_send_again(&Method::GET));
        assert!(!refused.is_endpoint_failure());
        assert!(after.is_endpoint_failure() && unreachable.is_endpoint_failure());
    }

    #[tokio::test]
    async fn a_caller_body_that_fails_midway_is_noticed() {
        let frames = futures::stream::iter([
            Ok::<_, body::BoxError>(http_body::Frame::data(Bytes::from_static(b"{\"a\":"))),
            Err("stream error received: unexpected end of body".into()),
        ]);
        let req = http::Request::post("https://127.0.0.1:1/apis/x")
            .body(body::boxed(http_body_util::StreamBody::new(frames)))
            .unwrap();
        let (req, caller) = watch_body(req);
        assert_eq!(caller.failure(), None);
        assert!(req.into_body().collect().await.is_err());
        assert_eq!(
            caller.failure(),
            Some("stream error received: unexpected end of body")
        );
        // A body that ends well is nobody's failure.
        let (req, caller) = watch_body(http::Request::new(body::full("{}")));
        req.into_body().collect().await.unwrap();
        assert_eq!(caller.failure(), None);
    }
}
