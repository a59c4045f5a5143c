//! One OpenTelemetry server span per request, when `--tracing-config-file` is given (see
//! `crate::otel` for the export), and the W3C trace context (`traceparent`, `tracestate`) the
//! backends and the core receive, so that a trace crosses the gateway.
//!
//! The span is a child of the caller's `traceparent` when it sent a valid one, and sampled as
//! kube-apiserver samples (a sampled parent is sampled, otherwise `samplingRatePerMillion`). It
//! carries what an operator asks of an aggregator: where the request went (`core`, `gateway`,
//! `apiservice/<name>`), the APIService, how long the backend took to answer
//! (`aggregation_gateway.backend.duration_ms`, from sending to response headers), the method and
//! the status. Its name is kube's: the method, and for resource requests the path with the
//! namespace and name as placeholders (`GET /apis/wardle.example.com/v1alpha1/namespaces/
//! {:namespace}/flunders/{:name}`). Like the access log, it ends at response headers: for a watch
//! that is when the stream starts, so a day-long watch is not a day-long span.
//!
//! The span context travels in the request's extensions ([`RequestTrace`]); `proxy` calls
//! [`crate::otel::propagate`] when it prepares the request for its backend, which replaces the
//! caller's `traceparent` with the gateway's span as the parent. Without a tracing configuration
//! there is no extension, the caller's headers pass untouched (as through kube-apiserver without
//! tracing), and this layer only forwards the call: no allocation, no header read.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use http::header::{HeaderValue, USER_AGENT};
use http::{Method, Version};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::BoxFuture;
use crate::body::{Request, Response};
use crate::extensions::{RequestContext, RoutedTo};
use crate::otel::{HeaderExtractor, RequestTrace};

/// What the layer needs of the tracer provider: the tracer and the W3C propagator.
pub struct RequestTracer {
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

// === impl RequestTracer ===

impl RequestTracer {
    pub fn new(provider: &SdkTracerProvider) -> Self {
        Self {
            tracer: provider.tracer(crate::otel::SERVICE_NAME),
            propagator: TraceContextPropagator::new(),
        }
    }
}

#[derive(Clone)]
pub struct Trace<S> {
    inner: S,
    tracer: Option<Arc<RequestTracer>>,
}

// === impl Trace ===

impl<S> Trace<S> {
    /// `None`: tracing is off and the layer is a pass-through.
    pub fn layer(tracer: Option<Arc<RequestTracer>>) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            tracer: tracer.clone(),
        })
    }
}

impl<S> Service<Request> for Trace<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let Some(tracer) = &self.tracer else {
            return Either::Left(self.inner.call(req));
        };
        let parent = tracer.propagator.extract(&HeaderExtractor(req.headers()));
        let mut span = tracer
            .tracer
            .span_builder(method_name(req.method()))
            .with_kind(SpanKind::Server)
            .start_with_context(&tracer.tracer, &parent);
        req.extensions_mut()
            .insert(RequestTrace::new(span.span_context().clone()));
        // Attributes and the name cost work only for spans that are exported.
        if span.is_recording() {
            if let Some(name) = resource_span_name(&req) {
                span.update_name(name);
            }
            span.set_attributes(request_attributes(&req));
        }
        let trace = req.extensions().get::<RequestTrace>().cloned();
        // Kept for the way out: the router records the route in it.
        let context = RequestContext::of(req.extensions()).cloned();
        let fut = self.inner.call(req);
        Either::Right(Box::pin(async move {
            let Ok(resp) = fut.await;
            if span.is_recording() {
                let status = resp.status();
                let routed = context.as_deref().and_then(RequestContext::route);
                let route = routed.map_or("gateway", RoutedTo::label);
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status.as_u16()),
                ));
                span.set_attribute(KeyValue::new("aggregation_gateway.route", route.to_owned()));
                if let Some(RoutedTo::ApiService(label) | RoutedTo::LocalApiService(label)) = routed
                {
                    let name = label.strip_prefix("apiservice/").unwrap_or(label);
                    span.set_attribute(KeyValue::new(
                        "aggregation_gateway.apiservice",
                        name.to_owned(),
                    ));
                }
                if let Some(sent) = trace.as_ref().and_then(RequestTrace::sent) {
                    span.set_attribute(KeyValue::new(
                        "aggregation_gateway.backend.duration_ms",
                        sent.elapsed().as_secs_f64() * 1000.0,
                    ));
                }
                // OpenTelemetry's HTTP conventions: a server span is an error for 5xx only.
                if status.is_server_error() {
                    span.set_status(Status::error(status.to_string()));
                }
            }
            span.end();
            Ok(resp)
        }))
    }
}

/// The span's first name: the method (OpenTelemetry's `_OTHER` for methods outside RFC 9110),
/// as a static string so an unsampled span allocates no name.
fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// kube-apiserver's span name for a resource request (`getSpanNameFromRequestInfo`): the method
/// and the path with `{:namespace}` and `{:name}` in place of the values, so spans of one kind of
/// request share a name. `None` for other requests, which keep the method alone.
fn resource_span_name(req: &Request) -> Option<String> {
    let info = crate::request_info::parse(
        req.method(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
    )
    .ok()
    .filter(|i| i.is_resource_request)?;
    let mut name = format!("{} /{}", method_name(req.method()), info.api_prefix());
    for (part, value) in [
        (info.api_group(), info.api_group()),
        (info.api_version(), info.api_version()),
        (info.namespace(), "namespaces/{:namespace}"),
        (info.resource(), info.resource()),
        (info.name(), "{:name}"),
        (info.subresource(), info.subresource()),
    ] {
        if !part.is_empty() {
            name.push('/');
            name.push_str(value);
        }
    }
    Some(name)
}

/// OpenTelemetry's HTTP server attributes, and kube's `audit-id`.
fn request_attributes(req: &Request) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("http.request.method", method_name(req.method())),
        KeyValue::new("url.path", req.uri().path().to_owned()),
        KeyValue::new(
            "network.protocol.version",
            match req.version() {
                Version::HTTP_2 => "2",
                Version::HTTP_10 => "1.0",
                _ => "1.1",
            },
        ),
    ];
    if let Some(query) = req.uri().query() {
        attributes.push(KeyValue::new("url.query", query.to_owned()));
    }
    if let Some(conn) = RequestContext::conn_of(req.extensions()) {
        attributes.push(KeyValue::new(
            "client.address",
            conn.remote.ip().to_string(),
        ));
    }
    let text = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    if let Some(agent) = text(USER_AGENT) {
        attributes.push(KeyValue::new("user_agent.original", agent));
    }
    if let Some(id) = text(crate::front::stack::audit::AUDIT_ID) {
        attributes.push(KeyValue::new("audit-id", id));
    }
    attributes
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{Status, TraceId};
    use opentelemetry::Value;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{Sampler, SpanData, SpanExporter};
    use tower::ServiceExt;

    use super::*;
    use crate::body;
    use crate::extensions::ConnInfo;
    use crate::otel::propagate;
    use http::HeaderMap;

    /// Keeps what it is given, for the assertions.
    #[derive(Debug, Clone, Default)]
    struct Collected(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collected {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    fn tracer(root: Sampler) -> (Option<Arc<RequestTracer>>, Collected, SdkTracerProvider) {
        let spans = Collected::default();
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(root)))
            .with_simple_exporter(spans.clone())
            .build();
        (
            Some(Arc::new(RequestTracer::new(&provider))),
            spans,
            provider,
        )
    }

    /// Sends `req` through the layer to a stand-in router that prepares it for a remote
    /// APIService as `proxy` does and answers 503; returns the headers the backend would get.
    async fn through(tracer: Option<Arc<RequestTracer>>, req: Request) -> HeaderMap {
        let backend = tower::service_fn(|mut req: Request| async move {
            propagate(&mut req);
            let mut resp = Response::new(body::empty());
            *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            if let Some(context) = RequestContext::of(req.extensions()) {
                context.set_route(RoutedTo::api_service("v1alpha1.wardle.example.com", false));
            }
            resp.extensions_mut().insert(req.headers().clone());
            Ok::<_, Infallible>(resp)
        });
        let resp = Trace::layer(tracer)
            .layer(backend)
            .oneshot(req)
            .await
            .unwrap();
        resp.extensions().get::<HeaderMap>().unwrap().clone()
    }

    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const CALLER_SPAN: &str = "b7ad6b7169203331";

    fn flunder_request(traceparent: Option<&str>) -> Request {
        let mut req = http::Request::get(
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders/one?pretty=true",
        );
        if let Some(tp) = traceparent {
            req = req
                .header("traceparent", tp)
                .header("tracestate", "vendor=x");
        }
        // The listener's context, which carries the route back out.
        req.extension(RequestContext::new(ConnInfo::new(
            "192.0.2.7:5555".parse().unwrap(),
        )))
        .body(body::empty())
        .unwrap()
    }

    fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    #[tokio::test]
    async fn a_sampled_callers_trace_continues_through_the_gateway_to_the_backend() {
        let (tracer, spans, _provider) = tracer(Sampler::AlwaysOff);
        let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
        let sent = through(tracer, flunder_request(Some(&caller))).await;

        let spans = spans.0.lock().unwrap();
        assert_eq!(spans.len(), 1, "one span per request");
        let span = &spans[0];
        assert_eq!(span.span_context.trace_id().to_string(), TRACE);
        assert_eq!(span.parent_span_id.to_string(), CALLER_SPAN);
        assert_eq!(span.span_kind, SpanKind::Server);
        assert_eq!(
            span.name,
            "GET /apis/wardle.example.com/v1alpha1/namespaces/{:namespace}/flunders/{:name}"
        );
        for (key, want) in [
            (
                "aggregation_gateway.route",
                Value::from("apiservice/v1alpha1.wardle.example.com"),
            ),
            (
                "aggregation_gateway.apiservice",
                Value::from("v1alpha1.wardle.example.com"),
            ),
            ("http.response.status_code", Value::I64(503)),
            ("http.request.method", Value::from("GET")),
            ("url.query", Value::from("pretty=true")),
        ] {
            assert_eq!(attribute(span, key), Some(&want), "{key}");
        }
        assert!(
            matches!(
                attribute(span, "aggregation_gateway.backend.duration_ms"),
                Some(Value::F64(ms)) if *ms >= 0.0
            ),
            "{:?}",
            span.attributes
        );
        assert!(
            matches!(span.status, Status::Error { .. }),
            "5xx is an error"
        );

        // The backend's parent is the gateway's span, in the caller's trace, still sampled.
        let own = span.span_context.span_id().to_string();
        assert_eq!(sent["traceparent"], format!("00-{TRACE}-{own}-01").as_str());
        assert_eq!(sent["tracestate"], "vendor=x");
    }

    #[tokio::test]
    async fn an_unsampled_request_is_not_exported_but_its_trace_still_reaches_the_backend() {
        let (tracer, spans, _provider) = tracer(Sampler::AlwaysOff);
        let sent = through(tracer, flunder_request(None)).await;
        assert!(spans.0.lock().unwrap().is_empty());
        let traceparent = sent["traceparent"].to_str().unwrap();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{traceparent}");
        assert_ne!(parts[1], TraceId::INVALID.to_string(), "{traceparent}");
        assert_eq!(parts[3], "00", "not sampled: {traceparent}");
    }

    #[tokio::test]
    async fn the_sampling_rate_decides_for_requests_without_a_sampled_parent() {
        let (tracer, spans, _provider) = tracer(Sampler::AlwaysOn);
        through(tracer, flunder_request(None)).await;
        let spans = spans.0.lock().unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(
            spans[0].parent_span_id,
            opentelemetry::trace::SpanId::INVALID
        );
    }

    #[tokio::test]
    async fn without_tracing_the_callers_trace_headers_pass_untouched() {
        let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
        let sent = through(None, flunder_request(Some(&caller))).await;
        assert_eq!(sent["traceparent"], caller.as_str());
        assert_eq!(sent["tracestate"], "vendor=x");
    }

    #[test]
    fn span_names_follow_kube_apiserver() {
        for (method, path, want) in [
            (
                Method::GET,
                "/api/v1/namespaces/default/pods/p/log",
                "GET /api/v1/namespaces/{:namespace}/pods/{:name}/log",
            ),
            (
                Method::POST,
                "/apis/apps/v1/namespaces/default/deployments",
                "POST /apis/apps/v1/namespaces/{:namespace}/deployments",
            ),
            (
                Method::GET,
                "/apis/apiregistration.k8s.io/v1/apiservices",
                "GET /apis/apiregistration.k8s.io/v1/apiservices",
            ),
        ] {
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(body::empty())
                .unwrap();
            assert_eq!(resource_span_name(&req).as_deref(), Some(want), "{path}");
        }
        let discovery = http::Request::get("/apis").body(body::empty()).unwrap();
        assert_eq!(resource_span_name(&discovery), None);
    }
}
