//! How the caller's identity travels on to the **core** (`--core-identity`). Remote APIServices
//! always get `X-Remote-*` over our proxy client certificate (`identity::set_identity_headers`).
//!
//! The rule everything here serves: the core must never see an identity the caller made up and
//! that the core would believe because of *our* credentials. So which headers go out depends on
//! which connection they go out on:
//!
//! | mode | caller | connection to the core | identity headers |
//! |---|---|---|---|
//! | passthrough | token, anonymous | no client certificate | the caller's own `Authorization`, and the `Impersonate-*` the gateway allowed (the core checks both itself) |
//! | passthrough | certificate, front proxy, JWT | our proxy client certificate | `X-Remote-*` of the (impersonated) user, set by us |
//! | impersonate | anyone | the gateway's own credentials | `Impersonate-*` of the (impersonated) user, set by us |
//!
//! Whatever the caller sent as `X-Remote-*`/`Impersonate-*` (underscore spellings included) or
//! `Authorization` is removed first in every case (the authentication layer already took them
//! off; this is the backstop). These headers must be set after hop-by-hop stripping: a client's
//! `Connection` header may name any of them.
//!
//! A user that cannot be written into headers (a control character in a name, group or extra
//! value) is refused with a 500 rather than passed on with part of its identity missing.

use gateway_config::CoreIdentity;
use http::header::AUTHORIZATION;
use http::HeaderMap;

use super::{impersonation, Authenticated, Method};
use crate::error::GatewayError;
use crate::identity::{check_encodable, set_identity_headers, strip_identity_headers, UserInfo};

/// Which client (credentials) the core request must go out on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreCredentials {
    /// No client certificate and no gateway token: the caller's own credentials only.
    Caller,
    /// Our proxy client certificate, vouching for the `X-Remote-*` we set.
    Proxy,
    /// The gateway's own core credentials, with `Impersonate-*` we set.
    Own,
}

/// Sets the identity headers for a request to the core and says which credentials to send it
/// with. A request without an [`Authenticated`] extension (it did not pass the authentication
/// layer) goes as an anonymous caller. Call it after `proxy::prepare_request`: hop-by-hop
/// stripping afterwards would remove whatever `Connection` names of what is set here.
pub fn prepare_core_request(
    headers: &mut HeaderMap,
    auth: Option<&Authenticated>,
    mode: CoreIdentity,
) -> Result<CoreCredentials, GatewayError> {
    strip_identity_headers(headers);
    let unencodable = |e: crate::identity::UnencodableIdentity| {
        tracing::warn!(error = %e, "request refused");
        GatewayError::Internal(e.to_string())
    };
    Ok(match mode {
        CoreIdentity::Impersonate => {
            let user = auth.map_or(UserInfo::shared_anonymous(), Authenticated::user);
            // `set_headers` skips what it cannot encode; with our own credentials that would
            // leave the core acting for someone else.
            check_encodable(user).map_err(unencodable)?;
            impersonation::set_headers(headers, user);
            CoreCredentials::Own
        }
        CoreIdentity::Passthrough => match auth {
            // The core cannot check these itself: the gateway vouches for them.
            Some(a)
                if matches!(
                    a.method,
                    Method::Certificate | Method::RequestHeader | Method::Jwt
                ) =>
            {
                set_identity_headers(headers, a.user()).map_err(unencodable)?;
                CoreCredentials::Proxy
            }
            Some(a) => {
                if let Some(v) = &a.authorization {
                    headers.insert(AUTHORIZATION, v.clone());
                }
                for (name, value) in &a.impersonation_headers {
                    headers.append(name.clone(), value.clone());
                }
                CoreCredentials::Caller
            }
            None => CoreCredentials::Caller,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::AUTHENTICATED;
    use http::header::{HeaderName, HeaderValue};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn forged() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "admin".parse().unwrap());
        h.insert("x-remote-group", "system:masters".parse().unwrap());
        h.insert("impersonate-user", "admin".parse().unwrap());
        // Spellings a WSGI/Rack/nginx backend reads as the same headers.
        h.insert("x_remote_user", "admin".parse().unwrap());
        h.insert("x_remote_group", "system:masters".parse().unwrap());
        h.insert("impersonate_group", "system:masters".parse().unwrap());
        h.insert(AUTHORIZATION, "Bearer forged".parse().unwrap());
        h.insert("accept", "application/json".parse().unwrap());
        h
    }

    fn alice(method: Method) -> Authenticated {
        Authenticated {
            method,
            requestor: Arc::new(UserInfo {
                name: "alice".into(),
                groups: vec!["dev".into(), AUTHENTICATED.into()],
                uid: String::new(),
                extra: BTreeMap::new(),
            }),
            impersonated: None,
            authorization: Some(HeaderValue::from_static("Bearer alice-token")),
            impersonation_headers: Vec::new(),
        }
    }

    #[test]
    fn token_callers_keep_their_own_credentials_and_nothing_forged() {
        let mut h = forged();
        let creds = prepare_core_request(
            &mut h,
            Some(&alice(Method::Token)),
            CoreIdentity::Passthrough,
        )
        .unwrap();
        assert_eq!(creds, CoreCredentials::Caller);
        assert_eq!(h[AUTHORIZATION], "Bearer alice-token");
        assert!(h.get("x-remote-user").is_none());
        assert!(h.get("x-remote-group").is_none());
        assert!(h.get("impersonate-user").is_none());
        assert_eq!(h["accept"], "application/json");
    }

    #[test]
    fn allowed_impersonation_is_passed_on_for_the_core_to_check_again() {
        let mut auth = alice(Method::Token);
        auth.impersonation_headers = vec![(
            HeaderName::from_static("impersonate-user"),
            HeaderValue::from_static("bob"),
        )];
        let mut h = forged();
        prepare_core_request(&mut h, Some(&auth), CoreIdentity::Passthrough).unwrap();
        assert_eq!(h["impersonate-user"], "bob");
    }

    #[test]
    fn certificate_callers_go_as_request_headers_over_the_proxy_certificate() {
        let mut h = forged();
        let creds = prepare_core_request(
            &mut h,
            Some(&alice(Method::Certificate)),
            CoreIdentity::Passthrough,
        )
        .unwrap();
        assert_eq!(creds, CoreCredentials::Proxy);
        assert_eq!(h["x-remote-user"], "alice");
        assert!(h.get(AUTHORIZATION).is_none());
        assert!(h.get("impersonate-user").is_none());
        let groups: Vec<_> = h.get_all("x-remote-group").iter().collect();
        assert_eq!(groups, ["dev", AUTHENTICATED]);
    }

    #[test]
    fn impersonate_mode_speaks_for_the_effective_user() {
        let mut auth = alice(Method::Token);
        auth.impersonated = Some(Arc::new(UserInfo {
            name: "bob".into(),
            groups: vec!["ops".into(), AUTHENTICATED.into()],
            ..Default::default()
        }));
        let mut h = forged();
        let creds = prepare_core_request(&mut h, Some(&auth), CoreIdentity::Impersonate).unwrap();
        assert_eq!(creds, CoreCredentials::Own);
        assert_eq!(h["impersonate-user"], "bob");
        assert_eq!(h["impersonate-group"], "ops");
        assert!(h.get(AUTHORIZATION).is_none());
        assert!(h.get("x-remote-user").is_none());

        let mut h = forged();
        prepare_core_request(&mut h, None, CoreIdentity::Impersonate).unwrap();
        assert_eq!(h["impersonate-user"], "system:anonymous");
    }

    #[test]
    fn unauthenticated_requests_carry_nothing() {
        let mut h = forged();
        assert_eq!(
            prepare_core_request(&mut h, None, CoreIdentity::Passthrough).unwrap(),
            CoreCredentials::Caller
        );
        assert_eq!(h.len(), 1);
    }

    fn no_underscore_forgery_survives(h: &HeaderMap) {
        for name in h.keys() {
            assert!(!name.as_str().contains('_'), "{name} reached the core");
        }
    }

    #[test]
    fn underscore_spellings_never_reach_the_core() {
        for (auth, mode) in [
            (Some(alice(Method::Token)), CoreIdentity::Passthrough),
            (Some(alice(Method::Certificate)), CoreIdentity::Passthrough),
            (Some(alice(Method::Token)), CoreIdentity::Impersonate),
            (None, CoreIdentity::Passthrough),
        ] {
            let mut h = forged();
            prepare_core_request(&mut h, auth.as_ref(), mode).unwrap();
            no_underscore_forgery_survives(&h);
        }
    }

    #[test]
    fn an_identity_that_cannot_be_a_header_is_refused_not_trimmed() {
        let bad_group = || {
            Arc::new(UserInfo {
                name: "alice".into(),
                groups: vec!["dev\nsystem:masters".into(), AUTHENTICATED.into()],
                ..Default::default()
            })
        };
        let mut cert = alice(Method::Certificate);
        cert.requestor = bad_group();
        let mut impersonating = alice(Method::Token);
        impersonating.impersonated = Some(bad_group());
        for (auth, mode) in [
            (cert, CoreIdentity::Passthrough),
            (impersonating, CoreIdentity::Impersonate),
        ] {
            let mut h = forged();
            let err = prepare_core_request(&mut h, Some(&auth), mode).unwrap_err();
            assert_eq!(err.code(), http::StatusCode::INTERNAL_SERVER_ERROR);
            assert!(err.to_string().contains("group"), "{err}");
        }
    }
}
