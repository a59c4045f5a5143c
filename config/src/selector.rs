//! The label-selector grammar of the API server (`labels.Parse` in apimachinery's
//! `pkg/labels/selector.go`), enough to refuse a `--apiservice-label-selector` the core would
//! refuse. Checked at start because the selector is only sent with every APIService list: a typo
//! found there would fail each list forever instead of once, at start, naming the flag.

/// Checks a label selector with the grammar the API server's `labelSelector` parser accepts, so a
/// typo is refused at start instead of failing every APIService list forever:
/// `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`,
/// `key>1`, `key<1`, comma-separated; keys and values validated as label keys and values.
pub(crate) fn check_label_selector(selector: &str) -> Result<(), String> {
    let mut parser = Parser {
        tokens: selector_tokens(selector),
        pos: 0,
    };
    if parser.peek() == Tok::End {
        return Ok(());
    }
    loop {
        let key = parser.requirement()?;
        match parser.next() {
            Tok::End => return Ok(()),
            Tok::Sym(",") => {
                if !matches!(parser.peek(), Tok::Word(_) | Tok::Sym("!")) {
                    return Err(format!(
                        "expected a requirement after ',', found {}",
                        parser.peek().describe()
                    ));
                }
            }
            other => {
                return Err(format!(
                    "after the requirement on {key:?} expected ',' or the end, found {}",
                    other.describe()
                ))
            }
        }
    }
}

/// A cursor over the tokens, one method per rule of the grammar. Every loop consumes a token,
/// and the token list is finite, so parsing ends.
struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

// === impl Parser ===

impl Parser {
    fn peek(&self) -> Tok {
        self.tokens.get(self.pos).cloned().unwrap_or(Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek();
        self.pos += 1;
        t
    }

    /// `!key`, `key`, or `key <op> <values>`; returns the key for the caller's messages.
    fn requirement(&mut self) -> Result<String, String> {
        let negated = self.peek() == Tok::Sym("!");
        if negated {
            self.pos += 1;
        }
        let key = match self.next() {
            Tok::Word(k) => k,
            other => return Err(format!("expected a label key, found {}", other.describe())),
        };
        check_label_key(&key)?;
        if negated || ends_requirement(&self.peek()) {
            return Ok(key);
        }
        let op = self.operator(&key)?;
        let values = if op == "in" || op == "notin" {
            self.value_set(&key, &op)?
        } else {
            vec![self.single_value(&key, &op)?]
        };
        for v in &values {
            check_label_value(&key, v)?;
        }
        Ok(key)
    }

    fn operator(&mut self, key: &str) -> Result<String, String> {
        match self.next() {
            Tok::Word(w) if w == "in" || w == "notin" => Ok(w),
            Tok::Sym(s) if ["=", "==", "!=", ">", "<"].contains(&s) => Ok(s.to_owned()),
            other => Err(format!(
                "after {key:?} expected an operator (=, ==, !=, in, notin, >, <) or ',', found {}",
                other.describe()
            )),
        }
    }

    /// `(a,b)`. Empty items are empty values: "()", "(a,)" and "(a,,b)" are all valid.
    fn value_set(&mut self, key: &str, op: &str) -> Result<Vec<String>, String> {
        if self.next() != Tok::Sym("(") {
            return Err(format!(
                "{key} {op} needs a parenthesized list: {key} {op} (a,b)"
            ));
        }
        let mut values = Vec::new();
        loop {
            match self.next() {
                Tok::Word(v) => {
                    values.push(v);
                    match self.next() {
                        Tok::Sym(",") => continue,
                        Tok::Sym(")") => return Ok(values),
                        other => {
                            return Err(format!(
                                "in the values of {key:?} expected ',' or ')', found {}",
                                other.describe()
                            ))
                        }
                    }
                }
                Tok::Sym(",") => values.push(String::new()),
                Tok::Sym(")") => {
                    values.push(String::new());
                    return Ok(values);
                }
                other => {
                    return Err(format!(
                        "in the values of {key:?} expected a value, ',' or ')', found {}",
                        other.describe()
                    ))
                }
            }
        }
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; empty when the requirement ends there.
    fn single_value(&mut self, key: &str, op: &str) -> Result<String, String> {
        let value = match self.peek() {
            t if ends_requirement(&t) => String::new(),
            Tok::Word(v) => {
                self.pos += 1;
                v
            }
            other => {
                return Err(format!(
                    "after {key}{op} expected a value, found {}",
                    other.describe()
                ))
            }
        };
        if (op == ">" || op == "<") && value.parse::<i64>().is_err() {
            return Err(format!(
                "{key}{op}{value}: '>' and '<' compare with an integer"
            ));
        }
        Ok(value)
    }
}

fn ends_requirement(t: &Tok) -> bool {
    matches!(t, Tok::End | Tok::Sym(","))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Word(String),
    Sym(&'static str),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Word(w) => format!("{w:?}"),
            Tok::Sym(s) => format!("'{s}'"),
            Tok::End => "the end".to_owned(),
        }
    }
}

/// Words run until whitespace or an operator character; `==` and `!=` are the only two-character
/// operators. "in" and "notin" stay words: whether they are operators depends on position.
fn selector_tokens(selector: &str) -> Vec<Tok> {
    const SYMBOLS: [&str; 7] = ["=", "!", "(", ")", ",", ">", "<"];
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
    let is_symbol = |c: char| "=!(),<>".contains(c);
    let mut tokens = Vec::new();
    let mut chars = selector.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if is_space(c) {
            chars.next();
        } else if is_symbol(c) {
            chars.next();
            let two = chars.peek().map(|&(_, d)| (c, d));
            let sym = match two {
                Some(('=', '=')) => "==",
                Some(('!', '=')) => "!=",
                _ => SYMBOLS
                    .into_iter()
                    .find(|s| s.starts_with(c))
                    .unwrap_or("="),
            };
            if sym.len() == 2 {
                chars.next();
            }
            tokens.push(Tok::Sym(sym));
        } else {
            let mut end = selector.len();
            while let Some(&(i, d)) = chars.peek() {
                if is_space(d) || is_symbol(d) {
                    end = i;
                    break;
                }
                chars.next();
            }
            tokens.push(Tok::Word(selector[start..end].to_owned()));
        }
    }
    tokens
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`: label names and non-empty label values.
fn label_name_chars_ok(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// A label key: an optional DNS subdomain prefix and '/', then a name of at most 63 characters.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            l.starts_with(lower_alnum)
                && l.ends_with(lower_alnum)
                && l.chars().all(|c| lower_alnum(c) || c == '-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err(format!(
                "label key {key:?}: the prefix before '/' must be a lowercase DNS subdomain \
                 (e.g. example.com)"
            ));
        }
    }
    if name.is_empty() || name.len() > 63 || !label_name_chars_ok(name) {
        return Err(format!(
            "label key {key:?}: the name must be 1-63 characters of letters, digits, '-', '_' or \
             '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn check_label_value(key: &str, value: &str) -> Result<(), String> {
    if !value.is_empty() && (value.len() > 63 || !label_name_chars_ok(value)) {
        return Err(format!(
            "value {value:?} for {key:?}: label values are at most 63 characters of letters, \
             digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_label_selector;

    /// One row per selector: `None` when the API server accepts it, else a part of the refusal.
    #[test]
    fn label_selectors_follow_the_api_server_grammar() {
        let long = "a".repeat(64);
        let rows: Vec<(String, Option<&str>)> = vec![
            // Accepted.
            ("".into(), None),
            ("  ".into(), None),
            ("env=prod".into(), None),
            ("env==prod".into(), None),
            ("env!=prod".into(), None),
            ("env = prod , tier".into(), None),
            ("!legacy".into(), None),
            ("gateway.example.com/owner=edge".into(), None),
            ("tier in (a,b)".into(), None),
            ("tier notin (a, b)".into(), None),
            ("tier in ()".into(), None),
            ("tier in (a,,b,)".into(), None),
            ("x in (in,notin)".into(), None),
            ("in in (in)".into(), None),
            ("env=".into(), None),
            ("replicas>1,replicas<10".into(), None),
            ("a.b_c-d=V.1_x-Y".into(), None),
            (format!("k={}", &long[1..]), None),
            // Refused.
            ("env=prod,".into(), Some("after ','")),
            (",env".into(), Some("expected a label key")),
            ("env prod".into(), Some("expected an operator")),
            ("tier in a,b".into(), Some("parenthesized list")),
            ("tier in (a b)".into(), Some("expected ',' or ')'")),
            ("tier in (a".into(), Some("expected ',' or ')'")),
            ("tier in (".into(), Some("expected a value")),
            ("!env=prod".into(), Some("expected ',' or the end")),
            ("!".into(), Some("expected a label key")),
            ("env=(a)".into(), Some("expected a value")),
            ("env=a=b".into(), Some("expected ',' or the end")),
            ("replicas>one".into(), Some("integer")),
            ("replicas<".into(), Some("integer")),
            ("replicas>-1".into(), Some("label values")),
            ("-env=prod".into(), Some("label key \"-env\"")),
            ("Example.com/env".into(), Some("prefix before '/'")),
            ("/env".into(), Some("prefix before '/'")),
            ("a/b/c".into(), Some("the name must be")),
            ("env=prod!".into(), Some("expected ',' or the end")),
            ("env=-prod".into(), Some("label values")),
            ("env=ok@".into(), Some("label values")),
            (long.clone(), Some("the name must be 1-63 characters")),
            (
                format!("k={long}"),
                Some("label values are at most 63 characters"),
            ),
        ];
        for (selector, want) in &rows {
            match (check_label_selector(selector), want) {
                (Ok(()), None) => {}
                (Err(err), Some(want)) => assert!(err.contains(want), "{selector:?}: {err}"),
                (got, want) => panic!("{selector:?}: got {got:?}, want refusal {want:?}"),
            }
        }
    }
}
