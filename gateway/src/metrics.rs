//! Prometheus metrics, named as kube-apiserver and kube-aggregator name them where the concept
//! is the same. Families are registered once at start; recording is lock-free.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    /// `core`, `gateway` (answered by the gateway itself) or `apiservice/<name>`.
    pub target: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub verb: String,
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RequestKind {
    readOnly,
    mutating,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub request_kind: RequestKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<TargetLabels, Histogram, fn() -> Histogram>,
    pub inflight: Family<KindLabels, Gauge>,
    pub rejected: Family<ReasonLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "apiserver_request",
            "Requests through the gateway by verb, route target and HTTP code",
            requests.clone(),
        );
        let duration = Family::<TargetLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "apiserver_request_duration_seconds",
            "Time to response headers by verb and route target",
            duration.clone(),
        );
        let inflight = Family::<KindLabels, Gauge>::default();
        registry.register(
            "apiserver_current_inflight_requests",
            "Requests in flight, read-only and mutating counted apart (long-running excluded)",
            inflight.clone(),
        );
        let rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "apiserver_request_terminations",
            "Requests the gateway answered itself with an error (too many requests, timeout, body too large, ...)",
            rejected.clone(),
        );
        Self { registry, requests, duration, inflight, rejected }
    }

    /// For controllers that add their own families at start (before the registry is shared).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_kubernetes_names() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels { verb: "GET".into(), target: "core".into(), code: 200 })
            .inc();
        m.duration
            .get_or_create(&TargetLabels { verb: "GET".into(), target: "core".into() })
            .observe(0.002);
        let text = m.encode();
        assert!(text.contains("apiserver_request_total{verb=\"GET\",target=\"core\",code=\"200\"} 1"), "{text}");
        assert!(text.contains("# TYPE apiserver_request_duration_seconds histogram"), "{text}");
    }
}
