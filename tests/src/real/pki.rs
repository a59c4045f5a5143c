//! The certificates, tokens and keys of one real control plane, written into its own directory.
//!
//! The layout is a kubeadm cluster's: a cluster CA that signs kube-apiserver's serving
//! certificate and users' client certificates, a separate front-proxy CA that signs the proxy
//! client certificates aggregators present to aggregated servers, a service-account signing key,
//! and a token file with an admin and an unprivileged user. sample-apiserver's serving
//! certificate comes from a CA of its own, named in the APIService's `caBundle`.

use std::path::{Path, PathBuf};

use crate::certs::{CertifiedPair, TestCa};

/// The bearer token of `admin` (group `system:masters`) in kube-apiserver's token file.
pub const ADMIN_TOKEN: &str = "real-e2e-admin-token";
/// The bearer token of `alice`, a user no RBAC rule names (only `system:authenticated`).
pub const ALICE_TOKEN: &str = "real-e2e-alice-token";
/// The common name of kube-apiserver's own proxy client certificate (`--proxy-client-cert-file`).
pub const APISERVER_PROXY_CN: &str = "front-proxy-client";
/// The common name of the gateway's proxy client certificate; in `--requestheader-allowed-names`.
pub const GATEWAY_PROXY_CN: &str = "aggregation-gateway";

/// Everything the processes of one control plane read from files.
pub struct RealPki {
    dir: tempfile::TempDir,
    /// Signs kube-apiserver's serving certificate and users' client certificates.
    pub cluster_ca: TestCa,
    pub cluster_ca_file: PathBuf,
    pub apiserver_serving: (PathBuf, PathBuf),
    /// `admin` in `system:masters`, as a client certificate (the gateway's identity on the core).
    pub admin: CertifiedPair,
    pub admin_files: (PathBuf, PathBuf),
    /// kube-apiserver's `--requestheader-client-ca-file`.
    pub front_proxy_ca: TestCa,
    pub front_proxy_ca_file: PathBuf,
    /// kube-apiserver's `--proxy-client-cert-file`/`--proxy-client-key-file`.
    pub apiserver_proxy_client: (PathBuf, PathBuf),
    /// The gateway's proxy client certificate from the front-proxy CA, CN [`GATEWAY_PROXY_CN`].
    pub gateway_proxy_client: (PathBuf, PathBuf),
    /// Signs sample-apiserver's serving certificate (`api.wardle.svc`); the APIService's caBundle.
    pub wardle_ca: TestCa,
    pub wardle_serving: (PathBuf, PathBuf),
    /// The service-account signing key (private) and its public half.
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
    /// kube-apiserver's `--token-auth-file`.
    pub token_file: PathBuf,
}

impl std::fmt::Debug for RealPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl RealPki {
    /// Issues everything into a fresh temporary directory.
    ///
    /// # Panics
    /// If the directory cannot be written.
    pub fn new() -> RealPki {
        let dir = tempfile::Builder::new()
            .prefix("real-control-plane-")
            .tempdir()
            .expect("creating the control plane's directory");
        let at = dir.path();
        let cluster_ca = TestCa::new("real-e2e-cluster-ca");
        let cluster_ca_file = cluster_ca.write(at, "ca.crt").unwrap();
        let apiserver_serving = cluster_ca
            .issue_server(&[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "localhost",
                "127.0.0.1",
                "10.0.0.1",
            ])
            .write(at, "apiserver")
            .unwrap();
        let admin = cluster_ca.issue_client("admin", &["system:masters"]);
        let admin_files = admin.write(at, "admin").unwrap();

        let front_proxy_ca = TestCa::new("real-e2e-front-proxy-ca");
        let front_proxy_ca_file = front_proxy_ca.write(at, "front-proxy-ca.crt").unwrap();
        let apiserver_proxy_client = front_proxy_ca
            .issue_client(APISERVER_PROXY_CN, &[])
            .write(at, "front-proxy-client")
            .unwrap();
        let gateway_proxy_client = front_proxy_ca
            .issue_client(GATEWAY_PROXY_CN, &[])
            .write(at, "gateway-proxy-client")
            .unwrap();

        let wardle_ca = TestCa::new("real-e2e-wardle-ca");
        let wardle_serving = wardle_ca
            .issue_server(&["api.wardle.svc", "localhost", "127.0.0.1"])
            .write(at, "wardle-serving")
            .unwrap();

        let key = rcgen::KeyPair::generate().expect("generating the service-account key");
        let service_account_key = at.join("sa.key");
        let service_account_pub = at.join("sa.pub");
        std::fs::write(&service_account_key, key.serialize_pem()).unwrap();
        std::fs::write(&service_account_pub, key.public_key_pem()).unwrap();

        // token,user,uid,"group1,group2"
        let token_file = at.join("tokens.csv");
        std::fs::write(
            &token_file,
            format!(
                "{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n{ALICE_TOKEN},alice,alice-uid\n"
            ),
        )
        .unwrap();

        RealPki {
            dir,
            cluster_ca,
            cluster_ca_file,
            apiserver_serving,
            admin,
            admin_files,
            front_proxy_ca,
            front_proxy_ca_file,
            apiserver_proxy_client,
            gateway_proxy_client,
            wardle_ca,
            wardle_serving,
            service_account_key,
            service_account_pub,
            token_file,
        }
    }

    /// The control plane's directory (removed with the `RealPki`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to `name` in the control plane's directory.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let file = self.dir.path().join(name);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&file, contents).unwrap_or_else(|e| panic!("writing {name}: {e}"));
        file
    }
}

impl Default for RealPki {
    fn default() -> RealPki {
        RealPki::new()
    }
}
