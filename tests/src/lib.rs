//! End-to-end test support: fixture servers of ours that speak the Kubernetes API protocol (a core
//! server and aggregated API servers), an OTLP trace receiver, certificate helpers, and a harness
//! that starts the real gateway binary and drives it with real clients (kubectl, helm, HTTP/1.1
//! and HTTP/2), a real one-node cluster for the chart and Kubernetes' own e2e tests, the parts of
//! the benchmark (`src/bin/bench.rs`), and the README's demo (`src/bin/demo.rs`).

pub mod bench;
pub mod certs;
pub mod demo;
pub mod dockerfile;
pub mod fixture;
pub mod harness;
pub mod helm;
pub mod oidc;
pub mod otlp;
pub mod real;
pub mod real_node;
pub mod scenario;
pub mod table;
