//! Generated OpenAPI v2 (Swagger 2.0) specs shaped like an aggregated API server's (what
//! sample-apiserver or metrics-server serve at `/openapi/v2`), deterministic and of a chosen size.
//!
//! Each spec has what kube-openapi's builder writes for a group-version: the discovery paths of
//! the server (`/apis/`, `/apis/<group>/`, `/apis/<group>/<version>/`, which the gateway's merge
//! filters out), then per kind the collection, item and watch paths with their operations and
//! parameters, and the definitions they reach: the kind, its list, spec and status (with
//! `x-kubernetes-group-version-kind` on the kind and list), plus the apimachinery definitions
//! every server carries, identical in every spec so the merge shares them. Kinds are added until
//! the serialized spec reaches the size asked for.

use serde_json::{json, Map, Value};

/// Words the descriptions are made of, picked by index so every spec is the same on every run.
const WORDS: &[&str] = &[
    "the",
    "object",
    "field",
    "is",
    "set",
    "by",
    "server",
    "when",
    "a",
    "client",
    "requests",
    "resource",
    "value",
    "must",
    "be",
    "specified",
    "for",
    "each",
    "controller",
    "reconciles",
    "desired",
    "state",
    "observed",
    "generation",
    "status",
    "condition",
    "reports",
    "latest",
    "available",
    "replicas",
    "selector",
    "matches",
    "labels",
    "namespace",
    "scoped",
    "cluster",
];

/// A sentence of `n` words starting at `seed`.
fn sentence(seed: usize, n: usize) -> String {
    let mut s = String::with_capacity(n * 8);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(seed * 7 + i * 13 + i * i) % WORDS.len()]);
    }
    s.push('.');
    s
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn def_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/definitions/{name}") })
}

/// The apimachinery definitions every Kubernetes-style server's spec carries.
fn shared_definitions() -> Map<String, Value> {
    let mut defs = Map::new();
    let string = |d: &str| json!({"type": "string", "description": d});
    defs.insert(format!("{META}.ObjectMeta"), json!({
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object",
        "properties": {
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": sentence(1, 30)},
            "creationTimestamp": {"$ref": format!("#/definitions/{META}.Time"), "description": sentence(2, 40)},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64", "description": sentence(3, 20)},
            "deletionTimestamp": {"$ref": format!("#/definitions/{META}.Time"), "description": sentence(4, 40)},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge", "description": sentence(5, 40)},
            "generateName": string(&sentence(6, 40)),
            "generation": {"type": "integer", "format": "int64", "description": sentence(7, 15)},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": sentence(8, 30)},
            "managedFields": {"type": "array", "items": def_ref(&format!("{META}.ManagedFieldsEntry")), "x-kubernetes-list-type": "atomic", "description": sentence(9, 30)},
            "name": string(&sentence(10, 30)),
            "namespace": string(&sentence(11, 30)),
            "ownerReferences": {"type": "array", "items": def_ref(&format!("{META}.OwnerReference")), "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge", "description": sentence(12, 30)},
            "resourceVersion": string(&sentence(13, 40)),
            "selfLink": string(&sentence(14, 10)),
            "uid": string(&sentence(15, 30)),
        }
    }));
    defs.insert(
        format!("{META}.Time"),
        json!({"type": "string", "format": "date-time", "description": sentence(16, 20)}),
    );
    defs.insert(format!("{META}.ManagedFieldsEntry"), json!({
        "type": "object", "description": sentence(17, 20),
        "properties": {
            "apiVersion": string(&sentence(18, 15)), "fieldsType": string(&sentence(19, 15)),
            "fieldsV1": {"type": "object", "description": sentence(20, 10)},
            "manager": string(&sentence(21, 8)), "operation": string(&sentence(22, 15)),
            "subresource": string(&sentence(23, 20)),
            "time": {"$ref": format!("#/definitions/{META}.Time"), "description": sentence(24, 15)},
        }
    }));
    defs.insert(format!("{META}.OwnerReference"), json!({
        "type": "object", "description": sentence(25, 20), "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": string(&sentence(26, 5)), "blockOwnerDeletion": {"type": "boolean", "description": sentence(27, 25)},
            "controller": {"type": "boolean", "description": sentence(28, 8)}, "kind": string(&sentence(29, 10)),
            "name": string(&sentence(30, 10)), "uid": string(&sentence(31, 10)),
        },
        "x-kubernetes-map-type": "atomic"
    }));
    defs.insert(format!("{META}.ListMeta"), json!({
        "type": "object", "description": sentence(32, 20),
        "properties": {
            "continue": string(&sentence(33, 40)), "remainingItemCount": {"type": "integer", "format": "int64", "description": sentence(34, 30)},
            "resourceVersion": string(&sentence(35, 30)), "selfLink": string(&sentence(36, 10)),
        }
    }));
    defs.insert(format!("{META}.Status"), json!({
        "type": "object", "description": sentence(37, 10),
        "properties": {
            "apiVersion": string(&sentence(38, 20)), "code": {"type": "integer", "format": "int32", "description": sentence(39, 10)},
            "kind": string(&sentence(40, 20)), "message": string(&sentence(41, 10)),
            "metadata": {"$ref": format!("#/definitions/{META}.ListMeta"), "default": {}, "description": sentence(42, 10)},
            "reason": string(&sentence(43, 20)), "status": string(&sentence(44, 10)),
        },
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}]
    }));
    defs.insert(format!("{META}.DeleteOptions"), json!({
        "type": "object", "description": sentence(45, 10),
        "properties": {
            "dryRun": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic", "description": sentence(46, 30)},
            "gracePeriodSeconds": {"type": "integer", "format": "int64", "description": sentence(47, 30)},
            "propagationPolicy": string(&sentence(48, 30)),
        },
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "DeleteOptions", "version": "v1"}]
    }));
    defs.insert(format!("{META}.WatchEvent"), json!({
        "type": "object", "description": sentence(49, 10), "required": ["type", "object"],
        "properties": {"object": {"type": "object", "description": sentence(50, 20)}, "type": {"type": "string", "default": ""}},
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "WatchEvent", "version": "v1"}]
    }));
    defs.insert(
        format!("{META}.Patch"),
        json!({"type": "object", "description": sentence(51, 15)}),
    );
    defs.insert(format!("{META}.APIResourceList"), json!({
        "type": "object", "description": sentence(52, 15), "required": ["groupVersion", "resources"],
        "properties": {"apiVersion": string(&sentence(53, 10)), "groupVersion": string(&sentence(54, 8)), "kind": string(&sentence(55, 10)),
                       "resources": {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "atomic"}},
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "APIResourceList", "version": "v1"}]
    }));
    defs
}

fn query_param(name: &str, ty: &str, seed: usize) -> Value {
    json!({"uniqueItems": true, "type": ty, "description": sentence(seed, 25), "name": name, "in": "query"})
}

fn ok_response(schema: Value) -> Value {
    json!({"200": {"description": "OK", "schema": schema}, "401": {"description": "Unauthorized"}})
}

/// The paths and definitions of one kind of `group`/`version`, the `index`-th; `revision` is
/// written into the kind's description (a changed spec, same size).
fn add_kind(
    paths: &mut Map<String, Value>,
    defs: &mut Map<String, Value>,
    group: &str,
    version: &str,
    index: usize,
    revision: u32,
) {
    let kind = format!("Widget{index:03}");
    let plural = format!("widget{index:03}s");
    let prefix: String = group.rsplit('.').collect::<Vec<_>>().join(".");
    let def = format!("{prefix}.{version}.{kind}");
    let gvk = json!([{"group": group, "kind": kind, "version": version}]);
    let tag = format!("{}_{version}", group.replace('.', "_"));
    let op = |verb: &str, what: &str, schema: Value, action: &str, seed: usize| {
        json!({
            "description": sentence(seed, 12),
            "consumes": ["*/*"],
            "produces": ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"],
            "schemes": ["https"],
            "tags": [tag],
            "operationId": format!("{verb}{}{}{kind}", tag.replace('_', ""), what),
            "responses": ok_response(schema),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": {"group": group, "kind": kind, "version": version},
        })
    };
    let list_params = json!([
        query_param("allowWatchBookmarks", "boolean", index + 1),
        query_param("continue", "string", index + 2),
        query_param("fieldSelector", "string", index + 3),
        query_param("labelSelector", "string", index + 4),
        query_param("limit", "integer", index + 5),
        query_param("resourceVersion", "string", index + 6),
        query_param("resourceVersionMatch", "string", index + 7),
        query_param("timeoutSeconds", "integer", index + 8),
        query_param("watch", "boolean", index + 9),
    ]);
    let ns = json!({"uniqueItems": true, "type": "string", "description": "object name and auth scope, such as for teams and projects", "name": "namespace", "in": "path", "required": true});
    let name = json!({"uniqueItems": true, "type": "string", "description": format!("name of the {kind}"), "name": "name", "in": "path", "required": true});
    let base = format!("/apis/{group}/{version}");
    paths.insert(
        format!("{base}/namespaces/{{namespace}}/{plural}"),
        json!({
            "get": op("list", "Namespaced", def_ref(&format!("{def}List")), "list", index + 10),
            "post": op("create", "Namespaced", def_ref(&def), "post", index + 11),
            "delete": op("delete", "CollectionNamespaced", def_ref(&format!("{META}.Status")), "deletecollection", index + 12),
            "parameters": [ns.clone(), query_param("pretty", "string", index + 13)],
        }),
    );
    paths.insert(
        format!("{base}/namespaces/{{namespace}}/{plural}/{{name}}"),
        json!({
            "get": op("read", "Namespaced", def_ref(&def), "get", index + 14),
            "put": op("replace", "Namespaced", def_ref(&def), "put", index + 15),
            "patch": op("patch", "Namespaced", def_ref(&def), "patch", index + 16),
            "delete": op("delete", "Namespaced", def_ref(&format!("{META}.Status")), "delete", index + 17),
            "parameters": [name.clone(), ns.clone(), query_param("pretty", "string", index + 18)],
        }),
    );
    paths.insert(
        format!("{base}/{plural}"),
        json!({
            "get": op("list", "ForAllNamespaces", def_ref(&format!("{def}List")), "list", index + 19),
            "parameters": list_params.clone(),
        }),
    );
    paths.insert(
        format!("{base}/watch/namespaces/{{namespace}}/{plural}"),
        json!({
            "get": op("watch", "NamespacedList", def_ref(&format!("{META}.WatchEvent")), "watchlist", index + 20),
            "parameters": list_params,
        }),
    );
    let field = |i: usize| -> (String, Value) {
        let seed = index * 31 + i;
        let name = format!(
            "{}{}{i}",
            WORDS[seed % WORDS.len()],
            WORDS[(seed / 3) % WORDS.len()].to_ascii_uppercase()
        );
        let schema = match i % 5 {
            0 => json!({"type": "string", "default": "", "description": sentence(seed, 24)}),
            1 => json!({"type": "integer", "format": "int32", "description": sentence(seed, 18)}),
            2 => {
                json!({"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic", "description": sentence(seed, 20)})
            }
            3 => {
                json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": sentence(seed, 22)})
            }
            _ => json!({"type": "object", "description": sentence(seed, 16), "properties": {
                "enabled": {"type": "boolean", "description": sentence(seed + 1, 10)},
                "interval": {"type": "string", "description": sentence(seed + 2, 12)},
                "threshold": {"type": "number", "format": "double", "description": sentence(seed + 3, 12)},
            }}),
        };
        (name, schema)
    };
    let spec_fields: Map<String, Value> = (0..40).map(field).collect();
    let status_fields: Map<String, Value> = (40..52).map(field).collect();
    let mut description = sentence(index, 30);
    if revision > 0 {
        description.push_str(&format!(" (revision {revision})"));
    }
    defs.insert(
        def.clone(),
        json!({
            "description": description,
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string", "description": sentence(index + 21, 40)},
                "kind": {"type": "string", "description": sentence(index + 22, 40)},
                "metadata": {"default": {}, "$ref": format!("#/definitions/{META}.ObjectMeta")},
                "spec": {"default": {}, "$ref": format!("#/definitions/{def}Spec")},
                "status": {"default": {}, "$ref": format!("#/definitions/{def}Status")},
            },
            "x-kubernetes-group-version-kind": gvk,
        }),
    );
    defs.insert(
        format!("{def}List"),
        json!({
            "description": format!("{kind}List is a list of {kind} objects."),
            "type": "object",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string", "description": sentence(index + 23, 40)},
                "items": {"type": "array", "items": {"default": {}, "$ref": format!("#/definitions/{def}")}},
                "kind": {"type": "string", "description": sentence(index + 24, 40)},
                "metadata": {"default": {}, "$ref": format!("#/definitions/{META}.ListMeta")},
            },
            "x-kubernetes-group-version-kind": [{"group": group, "kind": format!("{kind}List"), "version": version}],
        }),
    );
    defs.insert(
        format!("{def}Spec"),
        json!({"description": sentence(index + 25, 20), "type": "object", "properties": spec_fields}),
    );
    defs.insert(
        format!("{def}Status"),
        json!({"description": sentence(index + 26, 20), "type": "object", "properties": status_fields}),
    );
}

/// A generated spec and how many kinds it describes.
pub struct Generated {
    pub json: Vec<u8>,
    pub kinds: usize,
}

/// A spec of `group`/`version` of at least `bytes` serialized bytes (kinds are added until it
/// is), the same for the same arguments; `revision` changes one description.
pub fn generate(group: &str, version: &str, bytes: usize, revision: u32) -> Generated {
    let mut paths = Map::new();
    for (path, id) in [
        ("/apis/".to_owned(), "getAPIVersions"),
        (format!("/apis/{group}/"), "getAPIGroup"),
        (format!("/apis/{group}/{version}/"), "getAPIResources"),
    ] {
        paths.insert(
            path,
            json!({"get": {"description": "get available resources", "operationId": id,
                          "produces": ["application/json"], "schemes": ["https"],
                          "responses": ok_response(def_ref(&format!("{META}.APIResourceList")))}}),
        );
    }
    let mut defs = shared_definitions();
    let mut spec = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v0.0.0-bench"},
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "type": "apiKey", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    });
    let mut size = serde_json::to_vec(&spec).map_or(0, |v| v.len())
        + serde_json::to_vec(&defs).map_or(0, |v| v.len())
        + serde_json::to_vec(&paths).map_or(0, |v| v.len());
    let mut index = 0;
    while size < bytes {
        let (mut p, mut d) = (Map::new(), Map::new());
        add_kind(
            &mut p,
            &mut d,
            group,
            version,
            index,
            if index == 0 { revision } else { 0 },
        );
        size += serde_json::to_vec(&p).map_or(0, |v| v.len())
            + serde_json::to_vec(&d).map_or(0, |v| v.len());
        paths.extend(p);
        defs.extend(d);
        index += 1;
    }
    spec["paths"] = Value::Object(paths);
    spec["definitions"] = Value::Object(defs);
    Generated {
        json: serde_json::to_vec(&spec).unwrap_or_default(),
        kinds: index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_deterministic_of_the_size_asked_and_a_revision_changes_it() {
        let a = generate("g001.openapi.example.com", "v1", 256 << 10, 0).json;
        assert_eq!(
            a,
            generate("g001.openapi.example.com", "v1", 256 << 10, 0).json
        );
        assert!(
            a.len() >= 256 << 10 && a.len() < (256 << 10) + (40 << 10),
            "{}",
            a.len()
        );
        let b = generate("g001.openapi.example.com", "v1", 256 << 10, 1).json;
        assert_ne!(a, b);
        let spec: Value = serde_json::from_slice(&b).unwrap();
        assert!(spec["paths"]
            ["/apis/g001.openapi.example.com/v1/namespaces/{namespace}/widget000s"]
            .is_object());
        assert_eq!(
            spec["definitions"]["com.example.openapi.g001.v1.Widget000"]
                ["x-kubernetes-group-version-kind"][0]["kind"],
            "Widget000"
        );
    }
}
