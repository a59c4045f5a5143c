//! Classification: the first FlowSchema, in increasing matchingPrecedence and then name, that
//! matches a request (kube's `startRequest` scans its sorted `flowSchemas`); `catch-all` when none
//! does.
//!
//! kube scans every FlowSchema in order. A cluster with hundreds of them (one per team or per
//! controller) would cost that scan on every request, so the gateway indexes them by subject:
//! a FlowSchema can only match a caller named by one of its subjects, so only the lists for the
//! caller's user name, its groups, its ServiceAccount namespace and the wildcard subjects are
//! looked at. Each list is in matching order, and a list is left as soon as it cannot beat the
//! best match found so far, so the result is the linear scan's, at the cost of the few
//! FlowSchemas that name the caller.

use std::borrow::Borrow;
use std::collections::HashMap;

use crate::model::{Name, SchemaSpec, SubjectSpec};
use crate::rules::{matches_schema, service_account_of, RequestDigest, SERVICE_ACCOUNT_PREFIX};

/// FlowSchemas in matching order, with the subject index.
/// Schema positions by a subject's name. Its keys come from the configuration, and the names a
/// request brings are only looked up, so a fixed-seed fast hash is safe here and costs a
/// fraction of SipHash's.
type Index = HashMap<Box<str>, Vec<u32>, foldhash::fast::FixedState>;

pub struct Classifier<T> {
    schemas: Vec<T>,
    /// Users named exactly, and ServiceAccounts named exactly (by their user names).
    by_user: Index,
    by_group: Index,
    /// ServiceAccount subjects for every account of a namespace.
    by_service_account_namespace: Index,
    /// Subjects `User *` and `Group *`.
    anyone: Vec<u32>,
    catch_all: usize,
}

impl<T: Borrow<SchemaSpec>> Classifier<T> {
    /// `schemas` must already be in matching order; `catch_all` is the position of the schema
    /// used when none matches.
    pub fn new(schemas: Vec<T>, catch_all: usize) -> Self {
        let mut c = Self {
            schemas,
            by_user: Index::default(),
            by_group: Index::default(),
            by_service_account_namespace: Index::default(),
            anyone: Vec::new(),
            catch_all,
        };
        for i in 0..c.schemas.len() {
            let idx = i as u32;
            let subjects: Vec<SubjectSpec> = c.schemas[i]
                .borrow()
                .rules
                .iter()
                .flat_map(|r| r.subjects.iter().cloned())
                .collect();
            for subject in subjects {
                let list = match subject {
                    SubjectSpec::User(Name::Any) | SubjectSpec::Group(Name::Any) => &mut c.anyone,
                    SubjectSpec::User(Name::Exact(u)) => c.by_user.entry(u.into()).or_default(),
                    SubjectSpec::Group(Name::Exact(g)) => c.by_group.entry(g.into()).or_default(),
                    SubjectSpec::ServiceAccount {
                        namespace,
                        name: Name::Exact(n),
                    } => c
                        .by_user
                        .entry(format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{n}").into())
                        .or_default(),
                    SubjectSpec::ServiceAccount {
                        namespace,
                        name: Name::Any,
                    } => c
                        .by_service_account_namespace
                        .entry(namespace.into())
                        .or_default(),
                };
                if list.last() != Some(&idx) {
                    list.push(idx);
                }
            }
        }
        c
    }

    pub fn schemas(&self) -> &[T] {
        &self.schemas
    }

    /// The schema for `digest`: the first in matching order that matches, else `catch-all`.
    pub fn classify(&self, digest: RequestDigest<'_>) -> &T {
        let user = digest.user;
        let mut best = u32::MAX;
        let mut consider = |list: Option<&Vec<u32>>| {
            for &i in list.into_iter().flatten() {
                if i >= best {
                    return;
                }
                if matches_schema(digest, self.schemas[i as usize].borrow()) {
                    best = i;
                    return;
                }
            }
        };
        consider(Some(&self.anyone));
        consider(self.by_user.get(user.name.as_str()));
        for g in &user.groups {
            consider(self.by_group.get(g.as_str()));
        }
        if let Some((namespace, _)) = service_account_of(&user.name) {
            consider(self.by_service_account_namespace.get(namespace));
        }
        let at = if best == u32::MAX {
            self.catch_all
        } else {
            best as usize
        };
        &self.schemas[at]
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use crate::bootstrap;
    use crate::model::{NonResourceRule, NonResourceUrl, ResourceRule, ResourceSet, Rule, Set};
    use crate::testing::{info, user};
    use gateway_request::identity::UserInfo;

    /// kube's order: matchingPrecedence, then name.
    fn sorted(mut specs: Vec<SchemaSpec>) -> (Vec<SchemaSpec>, usize) {
        specs.sort_by(|a, b| {
            (a.matching_precedence, &a.name).cmp(&(b.matching_precedence, &b.name))
        });
        let catch_all = specs.iter().position(|s| &*s.name == "catch-all").unwrap();
        (specs, catch_all)
    }

    fn built_in() -> Classifier<SchemaSpec> {
        let specs = bootstrap::mandatory_flow_schemas()
            .iter()
            .chain(&bootstrap::suggested_flow_schemas())
            .map(|f| SchemaSpec::from_api(f).unwrap())
            .collect();
        let (specs, catch_all) = sorted(specs);
        Classifier::new(specs, catch_all)
    }

    #[test]
    fn requests_land_where_kube_apiserver_puts_them() {
        let c = built_in();
        let name = |method, target, u: &UserInfo| -> String {
            let info = info(method, target);
            c.classify(RequestDigest {
                info: &info,
                user: u,
            })
            .name
            .to_string()
        };
        let alice = user("alice", &["system:authenticated"]);
        let reader = user(
            "system:serviceaccount:quiet:reader",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:quiet",
                "system:authenticated",
            ],
        );
        let admin = user("admin", &["system:masters", "system:authenticated"]);
        let kcm = user("system:kube-controller-manager", &["system:authenticated"]);
        let anon = user("system:anonymous", &["system:unauthenticated"]);
        let cms = "/api/v1/namespaces/x/configmaps";
        assert_eq!(name(Method::GET, cms, &alice), "global-default");
        assert_eq!(name(Method::GET, cms, &reader), "service-accounts");
        assert_eq!(name(Method::GET, cms, &admin), "exempt");
        assert_eq!(name(Method::GET, cms, &kcm), "kube-controller-manager");
        assert_eq!(
            name(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kcm",
                &kcm
            ),
            "system-leader-election"
        );
        assert_eq!(name(Method::GET, "/readyz", &anon), "probes");
        assert_eq!(name(Method::GET, "/version", &anon), "global-default");
        // Nobody names this caller (no groups at all): catch-all.
        assert_eq!(name(Method::GET, cms, &user("nobody", &[])), "catch-all");
    }

    fn random_subject() -> SubjectSpec {
        let pick = |n: usize| fastrand::usize(..n);
        let names = ["*", "alice", "bob", "system:serviceaccount:a:x"];
        let groups = ["*", "g1", "g2", "system:authenticated"];
        match pick(3) {
            0 => SubjectSpec::User(match names[pick(names.len())] {
                "*" => Name::Any,
                n => Name::Exact(n.into()),
            }),
            1 => SubjectSpec::Group(match groups[pick(groups.len())] {
                "*" => Name::Any,
                n => Name::Exact(n.into()),
            }),
            _ => SubjectSpec::ServiceAccount {
                namespace: ["a", "b"][pick(2)].into(),
                name: match ["*", "x", "y"][pick(3)] {
                    "*" => Name::Any,
                    n => Name::Exact(n.into()),
                },
            },
        }
    }

    fn random_schema(i: usize) -> SchemaSpec {
        let pick = |n: usize| fastrand::usize(..n);
        let rules = (0..1 + pick(2))
            .map(|_| Rule {
                subjects: (0..1 + pick(3)).map(|_| random_subject()).collect(),
                resource_rules: vec![ResourceRule {
                    verbs: [Set::Any, Set::Of(vec!["list".into()])][pick(2)].clone(),
                    api_groups: Set::Any,
                    resources: [
                        ResourceSet::Any,
                        ResourceSet::Of(vec![("configmaps".into(), String::new())]),
                    ][pick(2)]
                    .clone(),
                    namespaces: [Set::Any, Set::Of(vec!["x".into()])][pick(2)].clone(),
                    cluster_scope: pick(2) == 0,
                }],
                non_resource_rules: vec![NonResourceRule {
                    verbs: Set::Any,
                    urls: vec![NonResourceUrl::Path {
                        exact: "/version".into(),
                        prefix: "/version/".into(),
                    }],
                }],
            })
            .collect();
        SchemaSpec {
            name: format!("fs-{i:03}").into(),
            uid: "".into(),
            matching_precedence: 2 + pick(50) as i32,
            level: "l".into(),
            distinguisher: None,
            rules,
        }
    }

    /// The index finds what kube's linear scan finds, over hundreds of random FlowSchemas and
    /// callers.
    #[test]
    fn the_index_agrees_with_a_linear_scan_in_matching_order() {
        for _ in 0..20 {
            let mut specs: Vec<SchemaSpec> = (0..300).map(random_schema).collect();
            specs.push(SchemaSpec::from_api(&bootstrap::mandatory_flow_schemas()[1]).unwrap());
            let (specs, catch_all) = sorted(specs);
            let c = Classifier::new(specs.clone(), catch_all);
            let users = [
                user("alice", &["g1"]),
                user("bob", &["g2", "system:authenticated"]),
                user("carol", &[]),
                user("system:serviceaccount:a:x", &["system:authenticated"]),
                user("system:serviceaccount:b:y", &["g1", "g2"]),
            ];
            let requests = [
                info(Method::GET, "/api/v1/namespaces/x/configmaps"),
                info(Method::GET, "/api/v1/namespaces/y/configmaps/c"),
                info(Method::GET, "/api/v1/nodes"),
                info(Method::GET, "/version"),
            ];
            for u in &users {
                for r in &requests {
                    let digest = RequestDigest { info: r, user: u };
                    let linear = specs
                        .iter()
                        .find(|s| matches_schema(digest, s))
                        .unwrap_or(&specs[catch_all]);
                    assert_eq!(
                        c.classify(digest).name,
                        linear.name,
                        "{} {}",
                        u.name,
                        r.path()
                    );
                }
            }
        }
    }
}
