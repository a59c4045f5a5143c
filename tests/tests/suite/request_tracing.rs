//! Request tracing as an operator turns it on: kube-apiserver's `--tracing-config-file` pointed
//! at an OTLP/gRPC collector (the suite's own receiver, `e2e::otlp`). A request that arrives with
//! a sampled W3C `traceparent` yields one gateway span in the caller's trace, and the backend it
//! went to (an aggregated API server, or the core) receives a `traceparent` in the same trace
//! whose parent is that span: the trace crosses the gateway.

use std::time::Duration;

use e2e::otlp::{OtlpReceiver, ReceivedSpan};
use e2e::scenario::{self, recorded_header, Scenario, WARDLE_GROUP};
use serde_json::Value;

const APISERVICE: &str = "v1alpha1.wardle.example.com";
/// OTLP's `SPAN_KIND_SERVER`.
const SERVER: i32 = 2;

/// The recorded request whose path contains `fragment` and whose `traceparent` is in `trace`;
/// returns the parent span id it names.
fn parent_seen(requests: &[Value], fragment: &str, trace: &str) -> Option<String> {
    requests
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains(fragment)))
        .filter_map(|r| recorded_header(r, "traceparent").into_iter().next())
        .find_map(|tp| {
            let parts: Vec<&str> = tp.split('-').collect();
            (parts.len() == 4 && parts[1] == trace).then(|| parts[2].to_owned())
        })
}

fn span_of<'a>(spans: &'a [ReceivedSpan], trace: &str) -> Option<&'a ReceivedSpan> {
    spans.iter().find(|s| s.trace_id == trace)
}

#[tokio::test]
async fn a_callers_trace_crosses_the_gateway_to_the_backend_and_the_core() {
    let receiver = OtlpReceiver::start().await;
    let builder = Scenario::wardle().apiservice(WARDLE_GROUP, "v1alpha1", "wardle");
    // Sampling 0 per million: only callers' sampled traces are exported, as with kube-apiserver.
    let config = builder.pki().write(
        "tracing.yaml",
        &format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {}\nsamplingRatePerMillion: 0\n",
            receiver.endpoint()
        ),
    );
    let s = builder
        .gateway_args(&["--tracing-config-file", config.to_str().unwrap()])
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    assert!(
        scenario::serves(
            &s.gateway,
            &alice,
            flunders,
            "FlunderList",
            Duration::from_secs(10)
        )
        .await,
        "{}",
        s.logs()
    );

    let (to_backend, to_core) = (
        ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
    );
    let configmaps = "/api/v1/namespaces/default/configmaps";
    for (path, (trace, caller)) in [(flunders, to_backend), (configmaps, to_core)] {
        let header = format!("00-{trace}-{caller}-01");
        let (status, _) = s.get(&alice, path, &[("traceparent", &header)]).await;
        assert_eq!(status, http::StatusCode::OK, "{path}");
    }

    // The SDK exports in batches (every few seconds).
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            span_of(spans, to_backend.0).is_some() && span_of(spans, to_core.0).is_some()
        })
        .await;
    let backend_span = span_of(&spans, to_backend.0).unwrap_or_else(|| {
        panic!(
            "no span in trace {}: {spans:#?}\n{}",
            to_backend.0,
            s.logs()
        )
    });
    let core_span = span_of(&spans, to_core.0)
        .unwrap_or_else(|| panic!("no span in trace {}: {spans:#?}\n{}", to_core.0, s.logs()));

    for (span, caller, route, status) in [
        (
            backend_span,
            to_backend.1,
            format!("apiservice/{APISERVICE}"),
            "200",
        ),
        (core_span, to_core.1, "core".to_owned(), "200"),
    ] {
        assert_eq!(
            span.parent_span_id, caller,
            "the caller's span is the parent: {span:#?}"
        );
        assert_eq!(span.kind, SERVER, "{span:#?}");
        assert_eq!(span.service_name, "aggregation-gateway", "{span:#?}");
        let attr = |k: &str| span.attributes.get(k).map(String::as_str);
        assert_eq!(
            attr("aggregation_gateway.route"),
            Some(route.as_str()),
            "{span:#?}"
        );
        assert_eq!(attr("http.response.status_code"), Some(status), "{span:#?}");
        assert_eq!(attr("http.request.method"), Some("GET"), "{span:#?}");
        assert!(
            attr("aggregation_gateway.backend.duration_ms")
                .and_then(|ms| ms.parse::<f64>().ok())
                .is_some_and(|ms| ms > 0.0),
            "the backend's time is recorded: {span:#?}"
        );
    }
    assert_eq!(
        backend_span.name,
        "GET /apis/wardle.example.com/v1alpha1/namespaces/{:namespace}/flunders"
    );
    assert_eq!(
        backend_span
            .attributes
            .get("aggregation_gateway.apiservice")
            .map(String::as_str),
        Some(APISERVICE)
    );
    assert_eq!(
        core_span.name,
        "GET /api/v1/namespaces/{:namespace}/configmaps"
    );
    assert!(!core_span
        .attributes
        .contains_key("aggregation_gateway.apiservice"));

    // Each backend was told the gateway's span is its parent, in the caller's trace.
    let backend_requests = s.pki.backend_requests(s.backend("wardle"), "wardle").await;
    assert_eq!(
        parent_seen(&backend_requests, "/flunders", to_backend.0).as_deref(),
        Some(backend_span.span_id.as_str()),
        "the aggregated server's traceparent: {backend_requests:#?}"
    );
    let core_requests = scenario::core_requests(&s.core).await;
    assert_eq!(
        parent_seen(&core_requests, "/configmaps", to_core.0).as_deref(),
        Some(core_span.span_id.as_str()),
        "the core's traceparent"
    );
}
