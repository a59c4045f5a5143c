//! Setup shared by the end-to-end scenarios with aggregated API servers: the certificates of one
//! scenario ([`Pki`]), an aggregated backend and the gateway started with them, APIService
//! manifests ([`ApiService`]), requests as a user, and the core fixture's recorded requests.
//!
//! A scenario reads like this:
//!
//! ```no_run
//! # async fn session() {
//! use e2e::harness::{FixtureCore, KubectlVersion};
//! use e2e::scenario::{self, Pki};
//!
//! let pki = Pki::new();
//! let core = FixtureCore::start(&[]).await.unwrap();
//! let backend = pki.start_backend("wardle.example.com", "v1alpha1", &[]).await;
//! let config = pki.gateway_config(&[("wardle", &backend)], "");
//! let gateway = pki.start_gateway(&core, &config, &[]).await;
//! let alice = pki.user("alice", &["dev"]);
//! let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
//! kubectl
//!     .apply_yaml(&pki.apiservice("wardle.example.com", "v1alpha1", "wardle").yaml())
//!     .await;
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::certs::{CertifiedPair, TestCa};
use crate::harness::{
    self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, HarnessError, HttpClient,
    Kubectl, KubectlVersion,
};

/// The group served by the usual aggregated backend (the fixture's default).
pub const WARDLE_GROUP: &str = "wardle.example.com";

/// A path as a command-line argument.
pub fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

// ---- certificates -------------------------------------------------------------------------------

/// Certificates for one scenario, written into its own scratch directory: the backends' serving
/// CA and certificate, the gateway's proxy client identity (CN `aggregator`, from the front-proxy
/// CA the backends trust), and the CA that signs users' client certificates.
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
    /// Signs the backends' serving certificate; the APIServices' `caBundle`.
    pub backend_ca: TestCa,
    /// The backends' `--tls-cert-file` / `--tls-private-key-file`.
    pub backend_cert: (PathBuf, PathBuf),
    /// The front-proxy CA: backends' `--requestheader-client-ca-file`.
    pub proxy_ca: TestCa,
    pub proxy_ca_file: PathBuf,
    /// The gateway's `--proxy-client-cert-file` / `--proxy-client-key-file`.
    pub proxy_client: (PathBuf, PathBuf),
    /// Signs users' client certificates: the gateway's `--client-ca-file`.
    pub users_ca: TestCa,
    pub users_ca_file: PathBuf,
    configs: AtomicUsize,
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}

impl Pki {
    /// Backends serve as Service `wardle/api` (`api.wardle.svc`).
    pub fn new() -> Pki {
        Pki::for_services(&["wardle"])
    }

    /// Backends serve as Service `api` in each of `namespaces`. Their certificate names only
    /// `api.<namespace>.svc`, the server name kube-aggregator verifies, and no address: a gateway
    /// that verified the address it dialled (always 127.0.0.1 here) would fail.
    pub fn for_services(namespaces: &[&str]) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let backend_ca = TestCa::new("backend-ca");
        let sans: Vec<String> = namespaces
            .iter()
            .map(|ns| format!("api.{ns}.svc"))
            .collect();
        let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
        let backend_cert = backend_ca
            .issue_server(&sans)
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
            proxy_ca,
            proxy_ca_file,
            proxy_client,
            users_ca,
            users_ca_file,
            configs: AtomicUsize::new(0),
        }
    }

    /// The scenario's scratch directory (removed when the `Pki` is dropped).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to `name` (parent directories created) in the scratch directory.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let file = self.dir.path().join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, contents).unwrap();
        file
    }

    /// A client certificate for user `name` in `groups`, from the users CA.
    pub fn user(&self, name: &str, groups: &[&str]) -> CertifiedPair {
        self.users_ca.issue_client(name, groups)
    }

    /// Starts `fixture-aggregated` serving `group` at `versions` (comma list, first preferred)
    /// with the backend serving certificate, trusting identity headers only from the gateway's
    /// proxy certificate (CN `aggregator`; `extra` may add `--requestheader-allowed-names`).
    pub async fn start_backend(
        &self,
        group: &str,
        versions: &str,
        extra: &[&str],
    ) -> FixtureAggregated {
        let (cert, key) = &self.backend_cert;
        let (cert, key, proxy_ca) = (path_arg(cert), path_arg(key), path_arg(&self.proxy_ca_file));
        let mut args = vec![
            "--tls-cert-file",
            &cert,
            "--tls-private-key-file",
            &key,
            "--requestheader-client-ca-file",
            &proxy_ca,
            "--requestheader-allowed-names",
            "aggregator",
            "--group",
            group,
            "--version",
            versions,
        ];
        args.extend(extra);
        FixtureAggregated::start(&args)
            .await
            .expect("aggregated fixture starts")
    }

    /// Writes a gateway config whose static `services:` map puts Service `api` of each namespace
    /// at its backend's address, followed by `extra_yaml`. Without services it is `extra_yaml`
    /// alone.
    pub fn gateway_config(
        &self,
        services: &[(&str, &FixtureAggregated)],
        extra_yaml: &str,
    ) -> PathBuf {
        let services: Vec<(&str, &str, &FixtureAggregated)> = services
            .iter()
            .map(|(namespace, backend)| (*namespace, "api", *backend))
            .collect();
        self.gateway_config_with_services(&services, extra_yaml)
    }

    /// [`Pki::gateway_config`] with Service names of its own: `(namespace, name, backend)`.
    pub fn gateway_config_with_services(
        &self,
        services: &[(&str, &str, &FixtureAggregated)],
        extra_yaml: &str,
    ) -> PathBuf {
        let mut yaml = String::new();
        if !services.is_empty() {
            yaml.push_str("services:\n");
        }
        for (namespace, name, backend) in services {
            yaml.push_str(&format!(
                "- namespace: {namespace}\n  name: {name}\n  port: 443\n  urls: [\"https://{}\"]\n",
                backend.addr
            ));
        }
        yaml.push_str(extra_yaml);
        let n = self.configs.fetch_add(1, Ordering::Relaxed);
        self.write(&format!("gateway-{n}.yaml"), &yaml)
    }

    /// Starts the gateway in front of `core` with `config`, the proxy client certificate, the
    /// users CA as `--client-ca-file`, APIService availability probed every second, and `extra`.
    pub async fn start_gateway(
        &self,
        core: &FixtureCore,
        config: &Path,
        extra: &[&str],
    ) -> Gateway {
        let (cert, key) = &self.proxy_client;
        let mut args = vec![
            "--config".to_owned(),
            path_arg(config),
            "--proxy-client-cert-file".to_owned(),
            path_arg(cert),
            "--proxy-client-key-file".to_owned(),
            path_arg(key),
            "--client-ca-file".to_owned(),
            path_arg(&self.users_ca_file),
            "--apiservice-availability-interval".to_owned(),
            "1s".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let gateway = Gateway::start(GatewayOptions::new(core.url()).args(args))
            .await
            .expect("gateway starts");
        // A session starts once the gateway is ready: before its APIService source has synced,
        // unclaimed `/apis/<group>` paths answer 503 (by design) rather than the core's 404.
        let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
        let readyz = format!("{}/readyz", gateway.url());
        let ready = harness::wait_until(std::time::Duration::from_secs(10), || async {
            harness::get(&client, &readyz)
                .await
                .is_ok_and(|(status, _, _)| status == http::StatusCode::OK)
        })
        .await;
        assert!(
            ready,
            "gateway never became ready:\n{}",
            gateway.process.logs()
        );
        gateway
    }

    /// [`Pki::start_gateway`] reading APIServices from the manifests in `manifests`
    /// (`--apiservice-source file`).
    pub async fn start_gateway_with_file_source(
        &self,
        core: &FixtureCore,
        config: &Path,
        manifests: &Path,
        extra: &[&str],
    ) -> Gateway {
        let dir = path_arg(manifests);
        let source = ["--apiservice-source", "file", "--apiservice-dir", &dir];
        self.start_gateway(core, config, &[&source[..], extra].concat())
            .await
    }

    /// A client for `backend` directly (its `/fixture/...` endpoints), verifying its certificate
    /// as the gateway does: against the backend CA, for the name `api.<namespace>.svc`.
    pub fn backend_client(&self, namespace: &str) -> HttpClient {
        let config = harness::tls_client_config(self.backend_ca.cert_pem(), None, &[]).unwrap();
        let name = ServerName::try_from(format!("api.{namespace}.svc")).unwrap();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(name))
            .enable_http1()
            .wrap_connector(http);
        Client::builder(TokioExecutor::new()).build(connector)
    }

    /// The requests `backend` (Service `<namespace>/api`) recorded, oldest first.
    pub async fn backend_requests(
        &self,
        backend: &FixtureAggregated,
        namespace: &str,
    ) -> Vec<Value> {
        let url = format!("{}/fixture/requests", backend.url());
        let (status, _, body) = harness::get(&self.backend_client(namespace), &url)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{url}");
        serde_json::from_slice(&body).unwrap()
    }

    /// Replaces the policy `backend` (Service `<namespace>/api`) authorizes discovery with.
    pub async fn set_backend_policy(
        &self,
        backend: &FixtureAggregated,
        namespace: &str,
        policy: &Value,
    ) {
        let req = Request::put(format!("{}/fixture/policy", backend.url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(policy.to_string())))
            .unwrap();
        let (status, _, body) = harness::send(&self.backend_client(namespace), req)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }

    /// An APIService for `version.group` backed by Service `namespace/api` on port 443, trusting
    /// the backend CA.
    pub fn apiservice(&self, group: &str, version: &str, namespace: &str) -> ApiService {
        ApiService {
            group: group.to_owned(),
            version: version.to_owned(),
            namespace: namespace.to_owned(),
            service: "api".to_owned(),
            port: 443,
            group_priority_minimum: 1000,
            version_priority: 15,
            ca_bundle: self.backend_ca.cert_pem().to_owned(),
            insecure_skip_tls_verify: false,
        }
    }
}

// ---- APIService manifests -----------------------------------------------------------------------

/// An `apiregistration.k8s.io/v1` APIService, see [`Pki::apiservice`].
#[derive(Clone, Debug)]
pub struct ApiService {
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    pub group_priority_minimum: u32,
    pub version_priority: u32,
    /// PEM; base64-encoded into `caBundle`.
    pub ca_bundle: String,
    /// `insecureSkipTLSVerify: true`, and no `caBundle` (validation allows only one of them).
    pub insecure_skip_tls_verify: bool,
}

impl ApiService {
    /// `<version>.<group>`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }

    /// Backed by Service `name` instead of `api`.
    pub fn service(mut self, name: &str) -> ApiService {
        self.service = name.to_owned();
        self
    }

    pub fn port(mut self, port: u16) -> ApiService {
        self.port = port;
        self
    }

    /// Trusting `pem` instead of the backend CA.
    pub fn ca_bundle(mut self, pem: &str) -> ApiService {
        self.ca_bundle = pem.to_owned();
        self
    }

    /// Not verifying the backend's certificate at all.
    pub fn insecure_skip_tls_verify(mut self) -> ApiService {
        self.insecure_skip_tls_verify = true;
        self
    }

    pub fn group_priority_minimum(mut self, priority: u32) -> ApiService {
        self.group_priority_minimum = priority;
        self
    }

    /// Writes [`ApiService::yaml`] to `dir/file` (an `--apiservice-dir` manifest).
    pub fn write_to(&self, dir: &Path, file: &str) {
        std::fs::write(dir.join(file), self.yaml()).unwrap();
    }

    /// The manifest, for `kubectl apply` or a `--apiservice-dir` file.
    pub fn yaml(&self) -> String {
        let trust = if self.insecure_skip_tls_verify {
            "insecureSkipTLSVerify: true".to_owned()
        } else {
            let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_bundle);
            format!("caBundle: {ca}")
        };
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {name}\nspec:\n  \
             group: {group}\n  version: {version}\n  groupPriorityMinimum: {gpm}\n  versionPriority: {vp}\n  \
             {trust}\n  service:\n    namespace: {namespace}\n    name: {service}\n    port: {port}\n",
            name = self.name(),
            group = self.group,
            version = self.version,
            gpm = self.group_priority_minimum,
            vp = self.version_priority,
            namespace = self.namespace,
            service = self.service,
            port = self.port,
        )
    }
}

// ---- a common scenario --------------------------------------------------------------------------

/// A core with an authorization policy, one aggregated backend serving
/// `wardle.example.com/v1alpha1` as Service `wardle/api`, registered by a manifest in an
/// `--apiservice-dir`, and a gateway in front of both.
#[derive(Debug)]
pub struct WardleScenario {
    pub gateway: Gateway,
    pub backend: FixtureAggregated,
    pub core: FixtureCore,
    pub pki: Pki,
}

impl WardleScenario {
    /// `backend_args` and `gateway_args` are appended to [`Pki::start_backend`]'s and
    /// [`Pki::start_gateway`]'s flags.
    pub async fn start(
        pki: Pki,
        policy: &Value,
        backend_args: &[&str],
        gateway_args: &[&str],
    ) -> WardleScenario {
        let core = start_core_with_policy(&pki, policy).await;
        let backend = pki
            .start_backend(WARDLE_GROUP, "v1alpha1", backend_args)
            .await;
        let manifests = pki.dir().join("apiservices");
        std::fs::create_dir(&manifests).unwrap();
        pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
            .write_to(&manifests, "wardle.yaml");
        let config = pki.gateway_config(&[("wardle", &backend)], "");
        let gateway = pki
            .start_gateway_with_file_source(&core, &config, &manifests, gateway_args)
            .await;
        WardleScenario {
            gateway,
            backend,
            core,
            pki,
        }
    }
}

/// Starts `fixture-core` with `policy` (written as `policy.json` into the scratch directory).
pub async fn start_core_with_policy(pki: &Pki, policy: &Value) -> FixtureCore {
    let policy_file = pki.write("policy.json", &policy.to_string());
    FixtureCore::start(&["--policy", &path_arg(&policy_file)])
        .await
        .unwrap()
}

// ---- requests as a user -------------------------------------------------------------------------

/// A kubectl session of `version` against the gateway as `user`.
pub fn kubectl_as(gateway: &Gateway, version: KubectlVersion, user: &CertifiedPair) -> Kubectl {
    Kubectl::new(&gateway.url(), Some(&gateway.ca_file), version)
        .unwrap()
        .with_client_pair(user)
        .unwrap()
}

/// GET `path` through the gateway over HTTP/2 with `headers`, as `user` or anonymously.
pub async fn try_get(
    gateway: &Gateway,
    user: Option<&CertifiedPair>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let client = harness::http2_client(&gateway.ca_pem()?, user)?;
    let mut req = Request::get(format!("{}{path}", gateway.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    harness::send(&client, req.body(Full::new(Bytes::new())).unwrap()).await
}

/// [`try_get`] as `user`, which must get an answer.
pub async fn get_raw(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    try_get(gateway, Some(user), path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// [`get_raw`] with the body as JSON (`null` if it is not).
pub async fn get_as(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let (status, _, body) = get_raw(gateway, user, path, headers).await;
    (status, json_or_null(&body))
}

/// `body` as JSON, or `null` if it is not.
pub fn json_or_null(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Polls `kubectl get apiservices` until the row for APIService `name` contains `wanted`, and
/// returns the table; fails after `timeout`.
pub async fn wait_for_apiservice_row(
    kubectl: &Kubectl,
    name: &str,
    wanted: &str,
    timeout: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let out = kubectl.run(&["get", "apiservices"]).await;
        if out
            .stdout
            .lines()
            .any(|l| l.starts_with(name) && l.contains(wanted))
        {
            return out.stdout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {wanted:?} for {name} in:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- the core fixture, directly -----------------------------------------------------------------

/// A plain-HTTP client for the fixture core.
pub fn core_client() -> HttpClient {
    harness::http1_client(TestCa::new("unused").cert_pem(), None).unwrap()
}

/// POSTs a JSON object straight to the core fixture (what a cluster's controllers would create).
pub async fn create_on_core(core: &FixtureCore, path: &str, object: Value) -> StatusCode {
    let req = Request::post(format!("{}{path}", core.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .unwrap();
    harness::send(&core_client(), req).await.unwrap().0
}

/// The requests the core recorded since the last [`clear_core_requests`], oldest first.
pub async fn core_requests(core: &FixtureCore) -> Vec<Value> {
    let (_, _, body) = harness::get(&core_client(), &format!("{}/fixture/requests", core.url()))
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// The recorded POSTs whose path contains `fragment` (e.g. `subjectaccessreviews`).
pub async fn core_posts(core: &FixtureCore, fragment: &str) -> Vec<Value> {
    core_requests(core)
        .await
        .into_iter()
        .filter(|r| {
            r["method"] == "POST" && r["path"].as_str().is_some_and(|p| p.contains(fragment))
        })
        .collect()
}

/// Forgets the requests the core recorded so far.
pub async fn clear_core_requests(core: &FixtureCore) {
    let req = Request::delete(format!("{}/fixture/requests", core.url()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    harness::send(&core_client(), req).await.unwrap();
}
