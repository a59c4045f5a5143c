//! Delegated authentication and authorization against the core server: who the caller is
//! (client certificate, front-proxy request headers, bearer token by TokenReview, anonymous),
//! whom they impersonate, and how that identity travels on to the core.
//!
//! Semantics are kube-apiserver's, in its order:
//! 1. **Request-header** (`x-remote-*`): only from a connection whose certificate chains to
//!    `--requestheader-client-ca-file` with a CN in `--requestheader-allowed-names` (any CN when
//!    the list is empty), and only when `X-Remote-User` is set.
//! 2. **x509**: a certificate chaining to `--client-ca-file`; CN is the user, each O a group.
//! 3. **Bearer token**: from `Authorization`, then, on a WebSocket upgrade, from a
//!    `base64url.bearer.authorization.k8s.io.<token>` subprotocol (see `websocket`). A JWT of an
//!    issuer in `--authentication-config` is verified here (see `jwt`); every other token, and
//!    one the issuer refused (kube's union tries the next authenticator), gets a `TokenReview`
//!    on the core, cached (see `token`).
//! 4. **Anonymous** (`system:anonymous` / `system:unauthenticated`) when nothing above produced
//!    a user *and nothing failed*: a certificate that authenticates nobody, or a rejected token,
//!    is a 401 (kube's `FailOnError` around the anonymous authenticator), not anonymity.
//!    With `--anonymous-auth=false`, or the file's `anonymous` disabled or limited to paths
//!    (`conditions`) this request's path is not, the request is a 401 too, except a GET or HEAD of `/livez`,
//!    `/readyz`, `/healthz` or one of their checks (`/readyz/<check>`), which always answer:
//!    probes carry no credentials. The gateway answers those itself; any other method or path
//!    would go on to a backend and is authenticated like everything else.
//!
//! Decisions that differ from kube-apiserver, and why:
//! - A `TokenReview` that cannot be made (core unreachable, timeout, 5xx) answers **503**
//!   "authentication webhook unavailable" with `Retry-After: 1`, not kube's 401: the caller's
//!   credential is not wrong, and a 401 makes credential plugins discard good tokens.
//!   Impersonation checks that cannot be made answer 503 the same way (kube: 403).
//! - Impersonation headers without `Impersonate-User` answer **400** (kube: 500), and so does
//!   impersonating more than `impersonation::MAX_ATTRIBUTES` attributes (kube has no cap: its
//!   checks are in-process, ours cost the core a review each).
//!
//! Every authenticated user gets `system:authenticated` (unless it already has it or
//! `system:unauthenticated`). After authentication the request carries an [`Authenticated`] and
//! the effective user as an `Arc<UserInfo>` in its extensions (shared, not copied per layer);
//! `Authorization`, a token subprotocol, `X-Remote-*` and `Impersonate-*` (in any case, and
//! spelled with `_` as well: see `identity::is_identity_header_name`) are gone from its headers,
//! so no later layer, log or backend sees a credential or a claimed identity. The core path puts back what it needs (see
//! `onward`).

mod anonymous;
pub mod cache;
pub mod forbidden;
pub mod impersonation;
pub mod jwt;
pub mod onward;
pub mod requestheader;
pub mod sar;
pub mod selector;
mod start;
pub mod token;
pub mod websocket;
pub mod x509;

use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{HeaderMap, StatusCode};

use crate::body::{Request, Response};
use crate::error::without_addresses;
use crate::extensions::RequestContext;
use crate::identity::{
    strip_identity_headers, UserInfo, ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED,
};
use crate::status::{status_response, StatusDetails};

pub use self::anonymous::{is_health_probe, AnonymousPolicy};
pub use self::start::{check_authentication_config, start, AuthnStartError, Started};

use self::sar::{cached_review, Action, Attributes, DecisionCache};
use self::token::{TokenReviewer, Verdict};
use self::x509::CertAuthenticator;

/// How the caller proved who they are; it decides how the identity travels on to the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Anonymous,
    /// A client certificate from `--client-ca-file`.
    Certificate,
    /// `X-Remote-*` from a trusted front proxy.
    RequestHeader,
    /// A bearer token the core confirmed with a TokenReview.
    Token,
    /// A JWT of a configured issuer, verified by the gateway (`--authentication-config`).
    Jwt,
}

/// Request extension: the outcome of authentication (and impersonation).
#[derive(Clone, Debug)]
pub struct Authenticated {
    pub method: Method,
    /// Who authenticated.
    pub requestor: Arc<UserInfo>,
    /// Whom the request impersonates, once every attribute was allowed.
    pub impersonated: Option<Arc<UserInfo>>,
    /// The caller's `Authorization` header (marked sensitive), taken off the request; for a
    /// caller a WebSocket subprotocol token authenticated, that token as `Bearer <token>`. Only
    /// the core path in passthrough mode puts it back, for callers the core authenticates
    /// itself: kube-apiserver reads `Authorization` on an upgrade too, so the core sees the
    /// same caller without the token in a header it would echo.
    pub authorization: Option<HeaderValue>,
    /// The `Impersonate-*` headers as the caller sent them, after the gateway allowed them; for
    /// the same passthrough case (the core then checks them again with the caller's token).
    pub impersonation_headers: Vec<(HeaderName, HeaderValue)>,
}

/// Whom a credential named, before impersonation.
struct Identified {
    method: Method,
    user: Arc<UserInfo>,
    /// The WebSocket subprotocol token that authenticated the caller, as `Authorization` (see
    /// [`Authenticated::authorization`]).
    protocol_token: Option<HeaderValue>,
}

impl Identified {
    fn new(method: Method, user: UserInfo) -> Self {
        Self {
            method,
            user: Arc::new(with_authenticated_group(user)),
            protocol_token: None,
        }
    }
}

/// The user a request acts as: authentication's outcome (see [`Authenticated::user`]), or a
/// user a request was given directly (one the gateway makes itself, tests); `None` for a request
/// that did not pass authentication.
pub fn request_user(extensions: &http::Extensions) -> Option<&Arc<UserInfo>> {
    extensions
        .get::<Authenticated>()
        .map(Authenticated::user)
        .or_else(|| extensions.get::<Arc<UserInfo>>())
}

// === impl Authenticated ===

impl Authenticated {
    /// The user the request acts as: the impersonated user if any, else the requestor.
    pub fn user(&self) -> &Arc<UserInfo> {
        self.impersonated.as_ref().unwrap_or(&self.requestor)
    }
}

/// Adds `system:authenticated` as kube's `AuthenticatedGroupAdder` does.
pub fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if user.name != ANONYMOUS
        && !user
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        user.groups.push(AUTHENTICATED.to_owned());
    }
    user
}

pub struct AuthnSettings {
    pub anonymous: AnonymousPolicy,
    /// Constrained impersonation (KEP-5284) besides the legacy `impersonate` verb.
    pub constrained_impersonation: bool,
}

/// Everything authentication needs, built once at start.
pub struct Authenticator {
    certs: Option<CertAuthenticator>,
    tokens: Option<TokenReviewer>,
    jwt: Option<Arc<jwt::JwtAuthenticators>>,
    anonymous: AnonymousPolicy,
    constrained_impersonation: bool,
    client: kube::Client,
    impersonation_cache: DecisionCache,
}

// === impl Authenticator ===

impl Authenticator {
    pub fn new(
        (certs, tokens, jwt): (
            Option<CertAuthenticator>,
            Option<TokenReviewer>,
            Option<Arc<jwt::JwtAuthenticators>>,
        ),
        settings: AuthnSettings,
        client: kube::Client,
        impersonation_cache: DecisionCache,
    ) -> Self {
        Self {
            certs,
            tokens,
            jwt,
            anonymous: settings.anonymous,
            constrained_impersonation: settings.constrained_impersonation,
            client,
            impersonation_cache,
        }
    }

    pub fn certs(&self) -> Option<&CertAuthenticator> {
        self.certs.as_ref()
    }

    /// Whether authenticating a request with these headers may wait on a webhook: a bearer
    /// token to review, or impersonation to check. When it may not, [`Self::authenticate`]
    /// is done at its first poll.
    pub fn may_wait(&self, headers: &HeaderMap) -> bool {
        ((self.tokens.is_some() || self.jwt.is_some())
            && (token::bearer_token(headers).is_some() || websocket::offers_token(headers)))
            || impersonation::requested(headers)
    }

    /// Authenticates `req` and applies impersonation: on success the request's headers are
    /// cleaned and [`Authenticated`] plus the effective `Arc<UserInfo>` are in its extensions; on
    /// failure the answer to send (401, 400, 403 or 503 Status).
    pub async fn authenticate(&self, req: &mut Request) -> Result<(), Response> {
        // The decoded path: the router answers health on it (see `request_info::decided_path`).
        let path = crate::request_info::decided_path(req);
        let health = is_health_probe(req.method(), path);
        let anonymous_allowed = self.anonymous.allows(path);
        // Only Sync parts are held across the reviews (the body is not Sync).
        let chain = RequestContext::conn_of(req.extensions())
            .and_then(|c| c.peer_certs.clone())
            .and_then(|certs| certs.downcast::<x509::PeerCertificates>().ok());
        let found = self.identify(req.headers(), chain.as_deref()).await;
        let anonymous = || Identified {
            method: Method::Anonymous,
            user: UserInfo::shared_anonymous().clone(),
            protocol_token: None,
        };
        let Identified {
            method,
            user: requestor,
            protocol_token,
        } = match found {
            Ok(Some(found)) => found,
            Ok(None) if anonymous_allowed || health => anonymous(),
            Ok(None) => return Err(unauthorized("anonymous requests are not allowed")),
            Err(_) if health => anonymous(),
            Err(resp) => return Err(resp),
        };

        // What the request does, for the `impersonate-on:<mode>:<verb>` checks.
        let info = req
            .extensions()
            .get::<Arc<crate::request_info::RequestInfo>>()
            .cloned();
        let headers = req.headers_mut();
        let sent = headers.remove(AUTHORIZATION);
        // The token that authenticated the caller is the one the core gets (passthrough).
        let authorization = protocol_token.or(sent).map(|mut v| {
            v.set_sensitive(true);
            v
        });
        // From every request, whatever authenticated it: a credential, like `Authorization`.
        websocket::strip(headers);
        let mut impersonation_headers = Vec::new();
        let mut impersonated = None;
        if impersonation::requested(headers) {
            let parsed = impersonation::parse(headers);
            impersonation_headers = take_prefixed(headers, "impersonate-");
            match parsed {
                Err(e) => {
                    return Err(status_response(
                        StatusCode::BAD_REQUEST,
                        &e.to_string(),
                        None,
                    ))
                }
                Ok(Some(request)) if self.constrained_impersonation => {
                    let user = self
                        .allow_constrained_impersonation(&requestor, &request, info.as_deref())
                        .await?;
                    impersonated = Some(Arc::new(user));
                }
                Ok(Some(request)) => {
                    self.allow_impersonation(&requestor, &request).await?;
                    impersonated = Some(Arc::new(impersonation::impersonated_user(&request)));
                }
                Ok(None) => impersonation_headers.clear(),
            }
        }
        // Every request-header identity (read above or not, trusted or not) and whatever else
        // some backend could read as one (`X_Remote_User`, `impersonate_group`) goes: nobody
        // downstream should see them.
        strip_identity_headers(headers);

        let auth = Authenticated {
            method,
            requestor,
            impersonated,
            authorization,
            impersonation_headers,
        };
        req.extensions_mut().insert(auth);
        Ok(())
    }

    /// The authenticated caller, `None` when no credential was presented (or none named
    /// anyone without failing), or the 401/503 answer.
    async fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<&x509::PeerCertificates>,
    ) -> Result<Option<Identified>, Response> {
        let mut failures: Vec<String> = Vec::new();
        if let (Some(peer), Some(certs)) = (peer, &self.certs) {
            let check = certs.check_peer(peer);
            match check.front_proxy {
                Some(Ok(())) => {
                    if let Some(user) = requestheader::user_from_headers(headers) {
                        return Ok(Some(Identified::new(Method::RequestHeader, user)));
                    }
                }
                Some(Err(e)) => failures.push(e),
                None => {}
            }
            match check.user {
                Some(Ok(Some(user))) => {
                    return Ok(Some(Identified::new(Method::Certificate, user)))
                }
                Some(Ok(None)) => {}
                Some(Err(e)) => failures.push(e),
                None => {}
            }
        }
        if let Some(found) = self.token_user(headers, &mut failures).await? {
            return Ok(Some(found));
        }
        if failures.is_empty() {
            Ok(None)
        } else {
            Err(unauthorized(&failures.join("; ")))
        }
    }

    /// The caller a bearer token names: from `Authorization`, else from a WebSocket
    /// subprotocol. kube's union tries the subprotocol whether or not `Authorization` failed:
    /// the first credential that names someone wins.
    async fn token_user(
        &self,
        headers: &HeaderMap,
        failures: &mut Vec<String>,
    ) -> Result<Option<Identified>, Response> {
        if let Some(token) = token::bearer_token(headers) {
            if let Some((method, user)) =
                self.token_identity(token, "bearer token", failures).await?
            {
                return Ok(Some(Identified::new(method, user)));
            }
        }
        match websocket::token(headers) {
            Ok(Some(offered)) => {
                let what = "bearer token in the WebSocket subprotocol";
                if let Some((method, user)) =
                    self.token_identity(&offered.token, what, failures).await?
                {
                    let mut found = Identified::new(method, user);
                    found.protocol_token = Some(offered.authorization);
                    return Ok(Some(found));
                }
            }
            Ok(None) => {}
            Err(e) => failures.push(e.to_string()),
        }
        Ok(None)
    }

    /// One token through kube's token chain: the configured JWT issuers, then the TokenReview.
    async fn token_identity(
        &self,
        token: &str,
        what: &str,
        failures: &mut Vec<String>,
    ) -> Result<Option<(Method, UserInfo)>, Response> {
        if let Some(issuers) = &self.jwt {
            match issuers.authenticate(token).await {
                jwt::Verdict::Authenticated(user) => return Ok(Some((Method::Jwt, user))),
                jwt::Verdict::Rejected(why) => failures.push(format!("{what}: {why}")),
                jwt::Verdict::NotOurs => {}
            }
        }
        if let Some(reviewer) = &self.tokens {
            if let Some(user) = Self::review(reviewer, token, what, failures).await? {
                return Ok(Some((Method::Token, user)));
            }
        }
        Ok(None)
    }

    /// Reviews `token`: the user it authenticates, `None` with the reason in `failures` when it
    /// is rejected, or the 503 when the review cannot be made.
    async fn review(
        reviewer: &TokenReviewer,
        token: &str,
        what: &str,
        failures: &mut Vec<String>,
    ) -> Result<Option<UserInfo>, Response> {
        match reviewer.review(token).await {
            Ok(Verdict::Authenticated(user)) => Ok(Some(user)),
            Ok(Verdict::Rejected(why)) => {
                failures.push(if why.is_empty() {
                    format!("invalid {what}")
                } else {
                    format!("{what}: {why}")
                });
                Ok(None)
            }
            Err(e) => {
                // The reviewer logs the outage once; this request's 503 says why.
                tracing::debug!(error = %e, "bearer token could not be reviewed");
                Err(unavailable(&e.to_string()))
            }
        }
    }

    /// One review for impersonation: `Ok(None)` when allowed, `Ok(Some(403))` when not, `Err`
    /// (503) when the core could not be asked.
    async fn impersonation_review(
        &self,
        reviewer: &UserInfo,
        action: Action<'_>,
        selectors: selector::Selectors<'_>,
        requestor: &str,
    ) -> Result<Option<Response>, Response> {
        let attrs = Attributes {
            user: reviewer,
            action,
            selectors,
        };
        match cached_review(&self.client, &self.impersonation_cache, &attrs).await {
            Ok((d, _)) if d.allowed => Ok(None),
            Ok((d, _)) => {
                let (message, details) = forbidden::forbidden(requestor, &action, &d.reason);
                Ok(Some(status_response(
                    StatusCode::FORBIDDEN,
                    &message,
                    Some(details),
                )))
            }
            Err(e) => {
                tracing::debug!(error = %e, "impersonation could not be checked");
                Err(status_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &without_addresses(&format!(
                        "{e}; impersonation could not be checked, retry shortly"
                    )),
                    Some(StatusDetails {
                        retry_after_seconds: Some(1),
                        ..Default::default()
                    }),
                ))
            }
        }
    }

    /// Impersonation with the core's `ConstrainedImpersonation` gate on: each mode that applies
    /// (see `impersonation::constrained_plans`) is tried in kube's order, its
    /// `impersonate-on:<mode>:<verb>` question on the request first, then its questions about
    /// each attribute; the first mode allowed all of them names the user. When none is, the
    /// first refusal is the answer. Repeated questions are answered by the decision cache, which
    /// stands in for kube's per-mode caches (kube also remembers which mode last worked for a
    /// requestor and tries it first; that saves reviews, not outcomes).
    async fn allow_constrained_impersonation(
        &self,
        requestor: &UserInfo,
        request: &impersonation::Request,
        info: Option<&crate::request_info::RequestInfo>,
    ) -> Result<UserInfo, Response> {
        let fallback;
        let info = match info {
            Some(i) => i,
            None => {
                fallback = crate::request_info::RequestInfo::non_resource(&http::Method::GET, "/");
                &fallback
            }
        };
        let mut first_refusal = None;
        'modes: for plan in impersonation::constrained_plans(request, requestor) {
            let refused = |r: Response, first: &mut Option<Response>| {
                first.get_or_insert(r);
            };
            if plan.impersonate_on {
                let verb = format!("impersonate-on:{}:{}", plan.mode.name(), info.verb());
                let action = Action::of_request(info, &verb);
                let selectors = selector::Selectors {
                    label: info.label_selector(),
                    field: info.field_selector(),
                };
                if let Some(r) = self
                    .impersonation_review(&plan.requestor, action, selectors, &requestor.name)
                    .await?
                {
                    refused(r, &mut first_refusal);
                    continue;
                }
            }
            // Each step's review: no selectors, on behalf of the plan's requestor.
            let review = |action| {
                self.impersonation_review(
                    &plan.requestor,
                    action,
                    selector::Selectors::NONE,
                    &requestor.name,
                )
            };
            for step in &plan.steps {
                match step {
                    impersonation::Step::Ask(ask) => {
                        if let Some(r) = review(ask.action()).await? {
                            refused(r, &mut first_refusal);
                            continue 'modes;
                        }
                    }
                    impersonation::Step::AnyOrEach { any, each } => {
                        let all = review(any.action()).await?;
                        if all.is_none() {
                            continue;
                        }
                        for ask in each {
                            if let Some(r) = review(ask.action()).await? {
                                refused(r, &mut first_refusal);
                                continue 'modes;
                            }
                        }
                    }
                    impersonation::Step::Refuse { ask, why } => {
                        let (message, details) =
                            forbidden::forbidden(&requestor.name, &ask.action(), why);
                        refused(
                            status_response(StatusCode::FORBIDDEN, &message, Some(details)),
                            &mut first_refusal,
                        );
                        continue 'modes;
                    }
                }
            }
            tracing::debug!(user = %requestor.name, mode = plan.mode.name(), "impersonation allowed");
            return Ok(plan.user);
        }
        // Legacy always applies, so there is a refusal; fail closed all the same.
        Err(first_refusal.unwrap_or_else(|| {
            status_response(StatusCode::FORBIDDEN, "impersonation refused", None)
        }))
    }

    /// Every impersonated attribute must be allowed for the requestor, checked one at a time
    /// in kube's order; the first refused one is the 403, and nothing after it is asked.
    async fn allow_impersonation(
        &self,
        requestor: &UserInfo,
        request: &impersonation::Request,
    ) -> Result<(), Response> {
        for check in impersonation::checks(request) {
            let attrs = Attributes {
                user: requestor,
                action: check.action(),
                selectors: selector::Selectors::NONE,
            };
            match cached_review(&self.client, &self.impersonation_cache, &attrs).await {
                Ok((d, _)) if d.allowed => {}
                Ok((d, _)) => {
                    let (message, details) =
                        forbidden::forbidden(&requestor.name, &check.action(), &d.reason);
                    tracing::debug!(user = %requestor.name, %message, "impersonation refused");
                    return Err(status_response(
                        StatusCode::FORBIDDEN,
                        &message,
                        Some(details),
                    ));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "impersonation could not be checked");
                    return Err(status_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &without_addresses(&format!(
                            "{e}; impersonation could not be checked, retry shortly"
                        )),
                        Some(StatusDetails {
                            retry_after_seconds: Some(1),
                            ..Default::default()
                        }),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// kube's 401: the body says only "Unauthorized" (why is for the log, not the caller).
fn unauthorized(why: &str) -> Response {
    tracing::debug!(reason = %why, "authentication failed");
    status_response(StatusCode::UNAUTHORIZED, "Unauthorized", None)
}

/// The 503 for a review that could not be made. Unauthenticated callers read it, so the
/// addresses in the error (the core's URL) are taken out; the warning logged before keeps them.
fn unavailable(why: &str) -> Response {
    status_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &without_addresses(&format!(
            "{why}; the credential could not be checked, retry shortly"
        )),
        Some(StatusDetails {
            retry_after_seconds: Some(1),
            ..Default::default()
        }),
    )
}

/// Removes and returns every header whose name starts with `prefix`.
fn take_prefixed(headers: &mut HeaderMap, prefix: &str) -> Vec<(HeaderName, HeaderValue)> {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with(prefix))
        .cloned()
        .collect();
    let mut out = Vec::new();
    for name in names {
        for v in headers.get_all(&name) {
            out.push((name.clone(), v.clone()));
        }
        headers.remove(&name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underscore_identity_headers_are_dropped_unread() {
        let mut h = HeaderMap::new();
        h.insert("x_remote_user", "admin".parse().unwrap());
        h.insert("x_remote_group", "system:masters".parse().unwrap());
        h.insert("impersonate_user", "admin".parse().unwrap());
        h.insert("x_remote_extra_foo", "bar".parse().unwrap());
        // Not an impersonation request: kube reads only the dash spelling.
        assert!(!impersonation::requested(&h));
        assert!(impersonation::parse(&h).unwrap().is_none());
        assert!(requestheader::user_from_headers(&h).is_none());
        strip_identity_headers(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn authenticated_group_is_added_once() {
        let u = with_authenticated_group(UserInfo {
            name: "a".into(),
            groups: vec!["dev".into()],
            ..Default::default()
        });
        assert_eq!(u.groups, ["dev", AUTHENTICATED]);
        assert_eq!(with_authenticated_group(u.clone()).groups, u.groups);
        assert_eq!(
            with_authenticated_group(UserInfo::anonymous()).groups,
            [UNAUTHENTICATED]
        );
    }

    #[test]
    fn taking_headers_keeps_every_value() {
        let mut h = HeaderMap::new();
        h.append("impersonate-group", "a".parse().unwrap());
        h.append("impersonate-group", "b".parse().unwrap());
        h.append("impersonate-user", "u".parse().unwrap());
        h.append("accept", "*/*".parse().unwrap());
        let taken = take_prefixed(&mut h, "impersonate-");
        assert_eq!(taken.len(), 3);
        assert_eq!(h.len(), 1);
    }
}
