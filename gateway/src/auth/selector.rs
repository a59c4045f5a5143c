//! Label and field selectors as authorization attributes (KEP-4601, `AuthorizeWithSelectors`,
//! on by default since Kubernetes 1.32 and GA in 1.34).
//!
//! kube-apiserver's authorization filter parses a list's, watch's or deletecollection's
//! `labelSelector` and `fieldSelector` with the same parsers its storage will use
//! (apimachinery's `labels.Parse` and `fields.ParseSelector`), and its webhook authorizer
//! (`k8s.io/apiserver/plugin/pkg/authorizer/webhook/webhook.go`, `resourceAttributesFrom`) puts
//! the parsed requirements, never the raw string, in the SubjectAccessReview. A selector it
//! cannot parse adds nothing, so the review asks about the whole collection: a selector can only
//! narrow what is asked, so dropping it is the stricter question, and the backend then refuses
//! the request itself. Requirements the review cannot express (`>`, `<`) are left out for the
//! same reason.
//!
//! The webhook would see a question different from the one the backend answers if these
//! parsers read a selector differently from Go's; they follow apimachinery's grammar byte for
//! byte, quirks included (a NUL byte ends a token; `in`/`notin` are keywords only where an
//! operator is expected; terms of a field selector are sorted as strings). Requirements of a
//! label selector are ordered by key as Go's sort orders them; Go's sort is not stable for more
//! than twelve requirements, where requirements with the same key may come in another order
//! here: their meaning (all must hold) is the same.

use apiservice::validation::dns1123_subdomain_errors;
use k8s_openapi::api::authorization::v1::{FieldSelectorAttributes, LabelSelectorAttributes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldSelectorRequirement, LabelSelectorRequirement,
};

/// The raw selectors of a request, as kube's `RequestInfo` keeps them (empty: not given, or the
/// verb takes none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selectors<'a> {
    pub label: &'a str,
    pub field: &'a str,
}

impl Selectors<'_> {
    pub const NONE: Selectors<'static> = Selectors {
        label: "",
        field: "",
    };
}

// === field selectors ===

/// A field selector's requirement as `fields.ParseSelector` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    /// `=`/`==` (true) or `!=` (false).
    pub equals: bool,
    pub value: String,
}

/// `fields.ParseSelector`: comma-separated terms (a backslash escapes the next character, so
/// `\,` does not split), sorted as strings, each `field=value`, `field==value` or
/// `field!=value` split at the first operator; the value is unescaped (`\\`, `\,`, `\=`) and
/// may hold no bare `,` or `=`. An empty term, and a term with neither field nor value, adds
/// nothing.
pub fn parse_field_selector(selector: &str) -> Result<Vec<FieldRequirement>, String> {
    let mut terms = split_field_terms(selector);
    terms.sort_unstable();
    let mut out = Vec::with_capacity(terms.len());
    for term in terms.into_iter().filter(|t| !t.is_empty()) {
        let Some((field, op, raw)) = split_field_term(term) else {
            return Err(format!(
                "invalid field selector {selector:?}: {term:?} has no operator (=, == or !=)"
            ));
        };
        let value = unescape_field_value(raw)
            .map_err(|why| format!("invalid field selector {selector:?}: {why}"))?;
        if field.is_empty() && value.is_empty() {
            continue;
        }
        out.push(FieldRequirement {
            field: field.to_owned(),
            equals: op != "!=",
            value,
        });
    }
    Ok(out)
}

fn split_field_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, b) in selector.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b',' => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// The first position where an operator starts; `!=` and `==` are tried before `=` so that
/// `a==b` is not the field `a` equal to `=b`.
fn split_field_term(term: &str) -> Option<(&str, &'static str, &str)> {
    (0..term.len()).find_map(|i| {
        let rest = term.get(i..)?;
        ["!=", "==", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .map(|op| (&term[..i], op, &rest[op.len()..]))
    })
}

fn unescape_field_value(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        match c {
            '\\' | ',' | '=' if escaped => {
                out.push(c);
                escaped = false;
            }
            _ if escaped => return Err(format!("invalid escape sequence \\{c} in {raw:?}")),
            '\\' => escaped = true,
            ',' | '=' => {
                return Err(format!(
                    "{c:?} in the value {raw:?} must be escaped with a backslash"
                ))
            }
            _ => out.push(c),
        }
    }
    if escaped {
        return Err(format!("the value {raw:?} ends in a lone backslash"));
    }
    Ok(out)
}

// === label selectors ===

/// A label selector's operator (apimachinery's `selection.Operator` as `labels.Parse` makes
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOp {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// A label selector's requirement; `values` sorted and without duplicates, as Go's string set
/// lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    End,
    Identifier,
    OpenPar,
    ClosePar,
    Comma,
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    In,
    NotIn,
}

/// apimachinery's label lexer: whitespace separates, `=!(),<>` are operators (the longest of
/// `!=`, `==` or one character), anything else runs to the next operator or whitespace and is
/// an identifier unless it is `in` or `notin`. A NUL byte reads as the end of the input where a
/// token would start and is swallowed where it ends one (Go's lexer uses 0 for both).
fn lex(selector: &str) -> Vec<(Tok, &str)> {
    let bytes = selector.as_bytes();
    let special = |b: u8| matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<');
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        while bytes.get(pos).copied().is_some_and(space) {
            pos += 1;
        }
        let Some(&first) = bytes.get(pos).filter(|b| **b != 0) else {
            out.push((Tok::End, ""));
            return out;
        };
        if special(first) {
            let two = bytes.get(pos..pos + 2);
            let (tok, len) = match (first, two) {
                (_, Some(b"!=")) => (Tok::NotEquals, 2),
                (_, Some(b"==")) => (Tok::DoubleEquals, 2),
                (b'=', _) => (Tok::Equals, 1),
                (b'!', _) => (Tok::Not, 1),
                (b'(', _) => (Tok::OpenPar, 1),
                (b')', _) => (Tok::ClosePar, 1),
                (b',', _) => (Tok::Comma, 1),
                (b'>', _) => (Tok::Greater, 1),
                _ => (Tok::Less, 1),
            };
            out.push((tok, &selector[pos..pos + len]));
            pos += len;
            continue;
        }
        let start = pos;
        while bytes
            .get(pos)
            .copied()
            .is_some_and(|b| b != 0 && !special(b) && !space(b))
        {
            pos += 1;
        }
        let word = &selector[start..pos];
        if bytes.get(pos) == Some(&0) {
            pos += 1;
        }
        out.push(match word {
            "in" => (Tok::In, word),
            "notin" => (Tok::NotIn, word),
            _ => (Tok::Identifier, word),
        });
    }
}

/// A recursive-descent reader over the tokens. `in` and `notin` are keywords only where an
/// operator may stand; everywhere else they are identifiers (`in in (notin)` is valid).
struct LabelParser<'a> {
    tokens: Vec<(Tok, &'a str)>,
    at: usize,
}

impl<'a> LabelParser<'a> {
    fn token(&self, as_value: bool) -> (Tok, &'a str) {
        // The lexer always ends with `End`; reading past it keeps answering `End`.
        let (tok, lit) = self.tokens.get(self.at).copied().unwrap_or((Tok::End, ""));
        match tok {
            Tok::In | Tok::NotIn if as_value => (Tok::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn peek(&self) -> (Tok, &'a str) {
        self.token(true)
    }

    fn next(&mut self, as_value: bool) -> (Tok, &'a str) {
        let t = self.token(as_value);
        self.at += 1;
        t
    }

    fn selector(&mut self) -> Result<Vec<LabelRequirement>, String> {
        let mut out = Vec::new();
        loop {
            match self.peek() {
                (Tok::Identifier | Tok::Not, _) => {
                    out.push(self.requirement()?);
                    match self.next(true) {
                        (Tok::End, _) => return Ok(out),
                        (Tok::Comma, _) => {
                            let (tok, lit) = self.peek();
                            if !matches!(tok, Tok::Identifier | Tok::Not) {
                                return Err(format!("found {lit:?} after ',', expected a key"));
                            }
                        }
                        (_, lit) => return Err(format!("found {lit:?}, expected ',' or the end")),
                    }
                }
                (Tok::End, _) => return Ok(out),
                (_, lit) => return Err(format!("found {lit:?}, expected '!', a key or the end")),
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, String> {
        let (mut tok, mut key) = self.next(true);
        let negated = tok == Tok::Not;
        if negated {
            (tok, key) = self.next(true);
        }
        if tok != Tok::Identifier {
            return Err(format!("found {key:?}, expected a key"));
        }
        qualified_name(key)?;
        let bare = matches!(self.peek().0, Tok::End | Tok::Comma);
        if negated || bare {
            let op = if negated {
                LabelOp::DoesNotExist
            } else {
                LabelOp::Exists
            };
            return Ok(LabelRequirement {
                key: key.to_owned(),
                op,
                values: Vec::new(),
            });
        }
        let op = match self.next(false) {
            (Tok::In, _) => LabelOp::In,
            (Tok::NotIn, _) => LabelOp::NotIn,
            (Tok::Equals, _) => LabelOp::Equals,
            (Tok::DoubleEquals, _) => LabelOp::DoubleEquals,
            (Tok::NotEquals, _) => LabelOp::NotEquals,
            (Tok::Greater, _) => LabelOp::GreaterThan,
            (Tok::Less, _) => LabelOp::LessThan,
            (_, lit) => {
                return Err(format!(
                "found {lit:?} after the key {key:?}, expected one of in, notin, =, ==, !=, >, <"
            ))
            }
        };
        let mut values = match op {
            LabelOp::In | LabelOp::NotIn => self.value_set()?,
            _ => vec![self.exact_value()?],
        };
        values.sort_unstable();
        values.dedup();
        if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan)
            && values.iter().any(|v| v.parse::<i64>().is_err())
        {
            return Err(format!(
                "the value of {key:?} after > or < must be an integer"
            ));
        }
        for v in &values {
            label_value(v).map_err(|why| format!("invalid value {v:?} of {key:?}: {why}"))?;
        }
        Ok(LabelRequirement {
            key: key.to_owned(),
            op,
            values,
        })
    }

    /// `( values )`: values separated by commas, any of them empty; `()` is the one empty value.
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.next(true);
        if tok != Tok::OpenPar {
            return Err(format!("found {lit:?}, expected '('"));
        }
        let mut values: Vec<String> = Vec::new();
        match self.peek() {
            (Tok::ClosePar, _) => {
                self.at += 1;
                return Ok(vec![String::new()]);
            }
            (Tok::Identifier | Tok::Comma, _) => {}
            (_, lit) => return Err(format!("found {lit:?}, expected ',', ')' or a value")),
        }
        loop {
            match self.next(true) {
                (Tok::Identifier, lit) => {
                    values.push(lit.to_owned());
                    match self.peek() {
                        (Tok::Comma, _) => {}
                        (Tok::ClosePar, _) => break,
                        (_, lit) => return Err(format!("found {lit:?}, expected ',' or ')'")),
                    }
                }
                (Tok::Comma, _) => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    match self.peek().0 {
                        Tok::ClosePar => {
                            values.push(String::new());
                            break;
                        }
                        Tok::Comma => {
                            self.at += 1;
                            values.push(String::new());
                        }
                        _ => {}
                    }
                }
                (_, lit) => return Err(format!("found {lit:?}, expected ',' or a value")),
            }
        }
        match self.next(true) {
            (Tok::ClosePar, _) => Ok(values),
            (_, lit) => Err(format!("found {lit:?}, expected ')'")),
        }
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing before `,` or the end is the empty
    /// value.
    fn exact_value(&mut self) -> Result<String, String> {
        if matches!(self.peek().0, Tok::End | Tok::Comma) {
            return Ok(String::new());
        }
        match self.next(true) {
            (Tok::Identifier, lit) => Ok(lit.to_owned()),
            (_, lit) => Err(format!("found {lit:?}, expected a value")),
        }
    }
}

/// `labels.Parse`: the requirements ordered by key.
pub fn parse_label_selector(selector: &str) -> Result<Vec<LabelRequirement>, String> {
    let mut parser = LabelParser {
        tokens: lex(selector),
        at: 0,
    };
    let mut out = parser
        .selector()
        .map_err(|why| format!("invalid label selector {selector:?}: {why}"))?;
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// At most 63 characters, alphanumeric at both ends, `-`, `_` and `.` inside (apimachinery's
/// qualified-name part and label value).
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(inner)
}

/// apimachinery's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) if !n.contains('/') => (Some(p), n),
        Some(_) => return Err(format!("the key {key:?} has more than one '/'")),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() || !dns1123_subdomain_errors(p).is_empty() {
            return Err(format!(
                "the prefix of the key {key:?} must be a DNS-1123 subdomain"
            ));
        }
    }
    if !name_part(name) {
        return Err(format!(
            "the key {key:?} must be at most 63 characters, alphanumeric at both ends, with \
             '-', '_' or '.' between"
        ));
    }
    Ok(())
}

fn label_value(v: &str) -> Result<(), &'static str> {
    if v.is_empty() || name_part(v) {
        Ok(())
    } else {
        Err("a label value is empty or at most 63 characters, alphanumeric at both ends, with '-', '_' or '.' between")
    }
}

// === as the webhook authorizer sends them ===

/// `spec.resourceAttributes.fieldSelector` for `selector`: equality as `In`, inequality as
/// `NotIn`, each with its one value; `None` when there is no selector or it does not parse.
pub fn field_attributes(selector: &str) -> Option<FieldSelectorAttributes> {
    if selector.is_empty() {
        return None;
    }
    let requirements: Vec<_> = parse_field_selector(selector)
        .ok()?
        .into_iter()
        .map(|r| FieldSelectorRequirement {
            key: r.field,
            operator: if r.equals { "In" } else { "NotIn" }.to_owned(),
            values: Some(vec![r.value]),
        })
        .collect();
    (!requirements.is_empty()).then_some(FieldSelectorAttributes {
        raw_selector: None,
        requirements: Some(requirements),
    })
}

/// `spec.resourceAttributes.labelSelector` for `selector`: `=`, `==` and `in` as `In`, `!=` and
/// `notin` as `NotIn`, `Exists`, `DoesNotExist`; `>` and `<` left out; `None` when nothing is
/// left or the selector does not parse.
pub fn label_attributes(selector: &str) -> Option<LabelSelectorAttributes> {
    if selector.is_empty() {
        return None;
    }
    let requirements: Vec<_> = parse_label_selector(selector)
        .ok()?
        .into_iter()
        .filter_map(|r| {
            let operator = match r.op {
                LabelOp::In | LabelOp::Equals | LabelOp::DoubleEquals => "In",
                LabelOp::NotIn | LabelOp::NotEquals => "NotIn",
                LabelOp::Exists => "Exists",
                LabelOp::DoesNotExist => "DoesNotExist",
                LabelOp::GreaterThan | LabelOp::LessThan => return None,
            };
            Some(LabelSelectorRequirement {
                key: r.key,
                operator: operator.to_owned(),
                values: (!r.values.is_empty()).then_some(r.values),
            })
        })
        .collect();
    (!requirements.is_empty()).then_some(LabelSelectorAttributes {
        raw_selector: None,
        requirements: Some(requirements),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn labels(s: &str) -> Value {
        serde_json::to_value(label_attributes(s)).unwrap()
    }

    fn fields(s: &str) -> Value {
        serde_json::to_value(field_attributes(s)).unwrap()
    }

    #[test]
    fn label_requirements_are_sent_as_the_webhook_authorizer_sends_them() {
        assert_eq!(
            labels("tier in (web, db,web),!legacy , app=x,env!=prod,team,z notin (b,a)"),
            json!({"requirements": [
                {"key": "app", "operator": "In", "values": ["x"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "team", "operator": "Exists"},
                {"key": "tier", "operator": "In", "values": ["db", "web"]},
                {"key": "z", "operator": "NotIn", "values": ["a", "b"]},
            ]})
        );
        // `==`, empty values, keywords as keys and values, a prefixed key.
        assert_eq!(
            labels("example.com/in==,in in (notin,),x in ()"),
            json!({"requirements": [
                {"key": "example.com/in", "operator": "In", "values": [""]},
                {"key": "in", "operator": "In", "values": ["", "notin"]},
                {"key": "x", "operator": "In", "values": [""]},
            ]})
        );
        // `>` and `<` cannot be expressed: left out, and alone they leave nothing.
        assert_eq!(
            labels("replicas>3,app=x"),
            json!({"requirements": [{"key": "app", "operator": "In", "values": ["x"]}]})
        );
        assert_eq!(labels("replicas<3"), Value::Null);
        assert_eq!(labels(""), Value::Null);
    }

    #[test]
    fn a_label_selector_kube_cannot_parse_adds_nothing() {
        for bad in [
            "app=x,",
            ",app=x",
            "app=x y",
            "app in x",
            "app in (x",
            "app in (x y)",
            "!app=x",
            "app=(x)",
            "-app=x",
            "app=-x",
            "a/b/c=x",
            "Example.com/app=x",
            "app=x&y",
            "replicas>three",
            "replicas>-1",
            &format!("app={}", "v".repeat(64)),
            &format!("{}=x", "k".repeat(64)),
            "app notin",
            "=x",
        ] {
            assert!(parse_label_selector(bad).is_err(), "{bad:?}");
            assert_eq!(labels(bad), Value::Null, "{bad:?}");
        }
        let err = parse_label_selector("app in (x y)").unwrap_err();
        assert!(err.contains("expected ',' or ')'"), "{err}");
    }

    #[test]
    fn label_tokens_follow_gos_lexer() {
        // Whitespace of every kind separates; `!=` and `==` are one token.
        assert_eq!(
            parse_label_selector("a\t!=\nb,\rc==d").unwrap(),
            [
                LabelRequirement {
                    key: "a".into(),
                    op: LabelOp::NotEquals,
                    values: vec!["b".into()]
                },
                LabelRequirement {
                    key: "c".into(),
                    op: LabelOp::DoubleEquals,
                    values: vec!["d".into()]
                },
            ]
        );
        // A NUL where a token would start ends the input; after a word it is swallowed.
        assert_eq!(parse_label_selector("a= \0b").unwrap()[0].values, [""]);
        assert!(parse_label_selector("a=b\0c").is_err());
    }

    #[test]
    fn field_requirements_are_sent_as_the_webhook_authorizer_sends_them() {
        assert_eq!(
            fields("status.phase!=Failed,metadata.name==a\\,b,spec.nodeName="),
            json!({"requirements": [
                {"key": "metadata.name", "operator": "In", "values": ["a,b"]},
                {"key": "spec.nodeName", "operator": "In", "values": [""]},
                {"key": "status.phase", "operator": "NotIn", "values": ["Failed"]},
            ]})
        );
        // Empty terms and a term without field and value add nothing.
        assert_eq!(
            fields(",x=1,,="),
            json!({"requirements": [{"key": "x", "operator": "In", "values": ["1"]}]})
        );
        assert_eq!(fields("="), Value::Null);
        assert_eq!(fields(""), Value::Null);
        // The first operator splits: the field holds no `=`.
        assert_eq!(
            fields("a=b\\=c"),
            json!({"requirements": [{"key": "a", "operator": "In", "values": ["b=c"]}]})
        );
    }

    #[test]
    fn a_field_selector_kube_cannot_parse_adds_nothing() {
        for bad in ["a", "a=b=c", "a=b\\", "a=b\\x", "x=1,nothing"] {
            assert!(parse_field_selector(bad).is_err(), "{bad:?}");
            assert_eq!(fields(bad), Value::Null, "{bad:?}");
        }
    }
}
