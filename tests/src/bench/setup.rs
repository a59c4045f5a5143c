//! What every network scenario runs against: the two static backends, the gateway in front of
//! them, and a CA all of them and the load generator trust.
//!
//! The gateway is started through the e2e harness ([`Gateway::start`]) like in every other e2e
//! test; the bench only says what differs: its own binary (a release build), its certificates, a
//! file APIService source with one remote APIService (`v1.bench.example.com`, served by the TLS
//! backend), and a quieter access log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;

use super::load::{client_tls, connect, request, Endpoint, Proto};
use super::{BoxError, AGGREGATED_V2, BENCH_GROUP};
use crate::certs::TestCa;
use crate::harness::{FixtureServer, Gateway, GatewayOptions};

/// The running backends and gateway; dropping it stops them and removes their files.
pub struct Setup {
    pub tls_backend: FixtureServer,
    pub gateway: Gateway,
    /// How the gateway was started, to start more like it (the start-to-ready scenario).
    pub gateway_options: GatewayOptions,
    /// The bench CA, trusted by the load generator for the backend and the gateway alike.
    pub ca_pem: Arc<str>,
    /// A user the gateway authenticates by its client certificate (`--client-ca-file`).
    pub user: crate::certs::CertifiedPair,
    pub plain_pid: u32,
    /// The plain core backend's address, for the peer proxies ([`super::peers`]).
    pub plain_addr: std::net::SocketAddr,
    /// The files other proxies in front of the same backends need: the gateway's serving pair
    /// and the bench CA (which signed the TLS backend's certificate).
    pub files: SetupFiles,
    _plain: FixtureServer,
    _dir: tempfile::TempDir,
}

/// Certificate files written for the run (they live as long as the [`Setup`]).
#[derive(Clone, Debug)]
pub struct SetupFiles {
    pub gateway_cert: PathBuf,
    pub gateway_key: PathBuf,
    pub ca_file: PathBuf,
}

/// The name the TLS backend's certificate is issued for, as the gateway reaches the remote
/// APIService's service (`api.bench.svc`); peers verify the backend under the same name.
pub const REMOTE_SERVER_NAME: &str = "api.bench.svc";

impl Setup {
    /// Starts the backends (this binary again, `serve-backend`) and the gateway, and waits until
    /// the gateway is ready, has merged discovery and routes the remote APIService.
    pub async fn start(gateway_binary: &Path) -> Result<Setup, BoxError> {
        let dir = tempfile::Builder::new().prefix("bench-").tempdir()?;
        let ca = TestCa::try_new("bench-ca")?;
        let ca_file = ca.write(dir.path(), "ca.crt")?;
        let user = ca.issue_client("bench-user", &["bench"]);
        let ca_pem: Arc<str> = Arc::from(ca.cert_pem());
        let (backend_cert, backend_key) = ca
            .issue_server(&[REMOTE_SERVER_NAME, "localhost", "127.0.0.1"])
            .write(dir.path(), "backend")?;
        let (gateway_cert, gateway_key) = ca
            .issue_server(&["localhost", "127.0.0.1"])
            .write(dir.path(), "gateway")?;
        let (proxy_cert, proxy_key) = ca
            .issue_client("aggregator", &[])
            .write(dir.path(), "proxy-client")?;
        let me = std::env::current_exe()?;
        let plain = FixtureServer::start_binary("backend-plain", &me, &["serve-backend"]).await?;
        let backend_cert_s = backend_cert.display().to_string();
        let backend_key_s = backend_key.display().to_string();
        let tls_backend = FixtureServer::start_binary(
            "backend-tls",
            &me,
            &[
                "serve-backend",
                "--tls-cert",
                &backend_cert_s,
                "--tls-key",
                &backend_key_s,
            ],
        )
        .await?;

        let apiservices = dir.path().join("apiservices");
        std::fs::create_dir_all(&apiservices)?;
        let ca_b64 = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(ca.cert_pem())
        };
        std::fs::write(
            apiservices.join("bench.yaml"),
            format!(
                "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.{BENCH_GROUP}\n\
                 spec:\n  group: {BENCH_GROUP}\n  version: v1\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  \
                 caBundle: {ca_b64}\n  service:\n    namespace: bench\n    name: api\n    port: 443\n"
            ),
        )?;
        let config = dir.path().join("gateway.yaml");
        std::fs::write(
            &config,
            format!(
                "services:\n- namespace: bench\n  name: api\n  port: 443\n  urls: [\"https://{}\"]\n",
                tls_backend.addr
            ),
        )?;
        let mut args = gateway_args(
            [&gateway_cert, &gateway_key, &proxy_cert, &proxy_key],
            &apiservices,
            &ca_file,
        );
        args.extend([
            "--apiservice-availability-interval".to_owned(),
            "1s".to_owned(),
        ]);
        args.extend(webhooks_off(gateway_binary)?);
        // The per-request access log is silenced: at tens of thousands of requests per second its
        // lines (captured by this process) would measure the log pipeline, not the proxy.
        let options = GatewayOptions::new(plain.url())
            .binary(gateway_binary)
            .config(config)
            .args(args)
            .log_level("info,access=warn");
        let gateway = Gateway::start(options.clone()).await?;
        let plain_pid = plain.process.id();
        let plain_addr = plain.addr;
        let files = SetupFiles {
            gateway_cert,
            gateway_key,
            ca_file,
        };
        let setup = Setup {
            tls_backend,
            gateway,
            gateway_options: options,
            ca_pem,
            user,
            plain_pid,
            plain_addr,
            files,
            _plain: plain,
            _dir: dir,
        };
        setup.wait_until_routing().await?;
        Ok(setup)
    }

    /// The TLS backend itself, as a client without the gateway would reach it.
    pub fn direct(&self) -> Endpoint {
        Endpoint {
            addr: self.tls_backend.addr,
            ca_pem: Some(self.ca_pem.clone()),
            client_cert: None,
        }
    }

    /// The gateway, as an anonymous caller.
    pub fn via(&self) -> Endpoint {
        Endpoint {
            addr: self.gateway.addr,
            ca_pem: Some(self.ca_pem.clone()),
            client_cert: None,
        }
    }

    /// The gateway, as a user with a client certificate: what reaches remote APIServices over
    /// HTTP/2 (anonymous callers' requests go over HTTP/1.1 upstream).
    pub fn via_as_user(&self) -> Endpoint {
        Endpoint {
            client_cert: Some(self.user.clone()),
            ..self.via()
        }
    }

    /// Ready, discovery merged and the remote APIService available, within 60 s.
    async fn wait_until_routing(&self) -> Result<(), BoxError> {
        let via = self.via();
        let tls = client_tls(&self.ca_pem, Proto::H1)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        for path in [
            "/readyz",
            &format!("/apis/{BENCH_GROUP}/v1/namespaces/default/things/x"),
            "/apis",
        ] {
            loop {
                let ok = async {
                    let mut s = connect(&via, Some(&tls), Proto::H1).await?;
                    let accept = (path == "/apis").then_some(AGGREGATED_V2);
                    let resp = s.send(request(&via, Proto::H1, path, accept)).await?;
                    let status = resp.status();
                    let body = resp.into_body().collect().await?.to_bytes();
                    let good = status == StatusCode::OK
                        && (path != "/apis"
                            || body
                                .windows(BENCH_GROUP.len())
                                .any(|w| w == BENCH_GROUP.as_bytes()));
                    Ok::<_, BoxError>(good)
                }
                .await
                .unwrap_or(false);
                if ok {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the gateway did not answer {path} with 200 within 60s\n{}",
                        self.gateway.process.logs()
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// `--authorization-webhook=false` and `--authentication-token-webhook=false`, for the gateways
/// that have these flags (`--gateway` may name an older build). Requests carry no credentials
/// (anonymous); nothing to review. The remote route would ask the core for a
/// SubjectAccessReview, which the static core cannot answer.
pub fn webhooks_off(gateway_binary: &Path) -> Result<Vec<String>, BoxError> {
    let help = Command::new(gateway_binary).arg("--help").output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    Ok(
        ["--authorization-webhook", "--authentication-token-webhook"]
            .into_iter()
            .filter(|flag| {
                help.contains(&format!("{flag}[=")) || help.contains(&format!("{flag} "))
            })
            .map(|flag| format!("{flag}=false"))
            .collect(),
    )
}

/// The gateway binary the bench measures: `--gateway`, or `aggregation-gateway` built with this
/// binary's profile by the harness.
pub async fn gateway_binary(given: Option<PathBuf>) -> Result<PathBuf, BoxError> {
    Ok(match given {
        Some(path) => path,
        None => tokio::task::spawn_blocking(crate::harness::ensure_gateway_built).await??,
    })
}

/// A bench gateway's flags: serving and proxy-client certificates (`[cert, key, proxy cert,
/// proxy key]`), APIService manifests from `apiservices`, client certificates from `ca_file`.
pub fn gateway_args(certs: [&Path; 4], apiservices: &Path, ca_file: &Path) -> Vec<String> {
    let [cert, key, proxy_cert, proxy_key] = certs.map(|p| p.display().to_string());
    [
        "--tls-cert-file",
        &cert,
        "--tls-private-key-file",
        &key,
        "--proxy-client-cert-file",
        &proxy_cert,
        "--proxy-client-key-file",
        &proxy_key,
        "--apiservice-source",
        "file",
        "--apiservice-dir",
        &apiservices.display().to_string(),
        "--client-ca-file",
        &ca_file.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}
