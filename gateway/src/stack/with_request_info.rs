//! Parses the request's Kubernetes attributes once and puts them into its extensions for the
//! layers below (limits, timeout, authorization, router).

use std::task::{Context, Poll};

use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::{BoxError, Request, Response};
use crate::error::GatewayError;
use crate::request::BoxFuture;
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

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // Headers play no part: kube decides long-running from verb and subresource, and a
        // `Connection: Upgrade` anyone can send must not exempt a request from the limits.
        let info = parse(
            req.method(),
            req.uri().path(),
            req.uri().query().unwrap_or(""),
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
                .get::<crate::request_info::RequestInfo>()
                .cloned();
            let mut resp = Response::new(body::empty());
            resp.extensions_mut().insert(info);
            Ok::<_, BoxError>(resp)
        });
        let resp = RequestInfoService::layer().layer(inner).oneshot(req).await;
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
        assert_eq!(info.verb, "list");
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
        assert_eq!(
            (info.namespace.as_str(), info.verb.as_str()),
            ("kube-system", "watch")
        );
        assert!(info.long_running);
        let bad = http::Request::get("/api/v1/namespaces/%zz/pods")
            .body(body::empty())
            .unwrap();
        assert_eq!(seen(bad).await, None);
    }
}
