//! Picks the target for a request: a handler of the gateway's own (health, metrics) or the core
//! server, which receives everything no APIService claims.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Method};
use tower::Service;

use crate::backend::core::CoreBackend;
use crate::body::{full, BoxError, Request, Response};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::request_info::RequestInfo;
use crate::stack::{BoxFuture, ConnInfo, RoutedTo};

/// What the router reads on every request; built once at start.
pub struct Gateway {
    pub core: CoreBackend,
    pub health: Health,
    pub metrics: Arc<Metrics>,
}

#[derive(Clone)]
pub struct Router {
    gateway: Arc<Gateway>,
}

impl Router {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self { gateway }
    }
}

fn tagged(mut resp: Response, target: RoutedTo) -> Response {
    resp.extensions_mut().insert(target);
    resp
}

impl Service<Request> for Router {
    type Response = Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let gw = self.gateway.clone();
        Box::pin(async move {
            let path = req.uri().path();
            if req.method() == Method::GET || req.method() == Method::HEAD {
                if let Some(resp) = gw.health.respond(path, req.uri().query().unwrap_or("")) {
                    return Ok(tagged(resp, RoutedTo::Gateway));
                }
                if path == "/metrics" {
                    let mut resp = Response::new(full(gw.metrics.encode()));
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                    );
                    return Ok(tagged(resp, RoutedTo::Gateway));
                }
            }
            let client = req.extensions().get::<ConnInfo>().map(|c| c.remote);
            let long_running = req.extensions().get::<RequestInfo>().is_some_and(|i| i.long_running);
            let resp = match gw.core.forward(req, client, long_running).await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::warn!(error = %e, "core server request failed");
                    e.into_response()
                }
            };
            Ok(tagged(resp, RoutedTo::Core))
        })
    }
}
