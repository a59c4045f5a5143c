//! The certificates of one scenario: CAs, serving and client certificates, backends started with them, and the gateway's configuration.

use super::*;

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
    /// `(namespace, name, backend)` at its backend's address (a Service named more than once
    /// gets all of them, as its endpoints), followed by `extra_yaml`. Without services it is
    /// `extra_yaml` alone.
    pub fn gateway_config(
        &self,
        services: &[(&str, &str, &FixtureAggregated)],
        extra_yaml: &str,
    ) -> PathBuf {
        let mut yaml = String::new();
        if !services.is_empty() {
            yaml.push_str("services:\n");
        }
        let mut listed: Vec<(&str, &str)> = Vec::new();
        for (namespace, name, _) in services {
            if listed.contains(&(*namespace, *name)) {
                continue;
            }
            listed.push((namespace, name));
            let urls: Vec<String> = services
                .iter()
                .filter(|(ns, n, _)| ns == namespace && n == name)
                .map(|(_, _, backend)| format!("\"https://{}\"", backend.addr))
                .collect();
            yaml.push_str(&format!(
                "- namespace: {namespace}\n  name: {name}\n  port: 443\n  urls: [{}]\n",
                urls.join(", ")
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
        let gateway = self.spawn_gateway(core, config, extra).await;
        // A session starts once the gateway is ready: before its APIService source has synced,
        // unclaimed `/apis/<group>` paths answer 503 (by design) rather than the core's 404.
        let client = gateway.http1_client(None);
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

    /// [`Pki::start_gateway`] without waiting for readiness: returns once the gateway serves.
    pub async fn spawn_gateway(
        &self,
        core: &FixtureCore,
        config: &Path,
        extra: &[&str],
    ) -> Gateway {
        self.spawn_gateway_at(core, config, extra, 0).await
    }

    /// [`Pki::spawn_gateway`] on `port` (0: any free one), e.g. a replica restarted where a load
    /// balancer expects it.
    pub async fn spawn_gateway_at(
        &self,
        core: &FixtureCore,
        config: &Path,
        extra: &[&str],
        port: u16,
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
        Gateway::start(GatewayOptions::new(core.url()).args(args).secure_port(port))
            .await
            .expect("gateway starts")
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

    /// Makes `backend` (Service `<namespace>/api`) misbehave as `modes` say from now on (see
    /// `fixture::hostile`; empty: behave).
    pub async fn set_backend_hostility(
        &self,
        backend: &FixtureAggregated,
        namespace: &str,
        modes: &[crate::fixture::hostile::Hostile],
    ) {
        let req = Request::put(format!("{}/fixture/hostile", backend.url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(modes).unwrap())))
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
            annotations: Vec::new(),
        }
    }
}
