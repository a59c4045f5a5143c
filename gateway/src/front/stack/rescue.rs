//! Turns errors and panics from anything below into a `metav1.Status` response, so the client
//! always gets an answer it can parse and never an empty reply.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::future::CatchUnwind;
use futures::FutureExt;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::{BoxError, Request, Response};
use crate::error::{rescue, GatewayError};

#[derive(Clone)]
pub struct Rescue<S> {
    inner: S,
}

impl<S> Rescue<S> {
    pub fn layer() -> impl Layer<S, Service = Self> + Clone {
        layer_fn(|inner| Self { inner })
    }
}

impl<S> Service<Request> for Rescue<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    /// Readiness is forwarded. A readiness error cannot be returned as `Infallible`; it is left
    /// to `call`, whose error becomes a Status like any other.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        RescueFuture {
            inner: AssertUnwindSafe(self.inner.call(req)).catch_unwind(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner future, its error or panic turned into a Status. A named type rather than a
    /// boxed `async` block: every request passes here, and a box is an allocation and a copy of
    /// everything below it.
    pub struct RescueFuture<F> {
        #[pin]
        inner: CatchUnwind<AssertUnwindSafe<F>>,
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response, BoxError>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(match ready!(self.project().inner.poll(cx)) {
            Ok(Ok(resp)) => resp,
            Ok(Err(err)) => rescue(err),
            Err(panic) => panicked(panic),
        }))
    }
}

/// The answer to a request whose handler panicked (logged with the panic's message).
fn panicked(panic: Box<dyn Any + Send>) -> Response {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %what, "request handler panicked");
    GatewayError::Internal("internal error while handling the request".into()).into_response()
}
