//! Merging OpenAPI v2 (Swagger 2.0) specs as kube-aggregator does for `/openapi/v2`.
//!
//! The merged document starts from the core's spec. Each remote APIService then adds its
//! backend's spec, highest group priority first:
//! - **Filtered** to the paths under `/apis/<group>/<version>/`, plus the definitions those
//!   paths reach (kube-openapi's `FilterSpecByPaths`), so a backend cannot add or shadow anybody
//!   else's paths, nor the versions of its group that no APIService names (kube-apiserver's own
//!   merge, compared in the real-control-plane suite, leaves those out too).
//! - **Merged** the way kube-openapi's `MergeSpecsIgnorePathConflict` does:
//!   - a path the merged document already has is kept as it is;
//!   - an identical definition is shared;
//!   - a different definition with a taken name is renamed `<name>_v2` (then `_v3`, ...), with the
//!     backend's references rewritten, so both survive.
//!
//! References are followed the way kube-openapi follows them: through path items, operations,
//! parameters, responses and schemas (properties, items, allOf/anyOf/oneOf, not,
//! additionalProperties, additionalItems, patternProperties, definitions), into
//! `#/definitions/<name>`. Everything here is pure and works on `serde_json::Value`: objects are
//! sorted maps, as Go writes them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde_json::{Map, Value};

const DEFINITION_PREFIX: &str = "#/definitions/";
const OPERATIONS: [&str; 7] = ["get", "put", "post", "delete", "options", "head", "patch"];
/// Schema keywords holding one schema.
const SCHEMA_ONE: [&str; 3] = ["not", "additionalProperties", "additionalItems"];
/// Schema keywords holding a list of schemas.
const SCHEMA_LIST: [&str; 3] = ["allOf", "anyOf", "oneOf"];
/// Schema keywords holding a map of schemas.
const SCHEMA_MAP: [&str; 3] = ["properties", "patternProperties", "definitions"];

/// One remote APIService's spec for [`aggregate`]: its group and group priority decide where
/// it is filtered and in which order it is merged. `S` is the spec, or what it is loaded from
/// ([`aggregate_loading`]).
pub struct RemoteSpec<'a, S = &'a Value> {
    pub group: &'a str,
    pub version: &'a str,
    pub group_priority_minimum: i32,
    pub version_priority: i32,
    /// The APIService name, the last tie-breaker of the merge order.
    pub name: &'a str,
    pub spec: S,
}

/// The merged `/openapi/v2` document: `core`, then each of `remotes` filtered to its
/// group-version's paths and merged (see the module docs). Remotes are merged highest group
/// priority first, then version priority, then name, as kube-aggregator sorts APIServices.
pub fn aggregate(core: &Value, remotes: &[RemoteSpec<'_>]) -> Value {
    let remotes = remotes
        .iter()
        .map(|r| RemoteSpec { spec: r.spec, ..*r })
        .collect();
    aggregate_loading(core.clone(), remotes, |spec| Some((*spec).clone()))
}

/// [`aggregate`] for specs kept in another form (the bytes a backend sent): each is loaded
/// when its turn comes and dropped once merged, so only one remote spec is parsed at a time.
/// A spec `load` gives nothing for is left out.
pub fn aggregate_loading<S>(
    mut merged: Value,
    mut remotes: Vec<RemoteSpec<'_, S>>,
    mut load: impl FnMut(&S) -> Option<Value>,
) -> Value {
    remotes.sort_by(|a, b| {
        b.group_priority_minimum
            .cmp(&a.group_priority_minimum)
            .then_with(|| b.version_priority.cmp(&a.version_priority))
            .then_with(|| a.name.cmp(b.name))
    });
    for remote in &remotes {
        let Some(spec) = load(&remote.spec) else {
            continue;
        };
        let prefix = format!("/apis/{}/{}/", remote.group, remote.version);
        let filtered = filter_by_path_prefixes(spec, &[prefix]);
        merge_ignoring_path_conflicts(&mut merged, filtered);
    }
    merged
}

impl<S: Copy> Clone for RemoteSpec<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Copy> Copy for RemoteSpec<'_, S> {}

/// `spec` with only the paths starting with one of `prefixes`, and only the definitions they
/// reach (kube-openapi's `FilterSpecByPaths`). Filters in place: callers hand over a spec they
/// own, so a large one is never copied.
pub fn filter_by_path_prefixes(mut spec: Value, prefixes: &[String]) -> Value {
    let Some(root) = spec.as_object_mut() else {
        return spec;
    };
    if let Some(Value::Object(paths)) = root.get_mut("paths") {
        paths.retain(|path, _| {
            path.starts_with("x-") || prefixes.iter().any(|p| path.starts_with(p.as_str()))
        });
    }
    let used = reachable_definitions(&spec);
    if let Some(Value::Object(definitions)) = spec.get_mut("definitions") {
        definitions.retain(|name, _| used.contains(name));
    }
    spec
}

/// Adds `source`'s paths and definitions to `dest` (kube-openapi's
/// `MergeSpecsIgnorePathConflict`): paths `dest` has win; definitions that differ under one
/// name are renamed in `source` first.
pub fn merge_ignoring_path_conflicts(dest: &mut Value, mut source: Value) {
    // Everything here is linear in `source`: `dest` (the merged document, which grows with
    // every remote) is only looked up, never copied or walked, so merging N remotes costs
    // the size of the N specs, not N times the merged document.
    let dest_paths = object(dest, "paths");
    let new_paths: HashSet<String> = object(&source, "paths")
        .into_iter()
        .flat_map(|paths| paths.keys())
        .filter(|p| !p.starts_with("x-") && !dest_paths.is_some_and(|d| d.contains_key(*p)))
        .cloned()
        .collect();
    if new_paths.is_empty() {
        return;
    }
    // Only what the new paths need comes along.
    if let Some(Value::Object(paths)) = source.get_mut("paths") {
        paths.retain(|path, _| new_paths.contains(path));
    }
    let used = reachable_definitions(&source);
    if let Some(Value::Object(definitions)) = source.get_mut("definitions") {
        definitions.retain(|name, _| used.contains(name));
    }

    let renames = {
        let dest_definitions = object(dest, "definitions");
        let taken = |name: &str| dest_definitions.is_some_and(|d| d.contains_key(name));
        let source_definitions = object(&source, "definitions");
        let mut renamed_to: HashSet<String> = HashSet::new();
        let mut renames = BTreeMap::new();
        for (name, definition) in source_definitions.into_iter().flatten() {
            match dest_definitions.and_then(|d| d.get(name)) {
                Some(existing) if existing != definition => {
                    let mut i = 2;
                    let mut renamed = format!("{name}_v{i}");
                    while taken(&renamed)
                        || renamed_to.contains(&renamed)
                        || source_definitions.is_some_and(|s| s.contains_key(&renamed))
                    {
                        i += 1;
                        renamed = format!("{name}_v{i}");
                    }
                    renamed_to.insert(renamed.clone());
                    renames.insert(name.clone(), renamed);
                }
                _ => {}
            }
        }
        renames
    };
    if !renames.is_empty() {
        rename_definitions(&mut source, &renames);
    }

    let root = ensure_object(dest);
    let definitions = ensure_object(root.entry("definitions").or_insert(Value::Null));
    if let Some(Value::Object(source_definitions)) = source.get_mut("definitions") {
        for (name, definition) in std::mem::take(source_definitions) {
            definitions.entry(name).or_insert(definition);
        }
    }
    let paths = ensure_object(root.entry("paths").or_insert(Value::Null));
    if let Some(Value::Object(source_paths)) = source.get_mut("paths") {
        for (path, item) in std::mem::take(source_paths) {
            paths.entry(path).or_insert(item);
        }
    }
}

/// The names of the definitions `spec`'s paths reach, directly or through other definitions.
pub fn reachable_definitions(spec: &Value) -> BTreeSet<String> {
    let mut walker = RefWalker {
        definitions: object(spec, "definitions"),
        visited: BTreeSet::new(),
    };
    if let Some(paths) = object(spec, "paths") {
        for item in paths.values() {
            walker.path_item(item);
        }
    }
    walker.visited
}

/// Follows references from the paths, visiting each definition once.
struct RefWalker<'a> {
    definitions: Option<&'a Map<String, Value>>,
    visited: BTreeSet<String>,
}

impl<'a> RefWalker<'a> {
    fn reference(&mut self, value: &Value) {
        let Some(name) = value
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix(DEFINITION_PREFIX))
        else {
            return;
        };
        if self.visited.insert(name.to_owned()) {
            if let Some(definition) = self.definitions.and_then(|d| d.get(name)) {
                self.schema(definition);
            }
        }
    }

    fn schema(&mut self, schema: &'a Value) {
        if !schema.is_object() {
            return;
        }
        self.reference(schema);
        for key in SCHEMA_ONE {
            if let Some(inner) = schema.get(key) {
                self.schema(inner);
            }
        }
        for key in SCHEMA_LIST {
            for inner in schema
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.schema(inner);
            }
        }
        for key in SCHEMA_MAP {
            for inner in schema
                .get(key)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                self.schema(inner.1);
            }
        }
        match schema.get("items") {
            Some(Value::Array(items)) => items.iter().for_each(|i| self.schema(i)),
            Some(items) => self.schema(items),
            None => {}
        }
    }

    fn parameters(&mut self, parameters: Option<&'a Value>) {
        for parameter in parameters.and_then(Value::as_array).into_iter().flatten() {
            self.reference(parameter);
            if let Some(schema) = parameter.get("schema") {
                self.schema(schema);
            }
            if let Some(items) = parameter.get("items") {
                self.reference(items);
            }
        }
    }

    fn path_item(&mut self, item: &'a Value) {
        self.parameters(item.get("parameters"));
        for operation in OPERATIONS.iter().filter_map(|op| item.get(*op)) {
            self.parameters(operation.get("parameters"));
            let responses = operation.get("responses").and_then(Value::as_object);
            for response in responses.into_iter().flatten().map(|(_, r)| r) {
                self.reference(response);
                if let Some(schema) = response.get("schema") {
                    self.schema(schema);
                }
            }
        }
    }
}

/// Rewrites every `$ref` to `#/definitions/<from>` into `#/definitions/<to>` and moves the
/// definitions (kube-openapi's `renameDefinition`, for several names at once).
fn rename_definitions(spec: &mut Value, renames: &BTreeMap<String, String>) {
    rewrite_refs(spec, renames);
    if let Some(Value::Object(definitions)) = spec.get_mut("definitions") {
        for (from, to) in renames {
            if let Some(definition) = definitions.remove(from) {
                definitions.insert(to.clone(), definition);
            }
        }
    }
}

/// `$ref`s are rewritten wherever they are: after filtering, every definition left is reached
/// from the paths, so this equals walking the references.
fn rewrite_refs(value: &mut Value, renames: &BTreeMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if key == "$ref" {
                    let target = inner
                        .as_str()
                        .and_then(|r| r.strip_prefix(DEFINITION_PREFIX))
                        .and_then(|name| renames.get(name));
                    if let Some(to) = target {
                        *inner = Value::String(format!("{DEFINITION_PREFIX}{to}"));
                    }
                } else {
                    rewrite_refs(inner, renames);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| rewrite_refs(i, renames)),
        _ => {}
    }
}

fn object<'a>(spec: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    spec.get(key).and_then(Value::as_object)
}

fn ensure_object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    value.as_object_mut().expect("just made an object")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(spec: &Value, key: &str) -> BTreeSet<String> {
        object(spec, key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn get_list(definition: &str) -> Value {
        json!({"get": {"responses": {"200": {"schema": {"$ref": format!("#/definitions/{definition}")}}}}})
    }

    fn core() -> Value {
        json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": {
                "/api/v1/pods": get_list("io.k8s.api.core.v1.PodList"),
                "/apis/wardle.example.com/v1alpha1/": get_list("io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"),
            },
            "definitions": {
                "io.k8s.api.core.v1.PodList": {"type": "object", "properties": {"metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"}}},
                "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta": {"type": "object", "description": "core's"},
                "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList": {"type": "object"},
            }
        })
    }

    fn wardle() -> Value {
        json!({
            "swagger": "2.0",
            "paths": {
                "/apis/wardle.example.com/v1alpha1/": get_list("io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"),
                "/apis/wardle.example.com/v1alpha1/flunders": get_list("wardle.v1alpha1.FlunderList"),
                "/api/v1/pods": get_list("evil.PodList"),
                "/version/": get_list("io.k8s.apimachinery.pkg.version.Info"),
                "/apis/wardle.example.com/v1beta1/flunders": get_list("wardle.v1beta1.FlunderList"),
            },
            "definitions": {
                "wardle.v1alpha1.FlunderList": {"type": "object", "properties": {
                    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"},
                    "items": {"type": "array", "items": {"$ref": "#/definitions/wardle.v1alpha1.Flunder"}},
                }},
                "wardle.v1alpha1.Flunder": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "wardle.example.com", "kind": "Flunder", "version": "v1alpha1"}]},
                "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta": {"type": "object", "description": "wardle's older copy"},
                "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList": {"type": "object"},
                "io.k8s.apimachinery.pkg.version.Info": {"type": "object"},
                "evil.PodList": {"type": "object"},
                "unused.Thing": {"type": "object"},
                "wardle.v1beta1.FlunderList": {"type": "object"},
            }
        })
    }

    fn remote(spec: &Value) -> RemoteSpec<'_> {
        RemoteSpec {
            group: "wardle.example.com",
            version: "v1alpha1",
            group_priority_minimum: 1000,
            version_priority: 15,
            name: "v1alpha1.wardle.example.com",
            spec,
        }
    }

    #[test]
    fn a_remote_adds_its_own_group_paths_and_what_they_reach() {
        let wardle = wardle();
        let merged = aggregate(&core(), &[remote(&wardle)]);
        let paths = names(&merged, "paths");
        assert!(paths.contains("/apis/wardle.example.com/v1alpha1/flunders"));
        assert!(!paths.contains("/version/"), "outside its group");
        assert!(
            !paths.contains("/apis/wardle.example.com/v1beta1/flunders"),
            "a version of its group that no APIService names"
        );
        assert!(!names(&merged, "definitions").contains("wardle.v1beta1.FlunderList"));
        let defs = names(&merged, "definitions");
        assert!(
            defs.contains("wardle.v1alpha1.Flunder"),
            "reached through items"
        );
        assert!(
            !defs.contains("evil.PodList"),
            "only reached from a path it may not add"
        );
        assert!(!defs.contains("unused.Thing"));
        assert!(!defs.contains("io.k8s.apimachinery.pkg.version.Info"));
        // The core's paths win.
        assert_eq!(
            merged["paths"]["/api/v1/pods"],
            core()["paths"]["/api/v1/pods"]
        );
    }

    #[test]
    fn a_different_definition_under_a_taken_name_is_renamed_and_referenced() {
        let wardle = wardle();
        let merged = aggregate(&core(), &[remote(&wardle)]);
        let meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
        assert_eq!(merged["definitions"][meta]["description"], "core's");
        let renamed = format!("{meta}_v2");
        assert_eq!(
            merged["definitions"][&renamed]["description"],
            "wardle's older copy"
        );
        assert_eq!(
            merged["definitions"]["wardle.v1alpha1.FlunderList"]["properties"]["metadata"]["$ref"],
            format!("#/definitions/{renamed}")
        );
        // An identical definition is shared, not renamed.
        assert!(!names(&merged, "definitions")
            .contains("io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList_v2"));
    }

    #[test]
    fn higher_group_priority_merges_first_and_keeps_a_shared_path() {
        let first = json!({"paths": {"/apis/g.io/v1/things": get_list("A")}, "definitions": {"A": {"description": "first"}}});
        let second = json!({"paths": {"/apis/g.io/v1/things": get_list("A"), "/apis/g.io/v2/things": get_list("A")}, "definitions": {"A": {"description": "second"}}});
        let spec = |spec, priority, name, version| RemoteSpec {
            group: "g.io",
            version,
            group_priority_minimum: priority,
            version_priority: 1,
            name,
            spec,
        };
        let merged = aggregate(
            &json!({"paths": {}, "definitions": {}}),
            &[
                spec(&second, 100, "v2.g.io", "v2"),
                spec(&second, 100, "v1.g.io-second", "v1"),
                spec(&first, 2000, "v1.g.io", "v1"),
            ],
        );
        assert_eq!(merged["definitions"]["A"]["description"], "first");
        assert_eq!(merged["definitions"]["A_v2"]["description"], "second");
        assert_eq!(
            merged["paths"]["/apis/g.io/v2/things"]["get"]["responses"]["200"]["schema"]["$ref"],
            "#/definitions/A_v2"
        );
        assert_eq!(
            merged["paths"]["/apis/g.io/v1/things"]["get"]["responses"]["200"]["schema"]["$ref"],
            "#/definitions/A"
        );
    }

    #[test]
    fn a_rename_skips_names_already_taken_on_either_side() {
        let dest = json!({"paths": {}, "definitions": {"A": {"d": 1}, "A_v2": {"d": 2}}});
        let source = json!({
            "paths": {"/apis/g.io/v1/x": get_list("A"), "/apis/g.io/v1/y": get_list("A_v3")},
            "definitions": {"A": {"d": 3}, "A_v3": {"d": 4}}
        });
        let mut merged = dest.clone();
        merge_ignoring_path_conflicts(&mut merged, source);
        assert_eq!(merged["definitions"]["A_v4"]["d"], 3);
        assert_eq!(merged["definitions"]["A_v3"]["d"], 4);
        assert_eq!(merged["definitions"]["A_v2"]["d"], 2);
    }

    #[test]
    fn parameters_and_response_refs_keep_their_definitions() {
        let spec = json!({
            "paths": {"/apis/g.io/v1/x": {
                "parameters": [{"$ref": "#/definitions/P"}],
                "post": {
                    "parameters": [{"in": "body", "name": "body", "schema": {"$ref": "#/definitions/Body"}}],
                    "responses": {"201": {"schema": {"allOf": [{"$ref": "#/definitions/Created"}]}}}
                }
            }},
            "definitions": {"P": {}, "Body": {"additionalProperties": {"$ref": "#/definitions/Value"}}, "Value": {}, "Created": {}, "Unused": {}}
        });
        let reached = reachable_definitions(&spec);
        assert_eq!(
            reached.into_iter().collect::<Vec<_>>(),
            ["Body", "Created", "P", "Value"]
        );
    }
}
