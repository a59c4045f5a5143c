//! Step 2, clients: the core server's client (with the proxy client certificate it presents for
//! certificate users; the controllers follow its rotations), the kube client that rides on its
//! transport, and the authenticator (TokenReview and SubjectAccessReview on the core, client CAs
//! watched).

use std::sync::Arc;
use std::time::Duration;

use gateway_config::{AuthnConfig, AuthzConfig, CoreConfig};
use tokio::sync::watch;

use super::tls::ProxyIdentityReload;
use super::StartError;
use crate::auth::Authenticator;
use crate::backend::core::CoreBackend;
use crate::backend::kube_client;

pub struct Clients {
    pub core: Arc<CoreBackend>,
    pub authenticator: Arc<Authenticator>,
    /// The client CA files' watcher; dropping it stops their reloads.
    _ca_watch: Option<notify::RecommendedWatcher>,
}

impl Clients {
    pub async fn start(
        (core, authn, authz, cert_reload_interval): (
            &CoreConfig,
            &AuthnConfig,
            &AuthzConfig,
            Duration,
        ),
        proxy_identity: &ProxyIdentityReload,
        metrics: &crate::metrics::Metrics,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, StartError> {
        // The core gets the proxy client certificate too: certificate users reach it as
        // X-Remote-*. One reloading source feeds the core and every remote backend; the loop
        // that follows its rotations runs with the controllers.
        let first = proxy_identity.receiver().borrow().clone();
        let core = Arc::new(CoreBackend::new(core, first.as_deref(), drain).await?);
        let started = crate::auth::start(
            (authn, authz),
            cert_reload_interval,
            kube_client::client(core.clone()),
            metrics.registry(),
        )?;
        // The authentication file is followed for the life of the process, as kube does.
        if let Some(jwt) = started.jwt {
            tokio::spawn(jwt.follow_file());
        }
        Ok(Self {
            core,
            authenticator: started.authenticator,
            _ca_watch: started.ca_watch,
        })
    }

    /// A kube-rs client on the core backend's transport, with the gateway's own credentials.
    pub fn kube(&self) -> kube::Client {
        kube_client::client(self.core.clone())
    }
}
