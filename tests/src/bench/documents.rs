//! Discovery documents shaped like a kube-apiserver's, generated from a table: the static
//! backend serves them (`/api`, `/apis`), and the in-process discovery rebuilds merge them.

use serde_json::{json, Value};

use super::BENCH_GROUP;

/// One resource of a discovery version entry, with every verb.
pub fn resource(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Value {
    json!({
        "resource": plural,
        "responseKind": {"group": group, "version": version, "kind": kind},
        "scope": if namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": kind.to_ascii_lowercase(),
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    })
}

/// A group with one version holding `resources` (the legacy group has no name).
pub fn group_entry(group: &str, version: &str, resources: Vec<Value>) -> Value {
    let metadata = if group.is_empty() {
        json!({})
    } else {
        json!({ "name": group })
    };
    json!({
        "metadata": metadata,
        "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
    })
}

/// An `APIGroupDiscoveryList` (apidiscovery.k8s.io/v2) of `items`.
pub fn discovery_list(items: Vec<Value>) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// A kube-sized `/apis`: 40 groups with 6 resources each (about as large as a small cluster's).
pub fn core_apis_doc() -> Value {
    let mut items = Vec::new();
    for g in 0..40 {
        let group = format!("group{g}.k8s.example.io");
        let resources = (0..6)
            .map(|r| {
                resource(
                    &group,
                    "v1",
                    &format!("things{r}"),
                    &format!("Thing{r}"),
                    r % 2 == 0,
                )
            })
            .collect();
        items.push(group_entry(&group, "v1", resources));
    }
    items.push(group_entry(
        BENCH_GROUP,
        "v1",
        vec![resource(BENCH_GROUP, "v1", "things", "Thing", true)],
    ));
    discovery_list(items)
}

/// The core's `/api`: the legacy group with a handful of resources.
pub fn core_api_doc() -> Value {
    let resources = [
        ("configmaps", "ConfigMap", true),
        ("namespaces", "Namespace", false),
        ("pods", "Pod", true),
        ("secrets", "Secret", true),
        ("services", "Service", true),
    ]
    .iter()
    .map(|(p, k, n)| resource("", "v1", p, k, *n))
    .collect();
    discovery_list(vec![group_entry("", "v1", resources)])
}
