//! One body type for the whole request path. Boxing costs an allocation per message, but it lets
//! every layer, the core client and the remote clients share one `Request`/`Response` type. It is
//! a newtype rather than an alias so that service bounds name a plain struct (rustc cannot prove
//! `Send` for futures generic over a type that has a `dyn Error` inside). Beside it, the boxed
//! future the services return.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
pub type Request = http::Request<Body>;
pub type Response = http::Response<Body>;
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pub struct Body(UnsyncBoxBody<Bytes, BoxError>);

// === impl Body ===

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

impl Default for Body {
    fn default() -> Self {
        empty()
    }
}

pub fn empty() -> Body {
    Body(Empty::new().map_err(|never| match never {}).boxed_unsync())
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Body(
        Full::new(bytes.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    )
}

/// Any hyper/http-body body, boxed with its error erased.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body(body.map_err(Into::into).boxed_unsync())
}

/// `body`, boxed, holding `guard` until the body is finished or dropped: whatever the guard
/// releases on drop (an in-flight slot, a pending audit event) lasts as long as the response
/// streams, not just until its headers are sent.
pub fn with_guard<B, G>(body: B, guard: G) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    G: Send + 'static,
{
    boxed(Guarded { inner: body, guard })
}

/// `body` without its trailers: data frames pass, trailer frames (HTTP/1.1 chunked trailers,
/// HTTP/2 trailing HEADERS) are dropped. A client's trailers are headers the gateway never
/// inspected, so forwarding them would let `X-Remote-User`, `Impersonate-*` or `Authorization`
/// reach a backend after the identity checks; Go's reverse proxy forwards them, the gateway does
/// not. A body that is already complete (most GETs) is returned as it is.
pub fn without_trailers(body: Body) -> Body {
    if http_body::Body::is_end_stream(&body) {
        return body;
    }
    boxed(WithoutTrailers { inner: body })
}

pin_project_lite::pin_project! {
    struct WithoutTrailers<B> {
        #[pin]
        inner: B,
    }
}

// === impl WithoutTrailers ===

impl<B: http_body::Body> http_body::Body for WithoutTrailers<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut inner = self.project().inner;
        loop {
            match std::task::ready!(inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) if frame.is_trailers() => {
                    tracing::debug!("request trailers dropped");
                }
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `body`, failing with `timed_out` if it has not ended by `deadline`: a bound on a whole
/// exchange rather than on its headers. The failure resets the client's HTTP/2 stream (or
/// closes its HTTP/1.1 connection), as Go's server does when a request's context ends.
pub fn until(body: Body, deadline: tokio::time::Instant, timed_out: &'static str) -> Body {
    if http_body::Body::is_end_stream(&body) {
        return body;
    }
    boxed(Until {
        inner: body,
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        timed_out,
    })
}

pin_project_lite::pin_project! {
    struct Until<B> {
        #[pin]
        inner: B,
        deadline: Pin<Box<tokio::time::Sleep>>,
        timed_out: &'static str,
    }
}

impl<B> http_body::Body for Until<B>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err((*this.timed_out).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    struct Guarded<B, G> {
        #[pin]
        inner: B,
        guard: G,
    }
}

// === impl Guarded ===

impl<B: http_body::Body, G> http_body::Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use futures::StreamExt;

    use super::*;

    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn trailers_are_dropped_and_data_kept() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-remote-user", "admin".parse().unwrap());
        let frames = futures::stream::iter([
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::data(Bytes::from_static(b"c"))),
            Ok(Frame::trailers(trailers)),
        ]);
        let body = boxed(http_body_util::StreamBody::new(frames));
        let collected = without_trailers(body).collect().await.unwrap();
        assert!(collected.trailers().is_none());
        assert_eq!(&collected.to_bytes()[..], b"abc");
    }

    #[tokio::test]
    async fn the_guard_lives_as_long_as_the_body() {
        let dropped = Arc::new(AtomicBool::new(false));
        let body = with_guard(full("abc"), Flag(dropped.clone()));
        assert!(!dropped.load(Ordering::SeqCst));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abc");
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_past_its_deadline_fails() {
        let slow =
            futures::stream::iter([Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{")))])
                .chain(futures::stream::pending());
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut body = until(
            boxed(http_body_util::StreamBody::new(slow)),
            deadline,
            "too slow",
        );
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"{"));
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.to_string(), "too slow");
        assert!(tokio::time::Instant::now() >= deadline);
        // One that ends in time ends as it is.
        let quick = until(full("ok"), deadline, "too slow");
        assert_eq!(&quick.collect().await.unwrap().to_bytes()[..], b"ok");
    }
}
