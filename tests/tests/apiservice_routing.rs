//! A user registers an aggregated API server through the gateway and uses it: requests under its
//! group/version reach the remote server with the caller's identity (never a forged one), the
//! APIService's availability shows in `kubectl get apiservices`, a stopped backend gives a clear
//! 503, and deleting the APIService sends the group back to the core. The gateway's own probes
//! and discovery fetches carry kube-aggregator's identity, a backend is trusted only under its
//! Service name and `caBundle`, and the discovery documents the gateway serves need the
//! discovery permission.

use std::time::Duration;

use bytes::Bytes;
use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, Kubectl, KubectlVersion};
use e2e::scenario::{self, create_on_core, get_as, json_or_null, Pki};
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

/// Every value of header `name` in a request the fixture recorded (`[[name, value], ...]`).
fn header_values(request: &Value, name: &str) -> Vec<String> {
    request["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pair| {
            pair[0]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })
        .filter_map(|pair| pair[1].as_str().map(str::to_owned))
        .collect()
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

/// Creates an EndpointSlice of Service `wardle/api` on the core, with one endpoint at
/// 127.0.0.1:`port`.
async fn create_endpoint_slice(
    core: &FixtureCore,
    name: &str,
    port: u16,
    ready: bool,
) -> StatusCode {
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    create_on_core(
        core,
        "/apis/discovery.k8s.io/v1/namespaces/wardle/endpointslices",
        slice,
    )
    .await
}

#[tokio::test]
async fn an_applied_apiservice_routes_to_its_backend_with_the_callers_identity() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let mut backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let config = pki.gateway_config(&[("wardle", &backend)], "");
    let gateway = pki.start_gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &["dev"]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let wardle = pki.apiservice(GROUP, "v1alpha1", "wardle");

    // Before registration the group is the core's (which does not have it).
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let (status, _) = get_as(&gateway, &alice, flunders, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    kubectl.apply_yaml(&wardle.yaml()).await;
    let served = harness::wait_until(Duration::from_secs(2), || async {
        let (status, body) = get_as(&gateway, &alice, flunders, &[]).await;
        status == StatusCode::OK && body["kind"] == "FlunderList"
    })
    .await;
    assert!(
        served,
        "the remote did not serve {flunders} within 2s:\n{}",
        gateway.process.logs()
    );

    // The backend sees the authenticated caller, never what the client claimed. (A forged
    // `Impersonate-User` is refused with 403 unless the core allows it: tests/authentication.rs.)
    let (status, identity) = get_as(
        &gateway,
        &alice,
        "/apis/wardle.example.com/v1alpha1/identity",
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

    // An anonymous caller is system:anonymous at the backend.
    let anonymous = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let (_, _, body) = harness::get(
        &anonymous,
        &format!(
            "{}/apis/wardle.example.com/v1alpha1/identity",
            gateway.url()
        ),
    )
    .await
    .unwrap();
    let identity: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(identity["user"], "system:anonymous", "{identity}");

    // Objects are created on the backend as alice.
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), Some(&alice)).unwrap();
    let (status, _, body) = harness::send(
        &client,
        Request::post(format!("{}{flunders}", gateway.url()))
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

    // exec-style upgrades tunnel to the remote over HTTP/1.1.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

    // The backend goes away: the condition flips and requests fail fast with a Status.
    backend.process.kill();
    wait_for_row(
        &kubectl,
        "False (FailedDiscoveryCheck)",
        Duration::from_secs(15),
    )
    .await;
    let (status, body) = get_as(&gateway, &alice, flunders, &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reason"], "ServiceUnavailable");
    assert!(body["message"].as_str().unwrap().contains(NAME), "{body}");
    let metrics = harness::get(&anonymous, &format!("{}/metrics", gateway.url()))
        .await
        .unwrap()
        .2;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(&format!(
            "aggregator_unavailable_apiservice{{name=\"{NAME}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("aggregator_unavailable_apiservice_total{name=\"v1alpha1.wardle.example.com\",reason=\"FailedDiscoveryCheck\"}"), "{metrics}");

    // Deleting the APIService sends the group back to the core.
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back = harness::wait_until(Duration::from_secs(2), || async {
        get_as(&gateway, &alice, flunders, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(back, "after delete the core should answer 404");
}

#[tokio::test]
async fn file_source_picks_up_edited_manifests_without_restart() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let manifests = tempfile::tempdir().unwrap();
    let config = pki.gateway_config(&[("wardle", &backend)], "");
    let gateway = pki
        .start_gateway_with_file_source(&core, &config, manifests.path(), &[])
        .await;
    let alice = pki.user("alice", &[]);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let wardle = pki.apiservice(GROUP, "v1alpha1", "wardle");

    // A manifest naming a Service the gateway cannot reach: routed, but unavailable.
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        wardle.clone().service("missing").yaml(),
    )
    .unwrap();
    let unavailable = harness::wait_until(Duration::from_secs(5), || async {
        let (status, body) = get_as(&gateway, &alice, flunders, &[]).await;
        status == StatusCode::SERVICE_UNAVAILABLE
            && body["message"].as_str().is_some_and(|m| m.contains(NAME))
    })
    .await;
    assert!(unavailable, "{}", gateway.process.logs());

    // Edit it to name the real Service: served by the remote without a restart.
    std::fs::write(manifests.path().join("wardle.yaml"), wardle.yaml()).unwrap();
    let served = harness::wait_until(Duration::from_secs(5), || async {
        let (status, body) = get_as(&gateway, &alice, flunders, &[]).await;
        status == StatusCode::OK && body["kind"] == "FlunderList"
    })
    .await;
    assert!(served, "{}", gateway.process.logs());

    // A broken edit keeps the last good set and says which file is wrong.
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nspec: [oops\n",
    )
    .unwrap();
    let reported = gateway
        .process
        .wait_for_line(
            |l| l.contains("wardle.yaml") && l.contains("ERROR"),
            Duration::from_secs(5),
        )
        .await;
    assert!(reported.is_some(), "{}", gateway.process.logs());
    assert_eq!(
        get_as(&gateway, &alice, flunders, &[]).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn before_the_first_sync_unclaimed_groups_get_503_with_retry_after() {
    // No core at all: the kube source can never sync.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gateway = Gateway::start(GatewayOptions::new(format!("http://127.0.0.1:{port}")))
        .await
        .unwrap();
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
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
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let port = backend.addr.port();
    // No static services map: the gateway must find the backend through the core's Service.
    let config = pki.gateway_config(&[], "logLevel: info\n");
    let gateway = pki.start_gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);

    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "api", "namespace": "wardle"},
        "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                 "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}]}
    });
    assert_eq!(
        create_on_core(&core, "/api/v1/namespaces/wardle/services", service).await,
        StatusCode::CREATED
    );
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
        create_endpoint_slice(&core, "api-unready", port, false).await,
        StatusCode::CREATED
    );
    wait_for_row(
        &kubectl,
        "False (MissingEndpoints)",
        Duration::from_secs(10),
    )
    .await;

    assert_eq!(
        create_endpoint_slice(&core, "api-abcde", port, true).await,
        StatusCode::CREATED
    );
    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    let (status, body) = get_as(
        &gateway,
        &alice,
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "FlunderList");
}

/// With `--apiservice-label-selector` one gateway serves only its own APIServices: an unlabeled
/// one stays with the core until it gets the label.
#[tokio::test]
async fn a_label_selector_limits_the_apiservices_a_gateway_serves() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let config = pki.gateway_config(&[("wardle", &backend)], "");
    let gateway = pki
        .start_gateway(
            &core,
            &config,
            &[
                "--apiservice-label-selector",
                "gateway.example.com/owner=edge",
            ],
        )
        .await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

    kubectl
        .apply_yaml(&pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    // Not ours yet: the core answers (it does not serve the group).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        get_as(&gateway, &alice, flunders, &[]).await.0,
        StatusCode::NOT_FOUND
    );

    kubectl
        .run_ok(&[
            "label",
            "apiservice",
            NAME,
            "gateway.example.com/owner=edge",
        ])
        .await;
    let served = harness::wait_until(Duration::from_secs(5), || async {
        let (status, body) = get_as(&gateway, &alice, flunders, &[]).await;
        status == StatusCode::OK && body["kind"] == "FlunderList"
    })
    .await;
    assert!(served, "{}", gateway.process.logs());
}

/// A backend that authorizes discovery like a kube API server (anonymous callers are refused)
/// still becomes Available and appears in discovery: the gateway's probe and discovery fetches
/// come as kube-aggregator's own user, on the proxy certificate.
#[tokio::test]
async fn probes_and_discovery_reach_an_authorizing_backend_as_the_aggregator() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    pki.set_backend_policy(
        &backend,
        "wardle",
        &json!({"rules": [discovery_for_authenticated()]}),
    )
    .await;
    let config = pki.gateway_config(&[("wardle", &backend)], "");
    let gateway = pki.start_gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &["dev"]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    kubectl
        .apply_yaml(&pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;

    wait_for_row(&kubectl, "True", Duration::from_secs(10)).await;
    // The merged discovery has the backend's resources: its /apis was readable too.
    let listed = harness::wait_until(Duration::from_secs(10), || async {
        let (status, doc) = get_as(&gateway, &alice, "/apis", &[("accept", AGGREGATED)]).await;
        status == StatusCode::OK && resources_of(&doc, GROUP).contains(&"flunders".to_owned())
    })
    .await;
    assert!(listed, "{}", gateway.process.logs());

    let requests = pki.backend_requests(&backend, "wardle").await;
    let identity = |r: &Value| {
        (
            header_values(r, "x-remote-user"),
            header_values(r, "x-remote-group"),
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
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki
        .start_backend(GROUP, "v1alpha1,v1beta1,v1,v2", &[])
        .await;
    let config = pki.gateway_config_with_services(
        &[
            ("wardle", "api", &backend),
            ("wardle", "impostor", &backend),
        ],
        "",
    );
    let gateway = pki.start_gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let other_ca = e2e::certs::TestCa::new("other-ca");
    let apiservice = |version: &str| pki.apiservice(GROUP, version, "wardle");
    for manifest in [
        apiservice("v1alpha1"),
        apiservice("v1beta1").ca_bundle(other_ca.cert_pem()),
        apiservice("v1").insecure_skip_tls_verify(),
        apiservice("v2").service("impostor"),
    ] {
        kubectl.apply_yaml(&manifest.yaml()).await;
    }
    let flunders = |version: &str| format!("/apis/{GROUP}/{version}/namespaces/default/flunders");

    for (version, row) in [
        ("v1alpha1", "True"),
        ("v1", "True"),
        ("v1beta1", "False (FailedDiscoveryCheck)"),
        ("v2", "False (FailedDiscoveryCheck)"),
    ] {
        let name = format!("{version}.{GROUP}");
        scenario::wait_for_apiservice_row(&kubectl, &name, row, Duration::from_secs(15)).await;
    }
    for version in ["v1alpha1", "v1"] {
        let (status, body) = get_as(&gateway, &alice, &flunders(version), &[]).await;
        assert_eq!(status, StatusCode::OK, "{version}: {body}");
        assert_eq!(body["kind"], "FlunderList", "{version}: {body}");
    }
    for (version, why) in [("v1beta1", "UnknownIssuer"), ("v2", "impostor.wardle.svc")] {
        let (status, body) = get_as(&gateway, &alice, &flunders(version), &[]).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{version}: {body}");
        assert_eq!(body["kind"], "Status", "{body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{version}.{GROUP}")) && message.contains(why),
            "{version}: the message should name the APIService and say why: {message}"
        );
    }
}

/// With authorization on, the discovery and OpenAPI documents the gateway serves from its cache
/// need the discovery permission, as on kube-apiserver: anonymous callers get 403, an
/// authenticated user gets the merged documents and kubectl works.
#[tokio::test]
async fn discovery_documents_need_the_discovery_permission() {
    let pki = Pki::new();
    let policy = json!({"rules": [
        discovery_for_authenticated(),
        {"group": "system:authenticated", "verbs": ["get", "list"], "apiGroups": ["*"], "resources": ["*"]},
    ]});
    let core = scenario::start_core_with_policy(&pki, &policy).await;
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let config = pki.gateway_config(&[("wardle", &backend)], "");
    let manifests = pki.dir().join("apiservices");
    std::fs::create_dir(&manifests).unwrap();
    pki.apiservice(GROUP, "v1alpha1", "wardle")
        .write_to(&manifests, "wardle.yaml");
    let gateway = pki
        .start_gateway_with_file_source(&core, &config, &manifests, &[])
        .await;
    let alice = pki.user("alice", &["dev"]);
    let openapi = "/openapi/v3/apis/wardle.example.com/v1alpha1";
    let served = harness::wait_until(Duration::from_secs(10), || async {
        let (status, doc) = get_as(&gateway, &alice, "/apis", &[("accept", AGGREGATED)]).await;
        status == StatusCode::OK
            && resources_of(&doc, GROUP).contains(&"flunders".to_owned())
            && get_as(&gateway, &alice, openapi, &[]).await.0 == StatusCode::OK
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
        let (status, _, body) = scenario::try_get(&gateway, None, path, &[("accept", accept)])
            .await
            .unwrap();
        let body = json_or_null(&body);
        assert_eq!(status, StatusCode::FORBIDDEN, "anonymous {path}: {body}");
        assert_eq!(body["reason"], "Forbidden", "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with(&format!(
                    "forbidden: User \"system:anonymous\" cannot get path \"{path}\""
                )),
            "{body}"
        );
        let (status, body) = get_as(&gateway, &alice, path, &[("accept", accept)]).await;
        assert_eq!(status, StatusCode::OK, "alice {path}: {body}");
    }

    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let resources = kubectl.run_ok(&["api-resources"]).await.stdout;
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("flunders") && l.contains("wardle.example.com/v1alpha1")),
        "{resources}"
    );
}
