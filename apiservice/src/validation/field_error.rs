//! Rejected fields, printed as kube's `field.Error` and `utilerrors.Aggregate` print them.

use std::fmt;

/// Why a field is rejected; renders as kube's `field.ErrorType` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`: the field is missing or empty. The value is not shown.
    Required,
    /// `Invalid value: <value>`: the value is malformed or out of range.
    Invalid,
    /// `Forbidden`: the field may not be set here. The value is not shown.
    Forbidden,
    /// `Unsupported value: <value>`: not one of an enumerated set.
    NotSupported,
}

// === impl FieldErrorKind ===

impl FieldErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
        }
    }
}

/// The offending value, kept typed so it prints as kube prints it: strings quoted, numbers and
/// booleans bare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    /// No value is reported (Required and Forbidden errors).
    None,
    Str(String),
    Int(i64),
    Bool(bool),
}

// === impl FieldValue ===

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Str(s) => write_go_quoted(f, s),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One rejected field: `field: <kind>[: value][: message]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted field path as kube writes it, e.g. `spec.service.namespace`.
    pub field: String,
    pub kind: FieldErrorKind,
    pub value: FieldValue,
    /// Detail after the value; may be empty (e.g. a bare `Required value`).
    pub message: String,
}

// === impl FieldError ===

impl FieldError {
    pub(super) fn required(field: &str, message: &str) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Required,
            value: FieldValue::None,
            message: message.to_owned(),
        }
    }

    pub(super) fn forbidden(field: &str, message: &str) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Forbidden,
            value: FieldValue::None,
            message: message.to_owned(),
        }
    }

    pub(super) fn invalid(field: &str, value: FieldValue, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Invalid,
            value,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.kind.as_str())?;
        // kube never prints the value of Required/Forbidden errors.
        if !matches!(
            self.kind,
            FieldErrorKind::Required | FieldErrorKind::Forbidden
        ) && self.value != FieldValue::None
        {
            write!(f, ": {}", self.value)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Every rule an APIService broke, in the order kube-aggregator checks them.
///
/// `Display` matches kube's aggregate: one error prints alone, several print as
/// `[a, b]` with exact duplicates dropped. [`ValidationErrors::summary`] adds the object name for
/// logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_like_kube(.errors))]
pub struct ValidationErrors {
    /// `metadata.name` of the rejected APIService (may be empty when the name is missing).
    pub name: String,
    pub errors: Vec<FieldError>,
}

// === impl ValidationErrors ===

impl ValidationErrors {
    /// One line for logs and Status messages: `APIService "<name>" is invalid: <errors>`.
    pub fn summary(&self) -> String {
        format!("APIService {:?} is invalid: {}", self.name, self)
    }

    /// Whether some error concerns exactly this field path.
    pub fn has_field(&self, field: &str) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }
}

/// kube's `utilerrors.Aggregate` text: a single error alone, several as `[a, b]`, exact
/// duplicates dropped.
fn join_like_kube(errors: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::with_capacity(errors.len());
    for e in errors {
        let msg = e.to_string();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    match seen.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Displays a string the way Go's `%q` does for the characters that matter in API names:
/// double quotes, backslash escapes, `\x` for other control bytes.
pub(super) struct GoQuoted<'a>(pub(super) &'a str);

// === impl GoQuoted ===

impl fmt::Display for GoQuoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_go_quoted(f, self.0)
    }
}

fn write_go_quoted(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    use fmt::Write;
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\u{7}' => f.write_str("\\a")?,
            '\u{8}' => f.write_str("\\b")?,
            '\u{c}' => f.write_str("\\f")?,
            '\u{b}' => f.write_str("\\v")?,
            c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\x{:02x}", c as u32)?,
            c if c.is_control() => write!(f, "\\u{:04x}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}
