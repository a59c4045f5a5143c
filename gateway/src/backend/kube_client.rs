//! A kube-rs `Client` that rides on the core backend's own transport (same pool, same TLS, Unix
//! sockets included) with the gateway's credentials, so the controllers reach the core exactly
//! the way proxied requests do.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::core::CoreBackend;
use crate::body::BoxFuture;
use crate::body::{self, BoxError};

#[derive(Clone)]
pub struct CoreTransport(pub Arc<CoreBackend>);

impl Service<http::Request<kube::client::Body>> for CoreTransport {
    type Response = http::Response<body::Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let core = self.0.clone();
        Box::pin(async move {
            let req = req.map(body::boxed);
            core.send_own(req).await.map_err(Into::into)
        })
    }
}

pub fn client(core: Arc<CoreBackend>) -> kube::Client {
    kube::Client::new(CoreTransport(core), "default")
}
