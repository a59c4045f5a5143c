//! The fuzz bodies on stable Rust: inputs from a fixed-seed generator (half read as JSON text,
//! half as structure-shaping choices), and the findings, each kept as an input of its own.

use serde_json::json;

use super::{discovery, documents};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// An input of up to `max` bytes: every other one structure-aware (counts capped at 8, or
    /// one in four at 128: the larger shapes are the fuzz campaign's, in a release build), the
    /// others JSON text spliced from `tokens`.
    fn input(&mut self, max: usize, tokens: &[&[u8]]) -> Vec<u8> {
        let len = (self.next() % max as u64) as usize;
        let structured = self.next().is_multiple_of(2);
        let mode = match (structured, self.next() % 4) {
            (false, _) => 0,
            (true, 0) => 3,
            (true, _) => 1,
        };
        let mut out = vec![mode];
        while out.len() < len {
            if structured || self.next().is_multiple_of(8) {
                out.push(self.next() as u8);
            } else {
                out.extend_from_slice(tokens[(self.next() % tokens.len() as u64) as usize]);
            }
        }
        out
    }
}

const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\x00",
    b"\"paths\"",
    b"\"definitions\"",
    b"\"/apis/g.io/v1/x\"",
    b"\"get\"",
    b"\"responses\"",
    b"\"200\"",
    b"\"schema\"",
    b"\"$ref\"",
    b"\"#/definitions/A\"",
    b"\"A\"",
    b"\"properties\"",
    b"\"items\"",
    b"\"allOf\"",
    b"\"parameters\"",
    b"\"#/parameters/p\"",
    b"\"in\"",
    b"\"body\"",
    b"\"consumes\"",
    b"\"x-a\"",
    b"\"serverRelativeURL\"",
    b"\"groups\"",
    b"\"items\"",
    b"\"versions\"",
    b"\"resources\"",
    b"\"name\"",
    b"\"r/status\"",
    b"1",
    b"null",
    b"\"\"",
];

fn run(seed: u64, inputs: usize, max: usize, body: fn(&[u8])) {
    let mut rng = Rng(seed);
    for _ in 0..inputs {
        body(&rng.input(max, JSON_TOKENS));
    }
}

#[test]
fn openapi_v2_holds_on_generated_inputs() {
    run(1, 300, 400, documents::openapi_v2);
}

#[test]
fn openapi_v2_to_v3_holds_on_generated_inputs() {
    run(2, 300, 400, documents::openapi_v2_to_v3);
}

#[test]
fn openapi_v3_root_holds_on_generated_inputs() {
    run(3, 300, 400, documents::openapi_v3_root);
}

#[test]
fn discovery_holds_on_generated_inputs() {
    run(4, 200, 400, discovery::discovery);
}

/// The issue-26 findings as inputs of the byte fuzzer: a 5 000-link chain (a stack overflow
/// before), a spec nested past the parser's limit, and an extension YAML would multiply. (The
/// conversion's copying is `openapi_v2_to_v3`'s own unit tests.)
#[test]
fn openapi_bodies_hold_on_the_findings() {
    let mut chain = serde_json::Map::new();
    for i in 0..5000 {
        chain.insert(
            format!("L{i}"),
            json!({"properties": {"next": {"$ref": format!("#/definitions/L{}", i + 1)}}}),
        );
    }
    let get = json!({"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/L0"}}}}});
    let chained = json!({"paths": {"/apis/g.io/v1/x": get}, "definitions": chain});
    let nested = format!(
        r#"{{"paths": {{}}, "x-deep": {}{}}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    let mut wide = String::from(r#"{"paths": {}, "x-deep": "#);
    wide.push_str(&"[".repeat(120));
    wide.push_str(&vec!["0"; 20_000].join(","));
    wide.push_str(&"]".repeat(120));
    wide.push('}');
    for doc in [chained.to_string(), nested, wide] {
        // Raw mode: the core is `{}`, the document is the remote (or the only one).
        let mut input = vec![0u8, b'{', b'}', 0];
        input.extend_from_slice(doc.as_bytes());
        documents::openapi_v2(&input);
        let mut alone = vec![0u8];
        alone.extend_from_slice(doc.as_bytes());
        documents::openapi_v2_to_v3(&alone);
    }
}
