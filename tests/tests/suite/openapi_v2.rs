//! `/openapi/v2` through the gateway: the core's spec merged with the remote APIServices', in
//! JSON and in the protobuf form `kubectl explain --output=plaintext-openapiv2` reads, with
//! ETags; a backend that goes away leaves its types in place; and one backend whose spec hangs
//! delays no other backend's.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::certs::CertifiedPair;
use e2e::harness::{self, KubectlVersion};
use e2e::scenario::{kubectl_as, Pki, Scenario, WARDLE_GROUP};
use http::{Request, StatusCode};
use http_body_util::Full;

const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const FLUNDER: &str = "com.example.fixture.wardle.example.com.v1alpha1.Flunder";
const CONFIGMAP: &str = "com.example.fixture.core.v1.ConfigMap";

async fn get(
    s: &Scenario,
    user: &CertifiedPair,
    accept: &str,
    if_none_match: Option<&str>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let client = s.gateway.http2_client(Some(user));
    let mut req = Request::get(format!("{}/openapi/v2", s.gateway.url())).header("accept", accept);
    if let Some(etag) = if_none_match {
        req = req.header("if-none-match", etag);
    }
    harness::send(&client, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap()
}

/// The wardle backend registered, and the merged spec listing its Flunder.
async fn merged() -> (Scenario, CertifiedPair) {
    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let listed = harness::wait_until(Duration::from_secs(15), || async {
        let (status, _, body) = get(&s, &alice, "application/json", None).await;
        status == StatusCode::OK && String::from_utf8_lossy(&body).contains(FLUNDER)
    })
    .await;
    assert!(listed, "/openapi/v2 never listed {FLUNDER}\n{}", s.logs());
    (s, alice)
}

#[tokio::test]
async fn the_merged_spec_has_the_core_and_the_remote_types_in_json_and_protobuf() {
    let (s, alice) = merged().await;
    let (_, headers, body) = get(&s, &alice, "application/json", None).await;
    let spec: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        spec["definitions"][CONFIGMAP].is_object(),
        "the core's types stay"
    );
    assert!(spec["definitions"][FLUNDER].is_object());
    assert!(
        spec["paths"]["/apis/wardle.example.com/v1alpha1/namespaces/{namespace}/flunders"]
            .is_object()
    );
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let (status, _, _) = get(&s, &alice, "application/json", Some(&etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);

    let (status, headers, proto) = get(&s, &alice, PROTOBUF, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["content-type"],
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    );
    assert!(
        proto
            .windows(FLUNDER.len())
            .any(|w| w == FLUNDER.as_bytes()),
        "the protobuf names the remote type"
    );
    let proto_etag = headers["etag"].to_str().unwrap().to_owned();
    assert_ne!(proto_etag, etag, "each representation has its own ETag");
    let (status, _, _) = get(&s, &alice, PROTOBUF, Some(&proto_etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);

    // Compressed when the client accepts it (Go's transport always asks), same document.
    let client = s.gateway.http2_client(Some(&alice));
    let req = Request::get(format!("{}/openapi/v2", s.gateway.url()))
        .header("accept", PROTOBUF)
        .header("accept-encoding", "gzip")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, gzipped) = harness::send(&client, req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-encoding"], "gzip");
    assert!(
        gzipped.len() < proto.len() / 2,
        "{} of {}",
        gzipped.len(),
        proto.len()
    );
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzipped[..]), &mut plain)
        .unwrap();
    assert_eq!(plain, proto);

    let metrics = e2e::scenario::metrics(&s.gateway).await;
    assert!(
        metrics.contains(
            "aggregator_openapi_v2_regeneration_count{apiservice=\"core\",reason=\"add\"}"
        ),
        "{metrics}"
    );
}

/// `kubectl explain --output=plaintext-openapiv2` (the protobuf spec) explains the remote kind
/// and a core kind, with kubectl 1.27 and 1.33; after the backend is killed, the spec it gave
/// stays.
#[tokio::test]
async fn kubectl_explain_reads_the_remote_types_from_the_v2_spec() {
    let (mut s, alice) = merged().await;
    for version in [KubectlVersion::V1_27, KubectlVersion::V1_33] {
        let kubectl = kubectl_as(&s.gateway, version, &alice);
        let flunders = kubectl
            .run(&["explain", "flunders", "--output=plaintext-openapiv2"])
            .await;
        assert!(
            flunders.success(),
            "kubectl 1.{}: {flunders}",
            version.minor
        );
        assert!(
            flunders.stdout.contains("Flunder") && flunders.stdout.contains("FIELDS"),
            "kubectl 1.{}: {flunders}",
            version.minor
        );
        let configmaps = kubectl
            .run(&["explain", "configmaps", "--output=plaintext-openapiv2"])
            .await;
        assert!(
            configmaps.success() && configmaps.stdout.contains("ConfigMap"),
            "kubectl 1.{}: {configmaps}",
            version.minor
        );
    }
    s.backend_mut("wardle").process.kill();
    // Past the next revalidation of every spec would take a minute; a route change (the
    // availability flip) revalidates at once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, _, body) = get(&s, &alice, "application/json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        String::from_utf8_lossy(&body).contains(FLUNDER),
        "a backend that went away keeps its last spec\n{}",
        s.logs()
    );
}

/// A GET of `path` through the gateway as `user`, JSON.
async fn get_path(
    s: &Scenario,
    user: &CertifiedPair,
    path: &str,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let client = s.gateway.http2_client(Some(user));
    let req = Request::get(format!("{}{path}", s.gateway.url()))
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    harness::send(&client, req).await.unwrap()
}

/// A backend that answers 404 on `/openapi/v3` but serves `/openapi/v2` (servers from before
/// OpenAPI v3) gets its spec converted: listed in the gateway's v3 root with a hash, served with
/// handler3's caching rules, and `kubectl explain` (which reads v3) explains its kinds.
#[tokio::test]
async fn a_backend_with_only_openapi_v2_gets_kubectl_explain_through_v3() {
    let s = Scenario::builder()
        .backend("wardle", WARDLE_GROUP, "v1alpha1", &["--openapi-v2-only"])
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let key = "apis/wardle.example.com/v1alpha1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let url = loop {
        let (status, _, body) = get_path(&s, &alice, "/openapi/v3").await;
        let root: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if let (StatusCode::OK, Some(url)) =
            (status, root["paths"][key]["serverRelativeURL"].as_str())
        {
            break Some(url.to_owned());
        }
        if tokio::time::Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        url.is_some(),
        "/openapi/v3 never listed {key}\n{}",
        s.logs()
    );
    let url = url.unwrap();
    assert!(
        url.starts_with(&format!("/openapi/v3/{key}?hash=")),
        "{url}"
    );

    let (status, headers, body) = get_path(&s, &alice, &url).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "public, immutable");
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["openapi"], "3.0.0");
    assert!(
        doc["components"]["schemas"][FLUNDER]["x-kubernetes-group-version-kind"].is_array(),
        "{doc}"
    );
    assert!(
        !String::from_utf8_lossy(&body).contains("#/definitions/"),
        "every reference points into components"
    );
    let (status, headers, _) = get_path(&s, &alice, &format!("/openapi/v3/{key}?hash=STALE")).await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(headers["location"], url.as_str());

    for version in [KubectlVersion::V1_27, KubectlVersion::V1_33] {
        let kubectl = kubectl_as(&s.gateway, version, &alice);
        let explained = kubectl.run(&["explain", "flunders.spec"]).await;
        assert!(
            explained.success()
                && explained.stdout.contains("Flunder")
                && explained.stdout.contains("FIELDS"),
            "kubectl 1.{}: {explained}\n{}",
            version.minor,
            s.logs()
        );
    }
}

const FLOWERS_GROUP: &str = "flowers.example.com";
const FLOWERS_PATH: &str = "/apis/flowers.example.com/v1/namespaces/{namespace}/flunders";
/// How soon a spec must be merged beside a hung one: 0.5 to 1.2 s measured on a 2-core machine
/// at load 6 to 8; half the hung fetch's 10 s timeout, which is what it waited for before.
const BOUND: Duration = Duration::from_secs(5);
/// How long a reaction is waited for before the test gives up.
const LIMIT: Duration = Duration::from_secs(15);

/// Prints how long `what` took to reach the merged spec, and fails unless within [`BOUND`].
fn assert_within_bound(s: &Scenario, what: &str, took: Option<Duration>) {
    eprintln!("reaction: {what} -> in /openapi/v2 {took:?}");
    assert!(
        took.is_some_and(|t| t <= BOUND),
        "{what}: took {took:?} (bound {BOUND:?})\n{}",
        s.logs()
    );
}

/// Whether the merged `/openapi/v2` the gateway serves has `path` among its paths and, if given,
/// `definition` among its definitions.
async fn merged_has(
    s: &Scenario,
    user: &CertifiedPair,
    path: Option<&str>,
    definition: Option<&str>,
) -> bool {
    let (status, _, body) = get(s, user, "application/json", None).await;
    let spec: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    status == StatusCode::OK
        && path.is_none_or(|p| spec["paths"][p].is_object())
        && definition.is_none_or(|d| spec["definitions"][d].is_object())
}

/// Polls [`merged_has`] every 50 ms for up to `limit`: how long it took to hold.
async fn until_merged(
    s: &Scenario,
    user: &CertifiedPair,
    path: Option<&str>,
    definition: Option<&str>,
    limit: Duration,
) -> Option<Duration> {
    let since = Instant::now();
    while since.elapsed() < limit {
        if merged_has(s, user, path, definition).await {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Two backends with the file source: wardle, whose `/openapi/v2` answers its headers and then
/// nothing (the gateway gives up on it after its 10 s fetch timeout), registered from the start,
/// and flowers, healthy, registered only if `flowers_registered`.
async fn beside_a_hung_spec(flowers_args: &[&str], flowers_registered: bool) -> Scenario {
    let mut builder = Scenario::with_pki(Pki::for_services(&["wardle", "flowers"]))
        .backend(
            "wardle",
            WARDLE_GROUP,
            "v1alpha1",
            &["--hostile", "openapi-v2-hangs"],
        )
        .backend("flowers", FLOWERS_GROUP, "v1", flowers_args)
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle");
    if flowers_registered {
        builder = builder.apiservice(FLOWERS_GROUP, "v1", "flowers");
    }
    builder.start().await
}

/// Issue 27: a backend whose `/openapi/v2` hangs delays no other backend's spec. A new
/// APIService on a healthy backend, registered while the hung backend's fetch is waiting, is in
/// the merged `/openapi/v2` within [`BOUND`]. Before: all specs were fetched in one round and merged
/// when the last answered, so the new spec waited for the hung one's 10 s timeout.
#[tokio::test]
async fn a_hung_backend_spec_does_not_delay_another_backends_new_spec() {
    let s = beside_a_hung_spec(&[], false).await;
    let alice = s.user("alice", &["dev"]);
    // The first merged document (the core's spec) is served, and wardle's fetch hangs.
    let first = until_merged(&s, &alice, None, Some(CONFIGMAP), Duration::from_secs(15)).await;
    assert!(first.is_some(), "/openapi/v2 never merged\n{}", s.logs());
    tokio::time::sleep(Duration::from_millis(500)).await;

    s.register(&s.pki.apiservice(FLOWERS_GROUP, "v1", "flowers"));
    let took = until_merged(&s, &alice, Some(FLOWERS_PATH), None, LIMIT).await;
    assert_within_bound(&s, "new APIService beside a hung spec", took);
}

/// Issue 27: a backend that comes back (killed, restarted on the same port with a new spec) has
/// its new spec in the merged `/openapi/v2` within [`BOUND`] of its restart, beside a backend whose
/// spec hangs: its availability turning `True` fetches its spec at once, on its own key. Before:
/// that availability flip started a round of every spec, merged when the hung one timed out
/// (10 s); without the flip, at the next minute's revalidation.
#[tokio::test]
async fn a_backend_that_comes_back_has_its_new_spec_merged_within_seconds() {
    let mut s = beside_a_hung_spec(&[], true).await;
    let alice = s.user("alice", &["dev"]);
    let first = until_merged(
        &s,
        &alice,
        Some(FLOWERS_PATH),
        None,
        Duration::from_secs(20),
    )
    .await;
    assert!(first.is_some(), "flowers never merged\n{}", s.logs());

    let port = s.backend("flowers").addr.port();
    s.backend_mut("flowers").process.kill();
    // The gateway has found it gone: requests to it get the 503 of an unavailable APIService.
    let gone = harness::wait_until(LIMIT, || async {
        get_path(&s, &alice, "/apis/flowers.example.com/v1").await.0
            == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(gone, "flowers never turned unavailable\n{}", s.logs());
    let listen = format!("127.0.0.1:{port}");
    // The restarted server's spec has one more definition, `Deep`.
    let restarted = s
        .pki
        .start_backend(
            FLOWERS_GROUP,
            "v1",
            &["--listen", &listen, "--hostile", "openapi-v2-nesting=6"],
        )
        .await;
    *s.backend_mut("flowers") = restarted;
    let deep = Some("/apis/flowers.example.com/v1/hostile-deep");
    let took = until_merged(&s, &alice, deep, Some("Deep"), LIMIT).await;
    assert_within_bound(&s, "backend back with a new spec", took);
}
