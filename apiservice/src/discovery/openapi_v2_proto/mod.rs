//! `/openapi/v2` in protobuf: the `openapi.v2.Document` message of google/gnostic's
//! `openapiv2/OpenAPIv2.proto`, which client-go's `OpenAPISchema()` and `kubectl explain` ask for
//! with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`.
//!
//! kube-openapi produces it by parsing the JSON spec with gnostic and marshalling the message; here
//! the JSON value is walked once and the wire format written directly, message by message, in
//! field-number order (as Go's marshaller writes), so for the same JSON the bytes can be equal.
//! Maps (`definitions`, `paths`, `properties`, vendor extensions ...) become gnostic's ordered
//! `Named*` pairs in the order of the [`serde_json::Map`]'s keys, which is sorted (the workspace
//! does not enable `preserve_order`); gnostic keeps the JSON text's order, and kube-apiserver
//! writes these maps sorted, so the two agree for its spec. Free-form values (`default`, `example`,
//! `enum` members, `x-*` extensions) become `Any { yaml }` holding the YAML text gnostic writes
//! with yaml.v3 ([`yaml`]).
//!
//! * [`wire`]: the protobuf writer (fields, nested messages, `Named*` pairs).
//! * [`schema`]: `Schema`, `FileSchema` and what hangs off them.
//! * [`parameters`]: parameters, `PrimitivesItems`, response headers.
//! * [`yaml`]: a JSON value as yaml.v3 prints it.
//!
//! Unlike gnostic, which refuses a whole document for one unknown key, unknown keys are skipped:
//! the gateway serves what its backends publish and kubectl reads what it understands.

mod parameters;
mod schema;
mod wire;
pub mod yaml;

use bytes::Bytes;
use serde_json::{Map, Value};

use parameters::{parameter, parameters_item};
use schema::{external_docs, schema};
use wire::{Fields, Writer};

/// Why a spec could not be written as protobuf.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// A value has the wrong JSON type for its place in a Swagger 2.0 document.
    #[error("openapi v2 spec: {path} must be {expected}")]
    Unexpected {
        /// JSON-pointer-like location of the value (`/paths/~1api/get/responses`).
        path: String,
        /// What the place requires (`an object`, `an array`).
        expected: &'static str,
    },
    /// The message would be longer than the limit [`encode`] was given.
    #[error(
        "openapi v2 spec: its protobuf form would pass {limit} bytes (free-form values such as \
         `x-*` extensions, defaults and examples are written as YAML, which indents by nesting \
         depth); the spec must nest them less deeply"
    )]
    TooLarge { limit: usize },
}

/// How long the protobuf of a spec whose JSON is `json_len` bytes may be. The message is
/// shorter than the JSON but for the free-form values, written as YAML text; YAML indents by
/// nesting depth, so a deeply nested extension would print as a hundred times its JSON (a flat
/// list of small numbers is already twice its JSON). Four times the JSON and a mebibyte is far
/// above what any real spec needs.
pub fn size_limit(json_len: usize) -> usize {
    json_len.saturating_mul(4).saturating_add(1 << 20)
}

/// Writes `spec`, a Swagger 2.0 document, as a gnostic `openapi.v2.Document` message of at most
/// `limit` bytes (see [`size_limit`]).
pub fn encode(spec: &Value, limit: usize) -> Result<Bytes, EncodeError> {
    let mut w = Writer::within(limit);
    let doc = object(spec, "")?;
    document(&mut w, doc)?;
    w.finish().ok_or(EncodeError::TooLarge { limit })
}

/// `value` as an object, or an error naming `path`.
pub(crate) fn object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, EncodeError> {
    value.as_object().ok_or_else(|| EncodeError::Unexpected {
        path: path.to_owned(),
        expected: "an object",
    })
}

/// `value` as an array, or an error naming `path`.
pub(crate) fn array<'a>(value: &'a Value, path: &str) -> Result<&'a [Value], EncodeError> {
    value
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| EncodeError::Unexpected {
            path: path.to_owned(),
            expected: "an array",
        })
}

/// `path/key` with JSON-pointer escaping, for error messages only.
pub(crate) fn child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn document(w: &mut Writer, m: &Map<String, Value>) -> Result<(), EncodeError> {
    let f = Fields::new(m, "");
    f.string(w, 1, "swagger");
    f.message(w, 2, "info", info)?;
    f.string(w, 3, "host");
    f.string(w, 4, "basePath");
    f.strings(w, 5, "schemes")?;
    f.strings(w, 6, "consumes")?;
    f.strings(w, 7, "produces")?;
    f.message(w, 8, "paths", paths)?;
    // Definitions, ParameterDefinitions, ResponseDefinitions: one `Named*` pair per entry.
    f.message(w, 9, "definitions", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, schema)
    })?;
    f.message(w, 10, "parameters", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, parameter)
    })?;
    f.message(w, 11, "responses", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, response)
    })?;
    f.repeated_messages(w, 12, "security", security_requirement)?;
    f.message(w, 13, "securityDefinitions", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, security_definitions_item)
    })?;
    f.repeated_messages(w, 14, "tags", tag)?;
    f.message(w, 15, "externalDocs", external_docs)?;
    f.vendor_extensions(w, 16);
    Ok(())
}

fn info(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "title");
    f.string(w, 2, "version");
    f.string(w, 3, "description");
    f.string(w, 4, "termsOfService");
    f.message(w, 5, "contact", |w, m, path| {
        let f = Fields::new(m, path);
        f.string(w, 1, "name");
        f.string(w, 2, "url");
        f.string(w, 3, "email");
        f.vendor_extensions(w, 4);
        Ok(())
    })?;
    f.message(w, 6, "license", |w, m, path| {
        let f = Fields::new(m, path);
        f.string(w, 1, "name");
        f.string(w, 2, "url");
        f.vendor_extensions(w, 3);
        Ok(())
    })?;
    f.vendor_extensions(w, 7);
    Ok(())
}

/// `Paths`: vendor extensions (field 1), then the `/…` entries as `NamedPathItem`s (field 2).
fn paths(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    Fields::new(m, path).vendor_extensions(w, 1);
    wire::named_each(w, 2, m, path, |k| k.starts_with('/'), path_item)
}

fn path_item(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "$ref");
    for (number, verb) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (6, "options"),
        (7, "head"),
        (8, "patch"),
    ] {
        f.message(w, number, verb, operation)?;
    }
    f.repeated_messages(w, 9, "parameters", parameters_item)?;
    f.vendor_extensions(w, 10);
    Ok(())
}

fn operation(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.strings(w, 1, "tags")?;
    f.string(w, 2, "summary");
    f.string(w, 3, "description");
    f.message(w, 4, "externalDocs", external_docs)?;
    f.string(w, 5, "operationId");
    f.strings(w, 6, "produces")?;
    f.strings(w, 7, "consumes")?;
    f.repeated_messages(w, 8, "parameters", parameters_item)?;
    f.message(w, 9, "responses", responses)?;
    f.strings(w, 10, "schemes")?;
    f.bool(w, 11, "deprecated");
    f.repeated_messages(w, 12, "security", security_requirement)?;
    f.vendor_extensions(w, 13);
    Ok(())
}

/// Response codes as gnostic accepts them: three digits or `default`.
fn is_response_code(key: &str) -> bool {
    key == "default" || (key.len() == 3 && key.bytes().all(|b| b.is_ascii_digit()))
}

/// `Responses`: `NamedResponseValue`s (field 1), then vendor extensions (field 2).
fn responses(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    wire::named_each(w, 1, m, path, is_response_code, |w, m, path| {
        // ResponseValue: a `$ref` is a JsonReference (gnostic's later oneof match wins).
        if m.contains_key("$ref") {
            w.message(2, |w| json_reference(w, m, path))
        } else {
            w.message(1, |w| response(w, m, path))
        }
    })?;
    Fields::new(m, path).vendor_extensions(w, 2);
    Ok(())
}

pub(crate) fn json_reference(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "$ref");
    f.string(w, 2, "description");
    Ok(())
}

fn response(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "description");
    f.message(w, 2, "schema", |w, m, path| {
        // SchemaItem: `type: file` is a FileSchema, anything else a Schema.
        if m.get("type").and_then(Value::as_str) == Some("file") {
            w.message(2, |w| schema::file_schema(w, m, path))
        } else {
            w.message(1, |w| schema(w, m, path))
        }
    })?;
    f.message(w, 3, "headers", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, parameters::header)
    })?;
    f.message(w, 4, "examples", |w, m, _| {
        for (name, value) in m {
            wire::named_any(w, 1, name, value);
        }
        Ok(())
    })?;
    f.vendor_extensions(w, 5);
    Ok(())
}

/// `SecurityRequirement`: `NamedStringArray`s.
fn security_requirement(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    for (name, value) in m {
        let path = child(path, name);
        let scopes = array(value, &path)?;
        w.message(1, |w| {
            w.string(1, name);
            w.message(2, |w| {
                for scope in scopes {
                    w.string_always(1, &wire::scalar_text(scope));
                }
                Ok(())
            })
        })?;
    }
    Ok(())
}

/// `SecurityDefinitionsItem`: the oneof is chosen by `type` (and `flow` for OAuth 2).
fn security_definitions_item(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    let text = |key: &str| m.get(key).and_then(Value::as_str).unwrap_or("");
    let scopes = |w: &mut Writer, m: &Map<String, Value>, _: &str| {
        for (name, value) in m {
            w.message(1, |w| {
                w.string(1, name);
                w.string(2, &wire::scalar_text(value));
                Ok(())
            })?;
        }
        Ok(())
    };
    match (text("type"), text("flow")) {
        ("basic", _) => w.message(1, |w| {
            f.string(w, 1, "type");
            f.string(w, 2, "description");
            f.vendor_extensions(w, 3);
            Ok(())
        }),
        ("apiKey", _) => w.message(2, |w| {
            f.string(w, 1, "type");
            f.string(w, 2, "name");
            f.string(w, 3, "in");
            f.string(w, 4, "description");
            f.vendor_extensions(w, 5);
            Ok(())
        }),
        ("oauth2", "implicit") => w.message(3, |w| {
            f.string(w, 1, "type");
            f.string(w, 2, "flow");
            f.message(w, 3, "scopes", scopes)?;
            f.string(w, 4, "authorizationUrl");
            f.string(w, 5, "description");
            f.vendor_extensions(w, 6);
            Ok(())
        }),
        ("oauth2", flow @ ("password" | "application")) => {
            w.message(if flow == "password" { 4 } else { 5 }, |w| {
                f.string(w, 1, "type");
                f.string(w, 2, "flow");
                f.message(w, 3, "scopes", scopes)?;
                f.string(w, 4, "tokenUrl");
                f.string(w, 5, "description");
                f.vendor_extensions(w, 6);
                Ok(())
            })
        }
        ("oauth2", "accessCode") => w.message(6, |w| {
            f.string(w, 1, "type");
            f.string(w, 2, "flow");
            f.message(w, 3, "scopes", scopes)?;
            f.string(w, 4, "authorizationUrl");
            f.string(w, 5, "tokenUrl");
            f.string(w, 6, "description");
            f.vendor_extensions(w, 7);
            Ok(())
        }),
        // gnostic leaves the oneof unset for a definition it cannot classify.
        _ => Ok(()),
    }
}

fn tag(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "name");
    f.string(w, 2, "description");
    f.message(w, 3, "externalDocs", external_docs)?;
    f.vendor_extensions(w, 4);
    Ok(())
}

#[cfg(test)]
mod tests;
