//! Who may be anonymous: kube's `--anonymous-auth`, or the authentication configuration file's
//! `anonymous` (never both), and the health probes that answer without credentials either way.

use super::jwt;

/// A health probe: GET or HEAD of `/livez`, `/readyz`, `/healthz` or `/<endpoint>/<check>`.
/// The router answers every such request itself (see `health::Endpoint::from_path`), so letting
/// it through without credentials exposes nothing beyond the gateway's own health.
pub fn is_health_probe(method: &http::Method, path: &str) -> bool {
    (method == http::Method::GET || method == http::Method::HEAD)
        && ["/livez", "/readyz", "/healthz"].iter().any(|p| {
            path.strip_prefix(p).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .strip_prefix('/')
                        .is_some_and(|check| !check.is_empty())
            })
        })
}

/// Who may be anonymous: kube's `--anonymous-auth`, or the `anonymous` of the authentication
/// configuration file (enabled, and then on its `conditions`' paths only, when it lists any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnonymousPolicy {
    Denied,
    Allowed,
    /// Anonymous requests to exactly these paths only.
    Paths(Vec<String>),
}

impl AnonymousPolicy {
    pub(super) fn allows(&self, path: &str) -> bool {
        match self {
            Self::Denied => false,
            Self::Allowed => true,
            Self::Paths(paths) => paths.iter().any(|p| p == path),
        }
    }
}

/// kube's refusal of `--anonymous-auth` beside the file's `anonymous`.
pub(super) const ANONYMOUS_TWICE: &str = "anonymous: Forbidden: --anonymous-auth flag cannot be set when anonymous field is configured in authentication configuration file";

/// kube's rule: the file's `anonymous` and `--anonymous-auth` may not both be set (the error is
/// kube's message).
pub(super) fn anonymous_policy(
    authn: &gateway_config::AuthnConfig,
    jwt: Option<&jwt::JwtAuthenticators>,
) -> Result<AnonymousPolicy, &'static str> {
    let Some(file) = jwt.and_then(|j| j.anonymous()) else {
        return Ok(if authn.anonymous {
            AnonymousPolicy::Allowed
        } else {
            AnonymousPolicy::Denied
        });
    };
    if authn.anonymous_flag_set {
        return Err(ANONYMOUS_TWICE);
    }
    Ok(match (file.enabled, file.conditions.as_slice()) {
        (false, _) => AnonymousPolicy::Denied,
        (true, []) => AnonymousPolicy::Allowed,
        (true, conditions) => {
            AnonymousPolicy::Paths(conditions.iter().map(|c| c.path.clone()).collect())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_of_paths_allows_exactly_those_paths() {
        let policy = AnonymousPolicy::Paths(vec!["/livez".into()]);
        assert!(policy.allows("/livez"));
        assert!(!policy.allows("/livez/etcd"));
        assert!(AnonymousPolicy::Allowed.allows("/api"));
        assert!(!AnonymousPolicy::Denied.allows("/livez"));
    }

    #[test]
    fn only_reads_of_health_endpoints_are_probes() {
        use http::Method;
        for p in [
            "/livez",
            "/readyz",
            "/healthz",
            "/readyz/ping",
            "/livez/etcd",
            "/readyz/shutdown",
        ] {
            assert!(is_health_probe(&Method::GET, p), "{p}");
            assert!(is_health_probe(&Method::HEAD, p), "{p}");
            // Whatever is exempt, the gateway answers itself: nothing unauthenticated reaches
            // a backend.
            assert!(
                crate::handlers::health::Endpoint::from_path(p).is_some(),
                "{p}"
            );
        }
        for method in [
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ] {
            for p in ["/healthz", "/readyz/ping", "/livez/etcd"] {
                assert!(!is_health_probe(&method, p), "{method} {p}");
            }
        }
        for p in [
            "/readyzz",
            "/api",
            "/",
            "/apis/readyz",
            "/readyz/",
            "//healthz",
            "/healthz%2Fping",
        ] {
            assert!(!is_health_probe(&Method::GET, p), "{p}");
        }
    }
}
