//! Keeps `kube-system/extension-apiserver-authentication` on the core saying whom aggregated
//! servers must trust for the gateway: kube-apiserver's cluster-authentication-trust controller
//! (`pkg/controlplane/controller/clusterauthenticationtrust`), for the gateway's certificates.
//!
//! Why: every k8s.io/apiserver-based server (sample-apiserver, metrics-server, custom-metrics
//! adapters) reads that ConfigMap to decide which client certificates to believe and which front
//! proxy may send `X-Remote-*` identity. A gateway whose proxy client certificate is not in there
//! is anonymous to every real backend, and a core that is not kube-apiserver publishes nothing at
//! all, so its backends cannot start. kube-apiserver writes its own entries; the gateway adds its
//! client CA, its proxy client certificate's CA and common name and the headers it sets, as a
//! union ([`merge`]): another writer's entries are never dropped, and a write carries the
//! resourceVersion it was computed from, so a concurrent writer's update is read again rather
//! than overwritten.
//!
//! One key, one shape (`workqueue.rs`): the ConfigMap is reconciled when it changes on the core
//! (a watch on that one object, so another writer removing our entries is answered at once), when
//! the proxy client certificate or the client CA file is reloaded, and every minute (upstream's
//! resync); failures back off from 500 ms to 1 min.

mod merge;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{watcher, WatchStreamExt};

use apiservice::outage::Outage;
use gateway_config::tls::Identity;
pub use merge::{merged, GatewayTrust};

use crate::auth::x509::leaf_common_name;
use crate::control::apiservices::ProxyIdentity;
use crate::workqueue::{Backoff, Next, WorkQueue};

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";
/// Who the writes are from, in `managedFields`.
pub const FIELD_MANAGER: &str = "aggregation-gateway";
/// Upstream re-checks the ConfigMap every minute.
const RESYNC: Duration = Duration::from_secs(60);
const BACKOFF: Backoff = Backoff {
    min: Duration::from_millis(500),
    max: Duration::from_secs(60),
};

/// Where the gateway's trust material comes from; re-read on every reconcile, so reloads of the
/// files and of the proxy client certificate are published.
#[derive(Clone)]
pub struct TrustSources {
    /// `--client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
    /// `--proxy-client-ca-file`; without it, the certificates after the leaf in
    /// `--proxy-client-cert-file`.
    pub proxy_client_ca_file: Option<PathBuf>,
    pub proxy_identity: ProxyIdentity,
}

impl TrustSources {
    /// What the gateway publishes right now.
    pub fn current(&self) -> Result<GatewayTrust, TrustError> {
        let load = |path: &PathBuf| {
            gateway_config::tls::load_certs(path).map_err(|e| TrustError::Read(e.to_string()))
        };
        let client_ca = self.client_ca_file.as_ref().map(load).transpose()?;
        let identity: Option<Arc<Identity>> = self.proxy_identity.borrow().clone();
        let proxy_ca = match (&self.proxy_client_ca_file, &identity) {
            (Some(file), _) => load(file)?,
            (None, Some(identity)) => identity.certs.iter().skip(1).cloned().collect(),
            (None, None) => Vec::new(),
        };
        // The name Go backends check against requestheader-allowed-names: the last of several
        // CNs, as authentication here reads it too.
        let proxy_cn = identity
            .as_ref()
            .and_then(|i| i.certs.first())
            .and_then(|leaf| leaf_common_name(leaf.as_ref()));
        Ok(GatewayTrust {
            client_ca: client_ca.unwrap_or_default(),
            proxy_ca,
            proxy_cn,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading the gateway's certificates: {0}")]
    Read(String),
    #[error("{verb} configmap {NAMESPACE}/{NAME} on the core: {source}")]
    Core {
        verb: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// What a reconcile did.
#[derive(Debug, PartialEq, Eq)]
enum Written {
    Nothing,
    Created,
    Updated,
}

/// Runs the controller until the process ends.
pub async fn run(kube: kube::Client, mut sources: TrustSources) {
    let api: Api<ConfigMap> = Api::namespaced(kube, NAMESPACE);
    let mut queue: WorkQueue<(), Result<Written, TrustError>> = WorkQueue::new(|_| BACKOFF);
    let files: Vec<PathBuf> = sources
        .client_ca_file
        .iter()
        .chain(sources.proxy_client_ca_file.iter())
        .cloned()
        .collect();
    let _file_watch = {
        let queue = queue.queue().clone();
        gateway_config::tls::watch_files(&files, RESYNC, move || queue.add(()))
            .map_err(|e| tracing::warn!(error = %e, "not watching the CA files; the minute's resync picks up changes"))
            .ok()
    };
    let watch_config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    // With a backoff, like every other watcher here: without one a watch the core refuses
    // (403 without RBAC on the ConfigMap, a body that does not decode) is retried at once, in a
    // loop that keeps a CPU busy and floods the core.
    let mut changes = watcher(api.clone(), watch_config).default_backoff().boxed();
    // The reconciles say whether the core answers; the watch's own errors are retried by the
    // watcher, and the resync covers the gap.
    let outage = Outage::new(
        "authentication ConfigMap update",
        "aggregated servers keep the trust last published",
    );
    queue.queue().add(());
    loop {
        tokio::select! {
            event = changes.next() => match event {
                Some(Ok(_)) => queue.queue().add(()),
                // The watcher retries on its own; the resync covers the gap.
                Some(Err(e)) => tracing::debug!(error = %e, "watching the configmap"),
                None => return,
            },
            changed = sources.proxy_identity.changed() => {
                if changed.is_ok() {
                    queue.queue().add(());
                }
            }
            next = queue.next() => match next {
                Next::Ready(key) => {
                    let sources = sources.clone();
                    let api = api.clone();
                    queue.start(key, async move { reconcile(&api, &sources).await });
                }
                Next::Done(key, outcome) => match outcome {
                    Ok(written) => {
                        outage.answered();
                        if written != Written::Nothing {
                            tracing::info!(?written, configmap = %format!("{NAMESPACE}/{NAME}"), "published the gateway's client CA and proxy identity");
                        }
                        queue.resync(key, Some(RESYNC));
                    }
                    Err(e) => {
                        outage.failed(&e);
                        queue.retry(key);
                    }
                },
            },
        }
    }
}

/// Whether [`run`] has anything to publish; says so once when it has not.
pub fn has_anything_to_publish(sources: &TrustSources) -> bool {
    match sources.current() {
        Ok(trust) if trust.is_empty() => {
            tracing::info!("no client CA and no proxy client CA to publish in {NAMESPACE}/{NAME}");
            false
        }
        _ => true,
    }
}

async fn reconcile(api: &Api<ConfigMap>, sources: &TrustSources) -> Result<Written, TrustError> {
    let ours = sources.current()?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let current = api.get_opt(NAME).await.map_err(|source| TrustError::Core {
        verb: "reading",
        source,
    })?;
    match current {
        None => {
            let Some(data) = merged(&BTreeMap::new(), &ours, SystemTime::now()) else {
                return Ok(Written::Nothing);
            };
            let object = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(NAME.to_owned()),
                    namespace: Some(NAMESPACE.to_owned()),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            api.create(&params, &object)
                .await
                .map_err(|source| TrustError::Core {
                    verb: "creating",
                    source,
                })?;
            Ok(Written::Created)
        }
        Some(mut object) => {
            let data = object.data.clone().unwrap_or_default();
            let Some(next) = merged(&data, &ours, SystemTime::now()) else {
                return Ok(Written::Nothing);
            };
            object.data = Some(next);
            // The object keeps its resourceVersion: a concurrent write makes this a 409, and the
            // retry merges into what that writer wrote.
            api.replace(NAME, &params, &object)
                .await
                .map_err(|source| TrustError::Core {
                    verb: "updating",
                    source,
                })?;
            Ok(Written::Updated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::x509::tests::Ca;

    /// Issue 26, finding 8: the published name was the proxy certificate's first CN, while Go
    /// backends (and the gateway's own authentication) read the last.
    #[test]
    fn the_proxy_name_published_is_the_last_common_name_as_go_reads_it() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let leaf = Ca::new("front-proxy").client_named(&["first", "aggregator"]);
        let identity = Identity {
            certs: leaf,
            key: rustls::pki_types::PrivateKeyDer::Pkcs8(vec![0u8; 16].into()),
        };
        let (_tx, proxy_identity) = tokio::sync::watch::channel(Some(Arc::new(identity)));
        let sources = TrustSources {
            client_ca_file: None,
            proxy_client_ca_file: None,
            proxy_identity,
        };
        let trust = sources.current().unwrap();
        assert_eq!(trust.proxy_cn.as_deref(), Some("aggregator"));
    }
}
