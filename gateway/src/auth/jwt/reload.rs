//! The configured issuers, and their file kept in force as kube-apiserver keeps it: read and
//! validated at start (a bad file stops the start), then re-read when it changes and once a
//! minute. A new file replaces the issuers only when it is valid, leaves `anonymous` as it
//! was (kube refuses that change on reload), and every new issuer has fetched its keys within
//! [`UPDATE_TIMEOUT`]; otherwise the old set stays, with one log line for the refusal, and a
//! file that could still come good (an issuer not reachable yet) is tried again a minute later.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::authentication::{
    self as config, AnonymousAuthConfig, AuthenticationConfiguration,
};

use super::cel::Compiler;
use super::jws::untrusted_issuer;
use super::metrics::{hash, JwtMetrics};
use super::{IssuerAuthenticator, Verdict, Verified};
use crate::auth::cache::{key_of, TtlCache};

/// How long a reload waits for the new issuers' keys (kube's `UpdateAuthenticationConfigTimeout`).
pub const UPDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the file is read again besides change events (kube polls every minute).
pub const RESYNC: Duration = Duration::from_secs(60);

/// kube-apiserver caches a token's successful authentication this long (`TokenSuccessCacheTTL`
/// of its built-in authentication options, not a flag, around the whole token chain); here the cache is
/// the JWT issuers' alone, and never outlives the token's `exp`. Failures are not cached
/// (kube's failure TTL is 0).
pub const SUCCESS_CACHE_TTL: Duration = Duration::from_secs(10);

/// The issuers of one configuration, with the tokens they accepted lately (a new configuration
/// starts with an empty cache: its mappings may differ).
struct Issuers {
    issuers: Vec<Arc<IssuerAuthenticator>>,
    verified: TtlCache<Verified, String>,
}

pub struct JwtAuthenticators {
    issuers: ArcSwap<Issuers>,
    /// The start-up file's `anonymous`, which reloads may not change.
    anonymous: Option<AnonymousAuthConfig>,
    path: PathBuf,
    compiler: Compiler,
    metrics: Arc<JwtMetrics>,
}

/// Reads and validates the file, with kube's start-up error.
fn load(path: &Path, compiler: &Compiler) -> Result<(AuthenticationConfiguration, String), String> {
    let (file, text) = config::read(path).map_err(|e| e.to_string())?;
    let errors = config::validate(&file, compiler, &[]);
    if !errors.is_empty() {
        return Err(invalid(&errors));
    }
    Ok((file, text))
}

/// The file as a start would judge it, without starting anything (`--check-config`).
pub fn check_file(path: &Path) -> Result<AuthenticationConfiguration, String> {
    load(path, &Compiler::default()).map(|(file, _)| file)
}

fn build(
    file: &AuthenticationConfiguration,
    compiler: &Compiler,
    metrics: &Arc<JwtMetrics>,
) -> Result<Issuers, String> {
    let issuers = file
        .jwt
        .iter()
        .map(|a| IssuerAuthenticator::start(a, compiler, metrics.clone()).map(Arc::new))
        .collect::<Result<_, _>>()?;
    Ok(Issuers {
        issuers,
        verified: TtlCache::new(10_000),
    })
}

impl JwtAuthenticators {
    /// Loads the file and starts its issuers' first fetches (not waited for: kube does not
    /// either, so an issuer inside the cluster may come up later).
    pub fn start(path: &Path, metrics: Arc<JwtMetrics>) -> Result<Self, String> {
        let compiler = Compiler::default();
        let (file, text) = load(path, &compiler)?;
        let issuers = build(&file, &compiler, &metrics)?;
        metrics.config_applied(&hash(text.as_bytes()), false);
        Ok(Self {
            issuers: ArcSwap::from_pointee(issuers),
            anonymous: file.anonymous,
            path: path.to_owned(),
            compiler,
            metrics,
        })
    }

    /// The file's anonymous authenticator, when it configures one.
    pub fn anonymous(&self) -> Option<&AnonymousAuthConfig> {
        self.anonymous.as_ref()
    }

    pub async fn authenticate(&self, token: &str) -> Verdict {
        let active = self.issuers.load_full();
        let key = key_of(token.as_bytes());
        // A token accepted lately is not parsed again.
        if let Some(v) = active.verified.get(&key) {
            return Verdict::Authenticated(v.user);
        }
        let Some(iss) = untrusted_issuer(token) else {
            return Verdict::NotOurs;
        };
        let Some(issuer) = active.issuers.iter().find(|i| i.url() == iss) else {
            return Verdict::NotOurs;
        };
        let ttl = |v: &Verified| v.valid_for.min(SUCCESS_CACHE_TTL);
        let verified = active
            .verified
            .get_or_fetch(key, ttl, || issuer.authenticate(token))
            .await;
        match verified {
            Ok(v) => Verdict::Authenticated(v.user),
            Err(why) => Verdict::Rejected(why),
        }
    }

    /// Follows the file until the process ends.
    pub async fn follow_file(self: Arc<Self>) {
        let (tx, mut changed) = tokio::sync::watch::channel(());
        // The watcher's thread says when the file's content changed; the minute tick covers
        // retries and filesystems without events.
        let _watcher = gateway_config::tls::watch_files(std::slice::from_ref(&self.path), RESYNC, move || {
            tx.send_replace(());
        })
        .map_err(|e| {
            tracing::warn!(file = %self.path.display(), error = %e, "authentication config is not watched for changes; it is read again every minute");
        })
        .ok();
        let mut tracked = std::fs::read_to_string(&self.path).unwrap_or_default();
        let mut failing: Option<String> = None;
        let mut tick = tokio::time::interval(RESYNC);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = changed.changed() => {}
                _ = tick.tick() => {}
            }
            let outcome = self.reload(&mut tracked).await;
            match outcome {
                Ok(false) => {}
                Ok(true) => {
                    failing = None;
                    tracing::info!(file = %self.path.display(), "reloaded authentication config");
                }
                Err(e) => {
                    self.metrics.reload_failed();
                    if failing.as_deref() != Some(e.as_str()) {
                        tracing::error!(file = %self.path.display(), error = %e, "authentication config not reloaded; the configuration in force stays");
                        failing = Some(e);
                    }
                }
            }
        }
    }

    /// One look at the file: `Ok(true)` when a new configuration is in force, `Ok(false)` when
    /// the file is what was already judged.
    async fn reload(&self, tracked: &mut String) -> Result<bool, String> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("failed to read authentication config file: {e}"))?;
        if text == *tracked {
            return Ok(false);
        }
        let file = match self.check(&text) {
            Ok(file) => file,
            Err(e) => {
                // This text never becomes valid: judged once.
                *tracked = text;
                return Err(e);
            }
        };
        let issuers = build(&file, &self.compiler, &self.metrics)?;
        let ready = async {
            while !issuers.issuers.iter().all(|i| i.initialized()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        if tokio::time::timeout(UPDATE_TIMEOUT, ready).await.is_err() {
            let waiting: Vec<&str> = issuers
                .issuers
                .iter()
                .filter(|i| !i.initialized())
                .map(|i| i.url())
                .collect();
            return Err(format!(
                "failed to update authentication config: issuers without keys after {}s: {}",
                UPDATE_TIMEOUT.as_secs(),
                waiting.join(", ")
            ));
        }
        self.issuers.store(Arc::new(issuers));
        self.metrics.config_applied(&hash(text.as_bytes()), true);
        *tracked = text;
        Ok(true)
    }

    fn check(&self, text: &str) -> Result<AuthenticationConfiguration, String> {
        let file = config::decode(text).map_err(|e| e.to_string())?;
        let mut errors = config::validate(&file, &self.compiler, &[]);
        if file.anonymous != self.anonymous {
            errors.push(config::FieldError(
                "anonymous: Forbidden: changed from initial configuration file".into(),
            ));
        }
        if errors.is_empty() {
            Ok(file)
        } else {
            Err(invalid(&errors))
        }
    }
}

/// kube's refusal of a file that does not validate.
fn invalid(errors: &[config::FieldError]) -> String {
    format!(
        "invalid authentication configuration: {}",
        config::aggregate(errors)
    )
}
