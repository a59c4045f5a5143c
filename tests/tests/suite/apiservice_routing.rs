//! A user registers an aggregated API server through the gateway and uses it: requests under its
//! group/version reach the remote server with the caller's identity (never a forged one), the
//! APIService's availability shows in `kubectl get apiservices`, a stopped backend gives a clear
//! 503, and deleting the APIService sends the group back to the core. The gateway's own probes
//! and discovery fetches carry kube-aggregator's identity, a backend is trusted only under its
//! Service name and `caBundle`, and the discovery documents the gateway serves need the
//! discovery permission.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::CertifiedPair;
use e2e::harness::{self, Gateway, GatewayOptions, Kubectl, RefusingPort};
use e2e::scenario::{self, get_as, json_or_null, recorded_header, ApiService, Scenario};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// kube's `system:discovery` role, bound to `system:authenticated`: anonymous callers get none
/// of the discovery documents.
fn discovery_for_authenticated() -> Value {
    json!({"group": "system:authenticated", "verbs": ["get"],
           "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*"]})
}

/// The resource names of `group` in an aggregated discovery document.
fn resources_of(doc: &Value, group: &str) -> Vec<String> {
    doc["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["metadata"]["name"] == group)
        .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
        .flat_map(|v| v["resources"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["resource"].as_str().map(str::to_owned))
        .collect()
}

/// Polls `kubectl get apiservices` until the row for NAME contains `wanted`.
async fn wait_for_row(kubectl: &Kubectl, wanted: &str, timeout: Duration) -> String {
    scenario::wait_for_apiservice_row(kubectl, NAME, wanted, timeout).await
}

const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
const IDENTITY: &str = "/apis/wardle.example.com/v1alpha1/identity";

/// The wardle backend behind the gateway, and alice applying its APIService with kubectl:
/// served by the remote within 2 s.
async fn applied_wardle() -> (Scenario, CertifiedPair, Kubectl) {
    let s = Scenario::wardle().start().await;
    let alice = s.user("alice", &["dev"]);
    let kubectl = s.kubectl(&alice);
    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    assert_flunders_served(&s, &alice, Duration::from_secs(2)).await;
    (s, alice, kubectl)
}

/// Before registration the group is the core's (which does not have it); once applied, the
/// remote serves it within 2 s.
#[tokio::test]
async fn an_applied_apiservice_takes_its_group_from_the_core_within_2s() {
    let s = Scenario::wardle().start().await;
    let alice = s.user("alice", &["dev"]);
    let (status, _) = s.get(&alice, FLUNDERS, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    s.kubectl(&alice)
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    assert_flunders_served(&s, &alice, Duration::from_secs(2)).await;
}

/// The backend sees the authenticated caller, never what the client claimed. (A forged
/// `Impersonate-User` is refused with 403 unless the core allows it: tests/authentication.rs.)
#[tokio::test]
async fn the_backend_sees_the_authenticated_caller_not_the_identity_it_claims() {
    let (s, alice, _) = applied_wardle().await;
    let (status, identity) = s
        .get(
            &alice,
            IDENTITY,
            &[
                ("x-remote-user", "admin"),
                ("x-remote-group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(identity["user"], "alice", "{identity}");
    let groups: Vec<&str> = identity["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    assert_eq!(groups, ["dev", "system:authenticated"]);
    assert_eq!(
        identity["tlsClientCN"], "aggregator",
        "the backend must see our proxy certificate"
    );
    let raw_headers = identity["headers"].to_string().to_ascii_lowercase();
    assert!(
        !raw_headers.contains("system:masters") && !raw_headers.contains("impersonate-user"),
        "{identity}"
    );
}

#[tokio::test]
async fn an_anonymous_caller_is_system_anonymous_at_the_backend() {
    let (s, _, _) = applied_wardle().await;
    let anonymous = s.gateway.http1_client(None);
    let (_, _, body) = harness::get(&anonymous, &format!("{}{IDENTITY}", s.gateway.url()))
        .await
        .unwrap();
    let identity: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(identity["user"], "system:anonymous", "{identity}");
}

#[tokio::test]
async fn objects_are_created_on_the_backend_as_the_caller() {
    let (s, alice, _) = applied_wardle().await;
    let client = s.gateway.http1_client(Some(&alice));
    let (status, _, body) = harness::send(
        &client,
        Request::post(format!("{}{FLUNDERS}", s.gateway.url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"apiVersion":"wardle.example.com/v1alpha1","kind":"Flunder","metadata":{"name":"first"}}"#,
            )))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let flunder: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        flunder["metadata"]["annotations"]["fixture.example.com/created-by"], "alice",
        "{flunder}"
    );
}

/// exec-style upgrades tunnel to the remote over HTTP/1.1.
#[tokio::test]
async fn exec_style_upgrades_tunnel_to_the_backend() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, alice, _) = applied_wardle().await;
    let gateway = &s.gateway;
    let config =
        harness::tls_client_config(&gateway.ca_pem().unwrap(), Some(&alice), &[b"http/1.1"])
            .unwrap();
    let mut tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    let request = format!(
        "POST /apis/wardle.example.com/v1alpha1/namespaces/default/flunders/first/exec HTTP/1.1\r\n\
         Host: {}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n",
        gateway.addr
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let head = harness::read_head(&mut tls, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tls.write_all(b"ping remote").await.unwrap();
    let mut echoed = [0u8; 11];
    tokio::time::timeout(Duration::from_secs(5), tls.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"ping remote");
}

#[tokio::test]
async fn kubectl_get_apiservices_shows_the_service_and_availability() {
    let (_s, _, kubectl) = applied_wardle().await;
    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    let table = kubectl.run_ok(&["get", "apiservices"]).await.stdout;
    assert!(
        table.contains("SERVICE") && table.contains("AVAILABLE"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(NAME) && l.contains("wardle/api")),
        "{table}"
    );
}

/// The backend goes away: the condition flips, requests fail fast with a Status, and the
/// metrics count it.
#[tokio::test]
async fn a_stopped_backend_flips_the_condition_and_requests_fail_fast_with_a_status() {
    let (mut s, alice, kubectl) = applied_wardle().await;
    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    s.backend_mut("wardle").process.kill();
    wait_for_row(
        &kubectl,
        "False (FailedDiscoveryCheck)",
        Duration::from_secs(15),
    )
    .await;
    let (status, body) = s.get(&alice, FLUNDERS, &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reason"], "ServiceUnavailable");
    assert!(body["message"].as_str().unwrap().contains(NAME), "{body}");
    // Anyone, anonymous callers included, learns which APIService failed and why, never where
    // its backend lives.
    let anonymous = s.gateway.http1_client(None);
    let (status, _, body) = harness::get(&anonymous, &format!("{}{FLUNDERS}", s.gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let message = json_or_null(&body)["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains(NAME), "{message}");
    assert!(
        !message.contains("127.0.0.1") && !message.contains("https://"),
        "the backend's address: {message}"
    );
    let metrics = scenario::metrics(&s.gateway).await;
    assert!(
        metrics.contains(&format!(
            "aggregator_unavailable_apiservice{{name=\"{NAME}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("aggregator_unavailable_apiservice_total{name=\"v1alpha1.wardle.example.com\",reason=\"FailedDiscoveryCheck\"}"), "{metrics}");
}

#[tokio::test]
async fn deleting_the_apiservice_sends_the_group_back_to_the_core() {
    let (s, alice, kubectl) = applied_wardle().await;
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back = harness::wait_until(Duration::from_secs(2), || async {
        s.get(&alice, FLUNDERS, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(back, "after delete the core should answer 404");
}

/// Flunders are listed for `user` through the gateway `within` the given time.
async fn assert_flunders_served(s: &Scenario, user: &CertifiedPair, within: Duration) {
    let served = scenario::serves(&s.gateway, user, FLUNDERS, "FlunderList", within).await;
    assert!(
        served,
        "the remote did not serve {FLUNDERS} within {within:?}:\n{}",
        s.logs()
    );
}

/// The wardle backend behind a gateway reading an empty `--apiservice-dir`.
async fn file_source_session() -> (Scenario, CertifiedPair) {
    let s = Scenario::wardle().file_source().start().await;
    let alice = s.user("alice", &[]);
    (s, alice)
}

/// A manifest naming a Service the gateway cannot reach is routed, but unavailable; edited to
/// name the real Service, it is served by the remote without a restart.
#[tokio::test]
async fn file_source_picks_up_edited_manifests_without_restart() {
    let (s, alice) = file_source_session().await;
    let wardle = s.pki.apiservice(GROUP, "v1alpha1", "wardle");
    wardle
        .clone()
        .service("missing")
        .write_to(s.manifests(), "wardle.yaml");
    let unavailable = harness::wait_until(Duration::from_secs(5), || async {
        let (status, body) = s.get(&alice, FLUNDERS, &[]).await;
        status == StatusCode::SERVICE_UNAVAILABLE
            && body["message"].as_str().is_some_and(|m| m.contains(NAME))
    })
    .await;
    assert!(unavailable, "{}", s.logs());

    wardle.write_to(s.manifests(), "wardle.yaml");
    assert_flunders_served(&s, &alice, Duration::from_secs(5)).await;
}

/// A broken edit keeps the last good set and says which file is wrong.
#[tokio::test]
async fn a_broken_manifest_edit_keeps_the_last_good_set_and_names_the_file() {
    let (s, alice) = file_source_session().await;
    s.pki
        .apiservice(GROUP, "v1alpha1", "wardle")
        .write_to(s.manifests(), "wardle.yaml");
    assert_flunders_served(&s, &alice, Duration::from_secs(5)).await;

    std::fs::write(
        s.manifests().join("wardle.yaml"),
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nspec: [oops\n",
    )
    .unwrap();
    let reported = s
        .gateway
        .process
        .wait_for_line(
            |l| l.contains("wardle.yaml") && l.contains("ERROR"),
            Duration::from_secs(5),
        )
        .await;
    assert!(reported.is_some(), "{}", s.logs());
    assert_eq!(s.get(&alice, FLUNDERS, &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn before_the_first_sync_unclaimed_groups_get_503_with_retry_after() {
    // No core at all: the kube source can never sync.
    let core = RefusingPort::bind().unwrap();
    let gateway = Gateway::start(GatewayOptions::new(core.url()))
        .await
        .unwrap();
    let client = gateway.http1_client(None);
    let (status, headers, body) = harness::get(
        &client,
        &format!("{}/apis/metrics.k8s.io/v1beta1/pods", gateway.url()),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "5");
    let s: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(s["details"]["retryAfterSeconds"], 5, "{s}");
    let (_, _, ready) = harness::get(&client, &format!("{}/readyz?verbose", gateway.url()))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ready).contains("[-]apiservice-sources-synced failed"),
        "{ready:?}"
    );
}

#[tokio::test]
async fn services_and_endpointslices_on_the_core_resolve_the_backend() {
    // No static services map: the gateway must find the backend through the core's Service.
    let s = Scenario::wardle()
        .without_static_services()
        .config_yaml("logLevel: info\n")
        .start()
        .await;
    let (core, pki) = (&s.core, &s.pki);
    let port = s.backend("wardle").addr.port();
    let alice = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice);

    scenario::create_wardle_service(core, port).await;
    let wardle = pki.apiservice(GROUP, "v1alpha1", "wardle").port(port);
    kubectl.apply_yaml(&wardle.yaml()).await;

    // The Service exists but has no EndpointSlices yet (kube-aggregator's EndpointsNotFound).
    wait_for_row(
        &kubectl,
        "False (EndpointsNotFound)",
        Duration::from_secs(10),
    )
    .await;
    // A slice whose only endpoint is not ready: MissingEndpoints.
    assert_eq!(
        scenario::create_endpoint_slice(core, "api-unready", port, false).await,
        StatusCode::CREATED
    );
    wait_for_row(
        &kubectl,
        "False (MissingEndpoints)",
        Duration::from_secs(10),
    )
    .await;

    assert_eq!(
        scenario::create_endpoint_slice(core, "api-abcde", port, true).await,
        StatusCode::CREATED
    );
    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    let (status, body) = s.get(&alice, FLUNDERS, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "FlunderList");
}

/// With `--apiservice-label-selector` one gateway serves only its own APIServices: an unlabeled
/// one stays with the core until it gets the label.
#[tokio::test]
async fn a_label_selector_limits_the_apiservices_a_gateway_serves() {
    let s = Scenario::wardle()
        .gateway_args(&[
            "--apiservice-label-selector",
            "gateway.example.com/owner=edge",
        ])
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice);

    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    // Not ours yet: the core answers (it does not serve the group).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(s.get(&alice, FLUNDERS, &[]).await.0, StatusCode::NOT_FOUND);

    kubectl
        .run_ok(&[
            "label",
            "apiservice",
            NAME,
            "gateway.example.com/owner=edge",
        ])
        .await;
    assert_flunders_served(&s, &alice, Duration::from_secs(5)).await;
}

/// A backend that authorizes discovery like a kube API server (anonymous callers are refused)
/// still becomes Available and appears in discovery: the gateway's probe and discovery fetches
/// come as kube-aggregator's own user, on the proxy certificate.
#[tokio::test]
async fn probes_and_discovery_reach_an_authorizing_backend_as_the_aggregator() {
    let s = Scenario::wardle().start().await;
    let (gateway, pki, backend) = (&s.gateway, &s.pki, s.backend("wardle"));
    // Set before the APIService exists, so the gateway never reached the backend without it.
    pki.set_backend_policy(
        backend,
        "wardle",
        &json!({"rules": [discovery_for_authenticated()]}),
    )
    .await;
    let alice = s.user("alice", &["dev"]);
    let kubectl = s.kubectl(&alice);
    kubectl
        .apply_yaml(&pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;

    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    // The merged discovery has the backend's resources: its /apis was readable too.
    let listed = harness::wait_until(Duration::from_secs(10), || async {
        let (status, doc) = get_as(gateway, &alice, "/apis", &[("accept", AGGREGATED)]).await;
        status == StatusCode::OK && resources_of(&doc, GROUP).contains(&"flunders".to_owned())
    })
    .await;
    assert!(listed, "{}", gateway.process.logs());

    let requests = pki.backend_requests(backend, "wardle").await;
    let identity = |r: &Value| {
        (
            recorded_header(r, "x-remote-user"),
            recorded_header(r, "x-remote-group"),
            r["clientCN"].clone(),
        )
    };
    let aggregator = (
        vec!["system:kube-aggregator".to_owned()],
        vec!["system:masters".to_owned()],
        json!("aggregator"),
    );
    for path in ["/apis/wardle.example.com/v1alpha1", "/apis"] {
        let seen: Vec<&Value> = requests.iter().filter(|r| r["path"] == path).collect();
        assert!(
            !seen.is_empty(),
            "the backend never saw {path}: {requests:?}"
        );
        for r in seen {
            assert_eq!(identity(r), aggregator, "{path}: {r}");
        }
    }
}

/// The backend's certificate names only `api.wardle.svc`. The gateway routes to it under that
/// name with its caBundle, and with `insecureSkipTLSVerify`; it does not under another CA or
/// another Service name (same address), and says why.
#[tokio::test]
async fn backends_are_trusted_only_under_their_service_name_and_ca_bundle() {
    let s = Scenario::builder()
        .backend("wardle", GROUP, "v1alpha1,v1beta1,v1,v2", &[])
        .service_alias("wardle", "impostor", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice);
    let other_ca = e2e::certs::TestCa::new("other-ca");
    // One row per APIService: its version, how its manifest trusts the backend, the AVAILABLE
    // column it gets, and why requests to it are refused (none: served).
    type Trust = fn(ApiService, &e2e::certs::TestCa) -> ApiService;
    let cases: [(&str, Trust, &str, Option<&str>); 4] = [
        ("v1alpha1", |api, _| api, "True", None),
        (
            "v1beta1",
            |api, other| api.ca_bundle(other.cert_pem()),
            "False (FailedDiscoveryCheck)",
            Some("UnknownIssuer"),
        ),
        ("v1", |api, _| api.insecure_skip_tls_verify(), "True", None),
        (
            "v2",
            |api, _| api.service("impostor"),
            "False (FailedDiscoveryCheck)",
            Some("impostor.wardle.svc"),
        ),
    ];
    for (version, trust, _, _) in &cases {
        let manifest = trust(s.pki.apiservice(GROUP, version, "wardle"), &other_ca);
        kubectl.apply_yaml(&manifest.yaml()).await;
    }

    for (version, _, row, refused_because) in cases {
        let name = format!("{version}.{GROUP}");
        scenario::wait_for_apiservice_row(&kubectl, &name, row, Duration::from_secs(15)).await;
        let flunders = format!("/apis/{GROUP}/{version}/namespaces/default/flunders");
        let (status, body) = s.get(&alice, &flunders, &[]).await;
        match refused_because {
            None => {
                assert_eq!(status, StatusCode::OK, "{version}: {body}");
                assert_eq!(body["kind"], "FlunderList", "{version}: {body}");
            }
            Some(why) => {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{version}: {body}");
                assert_eq!(body["kind"], "Status", "{version}: {body}");
                let message = body["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains(&name) && message.contains(why),
                    "{version}: the message should name the APIService and say why: {message}"
                );
            }
        }
    }
}

/// With authorization on, the discovery and OpenAPI documents the gateway serves from its cache
/// need the discovery permission, as on kube-apiserver: anonymous callers get 403, an
/// authenticated user gets the merged documents and kubectl works.
#[tokio::test]
async fn discovery_documents_need_the_discovery_permission() {
    let policy = json!({"rules": [
        discovery_for_authenticated(),
        {"group": "system:authenticated", "verbs": ["get", "list"], "apiGroups": ["*"], "resources": ["*"]},
    ]});
    let s = Scenario::wardle()
        .core_policy(policy)
        .apiservice(GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let gateway = &s.gateway;
    let alice = s.user("alice", &["dev"]);
    let openapi = "/openapi/v3/apis/wardle.example.com/v1alpha1";
    let served = harness::wait_until(Duration::from_secs(10), || async {
        let (status, doc) = get_as(gateway, &alice, "/apis", &[("accept", AGGREGATED)]).await;
        status == StatusCode::OK
            && resources_of(&doc, GROUP).contains(&"flunders".to_owned())
            && get_as(gateway, &alice, openapi, &[]).await.0 == StatusCode::OK
    })
    .await;
    assert!(
        served,
        "alice never got the merged /apis:\n{}",
        gateway.process.logs()
    );

    for (path, accept) in [
        ("/apis", AGGREGATED),
        ("/apis", "application/json"),
        ("/api", AGGREGATED),
        ("/apis/wardle.example.com", "application/json"),
        ("/openapi/v3", "application/json"),
        (openapi, "application/json"),
    ] {
        let (status, _, body) = scenario::try_get(gateway, None, path, &[("accept", accept)])
            .await
            .unwrap();
        let body = json_or_null(&body);
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "anonymous {path} ({accept}): {body}"
        );
        assert_eq!(body["reason"], "Forbidden", "{path} ({accept}): {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with(&format!(
                    "forbidden: User \"system:anonymous\" cannot get path \"{path}\""
                )),
            "{path} ({accept}): {body}"
        );
        let (status, body) = get_as(gateway, &alice, path, &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "alice {path} ({accept}): {body}");
    }

    let kubectl = s.kubectl(&alice);
    let resources = kubectl.run_ok(&["api-resources"]).await.stdout;
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("flunders") && l.contains("wardle.example.com/v1alpha1")),
        "{resources}"
    );
}
