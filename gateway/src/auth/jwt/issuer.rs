//! One issuer's signing keys: OIDC discovery (`{url}/.well-known/openid-configuration`, or the
//! configured `discoveryURL`), then its `jwks_uri`, both over TLS verified with the issuer's
//! `certificateAuthority` (the system roots when it has none).
//!
//! As in kube, the first fetch runs in the background and is retried every 10 s until it
//! works, so an issuer served from inside the cluster can come up after the gateway; until then
//! its tokens are refused. A token whose key is not in the set (a rotation) fetches the JWKS
//! again, at most once per [`MIN_REFETCH_INTERVAL`]: a flood of made-up `kid`s costs the issuer
//! one request a second. Every fetch is bounded in time and size, so an issuer that hangs or
//! answers garbage delays only its own tokens.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::jws::{parse_key_set, PublicKey};
use super::metrics::JwtMetrics;

/// Between attempts at the first fetch (kube's poll interval).
pub const INIT_RETRY: Duration = Duration::from_secs(10);
/// The least time between two refetches after a key miss.
pub const MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(1);
/// One fetch, connection included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery document or JWKS read.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

pub type KeySet = Arc<Vec<PublicKey>>;

pub struct KeySource {
    issuer: String,
    discovery_url: String,
    client: HttpsClient,
    keys: ArcSwapOption<Vec<PublicKey>>,
    jwks_uri: ArcSwapOption<String>,
    /// When the JWKS was last fetched; held while refetching, so concurrent misses fetch once.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    metrics: Arc<JwtMetrics>,
}

impl KeySource {
    pub fn new(
        issuer: &gateway_config::authentication::Issuer,
        metrics: Arc<JwtMetrics>,
    ) -> Result<Self, String> {
        let roots = if issuer.certificate_authority.is_empty() {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            roots
        } else {
            gateway_config::tls::roots_from_pem(
                issuer.certificate_authority.as_bytes(),
                "certificateAuthority",
            )
            .map_err(|e| e.to_string())?
        };
        let tls = gateway_config::tls::client_config(
            gateway_config::tls::ServerTrust::Roots(roots),
            None,
            &[],
        )
        .map_err(|e| e.to_string())?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(FETCH_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let discovery_url = match &issuer.discovery_url {
            Some(url) if !url.is_empty() => url.clone(),
            _ => format!(
                "{}/.well-known/openid-configuration",
                issuer.url.trim_end_matches('/')
            ),
        };
        Ok(Self {
            issuer: issuer.url.clone(),
            discovery_url,
            client: Client::builder(TokioExecutor::new()).build(connector),
            keys: ArcSwapOption::empty(),
            jwks_uri: ArcSwapOption::empty(),
            last_fetch: tokio::sync::Mutex::new(None),
            metrics,
        })
    }

    /// The keys, once the first fetch worked.
    pub fn keys(&self) -> Option<KeySet> {
        self.keys.load_full()
    }

    /// Fetches discovery and the keys until it works; one log line when it fails first and one
    /// when it works.
    pub async fn initialize(self: Arc<Self>) {
        let mut failing = false;
        loop {
            match self.discover_and_fetch().await {
                Ok(count) => {
                    tracing::info!(issuer = %self.issuer, keys = count, "JWT issuer's keys fetched; its tokens are verified");
                    return;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(issuer = %self.issuer, error = %e, "JWT issuer's keys cannot be fetched; its tokens are refused until they are (retried every 10s)");
                        failing = true;
                    }
                }
            }
            tokio::time::sleep(INIT_RETRY).await;
        }
    }

    async fn discover_and_fetch(&self) -> Result<usize, String> {
        #[derive(Deserialize)]
        struct Discovery {
            #[serde(default)]
            issuer: String,
            #[serde(default)]
            jwks_uri: String,
        }
        let body = self.get(&self.discovery_url).await?;
        let doc: Discovery = serde_json::from_slice(&body)
            .map_err(|e| format!("oidc: failed to decode provider discovery object: {e}"))?;
        if doc.issuer != self.issuer {
            return Err(format!(
                "oidc: issuer did not match the issuer returned by provider, expected {:?} got {:?}",
                self.issuer, doc.issuer
            ));
        }
        if doc.jwks_uri.is_empty() {
            return Err("provider did not return JWKS URL".into());
        }
        self.jwks_uri.store(Some(Arc::new(doc.jwks_uri)));
        let mut last = self.last_fetch.lock().await;
        let keys = self.fetch_keys().await;
        *last = Some(Instant::now());
        keys.map(|k| k.len())
    }

    /// After no key verified a token made with `seen`: the keys as they are now, fetched again
    /// unless another request just did or the last fetch is too recent. `None` when nothing
    /// newer can be had.
    pub async fn refetch(&self, seen: &KeySet) -> Option<KeySet> {
        let mut last = self.last_fetch.lock().await;
        let current = self.keys.load_full()?;
        if !Arc::ptr_eq(&current, seen) {
            return Some(current);
        }
        if last.is_some_and(|at| at.elapsed() < MIN_REFETCH_INTERVAL) {
            return None;
        }
        let fetched = self.fetch_keys().await;
        *last = Some(Instant::now());
        match fetched {
            Ok(_) => self.keys.load_full(),
            Err(e) => {
                tracing::debug!(issuer = %self.issuer, error = %e, "JWKS refetch failed");
                None
            }
        }
    }

    /// Fetches the JWKS and stores it; the caller holds `last_fetch`.
    async fn fetch_keys(&self) -> Result<KeySet, String> {
        let uri = self.jwks_uri.load_full().ok_or("no jwks_uri yet")?;
        let result = self.get(&uri).await.and_then(|body| {
            let keys = parse_key_set(&body)?;
            Ok((keys, body))
        });
        match result {
            Ok((keys, body)) => {
                self.metrics.jwks_fetched(&self.issuer, Some(&body));
                let keys = Arc::new(keys);
                self.keys.store(Some(keys.clone()));
                Ok(keys)
            }
            Err(e) => {
                self.metrics.jwks_fetched(&self.issuer, None);
                Err(e)
            }
        }
    }

    async fn get(&self, url: &str) -> Result<Bytes, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        // No `Accept`, as go-oidc sends none: kube-apiserver serves its JWKS as
        // `application/jwk-set+json` and answers `Accept: application/json` with a 406.
        let request = http::Request::get(uri)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{url}: {}", apiservice::outage::chain(&e)))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map_err(|e| format!("{url}: reading the answer: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("{url}: {status}"));
            }
            Ok(body)
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("{url}: no answer within {}s", FETCH_TIMEOUT.as_secs()))?
    }
}
