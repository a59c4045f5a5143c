//! The end-to-end harness: starts real processes (the gateway binary, the fixture servers, kubectl)
//! and drives them like a user would, with real clients.
//!
//! Design choices worth knowing:
//! - Every child process is a [`Process`]: killed on drop, stdout/stderr captured line by line into
//!   a shared buffer by background threads. When a test panics, each `Process` it owned prints its
//!   logs while being dropped, so a failure shows what the servers said without extra code.
//! - Ports are always OS-assigned (port 0); processes announce their address on a log line that the
//!   harness parses (`listening on 127.0.0.1:PORT` for fixtures, a JSON `serving` event for the
//!   gateway).
//! - Binaries are found next to the running test executable (`target/<profile>/deps/<test>` →
//!   `target/<profile>/<name>`), because `CARGO_BIN_EXE_*` exists only at compile time of integration
//!   tests, not in this library. The gateway lives in another package, so cargo does not build it
//!   for our tests; [`ensure_gateway_built`] runs a nested `cargo build` once per test process (this
//!   does not deadlock: `cargo test` releases the build-directory lock before running tests).
//! - kubectl gets a fresh `HOME`, kubeconfig and `--cache-dir` per [`Kubectl`], because kubectl caches
//!   discovery for 6 hours and a stale cache would hide the requests a test means to exercise.
//! - Waiting is always polling with a deadline ([`wait_until`], [`Process::wait_for_line`]), never a
//!   blind sleep.

use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;

use crate::certs::{install_crypto, root_store, CertError, CertifiedPair};

/// How long a server may take to announce its address before the start counts as failed.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit for one kubectl invocation.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit for one raw HTTP exchange.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors from the harness. Process start failures carry the process's logs so the message alone
/// explains what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("binary not found: {0}")]
    Binary(String),
    #[error("{name} did not start: {reason}\n--- logs of {name} ---\n{logs}--- end of logs ---")]
    Start {
        name: String,
        reason: String,
        logs: String,
    },
    #[error("building the gateway failed: {0}")]
    Build(String),
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("HTTP request to {url} failed: {reason}")]
    Http { url: String, reason: String },
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let context = context.into();
    move |source| HarnessError::Io { context, source }
}

mod binaries;
mod clients;
mod fixtures;
mod gateway;
mod kubectl;
mod process;

pub use binaries::*;
pub use clients::*;
pub use fixtures::*;
pub use gateway::*;
pub use kubectl::*;
pub use process::*;

// ---- waiting ------------------------------------------------------------------------------------

/// Polls `check` every 100 ms until it returns true (→ `true`) or `timeout` passes (→ `false`).
/// The check runs at least once, and once more at the deadline, so a condition that becomes true
/// just in time is not missed.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep((deadline - now).min(Duration::from_millis(100))).await;
    }
}

/// Fails unless `took` (how long a reaction took; `None`: not seen) is at most `bound`.
pub fn assert_within(what: &str, took: Option<Duration>, bound: Duration) {
    match took {
        Some(took) => assert!(
            took <= bound,
            "{what}: took {:.2} s, more than the bound of {:.2} s",
            took.as_secs_f64(),
            bound.as_secs_f64()
        ),
        None => panic!("{what}: not seen at all"),
    }
}

// ---- ports --------------------------------------------------------------------------------------

/// A loopback address where nothing answers, for as long as this value lives: a socket bound to
/// it without listening, so connections are refused. A port found free and released at once
/// would not do in a suite that starts hundreds of servers on port 0: the next one (the gateway
/// under test among them) may be given it. Bound without `SO_REUSEADDR`, no listener can share it
/// and no outgoing connection takes it as its source port.
pub struct RefusingPort {
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl RefusingPort {
    pub fn bind() -> Result<RefusingPort, HarnessError> {
        let io = |source| HarnessError::Io {
            context: "binding a loopback port that refuses connections".into(),
            source,
        };
        let socket = tokio::net::TcpSocket::new_v4().map_err(io)?;
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(io)?;
        let addr = socket.local_addr().map_err(io)?;
        Ok(RefusingPort {
            _socket: socket,
            addr,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_line_is_parsed_nested_and_flat() {
        let nested = r#"{"timestamp":"2025-01-01T00:00:00Z","level":"INFO","fields":{"message":"serving","address":"127.0.0.1:41234","cert_file":"/tmp/x/apiserver.crt"},"target":"aggregation_gateway"}"#;
        let flat = r#"{"level":"INFO","message":"serving","address":"127.0.0.1:41234","cert_file":"/tmp/x/apiserver.crt"}"#;
        let want = ServingInfo {
            address: "127.0.0.1:41234".parse().unwrap(),
            cert_file: "/tmp/x/apiserver.crt".into(),
        };
        assert_eq!(parse_serving_line(nested), Some(want.clone()));
        assert_eq!(parse_serving_line(flat), Some(want));
        assert_eq!(
            parse_serving_line(r#"{"fields":{"message":"starting"}}"#),
            None
        );
        assert_eq!(parse_serving_line("not json"), None);
        assert_eq!(
            parse_serving_line(
                r#"{"fields":{"message":"serving","address":"nope","cert_file":"x"}}"#
            ),
            None
        );
    }

    #[test]
    fn listening_line_is_parsed() {
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:1234"),
            Some((None, addr))
        );
        assert_eq!(
            parse_listening_line("fixture-core listening on https://127.0.0.1:1234/"),
            Some((Some("https"), addr))
        );
        assert_eq!(parse_listening_line("listening on nowhere"), None);
        assert_eq!(parse_listening_line("starting"), None);
    }

    #[tokio::test]
    async fn wait_until_polls_until_true_or_deadline() {
        let start = Instant::now();
        let mut calls = 0;
        assert!(
            wait_until(Duration::from_secs(2), || {
                calls += 1;
                let done = calls >= 3;
                async move { done }
            })
            .await
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(!wait_until(Duration::from_millis(250), || async { false }).await);
    }
}
