//! A user registers an aggregated API server through the gateway and uses it: requests under its
//! group/version reach the remote server with the caller's identity (never a forged one), the
//! APIService's availability shows in `kubectl get apiservices`, a stopped backend gives a clear
//! 503, and deleting the APIService sends the group back to the core.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness::{
    self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, Kubectl, KubectlVersion,
};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";

/// Certificates for one scenario: the backend's serving CA, the gateway's proxy client identity,
/// and the CA that signs users' client certificates.
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
        let backend_ca = TestCa::new("wardle-ca");
        let backend_cert = backend_ca
            .issue_server(&["api.wardle.svc", "localhost", "127.0.0.1"])
            .write(dir.path(), "wardle-serving")
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

    fn user(&self, name: &str, groups: &[&str]) -> CertifiedPair {
        self.users_ca.issue_client(name, groups)
    }

    async fn start_backend(&self, extra: &[&str]) -> FixtureAggregated {
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
            GROUP.to_owned(),
            "--version".to_owned(),
            "v1alpha1".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        FixtureAggregated::start(&args)
            .await
            .expect("aggregated fixture starts")
    }

    /// Gateway config: the backend Service `wardle/api` lives at the fixture's address.
    fn config(&self, backend: &FixtureAggregated, extra_yaml: &str) -> PathBuf {
        let file = self
            .dir
            .path()
            .join(format!("gateway-{}.yaml", backend.addr.port()));
        let yaml = format!(
            "services:\n- namespace: wardle\n  name: api\n  port: 443\n  urls: [\"https://{}\"]\n{extra_yaml}",
            backend.addr
        );
        std::fs::write(&file, yaml).unwrap();
        file
    }

    async fn gateway(&self, core: &FixtureCore, config: &Path, extra: &[&str]) -> Gateway {
        let (cert, key) = &self.proxy_client;
        let mut args = vec![
            "--config".to_owned(),
            path(config),
            "--proxy-client-cert-file".to_owned(),
            path(cert),
            "--proxy-client-key-file".to_owned(),
            path(key),
            "--client-ca-file".to_owned(),
            path(&self.users_ca_file),
            "--apiservice-availability-interval".to_owned(),
            "1s".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Gateway::start(GatewayOptions::new(core.url()).args(args))
            .await
            .expect("gateway starts")
    }

    fn apiservice_yaml(&self, service_name: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.backend_ca.cert_pem());
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {NAME}\nspec:\n  group: {GROUP}\n  version: v1alpha1\n  \
             groupPriorityMinimum: 1000\n  versionPriority: 15\n  caBundle: {ca}\n  service:\n    namespace: wardle\n    name: {service_name}\n    port: 443\n"
        )
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

async fn get_as(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let client = harness::http2_client(&gateway.ca_pem().unwrap(), Some(user)).unwrap();
    let mut req = Request::get(format!("{}{path}", gateway.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, _, body) = harness::send(&client, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Polls `kubectl get apiservices` until the row for NAME contains `wanted`.
async fn wait_for_row(kubectl: &Kubectl, wanted: &str, timeout: Duration) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let out = kubectl.run(&["get", "apiservices"]).await;
        if out
            .stdout
            .lines()
            .any(|l| l.starts_with(NAME) && l.contains(wanted))
        {
            return out.stdout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {wanted:?} for {NAME} in:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_applied_apiservice_routes_to_its_backend_with_the_callers_identity() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let mut backend = pki.start_backend(&[]).await;
    let config = pki.config(&backend, "");
    let gateway = pki.gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &["dev"]);
    let kubectl = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_32,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();

    // Before registration the group is the core's (which does not have it).
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let (status, _) = get_as(&gateway, &alice, flunders, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    kubectl.apply_yaml(&pki.apiservice_yaml("api")).await;
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
    let _backend = pki.start_backend(&[]).await;
    let manifests = tempfile::tempdir().unwrap();
    let config = pki.config(&_backend, "");
    let dir = path(manifests.path());
    let gateway = pki
        .gateway(
            &core,
            &config,
            &["--apiservice-source", "file", "--apiservice-dir", &dir],
        )
        .await;
    let alice = pki.user("alice", &[]);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

    // A manifest naming a Service the gateway cannot reach: routed, but unavailable.
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        pki.apiservice_yaml("missing"),
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
    std::fs::write(
        manifests.path().join("wardle.yaml"),
        pki.apiservice_yaml("api"),
    )
    .unwrap();
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

/// POSTs a JSON object straight to the core fixture (what a cluster's controllers would create).
async fn create_on_core(core: &FixtureCore, path: &str, object: Value) -> StatusCode {
    let client = harness::http1_client(TestCa::new("unused").cert_pem(), None).unwrap();
    let req = Request::post(format!("{}{path}", core.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .unwrap();
    harness::send(&client, req).await.unwrap().0
}

#[tokio::test]
async fn services_and_endpointslices_on_the_core_resolve_the_backend() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(&[]).await;
    let port = backend.addr.port();
    // No static services map: the gateway must find the backend through the core's Service.
    let config = pki.dir.path().join("plain.yaml");
    std::fs::write(&config, "logLevel: info\n").unwrap();
    let gateway = pki.gateway(&core, &config, &[]).await;
    let alice = pki.user("alice", &[]);
    let kubectl = Kubectl::new(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::V1_32,
    )
    .unwrap()
    .with_client_pair(&alice)
    .unwrap();

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
    let yaml = pki
        .apiservice_yaml("api")
        .replace("port: 443", &format!("port: {port}"));
    kubectl.apply_yaml(&yaml).await;

    // The Service exists but has no EndpointSlices yet (kube-aggregator's EndpointsNotFound).
    wait_for_row(
        &kubectl,
        "False (EndpointsNotFound)",
        Duration::from_secs(10),
    )
    .await;
    // A slice whose only endpoint is not ready: MissingEndpoints.
    let unready = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "api-unready", "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": false}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    assert_eq!(
        create_on_core(
            &core,
            "/apis/discovery.k8s.io/v1/namespaces/wardle/endpointslices",
            unready
        )
        .await,
        StatusCode::CREATED
    );
    wait_for_row(
        &kubectl,
        "False (MissingEndpoints)",
        Duration::from_secs(10),
    )
    .await;

    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "api-abcde", "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    assert_eq!(
        create_on_core(
            &core,
            "/apis/discovery.k8s.io/v1/namespaces/wardle/endpointslices",
            slice
        )
        .await,
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
