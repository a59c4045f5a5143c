//! Each JSON → gnostic mapping, checked on the decoded message by field path (the numbers are
//! those of gnostic's `OpenAPIv2.proto`).

use serde_json::{json, Value};

use super::yaml::{to_yaml, to_yaml_within};
use super::{size_limit, EncodeError};

/// Without a size limit: the mappings are what these tests are about.
fn encode(spec: &Value) -> Result<bytes::Bytes, EncodeError> {
    super::encode(spec, usize::MAX)
}

/// A decoded field value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum F<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
}

fn varint(b: &mut &[u8]) -> u64 {
    let mut value = 0;
    let mut shift = 0;
    loop {
        let byte = b[0];
        *b = &b[1..];
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

fn fields(mut b: &[u8]) -> Vec<(u64, F<'_>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let value = match key & 7 {
            0 => F::Varint(varint(&mut b)),
            1 => {
                let v = u64::from_le_bytes(b[..8].try_into().unwrap());
                b = &b[8..];
                F::Fixed64(v)
            }
            2 => {
                let len = varint(&mut b) as usize;
                let v = &b[..len];
                b = &b[len..];
                F::Len(v)
            }
            other => panic!("wire type {other}"),
        };
        out.push((key >> 3, value));
    }
    out
}

/// Every value of field `n`.
fn all(b: &[u8], n: u64) -> Vec<F<'_>> {
    fields(b)
        .into_iter()
        .filter(|(k, _)| *k == n)
        .map(|(_, v)| v)
        .collect()
}

/// The one length-delimited value at the path of field numbers (each step must be unique).
fn at<'a>(b: &'a [u8], path: &[u64]) -> &'a [u8] {
    path.iter().fold(b, |b, &n| match all(b, n).as_slice() {
        [F::Len(v)] => v,
        other => panic!("field {n} in {path:?}: {other:?}"),
    })
}

fn text<'a>(b: &'a [u8], path: &[u64]) -> &'a str {
    std::str::from_utf8(at(b, path)).unwrap()
}

/// The entry named `name` of the repeated `Named*` field `n`, as its value message (field 2).
fn named<'a>(b: &'a [u8], n: u64, name: &str) -> &'a [u8] {
    for v in all(b, n) {
        let F::Len(pair) = v else { panic!() };
        if text(pair, &[1]) == name {
            return at(pair, &[2]);
        }
    }
    panic!("no {name} in field {n}");
}

fn names(b: &[u8], n: u64) -> Vec<String> {
    all(b, n)
        .into_iter()
        .map(|v| match v {
            F::Len(pair) => text(pair, &[1]).to_owned(),
            other => panic!("{other:?}"),
        })
        .collect()
}

fn doc(extra: Value) -> Value {
    let mut d = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": {},
    });
    d.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    d
}

fn definition(schema: Value) -> Vec<u8> {
    let bytes = encode(&doc(json!({"definitions": {"io.example.Thing": schema}}))).unwrap();
    named(at(&bytes, &[9]), 1, "io.example.Thing").to_vec()
}

#[test]
fn document_info_security_and_definition_order() {
    let bytes = encode(&doc(json!({
        "definitions": {"b.Second": {"type": "object"}, "a.First": {"type": "string"}},
        "security": [{"BearerToken": []}],
        "securityDefinitions": {
            "BearerToken": {"type": "apiKey", "name": "authorization", "in": "header",
                            "description": "Bearer Token authentication"}
        },
        "x-top": "level",
    })))
    .unwrap();
    assert_eq!(text(&bytes, &[1]), "2.0");
    assert_eq!(text(&bytes, &[2, 1]), "Kubernetes");
    assert_eq!(text(&bytes, &[2, 2]), "v1.33.0");
    // Paths is present (empty) because the document has it.
    assert_eq!(at(&bytes, &[8]), b"");
    assert_eq!(names(at(&bytes, &[9]), 1), ["a.First", "b.Second"]);
    let requirement = at(&bytes, &[12, 1]);
    assert_eq!(text(requirement, &[1]), "BearerToken");
    assert_eq!(at(requirement, &[2]), b"", "an empty scope list");
    let api_key = at(named(at(&bytes, &[13]), 1, "BearerToken"), &[2]);
    assert_eq!(text(api_key, &[1]), "apiKey");
    assert_eq!(text(api_key, &[2]), "authorization");
    assert_eq!(text(api_key, &[3]), "header");
    assert_eq!(text(named(&bytes, 16, "x-top"), &[2]), "level\n");
}

#[test]
fn schema_ref_type_items_required_bounds() {
    let s = definition(json!({
        "description": "a thing",
        "type": "object",
        "required": ["spec", "kind"],
        "properties": {
            "spec": {"$ref": "#/definitions/io.example.Spec"},
            "list": {"type": "array", "items": {"$ref": "#/definitions/io.example.Item"}},
            "count": {"type": "integer", "format": "int32", "maximum": 10, "minimum": 0.5,
                      "maxLength": 3, "uniqueItems": true},
        },
    }));
    assert_eq!(text(&s, &[4]), "a thing");
    assert_eq!(text(&s, &[22, 1]), "object");
    assert_eq!(
        all(&s, 19),
        [F::Len(b"spec"), F::Len(b"kind")],
        "required in order"
    );
    let props = at(&s, &[25]);
    assert_eq!(names(props, 1), ["count", "list", "spec"]);
    assert_eq!(
        text(named(props, 1, "spec"), &[1]),
        "#/definitions/io.example.Spec"
    );
    let list = named(props, 1, "list");
    assert_eq!(text(list, &[23, 1, 1]), "#/definitions/io.example.Item");
    let count = named(props, 1, "count");
    assert_eq!(text(count, &[2]), "int32");
    assert_eq!(all(count, 7), [F::Fixed64(10f64.to_bits())]);
    assert_eq!(all(count, 9), [F::Fixed64(0.5f64.to_bits())]);
    assert_eq!(all(count, 11), [F::Varint(3)]);
    assert_eq!(all(count, 16), [F::Varint(1)]);
    // Unset scalars are left out (proto3).
    assert!(all(count, 8).is_empty());
}

#[test]
fn additional_properties_bool_and_schema() {
    let s = definition(json!({
        "properties": {
            "open": {"type": "object", "additionalProperties": true},
            "closed": {"type": "object", "additionalProperties": false},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }));
    let props = at(&s, &[25]);
    assert_eq!(all(at(named(props, 1, "open"), &[21]), 2), [F::Varint(1)]);
    // `false` is still the oneof's boolean, written although zero.
    assert_eq!(all(at(named(props, 1, "closed"), &[21]), 2), [F::Varint(0)]);
    assert_eq!(text(named(props, 1, "labels"), &[21, 1, 22, 1]), "string");
}

#[test]
fn vendor_extensions_enum_default_example_as_yaml() {
    let s = definition(json!({
        "type": "string",
        "enum": ["Always", "", "true", 3],
        "default": {"a": [1, "b"]},
        "example": "2024-01-02",
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
        "x-kubernetes-list-type": "atomic",
    }));
    let enums: Vec<&str> = all(&s, 20)
        .into_iter()
        .map(|v| match v {
            F::Len(any) => text(any, &[2]),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(enums, ["Always\n", "\"\"\n", "\"true\"\n", "3\n"]);
    assert_eq!(text(&s, &[5, 2]), "a:\n    - 1\n    - b\n");
    assert_eq!(text(&s, &[30, 2]), "\"2024-01-02\"\n");
    assert_eq!(
        names(&s, 31),
        ["x-kubernetes-group-version-kind", "x-kubernetes-list-type"]
    );
    assert_eq!(
        text(named(&s, 31, "x-kubernetes-group-version-kind"), &[2]),
        "- group: \"\"\n  kind: Pod\n  version: v1\n"
    );
    assert_eq!(
        text(named(&s, 31, "x-kubernetes-list-type"), &[2]),
        "atomic\n"
    );
}

fn operation(op: Value) -> Vec<u8> {
    let bytes = encode(&doc(json!({
        "paths": {
            "/api/v1/namespaces/{namespace}/pods": {
                "get": op,
                "parameters": [{"$ref": "#/parameters/namespace-vgWSWtn3"}],
                "x-path-extension": true,
            }
        }
    })))
    .unwrap();
    let item = named(at(&bytes, &[8]), 2, "/api/v1/namespaces/{namespace}/pods");
    assert_eq!(text(named(item, 10, "x-path-extension"), &[2]), "true\n");
    // A `$ref` parameter is a JsonReference (ParametersItem field 2).
    assert_eq!(text(item, &[9, 2, 1]), "#/parameters/namespace-vgWSWtn3");
    at(item, &[2]).to_vec()
}

#[test]
fn body_and_non_body_parameters() {
    let op = operation(json!({
        "operationId": "listPods",
        "parameters": [
            {"name": "body", "in": "body", "required": true,
             "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.Pod"}},
            {"name": "watch", "in": "query", "type": "boolean", "uniqueItems": true,
             "allowEmptyValue": true},
            {"name": "name", "in": "path", "required": true, "type": "string"},
            {"name": "X-Trace", "in": "header", "type": "string", "enum": ["a"]},
            {"name": "file", "in": "formData", "type": "array", "collectionFormat": "csv",
             "items": {"type": "string", "default": "x"}},
        ],
        "responses": {"200": {"description": "OK"}},
    }));
    assert_eq!(text(&op, &[5]), "listPods");
    let params: Vec<&[u8]> = all(&op, 8)
        .into_iter()
        .map(|v| match v {
            F::Len(p) => at(p, &[1]),
            other => panic!("{other:?}"),
        })
        .collect();
    let body = at(params[0], &[1]);
    assert_eq!(text(body, &[2]), "body");
    assert_eq!(text(body, &[3]), "body");
    assert_eq!(all(body, 4), [F::Varint(1)]);
    assert_eq!(text(body, &[5, 1]), "#/definitions/io.k8s.api.core.v1.Pod");

    let query = at(params[1], &[2, 3]);
    assert_eq!(text(query, &[4]), "watch");
    assert_eq!(all(query, 5), [F::Varint(1)], "allowEmptyValue");
    assert_eq!(text(query, &[6]), "boolean");
    assert_eq!(all(query, 20), [F::Varint(1)], "uniqueItems");

    let path = at(params[2], &[2, 4]);
    assert_eq!(all(path, 1), [F::Varint(1)], "required");
    assert_eq!(text(path, &[5]), "string");

    let header = at(params[3], &[2, 1]);
    assert_eq!(text(header, &[4]), "X-Trace");
    assert_eq!(text(header, &[20, 2]), "a\n");

    let form = at(params[4], &[2, 2]);
    assert_eq!(text(form, &[6]), "array");
    assert_eq!(text(form, &[9]), "csv");
    assert_eq!(text(form, &[8, 1]), "string", "PrimitivesItems.type");
    assert_eq!(text(form, &[8, 5, 2]), "x\n", "PrimitivesItems.default");
}

#[test]
fn responses_codes_refs_headers_and_extensions() {
    let op = operation(json!({
        "responses": {
            "200": {"description": "OK", "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.PodList"},
                    "headers": {"X-Rate": {"type": "integer", "description": "left"}}},
            "401": {"description": "Unauthorized"},
            "default": {"$ref": "#/responses/error"},
            "x-codegen": {"skip": true},
        },
    }));
    let responses = at(&op, &[9]);
    assert_eq!(names(responses, 1), ["200", "401", "default"]);
    let ok = at(named(responses, 1, "200"), &[1]);
    assert_eq!(text(ok, &[1]), "OK");
    assert_eq!(
        text(ok, &[2, 1, 1]),
        "#/definitions/io.k8s.api.core.v1.PodList"
    );
    let rate = named(at(ok, &[3]), 1, "X-Rate");
    assert_eq!(text(rate, &[1]), "integer");
    assert_eq!(text(rate, &[18]), "left");
    assert_eq!(
        text(named(responses, 1, "default"), &[2, 1]),
        "#/responses/error"
    );
    assert_eq!(text(named(responses, 2, "x-codegen"), &[2]), "skip: true\n");
}

#[test]
fn file_response_schema() {
    let op = operation(json!({
        "responses": {"200": {"description": "a file", "schema": {"type": "file"}}},
    }));
    let ok = at(named(at(&op, &[9]), 1, "200"), &[1]);
    assert_eq!(text(ok, &[2, 2, 6]), "file", "SchemaItem.file_schema.type");
}

#[test]
fn wrong_shapes_are_errors_naming_the_place() {
    assert_eq!(
        encode(&json!(["not", "a", "document"])),
        Err(EncodeError::Unexpected {
            path: String::new(),
            expected: "an object"
        })
    );
    let err = encode(&doc(json!({"paths": {"/a": {"get": {"parameters": {}}}}}))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "openapi v2 spec: /paths/~1a/get/parameters must be an array"
    );
}

#[test]
fn yaml_layout_like_yaml_v3() {
    let v = json!({"a": {"b": [1, {"c": "d", "e": []}, [2, 3]]}, "f": {}, "g": null});
    assert_eq!(
        to_yaml(&v),
        "a:\n    b:\n        - 1\n        - c: d\n          e: []\n        - - 2\n          - 3\nf: {}\ng: null\n"
    );
    assert_eq!(to_yaml(&json!([{"a": {"b": 1}}])), "- a:\n    b: 1\n");
}

#[test]
fn yaml_scalars_quoted_where_yaml_v3_quotes() {
    for (s, expected) in [
        ("plain text", "plain text\n"),
        ("", "\"\"\n"),
        ("null", "\"null\"\n"),
        ("True", "\"True\"\n"),
        ("yes", "yes\n"),
        ("123", "\"123\"\n"),
        ("0x1F", "\"0x1F\"\n"),
        ("1.5e3", "\"1.5e3\"\n"),
        ("1.2.3", "1.2.3\n"),
        ("a: b", "'a: b'\n"),
        ("- x", "'- x'\n"),
        ("*", "'*'\n"),
        ("it's", "it's\n"),
        ("'quoted'", "'''quoted'''\n"),
        (" leading", "' leading'\n"),
        ("tab\there", "\"tab\\there\"\n"),
        ("two\nlines", "|-\n    two\n    lines\n"),
        ("ends\n", "|\n    ends\n"),
        ("ünïcode", "ünïcode\n"),
    ] {
        assert_eq!(to_yaml(&json!(s)), expected, "{s:?}");
    }
    assert_eq!(
        to_yaml(&json!({"k": "two\nlines"})),
        "k: |-\n    two\n    lines\n"
    );
}

/// A value nested `depth` levels deep (arrays in arrays), with `leaves` zeros at the bottom.
fn nested_array(depth: usize, leaves: usize) -> Value {
    let mut v = Value::Array(vec![json!(0); leaves]);
    for _ in 1..depth {
        v = Value::Array(vec![v]);
    }
    v
}

#[test]
fn yaml_of_a_deeply_nested_value_is_cut_at_its_limit() {
    // Each leaf is two bytes of JSON and, 120 levels down, a line of 240 spaces of YAML.
    let deep = nested_array(120, 1_000);
    let json_len = serde_json::to_vec(&deep).unwrap().len();
    let full = to_yaml(&deep);
    assert!(full.len() > 100 * json_len, "{} vs {json_len}", full.len());
    assert_eq!(to_yaml_within(&deep, full.len()).as_deref(), Some(&*full));
    assert_eq!(to_yaml_within(&deep, 10 * json_len), None);
}

#[test]
fn a_spec_whose_yaml_would_multiply_it_is_refused_not_written() {
    // A 200 KB extension that YAML would print as 25 MB (issue 26's structure-aware fuzzing:
    // deep arrays of many leaves).
    let spec = doc(json!({"x-deep": nested_array(126, 100_000)}));
    let json_len = serde_json::to_vec(&spec).unwrap().len();
    let limit = size_limit(json_len);
    assert_eq!(
        super::encode(&spec, limit),
        Err(EncodeError::TooLarge { limit })
    );
    // The same value shallow is written.
    let shallow = doc(json!({"x-flat": nested_array(2, 100_000)}));
    let json_len = serde_json::to_vec(&shallow).unwrap().len();
    assert!(super::encode(&shallow, size_limit(json_len)).is_ok());
}

#[test]
fn the_deepest_spec_the_parser_accepts_encodes_on_a_small_stack() {
    // serde_json refuses nesting past 128 levels, so the encoder's recursion (a few frames per
    // level) is bounded by that: the deepest schema chain that parses, encoded on a thread with
    // a quarter of a worker thread's stack.
    let mut text = String::from(r#"{"definitions":{"a":"#);
    let levels = 62;
    for _ in 0..levels {
        text.push_str(r#"{"properties":{"p":"#);
    }
    text.push_str("{}");
    for _ in 0..levels {
        text.push_str("}}");
    }
    text.push_str("}}");
    let spec: Value = serde_json::from_str(&text).unwrap();
    let deeper = text.replacen(
        r#"{"properties":{"p":"#,
        r#"{"properties":{"p":{"properties":{"p":"#,
        1,
    );
    let deeper = deeper.replacen("}}", "}}}}", 1);
    let refused = serde_json::from_str::<Value>(&deeper).unwrap_err();
    assert!(
        refused.to_string().starts_with("recursion limit exceeded"),
        "{refused}"
    );
    let encoded = std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(move || super::encode(&spec, usize::MAX).map(|b| b.len()))
        .unwrap()
        .join()
        .unwrap();
    assert!(encoded.unwrap() > levels);
}
