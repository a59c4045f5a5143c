//! kube's metrics of structured authentication (`apiserver_authentication_*`), with kube's
//! names, labels and buckets. Hash labels are `sha256:<hex>`, as kube writes them, so that no
//! issuer URL or key appears in a metric.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use sha2::{Digest, Sha256};

pub struct JwtMetrics {
    /// result, jwt_issuer_hash.
    latency: HistogramVec,
    /// result, jwt_issuer_hash, apiserver_id_hash.
    jwks_fetch_timestamp: GaugeVec,
    /// jwt_issuer_hash, apiserver_id_hash, hash: 1 for the key set last fetched.
    jwks_key_set: IntGaugeVec,
    /// status, apiserver_id_hash.
    reloads: IntCounterVec,
    /// status, apiserver_id_hash.
    reload_timestamp: GaugeVec,
    /// apiserver_id_hash, hash: 1 for the configuration in force.
    config_info: IntGaugeVec,
    apiserver_id_hash: String,
    /// The hash label each info gauge carries now (issuer hash → key set hash; "" → config),
    /// so that a new value replaces the old series instead of adding one.
    info_labels: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// `sha256:<hex>` of `data`.
pub fn hash(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl JwtMetrics {
    /// Registers the families; `apiserver_id` names this replica (kube: its apiserver identity).
    pub fn register(registry: &Registry, apiserver_id: &str) -> Result<Self, prometheus::Error> {
        let latency = HistogramVec::new(
            HistogramOpts::new("apiserver_authentication_jwt_authenticator_latency_seconds", "Latency of jwt authentication operations in seconds. This is the time spent authenticating a token for cache miss only (i.e. when the token is not found in the cache).")
                .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["result", "jwt_issuer_hash"],
        )?;
        let jwks_fetch_timestamp = GaugeVec::new(
            Opts::new("apiserver_authentication_jwt_authenticator_jwks_fetch_last_timestamp_seconds", "Timestamp of the last successful or failed JWKS fetch split by result, api server identity and jwt issuer for the JWT authenticator."),
            &["result", "jwt_issuer_hash", "apiserver_id_hash"],
        )?;
        let jwks_key_set = IntGaugeVec::new(
            Opts::new("apiserver_authentication_jwt_authenticator_jwks_fetch_last_key_set_info", "Information about the last JWKS fetched by the JWT authenticator with hash as label, split by api server identity and jwt issuer."),
            &["jwt_issuer_hash", "apiserver_id_hash", "hash"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new("apiserver_authentication_config_controller_automatic_reloads_total", "Total number of automatic reloads of authentication configuration split by status and apiserver identity."),
            &["status", "apiserver_id_hash"],
        )?;
        let reload_timestamp = GaugeVec::new(
            Opts::new("apiserver_authentication_config_controller_automatic_reload_last_timestamp_seconds", "Timestamp of the last automatic reload of authentication configuration split by status and apiserver identity."),
            &["status", "apiserver_id_hash"],
        )?;
        let config_info = IntGaugeVec::new(
            Opts::new("apiserver_authentication_config_controller_last_config_info", "Information about the last applied authentication configuration with hash as label, split by apiserver identity."),
            &["apiserver_id_hash", "hash"],
        )?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(jwks_fetch_timestamp.clone()))?;
        registry.register(Box::new(jwks_key_set.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(reload_timestamp.clone()))?;
        registry.register(Box::new(config_info.clone()))?;
        Ok(Self {
            latency,
            jwks_fetch_timestamp,
            jwks_key_set,
            reloads,
            reload_timestamp,
            config_info,
            apiserver_id_hash: hash(apiserver_id.as_bytes()),
            info_labels: Default::default(),
        })
    }

    /// One token an issuer judged: `result` is `success` or `failure`, as kube labels it.
    pub fn authenticated(&self, issuer_hash: &str, success: bool, elapsed: Duration) {
        let result = if success { "success" } else { "failure" };
        self.latency
            .with_label_values(&[result, issuer_hash])
            .observe(elapsed.as_secs_f64());
    }

    /// One JWKS fetch; `body` is the key set fetched, `None` when the fetch failed.
    pub fn jwks_fetched(&self, issuer: &str, body: Option<&[u8]>) {
        let issuer_hash = hash(issuer.as_bytes());
        let id = self.apiserver_id_hash.as_str();
        let result = if body.is_some() { "success" } else { "failure" };
        self.jwks_fetch_timestamp
            .with_label_values(&[result, &issuer_hash, id])
            .set(now_seconds());
        if let Some(body) = body {
            let new = hash(body);
            if let Some(old) = self.swap_info_label(&issuer_hash, &new) {
                let _ = self
                    .jwks_key_set
                    .remove_label_values(&[&issuer_hash, id, &old]);
            }
            self.jwks_key_set
                .with_label_values(&[&issuer_hash, id, &new])
                .set(1);
        }
    }

    /// Records `new` as the label `key`'s info gauge carries; the one it carried before.
    fn swap_info_label(&self, key: &str, new: &str) -> Option<String> {
        let mut labels = self.info_labels.lock().unwrap_or_else(|p| p.into_inner());
        labels
            .insert(key.to_owned(), new.to_owned())
            .filter(|old| old != new)
    }

    /// A configuration was put in force (at start, or by a reload when `reload`).
    pub fn config_applied(&self, config_hash: &str, reload: bool) {
        let id = self.apiserver_id_hash.as_str();
        if let Some(old) = self.swap_info_label("", config_hash) {
            let _ = self.config_info.remove_label_values(&[id, &old]);
        }
        self.config_info
            .with_label_values(&[id, config_hash])
            .set(1);
        if reload {
            self.reloaded("success");
        }
    }

    /// A reload refused its new file.
    pub fn reload_failed(&self) {
        self.reloaded("failure");
    }

    fn reloaded(&self, status: &str) {
        let id = self.apiserver_id_hash.as_str();
        self.reloads.with_label_values(&[status, id]).inc();
        self.reload_timestamp
            .with_label_values(&[status, id])
            .set(now_seconds());
    }
}
