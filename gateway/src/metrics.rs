//! Prometheus metrics in the classic text format, named as kube-apiserver and kube-aggregator
//! name them where the concept is the same (so existing dashboards and alerts such as
//! `KubeAggregatedAPIDown` work unchanged). Families are registered once at start; recording is
//! lock-free after the first use of a label set.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// verb, target (`core`, `gateway`, `apiservice/<name>`), code.
    pub requests: IntCounterVec,
    /// verb, target: time to response headers.
    pub duration: HistogramVec,
    /// request_kind: readOnly | mutating.
    pub inflight: IntGaugeVec,
    /// reason: requests the gateway refused itself (TooManyRequests, RequestEntityTooLarge, ...).
    pub rejected: IntCounterVec,
    /// name: 1 when the APIService is unavailable, 0 when available.
    pub unavailable_apiservice: IntGaugeVec,
    /// name, reason: transitions to unavailable.
    pub unavailable_apiservice_total: IntCounterVec,
    /// name: APIServices whose definition was refused by validation. Not routed, unless a refused
    /// manifest edit left the last good definition in force (file source).
    pub invalid_apiservice: IntGaugeVec,
    /// file: manifest files the file source could not read or parse, so no APIService name is
    /// known for the problem.
    pub invalid_apiservice_manifest: IntGaugeVec,
    /// Rebuilds of the merged aggregated discovery document.
    pub discovery_aggregation_total: IntCounterVec,
    /// Audit events handed to the audit log writer.
    pub audit_event_total: IntCounter,
    /// Audit events dropped (queue full or write error), as kube's `plugin="log"` errors.
    pub audit_error_total: IntCounter,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "apiserver_request_duration_seconds",
                "Time to response headers by verb, route target and HTTP code",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ]),
            &["verb", "target", "code"],
        )
        .expect("valid metric definition");
        registry
            .register(Box::new(duration.clone()))
            .expect("metric registered once");
        Self {
            requests: counter(&registry, "apiserver_request_total", "Requests through the gateway by verb, route target and HTTP code", &["verb", "target", "code"]),
            duration,
            inflight: gauge(&registry, "apiserver_current_inflight_requests", "Requests in flight, read-only and mutating counted apart (long-running excluded)", &["request_kind"]),
            rejected: counter(&registry, "apiserver_request_terminations_total", "Requests the gateway answered itself with an error, by reason", &["reason"]),
            unavailable_apiservice: gauge(&registry, "aggregator_unavailable_apiservice", "Gauge of APIServices which are marked as unavailable broken down by APIService name", &["name"]),
            unavailable_apiservice_total: counter(&registry, "aggregator_unavailable_apiservice_total", "Counter of APIServices which are marked as unavailable broken down by APIService name and reason", &["name", "reason"]),
            invalid_apiservice: gauge(&registry, "aggregation_gateway_invalid_apiservice", "APIServices whose definition was refused by validation (1): not routed, or (file source) routed by their last good definition", &["name"]),
            invalid_apiservice_manifest: gauge(&registry, "aggregation_gateway_invalid_apiservice_manifest", "APIService manifest files the file source could not read or parse (1); the APIServices they last held stay in force", &["file"]),
            discovery_aggregation_total: counter(&registry, "aggregator_discovery_aggregation_count_total", "Counter of number of times discovery was aggregated", &[]),
            audit_event_total: counter(&registry, "apiserver_audit_event_total", "Counter of audit events generated and sent to the audit backend", &[]).with_label_values(&[] as &[&str]),
            audit_error_total: counter(&registry, "apiserver_audit_error_total", "Counter of audit events that failed to be audited properly. Plugin identifies the plugin affected by the error", &["plugin"]).with_label_values(&["log"]),
            registry,
        }
    }

    pub fn encode(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
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
        m.requests.with_label_values(&["GET", "core", "200"]).inc();
        m.duration
            .with_label_values(&["GET", "core", "200"])
            .observe(0.002);
        m.unavailable_apiservice
            .with_label_values(&["v1alpha1.wardle.example.com"])
            .set(1);
        m.unavailable_apiservice_total
            .with_label_values(&["v1alpha1.wardle.example.com", "FailedDiscoveryCheck"])
            .inc();
        let text = m.encode();
        assert!(
            text.contains("apiserver_request_total{code=\"200\",target=\"core\",verb=\"GET\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE apiserver_request_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                "apiserver_request_duration_seconds_count{code=\"200\",target=\"core\",verb=\"GET\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "aggregator_unavailable_apiservice{name=\"v1alpha1.wardle.example.com\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("aggregator_unavailable_apiservice_total{name=\"v1alpha1.wardle.example.com\",reason=\"FailedDiscoveryCheck\"} 1"), "{text}");
    }
}
