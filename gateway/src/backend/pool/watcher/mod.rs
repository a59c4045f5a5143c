//! The connection kept to each endpoint of a routed remote APIService: a watcher that
//! carries no requests, only PINGs.
//!
//! A backend nobody calls has no connection to notice it dying or freezing with; kube-aggregator
//! learns of it at its next check, up to 30 s later. The pool's own connections cannot be the
//! kept one: a backend closes those after some requests (kube-apiserver's `--goaway-chance`, an
//! anonymous caller), and after each close nothing would watch until the next check dialed
//! again. A connection that never carries a request is never closed for that, so each endpoint
//! always has one, pinged at the APIService's `http2-ping-interval`/`-timeout` (hyper sends a
//! PING only after an interval without reading anything: one PING per interval).
//!
//! An endpoint that speaks no HTTP/2 gets an idle HTTP/1.1 connection instead, probed once per
//! PING interval ([`http1`]).
//!
//! What it reports (`failures`) is a change of state, not each attempt: the connection closed
//! without GOAWAY, reset, or a PING unanswered (the process died, restarted or froze), a dial
//! failing after a GOAWAY, and later the endpoint answering again. Each re-checks the
//! APIServices' availability and fetches their discovery at once. A GOAWAY on the watcher (a
//! backend closing idle connections, or one shutting down) is dialed again quietly, with a
//! backoff, so a backend that keeps closing it costs a dial every few seconds and no checks.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;
use http::uri::Authority;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;

mod http1;

use super::super::failures::FailureSignal;
use super::connect::{dial, Dialed};
use super::goaway::GoAwayWatch;
use super::Connector;
use crate::body::Body;

/// The first wait before dialing again after the backend closed the kept connection; it doubles
/// up to [`MAX_BACKOFF`], so a backend that keeps closing it costs a dial every few seconds.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often an endpoint that failed is dialed until it answers: its return is seen within this
/// (well inside the 2 s a returning backend has to be served again in), for one refused or
/// unanswered dial per second while it is down.
const DOWN_REDIAL: Duration = Duration::from_secs(1);
/// A connection that lived this long resets the backoff: the backend is not churning it.
const STABLE: Duration = Duration::from_secs(10);

/// How the kept connection is pinged.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pings {
    pub(super) interval: Duration,
    pub(super) timeout: Duration,
}

/// The task keeping one endpoint's connection; stopped when dropped.
pub(super) struct Watcher {
    task: tokio::task::JoinHandle<()>,
    /// Cleared when the connection failed (see the module docs), set when one is up again.
    responsive: Arc<AtomicBool>,
}

// === impl Watcher ===

impl Watcher {
    /// Starts watching `endpoint`, just found passing its availability check. `connector`'s
    /// connections report to nobody: this task reports, once per change.
    pub(super) fn start(
        connector: Connector,
        failures: Arc<FailureSignal>,
        endpoint: Authority,
        pings: Pings,
    ) -> Self {
        let responsive = Arc::new(AtomicBool::new(true));
        let state = State {
            endpoint,
            failures,
            responsive: responsive.clone(),
            reachable: true,
        };
        let task = tokio::spawn(watch(connector, pings, state));
        Self { task, responsive }
    }

    /// Whether the endpoint's last kept connection failed and none is up again: a request
    /// whose connection to it broke is not sent to it again.
    pub(super) fn unresponsive(&self) -> bool {
        !self.responsive.load(Ordering::Acquire)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watcher last told.
struct State {
    endpoint: Authority,
    failures: Arc<FailureSignal>,
    responsive: Arc<AtomicBool>,
    /// As reported: starts as the passed check found it.
    reachable: bool,
}

impl State {
    fn up(&mut self) {
        self.responsive.store(true, Ordering::Release);
        if !std::mem::replace(&mut self.reachable, true) {
            tracing::info!(endpoint = %self.endpoint, "backend endpoint answers again");
            self.failures.report("kept connection up again");
        }
    }

    fn down(&mut self, what: &'static str, detail: &str) {
        self.responsive.store(false, Ordering::Release);
        if std::mem::replace(&mut self.reachable, false) {
            tracing::warn!(
                endpoint = %self.endpoint,
                error = detail,
                "{what}; re-checking the backend's availability and discovery"
            );
            self.failures.report(what);
        }
    }
}

/// How one kept connection ended.
enum Ended {
    /// The backend sent GOAWAY: it is done with the connection, maybe not alive.
    GoAway,
    /// An HTTP/1.1 connection closed with no request on it: the same as GOAWAY.
    Closed,
    Failed(&'static str, String),
}

/// The waits between dials: [`MIN_BACKOFF`] doubling up to [`MAX_BACKOFF`].
fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

async fn watch(connector: Connector, pings: Pings, mut state: State) {
    let mut delays = backoff();
    loop {
        let since = Instant::now();
        let ended = watch_once(&connector, pings, &mut state).await;
        if since.elapsed() >= STABLE {
            delays = backoff();
        }
        let wait = match ended {
            Ended::GoAway | Ended::Closed => {
                tracing::debug!(endpoint = %state.endpoint, "kept connection closed by the backend");
                delays.next().unwrap_or(MAX_BACKOFF)
            }
            Ended::Failed(what, detail) => {
                state.down(what, &detail);
                DOWN_REDIAL
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Dials one connection and drives it until it ends.
async fn watch_once(connector: &Connector, pings: Pings, state: &mut State) -> Ended {
    let io = match dial(connector, &state.endpoint).await {
        Ok(Dialed::Http2(io)) => *io,
        Ok(Dialed::Http1(io)) => return http1::watch(io, pings, state).await,
        Err(e) => return Ended::Failed("kept connection could not be made", e.to_string()),
    };
    let (io, goaway) = GoAwayWatch::new(TokioIo::new(io));
    let handshake = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // SETTINGS received replace it: how this connection knows the backend answered.
        .initial_max_send_streams(0)
        .keep_alive_interval(pings.interval)
        .keep_alive_timeout(pings.timeout)
        .keep_alive_while_idle(true)
        .handshake::<_, Body>(TokioIo::new(io))
        .await;
    // `send` stays alive while the connection is driven: hyper closes a connection nobody
    // can send on.
    let (_send, mut connection) = match handshake {
        Ok(handshake) => handshake,
        Err(e) => return Ended::Failed("kept connection could not be made", e.to_string()),
    };
    let mut answered = false;
    let driven = poll_fn(|cx| {
        let polled = connection.poll_unpin(cx);
        if !answered && connection.current_max_send_streams() > 0 {
            answered = true;
            state.up();
        }
        polled
    })
    .await;
    match driven {
        Err(e) => Ended::Failed(
            "kept connection failed (PING unanswered or reset)",
            e.to_string(),
        ),
        Ok(()) if goaway.seen() => Ended::GoAway,
        Ok(()) => Ended::Failed(
            "kept connection closed without GOAWAY",
            "the backend closed it".to_owned(),
        ),
    }
}
