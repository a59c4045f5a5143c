//! The front: what every client request crosses before anything is routed. The listener
//! ([`listener`]) accepts TCP, completes TLS and serves HTTP/1.1 or HTTP/2; the tower stack
//! ([`stack`]) logs, audits, traces, authenticates, limits, times out and authorizes each request
//! before handing it to the router (`crate::handlers::router`).
//!
//! Imports from: the handlers (the router, health probes' paths, discovery paths), the control
//! side's snapshots (routing, discovery), the backends (drained streams), and the bottom.

pub mod listener;
pub mod stack;
