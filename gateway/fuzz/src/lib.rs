//! The gateway's request parsers, compiled on their own for fuzzing. They depend only on `http`,
//! `percent-encoding` and `tracing`, so including their source files here keeps the sanitizer build to a
//! few crates instead of the whole gateway (kube, rustls, hyper): CI's fuzz step then costs
//! seconds of compiling, not minutes. The targets' bodies live in the gateway's `fuzzing`
//! module, which also runs them on stable Rust in `cargo test`.

#[path = "../../src/request_info.rs"]
pub mod request_info;

#[path = "../../src/identity.rs"]
pub mod identity;

#[path = "../../src/fuzzing.rs"]
pub mod fuzzing;
