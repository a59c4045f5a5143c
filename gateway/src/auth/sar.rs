//! SubjectAccessReview against the core (`authorization.k8s.io/v1`), with a decision cache.
//!
//! **Shared by request authorization (`front::stack::authz`) and impersonation checks
//! (`auth::impersonation`).** Describe the question as [`Attributes`] (who: a `UserInfo`; what:
//! an [`Action`]) and call [`cached_review`] with a [`DecisionCache`].
//!
//! Allowed and denied decisions are cached for different times (kube's webhook authorizer
//! defaults: 5m / 30s). Errors (core unreachable, timed out, 5xx) are never cached. The cache key
//! is the SHA-256 of the whole review spec (user, groups, uid, extra and attributes), and
//! concurrent identical questions share one review.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use apiservice::outage::Outage;

use super::cache::{key_of, TtlCache};
use super::selector::{self, Selectors};
use crate::error::kube_client_message;
use crate::identity::UserInfo;

/// How long a review may take before it counts as failed.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// What is being done, with kube's attribute names; empty strings mean "not set" (except
/// `group`, where empty is the core group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        version: &'a str,
        resource: &'a str,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
    },
    NonResource {
        path: &'a str,
        verb: &'a str,
    },
}

impl<'a> Action<'a> {
    /// The attributes kube-apiserver's authorization filter derives from a request, asked with
    /// `verb` (the request's own, or a constrained impersonation's `impersonate-on:<mode>:<verb>`).
    pub fn of_request(info: &'a crate::request_info::RequestInfo, verb: &'a str) -> Self {
        if info.is_resource_request {
            Action::Resource {
                verb,
                group: info.api_group(),
                version: info.api_version(),
                resource: info.resource(),
                subresource: info.subresource(),
                namespace: info.namespace(),
                name: info.name(),
            }
        } else {
            Action::NonResource {
                path: info.path(),
                verb,
            }
        }
    }
}

/// The question: may `user` perform `action`, limited to what `selectors` select?
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    pub user: &'a UserInfo,
    pub action: Action<'a>,
    /// The raw selectors of a list, watch or deletecollection (see `auth::selector`); ignored
    /// for a non-resource action.
    pub selectors: Selectors<'a>,
}

/// The core's answer. `allowed` is false both for an explicit deny and for no opinion (a single
/// webhook authorizer's no opinion is a no).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// `status.reason` (may be empty).
    pub reason: Arc<str>,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum SarError {
    /// The core could not be asked, or did not answer with a review.
    #[error("authorization webhook unavailable: {0}")]
    Unavailable(Arc<str>),
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The review spec kube's webhook authorizer would send for `attrs`.
pub fn spec(attrs: &Attributes<'_>) -> SubjectAccessReviewSpec {
    let user = attrs.user;
    let mut spec = SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        uid: opt(&user.uid),
        groups: Some(user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        ..Default::default()
    };
    match attrs.action {
        Action::Resource {
            verb,
            group,
            version,
            resource,
            subresource,
            namespace,
            name,
        } => {
            spec.resource_attributes = Some(ResourceAttributes {
                verb: opt(verb),
                group: Some(group.to_owned()),
                version: opt(version),
                resource: opt(resource),
                subresource: opt(subresource),
                namespace: opt(namespace),
                name: opt(name),
                // What kube's webhook authorizer sends: the parsed requirements, or nothing for
                // a selector that does not parse.
                field_selector: selector::field_attributes(attrs.selectors.field),
                label_selector: selector::label_attributes(attrs.selectors.label),
            })
        }
        Action::NonResource { path, verb } => {
            spec.non_resource_attributes = Some(NonResourceAttributes {
                path: opt(path),
                verb: opt(verb),
            })
        }
    }
    spec
}

/// One uncached SubjectAccessReview; a review that cannot be made is logged by `outage`.
async fn review_spec(
    client: &kube::Client,
    outage: &Outage,
    spec: SubjectAccessReviewSpec,
) -> Result<Decision, SarError> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let sar = SubjectAccessReview {
        spec,
        ..Default::default()
    };
    let created = match tokio::time::timeout(
        REVIEW_TIMEOUT,
        api.create(&PostParams::default(), &sar),
    )
    .await
    {
        Ok(Ok(created)) => created,
        Ok(Err(e)) => {
            outage.failed(&e);
            return Err(SarError::Unavailable(kube_client_message(&e).into()));
        }
        Err(_) => {
            let message = format!("no answer within {}s", REVIEW_TIMEOUT.as_secs());
            outage.failed_with(&message);
            return Err(SarError::Unavailable(message.into()));
        }
    };
    outage.answered();
    let status = created.status.unwrap_or_default();
    let denied = status.denied.unwrap_or(false);
    Ok(Decision {
        // kube's webhook authorizer refuses an answer that is both allowed and denied.
        allowed: status.allowed && !denied,
        reason: status.reason.unwrap_or_default().into(),
    })
}

/// Bounded (10 000 decisions) TTL cache of review decisions, and the log of the reviews that
/// could not be made (once per outage of the core, not once per request).
pub struct DecisionCache {
    cache: TtlCache<Decision, SarError>,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    outage: Outage,
}

impl DecisionCache {
    /// `client` names the reviews in the log: `SubjectAccessReview`, or of what.
    pub fn new(client: &'static str, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        Self {
            cache: TtlCache::new(10_000),
            allowed_ttl,
            denied_ttl,
            outage: Outage::new(
                client,
                "requests it must authorize answer 503 until it is back",
            ),
        }
    }
}

/// The decision for `attrs` from `cache` or, on a miss, from the core; the flag says whether it
/// came from the cache.
pub async fn cached_review(
    client: &kube::Client,
    cache: &DecisionCache,
    attrs: &Attributes<'_>,
) -> Result<(Decision, bool), SarError> {
    let spec = spec(attrs);
    // serde_json writes struct fields in declaration order and `extra` (a BTreeMap) sorted, so
    // equal questions give equal bytes.
    let key = key_of(&serde_json::to_vec(&spec).unwrap_or_default());
    if let Some(d) = cache.cache.get(&key) {
        return Ok((d, true));
    }
    let (allowed_ttl, denied_ttl) = (cache.allowed_ttl, cache.denied_ttl);
    let decision = cache
        .cache
        .get_or_fetch(
            key,
            |d: &Decision| if d.allowed { allowed_ttl } else { denied_ttl },
            || review_spec(client, &cache.outage, spec),
        )
        .await?;
    Ok((decision, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn specs_carry_the_whole_user_and_the_core_group() {
        let mut extra = BTreeMap::new();
        extra.insert("scopes".to_owned(), vec!["a".to_owned()]);
        let user = UserInfo {
            name: "alice".into(),
            uid: "1".into(),
            groups: vec!["dev".into()],
            extra,
        };
        let attrs = Attributes {
            user: &user,
            action: Action::Resource {
                verb: "impersonate",
                group: "",
                version: "",
                resource: "users",
                subresource: "",
                namespace: "",
                name: "bob",
            },
            selectors: Selectors::NONE,
        };
        let json = serde_json::to_value(spec(&attrs)).unwrap();
        assert_eq!(json["user"], "alice");
        assert_eq!(json["uid"], "1");
        assert_eq!(json["groups"][0], "dev");
        assert_eq!(json["extra"]["scopes"][0], "a");
        assert_eq!(json["resourceAttributes"]["group"], "");
        assert_eq!(json["resourceAttributes"]["name"], "bob");
        assert!(json["resourceAttributes"].get("namespace").is_none());
    }
}
