//! The discovery documents a server controls, under fuzzing: a core's legacy `/apis`
//! (`APIGroupList` and its `APIResourceList`s, converted to the aggregated form) and a backend's
//! aggregated `/apis` (`APIGroupDiscoveryList`, looked up per APIService), merged as the gateway
//! merges them. What must hold whatever the input: no panic, every APIService in the merge, and
//! a merged document no larger than its inputs allow.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList};
use kube_core::discovery::v2::APIGroupDiscoveryList;
use serde_json::{json, Value};

use super::choices::{documents, Choices};
use crate::discovery::{from_legacy, merge, APIServiceDiscovery, CoreDiscovery, RemoteDiscovery};
use crate::model::{Backend, RegisteredAPIService, RemoteBackendSpec, ServiceRef};

const GROUPS: usize = 6;

fn group_name(c: &mut Choices<'_>) -> String {
    match c.below(8) {
        0 => String::new(),
        1 => "x".repeat(c.many(3000)),
        _ => format!("g{}.io", c.below(GROUPS)),
    }
}

fn resource(c: &mut Choices<'_>) -> Value {
    let name = match c.below(6) {
        0 => format!("r{}/status", c.below(4)),
        1 => format!("r{}/a/b", c.below(4)),
        2 => String::new(),
        _ => format!("r{}", c.below(4)),
    };
    let verbs: Vec<String> = (0..c.many(1000)).map(|i| format!("v{i}")).collect();
    json!({"name": name, "singularName": "", "namespaced": c.flag(), "kind": "K",
           "verbs": verbs, "shortNames": ["s"], "group": "", "version": ""})
}

/// The `which`-th document of a discovery input: 0 the core's `APIGroupList`, 1 its resource
/// lists (as one JSON array), 2 a backend's `APIGroupDiscoveryList`; all shaped by `c`, with
/// many groups, repeated group-versions, subresources of resources not listed, empty names and
/// long lists.
pub fn document(c: &mut Choices<'_>, which: usize) -> Value {
    match which {
        0 => {
            let groups: Vec<Value> = (0..c.many(200))
                .map(|_| {
                    let name = group_name(c);
                    let versions: Vec<Value> = (0..c.below(4))
                        .map(|v| json!({"groupVersion": format!("{name}/v{v}"), "version": format!("v{v}")}))
                        .collect();
                    json!({"name": name, "versions": versions})
                })
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        1 => {
            let lists: Vec<Value> = (0..c.below(50))
                .map(|_| {
                    let gv = format!("g{}.io/v{}", c.below(GROUPS), c.below(4));
                    let resources: Vec<Value> = (0..c.many(100)).map(|_| resource(c)).collect();
                    json!({"kind": "APIResourceList", "groupVersion": gv, "resources": resources})
                })
                .collect();
            Value::Array(lists)
        }
        _ => {
            let items: Vec<Value> = (0..c.many(200))
                .map(|_| {
                    let versions: Vec<Value> = (0..c.below(4))
                        .map(|v| {
                            let resources: Vec<Value> = (0..c.below(50))
                                .map(|_| {
                                    let r = resource(c);
                                    json!({"resource": r["name"], "scope": "Cluster",
                                           "verbs": r["verbs"], "responseKind": {"kind": "K"},
                                           "subresources": [{"subresource": "status"}]})
                                })
                                .collect();
                            json!({"version": format!("v{v}"), "resources": resources, "freshness": "Current"})
                        })
                        .collect();
                    json!({"metadata": {"name": group_name(c)}, "versions": versions})
                })
                .collect();
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                   "metadata": {}, "items": items})
        }
    }
}

fn remote(group: String, version: String) -> RegisteredAPIService {
    RegisteredAPIService {
        name: format!("{version}.{group}"),
        backend: Backend::Remote(RemoteBackendSpec {
            service: ServiceRef {
                namespace: "ns".into(),
                name: "api".into(),
                port: 443,
            },
            ca_bundle: None,
            insecure_skip_tls_verify: true,
        }),
        group,
        version,
        group_priority_minimum: 1000,
        version_priority: 15,
        traffic: Default::default(),
    }
}

/// A core's legacy discovery converted, a backend's aggregated discovery looked up for a few
/// APIServices, and both merged.
///
/// Input: three documents (see [`document`] and [`super::choices::documents`]).
pub fn discovery(data: &[u8]) {
    let docs = documents(data, 3, document);
    let groups: APIGroupList =
        serde_json::from_slice(&docs[0]).unwrap_or(APIGroupList { groups: Vec::new() });
    let lists: Vec<APIResourceList> = serde_json::from_slice(&docs[1]).unwrap_or_default();
    let backend: APIGroupDiscoveryList =
        serde_json::from_slice(&docs[2]).unwrap_or(APIGroupDiscoveryList {
            metadata: None,
            items: Vec::new(),
        });

    let apis = from_legacy(&groups, &lists);
    assert_eq!(apis.items.len(), groups.groups.len());
    for (group, converted) in groups.groups.iter().zip(&apis.items) {
        assert_eq!(converted.versions.len(), group.versions.len());
        for version in &converted.versions {
            for r in &version.resources {
                let name = r.resource.as_deref().unwrap_or("");
                assert!(!name.is_empty() && !name.contains('/'), "{name:?}");
            }
        }
    }

    // The APIServices: each group-version the backend lists (a few), and one it does not.
    let mut apiservices: Vec<RegisteredAPIService> = backend
        .items
        .iter()
        .flat_map(|g| {
            let name = g
                .metadata
                .as_ref()
                .and_then(|m| m.name.clone())
                .unwrap_or_default();
            g.versions
                .iter()
                .filter_map(move |v| Some((name.clone(), v.version.clone()?)))
        })
        .filter(|(g, v)| !g.is_empty() && !v.is_empty())
        .take(8)
        .map(|(g, v)| remote(g, v))
        .collect();
    apiservices.push(remote("unlisted.io".into(), "v1".into()));
    let remotes: Vec<RemoteDiscovery> = apiservices
        .iter()
        .map(|a| RemoteDiscovery::from_backend_document(&backend, &a.group, &a.version))
        .collect();
    let entries: Vec<APIServiceDiscovery<'_>> = apiservices
        .iter()
        .zip(&remotes)
        .map(|(a, r)| APIServiceDiscovery::new(a, Some(r)))
        .collect();
    let core = CoreDiscovery {
        api: APIGroupDiscoveryList {
            metadata: None,
            items: Vec::new(),
        },
        apis,
    };
    let merged = merge(&core, &entries).expect("a merge always serializes");

    let out: APIGroupDiscoveryList =
        serde_json::from_slice(&merged.apis.v2).expect("the merged /apis parses back");
    for a in &apiservices {
        let listed = out.items.iter().any(|g| {
            g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(a.group.as_str())
                && g.versions
                    .iter()
                    .any(|v| v.version.as_deref() == Some(a.version.as_str()))
        });
        assert!(listed, "{} missing from the merge", a.name);
    }
    // Every byte of the merge comes from an input, but for the fields the merge writes itself
    // (freshness, kinds) on each group, version and resource.
    let inputs: usize = docs.iter().map(Vec::len).sum();
    let bound = 2 * inputs + 256 * (apiservices.len() + 1) + 4096;
    assert!(
        merged.apis.v2.len() <= bound,
        "{} > {bound}",
        merged.apis.v2.len()
    );
}
