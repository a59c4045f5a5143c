//! The node cluster's certificates, laid out as kubeadm lays out a cluster's: a cluster CA for
//! kube-apiserver's serving certificate and every component's client certificate, a front-proxy
//! CA whose `front-proxy-client` kube-apiserver presents to aggregated servers (and the gateway's
//! Pods present too, from a Secret), the kubelet's serving certificate, and the service-account
//! signing key. Written once into the cluster's directory.

use std::path::{Path, PathBuf};

use crate::certs::{CertifiedPair, TestCa};

/// The node's address: an alias on `lo`, so nothing listens on a real interface.
pub const NODE_IP: &str = "10.200.0.1";
/// The node's name.
pub const NODE_NAME: &str = "realnode";
/// The ClusterIP of `default/kubernetes` (first of the Service range).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The common name kube-apiserver accepts on request-header client certificates.
pub const FRONT_PROXY_CN: &str = "front-proxy-client";

/// A certificate and key written to files.
#[derive(Clone, Debug)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub pair: CertifiedPair,
}

/// Everything the cluster's processes read from files.
pub struct NodePki {
    pub cluster_ca: TestCa,
    pub cluster_ca_file: PathBuf,
    pub front_proxy_ca: TestCa,
    pub front_proxy_ca_file: PathBuf,
    pub apiserver_serving: Files,
    /// `admin` in `system:masters`.
    pub admin: Files,
    /// kube-apiserver's client certificate towards kubelets (exec, logs, port-forward).
    pub apiserver_kubelet_client: Files,
    pub controller_manager: Files,
    pub scheduler: Files,
    pub proxy: Files,
    /// `system:node:<name>` in `system:nodes`, for the Node authorizer.
    pub kubelet_client: Files,
    pub kubelet_serving: Files,
    /// kube-apiserver's `--proxy-client-cert-file`, and the gateway's proxy client certificate.
    pub front_proxy_client: Files,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

impl NodePki {
    /// Issues everything into `dir`.
    ///
    /// # Panics
    /// If `dir` cannot be written.
    pub fn new(dir: &Path) -> NodePki {
        std::fs::create_dir_all(dir).expect("creating the PKI directory");
        let write = |pair: CertifiedPair, stem: &str| {
            let (cert, key) = pair.write(dir, stem).expect("writing a certificate");
            Files { cert, key, pair }
        };
        let cluster_ca = TestCa::new("real-node-ca");
        let cluster_ca_file = cluster_ca.write(dir, "ca.crt").unwrap();
        let front_proxy_ca = TestCa::new("real-node-front-proxy-ca");
        let front_proxy_ca_file = front_proxy_ca.write(dir, "front-proxy-ca.crt").unwrap();
        let client = |cn: &str, groups: &[&str], stem: &str| {
            write(cluster_ca.issue_client(cn, groups), stem)
        };
        let apiserver_serving = write(
            cluster_ca.issue_server(&[
                NODE_IP,
                "127.0.0.1",
                KUBERNETES_SERVICE_IP,
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]),
            "apiserver",
        );
        let key = rcgen::KeyPair::generate().expect("generating the service-account key");
        let service_account_key = dir.join("sa.key");
        let service_account_pub = dir.join("sa.pub");
        std::fs::write(&service_account_key, key.serialize_pem()).unwrap();
        std::fs::write(&service_account_pub, key.public_key_pem()).unwrap();
        NodePki {
            admin: client("admin", &["system:masters"], "admin"),
            apiserver_kubelet_client: client(
                "kube-apiserver-kubelet-client",
                &["system:masters"],
                "apiserver-kubelet-client",
            ),
            controller_manager: client("system:kube-controller-manager", &[], "controller-manager"),
            scheduler: client("system:kube-scheduler", &[], "scheduler"),
            proxy: client("system:kube-proxy", &[], "proxy"),
            kubelet_client: client(
                &format!("system:node:{NODE_NAME}"),
                &["system:nodes"],
                "kubelet-client",
            ),
            kubelet_serving: write(cluster_ca.issue_server(&[NODE_IP, NODE_NAME]), "kubelet"),
            front_proxy_client: write(
                front_proxy_ca.issue_client(FRONT_PROXY_CN, &[]),
                "front-proxy-client",
            ),
            apiserver_serving,
            cluster_ca,
            cluster_ca_file,
            front_proxy_ca,
            front_proxy_ca_file,
            service_account_key,
            service_account_pub,
        }
    }
}
