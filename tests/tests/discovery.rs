//! A user with two aggregated API servers behind the gateway (one with aggregated discovery, one
//! legacy-only) sees one merged discovery: `kubectl api-versions`/`api-resources` (1.32 and 1.29)
//! list both groups, the HTTP cache revalidates with 304s, `explain` and strict `apply` work
//! through the merged OpenAPI v3, a stopped backend only hides its own group, and a new
//! APIService shows up within 2 s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness::{
    self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, Kubectl, KubectlVersion,
};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

struct Pki {
    dir: tempfile::TempDir,
    backend_ca: TestCa,
    backend_cert: (PathBuf, PathBuf),
    proxy_ca_file: PathBuf,
    proxy_client: (PathBuf, PathBuf),
    users_ca: TestCa,
    users_ca_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let backend_ca = TestCa::new("backends-ca");
        let backend_cert = backend_ca
            .issue_server(&["api.wardle.svc", "api.legacy.svc", "localhost", "127.0.0.1"])
            .write(dir.path(), "backend-serving")
            .unwrap();
        let proxy_ca = TestCa::new("front-proxy-ca");
        let proxy_ca_file = proxy_ca.write(dir.path(), "front-proxy-ca").unwrap();
        let proxy_client = proxy_ca
            .issue_client("aggregator", &[])
            .write(dir.path(), "proxy-client")
            .unwrap();
        let users_ca = TestCa::new("users-ca");
        let users_ca_file = users_ca.write(dir.path(), "users-ca").unwrap();
        Pki {
            dir,
            backend_ca,
            backend_cert,
            proxy_ca_file,
            proxy_client,
            users_ca,
            users_ca_file,
        }
    }

    fn user(&self, name: &str) -> CertifiedPair {
        self.users_ca.issue_client(name, &[])
    }

    async fn start_backend(
        &self,
        group: &str,
        versions: &str,
        extra: &[&str],
    ) -> FixtureAggregated {
        let (cert, key) = &self.backend_cert;
        let mut args = vec![
            "--tls-cert-file".to_owned(),
            path(cert),
            "--tls-private-key-file".to_owned(),
            path(key),
            "--requestheader-client-ca-file".to_owned(),
            path(&self.proxy_ca_file),
            "--requestheader-allowed-names".to_owned(),
            "aggregator".to_owned(),
            "--group".to_owned(),
            group.to_owned(),
            "--version".to_owned(),
            versions.to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        FixtureAggregated::start(&args)
            .await
            .expect("aggregated fixture starts")
    }

    async fn gateway(
        &self,
        core: &FixtureCore,
        services: &[(&str, &FixtureAggregated)],
        manifests: &Path,
    ) -> Gateway {
        let mut yaml = String::from("services:\n");
        for (namespace, backend) in services {
            yaml.push_str(&format!(
                "- namespace: {namespace}\n  name: api\n  port: 443\n  urls: [\"https://{}\"]\n",
                backend.addr
            ));
        }
        let config = self.dir.path().join("gateway.yaml");
        std::fs::write(&config, yaml).unwrap();
        let (cert, key) = &self.proxy_client;
        let args = vec![
            "--config".to_owned(),
            path(&config),
            "--proxy-client-cert-file".to_owned(),
            path(cert),
            "--proxy-client-key-file".to_owned(),
            path(key),
            "--client-ca-file".to_owned(),
            path(&self.users_ca_file),
            "--apiservice-availability-interval".to_owned(),
            "1s".to_owned(),
            "--apiservice-source".to_owned(),
            "file".to_owned(),
            "--apiservice-dir".to_owned(),
            path(manifests),
        ];
        Gateway::start(GatewayOptions::new(core.url()).args(args))
            .await
            .expect("gateway starts")
    }

    fn apiservice_yaml(
        &self,
        group: &str,
        version: &str,
        namespace: &str,
        priority: i32,
    ) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.backend_ca.cert_pem());
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {version}.{group}\nspec:\n  \
             group: {group}\n  version: {version}\n  groupPriorityMinimum: {priority}\n  versionPriority: 15\n  \
             caBundle: {ca}\n  service:\n    namespace: {namespace}\n    name: api\n    port: 443\n"
        )
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

async fn get_raw(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let client = harness::http2_client(&gateway.ca_pem().unwrap(), Some(user)).unwrap();
    let mut req = Request::get(format!("{}{path}", gateway.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    harness::send(&client, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap()
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
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let wardle = pki
        .start_backend("wardle.example.com", "v1alpha1,v1beta1", &[])
        .await;
    let mut legacy = pki
        .start_backend("legacy.example.com", "v1", &["--legacy-only"])
        .await;
    let manifests = tempfile::tempdir().unwrap();
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        pki.apiservice_yaml("wardle.example.com", "v1alpha1", "wardle", 1000),
    )
    .unwrap();
    std::fs::write(
        manifests.path().join("legacy.yaml"),
        pki.apiservice_yaml("legacy.example.com", "v1", "legacy", 900),
    )
    .unwrap();
    let gateway = pki
        .gateway(
            &core,
            &[("wardle", &wardle), ("legacy", &legacy)],
            manifests.path(),
        )
        .await;
    let alice = pki.user("alice");
    let kubectl = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_32,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();

    // Both groups become current once the backends were fetched.
    let merged = harness::wait_until(Duration::from_secs(10), || async {
        let (status, _, body) = get_raw(&gateway, &alice, "/apis", &[("accept", AGG)]).await;
        let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
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
    let old = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_29,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();
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
    std::fs::write(
        manifests.path().join("wardle-beta.yaml"),
        pki.apiservice_yaml("wardle.example.com", "v1beta1", "wardle", 1000),
    )
    .unwrap();
    let added = harness::wait_until(Duration::from_secs(2), || async {
        let (_, _, body) = get_raw(&gateway, &alice, "/apis", &[("accept", AGG)]).await;
        let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
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
        let (_, _, body) = get_raw(&gateway, &alice, "/apis", &[("accept", AGG)]).await;
        let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        freshness(&doc, "legacy.example.com") == ["Stale"]
    })
    .await;
    assert!(stale, "{}", gateway.process.logs());
    let fresh = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_32,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();
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
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        pki.apiservice_yaml("wardle.example.com", "v1alpha1", "wardle", 1000),
    )
    .unwrap();
    let gateway = pki
        .gateway(&core, &[("wardle", &wardle)], manifests.path())
        .await;
    let alice = pki.user("alice");
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        let (status, headers, body) = get_raw(&gateway, &alice, "/api", &[("accept", AGG)]).await;
        let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
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
    let kubectl = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_32,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();
    let current = harness::wait_until(Duration::from_secs(10), || async {
        let out = kubectl.run(&["api-resources"]).await;
        out.success()
            && out.stdout.contains("wardle.example.com/v1alpha1")
            && out.stdout.contains("configmaps")
    })
    .await;
    assert!(current, "{}", kubectl.run(&["api-resources"]).await);
}
