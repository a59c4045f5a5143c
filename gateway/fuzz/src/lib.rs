//! The code fuzzed, compiled on its own: the gateway's request parsers, its APIService Table
//! rewriter, and the apiservice crate's OpenAPI document code (the v2 filter, merge and protobuf
//! form, the v2 to v3 conversion, the v3 root union). Including their source files here keeps
//! the sanitizer build to a few small crates instead of the whole gateway (kube, rustls, hyper):
//! CI's fuzz step then costs seconds of compiling, not minutes. The targets' bodies live in the
//! gateway's `fuzzing` module and apiservice's `fuzzing` module, which also run them on stable
//! Rust in `cargo test`.
//!
//! The modules keep the paths they have in their crates (`crate::body`, `crate::discovery::…`),
//! which is what lets their files be included unchanged (`handlers.rs`, `discovery.rs` and
//! `documents.rs` here only hold the includes). apiservice's discovery documents
//! (`fuzzing::discovery`) are not here: they need k8s-openapi and apiservice's model, which would
//! make this build several times longer; their body runs in `cargo test` only.

#[path = "../../../request/src/request_info.rs"]
pub mod request_info;

#[path = "../../../request/src/identity.rs"]
pub mod identity;

#[path = "../../src/body.rs"]
pub mod body;

pub mod handlers;

#[path = "../../src/fuzzing.rs"]
pub mod fuzzing;

pub mod discovery;
pub mod documents;
