//! The OpenAPI documents a backend controls, under fuzzing: its v2 spec filtered, merged and
//! written as protobuf, the same spec converted to v3, and its v3 root in the union. Each body
//! takes raw bytes (see [`super::choices::documents`]), runs the code as the gateway runs it and
//! checks what must hold whatever the input: no panic, no stack overflow, the core's paths
//! untouched, and no amplification (what comes out is bounded by what went in).

use serde_json::{json, Map, Value};

use super::choices::{documents, Choices};
use crate::discovery::openapi::{merge_openapi_roots, OpenApiPath, OpenApiRoot};
use crate::discovery::openapi_v2::{aggregate, filter_by_path_prefixes, RemoteSpec};
use crate::discovery::openapi_v2_proto::{encode, size_limit};
use crate::discovery::openapi_v2_to_v3::{group_version_document, ConvertError, MAX_COPIED_BYTES};
use crate::discovery::{etag_for, MAX_JSON_DEPTH};

/// The remote APIService's group-version in every body.
const GROUP: &str = "g.io";
const VERSION: &str = "v1";
const PREFIX: &str = "/apis/g.io/v1/";

/// Where generated paths go: the APIService's own, its group's other version, the core's.
const PATH_PREFIXES: [&str; 4] = [PREFIX, "/apis/g.io/v2/", "/api/v1/", "x-"];
const OPERATIONS: [&str; 4] = ["get", "post", "put", "patch"];

/// A Swagger 2.0 spec shaped by `c` (the `which`-th of an input's documents): a few dozen
/// definitions referencing each other (cycles and self-references included), optionally a long
/// chain of definitions each referencing the next (closed into a cycle or not), schemas nested
/// up to past the parser's depth limit, huge arrays (enums, media type lists, extensions), and
/// paths with parameters, shared-parameter references, bodies and responses.
pub fn spec(c: &mut Choices<'_>, which: usize) -> Value {
    let named = 1 + c.below(24);
    let mut definitions = Map::new();
    for i in 0..named {
        definitions.insert(format!("D{i}"), schema(c, named, 0));
    }
    if c.flag() {
        let links = c.many(4000);
        let cycle = c.flag();
        for i in 0..links {
            let next = if i + 1 == links && cycle { 0 } else { i + 1 };
            definitions.insert(
                format!("L{i}"),
                json!({"properties": {"next": {"$ref": format!("#/definitions/L{next}")}}}),
            );
        }
    }
    let mut paths = Map::new();
    for i in 0..1 + c.below(8) {
        let prefix = PATH_PREFIXES[c.below(PATH_PREFIXES.len())];
        paths.insert(format!("{prefix}p{which}-{i}"), path_item(c, named));
    }
    let mut spec = json!({"swagger": "2.0", "paths": paths, "definitions": definitions});
    if c.flag() {
        spec["consumes"] = media_types(c);
    }
    if c.flag() {
        spec["produces"] = media_types(c);
    }
    if c.flag() {
        spec["parameters"] = json!({
            "body": {"name": "body", "in": "body", "required": true, "schema": schema(c, named, 0)},
            "pretty": {"name": "pretty", "in": "query", "type": "string"},
        });
    }
    if c.flag() {
        spec["x-extension"] = nested_array(c.below(MAX_JSON_DEPTH + 8), c.many(3000));
    }
    spec
}

/// A reference to one of the `named` definitions, a chain link, or a name nobody defines.
fn reference(c: &mut Choices<'_>, named: usize) -> Value {
    let target = match c.below(8) {
        0 => "L0".to_owned(),
        1 => "Missing".to_owned(),
        _ => format!("D{}", c.below(named)),
    };
    json!({"$ref": format!("#/definitions/{target}")})
}

fn schema(c: &mut Choices<'_>, named: usize, depth: usize) -> Value {
    if depth > MAX_JSON_DEPTH + 8 {
        return json!({});
    }
    let deeper = depth + 2;
    match c.below(11) {
        0 => reference(c, named),
        1 => json!({"properties": {"a": schema(c, named, deeper), "b": reference(c, named)}}),
        2 => json!({"type": "array", "items": schema(c, named, deeper)}),
        3 => json!({"allOf": [schema(c, named, deeper), reference(c, named)]}),
        4 => json!({"additionalProperties": schema(c, named, deeper), "not": reference(c, named)}),
        5 => {
            let mut r = reference(c, named);
            r["description"] = "a reference with a sibling".into();
            r
        }
        6 => json!({"items": [schema(c, named, deeper), reference(c, named)]}),
        7 => json!({"type": "string", "enum": (0..c.many(3000)).collect::<Vec<_>>()}),
        8 => nested_schema(c.below(MAX_JSON_DEPTH + 8)),
        9 => json!({
            "type": "object",
            "default": reference(c, named),
            "x-kubernetes-list-type": nested_array(c.below(MAX_JSON_DEPTH + 8), c.many(200)),
        }),
        _ => json!({"type": "string"}),
    }
}

/// `{"properties": {"p": …}}` around an empty schema, `depth` objects deep (built from the
/// inside out: no recursion here either).
fn nested_schema(depth: usize) -> Value {
    let mut schema = json!({});
    for _ in 0..depth / 2 {
        schema = json!({"properties": {"p": schema}});
    }
    schema
}

/// An array `depth` levels deep with `leaves` numbers at the bottom.
fn nested_array(depth: usize, leaves: usize) -> Value {
    let mut v = Value::Array(vec![json!(0); leaves]);
    for _ in 1..depth {
        v = Value::Array(vec![v]);
    }
    v
}

fn media_types(c: &mut Choices<'_>) -> Value {
    let distinct = 1 + c.many(3000);
    let repeated = c.flag();
    let types: Vec<String> = (0..distinct)
        .map(|i| format!("application/x-{}", if repeated { 0 } else { i }))
        .collect();
    json!(types)
}

fn path_item(c: &mut Choices<'_>, named: usize) -> Value {
    let mut item = Map::new();
    if c.flag() {
        item.insert(
            "parameters".into(),
            json!([{"$ref": "#/parameters/pretty"}, {"name": "namespace", "in": "path", "type": "string"}]),
        );
    }
    for _ in 0..1 + c.below(3) {
        let op = OPERATIONS[c.below(OPERATIONS.len())];
        let mut parameters = Vec::new();
        for _ in 0..c.below(4) {
            parameters.push(match c.below(4) {
                0 => json!({"$ref": "#/parameters/body"}),
                1 => json!({"in": "body", "name": "body", "schema": schema(c, named, 0)}),
                2 => json!({}),
                _ => json!({"in": "query", "name": "q", "type": "integer"}),
            });
        }
        let mut responses = Map::new();
        for code in 0..c.below(4) {
            responses.insert(
                format!("{}", 200 + code),
                json!({"description": "OK", "schema": schema(c, named, 0)}),
            );
        }
        let mut operation = json!({"parameters": parameters, "responses": responses});
        if c.flag() {
            operation["consumes"] = media_types(c);
        }
        item.insert(op.into(), operation);
    }
    Value::Object(item)
}

fn parse(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice(bytes).ok()
}

fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |b| b.len())
}

fn object<'a>(value: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    value.get(key).and_then(Value::as_object)
}

/// A remote spec filtered to its group-version, merged into a core spec, and the merge written
/// as protobuf.
///
/// Input: two documents, the core's and the remote's (see [`super::choices::documents`]).
pub fn openapi_v2(data: &[u8]) {
    let docs = documents(data, 2, spec);
    let (Some(core), Some(remote)) = (parse(&docs[0]), parse(&docs[1])) else {
        return;
    };
    let inputs = docs[0].len() + docs[1].len();

    // The filter keeps the group-version's paths and definitions the spec has, as they are,
    // and filtering again changes nothing.
    let prefixes = [PREFIX.to_owned()];
    let filtered = filter_by_path_prefixes(remote.clone(), &prefixes);
    for (key, kept) in [("paths", true), ("definitions", false)] {
        let Some(out) = object(&filtered, key) else {
            continue;
        };
        let given = object(&remote, key).expect("filtering adds no section");
        for (name, value) in out {
            assert_eq!(given.get(name), Some(value), "{key}/{name} changed");
            if kept {
                assert!(name.starts_with(PREFIX) || name.starts_with("x-"), "{name}");
            }
        }
    }
    assert_eq!(
        filter_by_path_prefixes(filtered.clone(), &prefixes),
        filtered,
        "filtering twice"
    );

    // The merge keeps the core's paths as they are and costs no more than its inputs (renames
    // add a few bytes per name and reference).
    let merged = aggregate(
        &core,
        &[RemoteSpec {
            group: GROUP,
            version: VERSION,
            group_priority_minimum: 1000,
            version_priority: 15,
            name: "v1.g.io",
            spec: &remote,
        }],
    );
    if let (Some(out), Some(given)) = (object(&merged, "paths"), object(&core, "paths")) {
        for (path, item) in given {
            assert_eq!(out.get(path), Some(item), "the core's {path} changed");
        }
    }
    let merged_len = json_len(&merged);
    assert!(
        merged_len <= 2 * inputs + 64,
        "{inputs} bytes in, {merged_len} merged"
    );

    // The protobuf form stays within its limit, or is refused with a reason.
    let limit = size_limit(inputs);
    if let Ok(bytes) = encode(&merged, limit) {
        assert!(bytes.len() <= limit, "{} > {limit}", bytes.len());
    }
}

/// A spec converted to the OpenAPI v3 document of its group-version.
///
/// Input: one document (see [`super::choices::documents`]).
pub fn openapi_v2_to_v3(data: &[u8]) {
    let docs = documents(data, 1, spec);
    let Some(v2) = parse(&docs[0]) else {
        return;
    };
    match group_version_document(&v2, GROUP, VERSION) {
        Ok(v3) => {
            assert_eq!(v3["openapi"], "3.0.0");
            // A handful of wrapper bytes per element of the spec, and the copies the
            // conversion is allowed; nothing more.
            let out = json_len(&v3);
            let bound = 8 * docs[0].len() + MAX_COPIED_BYTES + 4096;
            assert!(out <= bound, "{} bytes in, {out} out", docs[0].len());
        }
        Err(ConvertError::TooMuchCopying) => {}
    }
}

/// OpenAPI v3 root documents shaped by `c`: overlapping keys, long and odd ones, and many.
pub fn root(c: &mut Choices<'_>, which: usize) -> Value {
    let mut paths = Map::new();
    for i in 0..c.many(300) {
        let key = match c.below(5) {
            0 => format!("apis/g{}.io/v{}", c.below(4), c.below(3)),
            1 => "api/v1".to_owned(),
            2 => format!("apis/{}", "x".repeat(c.many(2000))),
            3 => format!("apis/g.io/v1/{i}"),
            _ => String::from_utf8_lossy(&[c.byte(), c.byte()]).into_owned(),
        };
        let url = format!("/openapi/v3/{key}?hash={which}-{i}");
        paths.insert(key, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// Backends' v3 roots unioned: each key is owned by the last root listing it, with that root's
/// entry, and the served body lists exactly the owned keys.
///
/// Input: up to four root documents (see [`super::choices::documents`]).
pub fn openapi_v3_root(data: &[u8]) {
    let docs = documents(data, 4, root);
    let roots: Vec<(usize, OpenApiRoot)> = docs
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((i, serde_json::from_slice(d).ok()?)))
        .collect();
    let merged = merge_openapi_roots(&roots).expect("a root always serializes");
    let body: OpenApiRoot = serde_json::from_slice(&merged.body).expect("the body parses back");
    assert_eq!(body.paths.len(), merged.owners.len());
    for (key, owner) in &merged.owners {
        let (last, root) = roots
            .iter()
            .rev()
            .find(|(_, r)| r.paths.contains_key(key))
            .expect("an owned key was listed");
        assert_eq!(owner, last, "{key}");
        let listed: &OpenApiPath = &root.paths[key];
        assert_eq!(&body.paths[key], listed, "{key}");
    }
    let inputs: usize = docs.iter().map(Vec::len).sum();
    assert!(
        merged.body.len() <= inputs + 16,
        "{} > {inputs}",
        merged.body.len()
    );
    assert_eq!(merged.etag, etag_for(&merged.body));
}
