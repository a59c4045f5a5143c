//! FlowSchemas read with kube's v1 defaults, validated as kube validates them, and compiled into
//! the forms `rules.rs` matches requests against.

use std::sync::Arc;

use gateway_request::names::dns1123_subdomain_errors;
use k8s_openapi::api::flowcontrol::v1 as api;

use super::{invalid, Invalid};
use crate::bootstrap::{self, EXEMPT};

/// FlowSchemas match in increasing matchingPrecedence, up to this.
pub const MAX_MATCHING_PRECEDENCE: i32 = 10_000;
const DEFAULT_MATCHING_PRECEDENCE: i32 = 1000;
/// Verbs a policy rule may name, besides `*`.
const SUPPORTED_VERBS: [&str; 9] = [
    "get",
    "list",
    "create",
    "update",
    "delete",
    "deletecollection",
    "patch",
    "watch",
    "proxy",
];

/// A FlowSchema as the gateway matches requests against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaSpec {
    pub name: Arc<str>,
    pub uid: Arc<str>,
    pub matching_precedence: i32,
    pub level: String,
    pub distinguisher: Option<Distinguisher>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distinguisher {
    ByUser,
    ByNamespace,
}

/// One `PolicyRulesWithSubjects`: a request matches when a subject and one of the rules for its
/// kind (resource or non-resource) match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub subjects: Vec<SubjectSpec>,
    pub resource_rules: Vec<ResourceRule>,
    pub non_resource_rules: Vec<NonResourceRule>,
}

/// A name, or `*` for any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    Any,
    Exact(String),
}

impl Name {
    fn new(s: &str) -> Self {
        if s == "*" {
            Self::Any
        } else {
            Self::Exact(s.to_owned())
        }
    }

    pub fn matches(&self, s: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(e) => e == s,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectSpec {
    User(Name),
    Group(Name),
    /// `name` `Any`: every ServiceAccount of the namespace.
    ServiceAccount {
        namespace: String,
        name: Name,
    },
}

/// A list that is either `["*"]` (anything) or values compared exactly (kube's
/// `containsString`; validation keeps `*` out of longer lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Set {
    Any,
    Of(Vec<String>),
}

impl Set {
    fn new(v: &[String]) -> Self {
        if v.len() == 1 && v[0] == "*" {
            Self::Any
        } else {
            Self::Of(v.to_vec())
        }
    }

    pub fn contains(&self, s: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Of(v) => v.iter().any(|x| x == s),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRule {
    pub verbs: Set,
    pub api_groups: Set,
    /// `resource` or `resource/subresource`, split once at the first `/` (kube joins the
    /// request's instead; the comparison is the same, without building a string per request).
    pub resources: ResourceSet,
    pub namespaces: Set,
    pub cluster_scope: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceSet {
    Any,
    Of(Vec<(String, String)>),
}

impl ResourceSet {
    pub fn contains(&self, resource: &str, subresource: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Of(v) => v.iter().any(|(r, s)| r == resource && s == subresource),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonResourceRule {
    pub verbs: Set,
    pub urls: Vec<NonResourceUrl>,
}

/// A non-resource URL of a rule: `*`, or a path that matches itself and everything under it
/// (`/apis` matches `/apis/x`; a trailing `/*` says the same), as kube's
/// `matchPolicyRuleNonResourceURL` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NonResourceUrl {
    Any,
    Path { exact: String, prefix: String },
}

impl NonResourceUrl {
    fn new(url: &str) -> Self {
        if url == "*" {
            return Self::Any;
        }
        let mut prefix = url.strip_suffix('*').unwrap_or(url).to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self::Path {
            exact: url.to_owned(),
            prefix,
        }
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Path { exact, prefix } => path == exact || path.starts_with(prefix.as_str()),
        }
    }
}

impl SchemaSpec {
    /// Reads and validates a FlowSchema.
    pub fn from_api(fs: &api::FlowSchema) -> Result<Self, Invalid> {
        let name = fs.metadata.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return invalid("metadata.name is required");
        }
        let spec = &fs.spec;
        let mandatory = bootstrap::mandatory_flow_schemas();
        if let Some(fixed) = mandatory
            .iter()
            .find(|m| m.metadata.name.as_deref() == Some(name))
        {
            let mut have = spec.clone();
            if have.matching_precedence.unwrap_or(0) == 0 {
                have.matching_precedence = Some(DEFAULT_MATCHING_PRECEDENCE);
            }
            if have != fixed.spec {
                return invalid(format!("spec of '{name}' must equal the fixed value"));
            }
        }
        let precedence = match spec.matching_precedence.unwrap_or(0) {
            0 => DEFAULT_MATCHING_PRECEDENCE,
            p => p,
        };
        if !(1..=MAX_MATCHING_PRECEDENCE).contains(&precedence) {
            return invalid(format!(
                "matchingPrecedence {precedence}: must be between 1 and {MAX_MATCHING_PRECEDENCE}"
            ));
        }
        if precedence == 1 && name != EXEMPT {
            return invalid("only the schema named 'exempt' may have matchingPrecedence 1");
        }
        let distinguisher = match spec.distinguisher_method.as_ref().map(|d| d.type_.as_str()) {
            None => None,
            Some("ByUser") => Some(Distinguisher::ByUser),
            Some("ByNamespace") => Some(Distinguisher::ByNamespace),
            Some(other) => {
                return invalid(format!(
                    "distinguisherMethod.type {other:?}: must be 'ByNamespace' or 'ByUser'"
                ))
            }
        };
        let level = &spec.priority_level_configuration.name;
        if level.is_empty() {
            return invalid("priorityLevelConfiguration.name: must reference a priority level");
        }
        let rules = spec
            .rules
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| rule(r).map_err(|e| Invalid(format!("rules[{i}]: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name: name.into(),
            uid: fs.metadata.uid.as_deref().unwrap_or_default().into(),
            matching_precedence: precedence,
            level: level.clone(),
            distinguisher,
            rules,
        })
    }
}

fn rule(r: &api::PolicyRulesWithSubjects) -> Result<Rule, Invalid> {
    if r.subjects.is_empty() {
        return invalid("subjects must contain at least one value");
    }
    let subjects = r
        .subjects
        .iter()
        .enumerate()
        .map(|(i, s)| subject(s).map_err(|e| Invalid(format!("subjects[{i}]: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let resource = r.resource_rules.as_deref().unwrap_or_default();
    let non_resource = r.non_resource_rules.as_deref().unwrap_or_default();
    if resource.is_empty() && non_resource.is_empty() {
        return invalid("at least one of resourceRules and nonResourceRules has to be non-empty");
    }
    Ok(Rule {
        subjects,
        resource_rules: resource
            .iter()
            .enumerate()
            .map(|(i, r)| resource_rule(r).map_err(|e| Invalid(format!("resourceRules[{i}]: {e}"))))
            .collect::<Result<_, _>>()?,
        non_resource_rules: non_resource
            .iter()
            .enumerate()
            .map(|(i, r)| {
                non_resource_rule(r).map_err(|e| Invalid(format!("nonResourceRules[{i}]: {e}")))
            })
            .collect::<Result<_, _>>()?,
    })
}

fn subject(s: &api::Subject) -> Result<SubjectSpec, Invalid> {
    let (user, group, sa) = (&s.user, &s.group, &s.service_account);
    match s.kind.as_str() {
        "User" if group.is_none() && sa.is_none() => match user {
            Some(u) if !u.name.is_empty() => Ok(SubjectSpec::User(Name::new(&u.name))),
            _ => invalid("user.name is required when kind is 'User'"),
        },
        "Group" if user.is_none() && sa.is_none() => match group {
            Some(g) if !g.name.is_empty() => Ok(SubjectSpec::Group(Name::new(&g.name))),
            _ => invalid("group.name is required when kind is 'Group'"),
        },
        "ServiceAccount" if user.is_none() && group.is_none() => match sa {
            Some(sa) if !sa.name.is_empty() => {
                if !is_dns_label(&sa.namespace) {
                    return invalid(format!(
                        "serviceAccount.namespace {:?}: must be a DNS-1123 label",
                        sa.namespace
                    ));
                }
                if sa.name != "*" && !is_dns_subdomain(&sa.name) {
                    return invalid(format!(
                        "serviceAccount.name {:?}: must be '*' or a DNS-1123 subdomain",
                        sa.name
                    ));
                }
                Ok(SubjectSpec::ServiceAccount {
                    namespace: sa.namespace.clone(),
                    name: Name::new(&sa.name),
                })
            }
            _ => invalid("serviceAccount.name is required when kind is 'ServiceAccount'"),
        },
        "User" | "Group" | "ServiceAccount" => {
            invalid(format!("only the member for kind {:?} may be set", s.kind))
        }
        other => invalid(format!(
            "kind {other:?}: must be 'Group', 'ServiceAccount' or 'User'"
        )),
    }
}

/// `*` alone, or values none of which is `*`.
fn wildcard_alone(field: &str, v: &[String]) -> Result<Set, Invalid> {
    if v.is_empty() {
        return invalid(format!("{field} must contain at least one value"));
    }
    if v.len() > 1 && v.iter().any(|x| x == "*") {
        return invalid(format!(
            "{field}: if '*' is present, it must be the only value"
        ));
    }
    Ok(Set::new(v))
}

fn verbs(v: &[String]) -> Result<Set, Invalid> {
    let set = wildcard_alone("verbs", v)?;
    if let Some(bad) = v
        .iter()
        .find(|x| *x != "*" && !SUPPORTED_VERBS.contains(&x.as_str()))
    {
        return invalid(format!("verbs: unsupported verb {bad:?}"));
    }
    Ok(set)
}

fn resource_rule(r: &api::ResourcePolicyRule) -> Result<ResourceRule, Invalid> {
    let verbs = verbs(&r.verbs)?;
    let api_groups = wildcard_alone("apiGroups", &r.api_groups)?;
    let resources = match wildcard_alone("resources", &r.resources)? {
        Set::Any => ResourceSet::Any,
        Set::Of(v) => ResourceSet::Of(
            v.into_iter()
                .map(|r| match r.split_once('/') {
                    Some((res, sub)) => (res.to_owned(), sub.to_owned()),
                    None => (r, String::new()),
                })
                .collect(),
        ),
    };
    let cluster_scope = r.cluster_scope.unwrap_or(false);
    let listed = r.namespaces.as_deref().unwrap_or_default();
    let namespaces = if listed.is_empty() {
        if !cluster_scope {
            return invalid(
                "resource rules that are not cluster scoped must supply at least one namespace",
            );
        }
        Set::Of(Vec::new())
    } else {
        let set = wildcard_alone("namespaces", listed)?;
        if let Some(bad) = listed.iter().find(|n| *n != "*" && !is_dns_label(n)) {
            return invalid(format!(
                "namespaces: {bad:?} must be '*' or a DNS-1123 label"
            ));
        }
        set
    };
    Ok(ResourceRule {
        verbs,
        api_groups,
        resources,
        namespaces,
        cluster_scope,
    })
}

fn non_resource_rule(r: &api::NonResourcePolicyRule) -> Result<NonResourceRule, Invalid> {
    let verbs = verbs(&r.verbs)?;
    wildcard_alone("nonResourceURLs", &r.non_resource_urls)?;
    for url in &r.non_resource_urls {
        non_resource_url_valid(url)?;
    }
    Ok(NonResourceRule {
        verbs,
        urls: r
            .non_resource_urls
            .iter()
            .map(|u| NonResourceUrl::new(u))
            .collect(),
    })
}

/// kube's `ValidateNonResourceURLPath`.
fn non_resource_url_valid(path: &str) -> Result<(), Invalid> {
    if path == "*" || path == "/" {
        return Ok(());
    }
    let bad = |why: &str| invalid(format!("nonResourceURLs: {path:?} {why}"));
    if path.is_empty() {
        return bad("must not be empty");
    }
    if !path.starts_with('/') {
        return bad("must start with slash");
    }
    if path.contains(' ') {
        return bad("must not contain white-space");
    }
    if path.contains("//") {
        return bad("must not contain double slash");
    }
    let stars = path.matches('*').count();
    if stars > 1 || (stars == 1 && !path.ends_with("/*")) {
        return bad("may only have a wildcard as a '/*' suffix");
    }
    Ok(())
}

/// apimachinery's `IsDNS1123Label` (what a namespace name is).
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

fn is_dns_subdomain(s: &str) -> bool {
    dns1123_subdomain_errors(s).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(json: serde_json::Value) -> Result<SchemaSpec, Invalid> {
        SchemaSpec::from_api(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn kube_defaults_fill_what_a_core_left_out() {
        let fs = schema(serde_json::json!({
            "metadata": {"name": "team"},
            "spec": {"priorityLevelConfiguration": {"name": "team"}, "rules": []}
        }))
        .unwrap();
        assert_eq!(fs.matching_precedence, 1000);
    }

    #[test]
    fn what_kube_validation_refuses_is_ignored_with_its_reason() {
        let rule = |r: serde_json::Value| {
            schema(serde_json::json!({"metadata": {"name": "s"}, "spec": {
                "priorityLevelConfiguration": {"name": "p"}, "rules": [r]}}))
        };
        let cases = [
            (
                serde_json::json!({"subjects": [], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}),
                "subjects must contain",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "group": {"name": "g"}}], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}),
                "only the member",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "Robot"}], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}),
                "kind \"Robot\"",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": "A:b", "name": "*"}}], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}),
                "DNS-1123 label",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "user": {"name": "u"}}]}),
                "at least one of",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "user": {"name": "u"}}], "resourceRules": [{"verbs": ["get", "*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true}]}),
                "only value",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "user": {"name": "u"}}], "resourceRules": [{"verbs": ["fly"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true}]}),
                "unsupported verb",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "user": {"name": "u"}}], "resourceRules": [{"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}]}),
                "not cluster scoped",
            ),
            (
                serde_json::json!({"subjects": [{"kind": "User", "user": {"name": "u"}}], "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/a/*/b"]}]}),
                "wildcard",
            ),
        ];
        for (json, want) in cases {
            let err = rule(json.clone()).unwrap_err().to_string();
            assert!(err.contains(want), "{json}: {err}");
        }
        let err = schema(serde_json::json!({"metadata": {"name": "s"}, "spec": {
            "priorityLevelConfiguration": {"name": "p"}, "matchingPrecedence": 1}}))
        .unwrap_err();
        assert!(err.0.contains("only the schema named 'exempt'"), "{err}");
        let err = schema(serde_json::json!({"metadata": {"name": "s"}, "spec": {
            "priorityLevelConfiguration": {"name": "p"}, "distinguisherMethod": {"type": "ByColour"}}}))
        .unwrap_err();
        assert!(err.0.contains("ByColour"), "{err}");
    }

    #[test]
    fn non_resource_urls_match_themselves_and_what_is_under_them() {
        let healthz = NonResourceUrl::new("/healthz");
        assert!(healthz.matches("/healthz"));
        assert!(healthz.matches("/healthz/etcd"));
        assert!(!healthz.matches("/healthzx"));
        let apis = NonResourceUrl::new("/apis/*");
        assert!(apis.matches("/apis/x"));
        assert!(apis.matches("/apis/"));
        assert!(!apis.matches("/api"));
        assert!(NonResourceUrl::new("*").matches("/anything"));
    }
}
