//! `Impersonate-User`, `-Group`, `-Uid` and `-Extra-<key>`, honoured the way kube-apiserver's
//! impersonation filter honours them: every requested attribute is checked with a
//! SubjectAccessReview for verb `impersonate` on behalf of the authenticated requestor, one after
//! another in kube's order, and the first refusal ends it; only when all are allowed does the
//! request continue as the impersonated user.
//!
//! Each check may cost the core a review (random names miss the decision cache), so what one
//! request may ask for is capped at [`MAX_ATTRIBUTES`]; kube has no such cap, but its checks are
//! in-process.

use std::collections::BTreeMap;

use apiservice::validation::dns1123_subdomain_errors;
use http::HeaderMap;

use super::requestheader::values;
use super::sar::Action;
use crate::identity::{UserInfo, ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED};

pub const USER: &str = "impersonate-user";
pub const GROUP: &str = "impersonate-group";
pub const UID: &str = "impersonate-uid";
pub const EXTRA_PREFIX: &str = "impersonate-extra-";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// The most attributes (the user, its UID, each group, each extra value) one request may ask to
/// impersonate. Above what front proxies that impersonate with a user's every group send (an
/// OIDC token carries at most 200, Azure AD's cap); far below the thousand reviews a single
/// request could otherwise ask of the core.
pub const MAX_ATTRIBUTES: usize = 256;

/// One attribute to be allowed, in kube's order: the user (or service account), each group,
/// each extra value, the UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Check {
    /// The attributes kube's impersonation filter authorizes for this check.
    pub fn action(&self) -> Action<'_> {
        let resource = |group, resource, subresource, namespace, name| Action::Resource {
            verb: "impersonate",
            group,
            version: "",
            resource,
            subresource,
            namespace,
            name,
        };
        match self {
            Self::User(name) => resource("", "users", "", "", name),
            Self::ServiceAccount { namespace, name } => {
                resource("", "serviceaccounts", "", namespace, name)
            }
            Self::Group(name) => resource("", "groups", "", "", name),
            Self::Extra { key, value } => {
                resource(AUTHENTICATION_GROUP, "userextras", key, "", value)
            }
            Self::Uid(uid) => resource(AUTHENTICATION_GROUP, "uids", "", "", uid),
        }
    }
}

/// What the caller asked to be treated as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImpersonationError {
    #[error("requested impersonation of {0} without impersonating a user (Impersonate-User)")]
    NoUser(&'static str),
    #[error(
        "requested impersonation of {0} attributes (the user, its UID, each Impersonate-Group \
         and each Impersonate-Extra-* value); at most {MAX_ATTRIBUTES} are allowed, send fewer \
         groups or extra values"
    )]
    TooMany(usize),
}

/// Whether any impersonation header is present (cheap check for the common case).
pub fn requested(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
}

/// The impersonation the headers ask for; `None` when they ask for none. Groups, extras or a UID
/// without a user is a malformed request (kube answers it with an error too).
pub fn parse(headers: &HeaderMap) -> Result<Option<Request>, ImpersonationError> {
    let user = values(headers, USER).next().unwrap_or_default().to_owned();
    let uid = values(headers, UID).next().unwrap_or_default().to_owned();
    let groups: Vec<String> = values(headers, GROUP).map(str::to_owned).collect();
    let extra = super::requestheader::extras(headers, EXTRA_PREFIX);
    if user.is_empty() {
        return match () {
            _ if !groups.is_empty() => Err(ImpersonationError::NoUser("groups")),
            _ if !extra.is_empty() => Err(ImpersonationError::NoUser("user extras")),
            _ if !uid.is_empty() => Err(ImpersonationError::NoUser("a UID")),
            _ => Ok(None),
        };
    }
    let requested = 1
        + usize::from(!uid.is_empty())
        + groups.len()
        + extra.values().map(Vec::len).sum::<usize>();
    if requested > MAX_ATTRIBUTES {
        return Err(ImpersonationError::TooMany(requested));
    }
    Ok(Some(Request {
        user,
        uid,
        groups,
        extra,
    }))
}

/// `system:serviceaccount:<namespace>:<name>` split as kube's `serviceaccount.SplitUsername`
/// splits it: exactly two parts after the prefix, the namespace a DNS-1123 label
/// (`ValidateNamespaceName`) and the name a DNS-1123 subdomain (`ValidateServiceAccountName`).
/// Anything else names no service account (`system:serviceaccount:team:Admin`, `..`): kube
/// checks it as a plain user (`impersonate users`) and gives it no service-account groups, so
/// the same goes here; a looser split would ask the core about `serviceaccounts` the caller may
/// impersonate and forward groups the name never earns.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    // A ':' in the name fails the subdomain check: kube's split into more than two parts.
    (is_dns1123_label(ns) && dns1123_subdomain_errors(name).is_empty()).then_some((ns, name))
}

/// apimachinery's `IsDNS1123Label`: at most 63 characters of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && dns1123_subdomain_errors(s).is_empty()
}

/// Every attribute the requestor must be allowed to impersonate, in kube's order.
pub fn checks(req: &Request) -> Vec<Check> {
    let mut out = Vec::with_capacity(1 + req.groups.len() + req.extra.len() + 1);
    out.push(match service_account(&req.user) {
        Some((namespace, name)) => Check::ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        None => Check::User(req.user.clone()),
    });
    out.extend(req.groups.iter().cloned().map(Check::Group));
    for (key, vals) in &req.extra {
        out.extend(vals.iter().map(|value| Check::Extra {
            key: key.clone(),
            value: value.clone(),
        }));
    }
    if !req.uid.is_empty() {
        out.push(Check::Uid(req.uid.clone()));
    }
    out
}

/// The user the request continues as once every check passed: a service account without
/// requested groups gets its two service-account groups; `system:authenticated` is added unless
/// impersonating `system:anonymous` (which gets `system:unauthenticated`) or either group was
/// requested explicitly.
pub fn impersonated_user(req: &Request) -> UserInfo {
    let mut groups = req.groups.clone();
    if let (Some((ns, _)), true) = (service_account(&req.user), groups.is_empty()) {
        groups.push("system:serviceaccounts".to_owned());
        groups.push(format!("system:serviceaccounts:{ns}"));
    }
    if req.user == ANONYMOUS {
        if !groups.iter().any(|g| g == UNAUTHENTICATED) {
            groups.push(UNAUTHENTICATED.to_owned());
        }
    } else if !groups
        .iter()
        .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        groups.push(AUTHENTICATED.to_owned());
    }
    UserInfo {
        name: req.user.clone(),
        uid: req.uid.clone(),
        groups,
        extra: req.extra.clone(),
    }
}

/// The `Impersonate-*` headers that make the core treat a request as `user`: used when the
/// gateway speaks to the core with its own credentials (`--core-identity=impersonate`). The
/// `system:authenticated`/`system:unauthenticated` groups are left out: the core adds them
/// itself, and asking for them explicitly would need impersonate rights on them.
pub fn set_headers(headers: &mut HeaderMap, user: &UserInfo) {
    use http::header::{HeaderName, HeaderValue};
    let mut put = |name: HeaderName, value: &str| match HeaderValue::from_str(value) {
        Ok(v) => {
            headers.append(name, v);
        }
        Err(_) => {
            tracing::warn!(header = %name, "identity value is not a valid header value; skipped")
        }
    };
    put(HeaderName::from_static(USER), &user.name);
    if !user.uid.is_empty() {
        put(HeaderName::from_static(UID), &user.uid);
    }
    for g in &user.groups {
        if g != AUTHENTICATED && g != UNAUTHENTICATED {
            put(HeaderName::from_static(GROUP), g);
        }
    }
    for (key, vals) in &user.extra {
        let Ok(name) = HeaderName::from_bytes(
            format!("{EXTRA_PREFIX}{}", crate::identity::encode_extra_key(key)).as_bytes(),
        ) else {
            continue;
        };
        for v in vals {
            put(name.clone(), v);
        }
    }
}

mod constrained;

pub use constrained::{constrained_plans, Ask, Mode, Plan, Step};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::forbidden::forbidden;
    use crate::test_util::headers;

    #[test]
    fn no_headers_no_impersonation() {
        assert_eq!(parse(&headers(&[("Accept", "*/*")])), Ok(None));
        assert!(!requested(&headers(&[("Accept", "*/*")])));
    }

    #[test]
    fn attributes_without_a_user_are_refused() {
        let err = parse(&headers(&[("Impersonate-Group", "system:masters")])).unwrap_err();
        assert_eq!(err, ImpersonationError::NoUser("groups"));
        assert!(parse(&headers(&[("Impersonate-Uid", "1")])).is_err());
        assert!(parse(&headers(&[("Impersonate-Extra-Scopes", "x")])).is_err());
    }

    #[test]
    fn more_attributes_than_the_cap_are_refused_before_any_check() {
        let mut h = headers(&[("Impersonate-User", "bob"), ("Impersonate-Uid", "1")]);
        for i in 0..MAX_ATTRIBUTES - 3 {
            h.append(GROUP, format!("g{i}").parse().unwrap());
        }
        h.append("impersonate-extra-scopes", "a".parse().unwrap());
        let at_cap = parse(&h).unwrap().unwrap();
        assert_eq!(checks(&at_cap).len(), MAX_ATTRIBUTES);
        h.append("impersonate-extra-scopes", "b".parse().unwrap());
        let err = parse(&h).unwrap_err();
        assert_eq!(err, ImpersonationError::TooMany(MAX_ATTRIBUTES + 1));
        assert!(err.to_string().contains("at most 256 are allowed"), "{err}");
    }

    #[test]
    fn checks_follow_kubes_order_and_attributes() {
        let req = parse(&headers(&[
            ("Impersonate-User", "bob"),
            ("Impersonate-Group", "dev"),
            ("Impersonate-Group", "ops"),
            ("Impersonate-Extra-Acme.com%2FProject", "p1"),
            ("Impersonate-Extra-Acme.com%2FProject", "p2"),
            ("Impersonate-Uid", "1234"),
        ]))
        .unwrap()
        .unwrap();
        let checks = checks(&req);
        assert_eq!(
            checks,
            [
                Check::User("bob".into()),
                Check::Group("dev".into()),
                Check::Group("ops".into()),
                Check::Extra {
                    key: "acme.com/project".into(),
                    value: "p1".into()
                },
                Check::Extra {
                    key: "acme.com/project".into(),
                    value: "p2".into()
                },
                Check::Uid("1234".into()),
            ]
        );
        assert_eq!(
            checks[3].action(),
            Action::Resource {
                verb: "impersonate",
                group: "authentication.k8s.io",
                version: "",
                resource: "userextras",
                subresource: "acme.com/project",
                namespace: "",
                name: "p1",
            }
        );
        assert_eq!(
            checks[5].action(),
            Action::Resource {
                verb: "impersonate",
                group: "authentication.k8s.io",
                version: "",
                resource: "uids",
                subresource: "",
                namespace: "",
                name: "1234",
            }
        );
        let user = impersonated_user(&req);
        assert_eq!(user.groups, ["dev", "ops", AUTHENTICATED]);
        assert_eq!(user.uid, "1234");
        assert_eq!(user.extra["acme.com/project"], ["p1", "p2"]);
    }

    #[test]
    fn service_accounts_are_namespaced_checks_with_default_groups() {
        let req = parse(&headers(&[(
            "Impersonate-User",
            "system:serviceaccount:kube-system:default",
        )]))
        .unwrap()
        .unwrap();
        let check = &checks(&req)[0];
        assert_eq!(
            check,
            &Check::ServiceAccount {
                namespace: "kube-system".into(),
                name: "default".into()
            }
        );
        let (message, _) = forbidden("alice", &check.action(), "");
        assert_eq!(
            message,
            r#"serviceaccounts "default" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "kube-system""#
        );
        assert_eq!(
            impersonated_user(&req).groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                AUTHENTICATED
            ]
        );
    }

    /// kube's `serviceaccount.SplitUsername` takes a name for a service account only when its
    /// namespace is a DNS-1123 label and its name a DNS-1123 subdomain; anything else is a plain
    /// user: checked as `impersonate users` and impersonated without the service-account groups.
    #[test]
    fn malformed_service_account_names_are_plain_users() {
        for user in [
            "system:serviceaccount:team:Admin",
            "system:serviceaccount:team:cluster admin",
            "system:serviceaccount:team:..",
            "system:serviceaccount:team:.default",
            "system:serviceaccount:team:default.",
            "system:serviceaccount:team:a..b",
            "system:serviceaccount:team:-default",
            "system:serviceaccount:team:default_1",
            "system:serviceaccount:Team:default",
            "system:serviceaccount:te.am:default",
            "system:serviceaccount:team-:default",
            "system:serviceaccount::default",
            "system:serviceaccount:team:",
            "system:serviceaccount:team:a:b",
            &format!("system:serviceaccount:{}:default", "n".repeat(64)),
            &format!("system:serviceaccount:team:{}", "n".repeat(254)),
        ] {
            let req = Request {
                user: user.to_owned(),
                ..Default::default()
            };
            assert_eq!(checks(&req), [Check::User(user.to_owned())], "{user}");
            assert_eq!(impersonated_user(&req).groups, [AUTHENTICATED], "{user}");
        }
        for (user, namespace, name) in [
            ("system:serviceaccount:team:default", "team", "default"),
            ("system:serviceaccount:team-1:a.b-c.d", "team-1", "a.b-c.d"),
            ("system:serviceaccount:0:9", "0", "9"),
            (
                &format!(
                    "system:serviceaccount:{}:{}",
                    "n".repeat(63),
                    "m".repeat(253)
                ),
                &"n".repeat(63),
                &"m".repeat(253),
            ),
        ] {
            let req = Request {
                user: user.to_owned(),
                ..Default::default()
            };
            assert_eq!(
                checks(&req),
                [Check::ServiceAccount {
                    namespace: namespace.to_owned(),
                    name: name.to_owned()
                }],
                "{user}"
            );
            assert_eq!(
                impersonated_user(&req).groups,
                [
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                    AUTHENTICATED.to_owned()
                ],
                "{user}"
            );
        }
    }

    #[test]
    fn anonymous_and_explicit_groups() {
        let anon = impersonated_user(&Request {
            user: ANONYMOUS.into(),
            ..Default::default()
        });
        assert_eq!(anon.groups, [UNAUTHENTICATED]);
        let explicit = impersonated_user(&Request {
            user: "x".into(),
            groups: vec![UNAUTHENTICATED.into()],
            ..Default::default()
        });
        assert_eq!(explicit.groups, [UNAUTHENTICATED]);
    }

    #[test]
    fn forbidden_messages_read_like_kube() {
        let (message, details) = forbidden("alice", &Check::User("admin".into()).action(), "");
        assert_eq!(
            message,
            r#"users "admin" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
        assert_eq!(details.name.as_deref(), Some("admin"));
        assert_eq!(details.kind.as_deref(), Some("users"));
        let (message, _) = forbidden(
            "alice",
            &Check::Extra {
                key: "scopes".into(),
                value: "view".into(),
            }
            .action(),
            "no rule",
        );
        assert_eq!(
            message,
            r#"userextras.authentication.k8s.io "view" is forbidden: User "alice" cannot impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope: no rule"#
        );
    }

    #[test]
    fn outgoing_headers_leave_implicit_groups_to_the_core() {
        let mut extra = BTreeMap::new();
        extra.insert("acme.com/project".to_owned(), vec!["p1".to_owned()]);
        let user = UserInfo {
            name: "bob".into(),
            uid: "9".into(),
            groups: vec!["dev".into(), AUTHENTICATED.into()],
            extra,
        };
        let mut h = HeaderMap::new();
        set_headers(&mut h, &user);
        assert_eq!(h["impersonate-user"], "bob");
        assert_eq!(h["impersonate-uid"], "9");
        assert_eq!(h.get_all("impersonate-group").iter().count(), 1);
        assert_eq!(h["impersonate-extra-acme.com%2fproject"], "p1");
        // And they parse back to the same request.
        let back = parse(&h).unwrap().unwrap();
        assert_eq!(back.extra["acme.com/project"], ["p1"]);
    }
}
