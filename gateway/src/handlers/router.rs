//! Picks the target for a request from one load of the routing snapshot: a handler of the
//! gateway's own (health, metrics), a remote APIService's backend, or the core server, which
//! receives everything no APIService claims. When the authorization layer pinned the snapshot
//! it decided on ([`PinnedRoutes`]), that one is used, never a newer one.

use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route_table::Lookup;
use gateway_flowcontrol::FlowControl;
use http::{header, HeaderValue, Method};
use tower::Service;

use crate::backend::core::CoreBackend;
use crate::body::BoxFuture;
use crate::body::{full, BoxError, Request, Response};
use crate::control::apiservices::{Routes, Routing, Target};
use crate::control::discovery::DiscoveryCache;
use crate::error::{GatewayError, Unreachable};
use crate::extensions::{RequestContext, RoutedTo, WatchInitialization};
use crate::handlers::apiservice_printing;
use crate::handlers::health::Health;
use crate::handlers::priority_and_fairness;
use crate::identity::UserInfo;
use crate::metrics::Metrics;
use crate::request_info::{decided_path, RequestInfo};

/// What the router reads on every request; built once at start.
pub struct Gateway {
    pub core: Arc<CoreBackend>,
    pub health: Health,
    pub metrics: Arc<Metrics>,
    pub routing: Arc<Routing>,
    /// Merged discovery and OpenAPI v3 snapshots (`/api`, `/apis`, `/apis/<g>`, `/openapi/v3`).
    pub discovery: Arc<DiscoveryCache>,
    /// API Priority and Fairness, unless `--enable-priority-and-fairness=false`: the front's
    /// layer admits requests by it, and its debug dumps are answered here.
    pub flow_control: Option<Arc<FlowControl>>,
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

/// The routing snapshot authorization decided a request on, carried in its extensions.
#[derive(Clone)]
pub struct PinnedRoutes(pub Arc<Routes>);

/// The table to route `req` with: the pinned one, else the current one.
fn routes_for(req: &Request, routing: &Routing) -> Arc<Routes> {
    match req.extensions().get::<PinnedRoutes>() {
        Some(pinned) => pinned.0.clone(),
        None => routing.load_full(),
    }
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
        // The route goes into the request's context, where the layers around the router read it
        // once the response is back; the response itself carries no extensions for it.
        let context = RequestContext::of(req.extensions()).cloned();
        Box::pin(async move {
            let tagged = |resp: Response, target: RoutedTo| {
                if let Some(context) = &context {
                    context.set_route(target);
                }
                resp
            };
            // The gateway's own endpoints answer on the decoded path, the one flow control
            // classified the request by and authorization decided on (kube-apiserver's mux
            // reads Go's `URL.Path` too): `/%68ealthz` is `/healthz`, and a path under it that
            // names no check (`/healthz/../api/...`) is this handler's 404, never the core's
            // business, so nothing the `probes` FlowSchema exempts leaves the gateway.
            let path = decided_path(&req);
            if req.method() == Method::GET || req.method() == Method::HEAD {
                if let Some(resp) = gw.health.respond(path, req.uri().query().unwrap_or("")) {
                    return Ok(tagged(resp, RoutedTo::Gateway));
                }
                if let Some(resp) = gw.flow_control.as_ref().and_then(|fc| {
                    priority_and_fairness::respond(fc, path, req.uri().query().unwrap_or(""))
                }) {
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
            let client = context.as_ref().map(|c| c.conn.remote);
            let info = req.extensions().get::<Arc<RequestInfo>>().map(|i| &**i);
            let long_running = info.is_some_and(|i| i.long_running);
            // A CRD or APIService written through us: the core's discovery follows at once.
            let core_discovery_write =
                info.is_some_and(crate::control::discovery::writes_core_discovery);
            let after_core = |resp: &Response| {
                if core_discovery_write && resp.status().is_success() {
                    gw.discovery.revalidate_core();
                }
            };
            // `kubectl get apiservices` of a core that stores them as the chart's CRD.
            let apiservice_printing = info
                .filter(|i| apiservice_printing::applies(i, req.headers()))
                .map(|i| i.verb() == "watch");
            let from_core = |resp: Response| async move {
                match apiservice_printing {
                    Some(watch) => apiservice_printing::present(resp, watch).await,
                    None => resp,
                }
            };
            // Routes are matched on the decoded path, as kube-aggregator's mux matches
            // `URL.Path`; the request itself goes on with the path the client wrote.
            let path = decided_path(&req);
            let table = routes_for(&req, &gw.routing);
            let route = match table.lookup(path) {
                Lookup::GroupVersion(route) | Lookup::LegacyCore(route) => Some(route),
                Lookup::Group(_) | Lookup::None => None,
            };
            if let Some(route) = route {
                let result = match &route.backend.target {
                    Target::Local => match gw.core.forward(req, client, long_running).await {
                        Ok(resp) => {
                            after_core(&resp);
                            Ok(from_core(resp).await)
                        }
                        Err(e) => Err(e),
                    },
                    Target::Broken(why) => Err(GatewayError::BackendUnavailable {
                        api_service: route.api_service.name.clone(),
                        cause: Unreachable::NotAvailable(why.to_string()),
                    }),
                    Target::Remote(_) if !route.available.is_available() => {
                        Err(GatewayError::BackendUnavailable {
                            api_service: route.api_service.name.clone(),
                            cause: Unreachable::NotAvailable(unavailable_reason(&route.available)),
                        })
                    }
                    Target::Remote(backend) => {
                        // Delegated: a watch's priority-and-fairness seats go back now, as
                        // kube-aggregator's proxy gives them back, whatever the backend or the
                        // caller's body then take.
                        WatchInitialization::delegated(req.extensions());
                        let user = crate::auth::request_user(req.extensions())
                            .unwrap_or(UserInfo::shared_anonymous())
                            .clone();
                        backend.forward(req, &user, client, long_running).await
                    }
                };
                let resp = result.unwrap_or_else(|e| {
                    log_failure(&e, "APIService request failed");
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
                Ok(resp) => {
                    after_core(&resp);
                    from_core(resp).await
                }
                Err(e) => {
                    log_failure(&e, "core server request failed");
                    e.into_response()
                }
            };
            Ok(tagged(resp, RoutedTo::Core))
        })
    }
}

/// A backend that is down fails every request sent to it: its access-log lines carry the 503s,
/// and the state change is logged once where it is decided (the availability controller for an
/// APIService, the `core-server` readiness check for the core). So these are debug lines; only
/// failures that say something about this one request are warnings.
fn log_failure(e: &GatewayError, what: &'static str) {
    match e {
        GatewayError::BackendUnavailable { .. } | GatewayError::CoreUnavailable { .. } => {
            tracing::debug!(error = %e, "{what}")
        }
        _ => tracing::warn!(error = %e, "{what}"),
    }
}

fn unavailable_reason(a: &apiservice::route_table::Availability) -> String {
    match a {
        apiservice::route_table::Availability::Unavailable { reason, message }
            if !message.is_empty() =>
        {
            format!("{message} ({reason})")
        }
        apiservice::route_table::Availability::Unavailable { reason, .. } => reason.to_string(),
        _ => "availability not yet known; the first check is under way".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apiservice::model::{Backend, RegisteredAPIService};
    use apiservice::route_table::RouteTable;

    use crate::control::apiservices::RouteTarget;

    fn table(target: Target) -> Arc<Routes> {
        let api = RegisteredAPIService {
            traffic: Default::default(),
            name: "v1alpha1.wardle.example.com".into(),
            group: "wardle.example.com".into(),
            version: "v1alpha1".into(),
            group_priority_minimum: 1000,
            version_priority: 15,
            backend: Backend::Local,
        };
        let target = RouteTarget {
            target,
            routed_to: RoutedTo::api_service(&api.name, true),
        };
        Arc::new(RouteTable::from_routes([(api, target)]).0)
    }

    #[test]
    fn a_pinned_table_wins_over_the_current_one() {
        let routing = Routing::new();
        let req = || {
            http::Request::get("/apis/wardle.example.com/v1alpha1/flunders")
                .body(crate::body::empty())
                .unwrap()
        };
        // Nothing pinned: the current (empty) table.
        let current = routes_for(&req(), &routing);
        assert!(matches!(
            current.lookup("/apis/wardle.example.com/v1alpha1/flunders"),
            Lookup::None
        ));
        // Pinned while the APIService was local: still local, whatever was published since.
        let pinned = table(Target::Local);
        let mut r = req();
        r.extensions_mut().insert(PinnedRoutes(pinned.clone()));
        let used = routes_for(&r, &routing);
        assert!(Arc::ptr_eq(&used, &pinned));
        let Lookup::GroupVersion(route) = used.lookup("/apis/wardle.example.com/v1alpha1/flunders")
        else {
            panic!("the pinned table routes the group-version");
        };
        assert!(matches!(route.backend.target, Target::Local));
    }

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
