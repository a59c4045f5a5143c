//! etcd and kube-apiserver, started with the flags a cluster that aggregates needs.
//!
//! kube-apiserver runs as kubeadm configures it, minus what needs nodes: client certificates and a
//! token file for users, `Node,RBAC` authorization, service-account issuing (for
//! sample-apiserver's token), and for aggregation the front-proxy CA, the request-header names and
//! its own proxy client certificate. It publishes the client CA and the request-header settings in
//! `kube-system/extension-apiserver-authentication`, which sample-apiserver reads to decide whom
//! to trust. There is no controller-manager, scheduler or kubelet: Services get no endpoints
//! (`wardle/api` is an ExternalName Service), nothing is garbage-collected, no Pod runs.

use std::process::Command;
use std::time::{Duration, Instant};

use http::StatusCode;

use super::pki::{RealPki, ADMIN_TOKEN};
use super::ports::free_port;
use super::RealBinaries;
use crate::harness::{
    get, http1_client, GatewayOptions, HarnessError, HttpClient, Kubectl, KubectlVersion, Process,
};

/// How long etcd and kube-apiserver may take to become ready on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A running etcd and kube-apiserver, killed when dropped.
pub struct ControlPlane {
    pub pki: RealPki,
    /// `http://127.0.0.1:<port>`, shared with sample-apiserver (its own prefix).
    pub etcd_url: String,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    pub kube_apiserver: Process,
    pub etcd: Process,
    /// kube-apiserver's binary and flags, to start it again as it was ([`Self::restart_kube_apiserver`]).
    kube_apiserver_command: (std::path::PathBuf, Vec<String>),
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .field("etcd_url", &self.etcd_url)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd, then kube-apiserver, and waits until kube-apiserver's `/readyz` passes (RBAC
    /// bootstrap roles included).
    pub async fn start(binaries: &RealBinaries) -> Result<ControlPlane, HarnessError> {
        ControlPlane::start_with(binaries, &[]).await
    }

    /// [`ControlPlane::start`] with `extra` flags after the standard ones (e.g.
    /// `--authentication-config FILE`; `--requestheader-uid-headers X-Remote-Uid`).
    pub async fn start_with(
        binaries: &RealBinaries,
        extra: &[String],
    ) -> Result<ControlPlane, HarnessError> {
        let pki = RealPki::new();
        let etcd = start_etcd(binaries, &pki).await?;
        let (etcd, etcd_url) = etcd;
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let file = |p: &std::path::Path| p.display().to_string();
        let args: Vec<String> = [
            "--etcd-servers",
            &etcd_url,
            "--secure-port",
            &port.to_string(),
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--endpoint-reconciler-type",
            "none",
            "--cert-dir",
            &file(&pki.dir().join("kube-apiserver")),
            "--tls-cert-file",
            &file(&pki.apiserver_serving.0),
            "--tls-private-key-file",
            &file(&pki.apiserver_serving.1),
            "--client-ca-file",
            &file(&pki.cluster_ca_file),
            "--token-auth-file",
            &file(&pki.token_file),
            "--authorization-mode",
            "Node,RBAC",
            "--service-cluster-ip-range",
            "10.0.0.0/24",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &file(&pki.service_account_pub),
            "--service-account-signing-key-file",
            &file(&pki.service_account_key),
            "--requestheader-client-ca-file",
            &file(&pki.front_proxy_ca_file),
            "--requestheader-allowed-names",
            &format!(
                "{},{}",
                super::pki::APISERVER_PROXY_CN,
                super::pki::GATEWAY_PROXY_CN
            ),
            "--requestheader-username-headers",
            "X-Remote-User",
            "--requestheader-group-headers",
            "X-Remote-Group",
            "--requestheader-extra-headers-prefix",
            "X-Remote-Extra-",
            "--proxy-client-cert-file",
            &file(&pki.apiserver_proxy_client.0),
            "--proxy-client-key-file",
            &file(&pki.apiserver_proxy_client.1),
            "--enable-aggregator-routing=false",
        ]
        .into_iter()
        .map(Into::into)
        .chain(extra.iter().cloned())
        .collect();
        let kube_apiserver_command = (binaries.kube_apiserver.clone(), args);
        let kube_apiserver = spawn_kube_apiserver(&kube_apiserver_command)?;
        let plane = ControlPlane {
            pki,
            etcd_url,
            url,
            kube_apiserver,
            etcd,
            kube_apiserver_command,
        };
        plane.wait_ready().await?;
        Ok(plane)
    }

    /// Kills kube-apiserver (SIGKILL: no graceful shutdown, as when its node fails) and starts it
    /// again with the same flags on the same port; returns once its `/readyz` passes, with how
    /// long it was gone.
    pub async fn restart_kube_apiserver(&mut self) -> Result<Duration, HarnessError> {
        let killed = Instant::now();
        self.kube_apiserver.kill();
        self.kube_apiserver = spawn_kube_apiserver(&self.kube_apiserver_command)?;
        self.wait_ready().await?;
        Ok(killed.elapsed())
    }

    /// Options for a gateway in front of this kube-apiserver: it trusts the cluster CA, reaches
    /// the core as `admin`, takes the cluster's client certificates, and presents the front-proxy
    /// client certificate kube-apiserver's `--requestheader-allowed-names` names.
    pub fn gateway_options(&self) -> GatewayOptions {
        let pki = &self.pki;
        let path = |p: &std::path::Path| p.display().to_string();
        GatewayOptions::new(self.url.clone()).args([
            "--core-ca-file".to_owned(),
            path(&pki.cluster_ca_file),
            "--core-client-cert-file".to_owned(),
            path(&pki.admin_files.0),
            "--core-client-key-file".to_owned(),
            path(&pki.admin_files.1),
            "--client-ca-file".to_owned(),
            path(&pki.cluster_ca_file),
            "--proxy-client-cert-file".to_owned(),
            path(&pki.gateway_proxy_client.0),
            "--proxy-client-key-file".to_owned(),
            path(&pki.gateway_proxy_client.1),
        ])
    }

    async fn wait_ready(&self) -> Result<(), HarnessError> {
        let client = self.admin_client()?;
        let url = format!("{}/readyz", self.url);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            match get(&client, &url).await {
                Ok((StatusCode::OK, _, _)) => return Ok(()),
                Ok((status, _, body)) => {
                    last = format!("{status}: {}", String::from_utf8_lossy(&body));
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(HarnessError::Start {
            name: "kube-apiserver".into(),
            reason: format!("/readyz did not pass within {READY_TIMEOUT:?}: {last}"),
            logs: self.kube_apiserver.logs() + &self.etcd.logs(),
        })
    }

    /// A raw HTTP/1.1 client presenting the admin client certificate, trusting the cluster CA.
    pub fn admin_client(&self) -> Result<HttpClient, HarnessError> {
        http1_client(self.pki.cluster_ca.cert_pem(), Some(&self.pki.admin))
    }

    /// kubectl straight to kube-apiserver with a bearer token from the token file.
    pub fn kubectl(&self, token: &str) -> Kubectl {
        Kubectl::for_release(
            &self.url,
            Some(&self.pki.cluster_ca_file),
            KubectlVersion::default(),
        )
        .and_then(|k| k.with_token(token))
        .expect("a kubectl session for kube-apiserver")
    }

    /// kubectl straight to kube-apiserver as `admin`.
    pub fn admin(&self) -> Kubectl {
        self.kubectl(ADMIN_TOKEN)
    }

    /// Every captured line of etcd and kube-apiserver, for failure messages.
    pub fn logs(&self) -> String {
        self.etcd.logs() + &self.kube_apiserver.logs()
    }
}

fn spawn_kube_apiserver(
    (binary, args): &(std::path::PathBuf, Vec<String>),
) -> Result<Process, HarnessError> {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    Process::spawn("kube-apiserver", cmd)
}

async fn start_etcd(
    binaries: &RealBinaries,
    pki: &RealPki,
) -> Result<(Process, String), HarnessError> {
    let client_port = free_port();
    let peer_port = free_port();
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(&binaries.etcd);
    cmd.arg("--data-dir").arg(pki.dir().join("etcd")).args([
        "--name",
        "default",
        "--listen-client-urls",
        &client_url,
        "--advertise-client-urls",
        &client_url,
        "--listen-peer-urls",
        &peer_url,
        "--initial-advertise-peer-urls",
        &peer_url,
        "--initial-cluster",
        &format!("default={peer_url}"),
    ]);
    let etcd = Process::spawn("etcd", cmd)?;
    let ready = etcd
        .wait_for_line(
            |l| l.contains("ready to serve client requests"),
            READY_TIMEOUT,
        )
        .await;
    if ready.is_none() {
        let logs = etcd.logs();
        return Err(HarnessError::Start {
            name: "etcd".into(),
            reason: "no \"ready to serve client requests\" line".into(),
            logs,
        });
    }
    Ok((etcd, client_url))
}
