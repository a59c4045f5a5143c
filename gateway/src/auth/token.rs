//! Bearer tokens, checked with a `TokenReview` on the core (`authentication.k8s.io/v1`), as
//! kube-apiserver's webhook token authenticator does with `--authentication-token-webhook`.
//!
//! Results are cached by the SHA-256 of the token (the token itself is never stored):
//! authenticated for `--authentication-token-webhook-cache-ttl` (2m), rejected for
//! `--authentication-token-webhook-cache-unauthorized-ttl` (10s). A review that could not be made
//! (core unreachable, timeout, error answer) is not cached, and concurrent reviews of one token
//! are made once.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

use apiservice::outage::Outage;

use super::cache::{key_of, TtlCache};
use crate::error::kube_client_message;
use crate::identity::UserInfo;

/// How long a review may take before the request fails.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The bearer token of an `Authorization: Bearer <token>` header, as kube's bearer-token
/// authenticator reads it: scheme case-insensitive, empty tokens ignored.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let mut parts = value.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = parts.next()?;
    (!token.is_empty()).then_some(token)
}

/// A review's verdict (cached both ways).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Authenticated(UserInfo),
    /// Not authenticated, with the reviewer's `status.error` if any.
    Rejected(Arc<str>),
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum TokenError {
    #[error("authentication webhook unavailable: {0}")]
    Unavailable(Arc<str>),
}

pub struct TokenReviewer {
    client: kube::Client,
    /// Reviews that could not be made, logged once per outage of the core (not per request).
    outage: Outage,
    cache: TtlCache<Verdict, TokenError>,
    ttl: Duration,
    unauthorized_ttl: Duration,
}

impl TokenReviewer {
    /// Caches up to 10 000 tokens.
    pub fn new(client: kube::Client, ttl: Duration, unauthorized_ttl: Duration) -> Self {
        Self {
            client,
            outage: Outage::new(
                "TokenReview",
                "requests with a bearer token answer 503 until it is back",
            ),
            cache: TtlCache::new(10_000),
            ttl,
            unauthorized_ttl,
        }
    }

    pub async fn review(&self, token: &str) -> Result<Verdict, TokenError> {
        let (ttl, unauthorized_ttl) = (self.ttl, self.unauthorized_ttl);
        self.cache
            .get_or_fetch(
                key_of(token.as_bytes()),
                |v| match v {
                    Verdict::Authenticated(_) => ttl,
                    Verdict::Rejected(_) => unauthorized_ttl,
                },
                || review(&self.client, &self.outage, token),
            )
            .await
    }
}

async fn review(
    client: &kube::Client,
    outage: &Outage,
    token: &str,
) -> Result<Verdict, TokenError> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: None,
        },
        ..Default::default()
    };
    let created =
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &request))
            .await
        {
            Ok(Ok(created)) => created,
            Ok(Err(e)) => {
                outage.failed(&e);
                return Err(TokenError::Unavailable(kube_client_message(&e).into()));
            }
            Err(_) => {
                let message = format!("no answer within {}s", REVIEW_TIMEOUT.as_secs());
                outage.failed_with(&message);
                return Err(TokenError::Unavailable(message.into()));
            }
        };
    outage.answered();
    Ok(verdict(created))
}

fn verdict(review: TokenReview) -> Verdict {
    let status = review.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        let why = status.error.unwrap_or_default();
        return Verdict::Rejected(why.into());
    }
    let user = status.user.unwrap_or_default();
    let name = user.username.unwrap_or_default();
    if name.is_empty() {
        return Verdict::Rejected("the token review named no user".into());
    }
    Verdict::Authenticated(UserInfo {
        name,
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bearer_tokens_are_read_like_kube() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer_token(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("Bearer ")), None);
        assert_eq!(bearer_token(&h("Basic YTpi")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn verdicts_from_review_status() {
        let ok: TokenReview = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
            "spec": {},
            "status": {"authenticated": true, "user": {"username": "alice", "uid": "7",
                        "groups": ["dev"], "extra": {"scopes": ["a"]}}}
        }))
        .unwrap();
        let Verdict::Authenticated(user) = verdict(ok) else {
            panic!("expected authenticated")
        };
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "7");
        assert_eq!(user.groups, ["dev"]);
        assert_eq!(user.extra["scopes"], ["a"]);

        let bad: TokenReview = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
            "spec": {}, "status": {"authenticated": false, "error": "invalid bearer token"}
        }))
        .unwrap();
        assert_eq!(
            verdict(bad),
            Verdict::Rejected("invalid bearer token".into())
        );
    }
}
