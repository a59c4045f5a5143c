//! One access-log line per request (method, path, status, duration, where it was routed) and the
//! request metrics. Measured to response headers: for a watch that is when the stream starts.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http::uri::PathAndQuery;
use http::{Method, Version};
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::{Request, Response};
use crate::control::discovery::DiscoveryCache;
use crate::error::Terminated;
use crate::extensions::{RequestContext, RoutedTo};
use crate::metrics::{Metrics, Observed, RequestLabels, APISERVER};

#[derive(Clone)]
pub struct AccessLog<S> {
    inner: S,
    metrics: Arc<Metrics>,
    /// Where the names the metrics may carry come from (see `metrics::known_resources`).
    discovery: Arc<DiscoveryCache>,
}

impl<S> AccessLog<S> {
    pub fn layer(
        metrics: Arc<Metrics>,
        discovery: Arc<DiscoveryCache>,
    ) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            metrics: metrics.clone(),
            discovery: discovery.clone(),
        })
    }
}

impl<S> Service<Request> for AccessLog<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Logged<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let start = Instant::now();
        let method = req.method().clone();
        // Cloning the path and query only bumps a reference count; the log line formats it if it
        // is written. (HTTP/2 requests carry an absolute URI; the log shows the path either way.)
        let uri = req.uri().path_and_query().cloned();
        // Kept for the way out: the router records the route in it.
        let context = RequestContext::of(req.extensions()).cloned();
        let version = req.version();
        // Parsed once for the labels and the layers below (see `ensure_parsed`).
        crate::request_info::ensure_parsed(&mut req);
        let info = req
            .extensions()
            .get::<Arc<crate::request_info::RequestInfo>>()
            .map(|i| &**i);
        let labels = RequestLabels::of_parsed(
            req.method(),
            info,
            req.uri().query().unwrap_or(""),
            req.headers(),
            &self.discovery.known_resources(),
        );
        Logged {
            inner: self.inner.call(req),
            request: Some(Logging {
                start,
                method,
                uri,
                context,
                version,
                labels,
                metrics: self.metrics.clone(),
            }),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner future; its response is counted and logged when it is ready. A named type, not
    /// a boxed `async` block: the box was an allocation and a copy of the whole stack's future
    /// for every request.
    pub struct Logged<F> {
        #[pin]
        inner: F,
        request: Option<Logging>,
    }
}

/// What the log line and the metrics need from the request.
struct Logging {
    start: Instant,
    method: Method,
    uri: Option<PathAndQuery>,
    /// The connection (the log's `client`) and, once the response is back, the route.
    context: Option<Arc<RequestContext>>,
    version: Version,
    labels: RequestLabels,
    metrics: Arc<Metrics>,
}

impl<F> Future for Logged<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(resp) = ready!(this.inner.poll(cx));
        if let Some(request) = this.request.take() {
            request.log(&resp);
        }
        Poll::Ready(Ok(resp))
    }
}

impl Logging {
    fn log(self, resp: &Response) {
        let elapsed = self.start.elapsed();
        let routed = self.context.as_deref().and_then(RequestContext::route);
        let target = routed.map_or("gateway", RoutedTo::label);
        let code = resp.status().as_u16();
        self.metrics.observe(Observed {
            labels: &self.labels,
            component: routed.map_or(APISERVER, RoutedTo::component),
            target,
            code: resp.status(),
            elapsed,
            terminated: resp.extensions().get::<Terminated>().is_some(),
        });
        tracing::info!(
            target: "access",
            method = %self.method,
            uri = self.uri.as_ref().map_or("", |p| p.as_str()),
            status = code,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            routed = %target,
            client = ?self.context.as_ref().map(|c| c.conn.remote),
            protocol = ?self.version,
            "request"
        );
    }
}
