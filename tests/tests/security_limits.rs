//! Security and limits, as an operator and users see them: requests to an aggregated API are
//! authorized by a SubjectAccessReview on the core (denials read like kube-apiserver's, decisions
//! are cached), `/metrics` can be protected, every request leaves one audit line, in-flight and
//! body limits answer 429/413, slow clients and hung backends are cut off without hurting
//! watches, and a rotated serving certificate is picked up without a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness::{self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, HttpClient};
use e2e::scenario::{self, path_arg, Pki, WardleScenario};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

/// An aggregated backend registered through a manifest file, users with client certificates,
/// and the gateway's proxy identity; the backend also trusts the proxy CN `aggregator-2`.
struct Scenario {
    gateway: Gateway,
    _backend: FixtureAggregated,
    core: FixtureCore,
    pki: Pki,
}

impl Scenario {
    async fn start(policy: Value, gateway_args: &[&str]) -> Scenario {
        let backend_args = ["--requestheader-allowed-names", "aggregator-2"];
        let WardleScenario {
            gateway,
            backend,
            core,
            pki,
        } = WardleScenario::start(Pki::new(), &policy, &backend_args, gateway_args).await;
        Scenario {
            gateway,
            _backend: backend,
            core,
            pki,
        }
    }

    fn user(&self, name: &str, groups: &[&str]) -> CertifiedPair {
        self.pki.user(name, groups)
    }

    fn client(&self, user: Option<&CertifiedPair>) -> HttpClient {
        harness::http1_client(&self.gateway.ca_pem().unwrap(), user).unwrap()
    }

    async fn get(&self, client: &HttpClient, path: &str) -> (StatusCode, http::HeaderMap, Value) {
        let (status, headers, body) =
            harness::get(client, &format!("{}{path}", self.gateway.url()))
                .await
                .unwrap();
        (
            status,
            headers,
            serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body))),
        )
    }

    /// SubjectAccessReviews the core has answered since the last `clear_core_requests`.
    async fn reviews_at_core(&self) -> Vec<Value> {
        scenario::core_posts(&self.core, "subjectaccessreviews").await
    }

    async fn clear_core_requests(&self) {
        scenario::clear_core_requests(&self.core).await
    }
}

/// Waits until the remote answers alice (availability is probed every second).
async fn wait_until_served(s: &Scenario, client: &HttpClient) {
    let served = harness::wait_until(Duration::from_secs(10), || async {
        s.get(client, FLUNDERS).await.0 == StatusCode::OK
    })
    .await;
    assert!(
        served,
        "the remote never served alice:\n{}",
        s.gateway.process.logs()
    );
}

fn audit_lines(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}

#[tokio::test]
async fn remote_requests_are_authorized_cached_and_audited() {
    let policy = json!({"rules": [
        {"group": "dev", "verbs": ["get", "list"], "apiGroups": [GROUP], "resources": ["flunders"]},
        {"user": "alice", "verbs": ["get"], "nonResourceURLs": ["/metrics"]},
    ]});
    let audit_dir = tempfile::tempdir().unwrap();
    let audit_file = audit_dir.path().join("audit.log");
    let s = Scenario::start(
        policy,
        &[
            "--authorize-metrics",
            "--audit-log-path",
            &path_arg(&audit_file),
        ],
    )
    .await;
    let alice = s.client(Some(&s.user("alice", &["dev"])));
    let bob = s.client(Some(&s.user("bob", &["ops"])));
    wait_until_served(&s, &alice).await;

    // Allowed: the request reaches the remote.
    let (status, _, body) = s.get(&alice, FLUNDERS).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["kind"], "FlunderList", "{body}");

    // Denied: kube-apiserver's Forbidden, word for word, with the authorizer's reason after it.
    let (status, _, body) = s.get(&bob, FLUNDERS).await;
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
    let (status, _, body) = s
        .get(&bob, "/apis/wardle.example.com/v1alpha1/flunders/f1/status")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body["message"].as_str().unwrap().starts_with(
            "flunders.wardle.example.com \"f1\" is forbidden: User \"bob\" cannot get resource \"flunders/status\" in API group \"wardle.example.com\" at the cluster scope"
        ),
        "{body}"
    );
    assert_eq!(body["details"]["name"], "f1");

    // Decisions are cached: repeated questions cost the core one review each.
    s.clear_core_requests().await;
    for _ in 0..5 {
        assert_eq!(s.get(&alice, FLUNDERS).await.0, StatusCode::OK);
        assert_eq!(s.get(&bob, FLUNDERS).await.0, StatusCode::FORBIDDEN);
    }
    let reviews = s.reviews_at_core().await;
    assert_eq!(reviews.len(), 0, "all answers were cached: {reviews:?}");
    assert_eq!(
        s.get(&alice, &format!("{FLUNDERS}/f2")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        s.get(&alice, &format!("{FLUNDERS}/f2")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        s.reviews_at_core().await.len(),
        1,
        "one new question, one review"
    );

    // Requests to the core are the core's business: no review from the gateway.
    s.clear_core_requests().await;
    assert_eq!(
        s.get(&bob, "/api/v1/namespaces/default/configmaps").await.0,
        StatusCode::OK
    );
    assert_eq!(s.reviews_at_core().await.len(), 0);

    // /metrics is protected; health endpoints stay open to anyone.
    let anonymous = s.client(None);
    let (status, _, body) = s.get(&bob, "/metrics").await;
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
    assert_eq!(s.get(&anonymous, "/readyz").await.0, StatusCode::OK);
    assert_eq!(s.get(&anonymous, "/livez").await.0, StatusCode::OK);

    // The audit log: one line per request, with user, verb, code, decision and target, and the
    // Audit-ID the client saw.
    let (status, headers, _) = s.get(&bob, FLUNDERS).await;
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

    // One line per request: count a fresh batch exactly.
    let before = audit_lines(&audit_file).len();
    for _ in 0..7 {
        s.get(&anonymous, "/livez").await;
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

    // The client's Audit-ID is kept and reaches the core with the request.
    s.clear_core_requests().await;
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
    // A policy that allows nothing: with the webhook off, the remote is reached anyway.
    let s = Scenario::start(json!({"rules": []}), &["--authorization-webhook=false"]).await;
    let carol = s.client(Some(&s.user("carol", &[])));
    wait_until_served(&s, &carol).await;
    s.clear_core_requests().await;
    assert_eq!(s.get(&carol, FLUNDERS).await.0, StatusCode::OK);
    assert_eq!(s.reviews_at_core().await.len(), 0);
    assert_eq!(s.get(&carol, "/metrics").await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_rotated_proxy_client_certificate_is_presented_to_backends() {
    let s = Scenario::start(json!({}), &["--authorization-webhook=false"]).await;
    let dave = s.client(Some(&s.user("dave", &[])));
    wait_until_served(&s, &dave).await;
    let identity = "/apis/wardle.example.com/v1alpha1/identity";
    let (status, _, body) = s.get(&dave, identity).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tlsClientCN"], "aggregator");

    // A half-written rotation (key missing) keeps the current identity.
    let (cert_file, key_file) = &s.pki.proxy_client;
    std::fs::write(key_file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(s.get(&dave, identity).await.2["tlsClientCN"], "aggregator");

    // The new pair lands (renamed into place): backends are rebuilt with it.
    let next = s.pki.proxy_ca.issue_client("aggregator-2", &[]);
    let dir = cert_file.parent().unwrap();
    let (c, k) = next.write(dir, "proxy-client-next").unwrap();
    std::fs::rename(k, key_file).unwrap();
    std::fs::rename(c, cert_file).unwrap();
    let rotated = harness::wait_until(Duration::from_secs(10), || async {
        s.get(&dave, identity).await.2["tlsClientCN"] == "aggregator-2"
    })
    .await;
    assert!(
        rotated,
        "the backend never saw the new proxy certificate:\n{}",
        s.gateway.process.logs()
    );
    assert_eq!(s.get(&dave, FLUNDERS).await.0, StatusCode::OK);
}

/// Certificate users reach the core as `X-Remote-*` on our proxy certificate; a rotated proxy
/// certificate is presented to the core too, without a restart.
#[tokio::test]
async fn a_rotated_proxy_client_certificate_is_presented_to_the_core() {
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
    let gateway = Gateway::start(GatewayOptions::new(format!("https://{}", core.addr)).args([
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
    ]))
    .await
    .unwrap();
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
            let user = last["headers"]
                .as_array()
                .and_then(|h| {
                    h.iter().find(|p| {
                        p[0].as_str()
                            .is_some_and(|n| n.eq_ignore_ascii_case("x-remote-user"))
                    })
                })
                .map(|p| p[1].clone())
                .unwrap_or(Value::Null);
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
}

// ---- limits -------------------------------------------------------------------------------------

async fn core_gateway(args: &[&str]) -> (FixtureCore, Gateway) {
    let core = FixtureCore::start(&[]).await.unwrap();
    let gateway = Gateway::start(GatewayOptions::new(core.url()).args(args.iter().copied()))
        .await
        .unwrap();
    (core, gateway)
}

fn configmap(name: &str) -> Full<Bytes> {
    Full::new(Bytes::from(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
            .to_string(),
    ))
}

async fn create_configmap(client: &HttpClient, gateway: &Gateway, name: &str) -> StatusCode {
    harness::send(
        client,
        Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            gateway.url()
        ))
        .header("content-type", "application/json")
        .body(configmap(name))
        .unwrap(),
    )
    .await
    .unwrap()
    .0
}

/// Opens a watch on configmaps and returns a channel of the raw chunks it streams.
async fn watch_configmaps(
    client: &HttpClient,
    gateway: &Gateway,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let resp = harness::send_streaming(
        client,
        Request::get(format!(
            "{}/api/v1/namespaces/default/configmaps?watch=1",
            gateway.url()
        ))
        .body(Full::new(Bytes::new()))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut body = resp.into_body();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx
                    .send(String::from_utf8_lossy(&data).into_owned())
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    rx
}

async fn expect_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = String::new();
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            Ok(Some(chunk)) => {
                seen.push_str(&chunk);
                if seen.contains(&format!("\"name\":\"{name}\"")) {
                    return;
                }
            }
            Ok(None) => panic!("the watch ended; saw {seen:?}"),
            Err(_) => {}
        }
    }
    panic!("no event for {name} on the watch; saw {seen:?}");
}

#[tokio::test]
async fn in_flight_limit_answers_429_while_watches_keep_streaming() {
    let (core, gateway) = core_gateway(&["--max-requests-inflight=2"]).await;
    let ca = gateway.ca_pem().unwrap();
    let client = harness::http1_client(&ca, None).unwrap();
    let mut watch = watch_configmaps(&client, &gateway).await;
    let mut watch2 = watch_configmaps(&client, &gateway).await;

    let slow = format!("{}/fixture/sleep?ms=5000", gateway.url());
    let slow_requests: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            let url = slow.clone();
            tokio::spawn(async move { harness::get(&client, &url).await.unwrap().0 })
        })
        .collect();
    // Both slots taken (the two watches hold none). Probing before both slow requests are in
    // would race them for the slots, so give them a head start.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut refused = false;
    while !refused && Instant::now() < deadline {
        let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
            .await
            .unwrap();
        seen.push(status);
        refused = status == StatusCode::TOO_MANY_REQUESTS;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        refused,
        "a third read-only request was not refused: {seen:?}\n{}",
        gateway.process.logs()
    );
    let (status, headers, body) =
        harness::get(&client, &format!("{}/api/v1/namespaces", gateway.url()))
            .await
            .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "TooManyRequests");

    // Mutating requests are counted apart, and the watches keep flowing.
    assert_eq!(
        create_configmap(&client, &gateway, "during-load").await,
        StatusCode::CREATED
    );
    expect_event(&mut watch, "during-load").await;
    expect_event(&mut watch2, "during-load").await;

    for r in slow_requests {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    // Slots are free again.
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    drop(core);
}

#[tokio::test]
async fn hung_backends_time_out_but_watches_do_not_and_large_bodies_are_refused() {
    let (_core, gateway) =
        core_gateway(&["--request-timeout=2s", "--max-request-body-bytes=1024"]).await;
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let mut watch = watch_configmaps(&client, &gateway).await;

    let started = Instant::now();
    let (status, _, body) =
        harness::get(&client, &format!("{}/fixture/sleep?ms=5000", gateway.url()))
            .await
            .unwrap();
    let took = started.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "Timeout", "{body}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );

    // The client's ?timeout= shortens the limit.
    let started = Instant::now();
    let (status, _, _) = harness::get(
        &client,
        &format!("{}/fixture/sleep?ms=5000&timeout=500ms", gateway.url()),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "{:?}",
        started.elapsed()
    );

    // The watch opened before all this is still streaming, well past the request timeout.
    assert_eq!(
        create_configmap(&client, &gateway, "after-timeouts").await,
        StatusCode::CREATED
    );
    expect_event(&mut watch, "after-timeouts").await;

    // A body over the limit is refused before it reaches the core.
    let big = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
        "data": {"k": "x".repeat(4096)}});
    let (status, _, body) = harness::send(
        &client,
        Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            gateway.url()
        ))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(big.to_string())))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "RequestEntityTooLarge");
}

#[tokio::test]
async fn slow_header_clients_are_cut_off_and_huge_headers_refused() {
    let (_core, gateway) =
        core_gateway(&["--header-read-timeout=1s", "--max-header-bytes=16384"]).await;
    let ca = gateway.ca_pem().unwrap();

    // Half a request line, then silence.
    let mut slow = harness::tls_connect(gateway.addr, &ca).await.unwrap();
    slow.write_all(b"GET /version HT").await.unwrap();
    slow.flush().await.unwrap();
    let started = Instant::now();

    // A TCP client that never starts the TLS handshake.
    let mut silent = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();

    // Everyone else is served meanwhile.
    let client = harness::http1_client(&ca, None).unwrap();
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);

    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "the slow client was not cut off within 5s");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "unexpected answer to a slow client: {text:?}"
    );
    let mut byte = [0u8; 1];
    let silent_closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut byte)).await;
    assert!(
        matches!(silent_closed, Ok(Ok(0)) | Ok(Err(_))),
        "a client that never completes the TLS handshake must be disconnected"
    );

    // A header block over --max-header-bytes: 431.
    let mut big = harness::tls_connect(gateway.addr, &ca).await.unwrap();
    let request = format!(
        "GET /version HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(32 * 1024)
    );
    let _ = big.write_all(request.as_bytes()).await;
    let head = harness::read_head(&mut big, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    // A new client: the first one's pooled connection has idled past --header-read-timeout,
    // which hyper also applies while waiting for the next request on a kept-alive connection,
    // so reusing it races the server's close.
    let client = harness::http1_client(&ca, None).unwrap();
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: what a client sends right after the preface.
const H2_EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// Reads whatever the gateway sends until it closes the connection; false if it is still open at
/// `deadline`. A close without TLS close_notify shows up as an error, which counts as closed.
async fn closed_by<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, deadline: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await;
        match read {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn clients_that_stall_before_their_first_request_are_cut_off_on_http2_and_http1() {
    let (_core, gateway) = core_gateway(&["--header-read-timeout=1s"]).await;
    let ca = gateway.ca_pem().unwrap();
    let h2_tls = harness::tls_client_config(&ca, None, &[b"h2"]).unwrap();
    let started = Instant::now();

    // Each completes the TLS handshake and then stops short of a request.
    let mut stalled = Vec::new();
    let silent_h2 = harness::tls_connect_with(gateway.addr, h2_tls.clone())
        .await
        .unwrap();
    assert_eq!(silent_h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    stalled.push(("h2, nothing sent", silent_h2));
    let mut half_preface = harness::tls_connect_with(gateway.addr, h2_tls.clone())
        .await
        .unwrap();
    half_preface.write_all(&H2_PREFACE[..12]).await.unwrap();
    half_preface.flush().await.unwrap();
    stalled.push(("h2, half the preface", half_preface));
    // Past the preface hyper's keep-alive pings would only notice after 40s, and never if the
    // client answers them.
    let mut preface_only = harness::tls_connect_with(gateway.addr, h2_tls.clone())
        .await
        .unwrap();
    preface_only.write_all(H2_PREFACE).await.unwrap();
    preface_only.write_all(H2_EMPTY_SETTINGS).await.unwrap();
    preface_only.flush().await.unwrap();
    stalled.push(("h2, preface and SETTINGS but no request", preface_only));
    stalled.push((
        "http/1.1, nothing sent",
        harness::tls_connect(gateway.addr, &ca).await.unwrap(),
    ));
    let no_alpn = harness::tls_client_config(&ca, None, &[]).unwrap();
    stalled.push((
        "no ALPN, nothing sent",
        harness::tls_connect_with(gateway.addr, no_alpn)
            .await
            .unwrap(),
    ));

    // Everyone else is served meanwhile, on both protocols.
    let h1 = harness::http1_client(&ca, None).unwrap();
    let h2 = harness::http2_client(&ca, None).unwrap();
    for client in [&h1, &h2] {
        let (status, _, _) = harness::get(client, &format!("{}/version", gateway.url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
    }

    // An HTTP/2 connection that has made a request may then idle past the timeout.
    let tls = harness::tls_connect_with(gateway.addr, h2_tls)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let version = || {
        Request::get(format!("{}/version", gateway.url()))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = sender.send_request(version()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.into_body().collect().await.unwrap();
    let idle_since = Instant::now();

    let deadline = started + Duration::from_secs(5);
    let mut still_open = Vec::new();
    for (what, mut stream) in stalled {
        if !closed_by(&mut stream, deadline).await {
            still_open.push(what);
        }
    }
    assert!(
        still_open.is_empty(),
        "not cut off within 5s: {still_open:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "cut off early: {took:?}"
    );

    // Idling is the point here: the second request goes out well past the timeout.
    tokio::time::sleep_until((idle_since + Duration::from_millis(1500)).into()).await;
    let second = tokio::time::timeout(Duration::from_secs(5), sender.send_request(version()))
        .await
        .expect("no answer on the idle HTTP/2 connection")
        .expect("the HTTP/2 connection that had made a request was closed");
    assert_eq!(second.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_used_by_new_connections_while_a_watch_flows() {
    let dir = tempfile::tempdir().unwrap();
    let cert_file = dir.path().join("tls.crt");
    let key_file = dir.path().join("tls.key");
    let old_ca = TestCa::new("serving-ca-1");
    let write_pair = |pair: &CertifiedPair| {
        // Written beside and renamed into place, as a Secret update swaps files atomically.
        let (c, k) = pair.write(dir.path(), "next").unwrap();
        std::fs::rename(k, &key_file).unwrap();
        std::fs::rename(c, &cert_file).unwrap();
    };
    write_pair(&old_ca.issue_server(&["localhost", "127.0.0.1"]));
    let (_core, gateway) = core_gateway(&[
        "--tls-cert-file",
        &path_arg(&cert_file),
        "--tls-private-key-file",
        &path_arg(&key_file),
    ])
    .await;
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

    // A broken pair on disk keeps the current certificate.
    std::fs::write(&cert_file, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let fresh = harness::http1_client(new_ca.cert_pem(), None).unwrap();
    assert_eq!(
        harness::get(&fresh, &format!("{}/version", gateway.url()))
            .await
            .unwrap()
            .0,
        StatusCode::OK
    );
}
