//! `Schema` (a JSON Schema as Swagger 2.0 restricts it), `FileSchema`, and the small messages
//! they carry: `ExternalDocs`, `Xml`.

use serde_json::{Map, Value};

use super::wire::{self, Fields, Writer};
use super::{array, child, object, EncodeError};

pub(crate) fn schema(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "$ref");
    f.string(w, 2, "format");
    f.string(w, 3, "title");
    f.string(w, 4, "description");
    f.any(w, 5, "default")?;
    f.double(w, 6, "multipleOf");
    f.double(w, 7, "maximum");
    f.bool(w, 8, "exclusiveMaximum");
    f.double(w, 9, "minimum");
    f.bool(w, 10, "exclusiveMinimum");
    f.int64(w, 11, "maxLength");
    f.int64(w, 12, "minLength");
    f.string(w, 13, "pattern");
    f.int64(w, 14, "maxItems");
    f.int64(w, 15, "minItems");
    f.bool(w, 16, "uniqueItems");
    f.int64(w, 17, "maxProperties");
    f.int64(w, 18, "minProperties");
    f.strings(w, 19, "required")?;
    f.anys(w, 20, "enum")?;
    if let Some(v) = m.get("additionalProperties") {
        // AdditionalPropertiesItem: a schema (field 1) or a boolean (field 2).
        match v {
            Value::Bool(b) => w.message(21, |w| {
                w.bool_always(2, *b);
                Ok(())
            })?,
            _ => {
                let path = child(path, "additionalProperties");
                let s = object(v, &path)?;
                w.message(21, |w| w.message(1, |w| schema(w, s, &path)))?;
            }
        }
    }
    if let Some(v) = m.get("type") {
        // TypeItem: one type name or several.
        w.message(22, |w| {
            match v {
                Value::Array(items) => {
                    for item in items {
                        w.string_always(1, &wire::scalar_text(item));
                    }
                }
                other => w.string_always(1, &wire::scalar_text(other)),
            }
            Ok(())
        })?;
    }
    if let Some(v) = m.get("items") {
        // ItemsItem: gnostic reads a single schema (a tuple's array is refused).
        let path = child(path, "items");
        let s = object(v, &path)?;
        w.message(23, |w| w.message(1, |w| schema(w, s, &path)))?;
    }
    if let Some(v) = m.get("allOf") {
        let path = child(path, "allOf");
        for (i, item) in array(v, &path)?.iter().enumerate() {
            let path = child(&path, &i.to_string());
            let s = object(item, &path)?;
            w.message(24, |w| schema(w, s, &path))?;
        }
    }
    f.message(w, 25, "properties", |w, m, path| {
        wire::named_each(w, 1, m, path, |_| true, schema)
    })?;
    f.string(w, 26, "discriminator");
    f.bool(w, 27, "readOnly");
    f.message(w, 28, "xml", |w, m, path| {
        let f = Fields::new(m, path);
        f.string(w, 1, "name");
        f.string(w, 2, "namespace");
        f.string(w, 3, "prefix");
        f.bool(w, 4, "attribute");
        f.bool(w, 5, "wrapped");
        f.vendor_extensions(w, 6);
        Ok(())
    })?;
    f.message(w, 29, "externalDocs", external_docs)?;
    f.any(w, 30, "example")?;
    f.vendor_extensions(w, 31);
    Ok(())
}

/// A response's `schema` with `type: file`.
pub(crate) fn file_schema(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "format");
    f.string(w, 2, "title");
    f.string(w, 3, "description");
    f.any(w, 4, "default")?;
    f.strings(w, 5, "required")?;
    f.string(w, 6, "type");
    f.bool(w, 7, "readOnly");
    f.message(w, 8, "externalDocs", external_docs)?;
    f.any(w, 9, "example")?;
    f.vendor_extensions(w, 10);
    Ok(())
}

pub(crate) fn external_docs(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    f.string(w, 1, "description");
    f.string(w, 2, "url");
    f.vendor_extensions(w, 3);
    Ok(())
}
