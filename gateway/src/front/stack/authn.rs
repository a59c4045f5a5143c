//! Authentication: decides who the caller is (and whom they impersonate) before anything is
//! routed, using `crate::auth`. On success the request carries `auth::Authenticated` and the
//! effective `Arc<UserInfo>`, with every credential and claimed-identity header removed; on failure
//! the layer answers itself (401, 400, 403 or 503 Status) and nothing reaches a backend.
//!
//! It sits after request-info (nothing here needs it, but the access log wants both) and before
//! limits: unauthenticated requests are refused before they take an in-flight slot.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use futures::FutureExt as _;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::take_inner;
use crate::auth::Authenticator;
use crate::body::BoxFuture;
use crate::body::{BoxError, Request, Response};

pub use crate::auth::x509::user_from_certificate;

#[derive(Clone)]
pub struct Authn<S> {
    inner: S,
    authenticator: Arc<Authenticator>,
}

impl<S> Authn<S> {
    pub fn layer(authenticator: Arc<Authenticator>) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            authenticator: authenticator.clone(),
        })
    }
}

impl<S> Service<Request> for Authn<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    /// A request authenticated without waiting (no webhook to ask): the inner call itself.
    /// Boxing every request's future copied the whole stack's future below into the box.
    type Future = Either<S::Future, BoxFuture<Result<Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        if !self.authenticator.may_wait(req.headers()) {
            // Nothing to await (a certificate, a front proxy's headers or no credential at
            // all), so the first poll finishes. Should it not, the request takes the path below
            // from the start: `authenticate` changes the request only once its caller is
            // identified, and its only later wait (impersonation's review) is ruled out here.
            if let Some(authenticated) = self.authenticator.authenticate(&mut req).now_or_never() {
                return match authenticated {
                    Ok(()) => Either::Left(self.inner.call(req)),
                    Err(answer) => Either::Right(Box::pin(std::future::ready(Ok(answer)))),
                };
            }
        }
        let authenticator = self.authenticator.clone();
        let mut inner = take_inner(&mut self.inner);
        Either::Right(Box::pin(async move {
            match authenticator.authenticate(&mut req).await {
                Ok(()) => inner.call(req).await,
                Err(answer) => Ok(answer),
            }
        }))
    }
}
