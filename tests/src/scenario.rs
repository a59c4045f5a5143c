//! The set-up every end-to-end session with aggregated API servers shares: the certificates of one
//! scenario ([`Pki`]), a core, aggregated backends and the gateway started with them
//! ([`Scenario`], built by [`ScenarioBuilder`]), APIService manifests ([`ApiService`]), requests
//! as a user, and the fixtures' recorded requests. Test files describe their session with the
//! builder's few knobs instead of a set-up struct of their own, so each test starts exactly the
//! session its one behaviour needs.
//!
//! A scenario reads like this:
//!
//! ```no_run
//! # async fn session() {
//! use e2e::scenario::{Scenario, WARDLE_GROUP};
//!
//! let s = Scenario::wardle().start().await;
//! let alice = s.user("alice", &["dev"]);
//! s.kubectl(&alice)
//!     .apply_yaml(&s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle").yaml())
//!     .await;
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
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

    /// Writes a gateway config whose static `services:` map puts each Service
    /// `(namespace, name, backend)` at its backend's address, followed by `extra_yaml`. Without
    /// services it is `extra_yaml` alone.
    pub fn gateway_config(
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
    /// users CA as `--client-ca-file`, and `extra`; returns once it is ready.
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

    /// Forgets the requests `backend` (Service `<namespace>/api`) recorded so far.
    pub async fn clear_backend_requests(&self, backend: &FixtureAggregated, namespace: &str) {
        let req = Request::delete(format!("{}/fixture/requests", backend.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, _) = harness::send(&self.backend_client(namespace), req)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
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

/// A core, aggregated backends and the gateway in front of them, started by [`ScenarioBuilder`]:
/// the one set-up every end-to-end session with aggregated API servers shares, so that a test
/// says only what its session needs (which backends, which APIServices from where, which policy,
/// which extra flags) and nothing it does not.
///
/// Fields drop in order: the gateway stops before its backends and core, and the scratch
/// directory goes last.
#[derive(Debug)]
pub struct Scenario {
    pub gateway: Gateway,
    /// By the namespace of the Service `api` they serve as, in the order they were declared.
    backends: Vec<(String, FixtureAggregated)>,
    pub core: FixtureCore,
    /// The `--apiservice-dir` of a file source.
    manifests: Option<PathBuf>,
    pub pki: Pki,
}

/// Which APIService source the gateway reads.
#[derive(Debug)]
enum Source {
    /// The core's APIServices (the gateway's default): registered with `kubectl apply`.
    Kube,
    /// An `--apiservice-dir` holding these `(file, manifest)` at start.
    Files(Vec<(String, String)>),
}

/// What a [`Scenario`] starts; see [`Scenario::builder`].
#[derive(Debug)]
pub struct ScenarioBuilder {
    pki: Pki,
    core_args: Vec<String>,
    policy: Option<Value>,
    /// `(namespace, group, versions, extra flags)`.
    backends: Vec<(String, String, String, Vec<String>)>,
    static_services: bool,
    /// `(namespace, name, namespace of the backend)`: more Service names for a backend.
    aliases: Vec<(String, String, String)>,
    config_yaml: String,
    source: Source,
    availability_interval: String,
    gateway_args: Vec<String>,
}

impl Scenario {
    /// A scenario with the certificates of [`Pki::new`] (backends serve as `wardle/api`).
    pub fn builder() -> ScenarioBuilder {
        Scenario::with_pki(Pki::new())
    }

    /// A scenario with `pki`, e.g. [`Pki::for_services`] for backends in other namespaces, or
    /// one the test already built APIService manifests from.
    pub fn with_pki(pki: Pki) -> ScenarioBuilder {
        ScenarioBuilder {
            pki,
            core_args: Vec::new(),
            policy: None,
            backends: Vec::new(),
            static_services: true,
            aliases: Vec::new(),
            config_yaml: String::new(),
            source: Source::Kube,
            availability_interval: "1s".to_owned(),
            gateway_args: Vec::new(),
        }
    }

    /// The most common session: the wardle backend (`wardle.example.com/v1alpha1` as Service
    /// `wardle/api`) behind the gateway, not yet registered.
    pub fn wardle() -> ScenarioBuilder {
        Scenario::builder().backend("wardle", WARDLE_GROUP, "v1alpha1", &[])
    }

    /// The backend serving as Service `api` of `namespace`.
    pub fn backend(&self, namespace: &str) -> &FixtureAggregated {
        self.backends
            .iter()
            .find(|(ns, _)| ns == namespace)
            .map(|(_, backend)| backend)
            .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
    }

    /// [`Scenario::backend`], to stop it.
    pub fn backend_mut(&mut self, namespace: &str) -> &mut FixtureAggregated {
        self.backends
            .iter_mut()
            .find(|(ns, _)| ns == namespace)
            .map(|(_, backend)| backend)
            .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
    }

    /// A client certificate for user `name` in `groups`.
    pub fn user(&self, name: &str, groups: &[&str]) -> CertifiedPair {
        self.pki.user(name, groups)
    }

    /// A kubectl 1.32 session as `user`.
    pub fn kubectl(&self, user: &CertifiedPair) -> Kubectl {
        kubectl_as(&self.gateway, KubectlVersion::V1_32, user)
    }

    /// GET `path` as `user` over HTTP/2, the body as JSON (`null` if it is not).
    pub async fn get(
        &self,
        user: &CertifiedPair,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        get_as(&self.gateway, user, path, headers).await
    }

    /// The gateway's logs so far, for failure messages.
    pub fn logs(&self) -> String {
        self.gateway.process.logs()
    }

    /// The `--apiservice-dir` of a scenario with a file source.
    pub fn manifests(&self) -> &Path {
        self.manifests
            .as_deref()
            .expect("the scenario reads APIServices from the core, not from files")
    }

    /// Registers `api` as a user of a file source does: its manifest lands in the directory.
    pub fn register(&self, api: &ApiService) {
        api.write_to(self.manifests(), &format!("{}.yaml", api.name()));
    }
}

impl ScenarioBuilder {
    /// The certificates, e.g. to write a CA file the gateway's flags name.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// Flags for `fixture-core`.
    pub fn core_args(mut self, args: &[&str]) -> ScenarioBuilder {
        self.core_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The core authorizes (and authenticates tokens) with `policy` instead of allowing all.
    pub fn core_policy(mut self, policy: Value) -> ScenarioBuilder {
        self.policy = Some(policy);
        self
    }

    /// An aggregated backend serving `group` at `versions` (comma list, first preferred) as
    /// Service `api` of `namespace`, see [`Pki::start_backend`] for `extra` flags.
    pub fn backend(
        mut self,
        namespace: &str,
        group: &str,
        versions: &str,
        extra: &[&str],
    ) -> ScenarioBuilder {
        self.backends.push((
            namespace.to_owned(),
            group.to_owned(),
            versions.to_owned(),
            extra.iter().map(|a| a.to_string()).collect(),
        ));
        self
    }

    /// Leaves the backends out of the static `services:` map: the gateway must find them
    /// through Services and EndpointSlices on the core.
    pub fn without_static_services(mut self) -> ScenarioBuilder {
        self.static_services = false;
        self
    }

    /// Also puts the backend of `backend_namespace` at Service `namespace/name`.
    pub fn service_alias(
        mut self,
        namespace: &str,
        name: &str,
        backend_namespace: &str,
    ) -> ScenarioBuilder {
        self.aliases.push((
            namespace.to_owned(),
            name.to_owned(),
            backend_namespace.to_owned(),
        ));
        self
    }

    /// YAML appended to the gateway's config file.
    pub fn config_yaml(mut self, yaml: &str) -> ScenarioBuilder {
        self.config_yaml.push_str(yaml);
        self
    }

    /// Reads APIServices from an `--apiservice-dir` (empty unless manifests are added).
    pub fn file_source(mut self) -> ScenarioBuilder {
        if let Source::Kube = self.source {
            self.source = Source::Files(Vec::new());
        }
        self
    }

    /// A file in the `--apiservice-dir` at start (implies [`ScenarioBuilder::file_source`]).
    pub fn manifest(mut self, file: &str, yaml: &str) -> ScenarioBuilder {
        self = self.file_source();
        if let Source::Files(files) = &mut self.source {
            files.push((file.to_owned(), yaml.to_owned()));
        }
        self
    }

    /// [`Pki::apiservice`] registered from a manifest at start (implies a file source).
    pub fn apiservice(self, group: &str, version: &str, namespace: &str) -> ScenarioBuilder {
        let api = self.pki.apiservice(group, version, namespace);
        self.manifest(&format!("{}.yaml", api.name()), &api.yaml())
    }

    /// `--apiservice-availability-interval` (1 s unless set).
    pub fn availability_interval(mut self, interval: &str) -> ScenarioBuilder {
        self.availability_interval = interval.to_owned();
        self
    }

    /// More gateway flags.
    pub fn gateway_args(mut self, args: &[&str]) -> ScenarioBuilder {
        self.gateway_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Starts the core, the backends and the gateway, and returns once the gateway is ready.
    pub async fn start(self) -> Scenario {
        let ScenarioBuilder {
            pki,
            mut core_args,
            policy,
            backends: specs,
            static_services,
            aliases,
            config_yaml,
            source,
            availability_interval,
            gateway_args,
        } = self;
        if let Some(policy) = policy {
            let file = pki.write("policy.json", &policy.to_string());
            core_args.extend(["--policy".to_owned(), path_arg(&file)]);
        }
        let core_args: Vec<&str> = core_args.iter().map(String::as_str).collect();
        let core = FixtureCore::start(&core_args).await.unwrap();
        let mut backends = Vec::new();
        for (namespace, group, versions, extra) in &specs {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let backend = pki.start_backend(group, versions, &extra).await;
            backends.push((namespace.clone(), backend));
        }
        let backend_of = |namespace: &str| {
            backends
                .iter()
                .find(|(ns, _)| ns == namespace)
                .map(|(_, backend)| backend)
                .unwrap_or_else(|| panic!("no backend in namespace {namespace}"))
        };
        let mut services: Vec<(&str, &str, &FixtureAggregated)> = Vec::new();
        if static_services {
            services.extend(backends.iter().map(|(ns, b)| (ns.as_str(), "api", b)));
        }
        for (namespace, name, backend) in &aliases {
            services.push((namespace, name, backend_of(backend)));
        }
        let config = pki.gateway_config(&services, &config_yaml);
        let mut args = vec![
            "--apiservice-availability-interval".to_owned(),
            availability_interval,
        ];
        let manifests = match source {
            Source::Kube => None,
            Source::Files(files) => {
                let dir = pki.dir().join("apiservices");
                std::fs::create_dir(&dir).unwrap();
                for (file, yaml) in files {
                    std::fs::write(dir.join(file), yaml).unwrap();
                }
                args.extend([
                    "--apiservice-source".to_owned(),
                    "file".to_owned(),
                    "--apiservice-dir".to_owned(),
                    path_arg(&dir),
                ]);
                Some(dir)
            }
        };
        args.extend(gateway_args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let gateway = pki.start_gateway(&core, &config, &args).await;
        Scenario {
            gateway,
            backends,
            core,
            manifests,
            pki,
        }
    }
}

/// A core and the gateway in front of it alone, as it runs without any of the scenario's
/// certificates: its own generated serving certificate, no client CA, no proxy identity, and
/// no APIServices (`--apiservice-source none`); `gateway_args` come after. Returns as soon as
/// the gateway serves, ready or not.
pub async fn core_and_gateway(gateway_args: &[&str]) -> (FixtureCore, Gateway) {
    let core = FixtureCore::start(&[]).await.expect("fixture core starts");
    let args = ["--apiservice-source", "none"].iter().chain(gateway_args);
    let gateway = Gateway::start(GatewayOptions::new(core.url()).args(args.copied()))
        .await
        .expect("gateway starts");
    (core, gateway)
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

/// Whether GET `path` as `user` answers 200 with a `kind` (e.g. `FlunderList`) within `timeout`.
pub async fn serves(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    kind: &str,
    timeout: Duration,
) -> bool {
    harness::wait_until(timeout, || async {
        let (status, body) = get_as(gateway, user, path, &[]).await;
        status == StatusCode::OK && body["kind"] == kind
    })
    .await
}

/// `/metrics`, fetched anonymously over HTTP/1.1.
pub async fn metrics(gateway: &Gateway) -> String {
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let (status, _, body) = harness::get(&client, &format!("{}/metrics", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).into_owned()
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

// ---- ConfigMaps through the gateway -------------------------------------------------------------

/// A ConfigMap `name` with one key, as a request body.
fn configmap(name: &str) -> Full<Bytes> {
    Full::new(Bytes::from(
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
            .to_string(),
    ))
}

/// Creates ConfigMap `name` in `default` through the gateway; the status it got.
pub async fn create_configmap(client: &HttpClient, gateway: &Gateway, name: &str) -> StatusCode {
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

/// Opens a watch on the ConfigMaps of `default` through the gateway and returns a channel of the
/// raw chunks it streams.
pub async fn watch_configmaps(
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

/// Waits up to 5 s for an event about object `name` on a [`watch_configmaps`] channel.
pub async fn expect_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = String::new();
    while std::time::Instant::now() < deadline {
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

/// The `Available` condition of APIService `name` as stored on the core (what `kubectl get
/// apiservices` shows): `(status, reason)`, or `None` while the APIService or its condition
/// does not exist.
pub async fn available_condition(core: &FixtureCore, name: &str) -> Option<(String, String)> {
    let url = format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices/{name}",
        core.url()
    );
    let (status, _, body) = harness::get(&core_client(), &url).await.ok()?;
    if status != StatusCode::OK {
        return None;
    }
    let api = json_or_null(&body);
    let condition = api["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")?;
    Some((
        condition["status"].as_str()?.to_owned(),
        condition["reason"].as_str().unwrap_or_default().to_owned(),
    ))
}
