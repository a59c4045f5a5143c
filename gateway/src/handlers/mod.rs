//! The request path's own answers, and the router that picks between them, a remote APIService's
//! backend and the core server: [`router`] (kube-aggregator's `handler_proxy.go`), the discovery
//! and OpenAPI documents the gateway serves ([`discovery`]), `/livez`, `/readyz`, `/healthz`
//! ([`health`]), and the APIService table printing of `kubectl get apiservices`
//! ([`apiservice_printing`]). `/metrics` is the router's one-liner over `crate::metrics`.
//!
//! Imports from: the control side (the snapshots it publishes), the backends, and the bottom.

pub mod apiservice_printing;
pub mod discovery;
pub mod health;
pub mod router;
