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
    retain_paths(&mut spec, prefixes);
    retain_reachable_definitions(&mut spec);
    spec
}

/// Drops the paths that start with none of `prefixes` (vendor extensions stay).
pub fn retain_paths(spec: &mut Value, prefixes: &[String]) {
    if let Some(Value::Object(paths)) = spec.get_mut("paths") {
        paths.retain(|path, _| {
            path.starts_with("x-") || prefixes.iter().any(|p| path.starts_with(p.as_str()))
        });
    }
}

/// Drops the definitions the paths do not reach.
fn retain_reachable_definitions(spec: &mut Value) {
    let used = reachable_definitions(spec);
    if let Some(Value::Object(definitions)) = spec.get_mut("definitions") {
        definitions.retain(|name, _| used.contains(name));
    }
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
    retain_reachable_definitions(&mut source);

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
        pending: Vec::new(),
    };
    if let Some(paths) = object(spec, "paths") {
        for item in paths.values() {
            walker.path_item(item);
        }
    }
    walker.walk();
    walker.visited
}

/// Follows references from the paths, visiting each definition once.
///
/// A backend's spec is input: a chain of thousands of definitions, each referencing the next,
/// is as legal as a schema nested as deep as the JSON parser allows. So nothing here recurses:
/// schemas wait in `pending` and are taken one at a time, and the stack stays flat whatever
/// the spec (a recursive walk overflows the stack on a chain of a few thousand links).
struct RefWalker<'a> {
    definitions: Option<&'a Map<String, Value>>,
    visited: BTreeSet<String>,
    /// Schemas found and not walked yet.
    pending: Vec<&'a Value>,
}

impl<'a> RefWalker<'a> {
    /// Queues the definition `value`'s `$ref` names, the first time it is named.
    fn follow(&mut self, value: &'a Value) {
        let Some(name) = value
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix(DEFINITION_PREFIX))
        else {
            return;
        };
        if self.visited.insert(name.to_owned()) {
            if let Some(definition) = self.definitions.and_then(|d| d.get(name)) {
                self.pending.push(definition);
            }
        }
    }

    /// Walks every queued schema and whatever it queues in turn.
    fn walk(&mut self) {
        while let Some(schema) = self.pending.pop() {
            self.schema(schema);
        }
    }

    /// One schema: its own reference, and its sub-schemas queued.
    fn schema(&mut self, schema: &'a Value) {
        if !schema.is_object() {
            return;
        }
        self.follow(schema);
        for key in SCHEMA_ONE {
            self.pending.extend(schema.get(key));
        }
        for key in SCHEMA_LIST {
            let list = schema.get(key).and_then(Value::as_array);
            self.pending.extend(list.into_iter().flatten());
        }
        for key in SCHEMA_MAP {
            let map = schema.get(key).and_then(Value::as_object);
            self.pending
                .extend(map.into_iter().flat_map(|m| m.values()));
        }
        match schema.get("items") {
            Some(Value::Array(items)) => self.pending.extend(items),
            Some(items) => self.pending.push(items),
            None => {}
        }
    }

    fn parameters(&mut self, parameters: Option<&'a Value>) {
        for parameter in parameters.and_then(Value::as_array).into_iter().flatten() {
            self.follow(parameter);
            self.pending.extend(parameter.get("schema"));
            if let Some(items) = parameter.get("items") {
                self.follow(items);
            }
        }
    }

    fn path_item(&mut self, item: &'a Value) {
        self.parameters(item.get("parameters"));
        for operation in OPERATIONS.iter().filter_map(|op| item.get(*op)) {
            self.parameters(operation.get("parameters"));
            let responses = operation.get("responses").and_then(Value::as_object);
            for response in responses.into_iter().flatten().map(|(_, r)| r) {
                self.follow(response);
                self.pending.extend(response.get("schema"));
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
/// from the paths, so this equals walking the references. A worklist, like [`RefWalker`].
fn rewrite_refs(value: &mut Value, renames: &BTreeMap<String, String>) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if key != "$ref" {
                        pending.push(inner);
                        continue;
                    }
                    let target = inner
                        .as_str()
                        .and_then(|r| r.strip_prefix(DEFINITION_PREFIX))
                        .and_then(|name| renames.get(name));
                    if let Some(to) = target {
                        *inner = Value::String(format!("{DEFINITION_PREFIX}{to}"));
                    }
                }
            }
            Value::Array(items) => pending.extend(items.iter_mut()),
            _ => {}
        }
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
pub(crate) mod tests {
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

    /// A spec whose one path reaches `Link0`, each `Link<i>` referencing `Link<i+1>` (issue 26:
    /// 5 000 links overflowed the stack of a recursive walk).
    pub(crate) fn chain(links: usize) -> Value {
        let mut definitions = Map::new();
        for i in 0..links {
            let next = json!({"$ref": format!("#/definitions/Link{}", i + 1)});
            let link = match i % 3 {
                0 => json!({"properties": {"next": next}}),
                1 => json!({"items": next, "description": "and with a sibling"}),
                _ => json!({"allOf": [next]}),
            };
            definitions.insert(format!("Link{i}"), link);
        }
        definitions.insert(format!("Link{links}"), json!({"type": "string"}));
        definitions.insert("Unreached".into(), json!({"$ref": "#/definitions/Link0"}));
        json!({
            "paths": {"/apis/g.io/v1/links": get_list("Link0")},
            "definitions": definitions,
        })
    }

    /// Runs `f` on a thread with a small stack: a walk that recursed per link would overflow it.
    pub(crate) fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_chain_of_twenty_thousand_references_is_walked_without_recursion() {
        const LINKS: usize = 20_000;
        let reached = on_small_stack(|| reachable_definitions(&chain(LINKS)));
        assert_eq!(reached.len(), LINKS + 1);
        assert!(reached.contains(&format!("Link{LINKS}")));
        assert!(!reached.contains("Unreached"));
    }

    #[test]
    fn a_long_chain_merges_and_renames_without_recursion() {
        const LINKS: usize = 10_000;
        let merged = on_small_stack(|| {
            // The core has a different `Link7`: the backend's is renamed and the reference to it
            // rewritten, deep down the chain.
            let core = json!({"paths": {}, "definitions": {"Link7": {"description": "core's"}}});
            let spec = chain(LINKS);
            aggregate(
                &core,
                &[RemoteSpec {
                    group: "g.io",
                    version: "v1",
                    group_priority_minimum: 1,
                    version_priority: 1,
                    name: "v1.g.io",
                    spec: &spec,
                }],
            )
        });
        let definitions = merged["definitions"].as_object().unwrap();
        assert_eq!(
            definitions.len(),
            LINKS + 2,
            "the chain, and the core's Link7"
        );
        assert_eq!(definitions["Link7"]["description"], "core's");
        assert_eq!(
            definitions["Link6"]["properties"]["next"]["$ref"],
            "#/definitions/Link7_v2"
        );
        assert!(definitions["Link7_v2"]["items"].is_object());
    }

    #[test]
    fn reference_cycles_end() {
        let spec = json!({
            "paths": {"/apis/g.io/v1/x": get_list("A")},
            "definitions": {
                "A": {"properties": {"b": {"$ref": "#/definitions/B"}, "self": {"$ref": "#/definitions/A"}}},
                "B": {"items": {"$ref": "#/definitions/A"}},
            }
        });
        let reached = reachable_definitions(&spec);
        assert_eq!(reached.into_iter().collect::<Vec<_>>(), ["A", "B"]);
    }
}
