//! A JSON value as YAML text, the way gnostic's `compiler.Marshal` prints it: yaml.v3's emitter
//! with every node's style cleared, so block collections indented by four, plain scalars where
//! they read back as the same string, `"…"` where a plain scalar would read as a number, bool or
//! null, `'…'` where a plain one cannot be written, a literal block for multi-line strings, and
//! no line wrapping.
//!
//! kubectl parses the text back, so what must hold is that it reads as the same value; the
//! emitter's layout rules (libyaml's indentation, yaml.v3's resolver) are followed so the text is
//! byte-equal in the common cases too. Known differences, both only in the text: a JSON number is
//! printed from its parsed value (`1.0e3` → `1000.0`) where gnostic keeps the source text, and an
//! object's keys come in the `serde_json::Map`'s sorted order where gnostic keeps the JSON's (in
//! kube-apiserver 1.33's spec only `x-kubernetes-group-version-kind` of `apiregistration.k8s.io`,
//! written `group, version, kind`, differs this way).

use serde_json::Value;

/// `value` as yaml.v3 marshals it (always ending in a newline).
pub fn to_yaml(value: &Value) -> String {
    to_yaml_within(value, usize::MAX).unwrap_or_default()
}

/// [`to_yaml`], or `None` as soon as the text passes `limit` bytes. The text can be far longer
/// than the JSON: every line is indented by its depth, so a value nested a hundred levels deep
/// prints each of its leaves behind hundreds of spaces.
///
/// The emitter recurses once per nesting level of `value`, which is bounded by the JSON parser
/// that built it (serde_json refuses documents nested deeper than 128 levels).
pub fn to_yaml_within(value: &Value, limit: usize) -> Option<String> {
    let mut e = Emitter {
        out: String::new(),
        limit,
        column: 0,
        whitespace: true,
        indention: true,
    };
    e.node(value, -1, Context::Root);
    // The document end: a line break unless a block scalar's last break already ended the line.
    e.write_indent(0);
    (e.out.len() <= limit).then_some(e.out)
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Root,
    MappingValue,
    SequenceItem,
    Key,
}

/// libyaml's emitter state, as much of it as layout depends on.
struct Emitter {
    out: String,
    /// Past this length the rest is not written (see [`to_yaml_within`]).
    limit: usize,
    column: i32,
    /// The last character written was whitespace (or nothing was written on this line).
    whitespace: bool,
    /// Only indentation and indicators (`- `) on this line so far.
    indention: bool,
}

const INDENT: i32 = 4;

impl Emitter {
    fn write(&mut self, s: &str) {
        self.out.push_str(s);
        self.column += s.chars().count() as i32;
    }

    fn newline(&mut self) {
        self.out.push('\n');
        self.column = 0;
        self.whitespace = true;
        self.indention = true;
    }

    /// libyaml's `write_indent`: a new line unless already at `indent` after indicators only.
    fn write_indent(&mut self, indent: i32) {
        let indent = indent.max(0);
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.newline();
        }
        while self.column < indent {
            self.out.push(' ');
            self.column += 1;
        }
        self.whitespace = true;
        self.indention = true;
    }

    fn indicator(&mut self, text: &str, need_whitespace: bool, is_indention: bool) {
        if need_whitespace && !self.whitespace {
            self.write(" ");
        }
        self.write(text);
        self.whitespace = false;
        self.indention = self.indention && is_indention;
    }

    /// The indentation of a block collection opened at `parent` in `context` (yaml.v3's
    /// `increase_indent`: a collection in a sequence item skips the `- `, anything else aligns
    /// to the next multiple of four).
    fn child_indent(parent: i32, context: Context) -> i32 {
        if parent < 0 {
            0
        } else if context == Context::SequenceItem {
            parent + 2
        } else {
            INDENT * ((parent + INDENT) / INDENT)
        }
    }

    fn full(&self) -> bool {
        self.out.len() > self.limit
    }

    fn node(&mut self, value: &Value, indent: i32, context: Context) {
        if self.full() {
            return;
        }
        match value {
            Value::Object(m) if m.is_empty() => self.flow_empty("{}"),
            Value::Array(a) if a.is_empty() => self.flow_empty("[]"),
            Value::Object(m) => {
                let indent = Self::child_indent(indent, context);
                for (key, value) in m {
                    if self.full() {
                        return;
                    }
                    self.write_indent(indent);
                    self.string(key, indent, Context::Key);
                    self.indicator(":", false, false);
                    self.node(value, indent, Context::MappingValue);
                }
            }
            Value::Array(a) => {
                let indent = Self::child_indent(indent, context);
                for item in a {
                    if self.full() {
                        return;
                    }
                    self.write_indent(indent);
                    self.indicator("-", true, true);
                    self.node(item, indent, Context::SequenceItem);
                }
            }
            Value::Null => self.plain("null"),
            Value::Bool(b) => self.plain(if *b { "true" } else { "false" }),
            Value::Number(n) => self.plain(&n.to_string()),
            Value::String(s) => self.string(s, indent, context),
        }
    }

    fn flow_empty(&mut self, text: &str) {
        self.indicator(text, true, false);
    }

    fn plain(&mut self, text: &str) {
        if !self.whitespace {
            self.write(" ");
        }
        self.write(text);
        self.whitespace = false;
        self.indention = false;
    }

    fn string(&mut self, s: &str, indent: i32, context: Context) {
        let a = analyze(s);
        let key = context == Context::Key;
        let style = if resolves_to_non_string(s) {
            Style::Double
        } else if s.contains('\n') {
            if a.block_allowed && !key {
                Style::Literal
            } else {
                Style::Double
            }
        } else if a.block_plain_allowed && !(key && a.multiline) {
            Style::Plain
        } else if a.single_quoted_allowed {
            Style::Single
        } else {
            Style::Double
        };
        match style {
            Style::Plain => self.plain(s),
            Style::Single => {
                self.indicator("'", true, false);
                self.write(&s.replace('\'', "''"));
                self.indicator("'", false, false);
            }
            Style::Double => {
                self.indicator("\"", true, false);
                self.write(&escape_double(s));
                self.indicator("\"", false, false);
            }
            Style::Literal => self.literal(s, indent),
        }
    }

    fn literal(&mut self, s: &str, indent: i32) {
        let mut hints = String::from("|");
        if s.starts_with([' ', '\n']) {
            hints.push_str(&INDENT.to_string());
        }
        if !s.ends_with('\n') {
            hints.push('-');
        } else if s.len() == 1 || s[..s.len() - 1].ends_with('\n') {
            hints.push('+');
        }
        self.indicator(&hints, true, false);
        let indent = if indent < 0 {
            INDENT
        } else {
            INDENT * ((indent + INDENT) / INDENT)
        };
        self.newline();
        let mut breaks = true;
        for c in s.chars() {
            if self.full() {
                return;
            }
            if c == '\n' {
                self.newline();
                breaks = true;
            } else {
                if breaks {
                    self.write_indent(indent);
                }
                let mut buf = [0u8; 4];
                self.write(c.encode_utf8(&mut buf));
                self.whitespace = false;
                self.indention = false;
                breaks = false;
            }
        }
    }
}

enum Style {
    Plain,
    Single,
    Double,
    Literal,
}

struct Analysis {
    multiline: bool,
    block_plain_allowed: bool,
    single_quoted_allowed: bool,
    block_allowed: bool,
}

fn is_printable(c: char) -> bool {
    matches!(c, '\n' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && c != '\u{FEFF}'
}

/// libyaml's `analyze_scalar`, for the block context.
fn analyze(s: &str) -> Analysis {
    if s.is_empty() {
        return Analysis {
            multiline: false,
            block_plain_allowed: true,
            single_quoted_allowed: true,
            block_allowed: false,
        };
    }
    let mut block_indicators = s.starts_with("---") || s.starts_with("...");
    let mut special = false;
    let mut line_breaks = false;
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let chars: Vec<char> = s.chars().collect();
    let mut preceded_by_whitespace = true;
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        let followed_by_whitespace = matches!(next, None | Some(' ' | '\t' | '\n' | '\r'));
        if i == 0 {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => block_indicators = true,
                '?' | ':' | '-' if followed_by_whitespace => block_indicators = true,
                _ => {}
            }
        } else {
            match c {
                ':' if followed_by_whitespace => block_indicators = true,
                '#' if preceded_by_whitespace => block_indicators = true,
                _ => {}
            }
        }
        if !is_printable(c) || c == '\u{FEFF}' {
            special = true;
        }
        if c == '\n' || c == '\r' {
            line_breaks = true;
        }
        if c == ' ' {
            if i == 0 {
                leading_space = true;
            }
            if i + 1 == chars.len() {
                trailing_space = true;
            }
            if previous_break {
                break_space = true;
            }
            previous_space = true;
            previous_break = false;
        } else if c == '\n' || c == '\r' {
            if i == 0 {
                leading_break = true;
            }
            if i + 1 == chars.len() {
                trailing_break = true;
            }
            if previous_space {
                space_break = true;
            }
            previous_space = false;
            previous_break = true;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = matches!(c, ' ' | '\t' | '\n' | '\r');
    }
    let mut a = Analysis {
        multiline: line_breaks,
        block_plain_allowed: true,
        single_quoted_allowed: true,
        block_allowed: true,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        a.block_plain_allowed = false;
    }
    if trailing_space {
        a.block_allowed = false;
    }
    if break_space {
        a.block_plain_allowed = false;
        a.single_quoted_allowed = false;
    }
    if space_break || special {
        a.block_plain_allowed = false;
        a.single_quoted_allowed = false;
        a.block_allowed = false;
    }
    if line_breaks {
        a.block_plain_allowed = false;
    }
    if block_indicators {
        a.block_plain_allowed = false;
    }
    a
}

/// Whether yaml.v3's resolver reads the plain scalar `s` as something other than a string (null,
/// bool, int, float, timestamp, merge key): such a string is written double-quoted.
fn resolves_to_non_string(s: &str) -> bool {
    match s {
        "" | "~" | "null" | "Null" | "NULL" | "true" | "True" | "TRUE" | "false" | "False"
        | "FALSE" | ".nan" | ".NaN" | ".NAN" | ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf"
        | "+.INF" | "-.inf" | "-.Inf" | "-.INF" | "<<" => return true,
        _ => {}
    }
    let first = s.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.')) {
        return false;
    }
    let plain: String = s.chars().filter(|&c| c != '_').collect();
    is_go_int(&plain) || is_yaml_float(&plain) || (first.is_ascii_digit() && is_timestamp(s))
}

/// `strconv.ParseInt(s, 0, 64)` or `ParseUint` accepting the text (ignoring overflow, which the
/// float pattern then catches).
fn is_go_int(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (body, radix) = match digits.get(..2) {
        Some("0x" | "0X") => (&digits[2..], 16),
        Some("0o" | "0O") => (&digits[2..], 8),
        Some("0b" | "0B") => (&digits[2..], 2),
        _ if digits.len() > 1 && digits.starts_with('0') => (&digits[1..], 8),
        _ => (digits, 10),
    };
    !body.is_empty() && body.chars().all(|c| c.is_digit(radix))
}

/// yaml.v3's float pattern `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// yaml.v3's timestamp shapes: `YYYY-M-D` optionally followed by a time.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 8 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let rest = &s[5..];
    let date_end = rest.find(['T', 't', ' ']).unwrap_or(rest.len());
    let date = &rest[..date_end];
    let mut parts = date.split('-');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| (1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The inside of a double-quoted scalar, with libyaml's escapes.
fn escape_double(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\\0"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{B}' => out.push_str("\\v"),
            '\u{C}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\u{1B}' => out.push_str("\\e"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{85}' => out.push_str("\\N"),
            '\u{A0}' => out.push_str("\\_"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if !is_printable(c) || c == '\u{FEFF}' => {
                let n = c as u32;
                if n <= 0xFF {
                    out.push_str(&format!("\\x{n:02X}"));
                } else if n <= 0xFFFF {
                    out.push_str(&format!("\\u{n:04X}"));
                } else {
                    out.push_str(&format!("\\U{n:08X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}
