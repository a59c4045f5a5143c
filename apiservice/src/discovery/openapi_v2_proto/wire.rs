//! The protobuf wire format as Go's marshaller writes a proto3 message: fields in number order,
//! scalars only when not zero, nested messages length-prefixed with a minimal varint.

use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, WireType};
use serde_json::{Map, Value};

use super::{array, child, object, yaml, EncodeError};

/// The output buffer, and how long it may grow.
pub(crate) struct Writer {
    buf: Vec<u8>,
    limit: usize,
    /// Something was left out because it would have passed `limit`.
    over: bool,
}

impl Writer {
    pub(crate) fn within(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            limit,
            over: false,
        }
    }

    /// The message, or `None` if it passed the limit. Only the YAML of free-form values can
    /// grow faster than the document (see `yaml`): it is cut short as soon as it would pass,
    /// and after that none is written; everything else is linear in the spec and checked here.
    pub(crate) fn finish(self) -> Option<Bytes> {
        (!self.over && self.buf.len() <= self.limit).then(|| Bytes::from(self.buf))
    }

    /// A nested message in field `number`, whatever `body` writes (present even when empty, as
    /// a set message field is).
    pub(crate) fn message(
        &mut self,
        number: u32,
        body: impl FnOnce(&mut Writer) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        encode_key(number, WireType::LengthDelimited, &mut self.buf);
        let start = self.buf.len();
        body(self)?;
        // The length goes before the body; written after it so the body is walked once. The
        // move is a memmove per nesting level, far cheaper than sizing every message first.
        let len = self.buf.len() - start;
        let mut prefix = [0u8; 10];
        let mut slice = &mut prefix[..];
        encode_varint(len as u64, &mut slice);
        let written = 10 - slice.len();
        self.buf
            .splice(start..start, prefix[..written].iter().copied());
        Ok(())
    }

    /// A string field, left out when empty (proto3).
    pub(crate) fn string(&mut self, number: u32, value: &str) {
        if !value.is_empty() {
            self.string_always(number, value);
        }
    }

    /// A string, also when empty: an element of a repeated field.
    pub(crate) fn string_always(&mut self, number: u32, value: &str) {
        encode_key(number, WireType::LengthDelimited, &mut self.buf);
        encode_varint(value.len() as u64, &mut self.buf);
        self.buf.extend_from_slice(value.as_bytes());
    }

    fn varint(&mut self, number: u32, value: u64) {
        if value != 0 {
            encode_key(number, WireType::Varint, &mut self.buf);
            encode_varint(value, &mut self.buf);
        }
    }

    fn double(&mut self, number: u32, value: f64) {
        if value != 0.0 || value.is_sign_negative() {
            encode_key(number, WireType::SixtyFourBit, &mut self.buf);
            self.buf.extend_from_slice(&value.to_le_bytes());
        }
    }
}

/// The text of a scalar where gnostic wants a string: strings as they are, numbers and booleans
/// as written in JSON.
pub(crate) fn scalar_text(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(s) => s.as_str().into(),
        Value::Null => "".into(),
        other => other.to_string().into(),
    }
}

/// The fields of one JSON object, read by key into field numbers.
pub(crate) struct Fields<'a> {
    m: &'a Map<String, Value>,
    path: &'a str,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(m: &'a Map<String, Value>, path: &'a str) -> Self {
        Fields { m, path }
    }

    /// A string field from a scalar (objects and arrays, which gnostic refuses, are skipped).
    pub(crate) fn string(&self, w: &mut Writer, number: u32, key: &str) {
        if let Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) = self.m.get(key) {
            w.string(number, &scalar_text(v));
        }
    }

    pub(crate) fn strings(
        &self,
        w: &mut Writer,
        number: u32,
        key: &str,
    ) -> Result<(), EncodeError> {
        if let Some(v) = self.m.get(key) {
            for item in array(v, &child(self.path, key))? {
                w.string_always(number, &scalar_text(item));
            }
        }
        Ok(())
    }

    pub(crate) fn bool(&self, w: &mut Writer, number: u32, key: &str) {
        if let Some(true) = self.m.get(key).and_then(Value::as_bool) {
            w.varint(number, 1);
        }
    }

    /// An int64: gnostic takes YAML integers only (`5.0` is a float and is left out).
    pub(crate) fn int64(&self, w: &mut Writer, number: u32, key: &str) {
        if let Some(v) = self.m.get(key).and_then(Value::as_i64) {
            w.varint(number, v as u64);
        }
    }

    /// A double: integers and floats.
    pub(crate) fn double(&self, w: &mut Writer, number: u32, key: &str) {
        if let Some(v) = self.m.get(key).and_then(Value::as_f64) {
            w.double(number, v);
        }
    }

    /// `Any { yaml }` of whatever value `key` holds.
    pub(crate) fn any(&self, w: &mut Writer, number: u32, key: &str) -> Result<(), EncodeError> {
        match self.m.get(key) {
            Some(v) => w.message(number, |w| {
                any(w, v);
                Ok(())
            }),
            None => Ok(()),
        }
    }

    /// One `Any` per element of the array at `key` (`enum`).
    pub(crate) fn anys(&self, w: &mut Writer, number: u32, key: &str) -> Result<(), EncodeError> {
        if let Some(v) = self.m.get(key) {
            for item in array(v, &child(self.path, key))? {
                w.message(number, |w| {
                    any(w, item);
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// The object at `key` as a nested message written by `body`.
    pub(crate) fn message(
        &self,
        w: &mut Writer,
        number: u32,
        key: &str,
        body: impl FnOnce(&mut Writer, &Map<String, Value>, &str) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        let Some(v) = self.m.get(key) else {
            return Ok(());
        };
        let path = child(self.path, key);
        let m = object(v, &path)?;
        w.message(number, |w| body(w, m, &path))
    }

    /// Each object of the array at `key` as a message written by `body`.
    pub(crate) fn repeated_messages(
        &self,
        w: &mut Writer,
        number: u32,
        key: &str,
        body: impl Fn(&mut Writer, &Map<String, Value>, &str) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        let Some(v) = self.m.get(key) else {
            return Ok(());
        };
        let path = child(self.path, key);
        for (i, item) in array(v, &path)?.iter().enumerate() {
            let path = child(&path, &i.to_string());
            let m = object(item, &path)?;
            w.message(number, |w| body(w, m, &path))?;
        }
        Ok(())
    }

    /// The `x-*` keys as `NamedAny`s, in field `number`.
    pub(crate) fn vendor_extensions(&self, w: &mut Writer, number: u32) {
        for (name, value) in self.m {
            if name.starts_with("x-") {
                named_any(w, number, name, value);
            }
        }
    }
}

/// `Any { yaml: <value as yaml.v3 prints it> }` (field 1, a `google.protobuf.Any`, stays unset).
fn any(w: &mut Writer, value: &Value) {
    if w.over {
        return;
    }
    match yaml::to_yaml_within(value, w.limit.saturating_sub(w.buf.len())) {
        Some(text) => w.string(2, &text),
        None => w.over = true,
    }
}

/// A `NamedAny { name, value: Any }` in field `number`.
pub(crate) fn named_any(w: &mut Writer, number: u32, name: &str, value: &Value) {
    // Infallible: the body returns Ok.
    let _ = w.message(number, |w| {
        w.string(1, name);
        w.message(2, |w| {
            any(w, value);
            Ok(())
        })
    });
}

/// One `Named* { name, value }` pair in field `number` for each key of `m` that `select` keeps,
/// the value (an object) written by `body`.
pub(crate) fn named_each(
    w: &mut Writer,
    number: u32,
    m: &Map<String, Value>,
    path: &str,
    select: impl Fn(&str) -> bool,
    body: impl Fn(&mut Writer, &Map<String, Value>, &str) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    for (name, value) in m {
        if !select(name) {
            continue;
        }
        let path = child(path, name);
        let value = object(value, &path)?;
        w.message(number, |w| {
            w.string(1, name);
            w.message(2, |w| body(w, value, &path))
        })?;
    }
    Ok(())
}

impl Writer {
    /// A bool that is set even when false: a oneof member.
    pub(crate) fn bool_always(&mut self, number: u32, value: bool) {
        encode_key(number, WireType::Varint, &mut self.buf);
        encode_varint(u64::from(value), &mut self.buf);
    }
}
