//! A real one-node Kubernetes cluster on this machine, for the suite's `real_node` area
//! (`tests/suite/real_node/`): the gateway's image runs in Pods, installed by its Helm chart the
//! way users install it, and Kubernetes' own e2e tests run through it.
//!
//! The cluster is the real control plane of [`crate::real`] plus a node: kube-controller-manager,
//! kube-scheduler, kubelet and kube-proxy (iptables mode) of the same release, containerd and
//! runc from the distribution, the CNI bridge plugin, and dnsmasq as cluster DNS. Nothing of it is
//! in this repository; the binaries are found the way envtest finds its own:
//!
//! - `KUBEBUILDER_ASSETS`: a directory with `kube-apiserver` and `etcd`;
//! - `SAMPLE_APISERVER`: the `sample-apiserver` binary;
//! - `REAL_NODE_BIN`: a directory with `kubelet`, `kube-proxy`, `kube-scheduler`,
//!   `kube-controller-manager` and a static `pause`;
//! - `E2E_TEST` (optional): Kubernetes' `e2e.test`; without it the upstream tests are skipped.
//!
//! The host side (root, `containerd`, `ctr`, `runc`, the CNI plugins, `dnsmasq`, `iptables`) is
//! checked too, and anything missing makes every test print `SKIPPED ...` and pass.
//!
//! - [`pki`]: the cluster's CAs and every component's certificate;
//! - [`host`]: the node's address, forwarding and the rule that keeps Pod traffic on the machine,
//!   all undone on drop;
//! - [`cluster`]: the processes, in start order, and their teardown;
//! - [`dns`]: cluster DNS records kept in step with the Services;
//! - [`image`]: OCI images built from host binaries and imported into containerd (nothing can be
//!   pulled here), the gateway's from the content the Dockerfile describes;
//! - [`pod_start`]: Pod start latency, create → Running;
//! - [`conformance_images`]: the images Kubernetes' conformance specs run, under the names the
//!   given `e2e.test` asks for.

pub mod cluster;
pub mod conformance_images;
pub mod dns;
pub mod host;
pub mod image;
pub mod pki;
pub mod pod_start;

use std::path::{Path, PathBuf};

pub use cluster::Cluster;

use crate::real::{executable, RealBinaries, ASSETS_ENV, SAMPLE_APISERVER_ENV};

/// The variable naming the directory with the node's binaries.
pub const NODE_BIN_ENV: &str = "REAL_NODE_BIN";
/// The variable naming Kubernetes' `e2e.test` binary (optional).
pub const E2E_TEST_ENV: &str = "E2E_TEST";

/// Host programs the node needs, with the Debian package that has each.
const HOST_PROGRAMS: [(&str, &str); 6] = [
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("dnsmasq", "dnsmasq-base"),
    ("iptables", "iptables"),
    ("ip", "iproute2"),
];
/// Where Debian's containernetworking-plugins puts the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Every binary a run of the real-node suite needs.
#[derive(Clone, Debug)]
pub struct NodeBinaries {
    pub control_plane: RealBinaries,
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub pause: PathBuf,
    /// Host programs by name (`containerd`, `ctr`, `runc`, ...), resolved on PATH.
    pub host: Vec<(&'static str, PathBuf)>,
    /// `e2e.test`, when `E2E_TEST` names it.
    pub e2e_test: Option<PathBuf>,
}

impl NodeBinaries {
    /// The binaries named by the environment and found on the host, or why the suite cannot run.
    pub fn from_env() -> Result<NodeBinaries, String> {
        let control_plane = RealBinaries::from_env()?;
        let dir = std::env::var_os(NODE_BIN_ENV)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{NODE_BIN_ENV} is not set"))?;
        let dir = PathBuf::from(dir);
        let in_dir = |name: &str| executable(&dir.join(name), NODE_BIN_ENV);
        // SAFETY of the check: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("the node needs root (network namespaces, iptables, mounts)".into());
        }
        let mut host = Vec::new();
        for (program, package) in HOST_PROGRAMS {
            let found = which(program)
                .ok_or_else(|| format!("`{program}` is not on PATH (Debian package {package})"))?;
            host.push((program, found));
        }
        if !Path::new(CNI_BIN_DIR).join("bridge").is_file() {
            return Err(format!(
                "{CNI_BIN_DIR}/bridge is missing (Debian package containernetworking-plugins)"
            ));
        }
        let e2e_test = match std::env::var_os(E2E_TEST_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Some(executable(Path::new(&path), E2E_TEST_ENV)?),
            None => None,
        };
        Ok(NodeBinaries {
            control_plane,
            kubelet: in_dir("kubelet")?,
            kube_proxy: in_dir("kube-proxy")?,
            kube_scheduler: in_dir("kube-scheduler")?,
            kube_controller_manager: in_dir("kube-controller-manager")?,
            pause: in_dir("pause")?,
            host,
            e2e_test,
        })
    }

    /// The binaries, or `None` after printing that `test` skipped and why (see
    /// [`RealBinaries::or_skip`]).
    pub fn or_skip(test: &str) -> Option<NodeBinaries> {
        match NodeBinaries::from_env() {
            Ok(binaries) => Some(binaries),
            Err(why) => {
                eprintln!(
                    "SKIPPED {test}: {why}. The real-node suite needs, as root, {ASSETS_ENV}=<dir with \
                     kube-apiserver and etcd>, {SAMPLE_APISERVER_ENV}=<sample-apiserver binary>, \
                     {NODE_BIN_ENV}=<dir with kubelet, kube-proxy, kube-scheduler, \
                     kube-controller-manager and pause>, optionally {E2E_TEST_ENV}=<e2e.test>, and \
                     containerd, runc, the CNI plugins and dnsmasq installed (README: \"On a real node\")."
                );
                None
            }
        }
    }

    /// A host program found on PATH at start.
    pub fn host(&self, program: &str) -> &Path {
        self.host
            .iter()
            .find(|(name, _)| *name == program)
            .map(|(_, path)| path.as_path())
            .unwrap_or_else(|| panic!("{program} was not looked up"))
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate, "PATH").is_ok())
}
