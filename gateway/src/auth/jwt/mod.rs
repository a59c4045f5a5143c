//! JWT authentication without a TokenReview: kube-apiserver's structured authentication
//! (`--authentication-config`, KEP-3331). A bearer token whose (unverified) `iss` is a
//! configured issuer's `url` is verified here, as kube's `oidc` authenticator verifies it: the
//! signature with the issuer's JWKS ([`issuer`], [`jws`]), `iss`, the audiences (any of them),
//! `exp` (required, no skew) and `nbf` (a minute of leeway), then the claim mappings and rules
//! ([`mapping`], [`cel`]). A token no issuer claims is not judged here: it goes on to the
//! TokenReview, as in kube's chain.
//!
//! The configuration is reloaded when its file changes ([`reload`]); the issuers in force stay
//! until the new set has fetched its keys.

pub mod cel;
pub mod issuer;
pub mod jws;
pub mod mapping;
pub mod metrics;
pub mod reload;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value as Json};

use self::issuer::{KeySet, KeySource};
use self::jws::Jws;
use self::mapping::Mapper;
use self::metrics::{hash, JwtMetrics};
use crate::identity::UserInfo;

pub use self::reload::JwtAuthenticators;

/// kube's allowance for clocks that disagree, on `nbf` (the leeway of the go-oidc kube vendors).
pub const NOT_BEFORE_SKEW: Duration = Duration::from_secs(60);

/// What the configured issuers made of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No configured issuer is the token's `iss`.
    NotOurs,
    Authenticated(UserInfo),
    /// The token's issuer refused it; why, for the log.
    Rejected(String),
}

/// A token an issuer accepted.
#[derive(Debug, Clone)]
pub struct Verified {
    pub user: UserInfo,
    /// Until the token's `exp`.
    pub valid_for: Duration,
}

/// Aborts the issuer's background fetch when the issuer is replaced.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One `jwt[]` entry, ready to verify tokens.
pub struct IssuerAuthenticator {
    url: String,
    issuer_hash: String,
    audiences: Vec<String>,
    keys: Arc<KeySource>,
    mapper: Mapper,
    metrics: Arc<JwtMetrics>,
    _fetch: AbortOnDrop,
}

impl IssuerAuthenticator {
    /// Builds the issuer and starts fetching its keys (on the current runtime).
    pub fn start(
        config: &gateway_config::authentication::JwtAuthenticator,
        compiler: &cel::Compiler,
        metrics: Arc<JwtMetrics>,
    ) -> Result<Self, String> {
        let keys = Arc::new(KeySource::new(&config.issuer, metrics.clone())?);
        let fetch = tokio::spawn(keys.clone().initialize());
        Ok(Self {
            url: config.issuer.url.clone(),
            issuer_hash: hash(config.issuer.url.as_bytes()),
            audiences: config.issuer.audiences.clone(),
            keys,
            mapper: Mapper::new(compiler, config)?,
            metrics,
            _fetch: AbortOnDrop(fetch),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the first fetch of the keys is done.
    pub fn initialized(&self) -> bool {
        self.keys.keys().is_some()
    }

    /// Verifies `token` (whose `iss` is this issuer's) and maps it to a user.
    pub async fn authenticate(&self, token: &str) -> Result<Verified, String> {
        let started = Instant::now();
        let result = self.verify_and_map(token).await;
        self.metrics
            .authenticated(&self.issuer_hash, result.is_ok(), started.elapsed());
        result
    }

    async fn verify_and_map(&self, token: &str) -> Result<Verified, String> {
        let jws = Jws::parse(token).map_err(|e| format!("oidc: verify token: {e}"))?;
        let keys = self
            .keys
            .keys()
            .ok_or("oidc: authenticator not initialized")?;
        let claims = match verify_with(&jws, &keys) {
            Some(claims) => claims,
            // A key this token needs may be newer than the set (a rotation).
            None => match self.keys.refetch(&keys).await {
                Some(fresh) => verify_with(&jws, &fresh),
                None => None,
            }
            .ok_or(
                "oidc: verify token: failed to verify signature: no key of the issuer verifies it",
            )?,
        };
        let now = SystemTime::now();
        check_claims(&self.url, &self.audiences, claims, now)?;
        let user = self.mapper.user(claims)?;
        let now = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let exp = claims.get("exp").and_then(Json::as_f64).unwrap_or(now);
        Ok(Verified {
            user,
            valid_for: Duration::try_from_secs_f64(exp - now).unwrap_or_default(),
        })
    }
}

/// `iss`, `aud`, `exp` and `nbf`, as go-oidc and kube check them (`iat` is not checked: kube
/// does not either).
fn check_claims(
    url: &str,
    want_audiences: &[String],
    claims: &Map<String, Json>,
    now: SystemTime,
) -> Result<(), String> {
    let iss = claims.get("iss").and_then(Json::as_str).unwrap_or_default();
    if iss != url {
        return Err(format!(
                "oidc: verify token: oidc: id token issued by a different provider, expected {url:?} got {iss:?}"
            ));
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Json::String(a)) => vec![a.as_str()],
        Some(Json::Array(items)) => items.iter().filter_map(Json::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences
        .iter()
        .any(|a| want_audiences.iter().any(|want| want == a))
    {
        return Err(format!(
            "oidc: verify token: oidc: expected audience in {want_audiences:?} got {audiences:?}"
        ));
    }
    let now = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let time = |name: &str| claims.get(name).and_then(Json::as_f64);
    match time("exp") {
        Some(exp) if exp >= now => {}
        _ => return Err("oidc: verify token: oidc: token is expired".into()),
    }
    if let Some(nbf) = time("nbf") {
        if nbf > now + NOT_BEFORE_SKEW.as_secs_f64() {
            return Err(
                "oidc: verify token: oidc: current time before the nbf (not before) time".into(),
            );
        }
    }
    Ok(())
}

/// The claims, if a key of `keys` verifies the token: those with its `kid`, or every key when
/// it names none (go-oidc's choice).
fn verify_with<'t>(jws: &'t Jws<'_>, keys: &KeySet) -> Option<&'t Map<String, Json>> {
    keys.iter()
        .filter(|k| jws.kid.is_none() || k.kid == jws.kid)
        .find_map(|k| jws.verify(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(claims: Json, now: u64) -> Result<(), String> {
        let claims = claims.as_object().unwrap().clone();
        let now = UNIX_EPOCH + Duration::from_secs(now);
        check_claims("https://issuer", &["a".into(), "b".into()], &claims, now)
    }

    #[test]
    fn time_audience_and_issuer_are_checked_as_go_oidc_does() {
        let at = 1_000_000;
        let ok = json!({"iss": "https://issuer", "aud": ["x", "b"], "exp": at + 10});
        assert_eq!(check(ok, at), Ok(()));
        let single = json!({"iss": "https://issuer", "aud": "a", "exp": at});
        assert_eq!(check(single, at), Ok(()), "exp equal to now has not passed");
        let expired = json!({"iss": "https://issuer", "aud": "a", "exp": at - 1});
        assert!(check(expired, at).unwrap_err().contains("token is expired"));
        let no_exp = json!({"iss": "https://issuer", "aud": "a"});
        assert!(check(no_exp, at).unwrap_err().contains("token is expired"));
        let audience = json!({"iss": "https://issuer", "aud": ["c"], "exp": at + 10});
        assert!(check(audience, at)
            .unwrap_err()
            .contains("expected audience"));
        let issuer = json!({"iss": "https://other", "aud": "a", "exp": at + 10});
        assert!(check(issuer, at)
            .unwrap_err()
            .contains("different provider"));
        // nbf: a minute of leeway, not more.
        let soon = json!({"iss": "https://issuer", "aud": "a", "exp": at + 900, "nbf": at + 59});
        assert_eq!(check(soon, at), Ok(()));
        let later = json!({"iss": "https://issuer", "aud": "a", "exp": at + 900, "nbf": at + 61});
        assert!(check(later, at).unwrap_err().contains("nbf"));
    }
}
