//! The one-node cluster's processes, started in dependency order and torn down in reverse.
//!
//! etcd and kube-apiserver listen on the node's address only (`10.200.0.1`), so nothing of the
//! node takes a port on 127.0.0.1 that the real-control-plane suite, which may run beside it,
//! picks from. kube-apiserver runs as kubeadm configures it (client CA, `Node,RBAC`,
//! NodeRestriction, service-account keys, the front-proxy CA and request-header names, its own
//! proxy client certificate); kube-controller-manager and kube-scheduler without leader election;
//! containerd with its own socket, root and state in the cluster's directory, runc reached through
//! our wrapper (this VM lacks `CAP_SYS_RESOURCE`, so runc cannot lower `oom_score_adj` below 0 and
//! every Pod sandbox failed with "can't get final child's PID from pipe: EOF"; the wrapper clamps
//! a negative `oomScoreAdj` to 0); the CNI bridge; dnsmasq as cluster DNS; the kubelet (cgroupfs,
//! its root in the cluster's directory) and kube-proxy in iptables mode.
//!
//! Dropping the [`Cluster`] stops the Pods' containers through containerd before containerd
//! itself, unmounts what the kubelet mounted, and then undoes the host changes ([`HostNetwork`]).

mod front_door;

pub use front_door::{Component, BOOTSTRAP_GROUP, CORE_PORT, GATEWAY, SIGNING_DURATION};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use http::StatusCode;

use super::conformance_images::{listed_images, ConformanceImages, Sources, BUSYBOX};
use super::host::{self, HostNetwork, CLUSTER_CIDR, POD_CIDR, SERVICE_CIDR};
use super::image::{build_and_import, ImageSpec};
use super::pki::{NodePki, FRONT_PROXY_CN, NODE_IP, NODE_NAME};
use super::{dns, NodeBinaries, CNI_BIN_DIR};
use crate::harness::{get, http1_client, HttpClient, Kubectl, KubectlVersion, Process};

/// kube-apiserver's port on the node's address.
pub const APISERVER_PORT: u16 = 6443;
/// etcd's client port on the node's address (shared with Pods that keep their own prefix, as
/// sample-apiserver and a sidecar kube-apiserver do).
pub const ETCD_PORT: u16 = 23379;
const ETCD_PEER_PORT: u16 = 23380;
/// The Pod sandbox image, built from the static `pause`.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// How long each component may take to become ready on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How the kubelet proves who it is to the cluster's API endpoint.
#[derive(Clone, Debug)]
pub enum KubeletLogin {
    /// A kubeconfig naming `server` with a client certificate; `rotate` turns on the kubelet's
    /// client certificate rotation (`rotateCertificates`).
    Certificate {
        server: String,
        cert: PathBuf,
        key: PathBuf,
        rotate: bool,
    },
    /// TLS bootstrap as kubeadm sets it up: a bootstrap kubeconfig naming `server` with a
    /// bootstrap token; the kubelet asks for its certificate with a CSR, writes its own
    /// kubeconfig and rotates the certificate before it expires.
    Bootstrap { server: String, token: String },
}

/// A running one-node cluster; see the module docs.
pub struct Cluster {
    pub pki: NodePki,
    /// `https://10.200.0.1:6443`: the cluster's API endpoint, kube-apiserver's own address
    /// until [`Cluster::move_behind_gateway`] puts the gateway there.
    pub url: String,
    /// kube-apiserver's own address (`url`, or its loopback port behind the gateway).
    pub core_url: String,
    /// `http://10.200.0.1:23379`.
    pub etcd_url: String,
    /// containerd's socket, for `ctr --address`.
    pub containerd: PathBuf,
    pub binaries: NodeBinaries,
    dir: tempfile::TempDir,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
    dns: tokio::task::JoinHandle<()>,
    host: Option<HostNetwork>,
    /// When [`Cluster::start`] began, for the suite's timings.
    pub started: Instant,
    /// The bootstrap token (`<id>.<secret>`) the kubelet started with behind the front door.
    pub bootstrap_token: Option<String>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("url", &self.url)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts everything and waits until the node is Ready. `runc_wrapper` is the suite's
    /// `node-runc` binary.
    pub async fn start(binaries: &NodeBinaries, runc_wrapper: &Path) -> Result<Cluster, String> {
        let started = Instant::now();
        let host = HostNetwork::set_up()?;
        let dir = tempfile::Builder::new()
            .prefix("real-node-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let pki = NodePki::new(&dir.path().join("pki"));
        let mut cluster = Cluster {
            url: format!("https://{NODE_IP}:{APISERVER_PORT}"),
            core_url: format!("https://{NODE_IP}:{APISERVER_PORT}"),
            etcd_url: format!("http://{NODE_IP}:{ETCD_PORT}"),
            containerd: dir.path().join("containerd.sock"),
            pki,
            binaries: binaries.clone(),
            dir,
            processes: Vec::new(),
            dns: tokio::spawn(async {}),
            host: Some(host),
            started,
            bootstrap_token: None,
        };
        cluster.start_control_plane().await?;
        cluster.start_containerd(runc_wrapper).await?;
        cluster.start_dns()?;
        let url = cluster.url.clone();
        let p = &cluster.pki;
        let login = KubeletLogin::Certificate {
            server: url.clone(),
            cert: p.kubelet_client.cert.clone(),
            key: p.kubelet_client.key.clone(),
            rotate: false,
        };
        cluster.start_kubelet(&login)?;
        cluster.start_proxy(&url)?;
        cluster.wait_node_ready().await?;
        eprintln!(
            "real node: {NODE_NAME} Ready after {:.1?}",
            cluster.started.elapsed()
        );
        Ok(cluster)
    }

    /// The cluster's directory (PKI, configs, containerd and kubelet state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kubectl as `admin` (`system:masters`), straight to kube-apiserver.
    pub fn admin(&self) -> Kubectl {
        Kubectl::new(
            &self.url,
            Some(&self.pki.cluster_ca_file),
            KubectlVersion::V1_33,
        )
        .and_then(|k| k.with_client_cert(&self.pki.admin.cert, &self.pki.admin.key))
        .expect("an admin kubectl session")
    }

    /// A raw HTTP/1.1 client presenting the admin certificate.
    pub fn admin_client(&self) -> HttpClient {
        http1_client(self.pki.cluster_ca.cert_pem(), Some(&self.pki.admin.pair))
            .expect("an admin HTTP client")
    }

    /// A kubeconfig file for the admin, for tools that take one (helm, e2e.test).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.admin_kubeconfig_at(&self.url)
    }

    fn admin_kubeconfig_at(&self, server: &str) -> PathBuf {
        let file = self.dir.path().join("admin.kubeconfig");
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "real-node", "cluster": {
                "server": server,
                "certificate-authority": self.pki.cluster_ca_file.display().to_string()}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": self.pki.admin.cert.display().to_string(),
                "client-key": self.pki.admin.key.display().to_string()}}],
            "contexts": [{"name": "real-node", "context": {"cluster": "real-node", "user": "admin"}}],
            "current-context": "real-node",
        });
        std::fs::write(&file, config.to_string()).expect("writing the admin kubeconfig");
        file
    }

    /// Builds an image from host binaries and imports it into the node's containerd.
    pub fn import_image(&self, spec: &ImageSpec) -> Result<String, String> {
        let started = Instant::now();
        let reference = build_and_import(spec, self.binaries.host("ctr"), &self.containerd)?;
        eprintln!(
            "real node: image {reference} imported in {:.1?}",
            started.elapsed()
        );
        Ok(reference)
    }

    /// Gives the image `from` the further name `to` in the node's containerd.
    pub fn tag_image(&self, from: &str, to: &str) -> Result<(), String> {
        let out = Command::new(self.binaries.host("ctr"))
            .arg("--address")
            .arg(&self.containerd)
            .args(["-n", "k8s.io", "images", "tag", "--force", from, to])
            .output()
            .map_err(|e| format!("ctr images tag: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr images tag {from} {to}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Builds and imports the images the conformance specs of `e2e` run (see
    /// [`super::conformance_images`]), each under every name `e2e.test --list-images` gives it;
    /// returns what was built and which listed names were not.
    pub fn import_conformance_images(&self, e2e: &Path) -> Result<ConformanceImages, String> {
        let cp = &self.binaries.control_plane;
        let sources = Sources {
            agnhost: e2e.with_file_name("agnhost"),
            busybox: PathBuf::from(BUSYBOX),
            pause: self.binaries.pause.clone(),
            sample_apiserver: cp.sample_apiserver.clone(),
            etcd: cp.etcd.clone(),
        };
        for (host, package) in [
            (&sources.agnhost, "build-e2e-test builds it beside e2e.test"),
            (&sources.busybox, "Debian package busybox-static"),
        ] {
            if !host.is_file() {
                return Err(format!("{} is missing ({package})", host.display()));
            }
        }
        let plan = ConformanceImages::plan(&listed_images(e2e)?, &sources)?;
        for (spec, tags) in &plan.builds {
            self.import_image(spec)?;
            for tag in tags {
                self.tag_image(&spec.reference, tag)?;
            }
        }
        Ok(plan)
    }

    /// Every captured line of every component, for failure messages.
    pub fn logs(&self) -> String {
        self.processes.iter().map(Process::logs).collect()
    }

    /// The captured lines of one component (`kubelet`, `kube-apiserver`, ...).
    pub fn component_logs(&self, name: &str) -> String {
        self.processes
            .iter()
            .filter(|p| p.name() == name)
            .map(Process::logs)
            .collect()
    }

    fn spawn(&mut self, name: &str, cmd: Command) -> Result<&Process, String> {
        let process = Process::spawn(name, cmd).map_err(|e| e.to_string())?;
        self.processes.push(process);
        Ok(self.processes.last().expect("just pushed"))
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("creating a config directory");
        }
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("writing {name}: {e}"));
        path
    }

    /// A kubeconfig for a component naming `server` and presenting `cert`/`key`.
    fn component_kubeconfig(&self, name: &str, server: &str, cert: &Path, key: &Path) -> PathBuf {
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server,
                "certificate-authority": self.pki.cluster_ca_file.display().to_string()}}],
            "users": [{"name": "u", "user": {
                "client-certificate": cert.display().to_string(),
                "client-key": key.display().to_string()}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        });
        self.file(&format!("{name}.kubeconfig"), &config.to_string())
    }

    async fn start_control_plane(&mut self) -> Result<(), String> {
        let b = self.binaries.control_plane.clone();
        let data = self.dir.path().join("etcd");
        let client = format!("http://{NODE_IP}:{ETCD_PORT}");
        let peer = format!("http://{NODE_IP}:{ETCD_PEER_PORT}");
        let mut etcd = Command::new(&b.etcd);
        etcd.arg("--data-dir").arg(&data).args([
            "--name",
            "default",
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("default={peer}"),
            "--listen-metrics-urls",
            "",
            // kube-apiserver 1.34+ serves a watch without a resourceVersion (and one from a
            // list's) from its watch cache only once the cache has caught up with etcd's current
            // revision, which it learns from a progress notification it asks etcd for
            // (RequestWatchProgress, etcd 3.5.13+). Debian's etcd 3.4 ignores the request, so a
            // cache of a quiet resource never catches up and such a watch fails after 3 s with
            // `Too large resource version` (504), directly as through any proxy; frequent
            // periodic notifications stand in for the requested ones.
            "--experimental-watch-progress-notify-interval",
            "250ms",
        ]);
        let etcd = self.spawn("etcd", etcd)?;
        if etcd
            .wait_for_line(
                |l| l.contains("ready to serve client requests"),
                READY_TIMEOUT,
            )
            .await
            .is_none()
        {
            return Err(format!("etcd did not start:\n{}", etcd.logs()));
        }

        self.start_kube_apiserver(NODE_IP, APISERVER_PORT, &[])
            .await?;
        let url = self.url.clone();
        self.start_controller_manager(&url, &[])?;
        self.start_scheduler(&url)
    }

    /// kube-apiserver on `bind:port` (with `extra` flags), as kubeadm configures it; waits for
    /// its `/readyz`.
    async fn start_kube_apiserver(
        &mut self,
        bind: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<(), String> {
        let p = &self.pki;
        let path = |p: &Path| p.display().to_string();
        let mut kas = Command::new(&self.binaries.control_plane.kube_apiserver);
        kas.args([
            "--etcd-servers",
            &self.etcd_url,
            "--secure-port",
            &port.to_string(),
            "--bind-address",
            bind,
            "--advertise-address",
            NODE_IP,
            "--tls-cert-file",
            &path(&p.apiserver_serving.cert),
            "--tls-private-key-file",
            &path(&p.apiserver_serving.key),
            "--client-ca-file",
            &path(&p.cluster_ca_file),
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--allow-privileged=true",
            "--service-cluster-ip-range",
            SERVICE_CIDR,
            "--service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file",
            &path(&p.service_account_pub),
            "--service-account-signing-key-file",
            &path(&p.service_account_key),
            "--kubelet-client-certificate",
            &path(&p.apiserver_kubelet_client.cert),
            "--kubelet-client-key",
            &path(&p.apiserver_kubelet_client.key),
            "--kubelet-preferred-address-types",
            "InternalIP,Hostname",
            "--requestheader-client-ca-file",
            &path(&p.front_proxy_ca_file),
            "--requestheader-allowed-names",
            FRONT_PROXY_CN,
            "--requestheader-username-headers",
            "X-Remote-User",
            "--requestheader-group-headers",
            "X-Remote-Group",
            "--requestheader-extra-headers-prefix",
            "X-Remote-Extra-",
            "--proxy-client-cert-file",
            &path(&p.front_proxy_client.cert),
            "--proxy-client-key-file",
            &path(&p.front_proxy_client.key),
        ])
        .args(extra);
        self.spawn("kube-apiserver", kas)?;
        self.wait_apiserver_ready(&format!("https://{bind}:{port}"))
            .await
    }

    /// kube-controller-manager on a kubeconfig naming `server`, without leader election, with
    /// `extra` flags.
    fn start_controller_manager(&mut self, server: &str, extra: &[&str]) -> Result<(), String> {
        let path = |p: &Path| p.display().to_string();
        let p = &self.pki;
        let kcm_config = self.component_kubeconfig(
            "controller-manager",
            server,
            &p.controller_manager.cert,
            &p.controller_manager.key,
        );
        let mut kcm = Command::new(&self.binaries.kube_controller_manager);
        kcm.arg("--kubeconfig")
            .arg(&kcm_config)
            .arg("--authentication-kubeconfig")
            .arg(&kcm_config)
            .arg("--authorization-kubeconfig")
            .arg(&kcm_config)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                "--service-account-private-key-file",
                &path(&p.service_account_key),
                "--root-ca-file",
                &path(&p.cluster_ca_file),
                "--cluster-signing-cert-file",
                &path(&p.cluster_ca_file),
                "--cluster-signing-key-file",
                &path(&self.ca_key_file()),
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--cluster-cidr",
                CLUSTER_CIDR,
                "--allocate-node-cidrs=false",
                "--controllers",
                "*,bootstrapsigner,tokencleaner",
            ])
            .args(extra);
        self.spawn("kube-controller-manager", kcm)?;
        Ok(())
    }

    /// kube-scheduler on a kubeconfig naming `server`, without leader election.
    fn start_scheduler(&mut self, server: &str) -> Result<(), String> {
        let p = &self.pki;
        let sched_config =
            self.component_kubeconfig("scheduler", server, &p.scheduler.cert, &p.scheduler.key);
        let mut sched = Command::new(&self.binaries.kube_scheduler);
        sched
            .arg("--kubeconfig")
            .arg(&sched_config)
            .arg("--authentication-kubeconfig")
            .arg(&sched_config)
            .arg("--authorization-kubeconfig")
            .arg(&sched_config)
            .args(["--bind-address", "127.0.0.1", "--leader-elect=false"]);
        self.spawn("kube-scheduler", sched)?;
        Ok(())
    }

    fn ca_key_file(&self) -> PathBuf {
        self.file("pki/ca.key", &self.pki.cluster_ca.key_pem())
    }

    async fn wait_apiserver_ready(&self, base: &str) -> Result<(), String> {
        let client = self.admin_client();
        let url = format!("{base}/readyz");
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
        Err(format!(
            "kube-apiserver's /readyz did not pass within {READY_TIMEOUT:?}: {last}\n{}",
            self.logs()
        ))
    }

    async fn start_containerd(&mut self, runc_wrapper: &Path) -> Result<(), String> {
        let root = self.dir.path().join("containerd");
        let cni_conf = self.dir.path().join("cni");
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{wrapper}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
"#,
            root = root.display(),
            socket = self.containerd.display(),
            wrapper = runc_wrapper.display(),
            cni_conf = cni_conf.display(),
        );
        let config = self.file("containerd/config.toml", &config);
        self.file(
            "cni/10-real-node.conflist",
            &serde_json::json!({
            "cniVersion": "1.0.0", "name": "real-node", "plugins": [
                {"type": "bridge", "bridge": host::BRIDGE, "isGateway": true, "ipMasq": true,
                 "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": self.dir.path().join("cni-ipam").display().to_string()}},
                {"type": "portmap", "capabilities": {"portMappings": true}},
                {"type": "loopback"}
            ]})
            .to_string(),
        );
        let mut containerd = Command::new(self.binaries.host("containerd"));
        containerd.arg("--config").arg(&config);
        // The wrapper finds the real runc here (containerd's shims inherit the environment).
        containerd.env("NODE_RUNC", self.binaries.host("runc"));
        self.spawn("containerd", containerd)?;
        let ctr = self.binaries.host("ctr").to_path_buf();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = Command::new(&ctr)
                .arg("--address")
                .arg(&self.containerd)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("containerd did not answer:\n{}", self.logs()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pause = self.binaries.pause.clone();
        self.import_image(&ImageSpec::binary(&pause, PAUSE_IMAGE, 65535, 65535))?;
        Ok(())
    }

    fn start_dns(&mut self) -> Result<(), String> {
        let dns_dir = self.dir.path().join("dns");
        std::fs::create_dir_all(&dns_dir).map_err(|e| e.to_string())?;
        let mut dnsmasq = Command::new(self.binaries.host("dnsmasq"));
        dnsmasq.args([
            "--keep-in-foreground",
            "--user=root",
            "--no-resolv",
            "--no-hosts",
            "--listen-address",
            NODE_IP,
            "--bind-interfaces",
            "--port",
            "53",
            "--local=/cluster.local/",
            "--pid-file=",
            "--log-facility=-",
        ]);
        dnsmasq.arg("--hostsdir").arg(&dns_dir);
        self.spawn("dnsmasq", dnsmasq)?;
        self.dns = tokio::spawn(dns::sync_services(
            self.admin_client(),
            self.url.clone(),
            dns_dir,
        ));
        Ok(())
    }

    /// The kubelet, logging in as `login` says.
    fn start_kubelet(&mut self, login: &KubeletLogin) -> Result<(), String> {
        let cert_dir = self.kubelet_cert_dir();
        // With a bootstrap kubeconfig the kubelet writes this file itself once its CSR is
        // signed, and uses an existing one instead of bootstrapping: remove what an earlier
        // start left.
        let written = self.dir.path().join("kubelet/kubeconfig");
        let (kubeconfig, bootstrap, rotate) = match login {
            KubeletLogin::Certificate {
                server,
                cert,
                key,
                rotate,
            } => (
                self.component_kubeconfig("kubelet", server, cert, key),
                None,
                *rotate,
            ),
            KubeletLogin::Bootstrap { server, token } => {
                let _ = std::fs::remove_file(&written);
                let _ = std::fs::remove_dir_all(&cert_dir);
                let config = serde_json::json!({
                    "apiVersion": "v1", "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": server,
                        "certificate-authority": self.pki.cluster_ca_file.display().to_string()}}],
                    "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "kubelet-bootstrap"}}],
                    "current-context": "c",
                });
                let file = self.file("kubelet/bootstrap.kubeconfig", &config.to_string());
                (written, Some(file), true)
            }
        };
        let p = &self.pki;
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: Webhook}}
tlsCertFile: "{cert}"
tlsPrivateKeyFile: "{key}"
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{socket}
failSwapOn: false
failCgroupV1: false
clusterDNS: [{NODE_IP}]
clusterDomain: cluster.local
podCIDR: {POD_CIDR}
maxPods: 60
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: {rotate}
"#,
            ca = p.cluster_ca_file.display(),
            cert = p.kubelet_serving.cert.display(),
            key = p.kubelet_serving.key.display(),
            socket = self.containerd.display(),
        );
        let config = self.file("kubelet/config.yaml", &config);
        let mut kubelet = Command::new(&self.binaries.kubelet);
        kubelet
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cert-dir")
            .arg(&cert_dir)
            .arg("--root-dir")
            .arg(self.dir.path().join("kubelet/root"))
            .args(["--hostname-override", NODE_NAME, "--node-ip", NODE_IP]);
        if let Some(bootstrap) = bootstrap {
            kubelet.arg("--bootstrap-kubeconfig").arg(bootstrap);
        }
        self.spawn("kubelet", kubelet)?;
        Ok(())
    }

    /// The kubelet's client certificates once it has its own: `kubelet-client-current.pem`
    /// (certificate and key), the newest of those it rotated through.
    pub fn kubelet_cert_dir(&self) -> PathBuf {
        self.dir.path().join("kubelet/pki")
    }

    /// kube-proxy on a kubeconfig naming `server`.
    fn start_proxy(&mut self, server: &str) -> Result<(), String> {
        let p = &self.pki;
        let proxy_kubeconfig =
            self.component_kubeconfig("proxy", server, &p.proxy.cert, &p.proxy.key);
        let proxy_config = format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}"}}
mode: iptables
clusterCIDR: {CLUSTER_CIDR}
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#,
            kubeconfig = proxy_kubeconfig.display()
        );
        let proxy_config = self.file("proxy.yaml", &proxy_config);
        let mut proxy = Command::new(&self.binaries.kube_proxy);
        proxy.arg("--config").arg(&proxy_config);
        self.spawn("kube-proxy", proxy)?;
        Ok(())
    }

    async fn wait_node_ready(&self) -> Result<(), String> {
        let client = self.admin_client();
        let url = format!("{}/api/v1/nodes/{NODE_NAME}", self.url);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok((StatusCode::OK, _, body)) = get(&client, &url).await {
                let node: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if ready {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!(
            "node {NODE_NAME} not Ready within {READY_TIMEOUT:?}:\n{}",
            self.logs()
        ))
    }

    /// Stops every Pod container through containerd: their shims outlive containerd itself.
    fn stop_pods(&self) {
        let ctr = self.binaries.host("ctr");
        let ctr = |args: &[&str]| {
            Command::new(ctr)
                .arg("--address")
                .arg(&self.containerd)
                .args(["-n", "k8s.io"])
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let tasks = ctr(&["tasks", "ls", "-q"]);
        for task in tasks.lines() {
            ctr(&["tasks", "kill", "-s", "KILL", task]);
        }
        std::thread::sleep(Duration::from_secs(1));
        for task in tasks.lines() {
            ctr(&["tasks", "delete", task]);
        }
        for container in ctr(&["containers", "ls", "-q"]).lines() {
            ctr(&["containers", "delete", container]);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.dns.abort();
        // The kubelet first, so it restarts nothing while the containers go.
        for name in ["kube-proxy", "kubelet"] {
            if let Some(p) = self.processes.iter_mut().find(|p| p.name() == name) {
                p.kill();
            }
        }
        self.stop_pods();
        while let Some(mut process) = self.processes.pop() {
            process.kill();
        }
        // Volumes the kubelet mounted (Secrets, projected tokens) and the containers' rootfs.
        let dir = self.dir.path().display().to_string();
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            let mut ours: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|m| m.starts_with(&dir))
                .collect();
            ours.sort_unstable_by_key(|m| std::cmp::Reverse(m.len()));
            for mount in ours {
                let _ = host::run("umount", &["-l", mount]);
            }
        }
        drop(self.host.take());
        if std::thread::panicking() {
            eprintln!("real node: logs are in memory only; the test's failure message has them");
        }
    }
}
