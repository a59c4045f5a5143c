//! The end-to-end suite, one test binary: every area below is a module, so the suite links once
//! and shares one copy of the `e2e` library's helpers.
//!
//! Run one area with `cargo test -p e2e --test suite <area>::` (for example
//! `cargo test -p e2e --test suite discovery::`). The real areas (`real_control_plane`,
//! `real_node`) skip unless the environment names their binaries, and are best run alone: each
//! starts whole control planes.

mod apiservice_routing;
mod apiservice_sources;
mod apiservice_status;
mod authentication;
mod bench_short;
mod certificates;
mod configuration;
mod control_loops;
mod demo;
mod discovery;
mod dockerfile;
mod fixtures_selftest;
mod gateway_core;
mod hardening;
mod harness_selftest;
mod helm_chart;
mod hostile;
mod leader_election;
mod limits;
mod live_core;
mod openapi_v2;
mod operator_logs;
mod priority_and_fairness;
mod proxy_fidelity;
mod real_control_plane;
mod real_node;
mod replica_readiness;
mod request_metrics;
mod request_tracing;
mod rolling_restart;
mod security_limits;
mod structured_authentication;
mod traffic;
mod trust_configmap;
