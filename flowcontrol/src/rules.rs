//! Whether a request matches a FlowSchema (k8s.io/apiserver `pkg/util/flowcontrol/rule.go`): some
//! rule whose subjects include the caller and whose resource rules (for a resource request) or
//! non-resource rules (otherwise) include what it asks for.

use gateway_request::identity::UserInfo;
use gateway_request::request_info::RequestInfo;

use crate::model::{Name, NonResourceRule, ResourceRule, Rule, SchemaSpec, SubjectSpec};

/// What classification looks at: the request's attributes and the caller, after
/// authentication and impersonation.
#[derive(Clone, Copy)]
pub struct RequestDigest<'a> {
    pub info: &'a RequestInfo,
    pub user: &'a UserInfo,
}

pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

pub fn matches_schema(digest: RequestDigest<'_>, schema: &SchemaSpec) -> bool {
    schema.rules.iter().any(|r| matches_rule(digest, r))
}

fn matches_rule(digest: RequestDigest<'_>, rule: &Rule) -> bool {
    if !rule
        .subjects
        .iter()
        .any(|s| matches_subject(digest.user, s))
    {
        return false;
    }
    let info = digest.info;
    if info.is_resource_request {
        rule.resource_rules
            .iter()
            .any(|r| matches_resource(info, r))
    } else {
        rule.non_resource_rules
            .iter()
            .any(|r| matches_non_resource(info, r))
    }
}

pub fn matches_subject(user: &UserInfo, subject: &SubjectSpec) -> bool {
    match subject {
        SubjectSpec::User(name) => name.matches(&user.name),
        SubjectSpec::Group(Name::Any) => true,
        SubjectSpec::Group(Name::Exact(g)) => user.groups.iter().any(|ug| ug == g),
        SubjectSpec::ServiceAccount { namespace, name } => {
            service_account_of(&user.name).is_some_and(|(ns, n)| ns == namespace && name.matches(n))
        }
    }
}

/// The namespace and name of a ServiceAccount's user name (`system:serviceaccount:<ns>:<name>`).
/// A namespace never holds a `:`, so the first one after the prefix ends it.
pub fn service_account_of(user: &str) -> Option<(&str, &str)> {
    user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?.split_once(':')
}

fn matches_resource(info: &RequestInfo, rule: &ResourceRule) -> bool {
    if !rule.verbs.contains(info.verb())
        || !rule.resources.contains(info.resource(), info.subresource())
        || !rule.api_groups.contains(info.api_group())
    {
        return false;
    }
    if info.namespace().is_empty() {
        rule.cluster_scope
    } else {
        rule.namespaces.contains(info.namespace())
    }
}

fn matches_non_resource(info: &RequestInfo, rule: &NonResourceRule) -> bool {
    rule.verbs.contains(info.verb()) && rule.urls.iter().any(|u| u.matches(info.path()))
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use crate::bootstrap;
    use crate::testing::{info, user};

    fn schema(name: &str) -> SchemaSpec {
        bootstrap::suggested_flow_schemas()
            .iter()
            .chain(&bootstrap::mandatory_flow_schemas())
            .find(|f| f.metadata.name.as_deref() == Some(name))
            .map(|f| SchemaSpec::from_api(f).unwrap())
            .unwrap()
    }

    fn d<'a>(info: &'a RequestInfo, user: &'a UserInfo) -> RequestDigest<'a> {
        RequestDigest { info, user }
    }

    #[test]
    fn subjects_rules_and_scopes_match_as_in_kube() {
        let node = user("system:node:n1", &["system:nodes", "system:authenticated"]);
        let leases = info(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
        );
        let node_status = info(Method::PATCH, "/api/v1/nodes/n1/status");
        let pods = info(Method::GET, "/api/v1/namespaces/x/pods");
        let high = schema("system-node-high");
        assert!(matches_schema(d(&leases, &node), &high));
        assert!(matches_schema(d(&node_status, &node), &high));
        assert!(!matches_schema(d(&pods, &node), &high));
        assert!(matches_schema(d(&pods, &node), &schema("system-nodes")));

        // Leases are namespaced: the leader-election rule is not cluster scoped.
        let sa = user(
            "system:serviceaccount:kube-system:ctrl",
            &["system:serviceaccounts"],
        );
        let election = schema("system-leader-election");
        assert!(matches_schema(d(&leases, &sa), &election));
        let cluster_lease = info(Method::GET, "/apis/coordination.k8s.io/v1/leases");
        assert!(!matches_schema(d(&cluster_lease, &sa), &election));
        let other_ns = user("system:serviceaccount:kube-systemx:ctrl", &[]);
        assert!(!matches_schema(d(&leases, &other_ns), &election));

        // Probes: non-resource GETs, with what is under the path.
        let probes = schema("probes");
        let anon = user("system:anonymous", &["system:unauthenticated"]);
        for path in ["/healthz", "/readyz", "/livez", "/healthz/etcd"] {
            assert!(
                matches_schema(d(&info(Method::GET, path), &anon), &probes),
                "{path}"
            );
        }
        // As in kube: `/healthz` covers any path under it, dot segments included (Go's
        // `URL.Path` keeps them). That is why the router answers every such path itself.
        for path in [
            "/%68ealthz",
            "/%68ealthz/../api/v1/namespaces/default/configmaps",
        ] {
            assert!(
                matches_schema(d(&info(Method::GET, path), &anon), &probes),
                "{path}"
            );
        }
        assert!(!matches_schema(
            d(&info(Method::POST, "/healthz"), &anon),
            &probes
        ));
        assert!(!matches_schema(
            d(&info(Method::GET, "/metrics"), &anon),
            &probes
        ));
        // Resource requests never match non-resource rules.
        assert!(!matches_schema(
            d(&info(Method::GET, "/api/v1/namespaces/healthz/pods"), &anon),
            &probes
        ));
    }

    #[test]
    fn service_account_names_split_at_the_namespace() {
        assert_eq!(
            service_account_of("system:serviceaccount:ns:name"),
            Some(("ns", "name"))
        );
        assert_eq!(
            service_account_of("system:serviceaccount:ns:a:b"),
            Some(("ns", "a:b"))
        );
        assert_eq!(service_account_of("system:serviceaccount:ns"), None);
        assert_eq!(service_account_of("alice"), None);
    }
}
