//! Step 1, configuration: the TLS material the gateway serves with and presents to backends,
//! loaded once and kept current when its files change, and the listening socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::tls::{self, Identity, ServerTlsSettings, ServingIdentity};
use gateway_config::{AuthnConfig, CertKeyPair, ServingConfig};
use rustls::pki_types::CertificateDer;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::StartError;
use crate::control::apiservices::ProxyIdentity;
use crate::metrics::Metrics;

/// The `certificate` label of the expiry metric for the serving certificate and for the proxy
/// client certificate.
const SERVING: &str = "serving";
const PROXY_CLIENT: &str = "proxy-client";

/// The serving TLS configuration new connections take, reloaded when its files (certificate,
/// key, client CAs) change. Dropping it stops the reloads.
pub struct ServingTls {
    current: Arc<ArcSwap<ServerConfig>>,
    cert: ServingIdentity,
    generated: bool,
    serial: String,
    not_after: String,
    _watcher: notify::RecommendedWatcher,
}

// === impl ServingTls ===

impl ServingTls {
    /// Loads (or generates) the serving certificate and the client CAs, and watches their files.
    pub fn start(
        serving: &ServingConfig,
        authn: &AuthnConfig,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, StartError> {
        let (cert, generated) = tls::ensure_serving_cert(serving)?;
        let mut client_ca_files = Vec::new();
        client_ca_files.extend(authn.client_ca_file.clone());
        client_ca_files.extend(authn.requestheader_client_ca_file.clone());
        let settings = ServerTlsSettings {
            serving: cert.clone(),
            client_ca_files,
            tls13_only: serving.tls13_only,
            cipher_suites: serving.cipher_suites.clone(),
        };
        let (first, chain) = settings.build()?;
        let (serial, not_after) = describe_leaf(&chain);
        record_expiry(metrics, SERVING, &chain);
        let current = Arc::new(ArcSwap::new(first));
        let watcher =
            {
                let current = current.clone();
                let metrics = metrics.clone();
                let files = settings.files();
                tls::watch_files(&files, serving.cert_reload_interval, move || match settings
                    .build()
                {
                    Ok((cfg, chain)) => {
                        current.store(cfg);
                        record_expiry(&metrics, SERVING, &chain);
                        let (serial, not_after) = describe_leaf(&chain);
                        tracing::info!(%serial, %not_after, "serving TLS material reloaded");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "keeping the previous serving TLS material")
                    }
                })?
            };
        Ok(Self {
            current,
            cert,
            generated,
            serial,
            not_after,
            _watcher: watcher,
        })
    }

    /// What the listener loads per connection.
    pub fn config(&self) -> Arc<ArcSwap<ServerConfig>> {
        self.current.clone()
    }

    /// The one `serving` line. `cert_file` only when there is a file to point a client at: a
    /// generated pair without --cert-dir lives in memory only.
    pub fn log_started(&self, address: SocketAddr, core: &str) {
        let (serial, not_after, generated) = (&self.serial, &self.not_after, self.generated);
        match self.cert.cert_file() {
            Some(cert_file) => tracing::info!(
                address = %address,
                cert_file = %cert_file.display(),
                self_signed = generated,
                %serial,
                %not_after,
                core = %core,
                "serving"
            ),
            None => tracing::info!(
                address = %address,
                self_signed = generated,
                %serial,
                %not_after,
                core = %core,
                cert = "self-signed, in memory only: give --cert-dir to write it where clients can read it",
                "serving"
            ),
        }
    }
}

/// The bound listening socket and the address it got (port 0 picks one).
pub struct Socket {
    pub listener: TcpListener,
    pub address: SocketAddr,
}

pub async fn bind(listen: SocketAddr) -> Result<Socket, StartError> {
    let bind_error = |source| StartError::Bind {
        addr: listen,
        source,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let address = listener.local_addr().map_err(bind_error)?;
    Ok(Socket { listener, address })
}

/// Keeps the proxy client certificate current: the sender the core client and the route
/// controller listen to, and the file watcher that feeds it. Dropping it stops the reloads.
pub struct ProxyIdentityReload {
    rx: ProxyIdentity,
    _tx: Arc<watch::Sender<Option<Arc<Identity>>>>,
    _watcher: Option<notify::RecommendedWatcher>,
}

// === impl ProxyIdentityReload ===

impl ProxyIdentityReload {
    /// Loads the proxy client certificate and reloads it whenever its files change. A pair that
    /// does not load (a half-written rotation, a key that does not match) keeps the previous
    /// identity.
    pub fn start(
        pair: Option<CertKeyPair>,
        reload_interval: Duration,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, StartError> {
        let Some(pair) = pair else {
            let (tx, rx) = watch::channel(None);
            return Ok(Self {
                rx,
                _tx: Arc::new(tx),
                _watcher: None,
            });
        };
        let first = Identity::load(&pair).map_err(StartError::ProxyIdentity)?;
        record_expiry(metrics, PROXY_CLIENT, &first.certs);
        let (tx, rx) = watch::channel(Some(Arc::new(first)));
        let tx = Arc::new(tx);
        let sender = tx.clone();
        let metrics = metrics.clone();
        let files = [pair.cert_file.clone(), pair.key_file.clone()];
        let watcher = tls::watch_files(&files, reload_interval, move || {
            match Identity::load(&pair) {
                Ok(identity) => {
                    let (serial, not_after) = describe_leaf(&identity.certs);
                    record_expiry(&metrics, PROXY_CLIENT, &identity.certs);
                    sender.send_replace(Some(Arc::new(identity)));
                    tracing::info!(cert_file = %pair.cert_file.display(), %serial, %not_after, "proxy client certificate reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "keeping the previous proxy client certificate")
                }
            }
        })?;
        Ok(Self {
            rx,
            _tx: tx,
            _watcher: Some(watcher),
        })
    }

    /// The current certificate, followed as it is reloaded.
    pub fn receiver(&self) -> ProxyIdentity {
        self.rx.clone()
    }
}

/// Publishes the expiry of the leaf of `chain`, the certificate now presented as `which`.
fn record_expiry(metrics: &Metrics, which: &str, chain: &[CertificateDer<'static>]) {
    if let Some(not_after) = chain.first().and_then(tls::not_after_unix) {
        metrics
            .certificate_expiration
            .with_label_values(&[which])
            .set(not_after);
    }
}

/// Serial number and expiry of a chain's leaf, for the log.
fn describe_leaf(chain: &[CertificateDer<'static>]) -> (String, String) {
    chain
        .first()
        .map(tls::describe)
        .unwrap_or_else(|| ("none".into(), "none".into()))
}
