//! Parses the request's Kubernetes attributes once and puts them into its extensions for the
//! layers below (limits, timeout, authorization, router).

use std::task::{Context, Poll};

use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::BoxFuture;
use crate::body::{BoxError, Request, Response};
use crate::error::GatewayError;
use crate::proxy::is_upgrade;
use crate::request_info::parse;

#[derive(Clone)]
pub struct RequestInfoService<S> {
    inner: S,
}

impl<S> RequestInfoService<S> {
    pub fn layer() -> impl Layer<S, Service = Self> + Clone {
        layer_fn(|inner| Self { inner })
    }
}

impl<S> Service<Request> for RequestInfoService<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let info = parse(
            req.method(),
            req.uri().path(),
            req.uri().query().unwrap_or(""),
            is_upgrade(req.headers()),
        );
        match info {
            Ok(info) => {
                req.extensions_mut().insert(info);
                Box::pin(self.inner.call(req))
            }
            Err(message) => Box::pin(async move { Err(GatewayError::BadRequest(message).into()) }),
        }
    }
}
