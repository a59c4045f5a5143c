//! A user with aggregated API servers behind the gateway (one with aggregated discovery, one
//! legacy-only) sees one merged discovery in kube-aggregator's order: over HTTP (v2, v2beta1 and
//! legacy, with ETags and 304s), through kubectl 1.32 and 1.29, and through the OpenAPI v3
//! documents `explain` and strict `apply` read. A stopped backend only turns its own group
//! Stale. Behind the scenes the gateway revalidates each backing Service once per round and
//! rebuilds nothing on a 304, and a brand-new backend (even one without OpenAPI v3) shows up
//! within 2 s.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::CertifiedPair;
use e2e::fixture;
use e2e::harness::{self, FixtureAggregated, FixtureCore, Gateway, Kubectl, KubectlVersion};
use e2e::scenario::{self, get_raw, json_or_null, ApiService, Pki};
use http::{HeaderMap, StatusCode};
use http_body_util::Full;
use serde_json::Value;

const WARDLE: &str = "wardle.example.com";
const LEGACY: &str = "legacy.example.com";
const LATE: &str = "late.example.com";

/// What kubectl 1.32 sends for `/api` and `/apis`.
const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// What kubectl 1.29 sends.
const KUBECTL_1_29: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// kube-aggregator's order of the session's groups: `apiregistration.k8s.io` first, then by
/// groupPriorityMinimum, highest first. The core's groups take the priorities kube-apiserver
/// registers for them (apps 17800, authentication.k8s.io 17700, authorization.k8s.io 17600,
/// discovery.k8s.io 16200; the core fixture itself lists discovery.k8s.io before
/// authentication.k8s.io); legacy.example.com is registered at 17700, ties with
/// authentication.k8s.io and comes second by name; wardle.example.com is at 1000.
const GROUPS: [&str; 7] = [
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    LEGACY,
    "authorization.k8s.io",
    "discovery.k8s.io",
    WARDLE,
];

/// The versions the wardle backend serves, its own preference first.
const WARDLE_SERVED: &str = "v1alpha1,v1beta1,v1";

/// wardle.example.com's APIServices with their versionPriority, in the order discovery lists
/// them: v1beta1 and v1alpha1 tie at 15 and the Kubernetes version order puts beta first; v1 is
/// at 5, last although GA.
const WARDLE_VERSIONS: [(&str, u32); 3] = [("v1beta1", 15), ("v1alpha1", 15), ("v1", 5)];

fn wardle_order() -> [&'static str; 3] {
    WARDLE_VERSIONS.map(|(version, _)| version)
}

// ---- the session ------------------------------------------------------------------------------

/// A core, the wardle backend (aggregated discovery, three APIServices on its one Service) and
/// the legacy backend (legacy discovery only), registered from manifests, behind a gateway.
struct Session {
    pki: Pki,
    manifests: tempfile::TempDir,
    wardle: FixtureAggregated,
    legacy: FixtureAggregated,
    gateway: Gateway,
    alice: CertifiedPair,
    _core: FixtureCore,
}

impl Session {
    /// `unregistered`: backends already running as Service `api` of a namespace, whose
    /// APIServices come later.
    async fn start(
        pki: Pki,
        unregistered: &[(&str, &FixtureAggregated)],
        gateway_args: &[&str],
    ) -> Session {
        let core = FixtureCore::start(&[]).await.unwrap();
        let wardle = pki.start_backend(WARDLE, WARDLE_SERVED, &[]).await;
        let legacy = pki.start_backend(LEGACY, "v1", &["--legacy-only"]).await;
        let manifests = tempfile::tempdir().unwrap();
        for (version, priority) in WARDLE_VERSIONS {
            ApiService {
                version_priority: priority,
                ..pki.apiservice(WARDLE, version, "wardle")
            }
            .write_to(manifests.path(), &format!("wardle-{version}.yaml"));
        }
        pki.apiservice(LEGACY, "v1", "legacy")
            .group_priority_minimum(17700)
            .write_to(manifests.path(), "legacy.yaml");
        let mut services = vec![("wardle", &wardle), ("legacy", &legacy)];
        services.extend_from_slice(unregistered);
        let config = pki.gateway_config(&services, "");
        let gateway = pki
            .start_gateway_with_file_source(&core, &config, manifests.path(), gateway_args)
            .await;
        let alice = pki.user("alice", &[]);
        let session = Session {
            pki,
            manifests,
            wardle,
            legacy,
            gateway,
            alice,
            _core: core,
        };
        session
            .wait_for_discovery(Duration::from_secs(10), "both backends fetched", |doc| {
                freshness(doc, WARDLE) == ["Current"; 3] && freshness(doc, LEGACY) == ["Current"]
            })
            .await;
        session
    }

    fn kubectl(&self, version: KubectlVersion) -> Kubectl {
        scenario::kubectl_as(&self.gateway, version, &self.alice)
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, Bytes) {
        get_raw(&self.gateway, &self.alice, path, headers).await
    }

    async fn aggregated_apis(&self) -> Value {
        json_or_null(&self.get("/apis", &[("accept", AGG)]).await.2)
    }

    /// Polls the aggregated `/apis` until `check` holds, and returns it; fails after `timeout`.
    async fn wait_for_discovery(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let doc = self.aggregated_apis().await;
            if check(&doc) {
                return doc;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {timeout:?}:\n{doc:#}\n{}",
                self.gateway.process.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Registers an APIService, as a user adding its manifest.
    fn register(&self, api: &ApiService) {
        api.write_to(self.manifests.path(), &format!("{}.yaml", api.name()));
    }

    /// `aggregator_discovery_aggregation_count_total`.
    async fn rebuilds(&self) -> u64 {
        let metrics = self.get("/metrics", &[]).await.2;
        let metrics = String::from_utf8_lossy(&metrics);
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("aggregator_discovery_aggregation_count_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no rebuild counter in:\n{metrics}")) as u64
    }

    /// The gateway's access log from line `from` on, as (uri, status).
    fn requests_since(&self, from: usize) -> Vec<(String, u64)> {
        self.gateway.process.lines()[from..]
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
            .filter_map(|v| Some((v["uri"].as_str()?.to_owned(), v["status"].as_u64()?)))
            .collect()
    }

    /// Waits until the access log from line `from` shows `uri` answered with `status`.
    async fn wait_for_request(&self, from: usize, uri: &str, status: u64) {
        let logged = harness::wait_until(Duration::from_secs(5), || async {
            self.requests_since(from)
                .iter()
                .any(|(u, s)| u == uri && *s == status)
        })
        .await;
        assert!(
            logged,
            "no {uri} answered {status}:\n{}",
            self.gateway.process.logs()
        );
    }

    /// The GETs of `path` that `backend` (Service `<namespace>/api`) received from the
    /// gateway's own identity.
    async fn gateway_fetches(
        &self,
        backend: &FixtureAggregated,
        namespace: &str,
        path: &str,
    ) -> Vec<Value> {
        self.pki
            .backend_requests(backend, namespace)
            .await
            .into_iter()
            .filter(|r| r["method"] == "GET" && r["path"] == path && r["clientCN"] == "aggregator")
            .collect()
    }

    async fn forget_requests(&self, backend: &FixtureAggregated, namespace: &str) {
        let req = http::Request::delete(format!("{}/fixture/requests", backend.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let client = self.pki.backend_client(namespace);
        assert_eq!(harness::send(&client, req).await.unwrap().0, StatusCode::OK);
    }
}

/// The ETag of the aggregated `/apis` the wardle backend serves (v2, the version the gateway
/// asks for first).
fn wardle_backend_etag() -> String {
    let versions: Vec<String> = WARDLE_SERVED.split(',').map(str::to_owned).collect();
    let doc = fixture::discovery::aggregated_list(
        &fixture::aggregated_server::table(WARDLE, &versions),
        false,
        "v2",
    );
    let body = serde_json::to_vec(&doc).unwrap();
    format!("\"{}\"", fixture::discovery::sha512_hex_upper(&body))
}

// ---- reading discovery documents --------------------------------------------------------------

static NULL: Value = Value::Null;

/// The groups of an aggregated list (`items`) or an APIGroupList (`groups`), in order.
fn group_names(doc: &Value) -> Vec<&str> {
    groups(doc)
        .map(|g| {
            g["metadata"]["name"]
                .as_str()
                .or(g["name"].as_str())
                .unwrap_or("")
        })
        .collect()
}

fn groups(doc: &Value) -> impl Iterator<Item = &Value> {
    doc["items"]
        .as_array()
        .or(doc["groups"].as_array())
        .into_iter()
        .flatten()
}

fn group<'a>(doc: &'a Value, name: &str) -> &'a Value {
    groups(doc)
        .find(|g| g["metadata"]["name"] == name || g["name"] == name)
        .unwrap_or(&NULL)
}

/// The versions of group `name` in `doc`, in order.
fn versions<'a>(doc: &'a Value, name: &str) -> Vec<&'a str> {
    of_versions(group(doc, name), "version")
}

fn freshness<'a>(doc: &'a Value, name: &str) -> Vec<&'a str> {
    of_versions(group(doc, name), "freshness")
}

/// `field` of each of `group`'s versions; every kind of discovery document calls the version
/// itself `version`.
fn of_versions<'a>(group: &'a Value, field: &str) -> Vec<&'a str> {
    group["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v[field].as_str().unwrap_or(""))
        .collect()
}

/// The resources of `name`/`version` in an aggregated list, sorted.
fn resources<'a>(doc: &'a Value, name: &str, version: &str) -> Vec<&'a str> {
    let mut names: Vec<&str> = group(doc, name)["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["version"] == version)
        .flat_map(|v| v["resources"].as_array().into_iter().flatten())
        .filter_map(|r| r["resource"].as_str())
        .collect();
    names.sort_unstable();
    names
}

/// The APIVERSION column of `kubectl api-resources` for `resource`, sorted.
fn listed_versions<'a>(table: &'a str, resource: &str) -> Vec<&'a str> {
    let mut versions: Vec<&str> = table
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(resource))
        .filter_map(|l| l.split_whitespace().find(|c| c.contains('/')))
        .collect();
    versions.sort_unstable();
    versions
}

/// Whether `uri` is legacy discovery of one group-version (`/api/v1`, `/apis/<g>/<v>`).
fn is_group_version_discovery(uri: &str) -> bool {
    let path = uri.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["api", _] | ["apis", _, _])
}

fn with_group_before<'a>(groups: &[&'a str], new: &'a str, before: &str) -> Vec<&'a str> {
    let mut out = groups.to_vec();
    let at = out.iter().position(|g| *g == before).unwrap();
    out.insert(at, new);
    out
}

// ---- sessions ---------------------------------------------------------------------------------

#[tokio::test]
async fn one_discovery_in_kube_aggregator_order() {
    let mut s = Session::start(Pki::for_services(&["wardle", "legacy"]), &[], &[]).await;

    // Every representation of /apis lists the groups in kube-aggregator's order, with caching
    // headers and a 304 for its ETag; v2beta1 is what kubectl 1.29 negotiates.
    for (accept, version) in [(AGG, "v2"), (V2BETA1, "v2beta1"), (KUBECTL_1_29, "v2beta1")] {
        let (status, headers, body) = s.get("/apis?timeout=32s", &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "{accept}");
        assert_eq!(
            headers["content-type"],
            format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
                .as_str()
        );
        assert_eq!(headers["vary"], "Accept");
        assert_eq!(headers["cache-control"], "public");
        let doc = json_or_null(&body);
        assert_eq!(doc["apiVersion"], format!("apidiscovery.k8s.io/{version}"));
        assert_eq!(group_names(&doc), GROUPS, "{accept}");
        assert_eq!(versions(&doc, WARDLE), wardle_order());
        let etag = headers["etag"].to_str().unwrap().to_owned();
        assert!(etag.len() > 2 && etag.starts_with('"'), "{etag}");
        let (status, headers, body) = s
            .get("/apis/", &[("accept", accept), ("if-none-match", &etag)])
            .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{accept}");
        assert_eq!(headers["etag"], etag.as_str());
        assert!(body.is_empty());
    }
    let doc = s.aggregated_apis().await;
    assert_eq!(resources(&doc, WARDLE, "v1beta1"), ["fischers", "flunders"]);

    // kubectl 1.32 (aggregated v2): every group-version, and each resource at its group's
    // preferred version, the first in the order above.
    let kubectl = s.kubectl(KubectlVersion::V1_32);
    let versions_out = kubectl.run_ok(&["api-versions"]).await.stdout;
    // kubectl sorts these itself.
    assert_eq!(
        versions_out.lines().collect::<Vec<_>>(),
        [
            "apiregistration.k8s.io/v1",
            "apps/v1",
            "authentication.k8s.io/v1",
            "authorization.k8s.io/v1",
            "discovery.k8s.io/v1",
            "legacy.example.com/v1",
            "v1",
            "wardle.example.com/v1",
            "wardle.example.com/v1alpha1",
            "wardle.example.com/v1beta1",
        ]
    );
    let table = kubectl.run_ok(&["api-resources"]).await.stdout;
    assert_eq!(
        listed_versions(&table, "flunders"),
        ["legacy.example.com/v1", "wardle.example.com/v1beta1"],
        "{table}"
    );

    // The same cache dir again: discovery is revalidated, not re-sent.
    let from = s.gateway.process.line_count();
    kubectl.run_ok(&["api-resources"]).await;
    s.wait_for_request(from, "/apis?timeout=32s", 304).await;
    s.wait_for_request(from, "/api?timeout=32s", 304).await;

    // `get --raw` is legacy discovery, in the same order.
    let raw: Value =
        serde_json::from_str(&kubectl.run_ok(&["get", "--raw", "/apis"]).await.stdout).unwrap();
    assert_eq!(raw["kind"], "APIGroupList");
    assert_eq!(group_names(&raw), GROUPS);
    assert_eq!(versions(&raw, WARDLE), wardle_order());
    assert_eq!(
        group(&raw, WARDLE)["preferredVersion"]["groupVersion"],
        "wardle.example.com/v1beta1"
    );
    let wardle: Value = serde_json::from_str(
        &kubectl
            .run_ok(&["get", "--raw", "/apis/wardle.example.com/"])
            .await
            .stdout,
    )
    .unwrap();
    assert_eq!(wardle["kind"], "APIGroup");
    assert_eq!(of_versions(&wardle, "version"), wardle_order());
    assert_eq!(
        wardle["preferredVersion"]["groupVersion"],
        "wardle.example.com/v1beta1"
    );

    // kubectl 1.29 negotiates v2beta1: the aggregated documents and no per-group-version legacy
    // discovery, which is what it would fall back to.
    let old = s.kubectl(KubectlVersion::V1_29);
    let from = s.gateway.process.line_count();
    let table = old.run_ok(&["api-resources"]).await.stdout;
    assert_eq!(
        listed_versions(&table, "flunders"),
        ["legacy.example.com/v1", "wardle.example.com/v1beta1"],
        "{table}"
    );
    s.wait_for_request(from, "/apis?timeout=32s", 200).await;
    let requests = s.requests_since(from);
    assert!(
        !requests
            .iter()
            .any(|(uri, _)| is_group_version_discovery(uri)),
        "kubectl 1.29 fell back to legacy discovery: {requests:?}"
    );

    // OpenAPI v3: the merged root lists the core's and each APIService's document; those are
    // passed through with their caching rules.
    let root = json_or_null(&s.get("/openapi/v3", &[]).await.2);
    for key in [
        "api/v1",
        "apis/apps/v1",
        "apis/wardle.example.com/v1beta1",
        "apis/wardle.example.com/v1alpha1",
        "apis/wardle.example.com/v1",
        "apis/legacy.example.com/v1",
    ] {
        assert!(
            root["paths"][key]["serverRelativeURL"].is_string(),
            "{key}: {root:#}"
        );
    }
    let url = root["paths"]["apis/wardle.example.com/v1beta1"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    let (status, headers, body) = s.get(url, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "public, immutable");
    assert!(String::from_utf8_lossy(&body).contains("Flunder"));
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let (status, _, body) = s.get(url, &[("if-none-match", &etag)]).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (status, headers, _) = s
        .get(
            "/openapi/v3/apis/wardle.example.com/v1beta1?hash=0123456789ABCDEF",
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(headers["location"], url);
    let (status, _, body) = s.get("/openapi/v3/apis/nope.example.com/v1", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json_or_null(&body)["kind"], "Status");

    // explain and strict server-side validation read the remote's OpenAPI.
    let explain = kubectl.run_ok(&["explain", "flunders.spec"]).await.stdout;
    assert!(explain.contains("reference"), "{explain}");
    let applied = kubectl
        .apply_yaml("apiVersion: wardle.example.com/v1beta1\nkind: Flunder\nmetadata:\n  name: first\n  namespace: default\nspec:\n  reference: other\n")
        .await;
    assert!(applied.stdout.contains("created"), "{applied}");

    // The legacy backend stops: its group goes Stale with the resources it last listed, and
    // kubectl hides only that group.
    let known = resources(&doc, LEGACY, "v1");
    assert_eq!(known, ["fischers", "flunders"]);
    s.legacy.process.kill();
    let doc = s
        .wait_for_discovery(Duration::from_secs(15), "legacy.example.com Stale", |d| {
            freshness(d, LEGACY) == ["Stale"]
        })
        .await;
    assert_eq!(resources(&doc, LEGACY, "v1"), known);
    assert_eq!(freshness(&doc, WARDLE), ["Current"; 3]);
    let out = s
        .kubectl(KubectlVersion::V1_32)
        .run(&["api-resources"])
        .await;
    assert!(out.success(), "{out}");
    assert_eq!(
        listed_versions(&out.stdout, "flunders"),
        ["wardle.example.com/v1beta1"],
        "{out}"
    );
}

#[tokio::test]
async fn backends_are_revalidated_once_per_service_and_a_new_one_shows_up_within_2s() {
    let pki = Pki::for_services(&["wardle", "legacy", "late"]);
    // A third team's API server, without OpenAPI v3, runs already; its APIService comes later.
    let late = pki.start_backend(LATE, "v1", &["--no-openapi"]).await;
    let s = Session::start(
        pki,
        &[("late", &late)],
        &["--discovery-refresh-interval", "1s"],
    )
    .await;

    // Every round asks each backing Service once, however many APIServices it backs (wardle:
    // three, legacy: one), revalidating what it has; a 304 rebuilds nothing.
    let rebuilds = s.rebuilds().await;
    s.forget_requests(&s.wardle, "wardle").await;
    s.forget_requests(&s.legacy, "legacy").await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let wardle = s.gateway_fetches(&s.wardle, "wardle", "/apis").await;
    let legacy = s.gateway_fetches(&s.legacy, "legacy", "/apis").await;
    assert!(legacy.len() >= 2, "no round each second: {legacy:#?}");
    assert!(
        !wardle.is_empty() && wardle.len() <= legacy.len() + 1,
        "wardle's Service fetched {} times, legacy's {}",
        wardle.len(),
        legacy.len()
    );
    let etag = wardle_backend_etag();
    for request in &wardle {
        let if_none_match = request["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|h| h[0] == "if-none-match")
            .and_then(|h| h[1].as_str());
        assert_eq!(if_none_match, Some(etag.as_str()), "{request:#}");
    }
    assert_eq!(s.rebuilds().await, rebuilds);

    // The new backend's APIService: a Service the gateway never fetched shows up, Current and
    // with its resources, within 2 s. At 1000 it ties with wardle.example.com and sorts first.
    s.register(&s.pki.apiservice(LATE, "v1", "late"));
    let doc = s
        .wait_for_discovery(Duration::from_secs(2), "the new backend", |d| {
            freshness(d, LATE) == ["Current"]
        })
        .await;
    assert_eq!(resources(&doc, LATE, "v1"), ["fischers", "flunders"]);
    assert_eq!(group_names(&doc), with_group_before(&GROUPS, LATE, WARDLE));
    assert!(s.rebuilds().await > rebuilds);
    let table = s
        .kubectl(KubectlVersion::V1_32)
        .run_ok(&["api-resources"])
        .await
        .stdout;
    assert!(
        listed_versions(&table, "flunders").contains(&"late.example.com/v1"),
        "{table}"
    );

    // It has no OpenAPI v3: it contributes no document, everyone else's stay listed.
    s.gateway
        .process
        .wait_for_line(
            |l| l.contains("backend has no /openapi/v3"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_or_else(|| panic!("{}", s.gateway.process.logs()));
    let root = json_or_null(&s.get("/openapi/v3", &[]).await.2);
    let keys: Vec<&str> = root["paths"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.keys().map(String::as_str))
        .filter(|k| k.contains(".example.com"))
        .collect();
    assert_eq!(
        keys.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [
            "apis/legacy.example.com/v1",
            "apis/wardle.example.com/v1",
            "apis/wardle.example.com/v1alpha1",
            "apis/wardle.example.com/v1beta1",
        ]
        .into_iter()
        .collect(),
        "{root:#}"
    );
    let (status, _, _) = s.get("/openapi/v3/apis/late.example.com/v1", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        freshness(&s.aggregated_apis().await, LATE),
        ["Current"],
        "{}",
        s.gateway.process.logs()
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
