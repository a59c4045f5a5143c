//! The optional ServiceMonitor and Ingress follow their switches and point at the gateway's
//! `https` port.

use k8s_openapi::api::networking::v1::Ingress;

use e2e::helm::{label, Rendered, EXAMPLES, FULLNAME, NAMESPACE};

use super::typed::ServiceMonitor;
use e2e::table::check_each;

#[test]
fn service_monitor_and_ingress_follow_their_switches() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            assert_eq!(
                r.has("ServiceMonitor"),
                example == Some("external-core"),
                "{}",
                label(example)
            );
            assert_eq!(
                r.has("Ingress"),
                example == Some("external-core"),
                "{}",
                label(example)
            );
        },
    );
    let r = Rendered::of(Some("external-core"));
    let sm: ServiceMonitor = r.get("ServiceMonitor", FULLNAME);
    let ep = &sm.spec.endpoints[0];
    assert_eq!(
        (ep.port.as_str(), ep.path.as_str(), ep.scheme.as_str()),
        ("https", "/metrics", "https")
    );
    assert_eq!(sm.metadata.labels.unwrap()["release"], "prometheus");
    // The scrape verifies the serving certificate (its Secret's CA, the Service's name) and
    // authenticates as the scraper's ServiceAccount, which /metrics authorization needs.
    let tls = serde_json::to_value(ep.tls_config.as_ref().unwrap()).unwrap();
    assert_eq!(
        tls,
        serde_json::json!({
            "ca": {"secret": {"name": "edge-gateway-serving", "key": "ca.crt"}},
            "serverName": format!("{FULLNAME}.{NAMESPACE}.svc"),
        })
    );
    assert_eq!(
        ep.bearer_token_file.as_deref(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    assert_eq!(r.config()["authorizeMetrics"], true);
    let ing: Ingress = r.get("Ingress", FULLNAME);
    let spec = ing.spec.unwrap();
    assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
    let backend = spec.rules.unwrap()[0].http.as_ref().unwrap().paths[0]
        .backend
        .service
        .clone()
        .unwrap();
    assert_eq!(
        (backend.name.as_str(), backend.port.unwrap().name.as_deref()),
        (FULLNAME, Some("https"))
    );
}

/// With /metrics authorized, the scraper is granted `get` on it where the gateway's
/// SubjectAccessReview is answered: the core's manifests for a core elsewhere, this cluster when
/// it is the core. A serving certificate nobody can verify is refused rather than skipped.
#[test]
fn the_scraper_may_read_metrics_and_verifies_the_gateway() {
    let r = Rendered::of(Some("external-core"));
    let docs = &r.core_manifests()["metrics-reader.yaml"];
    let role = &docs[0];
    assert_eq!(role["kind"], "ClusterRole");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let binding = &docs[1];
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}])
    );

    let in_cluster = Rendered::with(
        Some("external-core"),
        &["core.url=https://kubernetes.default.svc"],
    );
    let roles = in_cluster.all("ClusterRole");
    assert!(
        roles
            .iter()
            .any(|d| d["metadata"]["name"] == format!("{FULLNAME}-metrics-reader").as_str()),
        "{}",
        in_cluster.names()
    );
    assert!(!in_cluster
        .core_manifests()
        .contains_key("metrics-reader.yaml"));

    let err = e2e::helm::helm_template(&[], &["monitoring.serviceMonitor.enabled=true"])
        .expect_err("a ServiceMonitor that cannot verify the gateway must be refused");
    assert!(
        err.contains("cannot be verified") && err.contains("monitoring.serviceMonitor.tlsConfig"),
        "{err}"
    );
}
