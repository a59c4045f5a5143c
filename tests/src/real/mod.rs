//! A real control plane for the suite's `real_control_plane` area
//! (`tests/suite/real_control_plane/`): etcd, a real kube-apiserver and k8s.io/sample-apiserver
//! (the `wardle.example.com` flunders server of Kubernetes' own aggregator conformance test),
//! started on 127.0.0.1 the way `envtest` starts them, so the gateway is checked against the
//! servers users put it in front of, with kube-apiserver's own aggregator as the oracle.
//!
//! The binaries never go into this repository. They are found as controller-runtime's envtest
//! finds them: `KUBEBUILDER_ASSETS` names a directory holding `kube-apiserver` and `etcd`, and
//! `SAMPLE_APISERVER` names the `sample-apiserver` binary ([`RealBinaries::from_env`]). Without
//! them every test of the suite prints that it skipped, and why, and passes: CI runs the fixture
//! suite only.
//!
//! - [`ports`]: fixed ports below the kernel's ephemeral range, for binaries that cannot listen
//!   on port 0 and announce it;
//! - [`pki`]: the cluster's CAs, certificates, tokens and service-account key;
//! - [`control_plane`]: etcd and kube-apiserver, with the flags aggregation needs;
//! - [`sample_apiserver`]: sample-apiserver with delegated authentication and authorization,
//!   its ServiceAccount token from the TokenRequest API, upstream's example RBAC, and the
//!   `wardle/api` Service that both aggregators resolve to it.

pub mod control_plane;
pub mod pki;
pub mod ports;
pub mod sample_apiserver;

use std::path::{Path, PathBuf};

pub use control_plane::ControlPlane;
pub use pki::RealPki;
pub use sample_apiserver::SampleApiserver;

/// The variable naming the directory with `kube-apiserver` and `etcd` (envtest's convention).
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// The variable naming the `sample-apiserver` binary.
pub const SAMPLE_APISERVER_ENV: &str = "SAMPLE_APISERVER";

/// The real binaries a run of the suite needs.
#[derive(Clone, Debug)]
pub struct RealBinaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub sample_apiserver: PathBuf,
}

/// The kubectl of the release under test: `kubectl` beside `kube-apiserver` in
/// `KUBEBUILDER_ASSETS`, as envtest's assets carry it (`build-real-control-plane` builds the
/// release's own), else `None` for the dispatcher's (which knows releases up to 1.33 only, and
/// would drive a 1.34+ server with an older client and a skew warning).
pub fn release_kubectl() -> Option<PathBuf> {
    let assets = std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty())?;
    executable(&Path::new(&assets).join("kubectl"), ASSETS_ENV).ok()
}

impl RealBinaries {
    /// The binaries named by the environment, or why the suite cannot run.
    pub fn from_env() -> Result<RealBinaries, String> {
        let assets = std::env::var_os(ASSETS_ENV)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{ASSETS_ENV} is not set"))?;
        let assets = PathBuf::from(assets);
        let sample = std::env::var_os(SAMPLE_APISERVER_ENV)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{SAMPLE_APISERVER_ENV} is not set"))?;
        Ok(RealBinaries {
            etcd: executable(&assets.join("etcd"), ASSETS_ENV)?,
            kube_apiserver: executable(&assets.join("kube-apiserver"), ASSETS_ENV)?,
            sample_apiserver: executable(Path::new(&sample), SAMPLE_APISERVER_ENV)?,
        })
    }

    /// The binaries, or `None` after printing that `test` skipped and why (a skipped test passes,
    /// so the notice is the only trace: it goes to stderr, which `cargo test` shows with
    /// `--nocapture` and always prints for the whole binary at the end of a failing run).
    pub fn or_skip(test: &str) -> Option<RealBinaries> {
        match RealBinaries::from_env() {
            Ok(binaries) => Some(binaries),
            Err(why) => {
                eprintln!(
                    "SKIPPED {test}: {why}. The real-control-plane suite needs {ASSETS_ENV}=<dir with \
                     kube-apiserver and etcd> and {SAMPLE_APISERVER_ENV}=<sample-apiserver binary> \
                     (README: \"Against a real kube-apiserver\")."
                );
                None
            }
        }
    }
}

pub(crate) fn executable(path: &Path, variable: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {
            Ok(path.to_path_buf())
        }
        Ok(_) => Err(format!(
            "{} (from {variable}) is not an executable file",
            path.display()
        )),
        Err(e) => Err(format!("{} (from {variable}): {e}", path.display())),
    }
}
