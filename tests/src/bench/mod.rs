//! The benchmark harness behind `src/bin/bench.rs`: what the gateway costs compared with talking
//! to the backend directly, measured in the same run.
//!
//! One run starts, all on loopback ([`setup`]):
//! - two **static backends** ([`backend`], the bench binary's `serve-backend`, each its own
//!   process so its RSS and CPU are its own): one plain HTTP (the gateway's core server, as a
//!   sidecar core on loopback would be), one TLS (for "direct" measurements and as the remote
//!   APIService `v1.bench.example.com`). They answer from prepared bytes ([`documents`]): a small
//!   JSON object, 1 MiB, an aggregated discovery `/apis` with ETag, and watches that send one event
//!   and stay open. The point is the gateway's overhead, so the backend must be cheap;
//! - the **gateway**, started through the e2e harness (`harness::Gateway`), TLS in front;
//! - the **load generator** ([`load`]), in the bench process: hyper client connections (HTTP/1.1
//!   keep-alive, one request in flight per connection, or HTTP/2 with several streams per
//!   connection), a fixed warm-up then a fixed measuring window, every latency kept and sorted for
//!   percentiles.
//!
//! Every proxied figure ([`throughput`], [`watch`]) is measured twice with the same generator, the
//! same client TLS and the same concurrency: against the backend directly (TLS, as a client would
//! reach an API server without the gateway) and through the gateway. The table ([`report`])
//! reports both and their ratio; targets are on ratios or on the gateway's own resources. On a
//! 2-core machine the generator, the gateway and the backend share the CPUs; that is true of the
//! direct run as well, so the ratio is fair, but absolute numbers are lower than a dedicated load
//! machine would show.
//!
//! When `wrk`, `nginx` and `haproxy` are installed, [`peers`] starts nginx and HAProxy on the same
//! backends with the same certificate and measures them beside the gateway with `wrk`, for the
//! fallthrough and remote shapes, in interleaved rounds, with CPU and instructions per request.
//!
//! With the real control plane's binaries given (`KUBEBUILDER_ASSETS`, `SAMPLE_APISERVER`),
//! [`real`] times sample-apiserver and kube-apiserver through the gateway beside kube-apiserver's
//! own aggregator, in the same run.
//!
//! Route-table and discovery rebuilds ([`rebuild`]) are timed in process with the gateway's own
//! `apiservice` types (no sockets). Memory and CPU come from `/proc` ([`memory`]); start-up time is
//! [`ready`]; what hostile clients cost the gateway and everyone else is [`overload`]; what API
//! Priority and Fairness costs per request is [`fairness`].
//!
//! [`openapi`] runs a gateway of its own in front of many remote APIServices with large OpenAPI
//! v2 specs: the merge after one spec changes, serving the cached merge beside the same bytes
//! from the static backend, and the gateway's memory beside the merged document's size.
//!
//! [`authentication`] runs a gateway of its own in front of the fixture core with an
//! `--authentication-config` naming the fixture OIDC issuer: a JWT verified in the gateway beside
//! a token the core reviews (TokenReview), CPU and TokenReviews per request (issue 44).

pub mod authentication;
pub mod backend;
pub mod documents;
pub mod fairness;
pub mod load;
pub mod memory;
pub mod openapi;
pub mod overload;
pub mod peers;
pub mod ready;
pub mod real;
pub mod rebuild;
pub mod report;
pub mod setup;
pub mod soak;
pub mod throughput;
pub mod watch;

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `Accept` (and `Content-Type`) of aggregated discovery.
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The group of the remote APIService the bench registers (`v1.bench.example.com`).
pub const BENCH_GROUP: &str = "bench.example.com";
pub const ONE_MIB: usize = 1 << 20;

/// A byte stream, plain TCP or TLS, boxed so one code path serves both.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How long and how hard one run measures.
pub struct Settings {
    /// The CI smoke mode: every scenario for about a second.
    pub short: bool,
    pub warmup: Duration,
    /// Measuring window per side of a throughput scenario.
    pub duration: Duration,
    pub watch_streams: usize,
    /// Samples per in-process timing.
    pub repeats: usize,
    /// Only the scenarios whose name contains this text.
    pub only: Option<String>,
}

impl Settings {
    pub fn wants(&self, scenario: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| scenario.contains(only))
    }
}

/// The median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `v` rounded to `digits` decimals, for the JSON.
pub fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}
