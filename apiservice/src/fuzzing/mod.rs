//! Fuzz target bodies for the documents a server controls, shared by the cargo-fuzz targets in
//! `gateway/fuzz/` and the fixed-seed tests below (which run on stable Rust in every
//! `cargo test`). Each takes raw bytes, builds its input from them (as JSON text, or through
//! [`choices`] as a structure: chains, cycles, huge arrays, deep nesting), runs the code under
//! test and asserts its invariants: a panic, a stack overflow or an amplification is a finding,
//! and every finding becomes a unit test.
//!
//! [`choices`] and [`documents`] depend on nothing but the OpenAPI code and serde_json, so the
//! fuzz crate compiles them alone (see `gateway/fuzz/src/lib.rs`).

pub mod choices;
pub mod discovery;
pub mod documents;

#[cfg(test)]
mod tests;
