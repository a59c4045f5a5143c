//! Turns errors and panics from anything below into a `metav1.Status` response, so the client
//! always gets an answer it can parse and never an empty reply.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures::FutureExt;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::BoxFuture;
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
    type Future = BoxFuture<Result<Response, Infallible>>;

    /// Readiness is forwarded. A readiness error cannot be returned as `Infallible`; it is left
    /// to `call`, whose error becomes a Status like any other.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let fut = self.inner.call(req);
        Box::pin(async move {
            match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
                Ok(Ok(resp)) => Ok(resp),
                Ok(Err(err)) => Ok(rescue(err)),
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(panic = %what, "request handler panicked");
                    Ok(
                        GatewayError::Internal("internal error while handling the request".into())
                            .into_response(),
                    )
                }
            }
        })
    }
}
