//! OpenTelemetry export for `--tracing-config-file`, set up the way kube-apiserver sets up its own
//! (component-base/tracing `NewProvider`): OTLP over gRPC to the configured collector without TLS,
//! spans batched before export, and a parent-based sampler that samples
//! `samplingRatePerMillion` of the requests no sampled caller vouches for (none at 0). The spans
//! themselves are made by the `trace` layer (`crate::front::stack::trace`); the trace context they hand to
//! backends ([`RequestTrace`], [`propagate`]) lives here, below the stack and the backends, so
//! that proxying a request does not reach up into the stack.
//!
//! Why gRPC and not OTLP/HTTP: kube's `endpoint` is a gRPC target (`host:port`, default
//! `localhost:4317`), so the same file pointed at the same collector must work for both. The
//! exporter is the opentelemetry-otlp crate's tonic client (its `channel` part only: no server, no
//! TLS), which costs a few seconds of a cold build on top of the hyper/h2/tower stack the gateway
//! already compiles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gateway_config::TracingConfig;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use crate::body::Request;

/// The `service.name` of the gateway's spans.
pub const SERVICE_NAME: &str = "aggregation-gateway";

/// How long one export (with the exporter's few retries) may take before its batch is dropped:
/// the queue is bounded, and tracing must not hold memory while the collector is away.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("tracing exporter for {endpoint}: {source}")]
pub struct TracingSetupError {
    endpoint: String,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

/// The tracer provider of a tracing configuration. Must be called within the Tokio runtime: the
/// gRPC channel's connection task runs on it. Nothing is dialled until the first export.
pub fn provider(config: &TracingConfig) -> Result<SdkTracerProvider, TracingSetupError> {
    let endpoint = format!("http://{}", config.endpoint);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|source| TracingSetupError {
            endpoint: config.endpoint.clone(),
            source,
        })?;
    // kube: ParentBased(TraceIDRatioBased(rate / 1e6)), or ParentBased(NeverSample) at 0.
    let root = match config.sampling_rate_per_million {
        0 => Sampler::AlwaysOff,
        1_000_000 => Sampler::AlwaysOn,
        rate => Sampler::TraceIdRatioBased(f64::from(rate) / 1_000_000.0),
    };
    Ok(SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(root)))
        .with_batch_exporter(LoggedExporter {
            inner: exporter,
            endpoint: config.endpoint.clone(),
            failing: AtomicBool::new(false),
        })
        .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build())
        .build())
}

/// Flushes the spans still queued and stops the export thread; at shutdown, off the runtime's
/// worker threads since it blocks until the last export returned.
pub async fn shutdown(provider: SdkTracerProvider) {
    let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    if let Ok(Err(e)) = done {
        tracing::warn!(error = %e, "tracing: the last spans could not be exported");
    }
}

/// The exporter with its state changes logged: one line when exports start failing (a
/// collector that is down fails every few seconds), one when they work again.
#[derive(Debug)]
struct LoggedExporter<E> {
    inner: E,
    endpoint: String,
    failing: AtomicBool,
}

// === impl LoggedExporter ===

impl<E: SpanExporter> SpanExporter for LoggedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        match &result {
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                endpoint = %self.endpoint,
                error = %e,
                spans,
                "tracing: cannot export spans to the collector; dropping them until it answers"
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!(endpoint = %self.endpoint, "tracing: exporting spans again")
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

// === The W3C trace context a request carries to its backend ===

/// The gateway's span of a request, in its extensions: the parent the backend is told about,
/// and when the request was handed to it.
#[derive(Clone)]
pub struct RequestTrace(Arc<Shared>);

// === impl RequestTrace ===

impl RequestTrace {
    pub fn new(span: SpanContext) -> Self {
        Self(Arc::new(Shared {
            span,
            sent: OnceLock::new(),
        }))
    }

    /// When the request went to its backend or the core, if it did.
    pub fn sent(&self) -> Option<Instant> {
        self.0.sent.get().copied()
    }
}

struct Shared {
    span: SpanContext,
    /// Set by [`propagate`] when the request is first prepared for a backend or the core.
    sent: OnceLock<Instant>,
}

/// Writes the gateway's span into `req` as its `traceparent` (and `tracestate`), replacing the
/// caller's, and notes the time the request goes to its backend. Does nothing for a request
/// that is not traced.
pub fn propagate(req: &mut Request) {
    let Some(trace) = req.extensions().get::<RequestTrace>().cloned() else {
        return;
    };
    let _ = trace.0.sent.set(Instant::now());
    let cx = opentelemetry::Context::new().with_remote_span_context(trace.0.span.clone());
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(req.headers_mut()));
}

/// Reads the W3C headers of a request.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

// === impl HeaderExtractor ===

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes them; an empty value (no `tracestate`) removes what the caller sent.
struct HeaderInjector<'a>(&'a mut HeaderMap);

// === impl HeaderInjector ===

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            return;
        };
        match HeaderValue::from_str(&value) {
            Ok(v) if !value.is_empty() => {
                self.0.insert(name, v);
            }
            _ => {
                self.0.remove(name);
            }
        }
    }
}
