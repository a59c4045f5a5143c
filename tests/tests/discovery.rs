//! A user with two aggregated API servers behind the gateway (one with aggregated discovery, one
//! legacy-only) sees one merged discovery: `kubectl api-versions`/`api-resources` (1.32 and 1.29)
//! list both groups, the HTTP cache revalidates with 304s, `explain` and strict `apply` work
//! through the merged OpenAPI v3, a stopped backend only hides its own group, and a new
//! APIService shows up within 2 s.

use std::time::Duration;

use e2e::certs::CertifiedPair;
use e2e::harness::{self, FixtureCore, Gateway, KubectlVersion};
use e2e::scenario::{self, get_raw, json_or_null, Pki};
use http::StatusCode;
use serde_json::Value;

const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// `/apis` as aggregated discovery: the status and the document (`null` if not JSON).
async fn aggregated_apis(gateway: &Gateway, user: &CertifiedPair) -> (StatusCode, Value) {
    let (status, _, body) = get_raw(gateway, user, "/apis", &[("accept", AGG)]).await;
    (status, json_or_null(&body))
}

/// The `freshness` of `group`'s versions in the aggregated `/apis`.
fn freshness(doc: &Value, group: &str) -> Vec<String> {
    doc["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["metadata"]["name"] == group)
        .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
        .map(|v| v["freshness"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Gateway access-log lines for `uri` answered with `status`.
fn access_lines(gateway: &Gateway, uri: &str, status: u16) -> usize {
    gateway
        .process
        .lines()
        .iter()
        .filter(|l| {
            l.text.contains(&format!("\"uri\":\"{uri}\""))
                && l.text.contains(&format!("\"status\":{status}"))
        })
        .count()
}

#[tokio::test]
async fn two_backends_merge_into_one_discovery() {
    let pki = Pki::for_services(&["wardle", "legacy"]);
    let core = FixtureCore::start(&[]).await.unwrap();
    let wardle = pki
        .start_backend("wardle.example.com", "v1alpha1,v1beta1", &[])
        .await;
    let mut legacy = pki
        .start_backend("legacy.example.com", "v1", &["--legacy-only"])
        .await;
    let manifests = tempfile::tempdir().unwrap();
    pki.apiservice("wardle.example.com", "v1alpha1", "wardle")
        .write_to(manifests.path(), "wardle.yaml");
    pki.apiservice("legacy.example.com", "v1", "legacy")
        .group_priority_minimum(900)
        .write_to(manifests.path(), "legacy.yaml");
    let config = pki.gateway_config(&[("wardle", &wardle), ("legacy", &legacy)], "");
    let gateway = pki
        .start_gateway_with_file_source(&core, &config, manifests.path(), &[])
        .await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);

    // Both groups become current once the backends were fetched.
    let merged = harness::wait_until(Duration::from_secs(10), || async {
        let (status, doc) = aggregated_apis(&gateway, &alice).await;
        status == StatusCode::OK
            && freshness(&doc, "wardle.example.com") == ["Current"]
            && freshness(&doc, "legacy.example.com") == ["Current"]
    })
    .await;
    assert!(merged, "{}", gateway.process.logs());

    // Headers of the aggregated answer, and a 304 for its ETag.
    let (status, headers, body) =
        get_raw(&gateway, &alice, "/apis?timeout=32s", &[("accept", AGG)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(headers["vary"], "Accept");
    assert_eq!(headers["cache-control"], "public");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let doc: Value = serde_json::from_slice(&body).unwrap();
    let flunders = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["metadata"]["name"] == "wardle.example.com")
        .unwrap()["versions"][0]["resources"]
        .to_string();
    assert!(flunders.contains("flunders"), "{flunders}");
    let (status, headers, body) = get_raw(
        &gateway,
        &alice,
        "/apis/",
        &[("accept", AGG), ("if-none-match", &etag)],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(headers["etag"], etag.as_str());
    assert!(body.is_empty());

    // kubectl 1.32 (aggregated v2).
    let versions = kubectl.run_ok(&["api-versions"]).await.stdout;
    for gv in ["wardle.example.com/v1alpha1", "legacy.example.com/v1", "v1"] {
        assert!(
            versions.lines().any(|l| l == gv),
            "{gv} missing:\n{versions}"
        );
    }
    let resources = kubectl.run_ok(&["api-resources"]).await.stdout;
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("flunders") && l.contains("wardle.example.com/v1alpha1")),
        "{resources}"
    );
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("flunders") && l.contains("legacy.example.com/v1")),
        "{resources}"
    );

    // The same cache dir again: discovery is revalidated, not re-sent.
    let before = access_lines(&gateway, "/apis?timeout=32s", 304);
    kubectl.run_ok(&["api-resources"]).await;
    assert!(
        access_lines(&gateway, "/apis?timeout=32s", 304) > before,
        "{}",
        gateway.process.logs()
    );
    assert!(
        access_lines(&gateway, "/api?timeout=32s", 304) > 0,
        "{}",
        gateway.process.logs()
    );

    // `get --raw /apis` is the legacy APIGroupList.
    let raw: Value =
        serde_json::from_str(&kubectl.run_ok(&["get", "--raw", "/apis"]).await.stdout).unwrap();
    assert_eq!(raw["kind"], "APIGroupList");
    let names: Vec<&str> = raw["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"wardle.example.com") && names.contains(&"legacy.example.com"),
        "{names:?}"
    );
    let group: Value = serde_json::from_str(
        &kubectl
            .run_ok(&["get", "--raw", "/apis/legacy.example.com/"])
            .await
            .stdout,
    )
    .unwrap();
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(
        group["preferredVersion"]["groupVersion"],
        "legacy.example.com/v1"
    );

    // kubectl 1.29 (aggregated v2beta1).
    let old = scenario::kubectl_as(&gateway, KubectlVersion::V1_29, &alice);
    let resources = old.run_ok(&["api-resources"]).await.stdout;
    assert!(
        resources.contains("wardle.example.com/v1alpha1")
            && resources.contains("legacy.example.com/v1"),
        "{resources}"
    );

    // OpenAPI v3 through the merged root: explain, and strict server-side validation on apply.
    let root: Value =
        serde_json::from_slice(&get_raw(&gateway, &alice, "/openapi/v3", &[]).await.2).unwrap();
    assert!(
        root["paths"]["apis/wardle.example.com/v1alpha1"]["serverRelativeURL"].is_string(),
        "{root}"
    );
    let (status, _, _) = get_raw(
        &gateway,
        &alice,
        "/openapi/v3/apis/nope.example.com/v1",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let explain = kubectl.run_ok(&["explain", "flunders.spec"]).await.stdout;
    assert!(explain.contains("reference"), "{explain}");
    let applied = kubectl
        .apply_yaml("apiVersion: wardle.example.com/v1alpha1\nkind: Flunder\nmetadata:\n  name: first\n  namespace: default\nspec:\n  reference: other\n")
        .await;
    assert!(applied.stdout.contains("created"), "{applied}");

    // A new APIService shows up within 2 s.
    pki.apiservice("wardle.example.com", "v1beta1", "wardle")
        .write_to(manifests.path(), "wardle-beta.yaml");
    let added = harness::wait_until(Duration::from_secs(2), || async {
        let (_, doc) = aggregated_apis(&gateway, &alice).await;
        freshness(&doc, "wardle.example.com") == ["Current", "Current"]
    })
    .await;
    assert!(
        added,
        "v1beta1 not in discovery within 2s:\n{}",
        gateway.process.logs()
    );

    // The legacy backend stops: its group goes Stale, kubectl hides only that group.
    legacy.process.kill();
    let stale = harness::wait_until(Duration::from_secs(15), || async {
        let (_, doc) = aggregated_apis(&gateway, &alice).await;
        freshness(&doc, "legacy.example.com") == ["Stale"]
    })
    .await;
    assert!(stale, "{}", gateway.process.logs());
    let fresh = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let out = fresh.run(&["api-resources"]).await;
    assert!(out.success(), "{out}");
    assert!(!out.stdout.contains("legacy.example.com"), "{out}");
    assert!(out.stdout.contains("wardle.example.com/v1"), "{out}");

    let metrics = get_raw(&gateway, &alice, "/metrics", &[]).await.2;
    assert!(
        String::from_utf8_lossy(&metrics).contains("aggregator_discovery_aggregation_count_total")
    );
}

#[tokio::test]
async fn a_legacy_only_core_is_converted() {
    let pki = Pki::new();
    let core = FixtureCore::start(&["--no-aggregated-discovery"])
        .await
        .unwrap();
    let wardle = pki
        .start_backend("wardle.example.com", "v1alpha1", &[])
        .await;
    let manifests = tempfile::tempdir().unwrap();
    pki.apiservice("wardle.example.com", "v1alpha1", "wardle")
        .write_to(manifests.path(), "wardle.yaml");
    let config = pki.gateway_config(&[("wardle", &wardle)], "");
    let gateway = pki
        .start_gateway_with_file_source(&core, &config, manifests.path(), &[])
        .await;
    let alice = pki.user("alice", &[]);
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        let (status, headers, body) = get_raw(&gateway, &alice, "/api", &[("accept", AGG)]).await;
        let doc = json_or_null(&body);
        status == StatusCode::OK
            && headers
                .get("content-type")
                .is_some_and(|c| c.to_str().unwrap_or("").contains("apidiscovery"))
            && doc["items"][0]["versions"][0]["resources"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
    })
    .await;
    assert!(ready, "{}", gateway.process.logs());
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let current = harness::wait_until(Duration::from_secs(10), || async {
        let out = kubectl.run(&["api-resources"]).await;
        out.success()
            && out.stdout.contains("wardle.example.com/v1alpha1")
            && out.stdout.contains("configmaps")
    })
    .await;
    assert!(current, "{}", kubectl.run(&["api-resources"]).await);
}
