//! Parameters (body, and the four non-body kinds), `PrimitivesItems`, and response `Header`s.
//!
//! The non-body kinds and `PrimitivesItems`/`Header` share one run of fields (`type` …
//! `multipleOf`); only the field number it starts at differs, so [`primitive`] writes it for all.

use serde_json::{Map, Value};

use super::schema::schema;
use super::wire::{Fields, Writer};
use super::{json_reference, EncodeError};

/// `ParametersItem`: a `$ref` is a `JsonReference` (field 2), anything else a `Parameter` (1).
pub(crate) fn parameters_item(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    if m.contains_key("$ref") {
        w.message(2, |w| json_reference(w, m, path))
    } else {
        w.message(1, |w| parameter(w, m, path))
    }
}

/// `Parameter`: `in: body` is a `BodyParameter` (field 1); the rest a `NonBodyParameter` (2)
/// whose oneof is chosen by `in`, as gnostic's `in` enum checks choose it.
pub(crate) fn parameter(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    let kind = match m.get("in").and_then(Value::as_str) {
        Some("body") => {
            return w.message(1, |w| {
                f.string(w, 1, "description");
                f.string(w, 2, "name");
                f.string(w, 3, "in");
                f.bool(w, 4, "required");
                f.message(w, 5, "schema", schema)?;
                f.vendor_extensions(w, 6);
                Ok(())
            });
        }
        Some("header") => 1,
        Some("formData") => 2,
        Some("query") => 3,
        Some("path") => 4,
        // gnostic matches no kind and leaves the oneof unset.
        _ => return Ok(()),
    };
    w.message(2, |w| {
        w.message(kind, |w| {
            f.bool(w, 1, "required");
            f.string(w, 2, "in");
            f.string(w, 3, "description");
            f.string(w, 4, "name");
            // formData and query parameters have `allowEmptyValue` before the shared run.
            let first = if kind == 2 || kind == 3 {
                f.bool(w, 5, "allowEmptyValue");
                6
            } else {
                5
            };
            primitive(w, &f, first)?;
            f.vendor_extensions(w, first + 17);
            Ok(())
        })
    })
}

/// `type`, `format`, `items`, `collectionFormat`, `default`, the bounds, `enum`, `multipleOf`:
/// seventeen fields numbered from `first`.
fn primitive(w: &mut Writer, f: &Fields<'_>, first: u32) -> Result<(), EncodeError> {
    f.string(w, first, "type");
    f.string(w, first + 1, "format");
    f.message(w, first + 2, "items", primitives_items)?;
    f.string(w, first + 3, "collectionFormat");
    f.any(w, first + 4, "default")?;
    f.double(w, first + 5, "maximum");
    f.bool(w, first + 6, "exclusiveMaximum");
    f.double(w, first + 7, "minimum");
    f.bool(w, first + 8, "exclusiveMinimum");
    f.int64(w, first + 9, "maxLength");
    f.int64(w, first + 10, "minLength");
    f.string(w, first + 11, "pattern");
    f.int64(w, first + 12, "maxItems");
    f.int64(w, first + 13, "minItems");
    f.bool(w, first + 14, "uniqueItems");
    f.anys(w, first + 15, "enum")?;
    f.double(w, first + 16, "multipleOf");
    Ok(())
}

fn primitives_items(w: &mut Writer, m: &Map<String, Value>, path: &str) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    primitive(w, &f, 1)?;
    f.vendor_extensions(w, 18);
    Ok(())
}

/// A response header: the shared run, then `description` (18) and extensions (19).
pub(crate) fn header(
    w: &mut Writer,
    m: &Map<String, Value>,
    path: &str,
) -> Result<(), EncodeError> {
    let f = Fields::new(m, path);
    primitive(w, &f, 1)?;
    f.string(w, 18, "description");
    f.vendor_extensions(w, 19);
    Ok(())
}
