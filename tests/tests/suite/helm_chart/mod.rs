//! The Helm chart (`charts/aggregation-gateway`), checked the way a user meets it: `helm lint
//! --strict` and `helm template` on the default values and on every example values file, then
//! assertions on the rendered objects.
//!
//! - [`manifests`]: every manifest parses into its `k8s-openapi` type (or, for cert-manager and
//!   prometheus-operator kinds, a small `deny_unknown_fields` struct of ours, [`typed`]) and
//!   serializes back to the same JSON, so a misspelled or misplaced field fails with the path of
//!   the lost field.
//! - [`pod`] and [`rbac`]: the gateway container, ports, probes, mounts, security context and RBAC
//!   rules are the ones the gateway needs, and nothing more.
//! - [`certificates`], [`apiservices`], [`monitoring_and_ingress`]: the optional objects appear
//!   exactly when their values turn them on, and agree with what the gateway mounts and serves;
//!   [`alerts_and_dashboard`]: the PrometheusRule passes `promtool` and its unit tests, and the
//!   rules and the Grafana dashboard query only series the gateway exports.
//! - [`authentication`]: `authentication.config` becomes the structured authentication file in a
//!   ConfigMap mounted as a directory (so the gateway's reload sees updates), named by the config,
//!   with no `anonymousAuth` beside the file's `anonymous` and no checksum rolling the Pods for it.
//! - [`config`]: the config rendered into the ConfigMap is accepted by the gateway's own parser and
//!   validation, and by the real binary's `--check-config`.
//! - [`schema`]: values.schema.json rejects typos and wrong types with a message naming the field;
//!   [`values_docs`]: values.yaml documents its keys.
//!
//! Rendering is shared with `tests/dockerfile.rs` and lives in `e2e::helm`; tables of cases run
//! through [`cases::check_each`], so a failure names its row.
//!
//! Needs `helm` on PATH: run `../shared/tools/install-helm` (CI does it in `.ci/run`).

mod alerts_and_dashboard;
mod apiservices;
mod authentication;
mod certificates;
mod config;
mod flowcontrol;
mod manifests;
mod monitoring_and_ingress;
mod notes;
mod pod;
mod rbac;
mod schema;
mod typed;
mod values_docs;
