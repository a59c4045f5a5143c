//! Security, as an operator and users see it: requests to an aggregated API are authorized by a
//! SubjectAccessReview on the core (denials read like kube-apiserver's, decisions are cached),
//! `/metrics` can be protected, every request leaves one audit line, and rotated proxy client
//! and serving certificates are picked up without a restart. The request limits are in
//! `limits.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, HttpClient};
use e2e::scenario::{
    self, core_and_gateway, create_configmap, expect_event, path_arg, watch_configmaps, Scenario,
    ScenarioBuilder,
};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

/// A core with `policy`, the wardle backend registered through a manifest file (it also trusts
/// the proxy CN `aggregator-2`), and a gateway with `gateway_args`.
fn wardle(policy: Value, gateway_args: &[&str]) -> ScenarioBuilder {
    Scenario::builder()
        .backend(
            "wardle",
            GROUP,
            "v1alpha1",
            &["--requestheader-allowed-names", "aggregator-2"],
        )
        .core_policy(policy)
        .apiservice(GROUP, "v1alpha1", "wardle")
        .gateway_args(gateway_args)
}

async fn get(
    s: &Scenario,
    client: &HttpClient,
    path: &str,
) -> (StatusCode, http::HeaderMap, Value) {
    let (status, headers, body) = harness::get(client, &format!("{}{path}", s.gateway.url()))
        .await
        .unwrap();
    (
        status,
        headers,
        serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body))),
    )
}

/// SubjectAccessReviews the core has answered since the last `clear_core_requests`.
async fn reviews_at_core(s: &Scenario) -> Vec<Value> {
    scenario::core_posts(&s.core, "subjectaccessreviews").await
}

/// Waits until the remote answers `client` (availability is probed every second).
async fn wait_until_served(s: &Scenario, client: &HttpClient) {
    let served = harness::wait_until(Duration::from_secs(10), || async {
        get(s, client, FLUNDERS).await.0 == StatusCode::OK
    })
    .await;
    assert!(served, "the remote never served its user:\n{}", s.logs());
}

fn audit_lines(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}

// ---- authorization and audit --------------------------------------------------------------------

/// A session where group `dev` may read flunders and alice `/metrics`, with `/metrics`
/// protected and every request audited to [`audit_file`]; returns once alice (in `dev`) has
/// been served by the remote, with clients for her and for bob (in `ops`: he may do nothing but
/// reach the core).
async fn authorized_and_audited() -> (Scenario, HttpClient, HttpClient) {
    let policy = json!({"rules": [
        {"group": "dev", "verbs": ["get", "list"], "apiGroups": [GROUP], "resources": ["flunders"]},
        {"user": "alice", "verbs": ["get"], "nonResourceURLs": ["/metrics"]},
    ]});
    let builder = wardle(policy, &["--authorize-metrics"]);
    let audit_file = path_arg(&builder.pki().dir().join("audit.log"));
    let s = builder
        .gateway_args(&["--audit-log-path", &audit_file])
        .start()
        .await;
    let alice = s.gateway.http1_client(Some(&s.user("alice", &["dev"])));
    let bob = s.gateway.http1_client(Some(&s.user("bob", &["ops"])));
    wait_until_served(&s, &alice).await;
    (s, alice, bob)
}

/// The audit log of [`authorized_and_audited`].
fn audit_file(s: &Scenario) -> PathBuf {
    s.pki.dir().join("audit.log")
}

/// Allowed: the request reaches the remote.
#[tokio::test]
async fn an_authorized_remote_request_reaches_the_backend() {
    let (s, alice, _) = authorized_and_audited().await;
    let (status, _, body) = get(&s, &alice, FLUNDERS).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["kind"], "FlunderList", "{body}");
}

/// Denied: kube-apiserver's Forbidden, word for word, with the authorizer's reason after it.
#[tokio::test]
async fn a_denied_remote_request_gets_kube_apiservers_forbidden() {
    let (s, _, bob) = authorized_and_audited().await;
    let (status, _, body) = get(&s, &bob, FLUNDERS).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "flunders.wardle.example.com is forbidden: User \"bob\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"default\""
        ),
        "{message}"
    );
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(body["code"], 403);
    assert_eq!(
        body["details"],
        json!({"group": GROUP, "kind": "flunders"}),
        "{body}"
    );
    let (status, _, body) = get(
        &s,
        &bob,
        "/apis/wardle.example.com/v1alpha1/flunders/f1/status",
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body["message"].as_str().unwrap().starts_with(
            "flunders.wardle.example.com \"f1\" is forbidden: User \"bob\" cannot get resource \"flunders/status\" in API group \"wardle.example.com\" at the cluster scope"
        ),
        "{body}"
    );
    assert_eq!(body["details"]["name"], "f1");
}

/// Decisions are cached: repeated questions cost the core one review each.
#[tokio::test]
async fn authorization_decisions_are_cached() {
    let (s, alice, bob) = authorized_and_audited().await;
    // bob's first question, so that the loop below asks only cached ones.
    assert_eq!(get(&s, &bob, FLUNDERS).await.0, StatusCode::FORBIDDEN);
    scenario::clear_core_requests(&s.core).await;
    for _ in 0..5 {
        assert_eq!(get(&s, &alice, FLUNDERS).await.0, StatusCode::OK);
        assert_eq!(get(&s, &bob, FLUNDERS).await.0, StatusCode::FORBIDDEN);
    }
    let reviews = reviews_at_core(&s).await;
    assert_eq!(reviews.len(), 0, "all answers were cached: {reviews:?}");
    assert_eq!(
        get(&s, &alice, &format!("{FLUNDERS}/f2")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&s, &alice, &format!("{FLUNDERS}/f2")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        reviews_at_core(&s).await.len(),
        1,
        "one new question, one review"
    );
}

/// KEP-4601 (`AuthorizeWithSelectors`, GA in 1.34): a list or watch of a remote APIService is
/// reviewed with its label and field selectors parsed into requirements, as kube-apiserver's
/// webhook authorizer sends them, so an authorizer granting only part of a collection is asked
/// the question it can say yes to. A selector that does not parse narrows nothing: the review
/// asks about the whole collection, and is refused.
#[tokio::test]
async fn a_remote_list_or_watch_is_reviewed_with_its_selectors() {
    let policy = json!({"rules": [
        {"group": "dev", "verbs": ["get"], "apiGroups": [GROUP], "resources": ["flunders"]},
        {"group": "dev", "verbs": ["list", "watch"], "apiGroups": [GROUP], "resources": ["flunders"],
         "labelSelector": [
            {"key": "team", "operator": "In", "values": ["blue"]},
            {"key": "tier", "operator": "NotIn", "values": ["db"]},
         ],
         "fieldSelector": [{"key": "metadata.namespace", "operator": "In", "values": ["default"]}]},
    ]});
    let s = wardle(policy, &[]).start().await;
    let alice = s.gateway.http1_client(Some(&s.user("alice", &["dev"])));
    let served = harness::wait_until(Duration::from_secs(10), || async {
        get(&s, &alice, &format!("{FLUNDERS}/f1")).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(served, "the remote never served alice:\n{}", s.logs());

    let selected =
        "labelSelector=tier%21%3Ddb%2Cteam%3Dblue&fieldSelector=metadata.namespace%3D%3Ddefault";
    for query in [
        selected.to_owned(),
        format!("watch=true&timeoutSeconds=1&{selected}"),
    ] {
        let (status, _, body) = get(&s, &alice, &format!("{FLUNDERS}?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
    }
    // Without the selectors, or with one kube cannot parse, the question is the whole
    // collection, which alice may not list.
    for query in [
        "labelSelector=team%3Dblue".to_owned(),
        "fieldSelector=metadata.namespace%3Ddefault".to_owned(),
        format!("{selected}%2C%28"),
    ] {
        let (status, _, body) = get(&s, &alice, &format!("{FLUNDERS}?{query}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{query}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or("")
                .contains("cannot list resource \"flunders\""),
            "{body}"
        );
    }
}

/// Requests to the core are the core's business: no review from the gateway.
#[tokio::test]
async fn requests_to_the_core_get_no_review_from_the_gateway() {
    let (s, _, bob) = authorized_and_audited().await;
    scenario::clear_core_requests(&s.core).await;
    assert_eq!(
        get(&s, &bob, "/api/v1/namespaces/default/configmaps")
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(reviews_at_core(&s).await.len(), 0);
}

/// /metrics is protected; health endpoints stay open to anyone.
#[tokio::test]
async fn metrics_can_be_protected_while_health_stays_open() {
    let (s, alice, bob) = authorized_and_audited().await;
    let anonymous = s.gateway.http1_client(None);
    let (status, _, body) = get(&s, &bob, "/metrics").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("forbidden: User \"bob\" cannot get path \"/metrics\""),
        "{body}"
    );
    let (status, _, _) = harness::get(&alice, &format!("{}/metrics", s.gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(get(&s, &anonymous, "/readyz").await.0, StatusCode::OK);
    assert_eq!(get(&s, &anonymous, "/livez").await.0, StatusCode::OK);
}

/// Without any flag, `/metrics` is authorized as kube-apiserver authorizes it: a scrape the
/// core does not allow `get` on the non-resource URL is refused, anonymous ones included.
#[tokio::test]
async fn metrics_are_authorized_by_default() {
    let policy = json!({"rules": [
        {"group": "dev", "verbs": ["get", "list"], "apiGroups": [GROUP], "resources": ["flunders"]},
        {"user": "alice", "verbs": ["get"], "nonResourceURLs": ["/metrics"]},
    ]});
    let s = wardle(policy, &[]).start().await;
    let anonymous = s.gateway.http1_client(None);
    let (status, _, body) = get(&s, &anonymous, "/metrics").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("forbidden: User \"system:anonymous\" cannot get path \"/metrics\""),
        "{body}"
    );
    let alice = s.gateway.http1_client(Some(&s.user("alice", &["dev"])));
    let (status, _, body) = get(&s, &alice, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The audit log names users and what they did: only the gateway's user may read it.
#[cfg(unix)]
#[tokio::test]
async fn the_audit_log_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let (s, _, _) = authorized_and_audited().await;
    let mode = std::fs::metadata(audit_file(&s))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
}

/// The audit log: a line per request, with user, verb, code, decision and target, and the
/// Audit-ID the client saw.
#[tokio::test]
async fn the_audit_log_records_user_verb_code_decision_and_target() {
    let (s, _, bob) = authorized_and_audited().await;
    let audit_file = audit_file(&s);
    // alice's list was audited while waiting for the remote; bob also asks the core.
    assert_eq!(
        get(&s, &bob, "/api/v1/namespaces/default/configmaps")
            .await
            .0,
        StatusCode::OK
    );
    let (status, headers, _) = get(&s, &bob, FLUNDERS).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let audit_id = headers["audit-id"].to_str().unwrap().to_owned();
    let found = harness::wait_until(Duration::from_secs(5), || async {
        audit_lines(&audit_file)
            .iter()
            .any(|e| e["auditID"] == audit_id.as_str())
    })
    .await;
    assert!(found, "no audit line for {audit_id}");
    let events = audit_lines(&audit_file);
    let denied = events
        .iter()
        .find(|e| e["auditID"] == audit_id.as_str())
        .unwrap();
    assert_eq!(denied["kind"], "Event");
    assert_eq!(denied["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(denied["level"], "Metadata");
    assert_eq!(denied["stage"], "ResponseComplete");
    assert_eq!(denied["verb"], "list");
    assert_eq!(denied["requestURI"], FLUNDERS);
    assert_eq!(denied["user"]["username"], "bob");
    assert_eq!(
        denied["user"]["groups"],
        json!(["ops", "system:authenticated"])
    );
    assert_eq!(denied["sourceIPs"], json!(["127.0.0.1"]));
    assert_eq!(denied["responseStatus"]["code"], 403);
    assert_eq!(
        denied["annotations"]["authorization.k8s.io/decision"],
        "forbid"
    );
    // Answered by authorization, before the router: no route to record.
    assert!(denied["annotations"]
        .get("aggregation-gateway/routed-to")
        .is_none());
    assert!(denied["requestReceivedTimestamp"].as_str().is_some());
    assert!(denied["stageTimestamp"].as_str().is_some());
    let allowed = events
        .iter()
        .find(|e| {
            e["user"]["username"] == "alice"
                && e["responseStatus"]["code"] == 200
                && e["verb"] == "list"
        })
        .expect("alice's list is audited");
    assert_eq!(
        allowed["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    assert_eq!(
        allowed["annotations"]["aggregation-gateway/routed-to"],
        format!("apiservice/{NAME}")
    );
    let core_list = events
        .iter()
        .find(|e| e["requestURI"] == "/api/v1/namespaces/default/configmaps")
        .expect("the core request is audited");
    assert_eq!(
        core_list["annotations"]["aggregation-gateway/routed-to"],
        "core"
    );
    assert!(core_list["annotations"]
        .get("authorization.k8s.io/decision")
        .is_none());
}

/// One line per request: count a fresh batch exactly.
#[tokio::test]
async fn the_audit_log_has_exactly_one_line_per_request() {
    let (s, _, _) = authorized_and_audited().await;
    let audit_file = audit_file(&s);
    let anonymous = s.gateway.http1_client(None);
    // Everything so far is written before the batch is counted.
    assert_eq!(get(&s, &anonymous, "/livez").await.0, StatusCode::OK);
    let settled = harness::wait_until(Duration::from_secs(5), || async {
        let lines = audit_lines(&audit_file);
        lines.last().is_some_and(|e| e["requestURI"] == "/livez")
    })
    .await;
    assert!(settled, "{:?}", audit_lines(&audit_file));
    let before = audit_lines(&audit_file).len();
    for _ in 0..7 {
        get(&s, &anonymous, "/livez").await;
    }
    let counted = harness::wait_until(Duration::from_secs(5), || async {
        audit_lines(&audit_file).len() == before + 7
    })
    .await;
    assert!(
        counted,
        "expected {} lines, got {}",
        before + 7,
        audit_lines(&audit_file).len()
    );
}

/// The client's Audit-ID is kept and reaches the core with the request.
#[tokio::test]
async fn the_clients_audit_id_is_kept_and_reaches_the_core() {
    let (s, _, _) = authorized_and_audited().await;
    let anonymous = s.gateway.http1_client(None);
    scenario::clear_core_requests(&s.core).await;
    let (_, headers, _) = harness::send(
        &anonymous,
        Request::get(format!("{}/api/v1/namespaces", s.gateway.url()))
            .header("audit-id", "e2e-audit-1")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(headers["audit-id"], "e2e-audit-1");
    let seen = Value::from(scenario::core_requests(&s.core).await).to_string();
    assert!(
        seen.contains("e2e-audit-1"),
        "the core did not receive the Audit-ID"
    );
}

#[tokio::test]
async fn authorization_can_be_turned_off() {
    // A policy that allows nothing: with the webhook off, the remote is reached anyway, and
    // with --authorize-metrics=false so is /metrics.
    let s = wardle(
        json!({"rules": []}),
        &["--authorization-webhook=false", "--authorize-metrics=false"],
    )
    .start()
    .await;
    let carol = s.gateway.http1_client(Some(&s.user("carol", &[])));
    wait_until_served(&s, &carol).await;
    scenario::clear_core_requests(&s.core).await;
    assert_eq!(get(&s, &carol, FLUNDERS).await.0, StatusCode::OK);
    assert_eq!(reviews_at_core(&s).await.len(), 0);
    assert_eq!(get(&s, &carol, "/metrics").await.0, StatusCode::OK);
}

// ---- rotated proxy client certificates ----------------------------------------------------------

const IDENTITY: &str = "/apis/wardle.example.com/v1alpha1/identity";

/// The wardle session with authorization off, and dave, already served by the remote as
/// `aggregator`.
async fn proxied_as_aggregator() -> (Scenario, HttpClient) {
    let s = wardle(json!({}), &["--authorization-webhook=false"])
        .start()
        .await;
    let dave = s.gateway.http1_client(Some(&s.user("dave", &[])));
    wait_until_served(&s, &dave).await;
    let (status, _, body) = get(&s, &dave, IDENTITY).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tlsClientCN"], "aggregator");
    (s, dave)
}

/// A half-written rotation (key missing) keeps the current identity.
#[tokio::test]
async fn a_half_written_proxy_client_certificate_rotation_keeps_the_current_identity() {
    let (s, dave) = proxied_as_aggregator().await;
    let (_, key_file) = &s.pki.proxy_client;
    std::fs::write(key_file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        get(&s, &dave, IDENTITY).await.2["tlsClientCN"],
        "aggregator"
    );
    assert_eq!(get(&s, &dave, FLUNDERS).await.0, StatusCode::OK);
}

/// The new pair lands (renamed into place): backends are rebuilt with it.
#[tokio::test]
async fn a_rotated_proxy_client_certificate_is_presented_to_backends() {
    let (s, dave) = proxied_as_aggregator().await;
    let (cert_file, key_file) = &s.pki.proxy_client;
    let next = s.pki.proxy_ca.issue_client("aggregator-2", &[]);
    let dir = cert_file.parent().unwrap();
    let (c, k) = next.write(dir, "proxy-client-next").unwrap();
    std::fs::rename(k, key_file).unwrap();
    std::fs::rename(c, cert_file).unwrap();
    let rotated = harness::wait_until(Duration::from_secs(10), || async {
        get(&s, &dave, IDENTITY).await.2["tlsClientCN"] == "aggregator-2"
    })
    .await;
    assert!(
        rotated,
        "the backend never saw the new proxy certificate:\n{}",
        s.logs()
    );
    assert_eq!(get(&s, &dave, FLUNDERS).await.0, StatusCode::OK);
}

/// Certificate users reach the core as `X-Remote-*` on our proxy certificate; a rotated proxy
/// certificate is presented to the core too, without a restart.
#[tokio::test]
async fn a_rotated_proxy_client_certificate_is_presented_to_the_core() {
    let gateway = rotated_proxy_client_certificate_reaches_the_core(&[]).await;
    assert!(!gateway.process.logs().contains("loop panicked"));
}

/// Issue 41: the loop that hands a rotated proxy certificate to the core runs under the
/// supervisor. Made to panic in its first run (the debug builds' test hook), it is logged once,
/// counted, and started again, and the rotation still reaches the core. Before: the loop's task
/// died with the panic and the core got the old certificate until the gateway restarted.
#[tokio::test]
async fn a_rotated_proxy_client_certificate_reaches_the_core_after_its_loop_panicked() {
    let gateway = rotated_proxy_client_certificate_reaches_the_core(&[(
        "AGGREGATION_GATEWAY_TEST_PANIC",
        "proxy-identity:1",
    )])
    .await;
    let ended = gateway
        .process
        .lines()
        .into_iter()
        .filter(|l| l.text.contains("the proxy-identity loop panicked"))
        .count();
    assert_eq!(ended, 1, "{}", gateway.process.logs());
    let metrics = scenario::metrics(&gateway).await;
    let series = r#"aggregation_gateway_loop_restarts_total{loop="proxy-identity"} 1"#;
    assert!(metrics.contains(series), "no {series}:\n{metrics}");
}

/// A gateway in front of a TLS core, with `env`: erin's requests reach the core on the proxy
/// certificate, and after its rotation on disk on the new one.
async fn rotated_proxy_client_certificate_reaches_the_core(env: &[(&str, &str)]) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let core_ca = TestCa::new("core-ca");
    let core_ca_file = core_ca.write(dir.path(), "core-ca").unwrap();
    let (core_cert, core_key) = core_ca
        .issue_server(&["127.0.0.1"])
        .write(dir.path(), "core")
        .unwrap();
    let proxy_ca = TestCa::new("front-proxy-ca");
    let proxy_ca_file = proxy_ca.write(dir.path(), "front-proxy-ca").unwrap();
    let (proxy_cert, proxy_key) = proxy_ca
        .issue_client("aggregator", &[])
        .write(dir.path(), "proxy-client")
        .unwrap();
    let users_ca = TestCa::new("users-ca");
    let users_ca_file = users_ca.write(dir.path(), "users-ca").unwrap();
    let core = FixtureCore::start(&[
        "--tls-cert-file",
        &path_arg(&core_cert),
        "--tls-private-key-file",
        &path_arg(&core_key),
        "--client-ca-file",
        &path_arg(&proxy_ca_file),
    ])
    .await
    .unwrap();
    let mut options = GatewayOptions::new(format!("https://{}", core.addr)).args([
        "--apiservice-source".to_owned(),
        "none".to_owned(),
        "--core-ca-file".to_owned(),
        path_arg(&core_ca_file),
        "--proxy-client-cert-file".to_owned(),
        path_arg(&proxy_cert),
        "--proxy-client-key-file".to_owned(),
        path_arg(&proxy_key),
        "--client-ca-file".to_owned(),
        path_arg(&users_ca_file),
        // The restart counter is read anonymously.
        "--authorize-metrics=false".to_owned(),
    ]);
    for (key, value) in env {
        options = options.env(*key, *value);
    }
    let gateway = Gateway::start(options).await.unwrap();
    let erin = harness::http1_client(
        &gateway.ca_pem().unwrap(),
        Some(&users_ca.issue_client("erin", &[])),
    )
    .unwrap();
    let core_client = harness::http1_client(core_ca.cert_pem(), None).unwrap();
    // The client CN and X-Remote-User the core saw on the last GET of `path`.
    let seen_by_core = |path: &'static str| {
        let (erin, core_client, gateway_url, core_url) =
            (&erin, &core_client, gateway.url(), core.url());
        async move {
            let (status, _, _) = harness::get(erin, &format!("{gateway_url}{path}"))
                .await
                .unwrap();
            assert_eq!(status, StatusCode::OK);
            let (_, _, log) = harness::get(core_client, &format!("{core_url}/fixture/requests"))
                .await
                .unwrap();
            let log: Vec<Value> = serde_json::from_slice(&log).unwrap();
            let last = log
                .iter()
                .rev()
                .find(|r| r["path"] == path)
                .cloned()
                .unwrap_or(Value::Null);
            let user = scenario::recorded_header(&last, "x-remote-user")
                .into_iter()
                .next()
                .map_or(Value::Null, Value::from);
            (last["clientCN"].clone(), user)
        }
    };
    assert_eq!(
        seen_by_core("/api/v1/namespaces").await,
        (json!("aggregator"), json!("erin"))
    );

    let next = proxy_ca.issue_client("aggregator-2", &[]);
    let (c, k) = next.write(dir.path(), "proxy-client-next").unwrap();
    std::fs::rename(k, &proxy_key).unwrap();
    std::fs::rename(c, &proxy_cert).unwrap();
    let rotated = harness::wait_until(Duration::from_secs(10), || async {
        seen_by_core("/api/v1/namespaces/default").await.0 == json!("aggregator-2")
    })
    .await;
    assert!(
        rotated,
        "the core never saw the new proxy certificate:\n{}",
        gateway.process.logs()
    );
    gateway
}

// ---- serving certificates ---------------------------------------------------------------------

/// A gateway serving with a certificate from `serving-ca-1`, read from files in `dir`, and a
/// function that rotates them in place: written beside and renamed into place, as a Secret update
/// swaps files atomically.
async fn serving_from_files(
    dir: &Path,
) -> (FixtureCore, Gateway, TestCa, impl Fn(&CertifiedPair) + '_) {
    let cert_file = dir.join("tls.crt");
    let key_file = dir.join("tls.key");
    let write_pair = move |pair: &CertifiedPair| {
        let (c, k) = pair.write(dir, "next").unwrap();
        std::fs::rename(k, dir.join("tls.key")).unwrap();
        std::fs::rename(c, dir.join("tls.crt")).unwrap();
    };
    let old_ca = TestCa::new("serving-ca-1");
    write_pair(&old_ca.issue_server(&["localhost", "127.0.0.1"]));
    let (core, gateway) = core_and_gateway(&[
        "--tls-cert-file",
        &path_arg(&cert_file),
        "--tls-private-key-file",
        &path_arg(&key_file),
    ])
    .await;
    (core, gateway, old_ca, write_pair)
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_used_by_new_connections_while_a_watch_flows() {
    let dir = tempfile::tempdir().unwrap();
    let (_core, gateway, old_ca, write_pair) = serving_from_files(dir.path()).await;
    let old_client = harness::http2_client(old_ca.cert_pem(), None).unwrap();
    let mut watch = watch_configmaps(&old_client, &gateway).await;

    let new_ca = TestCa::new("serving-ca-2");
    write_pair(&new_ca.issue_server(&["localhost", "127.0.0.1"]));
    let picked_up = harness::wait_until(Duration::from_secs(10), || async {
        let fresh = harness::http1_client(new_ca.cert_pem(), None).unwrap();
        harness::get(&fresh, &format!("{}/version", gateway.url()))
            .await
            .is_ok_and(|(s, _, _)| s == StatusCode::OK)
    })
    .await;
    assert!(
        picked_up,
        "new connections never got the new certificate:\n{}",
        gateway.process.logs()
    );
    let stale = harness::http1_client(old_ca.cert_pem(), None).unwrap();
    assert!(
        harness::get(&stale, &format!("{}/version", gateway.url()))
            .await
            .is_err(),
        "a new connection still got the old certificate"
    );

    // The watch on the connection made before the rotation keeps flowing.
    let writer = harness::http1_client(new_ca.cert_pem(), None).unwrap();
    assert_eq!(
        create_configmap(&writer, &gateway, "after-rotation").await,
        StatusCode::CREATED
    );
    expect_event(&mut watch, "after-rotation").await;
}

#[tokio::test]
async fn a_broken_serving_certificate_on_disk_keeps_the_current_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_core, gateway, ca, _) = serving_from_files(dir.path()).await;
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let fresh = harness::http1_client(ca.cert_pem(), None).unwrap();
    assert_eq!(
        harness::get(&fresh, &format!("{}/version", gateway.url()))
            .await
            .unwrap()
            .0,
        StatusCode::OK
    );
}
