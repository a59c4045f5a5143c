//! Parses the request's Kubernetes attributes once and puts them into its extensions for the
//! layers below (limits, timeout, authorization, router).
//!
//! Whether a request is long-running is kube's decision (verb and subresource), widened by what
//! the APIService serving the group-version declares (`aggregation-gateway.io/long-running-*`
//! annotations, see `apiservice::traffic`): an aggregated server's own streaming subresources
//! (a VM console) are exempt from the timeout and the in-flight limits, as `exec` is. It is
//! decided here, before those layers, from the route table of this moment.

use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route_table::Lookup;

use tower::layer::layer_fn;
use tower::{Layer, Service};

use futures::future::Either;

use crate::body::{BoxError, Request, Response};
use crate::control::apiservices::Routing;
use crate::error::GatewayError;
use crate::request_info::{ensure_parsed, RequestInfo, Unparsable};

#[derive(Clone)]
pub struct RequestInfoService<S> {
    inner: S,
    /// Where APIServices' long-running declarations are read; `None`: kube's list only.
    routing: Option<Arc<Routing>>,
}

impl<S> RequestInfoService<S> {
    pub fn layer(routing: Option<Arc<Routing>>) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            routing: routing.clone(),
        })
    }
}

/// Whether the APIService serving `info`'s group-version declares the request long-running.
fn declared_long_running(routing: &Routing, info: &RequestInfo) -> bool {
    if !info.is_resource_request || info.api_group().is_empty() {
        return false;
    }
    let table = routing.load();
    match table.lookup(info.path()) {
        Lookup::GroupVersion(route) => route
            .api_service
            .traffic
            .long_running
            .matches(info.verb(), info.subresource()),
        _ => false,
    }
}

impl<S> Service<Request> for RequestInfoService<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    /// The inner call itself: a parsed request costs no future of this layer's own.
    type Future = Either<S::Future, std::future::Ready<Result<Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // Headers play no part: kube decides long-running from verb and subresource, and a
        // `Connection: Upgrade` anyone can send must not exempt a request from the limits.
        // The access log above has usually parsed the request already (for its labels). The
        // attributes are shared (`Arc`): priority and fairness keeps them for its debug dumps,
        // as long as the request waits or runs, without copying them.
        if !ensure_parsed(&mut req) {
            let message = req
                .extensions_mut()
                .remove::<Unparsable>()
                .map_or_else(String::new, |u| u.0);
            return Either::Right(std::future::ready(Err(
                GatewayError::BadRequest(message).into()
            )));
        }
        if let (Some(routing), Some(info)) = (
            &self.routing,
            req.extensions_mut().get_mut::<Arc<RequestInfo>>(),
        ) {
            if !info.long_running && declared_long_running(routing, info) {
                // Not shared yet, so this changes it in place.
                Arc::make_mut(info).long_running = true;
            }
        }
        Either::Left(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use http::header::{CONNECTION, UPGRADE};
    use tower::ServiceExt;

    use super::*;
    use crate::body;

    /// The `RequestInfo` the layers below see for `req` (`None` when it was refused).
    async fn seen(req: Request) -> Option<crate::request_info::RequestInfo> {
        let inner = tower::service_fn(|req: Request| async move {
            let info = req
                .extensions()
                .get::<Arc<crate::request_info::RequestInfo>>()
                .map(|i| (**i).clone());
            let mut resp = Response::new(body::empty());
            resp.extensions_mut().insert(info);
            Ok::<_, BoxError>(resp)
        });
        let resp = RequestInfoService::layer(None)
            .layer(inner)
            .oneshot(req)
            .await;
        resp.ok()?
            .extensions()
            .get::<Option<crate::request_info::RequestInfo>>()
            .cloned()
            .flatten()
    }

    fn upgrade(method: &str, uri: &str) -> Request {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, "SPDY/3.1")
            .body(body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn an_upgrade_header_does_not_make_a_request_long_running() {
        let info = seen(upgrade("GET", "/api/v1/namespaces/x/configmaps"))
            .await
            .unwrap();
        assert_eq!(info.verb(), "list");
        assert!(!info.long_running);
        let info = seen(upgrade("GET", "/fixture/anything")).await.unwrap();
        assert!(!info.long_running);
        let info = seen(upgrade(
            "POST",
            "/api/v1/namespaces/x/pods/p/exec?command=sh",
        ))
        .await
        .unwrap();
        assert!(info.long_running);
    }

    #[tokio::test]
    async fn the_decoded_path_is_what_the_layers_below_see() {
        let req = http::Request::get("/api/v1/namespaces/%6Bube-system/pods?watch=")
            .body(body::empty())
            .unwrap();
        let info = seen(req).await.unwrap();
        assert_eq!((info.namespace(), info.verb()), ("kube-system", "watch"));
        assert!(info.long_running);
        let bad = http::Request::get("/api/v1/namespaces/%zz/pods")
            .body(body::empty())
            .unwrap();
        assert_eq!(seen(bad).await, None);
    }
}
