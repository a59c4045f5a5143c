//! Legacy discovery (`APIGroupList` / `APIVersions` + `APIResourceList`s) → aggregated form.
//!
//! Some core servers only speak legacy discovery; the merge works on the aggregated shape, so their
//! documents are converted first. The conversion follows apiserver's
//! `ConvertGroupVersionIntoToDiscovery` (used by kube-aggregator for backends without aggregated
//! discovery): `<plural>/<sub>` entries are folded under their parent as subresources (a parent
//! that is not listed is created with an empty `responseKind`), `responseKind` comes from the
//! entry's group/version/kind (group and version empty when they are the containing GV's, which is
//! what a legacy `APIResource` already says by omitting them), and `scope` from `namespaced`.
//!
//! Differences, all on malformed input, where upstream returns an error and we keep going: a
//! subresource whose scope differs from its parent's keeps the parent's scope; entries with an
//! empty name are skipped. A group-version listed in the `APIGroupList` with no `APIResourceList`
//! (its fetch failed) becomes a version entry with only `version` and `freshness: Stale`.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroupList, APIResource, APIResourceList, APIVersions, ObjectMeta,
};
use kube_core::discovery::v2::{
    APIGroupDiscovery, APIGroupDiscoveryList, APIResourceDiscovery, APISubresourceDiscovery,
    APIVersionDiscovery, GroupVersionKind,
};

use super::{FRESHNESS_CURRENT, FRESHNESS_STALE, SCOPE_CLUSTER, SCOPE_NAMESPACED};

/// Converts a core server's legacy `/apis` (`APIGroupList`) plus the `APIResourceList`s it
/// returned for `/apis/<g>/<v>` into one `APIGroupDiscoveryList`, keeping the group and version
/// order of the `APIGroupList`. Resource lists for group-versions not in the group list are
/// ignored; listed group-versions without a resource list become `Stale` version-only entries.
pub fn from_legacy(
    group_list: &APIGroupList,
    resource_lists: &[APIResourceList],
) -> APIGroupDiscoveryList {
    let by_gv = index(resource_lists);
    let items = group_list
        .groups
        .iter()
        .map(|group| APIGroupDiscovery {
            metadata: Some(ObjectMeta {
                name: Some(group.name.clone()),
                ..ObjectMeta::default()
            }),
            versions: group
                .versions
                .iter()
                .map(|v| version_entry(&v.version, by_gv.get(v.group_version.as_str()).copied()))
                .collect(),
        })
        .collect();
    APIGroupDiscoveryList {
        metadata: None,
        items,
    }
}

/// Converts a core server's legacy `/api` (`APIVersions`) plus its `/api/<v>` resource lists into
/// an `APIGroupDiscoveryList` holding the core group (no name), like a real server's aggregated
/// `/api`.
pub fn from_legacy_core(
    versions: &APIVersions,
    resource_lists: &[APIResourceList],
) -> APIGroupDiscoveryList {
    let by_gv = index(resource_lists);
    let group = APIGroupDiscovery {
        metadata: Some(ObjectMeta::default()),
        versions: versions
            .versions
            .iter()
            .map(|v| version_entry(v, by_gv.get(v.as_str()).copied()))
            .collect(),
    };
    APIGroupDiscoveryList {
        metadata: None,
        items: vec![group],
    }
}

fn index(resource_lists: &[APIResourceList]) -> HashMap<&str, &APIResourceList> {
    let mut by_gv = HashMap::with_capacity(resource_lists.len());
    for list in resource_lists {
        // First list wins if a group-version appears twice.
        by_gv.entry(list.group_version.as_str()).or_insert(list);
    }
    by_gv
}

fn version_entry(version: &str, list: Option<&APIResourceList>) -> APIVersionDiscovery {
    match list {
        Some(list) => APIVersionDiscovery {
            version: Some(version.to_owned()),
            resources: convert_resources(&list.resources),
            freshness: Some(FRESHNESS_CURRENT.to_owned()),
        },
        None => APIVersionDiscovery {
            version: Some(version.to_owned()),
            resources: Vec::new(),
            freshness: Some(FRESHNESS_STALE.to_owned()),
        },
    }
}

fn scope(namespaced: bool) -> String {
    if namespaced {
        SCOPE_NAMESPACED
    } else {
        SCOPE_CLUSTER
    }
    .to_owned()
}

fn response_kind(r: &APIResource) -> GroupVersionKind {
    GroupVersionKind {
        group: Some(r.group.clone().unwrap_or_default()),
        version: Some(r.version.clone().unwrap_or_default()),
        kind: Some(r.kind.clone()),
    }
}

fn non_empty(v: &Option<Vec<String>>) -> Vec<String> {
    v.clone().unwrap_or_default()
}

/// The resources of one `APIResourceList`, subresources folded under their parents, in the
/// order the parents first appear.
pub fn convert_resources(resources: &[APIResource]) -> Vec<APIResourceDiscovery> {
    let mut out: Vec<APIResourceDiscovery> = Vec::with_capacity(resources.len());
    let mut parents: HashMap<&str, usize> = HashMap::with_capacity(resources.len());

    for r in resources {
        if r.name.is_empty() || r.name.contains('/') {
            continue;
        }
        if parents.contains_key(r.name.as_str()) {
            continue; // duplicate entry: first wins
        }
        parents.insert(r.name.as_str(), out.len());
        out.push(APIResourceDiscovery {
            resource: Some(r.name.clone()),
            response_kind: Some(response_kind(r)),
            scope: Some(scope(r.namespaced)),
            singular_resource: Some(r.singular_name.clone()),
            verbs: r.verbs.clone(),
            short_names: non_empty(&r.short_names),
            categories: non_empty(&r.categories),
            subresources: Vec::new(),
        });
    }

    for r in resources {
        let Some((parent, sub)) = r.name.split_once('/') else {
            continue;
        };
        if parent.is_empty() || sub.is_empty() {
            continue;
        }
        let idx = match parents.get(parent) {
            Some(&idx) => idx,
            None => {
                parents.insert(parent, out.len());
                out.push(APIResourceDiscovery {
                    resource: Some(parent.to_owned()),
                    response_kind: Some(GroupVersionKind::default()),
                    scope: Some(scope(r.namespaced)),
                    singular_resource: Some(String::new()),
                    ..APIResourceDiscovery::default()
                });
                out.len() - 1
            }
        };
        let response_kind = if r.kind.is_empty() {
            GroupVersionKind::default()
        } else {
            response_kind(r)
        };
        out[idx].subresources.push(APISubresourceDiscovery {
            subresource: Some(sub.to_owned()),
            response_kind: Some(response_kind),
            accepted_types: Vec::new(),
            verbs: r.verbs.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroup, GroupVersionForDiscovery};

    fn res(name: &str, kind: &str, namespaced: bool, verbs: &[&str]) -> APIResource {
        APIResource {
            name: name.into(),
            kind: kind.into(),
            namespaced,
            singular_name: if name.contains('/') {
                String::new()
            } else {
                name.trim_end_matches('s').into()
            },
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..APIResource::default()
        }
    }

    fn gv(group_version: &str, version: &str) -> GroupVersionForDiscovery {
        GroupVersionForDiscovery {
            group_version: group_version.into(),
            version: version.into(),
        }
    }

    #[test]
    fn folds_subresources_under_parents() {
        let mut eviction = res("pods/eviction", "Eviction", true, &["create"]);
        eviction.group = Some("policy".into());
        eviction.version = Some("v1".into());
        let mut deployments = res("deployments", "Deployment", true, &["get", "list"]);
        deployments.short_names = Some(vec!["deploy".into()]);
        deployments.categories = Some(vec!["all".into()]);
        let list = [
            res("pods", "Pod", true, &["get", "list", "watch"]),
            res("pods/status", "Pod", true, &["get", "patch"]),
            eviction,
            res("pods/exec", "", true, &["create", "get"]),
            res("nodes", "Node", false, &["get"]),
            deployments,
            // Parent not listed: created with an empty responseKind, like upstream.
            res("widgets/scale", "Scale", true, &["get"]),
        ];
        let out = convert_resources(&list);
        let names: Vec<_> = out.iter().map(|r| r.resource.as_deref().unwrap()).collect();
        assert_eq!(names, ["pods", "nodes", "deployments", "widgets"]);

        let pods = &out[0];
        assert_eq!(pods.scope.as_deref(), Some("Namespaced"));
        assert_eq!(pods.singular_resource.as_deref(), Some("pod"));
        assert_eq!(
            pods.response_kind,
            Some(GroupVersionKind {
                group: Some(String::new()),
                version: Some(String::new()),
                kind: Some("Pod".into()),
            })
        );
        let subs: Vec<_> = pods
            .subresources
            .iter()
            .map(|s| s.subresource.as_deref().unwrap())
            .collect();
        assert_eq!(subs, ["status", "eviction", "exec"]);
        let eviction = &pods.subresources[1];
        assert_eq!(
            eviction.response_kind,
            Some(GroupVersionKind {
                group: Some("policy".into()),
                version: Some("v1".into()),
                kind: Some("Eviction".into()),
            })
        );
        assert_eq!(eviction.verbs, ["create"]);
        assert_eq!(
            pods.subresources[2].response_kind,
            Some(GroupVersionKind::default())
        );

        assert_eq!(out[1].scope.as_deref(), Some("Cluster"));
        assert_eq!(out[2].short_names, ["deploy"]);
        assert_eq!(out[2].categories, ["all"]);
        assert_eq!(out[3].response_kind, Some(GroupVersionKind::default()));
        assert_eq!(out[3].subresources.len(), 1);
    }

    #[test]
    fn group_list_keeps_order_and_marks_missing_lists_stale() {
        let groups = APIGroupList {
            groups: vec![
                APIGroup {
                    name: "apps".into(),
                    versions: vec![gv("apps/v1", "v1")],
                    preferred_version: Some(gv("apps/v1", "v1")),
                    server_address_by_client_cidrs: None,
                },
                APIGroup {
                    name: "batch".into(),
                    versions: vec![gv("batch/v1", "v1"), gv("batch/v1beta1", "v1beta1")],
                    preferred_version: Some(gv("batch/v1", "v1")),
                    server_address_by_client_cidrs: None,
                },
            ],
        };
        let lists = [
            APIResourceList {
                group_version: "batch/v1".into(),
                resources: vec![res("jobs", "Job", true, &["get"])],
            },
            APIResourceList {
                group_version: "apps/v1".into(),
                resources: vec![res("deployments", "Deployment", true, &["get"])],
            },
            APIResourceList {
                group_version: "unlisted/v1".into(),
                resources: vec![res("things", "Thing", true, &["get"])],
            },
        ];
        let doc = from_legacy(&groups, &lists);
        assert_eq!(doc.items.len(), 2);
        assert_eq!(
            doc.items[0].metadata.as_ref().unwrap().name.as_deref(),
            Some("apps")
        );
        let batch = &doc.items[1];
        assert_eq!(batch.versions.len(), 2);
        assert_eq!(batch.versions[0].version.as_deref(), Some("v1"));
        assert_eq!(batch.versions[0].freshness.as_deref(), Some("Current"));
        assert_eq!(batch.versions[0].resources.len(), 1);
        assert_eq!(batch.versions[1].version.as_deref(), Some("v1beta1"));
        assert_eq!(batch.versions[1].freshness.as_deref(), Some("Stale"));
        assert!(batch.versions[1].resources.is_empty());
    }

    #[test]
    fn core_versions_become_the_unnamed_group() {
        let versions = APIVersions {
            versions: vec!["v1".into()],
            server_address_by_client_cidrs: vec![],
        };
        // Shaped like the real /api/v1 (no apiVersion field, subresources as separate entries).
        let list: APIResourceList = serde_json::from_str(
            r#"{"groupVersion":"v1","kind":"APIResourceList","resources":[
              {"kind":"Binding","name":"bindings","namespaced":true,"singularName":"binding","verbs":["create"]},
              {"kind":"Pod","name":"pods","namespaced":true,"shortNames":["po"],"singularName":"pod",
               "categories":["all"],"verbs":["get","list"]},
              {"group":"policy","kind":"Eviction","name":"pods/eviction","namespaced":true,"singularName":"",
               "verbs":["create"],"version":"v1"}]}"#,
        )
        .unwrap();
        let doc = from_legacy_core(&versions, &[list]);
        assert_eq!(doc.items.len(), 1);
        let core = &doc.items[0];
        assert_eq!(core.metadata.as_ref().unwrap().name, None);
        assert_eq!(core.versions[0].resources.len(), 2);
        assert_eq!(core.versions[0].resources[1].subresources.len(), 1);
    }
}
