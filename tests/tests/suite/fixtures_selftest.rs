//! Self-test of the fixture servers: start the real `fixture-core` and `fixture-aggregated`
//! binaries and check what users and the gateway will rely on, with raw HTTP/1.1 and HTTP/2
//! clients and with the real kubectl.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::timeout;

const AGG_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// A running fixture process; killed when dropped.
struct Fixture {
    _child: Child,
    addr: SocketAddr,
}

async fn start(bin: &str, args: &[&str]) -> Fixture {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn fixture");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    timeout(
        Duration::from_secs(10),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("fixture did not announce its address in time")
    .expect("read stdout");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("address");
    Fixture {
        _child: child,
        addr,
    }
}

async fn start_core(extra: &[&str]) -> Fixture {
    start(env!("CARGO_BIN_EXE_fixture-core"), extra).await
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP clients

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    version: http::Version,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn send_on<I>(io: I, h2: bool, req: Request<Full<Bytes>>) -> Reply
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let resp = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        sender.send_request(req).await.expect("h2 request")
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        sender.send_request(req).await.expect("h1 request")
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        version: parts.version,
        body,
    }
}

fn request(
    method: Method,
    addr: SocketAddr,
    h2: bool,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Request<Full<Bytes>> {
    // h2 needs :scheme and :authority; HTTP/1.1 sends the origin form and Host.
    let uri = if h2 {
        format!("http://{addr}{path}")
    } else {
        path.to_string()
    };
    let mut b = Request::builder().method(method).uri(uri);
    if !h2 {
        b = b.header(header::HOST, addr.to_string());
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body.to_string())))
        .expect("request")
}

async fn call(
    addr: SocketAddr,
    h2: bool,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    send_on(tcp, h2, request(method, addr, h2, path, headers, body)).await
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    call(addr, false, Method::GET, path, &[], "").await
}

async fn post_json(addr: SocketAddr, path: &str, body: Value) -> Reply {
    call(
        addr,
        false,
        Method::POST,
        path,
        &[("content-type", "application/json")],
        &body.to_string(),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// kubectl

fn kubectl_binary() -> PathBuf {
    let path = std::env::var_os("PATH").expect("PATH");
    let dispatcher = std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .expect("kubectl on PATH");
    let real = std::fs::canonicalize(dispatcher).expect("resolve kubectl");
    real.parent().expect("kubectl dir").join("kubectl.1.32")
}

/// kubectl with its own HOME, cache and kubeconfig, so no discovery cache leaks between tests.
struct Kubectl {
    home: tempfile::TempDir,
}

struct KubectlTls<'a> {
    ca: &'a Path,
    cert: &'a Path,
    key: &'a Path,
}

impl Kubectl {
    fn new(server: &str, tls: Option<KubectlTls<'_>>) -> Self {
        let home = tempfile::tempdir().expect("tempdir");
        let (cluster_tls, user) = match tls {
            Some(t) => (
                format!(", \"certificate-authority\": {:?}", t.ca),
                format!(
                    "{{\"client-certificate\": {:?}, \"client-key\": {:?}}}",
                    t.cert, t.key
                ),
            ),
            None => (String::new(), "{}".to_string()),
        };
        let kubeconfig = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"Config\",
              \"clusters\": [{{\"name\": \"c\", \"cluster\": {{\"server\": \"{server}\"{cluster_tls}}}}}],
              \"users\": [{{\"name\": \"u\", \"user\": {user}}}],
              \"contexts\": [{{\"name\": \"c\", \"context\": {{\"cluster\": \"c\", \"user\": \"u\"}}}}],
              \"current-context\": \"c\"}}"
        );
        std::fs::write(home.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
        Self { home }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(kubectl_binary());
        cmd.env("HOME", self.home.path())
            .env("KUBECONFIG", self.home.path().join("kubeconfig"))
            .arg(format!(
                "--cache-dir={}",
                self.home.path().join("cache").display()
            ))
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = timeout(Duration::from_secs(20), self.command(args).output())
            .await
            .expect("kubectl timed out")
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{stdout}\n{stderr}");
        stdout
    }

    fn file(&self, name: &str, content: &str) -> String {
        let path = self.home.path().join(name);
        std::fs::write(&path, content).expect("write file");
        path.display().to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates (a local helper; the shared one lives in the crate)

struct TestCerts {
    dir: tempfile::TempDir,
    client_cert_der: Vec<u8>,
    client_key_der: Vec<u8>,
    ca_der: Vec<u8>,
}

impl TestCerts {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn make_certs(client_cn: &str) -> TestCerts {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose, SanType,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fixture-selftest-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");

    let mut server = CertificateParams::new(Vec::<String>::new()).expect("server params");
    server
        .distinguished_name
        .push(DnType::CommonName, "fixture-aggregated");
    server.subject_alt_names = vec![
        SanType::DnsName("localhost".try_into().expect("dns name")),
        SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])),
    ];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().expect("key");
    let server_cert = server.signed_by(&server_key, &ca).expect("server cert");

    let mut client = CertificateParams::new(Vec::<String>::new()).expect("client params");
    client
        .distinguished_name
        .push(DnType::CommonName, client_cn);
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().expect("key");
    let client_cert = client.signed_by(&client_key, &ca).expect("client cert");

    for (name, pem) in [
        ("ca.crt", ca.pem()),
        ("server.crt", server_cert.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.crt", client_cert.pem()),
        ("client.key", client_key.serialize_pem()),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write pem");
    }
    TestCerts {
        client_cert_der: client_cert.der().to_vec(),
        client_key_der: client_key.serialize_der(),
        ca_der: ca.der().to_vec(),
        dir,
    }
}

async fn tls_connect(
    addr: SocketAddr,
    certs: &TestCerts,
    with_client_cert: bool,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(certs.ca_der.clone()))
        .expect("root");
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = if with_client_cert {
        builder
            .with_client_auth_cert(
                vec![CertificateDer::from(certs.client_cert_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs.client_key_der.clone())),
            )
            .expect("client auth")
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    connector
        .connect(ServerName::try_from("localhost").expect("server name"), tcp)
        .await
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread")]
async fn core_discovery_negotiation_and_caching() {
    let core = start_core(&[]).await;
    let addr = core.addr;

    let first = call(
        addr,
        false,
        Method::GET,
        "/apis?timeout=32s",
        &[("accept", AGG_ACCEPT)],
        "",
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.header("content-type"),
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(first.header("vary"), "Accept");
    assert_eq!(first.header("cache-control"), "public");
    let etag = first.header("etag").to_string();
    assert!(etag.starts_with('"') && etag.len() == 130, "etag {etag}");
    let doc = first.json();
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    assert_eq!(
        doc["items"][0]["metadata"]["name"],
        "apiregistration.k8s.io"
    );
    let apiservices = &doc["items"][0]["versions"][0]["resources"][0];
    assert_eq!(
        apiservices["responseKind"],
        json!({"group": "", "version": "", "kind": "APIService"})
    );
    assert_eq!(apiservices["subresources"][0]["subresource"], "status");

    let again = call(
        addr,
        true,
        Method::GET,
        "/apis",
        &[("accept", AGG_ACCEPT), ("if-none-match", &etag)],
        "",
    )
    .await;
    assert_eq!(
        again.version,
        http::Version::HTTP_2,
        "h2c by prior knowledge"
    );
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());

    // kubectl 1.29 asks for v2beta1 only; parameters may come in any order.
    let beta = call(
        addr,
        true,
        Method::GET,
        "/api/",
        &[(
            "accept",
            "application/json;as=APIGroupDiscoveryList;v=v2beta1;g=apidiscovery.k8s.io",
        )],
        "",
    )
    .await;
    assert_eq!(
        beta.header("content-type"),
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
    );
    assert_eq!(beta.json()["apiVersion"], "apidiscovery.k8s.io/v2beta1");

    let legacy = call(
        addr,
        false,
        Method::GET,
        "/apis/",
        &[("accept", "application/json, */*")],
        "",
    )
    .await;
    assert_eq!(legacy.json()["kind"], "APIGroupList");
    assert_eq!(get(addr, "/api").await.json()["kind"], "APIVersions");
    assert_eq!(
        get(addr, "/apis/apps").await.json()["preferredVersion"]["version"],
        "v1"
    );
    let v1 = get(addr, "/api/v1?timeout=32s").await.json();
    let names: Vec<&str> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        names.contains(&"pods/exec") && names.contains(&"configmaps"),
        "{names:?}"
    );
    assert_eq!(
        get(addr, "/apis/nope.example.com/v1").await.status,
        StatusCode::NOT_FOUND
    );

    let version = get(addr, "/version?timeout=5s").await.json();
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str()),
        (Some("1"), Some("32"))
    );
    assert_eq!(get(addr, "/readyz").await.body, "ok");

    // OpenAPI: hash URLs are immutable; a stale hash redirects to the current one.
    let root = get(addr, "/openapi/v3").await.json();
    let url = root["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .expect("apps/v1 url")
        .to_string();
    assert!(root["paths"]["api/v1"].is_object());
    let gv = call(
        addr,
        false,
        Method::GET,
        &url,
        &[("accept", "application/json")],
        "",
    )
    .await;
    assert_eq!(gv.header("cache-control"), "public, immutable");
    assert_eq!(
        gv.header("etag"),
        format!("\"{}\"", url.rsplit('=').next().unwrap())
    );
    let patch =
        &gv.json()["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "apps", "version": "v1", "kind": "Deployment"})
    );
    let stale = get(addr, "/openapi/v3/apis/apps/v1?hash=ABC").await;
    assert_eq!(stale.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(stale.header("location"), url);
    assert_eq!(
        get(addr, "/openapi/v3/apis/nope/v1").await.json()["reason"],
        "NotFound"
    );
    // OpenAPI v2: the same types as one Swagger 2.0 spec, for the gateway's merged /openapi/v2.
    let v2 = get(addr, "/openapi/v2").await.json();
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"]["com.example.fixture.apps.v1.Deployment"].is_object());
    assert_eq!(
        v2["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["get"]["responses"]
            ["200"]["schema"]["$ref"],
        "#/definitions/com.example.fixture.apps.v1.Deployment"
    );

    let off = start_core(&["--no-aggregated-discovery"]).await;
    let plain = call(
        off.addr,
        false,
        Method::GET,
        "/apis",
        &[("accept", AGG_ACCEPT)],
        "",
    )
    .await;
    assert_eq!(plain.json()["kind"], "APIGroupList");
}

#[tokio::test(flavor = "multi_thread")]
async fn core_kubectl_session() {
    let core = start_core(&[]).await;
    let kubectl = Kubectl::new(&format!("http://{}", core.addr), None);

    let resources = kubectl.ok(&["api-resources"]).await;
    for name in ["configmaps", "deployments", "apiservices", "namespaces"] {
        assert!(
            resources.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{resources}"
        );
    }
    let raw: Value =
        serde_json::from_str(&kubectl.ok(&["get", "--raw", "/apis"]).await).expect("json");
    assert_eq!(raw["kind"], "APIGroupList");

    let manifest = kubectl.file(
        "apiservices.yaml",
        "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.local.example.com}
spec: {group: local.example.com, version: v1, groupPriorityMinimum: 1000, versionPriority: 15}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.wardle.example.com}
spec:
  group: wardle.example.com
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {namespace: wardle, name: api}
",
    );
    let applied = kubectl.ok(&["apply", "-f", &manifest]).await;
    assert!(
        applied.contains("apiservice.apiregistration.k8s.io/v1.local.example.com created"),
        "{applied}"
    );
    let table = kubectl.ok(&["get", "apiservices"]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "SERVICE", "AVAILABLE", "AGE"], "{table}");
    assert_eq!(
        &rows[1][..3],
        ["v1.local.example.com", "Local", "True"],
        "{table}"
    );
    assert_eq!(
        &rows[2][..3],
        ["v1alpha1.wardle.example.com", "wardle/api", "Unknown"],
        "{table}"
    );
    assert!(kubectl
        .ok(&["apply", "-f", &manifest])
        .await
        .contains("unchanged"));
    assert!(kubectl
        .ok(&["apply", "--server-side", "-f", &manifest])
        .await
        .contains("serverside-applied"));

    let bad = kubectl.file(
        "bad.yaml",
        "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: bad}
spec: {group: x.example.com, version: v1, groupPriorityMinimum: 1000, versionPriority: 15}
",
    );
    let (ok, _, stderr) = kubectl.run(&["apply", "-f", &bad]).await;
    assert!(
        !ok && stderr.contains("must be `spec.version+\".\"+spec.group`: \"v1.x.example.com\""),
        "{stderr}"
    );

    // Typed create commands send protobuf.
    kubectl
        .ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=color=blue",
        ])
        .await;
    assert_eq!(
        kubectl
            .ok(&["get", "cm", "settings", "-o", "jsonpath={.data.color}"])
            .await,
        "blue"
    );
    kubectl.ok(&["delete", "configmap", "settings"]).await;
    let (ok, _, stderr) = kubectl.run(&["get", "configmap", "settings"]).await;
    assert!(
        !ok && stderr.contains("configmaps \"settings\" not found"),
        "{stderr}"
    );

    kubectl
        .ok(&[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
        ])
        .await;
    assert_eq!(
        kubectl
            .ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"])
            .await,
        "2"
    );

    let explain = kubectl.ok(&["explain", "deployments.spec"]).await;
    assert!(
        explain.contains("KIND:       Deployment") && explain.contains("replicas"),
        "{explain}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn core_watch_sees_later_events() {
    let core = start_core(&[]).await;
    let addr = core.addr;
    let kubectl = Kubectl::new(&format!("http://{addr}"), None);
    let mut watcher = kubectl
        .command(&["get", "configmaps", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let mut lines = BufReader::new(watcher.stdout.take().expect("stdout")).lines();

    // Create only once the watch request has arrived, so the event must come through the watch.
    timeout(Duration::from_secs(15), async {
        loop {
            let seen = get(addr, "/fixture/requests").await.json();
            if seen
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["path"].as_str().unwrap_or("").contains("watch=true"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("kubectl never started watching");
    let created = post_json(
        addr,
        "/api/v1/namespaces/default/configmaps",
        json!({"metadata": {"name": "late"}, "data": {"k": "v"}}),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let line = timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line.starts_with("late") {
                return line;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("no event for the configmap");
    assert!(line.starts_with("late "), "{line}");

    // The list → watch-from-resourceVersion pattern of kube-rs, over HTTP/2.
    let list = get(addr, "/api/v1/namespaces/default/configmaps")
        .await
        .json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2");
    tokio::spawn(conn);
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=10");
    let resp = sender
        .send_request(request(Method::GET, addr, true, &path, &[], ""))
        .await
        .expect("watch");
    let mut body = resp.into_body();
    let deleted = call(
        addr,
        false,
        Method::DELETE,
        "/api/v1/namespaces/default/configmaps/late",
        &[],
        "",
    )
    .await;
    assert_eq!(deleted.json()["metadata"]["name"], "late");
    let event: Value = timeout(Duration::from_secs(5), async {
        let mut buf = Vec::new();
        loop {
            let frame = body.frame().await.expect("stream open").expect("frame");
            buf.extend_from_slice(frame.data_ref().map(|d| d.as_ref()).unwrap_or_default());
            for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let v: Value = match serde_json::from_slice(line) {
                    Ok(v) => v,
                    Err(_) => continue,
                };
                if v["type"] != "BOOKMARK" {
                    return v;
                }
            }
        }
    })
    .await
    .expect("no watch event");
    assert_eq!(event["type"], "DELETED");
    assert_eq!(event["object"]["metadata"]["name"], "late");

    // History gone → one ERROR event with 410 Expired, as kube-apiserver answers.
    get(addr, "/fixture/requests").await;
    call(addr, false, Method::POST, "/fixture/compact", &[], "").await;
    let expired = get(
        addr,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
    )
    .await;
    let event: Value = serde_json::from_slice(expired.body.trim_ascii()).expect("event");
    assert_eq!(
        (event["type"].as_str(), event["object"]["code"].as_i64()),
        (Some("ERROR"), Some(410))
    );
}

async fn raw_upgrade(addr: SocketAddr, path: &str, upgrade_headers: &str) -> (String, TcpStream) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\n{upgrade_headers}\r\n"
    );
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.expect("read head");
        head.push(byte[0]);
    }
    (String::from_utf8_lossy(&head).into_owned(), tcp)
}

#[tokio::test(flavor = "multi_thread")]
async fn core_upgrade_echoes_bytes() {
    let core = start_core(&[]).await;
    let addr = core.addr;
    let (head, mut tunnel) = raw_upgrade(
        addr,
        "/api/v1/namespaces/default/pods/web/exec?command=sh",
        "Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: spdy/3.1"),
        "{head}"
    );
    tunnel
        .write_all(b"ping through the tunnel")
        .await
        .expect("write");
    let mut echoed = [0u8; 23];
    timeout(Duration::from_secs(5), tunnel.read_exact(&mut echoed))
        .await
        .expect("echo")
        .expect("read");
    assert_eq!(&echoed, b"ping through the tunnel");

    let (head, _) = raw_upgrade(
        addr,
        "/api/v1/namespaces/default/pods/web/portforward",
        "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
    )
    .await;
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");

    let plain = call(
        addr,
        false,
        Method::POST,
        "/api/v1/namespaces/default/pods/web/exec",
        &[],
        "",
    )
    .await;
    assert_eq!(plain.status, StatusCode::BAD_REQUEST);
    assert_eq!(plain.json()["message"], "Upgrade request required");
}

#[tokio::test(flavor = "multi_thread")]
async fn core_reviews_and_test_endpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        json!({
            "tokens": {"alice-token": {"username": "alice", "uid": "a1", "groups": ["devs"], "extra": {"scopes": ["read"]}}},
            "rules": [{"group": "devs", "verbs": ["get", "list"], "apiGroups": ["wardle.example.com"], "resources": ["flunders"]}]
        })
        .to_string(),
    )
    .expect("policy");
    let core = start_core(&["--policy", policy.to_str().unwrap()]).await;
    let addr = core.addr;

    let tr = |token: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let known = post_json(
        addr,
        "/apis/authentication.k8s.io/v1/tokenreviews",
        tr("alice-token"),
    )
    .await
    .json();
    assert_eq!(known["status"]["authenticated"], true);
    assert_eq!(known["status"]["user"]["username"], "alice");
    assert_eq!(known["status"]["user"]["extra"]["scopes"], json!(["read"]));
    let unknown = post_json(
        addr,
        "/apis/authentication.k8s.io/v1/tokenreviews",
        tr("nope"),
    )
    .await
    .json();
    assert_eq!(unknown["status"]["authenticated"], false);

    let sar = |verb: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": "alice", "groups": ["devs"],
            "resourceAttributes": {"verb": verb, "group": "wardle.example.com", "version": "v1alpha1", "resource": "flunders", "namespace": "default"}}})
    };
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    assert_eq!(
        post_json(addr, path, sar("list")).await.json()["status"]["allowed"],
        true
    );
    assert_eq!(
        post_json(addr, path, sar("delete")).await.json()["status"]["allowed"],
        false
    );

    let seen = get(addr, "/fixture/requests").await.json();
    let reviews = seen
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("reviews"))
        .count();
    assert_eq!(reviews, 4);

    let echo = call(
        addr,
        true,
        Method::PUT,
        "/fixture/echo?x=1",
        &[("x-test", "a"), ("x-test", "b")],
        "hi",
    )
    .await
    .json();
    assert_eq!(echo["query"], "x=1");
    assert_eq!(echo["body_base64"], "aGk=");
    let repeated: Vec<&Value> = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "x-test")
        .collect();
    assert_eq!(repeated.len(), 2);
    assert_eq!(
        get(addr, "/fixture/bytes?n=100000").await.body.len(),
        100_000
    );
    let stream = get(addr, "/fixture/stream?events=3&interval_ms=10").await;
    assert_eq!(
        stream
            .body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        3
    );
    let proto = call(
        addr,
        false,
        Method::POST,
        "/fixture/protobuf",
        &[],
        "k8s\0abc",
    )
    .await;
    assert_eq!(
        proto.header("content-type"),
        "application/vnd.kubernetes.protobuf"
    );
    assert_eq!(proto.body, "k8s\0abc");
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregated_identity_over_tls() {
    let certs = make_certs("front-proxy-client");
    let path = |n: &str| certs.path(n).display().to_string();
    let agg = start(
        env!("CARGO_BIN_EXE_fixture-aggregated"),
        &[
            "--tls-cert-file",
            &path("server.crt"),
            "--tls-private-key-file",
            &path("server.key"),
            "--requestheader-client-ca-file",
            &path("ca.crt"),
            "--requestheader-allowed-names",
            "front-proxy-client",
            "--version",
            "v1beta1,v1alpha1",
        ],
    )
    .await;
    let addr = agg.addr;

    let tls = tls_connect(addr, &certs, true).await.expect("tls");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let identity = send_on(
        tls,
        true,
        request(
            Method::GET,
            addr,
            true,
            "/apis/wardle.example.com/v1alpha1/identity",
            &[
                ("x-remote-user", "alice"),
                ("x-remote-group", "devs"),
                ("x-remote-group", "system:authenticated"),
                ("x-remote-extra-scopes", "read"),
            ],
            "",
        ),
    )
    .await
    .json();
    assert_eq!(identity["user"], "alice");
    assert_eq!(identity["groups"], json!(["devs", "system:authenticated"]));
    assert_eq!(identity["extra"], json!({"scopes": ["read"]}));
    assert_eq!(identity["tlsClientCN"], "front-proxy-client");

    let tls = tls_connect(addr, &certs, true).await.expect("tls");
    let created = send_on(
        tls,
        false,
        request(
            Method::POST,
            addr,
            false,
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
            &[("x-remote-user", "bob"), ("content-type", "application/json")],
            r#"{"apiVersion":"wardle.example.com/v1alpha1","kind":"Flunder","metadata":{"generateName":"fl-"}}"#,
        ),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let flunder = created.json();
    assert_eq!(
        flunder["metadata"]["annotations"]["fixture.example.com/created-by"],
        "bob"
    );
    assert!(flunder["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("fl-"));

    // Without a front-proxy certificate nothing but health and test endpoints is served.
    let anonymous = tls_connect(addr, &certs, false).await.expect("tls");
    let denied = send_on(
        anonymous,
        false,
        request(Method::GET, addr, false, "/apis", &[], ""),
    )
    .await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
    assert_eq!(denied.json()["reason"], "Unauthorized");
    let anonymous = tls_connect(addr, &certs, false).await.expect("tls");
    let log = send_on(
        anonymous,
        false,
        request(Method::GET, addr, false, "/fixture/requests", &[], ""),
    )
    .await;
    assert!(log
        .json()
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["clientCN"] == "front-proxy-client"));

    let kubectl = Kubectl::new(
        &format!("https://{addr}"),
        Some(KubectlTls {
            ca: &certs.path("ca.crt"),
            cert: &certs.path("client.crt"),
            key: &certs.path("client.key"),
        }),
    );
    let (ok, resources, stderr) = kubectl.run(&["api-resources"]).await;
    assert!(ok, "{stderr}");
    assert!(
        resources.contains("flunders") && resources.contains("wardle.example.com/v1beta1"),
        "{resources}"
    );
    let listed = kubectl.ok(&["get", "flunders", "-A", "-o", "name"]).await;
    assert!(
        listed.starts_with("flunder.wardle.example.com/fl-"),
        "{listed}"
    );
    let (_, _, stderr) = kubectl.run(&["get", "--raw", "/api"]).await;
    assert!(
        stderr.contains("NotFound") || stderr.contains("not find"),
        "{stderr}"
    );
}
