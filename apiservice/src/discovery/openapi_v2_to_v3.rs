//! OpenAPI v3 documents for aggregated servers that only serve v2 (older metrics adapters,
//! apiserver-builder servers).
//!
//! kube-aggregator notices a backend answering 404 on `/openapi/v3`, downloads its `/openapi/v2`
//! and converts it with kube-openapi's `openapiconv`, so `kubectl explain` (which reads v3 since
//! 1.27) and client-side validation work for it. The conversion here follows the same mapping:
//! - `definitions` become `components.schemas`, and every `#/definitions/<name>` reference
//!   `#/components/schemas/<name>`; a reference with sibling keywords (a description, a default)
//!   is wrapped in `allOf`, because OpenAPI 3.0 ignores whatever sits beside a `$ref`;
//! - `securityDefinitions` become `components.securitySchemes`, `responses` become
//!   `components.responses`;
//! - an operation's `body` parameter becomes its `requestBody`, one media type per `consumes`
//!   entry; other parameters get a `schema` built from their simple type;
//! - a response's `schema` becomes its `content`, one media type per `produces` entry.
//!
//! Two things differ from kube-openapi, both to give a document that stands on its own:
//! parameters referenced from the spec's `parameters` section (`#/parameters/<name>`, which
//! kube-apiserver-style specs use for `body`, `pretty`, ...) are inlined before converting
//! (kube-openapi leaves references to a `components.parameters` it never writes), and the
//! operation-level `consumes`/`produces` fall back to the spec-level ones, as Swagger 2.0 says.
//!
//! The document is limited to the APIService's own group-version, as the v2 merge limits it.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::openapi_v2::{filter_by_path_prefixes, retain_paths};

const OPERATIONS: [&str; 7] = ["get", "put", "post", "delete", "options", "head", "patch"];
const V2_DEFINITION: &str = "#/definitions/";
const V3_SCHEMA: &str = "#/components/schemas/";
/// Keys under which a schema holds values that are data, not schemas: never rewritten.
const DATA_KEYS: [&str; 3] = ["default", "example", "enum"];

/// How many bytes of copies one converted document may hold: shared parameters inlined where
/// they are referenced, and a body's or response's schema once per extra media type. A
/// Kubernetes-style spec copies a few hundred kilobytes at most (its bodies and responses are a
/// `$ref` each); a spec built to multiply itself (a large schema behind thousands of
/// references, or thousands of media types) would otherwise convert into gigabytes.
pub const MAX_COPIED_BYTES: usize = 16 << 20;

/// Why a spec cannot be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error(
        "converting it would copy more than {} MiB of inlined parameters and per-media-type \
         schemas; the spec must reference fewer large shared parameters or list fewer media types",
        MAX_COPIED_BYTES >> 20
    )]
    TooMuchCopying,
}

/// What is left of [`MAX_COPIED_BYTES`] for one document.
struct Copies {
    left: usize,
}

impl Copies {
    fn new() -> Self {
        Self {
            left: MAX_COPIED_BYTES,
        }
    }

    /// Counts `n` bytes written more than once against the allowance.
    fn spend(&mut self, n: usize) -> Result<(), ConvertError> {
        self.left = self
            .left
            .checked_sub(n)
            .ok_or(ConvertError::TooMuchCopying)?;
        Ok(())
    }

    /// A copy of `value`, counted against the allowance.
    fn copy(&mut self, value: &Value) -> Result<Value, ConvertError> {
        self.spend(json_size(value))?;
        Ok(value.clone())
    }
}

/// The length of `value` written as JSON, without writing it anywhere.
fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` into a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The OpenAPI v3 document kube-aggregator would serve at `/openapi/v3/apis/<group>/<version>`
/// for a backend whose OpenAPI v2 spec is `spec`.
pub fn group_version_document(
    spec: &Value,
    group: &str,
    version: &str,
) -> Result<Value, ConvertError> {
    let prefixes = [format!("/apis/{group}/{version}/")];
    let mut spec = spec.clone();
    // Other groups' paths go first, so that only this document's references are inlined; the
    // definitions are filtered after inlining, which may bring references of its own.
    retain_paths(&mut spec, &prefixes);
    let mut copies = Copies::new();
    inline_parameter_refs(&mut spec, &mut copies)?;
    let filtered = filter_by_path_prefixes(spec, &prefixes);
    convert(&filtered, &mut copies)
}

/// Converts a Swagger 2.0 document to OpenAPI 3.0 (module docs).
fn convert(v2: &Value, copies: &mut Copies) -> Result<Value, ConvertError> {
    let mut v3 = Map::new();
    v3.insert("openapi".into(), "3.0.0".into());
    for key in ["info", "externalDocs", "security", "tags"] {
        if let Some(value) = v2.get(key) {
            v3.insert(key.into(), value.clone());
        }
    }
    let consumes = strings(v2.get("consumes"));
    let produces = strings(v2.get("produces"));
    let mut paths = Map::new();
    for (path, item) in v2
        .get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        paths.insert(path.clone(), path_item(item, &consumes, &produces, copies)?);
    }
    v3.insert("paths".into(), Value::Object(paths));

    let mut components = Map::new();
    if let Some(definitions) = v2.get("definitions").and_then(Value::as_object) {
        let schemas = definitions
            .iter()
            .map(|(name, s)| (name.clone(), schema(s)))
            .collect();
        components.insert("schemas".into(), Value::Object(schemas));
    }
    if let Some(schemes) = v2.get("securityDefinitions").and_then(Value::as_object) {
        let schemes = schemes
            .iter()
            .map(|(name, s)| (name.clone(), security_scheme(s)))
            .collect();
        components.insert("securitySchemes".into(), Value::Object(schemes));
    }
    if let Some(responses) = v2.get("responses").and_then(Value::as_object) {
        let mut converted = Map::new();
        for (name, r) in responses {
            converted.insert(name.clone(), response(r, &produces, copies)?);
        }
        components.insert("responses".into(), Value::Object(converted));
    }
    v3.insert("components".into(), Value::Object(components));
    Ok(Value::Object(v3))
}

/// Replaces every `{"$ref": "#/parameters/<name>"}` in path items and operations with the
/// parameter it names, then drops the `parameters` section. A reference to a parameter the
/// spec does not have is left out: it would convert to a dangling reference.
fn inline_parameter_refs(spec: &mut Value, copies: &mut Copies) -> Result<(), ConvertError> {
    let Some(root) = spec.as_object_mut() else {
        return Ok(());
    };
    let shared = match root.remove("parameters") {
        Some(Value::Object(shared)) => shared,
        _ => Map::new(),
    };
    let mut resolve = |list: &mut Value| -> Result<(), ConvertError> {
        let Some(list) = list.as_array_mut() else {
            return Ok(());
        };
        let mut resolved = Vec::with_capacity(list.len());
        for parameter in list.drain(..) {
            match parameter.get("$ref").and_then(Value::as_str) {
                Some(r) => {
                    if let Some(p) = r
                        .strip_prefix("#/parameters/")
                        .and_then(|name| shared.get(name))
                    {
                        resolved.push(copies.copy(p)?);
                    }
                }
                None => resolved.push(parameter),
            }
        }
        *list = resolved;
        Ok(())
    };
    let Some(Value::Object(paths)) = root.get_mut("paths") else {
        return Ok(());
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        if let Some(list) = item.get_mut("parameters") {
            resolve(list)?;
        }
        for op in OPERATIONS {
            if let Some(list) = item.get_mut(op).and_then(|o| o.get_mut("parameters")) {
                resolve(list)?;
            }
        }
    }
    Ok(())
}

fn path_item(
    item: &Value,
    consumes: &[String],
    produces: &[String],
    copies: &mut Copies,
) -> Result<Value, ConvertError> {
    let Some(item) = item.as_object() else {
        return Ok(item.clone());
    };
    let mut out = Map::new();
    for (key, value) in item {
        if OPERATIONS.contains(&key.as_str()) {
            out.insert(key.clone(), operation(value, consumes, produces, copies)?);
        } else if key == "parameters" {
            let params = value.as_array().into_iter().flatten().map(parameter);
            out.insert(key.clone(), Value::Array(params.collect()));
        } else if key == "$ref" || key.starts_with("x-") {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(Value::Object(out))
}

fn operation(
    op: &Value,
    consumes: &[String],
    produces: &[String],
    copies: &mut Copies,
) -> Result<Value, ConvertError> {
    let Some(op) = op.as_object() else {
        return Ok(op.clone());
    };
    let consumes = op
        .get("consumes")
        .map_or_else(|| consumes.to_vec(), |c| strings(Some(c)));
    let produces = op
        .get("produces")
        .map_or_else(|| produces.to_vec(), |p| strings(Some(p)));
    let mut out = Map::new();
    for (key, value) in op {
        match key.as_str() {
            "summary" | "description" | "externalDocs" | "operationId" | "tags" | "deprecated"
            | "security" => {
                out.insert(key.clone(), value.clone());
            }
            "parameters" => {
                let mut params = Vec::new();
                for p in value.as_array().into_iter().flatten() {
                    match (p.get("in").and_then(Value::as_str), p.get("schema")) {
                        (Some("body"), Some(body)) => {
                            let body = request_body(p, body, &consumes, copies)?;
                            out.insert("requestBody".into(), body);
                        }
                        // Swagger's form parameters have no OpenAPI 3 parameter form; they
                        // do not occur in Kubernetes-style specs.
                        (Some("formData"), _) => {}
                        _ => params.push(parameter(p)),
                    }
                }
                if !params.is_empty() {
                    out.insert(key.clone(), Value::Array(params));
                }
            }
            "responses" => {
                let mut responses = Map::new();
                for (code, r) in value.as_object().into_iter().flatten() {
                    let converted = if code.starts_with("x-") {
                        r.clone()
                    } else {
                        response(r, &produces, copies)?
                    };
                    responses.insert(code.clone(), converted);
                }
                out.insert(key.clone(), Value::Object(responses));
            }
            k if k.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    Ok(Value::Object(out))
}

fn request_body(
    parameter: &Value,
    body: &Value,
    consumes: &[String],
    copies: &mut Copies,
) -> Result<Value, ConvertError> {
    let mut out = Map::new();
    if let Some(d) = parameter.get("description") {
        out.insert("description".into(), d.clone());
    }
    if let Some(r) = parameter.get("required") {
        out.insert("required".into(), r.clone());
    }
    out.insert("content".into(), media_types(body, consumes, copies)?);
    Ok(Value::Object(out))
}

/// `{"<type>": {"schema": ...}}` for each media type (once, however often it is listed);
/// `*/*` when the spec names none, so the schema is not lost. Every copy but one counts against
/// `copies`.
fn media_types(body: &Value, types: &[String], copies: &mut Copies) -> Result<Value, ConvertError> {
    let converted = schema(body);
    let mut distinct: BTreeSet<&str> = types.iter().map(String::as_str).collect();
    let last = distinct.pop_last().unwrap_or("*/*");
    let mut content = Map::new();
    for t in distinct {
        // The spec lists its media types once, for all its operations: each operation's copy
        // of the names counts too, or a long list would multiply without the schemas.
        copies.spend(t.len())?;
        let copy = copies.copy(&converted)?;
        content.insert(t.to_owned(), serde_json::json!({ "schema": copy }));
    }
    content.insert(last.to_owned(), serde_json::json!({ "schema": converted }));
    Ok(Value::Object(content))
}

fn parameter(p: &Value) -> Value {
    let Some(p) = p.as_object() else {
        return p.clone();
    };
    let mut out = Map::new();
    let mut simple = Map::new();
    for (key, value) in p {
        match key.as_str() {
            "name" | "in" | "description" | "required" | "allowEmptyValue" | "deprecated" => {
                out.insert(key.clone(), value.clone());
            }
            "$ref" => {
                out.insert(key.clone(), value.clone());
            }
            "schema" => {
                out.insert(key.clone(), schema(value));
            }
            "type" | "format" | "items" | "enum" | "default" | "uniqueItems" | "minimum"
            | "maximum" | "pattern" | "maxLength" | "minLength" | "maxItems" | "minItems" => {
                simple.insert(key.clone(), value.clone());
            }
            k if k.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    if !out.contains_key("schema") && !out.contains_key("$ref") {
        out.insert("schema".into(), schema(&Value::Object(simple)));
    }
    Value::Object(out)
}

fn response(r: &Value, produces: &[String], copies: &mut Copies) -> Result<Value, ConvertError> {
    let Some(r) = r.as_object() else {
        return Ok(r.clone());
    };
    let mut out = Map::new();
    for (key, value) in r {
        match key.as_str() {
            "$ref" => {
                let reference = value.as_str().unwrap_or_default();
                let converted = match reference.strip_prefix("#/responses/") {
                    Some(name) => format!("#/components/responses/{name}"),
                    None => reference.to_owned(),
                };
                out.insert(key.clone(), converted.into());
            }
            "description" | "headers" => {
                out.insert(key.clone(), value.clone());
            }
            "schema" => {
                out.insert("content".into(), media_types(value, produces, copies)?);
            }
            k if k.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    // OpenAPI 3 requires a description on every response.
    out.entry("description").or_insert_with(|| "".into());
    Ok(Value::Object(out))
}

fn security_scheme(s: &Value) -> Value {
    let Some(s) = s.as_object() else {
        return s.clone();
    };
    let mut out = Map::new();
    for (key, value) in s {
        match key.as_str() {
            "type" | "description" | "name" | "in" => {
                out.insert(key.clone(), value.clone());
            }
            k if k.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    if let Some(flow) = s.get("flow").and_then(Value::as_str) {
        let mut props = Map::new();
        for (from, to) in [
            ("authorizationUrl", "authorizationUrl"),
            ("tokenUrl", "tokenUrl"),
            ("scopes", "scopes"),
        ] {
            if let Some(v) = s.get(from) {
                props.insert(to.into(), v.clone());
            }
        }
        let mut flows = Map::new();
        flows.insert(flow.into(), Value::Object(props));
        out.insert("flows".into(), Value::Object(flows));
    }
    Value::Object(out)
}

/// A schema with its definition references pointing at `components.schemas`, references with
/// siblings wrapped in `allOf`.
fn schema(s: &Value) -> Value {
    let mut s = s.clone();
    rewrite_schema(&mut s);
    s
}

/// A worklist, not recursion (a backend's schema is input, see `openapi_v2::RefWalker`). Each
/// schema's own reference is rewritten before its sub-schemas are queued, which gives the same
/// document as rewriting bottom-up: wrapping a reference only adds an `allOf` entry that is
/// already in its final form.
fn rewrite_schema(value: &mut Value) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        rewrite_reference(value);
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    match key.as_str() {
                        k if DATA_KEYS.contains(&k) || k.starts_with("x-") => {}
                        // Maps from names to schemas: a property may well be called `default`.
                        "properties" | "patternProperties" | "definitions" => {
                            if let Value::Object(named) = inner {
                                pending.extend(named.values_mut());
                            }
                        }
                        _ => pending.push(inner),
                    }
                }
            }
            Value::Array(items) => pending.extend(items.iter_mut()),
            _ => {}
        }
    }
}

/// Points `value`'s `$ref` at `components.schemas`, wrapped in `allOf` when it has siblings.
fn rewrite_reference(value: &mut Value) {
    let Value::Object(map) = value else {
        return;
    };
    let reference = match map.get("$ref").and_then(Value::as_str) {
        Some(r) => match r.strip_prefix(V2_DEFINITION) {
            Some(name) => format!("{V3_SCHEMA}{name}"),
            None => r.to_owned(),
        },
        None => return,
    };
    map.remove("$ref");
    let reference = serde_json::json!({ "$ref": reference });
    if map.is_empty() {
        *value = reference;
    } else {
        match map.get_mut("allOf").and_then(Value::as_array_mut) {
            Some(all_of) => all_of.push(reference),
            None => {
                map.insert("allOf".into(), Value::Array(vec![reference]));
            }
        }
    }
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wardle_v2() -> Value {
        json!({
            "swagger": "2.0",
            "info": {"title": "wardle-server", "version": "v0.1.0"},
            "consumes": ["application/json", "application/yaml"],
            "produces": ["application/json"],
            "securityDefinitions": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}},
            "security": [{"BearerToken": []}],
            "parameters": {
                "body-flunder": {"name": "body", "in": "body", "required": true,
                                  "schema": {"$ref": "#/definitions/io.wardle.v1alpha1.Flunder"}},
                "pretty": {"name": "pretty", "in": "query", "type": "string", "uniqueItems": true,
                           "description": "pretty-print"}
            },
            "paths": {
                "/apis/wardle.example.com/v1alpha1/namespaces/{namespace}/flunders": {
                    "parameters": [{"$ref": "#/parameters/pretty"},
                                   {"name": "namespace", "in": "path", "required": true, "type": "string"}],
                    "post": {
                        "operationId": "createFlunder",
                        "consumes": ["application/json"],
                        "parameters": [{"$ref": "#/parameters/body-flunder"},
                                       {"$ref": "#/parameters/missing"}],
                        "responses": {
                            "201": {"description": "Created",
                                    "schema": {"$ref": "#/definitions/io.wardle.v1alpha1.Flunder"}},
                            "401": {"description": "Unauthorized"}
                        },
                        "x-kubernetes-action": "post",
                        "x-kubernetes-group-version-kind": {"group": "wardle.example.com", "version": "v1alpha1", "kind": "Flunder"}
                    }
                },
                "/apis/wardle.example.com/v1beta1/fischers": {
                    "get": {"responses": {"200": {"description": "OK",
                        "schema": {"$ref": "#/definitions/io.wardle.v1beta1.Fischer"}}}}
                },
                "/version/": {"get": {"responses": {"200": {"description": "OK"}}}}
            },
            "definitions": {
                "io.wardle.v1alpha1.Flunder": {
                    "type": "object",
                    "properties": {
                        "metadata": {"description": "Standard object metadata",
                                     "$ref": "#/definitions/io.k8s.ObjectMeta"},
                        "spec": {"$ref": "#/definitions/io.wardle.v1alpha1.FlunderSpec"},
                        "status": {"type": "string", "default": {"$ref": "#/definitions/not-a-ref"}},
                        "default": {"$ref": "#/definitions/io.k8s.ObjectMeta"}
                    },
                    "x-kubernetes-group-version-kind": [{"group": "wardle.example.com", "kind": "Flunder", "version": "v1alpha1"}]
                },
                "io.wardle.v1alpha1.FlunderSpec": {"type": "object",
                    "properties": {"items": {"type": "array", "items": {"$ref": "#/definitions/io.k8s.ObjectMeta"}}}},
                "io.k8s.ObjectMeta": {"type": "object"},
                "io.wardle.v1beta1.Fischer": {"type": "object"}
            }
        })
    }

    #[test]
    fn a_group_version_becomes_a_v3_document_of_its_own() {
        let v3 = group_version_document(&wardle_v2(), "wardle.example.com", "v1alpha1").unwrap();
        assert_eq!(v3["openapi"], "3.0.0");
        assert_eq!(v3["info"]["title"], "wardle-server");
        // Only the APIService's group-version, and only the definitions it reaches.
        let paths: Vec<&String> = v3["paths"].as_object().unwrap().keys().collect();
        assert_eq!(
            paths,
            ["/apis/wardle.example.com/v1alpha1/namespaces/{namespace}/flunders"]
        );
        let schemas: Vec<&String> = v3["components"]["schemas"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            schemas,
            [
                "io.k8s.ObjectMeta",
                "io.wardle.v1alpha1.Flunder",
                "io.wardle.v1alpha1.FlunderSpec"
            ]
        );
        assert_eq!(
            v3["components"]["securitySchemes"]["BearerToken"],
            json!({"type": "apiKey", "name": "authorization", "in": "header"})
        );
    }

    #[test]
    fn references_point_at_components_and_lose_no_sibling() {
        let v3 = group_version_document(&wardle_v2(), "wardle.example.com", "v1alpha1").unwrap();
        let flunder = &v3["components"]["schemas"]["io.wardle.v1alpha1.Flunder"];
        assert_eq!(
            flunder["properties"]["spec"],
            json!({"$ref": "#/components/schemas/io.wardle.v1alpha1.FlunderSpec"})
        );
        assert_eq!(
            flunder["properties"]["metadata"],
            json!({"description": "Standard object metadata",
                   "allOf": [{"$ref": "#/components/schemas/io.k8s.ObjectMeta"}]})
        );
        // Data is data: a default that looks like a reference is kept as it is.
        assert_eq!(
            flunder["properties"]["status"]["default"],
            json!({"$ref": "#/definitions/not-a-ref"})
        );
        // A property named like a data keyword is still a schema.
        assert_eq!(
            flunder["properties"]["default"],
            json!({"$ref": "#/components/schemas/io.k8s.ObjectMeta"})
        );
        assert_eq!(
            flunder["x-kubernetes-group-version-kind"][0]["kind"],
            "Flunder"
        );
        let text = v3.to_string();
        assert!(!text.contains("#/definitions/io."), "{text}");
    }

    #[test]
    fn bodies_parameters_and_responses_take_their_v3_forms() {
        let v3 = group_version_document(&wardle_v2(), "wardle.example.com", "v1alpha1").unwrap();
        let item =
            &v3["paths"]["/apis/wardle.example.com/v1alpha1/namespaces/{namespace}/flunders"];
        // A shared parameter is inlined and gets a schema from its simple type.
        assert_eq!(
            item["parameters"][0],
            json!({"name": "pretty", "in": "query", "description": "pretty-print",
                   "schema": {"type": "string", "uniqueItems": true}})
        );
        let post = &item["post"];
        assert_eq!(
            post["requestBody"],
            json!({"required": true, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/io.wardle.v1alpha1.Flunder"}}}})
        );
        // The body and the dangling reference are gone from the parameters.
        assert!(post.get("parameters").is_none(), "{post}");
        // Responses get one media type per spec-level `produces`.
        assert_eq!(
            post["responses"]["201"],
            json!({"description": "Created", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/io.wardle.v1alpha1.Flunder"}}}})
        );
        assert_eq!(
            post["responses"]["401"],
            json!({"description": "Unauthorized"})
        );
        assert_eq!(post["x-kubernetes-action"], "post");
        assert_eq!(post["operationId"], "createFlunder");
        assert!(post.get("consumes").is_none());
    }

    #[test]
    fn a_long_reference_chain_converts_without_recursion() {
        const LINKS: usize = 5_000;
        let v3 = crate::discovery::openapi_v2::tests::on_small_stack(|| {
            let spec = crate::discovery::openapi_v2::tests::chain(LINKS);
            group_version_document(&spec, "g.io", "v1").unwrap()
        });
        let schemas = v3["components"]["schemas"].as_object().unwrap();
        assert_eq!(schemas.len(), LINKS + 1);
        assert_eq!(
            schemas["Link1"],
            json!({"description": "and with a sibling",
                   "items": {"$ref": "#/components/schemas/Link2"}})
        );
    }

    /// A body schema of about `size` bytes behind a shared parameter, referenced by `operations`
    /// operations that each accept `media_types` media types.
    fn multiplying(size: usize, operations: usize, media_types: usize) -> Value {
        let mut paths = Map::new();
        for i in 0..operations {
            paths.insert(
                format!("/apis/g.io/v1/things{i}"),
                json!({"post": {"parameters": [{"$ref": "#/parameters/body"}],
                                "responses": {"200": {"description": "OK"}}}}),
            );
        }
        let consumes: Vec<String> = (0..media_types)
            .map(|i| format!("application/x-{i}"))
            .collect();
        json!({
            "consumes": consumes,
            "parameters": {"body": {"name": "body", "in": "body",
                                    "schema": {"description": "x".repeat(size)}}},
            "paths": paths,
        })
    }

    #[test]
    fn a_spec_built_to_multiply_itself_is_refused() {
        // 256 KiB of schema behind 100 references, or in front of 100 media types: either way
        // 25 MiB of copies from a 256 KiB spec.
        for spec in [
            multiplying(256 << 10, 100, 1),
            multiplying(256 << 10, 1, 100),
        ] {
            assert_eq!(
                group_version_document(&spec, "g.io", "v1"),
                Err(ConvertError::TooMuchCopying)
            );
        }
        // Kubernetes-sized: small bodies, everywhere, in a few media types.
        let ordinary = multiplying(200, 2_000, 5);
        let v3 = group_version_document(&ordinary, "g.io", "v1").unwrap();
        let content = &v3["paths"]["/apis/g.io/v1/things7"]["post"]["requestBody"]["content"];
        assert_eq!(content.as_object().unwrap().len(), 5);
        // Ten thousand media types of a hundred bytes, listed once for the spec, and an empty
        // schema for three hundred bodies: 6 MB of schema copies, but 300 MB of names.
        let mut names = multiplying(0, 300, 1);
        names["parameters"]["body"]["schema"] = json!({});
        let long: Vec<String> = (0..10_000)
            .map(|i| format!("application/x-{i}-{}", "n".repeat(90)))
            .collect();
        names["consumes"] = json!(long);
        assert_eq!(
            group_version_document(&names, "g.io", "v1"),
            Err(ConvertError::TooMuchCopying)
        );
        // A media type listed twice is written once.
        let mut twice = multiplying(200, 1, 1);
        twice["consumes"] = json!(["application/json", "application/json"]);
        let v3 = group_version_document(&twice, "g.io", "v1").unwrap();
        let content = &v3["paths"]["/apis/g.io/v1/things0"]["post"]["requestBody"]["content"];
        assert_eq!(content.as_object().unwrap().len(), 1);
    }
}
