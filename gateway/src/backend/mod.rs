//! The targets a request can be proxied to: the core server (everything no APIService claims)
//! and, per APIService, a remote aggregated server. Both share `crate::backend::proxy`.

pub mod balance;
pub mod core;
pub mod failures;
pub mod kube_client;
pub mod pool;
pub mod probe;
pub mod proxy;
pub mod remote;
pub mod retry;
pub mod unix;

use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Pool settings shared by every backend client. HTTP/2 pings make a silently dead connection
/// show up in seconds instead of the ~45 s kube-aggregator users run into.
pub fn client_builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .http2_keep_alive_timeout(Duration::from_secs(5))
        .http2_keep_alive_while_idle(true)
        .http2_adaptive_window(true);
    builder
}
