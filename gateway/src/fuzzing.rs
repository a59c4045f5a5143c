//! Fuzz target bodies, shared by the cargo-fuzz targets in `gateway/fuzz/` and by the
//! fixed-seed tests below (which run on stable Rust in every `cargo test`). Each takes raw bytes,
//! decodes them into an input, runs the code under test and asserts its invariants: a panic is a
//! finding.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue, Method};

use crate::identity::{set_identity_headers, UserInfo};
use crate::request_info;

const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT",
];

/// `request_info::parse` on an arbitrary method, path and query never panics, and what it
/// returns is consistent with kube-apiserver's reading of the same URL.
///
/// Input: byte 0 picks the method (or, past the table, the next line is a method token; bit 7
/// is ignored, it once was an upgrade flag and corpora still set it); the rest, lossily UTF-8,
/// is `path` and `query` split at the first `?`.
pub fn request_info(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (method, target) = match METHODS.get((first & 0x7f) as usize) {
        Some(m) => (
            Method::from_bytes(m.as_bytes()).expect("static method"),
            &*text,
        ),
        None => {
            let (token, target) = text.split_once('\n').unwrap_or(("GET", &text));
            (
                Method::from_bytes(token.as_bytes()).unwrap_or(Method::GET),
                target,
            )
        }
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let decoded = oracle::decode_path(path);
    let info = match request_info::parse(&method, path, query) {
        Ok(info) => info,
        Err(_) => {
            // Refused only for what kube's Go server would read differently or not at all.
            let bare_watch = decoded.as_deref().is_some_and(|p| {
                let parts: Vec<&str> = p.trim_matches('/').split('/').collect();
                matches!(
                    parts.as_slice(),
                    ["api", _, "watch" | "proxy"] | ["apis", _, _, "watch" | "proxy"]
                )
            });
            let too_many = query.split('&').count() > request_info::MAX_QUERY_PARAMS;
            assert!(
                decoded.is_none() || bare_watch || too_many,
                "refused {method} {path:?}?{query:?}"
            );
            return;
        }
    };
    let decoded = decoded.unwrap_or_else(|| panic!("accepted a path Go refuses: {path:?}"));
    assert_eq!(info.path(), decoded);
    for (what, value) in [
        ("namespace", info.namespace()),
        ("name", info.name()),
        ("resource", info.resource()),
        ("subresource", info.subresource()),
        ("apiGroup", info.api_group()),
        ("apiVersion", info.api_version()),
    ] {
        assert!(
            !value.contains('/'),
            "{what} {value:?} contains '/' ({path:?})"
        );
    }
    if info.is_resource_request {
        assert!(
            info.api_prefix() == "api" || info.api_prefix() == "apis",
            "{info:?}"
        );
        // Every attribute taken from the path is one of its decoded segments, never raw text.
        let segments: Vec<&str> = info.path().split('/').collect();
        for value in [info.namespace(), info.resource(), info.subresource()] {
            assert!(
                value.is_empty() || segments.contains(&value),
                "{value:?} is not a segment of {:?}",
                info.path()
            );
        }
        // kube leaves the verb empty only for methods it has no verb for (OPTIONS, ...).
        let standard = matches!(
            method,
            Method::GET
                | Method::HEAD
                | Method::POST
                | Method::PUT
                | Method::PATCH
                | Method::DELETE
        );
        if standard {
            assert!(
                !info.verb().is_empty(),
                "empty verb for {method} {path}?{query}"
            );
        }
        // A collection verb carries a name only when a `metadata.name` field selector picks
        // one object (kube does the same, so authorization can decide per object).
        if !info.name().is_empty() && matches!(info.verb(), "list" | "watch") {
            let from_selector = request_info::field_selector_name(query);
            let in_path = segments.contains(&info.name());
            assert!(
                from_selector.as_deref() == Some(info.name()) || in_path,
                "{info:?}"
            );
        }
        if !info.name().is_empty() {
            assert_ne!(info.verb(), "deletecollection", "{info:?}");
        }
        // Without a `watch`/`proxy` path segment, a GET names an object or is a list or watch
        // as kube's ListOptions decoding of the `watch` parameter says.
        let special = matches!(
            segments
                .iter()
                .skip_while(|s| s.is_empty())
                .nth(if info.api_prefix() == "api" { 2 } else { 3 }),
            Some(&"watch" | &"proxy")
        );
        if matches!(method, Method::GET | Method::HEAD) && !special {
            if info.verb() == "get" {
                assert!(!info.name().is_empty(), "{info:?}");
            } else {
                let expected = if oracle::watch(query) {
                    "watch"
                } else {
                    "list"
                };
                assert_eq!(info.verb(), expected, "{method} {path}?{query}");
            }
        }
        if info.verb() == "list" {
            assert!(!oracle::watch(query), "{method} {path}?{query} {info:?}");
        }
    } else {
        assert!(
            info.resource().is_empty() && info.namespace().is_empty(),
            "{info:?}"
        );
        assert_eq!(info.verb(), method.as_str().to_ascii_lowercase());
    }
    // Long-running (no timeout, no in-flight slot) exactly for kube's long-running verbs and
    // subresources, and never for a non-resource request whatever its method.
    let long_running = info.is_resource_request
        && (matches!(info.verb(), "watch" | "proxy")
            || matches!(
                info.subresource(),
                "attach" | "exec" | "proxy" | "log" | "portforward"
            ));
    assert_eq!(info.long_running, long_running, "{info:?}");
}

/// The APIService Table rewriter on arbitrary core answers: a list answer and a watch's events,
/// rewritten or passed on, never a panic; what is rewritten is a Table with kube-aggregator's
/// four columns and as many rows as it came with, and no larger than the answer allows (each row
/// gains at most its service's `namespace/name` and a reason in parentheses).
///
/// Input: byte 0 even, the rest is the list answer's text and, after a NUL byte, the watch's
/// event lines; odd, the rest shapes a Table (see [`table`]): the CRD's columns in any order,
/// some missing or repeated, rows of any cells, many rows.
pub fn apiservice_table(data: &[u8]) {
    use crate::handlers::apiservice_printing::rewritten;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (list, events): (Vec<u8>, Vec<u8>) = if mode & 1 == 0 {
        let (list, events) = rest
            .iter()
            .position(|b| *b == 0)
            .map_or((rest, &[][..]), |at| (&rest[..at], &rest[at + 1..]));
        (list.to_vec(), events.to_vec())
    } else {
        let mut bytes = rest.iter().copied();
        let first = table(&mut bytes, true);
        let later = table(&mut bytes, false);
        let list = serde_json::to_vec(&first).unwrap_or_default();
        let mut events = Vec::new();
        for (kind, object) in [("ADDED", &first), ("MODIFIED", &later)] {
            let event = serde_json::json!({"type": kind, "object": object});
            events.extend(serde_json::to_vec(&event).unwrap_or_default());
            events.push(b'\n');
        }
        (list, events)
    };
    let lines: Vec<bytes::Bytes> = events
        .split_inclusive(|b| *b == b'\n')
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let (rewritten_list, rewritten_events) = rewritten(&list, lines.clone());
    let check = |input: &[u8], output: &[u8]| {
        let (Ok(before), Ok(after)) = (
            serde_json::from_slice::<serde_json::Value>(input),
            serde_json::from_slice::<serde_json::Value>(output),
        ) else {
            panic!(
                "a rewritten answer does not parse: {}",
                String::from_utf8_lossy(output)
            );
        };
        let table = |v: &serde_json::Value| {
            if v.get("kind").is_some() {
                v.clone()
            } else {
                v["object"].clone()
            }
        };
        let (before, after) = (table(&before), table(&after));
        let rows = |t: &serde_json::Value| t["rows"].as_array().map_or(0, Vec::len);
        assert_eq!(rows(&before), rows(&after), "rows came or went");
        for row in after["rows"].as_array().into_iter().flatten() {
            if let Some(cells) = row.get("cells").and_then(|c| c.as_array()) {
                assert_eq!(cells.len(), 4, "{row}");
            }
        }
        if let Some(definitions) = after["columnDefinitions"].as_array() {
            assert_eq!(definitions.len(), 4, "{after}");
        }
        let bound = input.len() + 64 * rows(&after) + 1024;
        assert!(
            output.len() <= bound,
            "{} bytes in, {} out",
            input.len(),
            output.len()
        );
    };
    if let Some(out) = &rewritten_list {
        check(&list, out);
    }
    for (line, out) in lines.iter().zip(&rewritten_events) {
        if line != out {
            check(line, out);
        }
    }
}

/// A Table shaped by `bytes` (0 once they run out): the chart CRD's column definitions, or a
/// shuffle of them with some left out or repeated (`with_definitions`), and rows of cells of any
/// type and number, up to a thousand.
fn table(bytes: &mut impl Iterator<Item = u8>, with_definitions: bool) -> serde_json::Value {
    use serde_json::json;
    const COLUMNS: [&str; 7] = [
        "Name",
        "Service",
        "Service Namespace",
        "Available",
        "Reason",
        "Age",
        "Other",
    ];
    let mut next = || bytes.next().unwrap_or(0);
    let mut table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}});
    if with_definitions {
        let definitions: Vec<serde_json::Value> = if next().is_multiple_of(4) {
            (0..next() % 9)
                .map(|_| json!({"name": COLUMNS[usize::from(next()) % COLUMNS.len()], "type": "string"}))
                .collect()
        } else {
            COLUMNS[..6]
                .iter()
                .map(|n| json!({"name": n, "type": "string", "format": "", "priority": 0}))
                .collect()
        };
        table["columnDefinitions"] = json!(definitions);
    }
    let rows = usize::from(next()) * 4;
    let cell = |b: u8| match b % 6 {
        0 => json!(null),
        1 => json!(""),
        2 => json!("True"),
        3 => json!(12),
        4 => json!(["nested"]),
        _ => json!("x".repeat(usize::from(b))),
    };
    let rows: Vec<serde_json::Value> = (0..rows)
        .map(|_| {
            let cells: Vec<serde_json::Value> = (0..next() % 9).map(|_| cell(next())).collect();
            json!({"cells": cells})
        })
        .collect();
    table["rows"] = json!(rows);
    table
}

/// Second, deliberately plain readings of Go's URL rules, to check `request_info` against.
mod oracle {
    /// Go's `URL.Path` for a raw path: `None` when an escape is malformed or the result is not
    /// UTF-8.
    pub fn decode_path(raw: &str) -> Option<String> {
        let bytes = unescape(raw.as_bytes(), false)?;
        String::from_utf8(bytes).ok()
    }

    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }

    fn unescape(s: &[u8], plus_is_space: bool) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(s.len());
        let mut i = 0;
        while i < s.len() {
            match s[i] {
                b'%' => {
                    let hi = hex(*s.get(i + 1)?)?;
                    let lo = hex(*s.get(i + 2)?)?;
                    out.push(hi * 16 + lo);
                    i += 3;
                }
                b'+' if plus_is_space => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        Some(out)
    }

    /// `ListOptions.Watch` from a raw query: Go's `url.ParseQuery`, then the first `watch`
    /// value is true unless it is `0` or `false` in any case.
    pub fn watch(query: &str) -> bool {
        let mut first = None;
        for pair in query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (k, v) = match pair.find('=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, ""),
            };
            let (Some(k), Some(v)) = (unescape(k.as_bytes(), true), unescape(v.as_bytes(), true))
            else {
                continue;
            };
            if k == b"watch" {
                first = Some(v);
                break;
            }
        }
        match first {
            None => false,
            Some(v) => {
                let lower = v.to_ascii_lowercase();
                lower != b"false" && lower != b"0"
            }
        }
    }
}

/// Prefixes the decoder puts in front of header names, so the fuzzer reaches the identity
/// headers without having to guess them.
const NAME_PREFIXES: [&str; 10] = [
    "",
    "x-remote-",
    "X-Remote-Extra-",
    "impersonate-",
    "Impersonate-Extra-",
    "authorization",
    "x-remote-user",
    "x-remote-group",
    "X_Remote_",
    "impersonate_",
];

/// The other headers, by name, each with its values in order (the order between different
/// names is not meaningful: `HeaderMap` may reorder entries on removal).
fn non_identity(h: &HeaderMap) -> BTreeMap<String, Vec<Vec<u8>>> {
    h.keys()
        .filter(|k| !is_identity_header(k))
        .map(|k| {
            let values = h.get_all(k).iter().map(|v| v.as_bytes().to_vec()).collect();
            (k.as_str().to_owned(), values)
        })
        .collect()
}

/// Identity headers as any backend might read them: CGI-style servers take `_` for `-`.
fn is_identity_header(name: &HeaderName) -> bool {
    let n = name.as_str().replace('_', "-");
    n.starts_with("x-remote-") || n.starts_with("impersonate-") || n == "authorization"
}

/// After `set_identity_headers`, the identity headers are exactly the ones derived from the
/// user: nothing a client sent survives, every other header is untouched.
///
/// Input: NUL-separated fields. The first field, split at `0x01`, is the user (name, then
/// groups; `key=value` parts become extras); the rest alternate header name (first byte picks a
/// prefix) and value.
pub fn identity_headers(data: &[u8]) {
    let mut fields = data.split(|b| *b == 0);
    let user_field = fields.next().unwrap_or_default();
    let mut parts = user_field.split(|b| *b == 1).map(String::from_utf8_lossy);
    let name = parts.next().map(|s| s.into_owned()).unwrap_or_default();
    let mut groups = Vec::new();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in parts {
        match p.split_once('=') {
            Some((k, v)) => extra.entry(k.to_owned()).or_default().push(v.to_owned()),
            None => groups.push(p.into_owned()),
        }
    }
    let user = UserInfo {
        name,
        uid: String::new(),
        groups,
        extra,
    };

    let mut headers = HeaderMap::new();
    while let (Some(n), Some(v)) = (fields.next(), fields.next()) {
        let (prefix, suffix) = match n.split_first() {
            Some((p, rest)) => (NAME_PREFIXES[(*p as usize) % NAME_PREFIXES.len()], rest),
            None => ("", n),
        };
        let mut full = prefix.as_bytes().to_vec();
        full.extend_from_slice(suffix);
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&full), HeaderValue::from_bytes(v)) {
            headers.append(name, value);
        }
    }
    let others = non_identity(&headers);

    let mut expected = HeaderMap::new();
    // A user that cannot be encoded is refused: then no identity header at all may remain.
    let encodable = set_identity_headers(&mut expected, &user).is_ok();
    assert_eq!(set_identity_headers(&mut headers, &user).is_ok(), encodable);

    let identity = |h: &HeaderMap| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = h
            .iter()
            .filter(|(k, _)| is_identity_header(k))
            .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        identity(&headers),
        identity(&expected),
        "client-sent identity headers survived"
    );
    assert!(headers
        .keys()
        .all(|k| !k.as_str().starts_with("impersonate-")));
    assert!(!headers.contains_key(http::header::AUTHORIZATION));
    let after = non_identity(&headers);
    assert_eq!(after, others, "unrelated headers changed");
}

#[cfg(test)]
mod tests {
    //! The fuzz targets on stable Rust: a few thousand inputs from a fixed-seed generator,
    //! assembled from tokens that matter to each parser.

    /// xorshift64*: deterministic, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn assemble(rng: &mut Rng, tokens: &[&[u8]], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..rng.below(max) {
            if rng.below(8) == 0 {
                out.push(rng.next() as u8);
            } else {
                out.extend_from_slice(tokens[rng.below(tokens.len())]);
            }
        }
        out
    }

    #[test]
    fn request_info_target_holds_on_generated_inputs() {
        const TOKENS: &[&[u8]] = &[
            b"/",
            b"/",
            b"/",
            b"api",
            b"apis",
            b"v1",
            b"apps",
            b"namespaces",
            b"default",
            b"pods",
            b"watch",
            b"proxy",
            b"status",
            b"finalize",
            b"exec",
            b"log",
            b"scale",
            b"?",
            b"&",
            b"=",
            b"watch=true",
            b"watch=1",
            b"watch",
            b"watch=",
            b"watch=false",
            b"watch=FALSE",
            b"watch=0",
            b"%77atch",
            b"%74rue",
            b"%66alse",
            b";",
            b"+",
            b"%6B",
            b"%2f",
            b"%zz",
            b"%",
            b"%FF",
            b"exec",
            b"attach",
            b"portforward",
            b"configmaps",
            b"fieldSelector=metadata.name%3Dfoo",
            b"fieldSelector=metadata.name%3D%3D",
            b"%2F",
            b"..",
            b".",
            b"\n",
            b"\xff",
            b"\xc3\xa9",
        ];
        // Whole API paths are too rare to assemble token by token, so half the inputs start
        // from one and add a few path segments and query parameters.
        const PREFIXES: &[&[u8]] = &[
            b"/api/v1/",
            b"/api/v1/namespaces/",
            b"/apis/apps/v1/",
            b"/apis/apps/v1/namespaces/default/",
            b"/%61pi/v1/",
        ];
        const PARAMS: &[&[u8]] = &[
            b"watch",
            b"watch=",
            b"watch=true",
            b"watch=TRUE",
            b"watch=yes",
            b"watch=1",
            b"watch=0",
            b"watch=false",
            b"watch=FaLsE",
            b"watch=%74rue",
            b"watch=%66alse",
            b"watch=%zz",
            b"watch=0;x",
            b"%77atch=0",
            b"watch=+",
            b"fieldSelector=metadata.name%3Dfoo",
            b"limit=5",
            b"",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..10_000 {
            let mut input = vec![(rng.next() as u8 % 10) | (rng.next() as u8 & 0x80)];
            if round % 2 == 0 {
                input.extend(assemble(&mut rng, TOKENS, 14));
            } else {
                input.extend_from_slice(PREFIXES[rng.below(PREFIXES.len())]);
                input.extend(assemble(&mut rng, TOKENS, 4));
                input.push(b'?');
                for _ in 0..rng.below(4) {
                    input.extend_from_slice(PARAMS[rng.below(PARAMS.len())]);
                    input.push(b'&');
                }
            }
            super::request_info(&input);
        }
    }

    /// Inputs libFuzzer found in CI, kept so each finding stays fixed.
    #[test]
    fn request_info_target_holds_on_past_findings() {
        // A list whose field selector names one object: kube sets the name and keeps the verb.
        let mut list_by_field_selector = vec![0u8];
        list_by_field_selector.extend_from_slice(
            b"/apis/wardle.example.com/v1alpha1/flunders?fieldSelector=metadata.name%3Dmy-flunder",
        );
        let crash_e3cbdcf1: &[u8] = &[
            255, 97, 112, 105, 115, 47, 47, 47, 8, 203, 63, 61, 61, 232, 61, 61, 63, 61, 61, 255,
            253, 255, 255, 255, 255, 255, 6, 63, 0, 7, 38, 102, 105, 101, 108, 100, 83, 101, 108,
            101, 99, 116, 111, 114, 61, 109, 101, 116, 97, 100, 97, 116, 97, 46, 110, 97, 109, 101,
            61, 6, 63, 0, 7, 38, 102, 105, 101, 108, 100, 83, 101, 108, 101, 99, 116, 111, 114, 61,
            109, 101, 116, 97, 100, 97, 116, 97, 46, 110, 97, 109, 101, 61, 216, 189, 216, 189, 97,
            112, 47, 1, 17, 0, 0, 47, 48, 0, 0, 239, 191, 189, 97, 64, 0, 0, 0, 47, 64, 0,
        ];
        for input in [&list_by_field_selector[..], crash_e3cbdcf1] {
            super::request_info(input);
        }
    }

    #[test]
    fn identity_headers_target_holds_on_generated_inputs() {
        const TOKENS: &[&[u8]] = &[
            b"\0",
            b"\0",
            b"\x01",
            b"\x00\x01",
            b"\x00\x02",
            b"\x00\x03",
            b"\x00\x04",
            b"\x00\x05",
            b"user",
            b"scopes",
            b"system:masters",
            b"=",
            b"A",
            b"-",
            b"%2f",
            b"x",
            b"accept",
            b"\x00\x00",
            b"\r\n",
            b"\xff",
        ];
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..5000 {
            let input = assemble(&mut rng, TOKENS, 24);
            super::identity_headers(&input);
        }
    }

    #[test]
    fn identity_headers_target_catches_a_forged_header() {
        // Sanity check of the decoder: `\x01` prefix = "x-remote-", so this is
        // `x-remote-user: admin`, which must be replaced by `alice`.
        super::identity_headers(b"alice\x00\x01user\x00admin");
    }

    #[test]
    fn apiservice_table_target_holds_on_generated_inputs() {
        const TOKENS: &[&[u8]] = &[
            b"{\"kind\":\"Table\",\"columnDefinitions\":[",
            b"{\"name\":\"Name\"}",
            b"{\"name\":\"Service\"}",
            b"{\"name\":\"Service Namespace\"}",
            b"{\"name\":\"Available\"}",
            b"{\"name\":\"Reason\"}",
            b"{\"name\":\"Age\"}",
            b"],\"rows\":[",
            b"{\"cells\":[",
            b"\"a\"",
            b"null",
            b"1",
            b",",
            b"]}",
            b"]",
            b"}",
            b"\n",
            b"\x00",
            b"{\"type\":\"ADDED\",\"object\":",
        ];
        let mut rng = Rng(26);
        for _ in 0..500 {
            let mut input = assemble(&mut rng, TOKENS, 40);
            input.insert(0, (rng.next() % 2) as u8);
            super::apiservice_table(&input);
        }
    }
}
