//! Picks the target for a request from one load of the routing snapshot: a handler of the
//! gateway's own (health, metrics), a remote APIService's backend, or the core server, which
//! receives everything no APIService claims.

use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route::Lookup;
use http::{header, HeaderValue, Method};
use tower::Service;

use crate::backend::core::CoreBackend;
use crate::body::{full, BoxError, Request, Response};
use crate::discovery::DiscoveryCache;
use crate::error::GatewayError;
use crate::health::Health;
use crate::identity::UserInfo;
use crate::metrics::Metrics;
use crate::request_info::RequestInfo;
use crate::routing::{Routing, Target};
use crate::stack::{BoxFuture, ConnInfo, RoutedTo};

/// What the router reads on every request; built once at start.
pub struct Gateway {
    pub core: Arc<CoreBackend>,
    pub health: Health,
    pub metrics: Arc<Metrics>,
    pub routing: Arc<Routing>,
    /// Merged discovery and OpenAPI v3 snapshots (`/api`, `/apis`, `/apis/<g>`, `/openapi/v3`).
    pub discovery: Arc<DiscoveryCache>,
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

/// `/apis/<group>/...` for a group other than apiregistration.k8s.io: such a path may belong to
/// an APIService we have not loaded yet. APIService objects themselves always reach the core, so
/// a gateway that cannot sync can still be fixed through itself.
fn may_be_unsynced_route(path: &str) -> bool {
    path.strip_prefix("/apis/")
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|group| !group.is_empty() && group != "apiregistration.k8s.io")
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
                        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    return Ok(tagged(resp, RoutedTo::Gateway));
                }
            }
            let discovery = gw.discovery.handle(&req);
            if let Some(resp) = discovery.await {
                return Ok(tagged(resp, RoutedTo::Gateway));
            }
            let client = req.extensions().get::<ConnInfo>().map(|c| c.remote);
            let long_running = req
                .extensions()
                .get::<RequestInfo>()
                .is_some_and(|i| i.long_running);

            let table = gw.routing.load_full();
            let route = match table.lookup(path) {
                Lookup::GroupVersion(route) | Lookup::LegacyCore(route) => Some(route),
                Lookup::Group(_) | Lookup::None => None,
            };
            if let Some(route) = route {
                let result = match &route.backend.target {
                    Target::Local => gw.core.forward(req, client, long_running).await,
                    Target::Broken(why) => Err(GatewayError::BackendUnavailable {
                        api_service: route.api_service.name.clone(),
                        reason: why.to_string(),
                    }),
                    Target::Remote(_) if !route.available.is_available() => {
                        Err(GatewayError::BackendUnavailable {
                            api_service: route.api_service.name.clone(),
                            reason: unavailable_reason(&route.available),
                        })
                    }
                    Target::Remote(backend) => {
                        let user = req
                            .extensions()
                            .get::<Arc<UserInfo>>()
                            .unwrap_or(UserInfo::shared_anonymous())
                            .clone();
                        backend.forward(req, &user, client, long_running).await
                    }
                };
                let resp = result.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "APIService request failed");
                    e.into_response()
                });
                return Ok(tagged(resp, route.backend.routed_to.clone()));
            }
            if !gw.routing.is_synced() && may_be_unsynced_route(path) {
                return Ok(tagged(
                    GatewayError::RoutesNotReady.into_response(),
                    RoutedTo::Gateway,
                ));
            }
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

fn unavailable_reason(a: &apiservice::route::Availability) -> String {
    match a {
        apiservice::route::Availability::Unavailable { reason, message } if !message.is_empty() => {
            format!("{message} ({reason})")
        }
        apiservice::route::Availability::Unavailable { reason, .. } => reason.clone(),
        _ => "availability not yet known; the first check is under way".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_paths() {
        assert!(may_be_unsynced_route(
            "/apis/wardle.example.com/v1alpha1/flunders"
        ));
        assert!(!may_be_unsynced_route(
            "/apis/apiregistration.k8s.io/v1/apiservices"
        ));
        assert!(!may_be_unsynced_route("/apis"));
        assert!(!may_be_unsynced_route("/api/v1/pods"));
    }
}
