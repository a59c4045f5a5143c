//! A user with aggregated API servers behind the gateway (one with aggregated discovery, one
//! legacy-only) sees one merged discovery in kube-aggregator's order: over HTTP (v2, v2beta1 and
//! legacy, with ETags and 304s), through kubectl 1.32 and 1.29, and through the OpenAPI v3
//! documents `explain` and strict `apply` read. A stopped backend only turns its own group
//! Stale. Behind the scenes the gateway revalidates each backing Service once per round and
//! rebuilds nothing on a 304, and a brand-new backend (even one without OpenAPI v3) shows up
//! within 2 s.

mod releases;

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::certs::CertifiedPair;
use e2e::fixture;
use e2e::harness::{self, Gateway, KubectlVersion};
use e2e::scenario::{self, get_raw, json_or_null, ApiService, Pki, Scenario, ScenarioBuilder};
use http::{HeaderMap, StatusCode};
use serde_json::Value;

const WARDLE: &str = "wardle.example.com";
const LEGACY: &str = "legacy.example.com";
const LATE: &str = "late.example.com";
const SLOW: &str = "slow.example.com";

/// What kubectl 1.32 sends for `/api` and `/apis`.
const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// What kubectl 1.29 sends.
const KUBECTL_1_29: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// The order of the session's groups: `apiregistration.k8s.io` first; the core's other groups
/// as the core fixture publishes them (apps, discovery.k8s.io, authentication.k8s.io,
/// authorization.k8s.io, coordination.k8s.io, flowcontrol.apiserver.k8s.io: not kube-apiserver
/// 1.33's order, which has discovery.k8s.io last);
/// legacy.example.com's APIService (17700) ranks above what a core group without an APIService
/// counts as (1000, a CRD's), so it comes before them; wardle.example.com (1000) ties and comes
/// after them.
const GROUPS: [&str; 9] = [
    "apiregistration.k8s.io",
    LEGACY,
    "apps",
    "discovery.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "coordination.k8s.io",
    "flowcontrol.apiserver.k8s.io",
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
/// `pki` names the Services the backends serve as; more backends may be added to the builder,
/// whose APIServices come later.
fn wardle_and_legacy(pki: Pki) -> ScenarioBuilder {
    let mut builder = Scenario::with_pki(pki)
        .backend("wardle", WARDLE, WARDLE_SERVED, &[])
        .backend("legacy", LEGACY, "v1", &["--legacy-only"]);
    for (version, priority) in WARDLE_VERSIONS {
        let api = ApiService {
            version_priority: priority,
            ..builder.pki().apiservice(WARDLE, version, "wardle")
        };
        builder = builder.manifest(&format!("wardle-{version}.yaml"), &api.yaml());
    }
    let legacy = builder
        .pki()
        .apiservice(LEGACY, "v1", "legacy")
        .group_priority_minimum(17700);
    builder.manifest("legacy.yaml", &legacy.yaml())
}

/// Starts `builder` and waits until discovery has both backends' groups, Current.
async fn start(builder: ScenarioBuilder) -> (Scenario, CertifiedPair) {
    let s = builder.start().await;
    let alice = s.user("alice", &[]);
    wait_for_discovery(
        &s,
        &alice,
        Duration::from_secs(10),
        "both backends fetched",
        |doc| freshness(doc, WARDLE) == ["Current"; 3] && freshness(doc, LEGACY) == ["Current"],
    )
    .await;
    (s, alice)
}

/// [`wardle_and_legacy`] with their own Services, started.
async fn discovery_session() -> (Scenario, CertifiedPair) {
    start(wardle_and_legacy(Pki::for_services(&["wardle", "legacy"]))).await
}

async fn get(
    s: &Scenario,
    alice: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    get_raw(&s.gateway, alice, path, headers).await
}

async fn aggregated_apis(s: &Scenario, alice: &CertifiedPair) -> Value {
    json_or_null(&get(s, alice, "/apis", &[("accept", AGG)]).await.2)
}

/// Polls the aggregated `/apis` until `check` holds, and returns it; fails after `timeout`.
async fn wait_for_discovery(
    s: &Scenario,
    alice: &CertifiedPair,
    timeout: Duration,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let doc = aggregated_apis(s, alice).await;
        if check(&doc) {
            return doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}:\n{doc:#}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `aggregator_discovery_aggregation_count_total`.
async fn rebuilds(s: &Scenario, alice: &CertifiedPair) -> u64 {
    let metrics = get(s, alice, "/metrics", &[]).await.2;
    let metrics = String::from_utf8_lossy(&metrics);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("aggregator_discovery_aggregation_count_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no rebuild counter in:\n{metrics}")) as u64
}

/// The documents every session's OpenAPI v3 root lists once the gateway has fetched them.
const OPENAPI_DOCUMENTS: [&str; 6] = [
    "api/v1",
    "apis/apps/v1",
    "apis/wardle.example.com/v1beta1",
    "apis/wardle.example.com/v1alpha1",
    "apis/wardle.example.com/v1",
    "apis/legacy.example.com/v1",
];

/// Polls the OpenAPI v3 root until it lists every one of [`OPENAPI_DOCUMENTS`] (fetched apart
/// from discovery, so possibly after it), and returns it; fails after 10 s naming the missing.
async fn wait_for_openapi_root(s: &Scenario, alice: &CertifiedPair) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let root = json_or_null(&get(s, alice, "/openapi/v3", &[]).await.2);
        let missing: Vec<&str> = OPENAPI_DOCUMENTS
            .into_iter()
            .filter(|key| !root["paths"][key]["serverRelativeURL"].is_string())
            .collect();
        if missing.is_empty() {
            return root;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing:?} not listed within 10s: {root:#}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gateway's access log from line `from` on, as (uri, status).
fn requests_since(gateway: &Gateway, from: usize) -> Vec<(String, u64)> {
    gateway.process.lines()[from..]
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
        .filter_map(|v| Some((v["uri"].as_str()?.to_owned(), v["status"].as_u64()?)))
        .collect()
}

/// Waits until the access log from line `from` shows `uri` answered with `status`.
async fn wait_for_request(gateway: &Gateway, from: usize, uri: &str, status: u64) {
    let logged = harness::wait_until(Duration::from_secs(5), || async {
        requests_since(gateway, from)
            .iter()
            .any(|(u, s)| u == uri && *s == status)
    })
    .await;
    assert!(
        logged,
        "no {uri} answered {status}:\n{}",
        gateway.process.logs()
    );
}

/// The GETs of `path` that the backend of `namespace` received from the gateway's own identity.
async fn gateway_fetches(s: &Scenario, namespace: &str, path: &str) -> Vec<Value> {
    s.pki
        .backend_requests(s.backend(namespace), namespace)
        .await
        .into_iter()
        .filter(|r| r["method"] == "GET" && r["path"] == path && r["clientCN"] == "aggregator")
        .collect()
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

// ---- one merged discovery ---------------------------------------------------------------------

/// Every representation of /apis lists the groups in kube-aggregator's order, with caching
/// headers and a 304 for its ETag; v2beta1 is what kubectl 1.29 negotiates. One row per Accept.
#[tokio::test]
async fn every_representation_of_apis_lists_the_groups_in_order_and_revalidates_with_a_304() {
    let (s, alice) = discovery_session().await;
    for (accept, version) in [(AGG, "v2"), (V2BETA1, "v2beta1"), (KUBECTL_1_29, "v2beta1")] {
        let (status, headers, body) =
            get(&s, &alice, "/apis?timeout=32s", &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "{accept}");
        assert_eq!(
            headers["content-type"],
            format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
                .as_str(),
            "{accept}"
        );
        assert_eq!(headers["vary"], "Accept", "{accept}");
        assert_eq!(headers["cache-control"], "public", "{accept}");
        let doc = json_or_null(&body);
        assert_eq!(
            doc["apiVersion"],
            format!("apidiscovery.k8s.io/{version}"),
            "{accept}"
        );
        assert_eq!(group_names(&doc), GROUPS, "{accept}");
        assert_eq!(versions(&doc, WARDLE), wardle_order(), "{accept}");
        let etag = headers["etag"].to_str().unwrap().to_owned();
        assert!(etag.len() > 2 && etag.starts_with('"'), "{accept}: {etag}");
        let (status, headers, body) = get(
            &s,
            &alice,
            "/apis/",
            &[("accept", accept), ("if-none-match", &etag)],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{accept}");
        assert_eq!(headers["etag"], etag.as_str(), "{accept}");
        assert!(body.is_empty(), "{accept}");
    }
    let doc = aggregated_apis(&s, &alice).await;
    assert_eq!(resources(&doc, WARDLE, "v1beta1"), ["fischers", "flunders"]);
}

/// kube-apiserver 1.36 (KEP-4020 peer-aggregated discovery) takes a `profile` parameter in an
/// aggregated clause: `profile=nopeer` asks for the server's own view rather than the one merged
/// with its peers, and still selects `apidiscovery.k8s.io/v2`. The gateway is one server with one
/// merged view, so every profile gets that document: the same bytes and ETag as plain v2, kube's
/// `Content-Type` (`g`/`v`/`as` only, as its response writer builds it) and `Vary: Accept`.
/// One row per `Accept`: client-go 1.36's (nopeer first, plain v2 after), nopeer alone, and nopeer
/// before a v2beta1 clause (which must not win over the v2 one the client listed first).
#[tokio::test]
async fn a_nopeer_profile_still_gets_the_aggregated_v2_document() {
    let (s, alice) = discovery_session().await;
    const NOPEER: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";
    let (_, plain, plain_body) = get(&s, &alice, "/apis", &[("accept", AGG)]).await;
    let plain_etag = plain["etag"].to_str().unwrap().to_owned();
    let client_go_136 = format!("{NOPEER},{AGG}");
    let before_v2beta1 = format!("{NOPEER},{V2BETA1}");
    for accept in [client_go_136.as_str(), NOPEER, before_v2beta1.as_str()] {
        let (status, headers, body) = get(&s, &alice, "/apis", &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "{accept}");
        assert_eq!(
            headers["content-type"],
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "{accept}"
        );
        assert_eq!(headers["vary"], "Accept", "{accept}");
        assert_eq!(headers["etag"], plain_etag.as_str(), "{accept}");
        assert_eq!(body, plain_body, "{accept}");
        let (status, _, body) = get(
            &s,
            &alice,
            "/apis",
            &[("accept", accept), ("if-none-match", &plain_etag)],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{accept}");
        assert!(body.is_empty(), "{accept}");
    }
}

/// kubectl 1.32 (aggregated v2): every group-version, and each resource at its group's preferred
/// version, the first in kube-aggregator's order; run again with the same cache dir, discovery
/// is revalidated, not re-sent.
#[tokio::test]
async fn kubectl_lists_every_group_version_and_revalidates_its_cache() {
    let (s, alice) = discovery_session().await;
    let kubectl = s.kubectl(&alice);
    let versions_out = kubectl.run_ok(&["api-versions"]).await.stdout;
    // kubectl sorts these itself.
    assert_eq!(
        versions_out.lines().collect::<Vec<_>>(),
        [
            "apiregistration.k8s.io/v1",
            "apps/v1",
            "authentication.k8s.io/v1",
            "authorization.k8s.io/v1",
            "coordination.k8s.io/v1",
            "discovery.k8s.io/v1",
            "flowcontrol.apiserver.k8s.io/v1",
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

    let from = s.gateway.process.line_count();
    kubectl.run_ok(&["api-resources"]).await;
    wait_for_request(&s.gateway, from, "/apis?timeout=32s", 304).await;
    wait_for_request(&s.gateway, from, "/api?timeout=32s", 304).await;
}

/// `get --raw` is legacy discovery, in the same order, with the preferred version first.
#[tokio::test]
async fn legacy_discovery_lists_the_groups_in_the_same_order() {
    let (s, alice) = discovery_session().await;
    let kubectl = s.kubectl(&alice);
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
}

/// kubectl 1.29 negotiates v2beta1: the aggregated documents and no per-group-version legacy
/// discovery, which is what it would fall back to.
#[tokio::test]
async fn kubectl_1_29_reads_v2beta1_without_falling_back_to_legacy_discovery() {
    let (s, alice) = discovery_session().await;
    let old = scenario::kubectl_as(&s.gateway, KubectlVersion::V1_29, &alice);
    let from = s.gateway.process.line_count();
    let table = old.run_ok(&["api-resources"]).await.stdout;
    assert_eq!(
        listed_versions(&table, "flunders"),
        ["legacy.example.com/v1", "wardle.example.com/v1beta1"],
        "{table}"
    );
    wait_for_request(&s.gateway, from, "/apis?timeout=32s", 200).await;
    let requests = requests_since(&s.gateway, from);
    assert!(
        !requests
            .iter()
            .any(|(uri, _)| is_group_version_discovery(uri)),
        "kubectl 1.29 fell back to legacy discovery: {requests:?}"
    );
}

/// OpenAPI v3: the merged root lists the core's and each APIService's document; those are
/// passed through with their caching rules, an old hash redirects, an unknown one is a 404.
#[tokio::test]
async fn the_openapi_v3_root_lists_every_document_and_passes_them_through_with_caching() {
    let (s, alice) = discovery_session().await;
    let root = wait_for_openapi_root(&s, &alice).await;
    let url = root["paths"]["apis/wardle.example.com/v1beta1"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    let (status, headers, body) = get(&s, &alice, url, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "public, immutable");
    assert!(String::from_utf8_lossy(&body).contains("Flunder"));
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let (status, _, body) = get(&s, &alice, url, &[("if-none-match", &etag)]).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (status, headers, _) = get(
        &s,
        &alice,
        "/openapi/v3/apis/wardle.example.com/v1beta1?hash=0123456789ABCDEF",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(headers["location"], url);
    let (status, _, body) = get(&s, &alice, "/openapi/v3/apis/nope.example.com/v1", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json_or_null(&body)["kind"], "Status");
}

/// explain and strict server-side validation read the remote's OpenAPI.
#[tokio::test]
async fn explain_and_strict_apply_read_the_remotes_openapi() {
    let (s, alice) = discovery_session().await;
    wait_for_openapi_root(&s, &alice).await;
    let kubectl = s.kubectl(&alice);
    let explain = kubectl.run_ok(&["explain", "flunders.spec"]).await.stdout;
    assert!(explain.contains("reference"), "{explain}");
    let applied = kubectl
        .apply_yaml("apiVersion: wardle.example.com/v1beta1\nkind: Flunder\nmetadata:\n  name: first\n  namespace: default\nspec:\n  reference: other\n")
        .await;
    assert!(applied.stdout.contains("created"), "{applied}");
}

/// The legacy backend stops: its group goes Stale with the resources it last listed, and
/// kubectl hides only that group.
#[tokio::test]
async fn a_stopped_backend_turns_only_its_own_group_stale() {
    let (mut s, alice) = discovery_session().await;
    let doc = aggregated_apis(&s, &alice).await;
    let known = resources(&doc, LEGACY, "v1");
    assert_eq!(known, ["fischers", "flunders"]);
    s.backend_mut("legacy").process.kill();
    let doc = wait_for_discovery(
        &s,
        &alice,
        Duration::from_secs(15),
        "legacy.example.com Stale",
        |d| freshness(d, LEGACY) == ["Stale"],
    )
    .await;
    assert_eq!(resources(&doc, LEGACY, "v1"), known);
    assert_eq!(freshness(&doc, WARDLE), ["Current"; 3]);
    let out = s.kubectl(&alice).run(&["api-resources"]).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        listed_versions(&out.stdout, "flunders"),
        ["wardle.example.com/v1beta1"],
        "{out}"
    );
}

// ---- refreshing ---------------------------------------------------------------------------------

/// [`wardle_and_legacy`] refreshed every second, with a third team's API server (without OpenAPI
/// v3) already running as Service `late/api`; its APIService comes later.
async fn refresh_session() -> (Scenario, CertifiedPair) {
    let builder = wardle_and_legacy(Pki::for_services(&["wardle", "legacy", "late"]))
        .backend("late", LATE, "v1", &["--no-openapi"])
        .gateway_args(&["--discovery-refresh-interval", "1s"]);
    start(builder).await
}

/// Registers the late backend's APIService and waits, at most 2 s, until its group is Current.
async fn register_late(s: &Scenario, alice: &CertifiedPair) -> Value {
    s.register(&s.pki.apiservice(LATE, "v1", "late"));
    wait_for_discovery(s, alice, Duration::from_secs(2), "the new backend", |d| {
        freshness(d, LATE) == ["Current"]
    })
    .await
}

/// Every round asks each backing Service once, however many APIServices it backs (wardle:
/// three, legacy: one), revalidating what it has; a 304 rebuilds nothing.
#[tokio::test]
async fn each_backing_service_is_revalidated_once_per_round_and_a_304_rebuilds_nothing() {
    let (s, alice) = refresh_session().await;
    let rebuilt = rebuilds(&s, &alice).await;
    s.pki
        .clear_backend_requests(s.backend("wardle"), "wardle")
        .await;
    s.pki
        .clear_backend_requests(s.backend("legacy"), "legacy")
        .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let wardle = gateway_fetches(&s, "wardle", "/apis").await;
    let legacy = gateway_fetches(&s, "legacy", "/apis").await;
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
    assert_eq!(rebuilds(&s, &alice).await, rebuilt);
}

/// The new backend's APIService: a Service the gateway never fetched shows up, Current and with
/// its resources, within 2 s. At 1000 it ties with wardle.example.com and sorts first.
#[tokio::test]
async fn a_new_backend_shows_up_in_discovery_within_2s() {
    let (s, alice) = refresh_session().await;
    let rebuilt = rebuilds(&s, &alice).await;
    let doc = register_late(&s, &alice).await;
    assert_eq!(resources(&doc, LATE, "v1"), ["fischers", "flunders"]);
    assert_eq!(group_names(&doc), with_group_before(&GROUPS, LATE, WARDLE));
    assert!(rebuilds(&s, &alice).await > rebuilt);
    let table = s.kubectl(&alice).run_ok(&["api-resources"]).await.stdout;
    assert!(
        listed_versions(&table, "flunders").contains(&"late.example.com/v1"),
        "{table}"
    );
}

/// A backend without OpenAPI v3 contributes no document, everyone else's stay listed, and its
/// group stays Current in discovery.
#[tokio::test]
async fn a_backend_without_openapi_v3_contributes_no_document() {
    let (s, alice) = refresh_session().await;
    register_late(&s, &alice).await;
    s.gateway
        .process
        .wait_for_line(
            |l| l.contains("backend has no /openapi/v3"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_or_else(|| panic!("{}", s.logs()));
    let root = wait_for_openapi_root(&s, &alice).await;
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
            "apis/legacy.example.com",
            "apis/legacy.example.com/v1",
            "apis/wardle.example.com",
            "apis/wardle.example.com/v1",
            "apis/wardle.example.com/v1alpha1",
            "apis/wardle.example.com/v1beta1",
        ]
        .into_iter()
        .collect(),
        "{root:#}"
    );
    let (status, _, _) = get(&s, &alice, "/openapi/v3/apis/late.example.com/v1", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        freshness(&aggregated_apis(&s, &alice).await, LATE),
        ["Current"],
        "{}",
        s.logs()
    );
}

// ---- a legacy-only core -------------------------------------------------------------------------

#[tokio::test]
async fn a_legacy_only_core_is_converted() {
    let s = Scenario::wardle()
        .core_args(&["--no-aggregated-discovery"])
        .apiservice(WARDLE, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        let (status, headers, body) = get(&s, &alice, "/api", &[("accept", AGG)]).await;
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
    assert!(ready, "{}", s.logs());
    let kubectl = s.kubectl(&alice);
    let current = harness::wait_until(Duration::from_secs(10), || async {
        let out = kubectl.run(&["api-resources"]).await;
        out.success()
            && out.stdout.contains("wardle.example.com/v1alpha1")
            && out.stdout.contains("configmaps")
    })
    .await;
    assert!(current, "{}", kubectl.run(&["api-resources"]).await);
}

// ---- the core's own order, readiness, group-level OpenAPI -------------------------------------

/// Built-in groups as a core of another release publishes them (the shape of an older
/// kube-apiserver's `/apis`): flowcontrol before resource.k8s.io, which 1.33's priorities put the
/// other way round, and versions whose preferred one is not the highest.
const OTHER_RELEASE_GROUPS: [&str; 4] = [
    "flowcontrol.apiserver.k8s.io=v1,v1beta3",
    "internal.apiserver.k8s.io=v1alpha1",
    "resource.k8s.io=v1alpha3",
    "storagemigration.k8s.io=v1alpha1",
];

/// `(group, versions)` in order, of any kind of `/apis` document; for legacy documents the
/// preferred version is put first, as clients read it.
fn layout(doc: &Value) -> Vec<(String, Vec<String>)> {
    groups(doc)
        .map(|g| {
            let name = g["metadata"]["name"].as_str().or(g["name"].as_str());
            let mut versions: Vec<String> = of_versions(g, "version")
                .into_iter()
                .map(str::to_owned)
                .collect();
            if let Some(preferred) = g["preferredVersion"]["version"].as_str() {
                versions.insert(0, format!("preferred {preferred}"));
            }
            (name.unwrap_or("").to_owned(), versions)
        })
        .collect()
}

/// With no APIService of its own, `/apis` through the gateway is the core's: same groups, same
/// order, same preferred versions, in every representation. One row per Accept.
#[tokio::test]
async fn with_no_apiservice_of_its_own_apis_is_the_cores() {
    let mut core_args = Vec::new();
    for group in OTHER_RELEASE_GROUPS {
        core_args.extend(["--group", group]);
    }
    let s = Scenario::builder().core_args(&core_args).start().await;
    let alice = s.user("alice", &[]);
    let direct = s.gateway.http1_client(None);
    for (accept, what) in [
        (AGG, "v2"),
        (V2BETA1, "v2beta1"),
        ("application/json", "legacy"),
    ] {
        let request = http::Request::get(format!("{}/apis", s.core.url()))
            .header("accept", accept)
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        let (status, _, body) = harness::send(&direct, request).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{what}: the core's /apis");
        let core = layout(&json_or_null(&body));
        assert!(
            core.iter().any(|(g, _)| g == "resource.k8s.io"),
            "{what}: {core:?}"
        );
        let (status, _, body) = get(&s, &alice, "/apis", &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "{what}");
        assert_eq!(layout(&json_or_null(&body)), core, "{what}");
    }
}

/// A new replica is not ready before it fetched the discovery of every APIService it knew at
/// start: `/readyz` names the check kube-apiserver names, fails while a backend takes 3 s to
/// answer `/apis`, and passes once it answered, with the group Current in `/apis` by then.
#[tokio::test]
async fn readyz_waits_for_the_first_discovery_of_every_apiservice() {
    const DELAY: Duration = Duration::from_secs(3);
    let builder = Scenario::with_pki(Pki::for_services(&["slow"])).backend(
        "slow",
        SLOW,
        "v1",
        &["--discovery-delay-ms", &DELAY.as_millis().to_string()],
    );
    let api = builder.pki().apiservice(SLOW, "v1", "slow");
    let builder = builder
        .manifest("slow.yaml", &api.yaml())
        .without_waiting_for_readiness();
    let started = Instant::now();
    let s = builder.start().await;
    let alice = s.user("alice", &[]);

    let mut first = None;
    let ready_after = loop {
        let (status, _, body) = scenario::try_get(&s.gateway, None, "/readyz?verbose", &[])
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        if first.is_none() {
            first = Some((status, body.clone()));
        }
        if status == StatusCode::OK {
            assert!(
                body.contains("[+]poststarthook/apiservice-discovery-controller ok"),
                "{body}"
            );
            break started.elapsed();
        }
        assert!(
            started.elapsed() < DELAY + Duration::from_secs(5),
            "never ready: {body}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, body) = first.unwrap();
    assert_ne!(status, StatusCode::OK, "ready at once: {body}");
    assert!(
        body.contains("[-]poststarthook/apiservice-discovery-controller failed"),
        "{body}"
    );
    eprintln!(
        "/readyz passed {ready_after:?} after start, the backend answering /apis after {DELAY:?}"
    );
    assert!(
        ready_after >= DELAY - Duration::from_millis(500),
        "ready after {ready_after:?}, before the backend answered"
    );
    let doc = aggregated_apis(&s, &alice).await;
    assert_eq!(freshness(&doc, SLOW), ["Current"], "{doc:#}");
}

/// The OpenAPI v3 root lists a backend's group-level document (`apis/<group>`) as
/// kube-aggregator's does, and `/openapi/v3/apis/<group>` answers it from that backend.
#[tokio::test]
async fn the_openapi_v3_root_lists_a_backends_group_document_and_serves_it() {
    let (s, alice) = discovery_session().await;
    wait_for_openapi_root(&s, &alice).await;
    let key = format!("apis/{WARDLE}");
    let listed = harness::wait_until(Duration::from_secs(5), || async {
        let root = json_or_null(&get(&s, &alice, "/openapi/v3", &[]).await.2);
        root["paths"][&key]["serverRelativeURL"].is_string()
    })
    .await;
    let root = json_or_null(&get(&s, &alice, "/openapi/v3", &[]).await.2);
    assert!(listed, "{key} not in the root: {root:#}");
    let url = root["paths"][&key]["serverRelativeURL"].as_str().unwrap();
    for path in [url.to_owned(), format!("/openapi/v3/{key}")] {
        let (status, _, body) = get(&s, &alice, &path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let doc = json_or_null(&body);
        assert!(
            doc["paths"][format!("/apis/{WARDLE}/")]["get"].is_object(),
            "{path}: {doc:#}"
        );
    }
}
