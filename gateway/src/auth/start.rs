//! Setting authentication up at start: the authenticator from the configuration, the watch on
//! its CA files, the issuers of `--authentication-config`, and the same file judged beforehand
//! for `--check-config`.

use std::sync::Arc;

use gateway_config::tls::TlsError;

use super::anonymous::{anonymous_policy, ANONYMOUS_TWICE};
use super::sar::DecisionCache;
use super::token::TokenReviewer;
use super::x509::CertAuthenticator;
use super::{jwt, Authenticator, AuthnSettings};

/// Why authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuthnStartError {
    #[error("serving TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("--authentication-config: {0}")]
    AuthenticationConfig(String),
}

/// What [`start`] gives: the authenticator, the client CA files' watcher (dropping it stops
/// their reloads), and the authentication file's follower to run beside the controllers.
pub struct Started {
    pub authenticator: Arc<Authenticator>,
    pub ca_watch: Option<notify::RecommendedWatcher>,
    pub jwt: Option<Arc<jwt::JwtAuthenticators>>,
}

/// Builds the authenticator from the configuration, with a watch that reloads the client and
/// request-header CAs when their files change (kept alive by holding [`Started::ca_watch`]).
/// Impersonation decisions are cached with the authorization TTLs; the CA files are checked
/// every `--cert-reload-interval`.
pub fn start(
    (authn, authz): (&gateway_config::AuthnConfig, &gateway_config::AuthzConfig),
    cert_reload_interval: std::time::Duration,
    client: kube::Client,
    registry: &prometheus::Registry,
) -> Result<Started, AuthnStartError> {
    let certs = if authn.client_ca_file.is_some() || authn.requestheader_client_ca_file.is_some() {
        Some(CertAuthenticator::new(
            authn.client_ca_file.clone(),
            authn.requestheader_client_ca_file.clone(),
            authn.requestheader_allowed_names.clone(),
        )?)
    } else {
        None
    };
    let tokens = authn.token_webhook.then(|| {
        TokenReviewer::new(
            client.clone(),
            authn.token_cache_ttl,
            authn.token_cache_unauthorized_ttl,
        )
    });
    let jwt = start_jwt(authn, registry)?;
    let anonymous = anonymous_policy(authn, jwt.as_deref())
        .map_err(|e| AuthnStartError::AuthenticationConfig(e.into()))?;
    let authenticator = Arc::new(Authenticator::new(
        (certs, tokens, jwt.clone()),
        AuthnSettings {
            anonymous,
            constrained_impersonation: authz.constrained_impersonation,
        },
        client,
        DecisionCache::new(
            "SubjectAccessReview for impersonation",
            authz.cache_authorized_ttl,
            authz.cache_unauthorized_ttl,
        ),
    ));
    let files = authenticator.certs().map(|c| c.files()).unwrap_or_default();
    let ca_watch = if files.is_empty() {
        None
    } else {
        let reloading = authenticator.clone();
        match gateway_config::tls::watch_files(&files, cert_reload_interval, move || {
            if let Some(certs) = reloading.certs() {
                certs.reload();
            }
        }) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "client CA files are not watched; changes need a restart");
                None
            }
        }
    };
    Ok(Started {
        authenticator,
        ca_watch,
        jwt,
    })
}

/// The issuers of `--authentication-config`, loaded and validated (a bad file stops the start).
fn start_jwt(
    authn: &gateway_config::AuthnConfig,
    registry: &prometheus::Registry,
) -> Result<Option<Arc<jwt::JwtAuthenticators>>, AuthnStartError> {
    let Some(path) = &authn.authentication_config else {
        return Ok(None);
    };
    let metrics = jwt::metrics::JwtMetrics::register(registry, &crate::host::name())
        .map_err(|e| AuthnStartError::AuthenticationConfig(e.to_string()))?;
    let issuers = jwt::JwtAuthenticators::start(path, Arc::new(metrics))
        .map_err(AuthnStartError::AuthenticationConfig)?;
    Ok(Some(Arc::new(issuers)))
}

/// `--authentication-config` judged as a start judges it (the file, its CEL, and the
/// `anonymous` rule), before anything starts: `--check-config` and a real start refuse alike.
pub fn check_authentication_config(authn: &gateway_config::AuthnConfig) -> Result<(), String> {
    let Some(path) = &authn.authentication_config else {
        return Ok(());
    };
    let file = jwt::reload::check_file(path)?;
    if file.anonymous.is_some() && authn.anonymous_flag_set {
        return Err(ANONYMOUS_TWICE.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube's rule: the file's `anonymous` beside `--anonymous-auth` is refused; either alone
    /// is not, and the file's conditions become the policy.
    #[test]
    fn the_files_anonymous_excludes_the_flag() {
        let dir = std::env::temp_dir().join(format!("gw-authn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("authn.yaml");
        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n\
             anonymous: {enabled: true, conditions: [{path: /livez}]}\n",
        )
        .unwrap();
        let authn = |flag_set: bool| gateway_config::AuthnConfig {
            client_ca_file: None,
            requestheader_client_ca_file: None,
            requestheader_allowed_names: Vec::new(),
            anonymous: true,
            anonymous_flag_set: flag_set,
            authentication_config: Some(file.clone()),
            token_webhook: true,
            token_cache_ttl: std::time::Duration::from_secs(120),
            token_cache_unauthorized_ttl: std::time::Duration::from_secs(10),
        };
        assert_eq!(check_authentication_config(&authn(false)), Ok(()));
        assert_eq!(
            check_authentication_config(&authn(true)),
            Err(ANONYMOUS_TWICE.to_owned())
        );
        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n",
        )
        .unwrap();
        assert_eq!(
            check_authentication_config(&authn(true)),
            Ok(()),
            "no anonymous in the file: the flag decides"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
