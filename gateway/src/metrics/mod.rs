//! Prometheus metrics in the classic text format, named as kube-apiserver and kube-aggregator
//! name them where the concept is the same (so existing dashboards and alerts such as
//! `KubeAggregatedAPIDown` work unchanged). Families are registered once at start; recording is
//! lock-free after the first use of a label set.

pub mod inflight;
pub mod known_resources;
pub mod request_labels;
mod runtime;
mod series;

use std::sync::Arc;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub use inflight::Watermark;
pub use known_resources::KnownResources;
pub use request_labels::RequestLabels;

/// kube's `component` label for requests the gateway proxies to a remote APIService, as
/// kube-aggregator records them.
pub const AGGREGATOR: &str = "aggregator";
/// kube's `component` label for everything else.
pub const APISERVER: &str = "apiserver";

/// kube-apiserver's buckets for `apiserver_request_duration_seconds`.
const REQUEST_DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];
/// kube-apiserver's buckets for `apiserver_request_sli_duration_seconds`.
const REQUEST_SLI_BUCKETS: [f64; 21] = [
    0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
    30.0, 45.0, 60.0,
];
/// The gateway's own latency buckets: finer at the low end, where a proxy's cost shows.
const GATEWAY_DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

pub struct Metrics {
    registry: Registry,
    /// kube's labels: verb, dry_run, group, version, resource, subresource, scope, component,
    /// code, system_client.
    requests: IntCounterVec,
    /// kube's labels without code and system_client: time to response headers.
    duration: HistogramVec,
    /// kube's labels without dry_run, code and system_client.
    sli_duration: HistogramVec,
    /// kube's labels without dry_run and system_client: requests the gateway answered itself in
    /// self-defense (429, 504, 413) or as the aggregator (a remote APIService it cannot reach).
    terminations: IntCounterVec,
    /// verb, target (`core`, `gateway`, `apiservice/<name>`), code: where requests went.
    gateway_requests: IntCounterVec,
    /// verb, target: time to response headers.
    gateway_duration: HistogramVec,
    /// `apiserver_current_inflight_requests{request_kind="readOnly"}`: see [`inflight`].
    executing_read_only: Arc<Watermark>,
    /// `apiserver_current_inflight_requests{request_kind="mutating"}`.
    executing_mutating: Arc<Watermark>,
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
    /// name: 1 while this replica holds the leader-election Lease of that name, else 0.
    pub leader_election_master_status: IntGaugeVec,
    /// Audit events handed to the audit log writer.
    pub audit_event_total: IntCounter,
    /// Audit events dropped (queue full or write error), as kube's `plugin="log"` errors.
    pub audit_error_total: IntCounter,
    /// certificate: `serving` | `proxy-client`: the notAfter of the leaf in use, as Unix
    /// seconds, set at start and on every reload (for the certificate expiry alert).
    pub certificate_expiration: IntGaugeVec,
    /// request_kind: readOnly | mutating: the in-flight limit the `inflight` gauge counts up to
    /// (absent when unlimited), for the saturation alert.
    pub inflight_limit: IntGaugeVec,
    /// kube-aggregator's: merged `/openapi/v2` rebuilds, by the APIService whose spec changed
    /// (`core` for the core's) and why (`add`, `update`, `delete`).
    pub openapi_v2_regeneration_count: IntCounterVec,
    /// kube-aggregator's: seconds the last rebuild took, by reason.
    pub openapi_v2_regeneration_duration: prometheus::GaugeVec,
    /// loop: times a supervised loop ended and was started again (`app::supervisor`).
    pub loop_restarts: IntCounterVec,
    /// The request families' series by label set, resolved once (see [`series`]).
    series: series::SeriesCache,
}

/// One finished request, as the access log saw it.
pub struct Observed<'a> {
    pub labels: &'a RequestLabels,
    /// [`AGGREGATOR`] or [`APISERVER`].
    pub component: &'static str,
    /// Where the router sent it (`gateway`, `core`, `apiservice/<name>`).
    pub target: &'a str,
    pub code: http::StatusCode,
    /// Time to response headers.
    pub elapsed: std::time::Duration,
    /// The gateway answered it itself in self-defense or as the aggregator.
    pub terminated: bool,
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

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        registry
            .register(Box::new(runtime::RuntimeCollector::new()))
            .expect("metric registered once");
        let inflight = gauge(&registry, "apiserver_current_inflight_requests", "Maximal number of currently used inflight request limit of this apiserver per request kind in last second.", &["request_kind"]);
        Self {
            requests: counter(&registry, "apiserver_request_total", "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.", &["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component", "code", "system_client"]),
            duration: histogram(&registry, "apiserver_request_duration_seconds", "Response latency distribution in seconds (to response headers) for each verb, dry run value, group, version, resource, subresource, scope and component.", &REQUEST_DURATION_BUCKETS, &["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component"]),
            sli_duration: histogram(&registry, "apiserver_request_sli_duration_seconds", "Response latency distribution in seconds (to response headers) for each verb, group, version, resource, subresource, scope and component.", &REQUEST_SLI_BUCKETS, &["verb", "group", "version", "resource", "subresource", "scope", "component"]),
            terminations: counter(&registry, "apiserver_request_terminations_total", "Number of requests which apiserver terminated in self-defense.", &["verb", "group", "version", "resource", "subresource", "scope", "component", "code"]),
            gateway_requests: counter(&registry, "aggregation_gateway_requests_total", "Requests through the gateway by verb, route target (gateway, core, apiservice/<name>) and HTTP code", &["verb", "target", "code"]),
            gateway_duration: histogram(&registry, "aggregation_gateway_request_duration_seconds", "Time to response headers by verb and route target", &GATEWAY_DURATION_BUCKETS, &["verb", "target"]),
            executing_read_only: Watermark::new(inflight.with_label_values(&["readOnly"])),
            executing_mutating: Watermark::new(inflight.with_label_values(&["mutating"])),
            unavailable_apiservice: gauge(&registry, "aggregator_unavailable_apiservice", "Gauge of APIServices which are marked as unavailable broken down by APIService name", &["name"]),
            unavailable_apiservice_total: counter(&registry, "aggregator_unavailable_apiservice_total", "Counter of APIServices which are marked as unavailable broken down by APIService name and reason", &["name", "reason"]),
            invalid_apiservice: gauge(&registry, "aggregation_gateway_invalid_apiservice", "APIServices whose definition was refused by validation (1): not routed, or (file source) routed by their last good definition", &["name"]),
            invalid_apiservice_manifest: gauge(&registry, "aggregation_gateway_invalid_apiservice_manifest", "APIService manifest files the file source could not read or parse (1); the APIServices they last held stay in force", &["file"]),
            discovery_aggregation_total: counter(&registry, "aggregator_discovery_aggregation_count_total", "Counter of number of times discovery was aggregated", &[]),
            leader_election_master_status: gauge(&registry, "leader_election_master_status", "1 while this replica holds the leader-election Lease named by name (it writes APIService status), 0 while it is a backup", &["name"]),
            audit_event_total: counter(&registry, "apiserver_audit_event_total", "Counter of audit events generated and sent to the audit backend", &[]).with_label_values(&[] as &[&str]),
            audit_error_total: counter(&registry, "apiserver_audit_error_total", "Counter of audit events that failed to be audited properly. Plugin identifies the plugin affected by the error", &["plugin"]).with_label_values(&["log"]),
            certificate_expiration: gauge(&registry, "aggregation_gateway_certificate_expiration_timestamp_seconds", "Expiry (notAfter, Unix seconds) of the certificate the gateway presents, by certificate: serving (to clients) or proxy-client (to backends and the core); updated on reload", &["certificate"]),
            openapi_v2_regeneration_count: counter(&registry, "aggregator_openapi_v2_regeneration_count", "Counter of OpenAPI v2 spec regeneration count broken down by causing APIService name and reason.", &["apiservice", "reason"]),
            openapi_v2_regeneration_duration: {
                let g = prometheus::GaugeVec::new(Opts::new("aggregator_openapi_v2_regeneration_duration", "Gauge of OpenAPI v2 spec regeneration duration in seconds."), &["reason"]).expect("valid metric definition");
                registry.register(Box::new(g.clone())).expect("metric registered once");
                g
            },
            inflight_limit: gauge(&registry, "aggregation_gateway_max_inflight_requests", "The in-flight limit of apiserver_current_inflight_requests by request_kind (--max-requests-inflight, --max-mutating-requests-inflight); absent when unlimited", &["request_kind"]),
            loop_restarts: counter(&registry, "aggregation_gateway_loop_restarts_total", "Times a long-running loop of the gateway ended (panicked or returned) and was started again, by loop", &["loop"]),
            registry,
            series: series::SeriesCache::default(),
        }
    }

    /// The watermark `apiserver_current_inflight_requests{request_kind}` reports for a request
    /// of this kind.
    pub fn executing(&self, mutating: bool) -> &Arc<Watermark> {
        if mutating {
            &self.executing_mutating
        } else {
            &self.executing_read_only
        }
    }

    /// Publishes `apiserver_current_inflight_requests` every second, as kube-apiserver does.
    pub async fn publish_inflight(self: Arc<Self>) {
        let mut every = tokio::time::interval(inflight::PUBLISH_PERIOD);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.executing_read_only.publish();
            self.executing_mutating.publish();
        }
    }

    /// Records one finished request in kube's families and the gateway's own.
    pub fn observe(&self, request: Observed<'_>) {
        let Observed {
            labels,
            component,
            target,
            code,
            elapsed,
            terminated,
        } = request;
        let n = &labels.names;
        let (group, version, resource, subresource) =
            (&*n.group, &*n.version, &*n.resource, &*n.subresource);
        let code_label = code.as_str();
        let seconds = elapsed.as_secs_f64();
        let key = series::SeriesKey {
            verb: labels.verb,
            dry_run: labels.dry_run,
            names: n,
            scope: labels.scope,
            component,
            system_client: labels.system_client,
            target,
            code: code.as_u16(),
        };
        let resolve = || series::Series {
            requests: self.requests.with_label_values(&[
                labels.verb,
                labels.dry_run,
                group,
                version,
                resource,
                subresource,
                labels.scope,
                component,
                code_label,
                labels.system_client,
            ]),
            duration: self.duration.with_label_values(&[
                labels.verb,
                labels.dry_run,
                group,
                version,
                resource,
                subresource,
                labels.scope,
                component,
            ]),
            sli_duration: self.sli_duration.with_label_values(&[
                labels.verb,
                group,
                version,
                resource,
                subresource,
                labels.scope,
                component,
            ]),
            gateway_requests: self.gateway_requests.with_label_values(&[
                labels.verb,
                target,
                code_label,
            ]),
            gateway_duration: self
                .gateway_duration
                .with_label_values(&[labels.verb, target]),
        };
        self.series.with(&key, resolve, |series| {
            series.requests.inc();
            series.duration.observe(seconds);
            series.sli_duration.observe(seconds);
            series.gateway_requests.inc();
            series.gateway_duration.observe(seconds);
        });
        if terminated {
            self.terminations
                .with_label_values(&[
                    labels.verb,
                    group,
                    version,
                    resource,
                    subresource,
                    labels.scope,
                    component,
                    code_label,
                ])
                .inc();
        }
    }

    /// The registry, for families registered elsewhere (`apiserver_flowcontrol_*`), so that one
    /// `/metrics` answer carries them all.
    pub fn registry(&self) -> &Registry {
        &self.registry
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
    use std::sync::Arc;
    use std::time::Duration;

    use super::known_resources::ResourceLabels;
    use super::*;

    #[test]
    fn exposition_has_kubernetes_names_and_labels() {
        let m = Metrics::new();
        let labels = RequestLabels {
            verb: "LIST",
            dry_run: "",
            names: ResourceLabels {
                group: Arc::from("wardle.example.com"),
                version: Arc::from("v1alpha1"),
                resource: Arc::from("flunders"),
                subresource: Arc::from(""),
            },
            scope: "namespace",
            system_client: "",
        };
        m.observe(Observed {
            labels: &labels,
            component: AGGREGATOR,
            target: "apiservice/v1alpha1.wardle.example.com",
            code: http::StatusCode::SERVICE_UNAVAILABLE,
            elapsed: Duration::from_millis(2),
            terminated: true,
        });
        m.unavailable_apiservice
            .with_label_values(&["v1alpha1.wardle.example.com"])
            .set(1);
        m.unavailable_apiservice_total
            .with_label_values(&["v1alpha1.wardle.example.com", "FailedDiscoveryCheck"])
            .inc();
        let text = m.encode();
        for series in [
            r#"apiserver_request_total{code="503",component="aggregator",dry_run="",group="wardle.example.com",resource="flunders",scope="namespace",subresource="",system_client="",verb="LIST",version="v1alpha1"} 1"#,
            r#"apiserver_request_duration_seconds_count{component="aggregator",dry_run="",group="wardle.example.com",resource="flunders",scope="namespace",subresource="",verb="LIST",version="v1alpha1"} 1"#,
            r#"apiserver_request_sli_duration_seconds_count{component="aggregator",group="wardle.example.com",resource="flunders",scope="namespace",subresource="",verb="LIST",version="v1alpha1"} 1"#,
            r#"apiserver_request_terminations_total{code="503",component="aggregator",group="wardle.example.com",resource="flunders",scope="namespace",subresource="",verb="LIST",version="v1alpha1"} 1"#,
            r#"aggregation_gateway_requests_total{code="503",target="apiservice/v1alpha1.wardle.example.com",verb="LIST"} 1"#,
            r#"aggregator_unavailable_apiservice{name="v1alpha1.wardle.example.com"} 1"#,
            r#"aggregator_unavailable_apiservice_total{name="v1alpha1.wardle.example.com",reason="FailedDiscoveryCheck"} 1"#,
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
    }

    fn get_pods(names: ResourceLabels) -> RequestLabels {
        RequestLabels {
            verb: "GET",
            dry_run: "",
            names,
            scope: "resource",
            system_client: "",
        }
    }

    fn pods() -> ResourceLabels {
        ResourceLabels {
            group: Arc::from(""),
            version: Arc::from("v1"),
            resource: Arc::from("pods"),
            subresource: Arc::from(""),
        }
    }

    fn observe(m: &Metrics, labels: &RequestLabels, target: &str, code: u16) {
        m.observe(Observed {
            labels,
            component: APISERVER,
            target,
            code: http::StatusCode::from_u16(code).unwrap(),
            elapsed: Duration::from_millis(1),
            terminated: false,
        });
    }

    /// Kept series (see `series`) count into the same series as a fresh lookup: the same names
    /// from a rebuilt discovery index (new `Arc`s) and the same labels again add up; another
    /// code or target is a series of its own.
    #[test]
    fn requests_with_the_same_labels_count_in_one_series() {
        let m = Metrics::new();
        let first = get_pods(pods());
        observe(&m, &first, "core", 200);
        observe(&m, &first, "core", 200);
        observe(&m, &get_pods(pods()), "core", 200);
        observe(&m, &first, "core", 404);
        observe(&m, &first, "gateway", 200);
        let text = m.encode();
        for series in [
            // kube's family has no target label: the request the gateway answered counts here too.
            r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",system_client="",verb="GET",version="v1"} 4"#,
            r#"apiserver_request_total{code="404",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",system_client="",verb="GET",version="v1"} 1"#,
            r#"apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 5"#,
            r#"aggregation_gateway_requests_total{code="200",target="core",verb="GET"} 3"#,
            r#"aggregation_gateway_requests_total{code="200",target="gateway",verb="GET"} 1"#,
            r#"aggregation_gateway_request_duration_seconds_count{target="core",verb="GET"} 4"#,
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
    }

    /// Past its bound the cache starts over, and nothing is lost: every request is counted.
    #[test]
    fn a_full_series_cache_still_counts_every_request() {
        let m = Metrics::new();
        // Each rebuilt index is a new key to the cache; more of them than it keeps.
        for _ in 0..(series::MAX_SERIES + 10) {
            observe(&m, &get_pods(pods()), "core", 200);
        }
        let text = m.encode();
        let expected = format!(
            r#"apiserver_request_total{{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",system_client="",verb="GET",version="v1"}} {}"#,
            series::MAX_SERIES + 10
        );
        assert!(text.contains(&expected), "{expected} missing from\n{text}");
    }
}
