//! The front door: accepts TCP, completes the TLS handshake (ALPN h2/http1.1, optional client
//! certificate), and serves HTTP/2 or HTTP/1.1 (with upgrades) on each connection, as ALPN chose.
//! The serving configuration is loaded per connection from an `ArcSwap`, so a rotated certificate
//! is used by new connections while open ones carry on.
//!
//! Everything a client controls here is bounded, as kube-apiserver's Go server bounds it:
//! - open connections, by `--max-client-connections` (past it a new connection is closed at once,
//!   which a client sees as a refusal, instead of the process running out of descriptors);
//! - every phase before a request, by the header read timeout: the TLS handshake by a timeout
//!   around it, the first request and any later HTTP/1.1 request head by [`Deadlines`];
//! - idle connections, by [`IDLE_TIMEOUT`] (90 s), and dead HTTP/2 peers by keep-alive pings;
//! - HTTP/2 streams, by `--http2-max-streams-per-connection` (announced in SETTINGS);
//! - request heads, by `--max-header-bytes` in total (not by a count of lines);
//! - each ordinary exchange, writing its response included, by the request timeout: the timeout
//!   layer arms an [`ExchangeDeadline`] that the listener enforces by resetting the HTTP/2 stream
//!   or closing the HTTP/1.1 connection;
//! - what one stalled HTTP/1.1 response holds, by pacing it ([`connection::paced`]);
//! - a connection the gateway closes, by [`connection::LINGER`]: what the client still sends is
//!   drained that long so that it reads the answer instead of a reset ([`Lingering`]).

mod connection;
mod exchange;
mod rare;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use arc_swap::ArcSwap;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::Service;

use crate::backend::proxy::drained;
use crate::body::{Request, Response};
use crate::extensions::ConnInfo;
use crate::front::stack::timeout::ExchangeDeadline;
pub use connection::IDLE_TIMEOUT;
use connection::{ConnState, Deadlines, Lingering, Protocol};
use exchange::Exchanges;
use rare::Rare;

pub struct ListenerSettings {
    pub header_read_timeout: Duration,
    pub max_header_bytes: u32,
    pub http2_max_streams: u32,
    /// Open client connections allowed; 0: half the open-file limit.
    pub max_connections: u32,
}

/// Header lines parsed per HTTP/1.1 request head. kube-apiserver (Go) limits only the head's
/// bytes; hyper must also size its parse array, 100 lines by default, which a client with many
/// `Impersonate-Extra-*` values can exceed. This is far above what clients send, while the byte
/// limit is what binds in practice.
const MAX_HEADER_LINES: usize = 256;

/// What an HTTP/2 client may send on one stream before the gateway reads it: kube-apiserver's
/// `MaxUploadBufferPerStream` (enough for 99 % of API objects in one go).
const HTTP2_STREAM_WINDOW: u32 = 256 * 1024;

struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<StreamExecutor>,
    header_read_timeout: Duration,
}

fn builders(settings: &ListenerSettings) -> Builders {
    let mut h1 = http1::Builder::new();
    // Header deadlines are [`Deadlines`]'s: hyper's own timer would also run while a
    // connection idles between requests, closing it after seconds instead of `IDLE_TIMEOUT`.
    h1.timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_headers(MAX_HEADER_LINES)
        .max_header_size(settings.max_header_bytes as usize)
        .max_buf_size(settings.max_header_bytes.max(8192) as usize)
        .keep_alive(true);
    let mut h2 = http2::Builder::new(StreamExecutor);
    // Pings detect a peer that went away, also between requests (hyper pings idle connections).
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(settings.http2_max_streams)
        .max_header_list_size(settings.max_header_bytes)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    Builders {
        http1: h1,
        http2: h2,
        header_read_timeout: settings.header_read_timeout,
    }
}

/// Runs each HTTP/2 stream in a task of its own under an [`ExchangeDeadline`]: when the deadline
/// the timeout layer armed passes, the stream's future is dropped, which resets the stream and
/// frees its body, its buffers and its in-flight slot, whatever the client's flow-control window.
#[derive(Clone, Copy)]
struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, stream: F) {
        let deadline = ExchangeDeadline::default();
        tokio::spawn(deadline.clone().scope(async move {
            tokio::select! {
                _ = stream => {}
                _ = deadline.expired() => {
                    tracing::debug!("HTTP/2 stream reset: its response was not taken within the request timeout");
                }
            }
        }));
    }
}

/// The open-connection cap, and whether it was reached (logged once per change).
struct ConnectionCap {
    slots: Arc<Semaphore>,
    limit: usize,
    full: AtomicBool,
}

impl ConnectionCap {
    fn new(max: u32) -> Self {
        let limit = match max {
            0 => (open_file_limit() / 2).clamp(64, Semaphore::MAX_PERMITS as u64) as usize,
            n => n as usize,
        };
        ConnectionCap {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            full: AtomicBool::new(false),
        }
    }

    fn admit(&self) -> Option<OwnedSemaphorePermit> {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                if self.full.swap(false, Ordering::Relaxed) {
                    tracing::info!(limit = self.limit, "accepting client connections again");
                }
                Some(permit)
            }
            Err(_) => {
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        limit = self.limit,
                        "open client connections at --max-client-connections: closing new ones at once"
                    );
                }
                None
            }
        }
    }
}

/// The soft limit on open files (`RLIMIT_NOFILE`), which `main` raises to the hard limit.
fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    }
}

/// Accepts until `stop` turns true, then returns the handle that drains open connections.
pub async fn serve<S>(
    listener: TcpListener,
    tls: Arc<ArcSwap<ServerConfig>>,
    service: S,
    settings: ListenerSettings,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown
where
    S: Service<Request, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let builders = Arc::new(builders(&settings));
    let cap = ConnectionCap::new(settings.max_connections);
    tracing::info!(
        max_client_connections = cap.limit,
        http2_max_streams_per_connection = settings.http2_max_streams,
        "listening"
    );
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = drained(&mut stop) => break,
        };
        let Some(permit) = cap.admit() else {
            // Closed before any byte is read: the client's handshake fails at once.
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let conn = Connection {
            tls: tls.load_full(),
            builders: builders.clone(),
            stop: stop.clone(),
            info: ConnInfo::new(remote),
        };
        let watcher = graceful.watcher();
        // The permit goes with the socket, which may linger after the connection ends.
        let tcp = Lingering::new(tcp, permit);
        tokio::spawn(
            conn.serve(tcp, service.clone(), watcher)
                .instrument(tracing::debug_span!("connection", client = %remote)),
        );
    }
    graceful
}

/// Why a connection stops being served as usual before it ends by itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The gateway is shutting down: finish the open exchanges, take no new ones.
    Drain,
    /// Nothing happened on it for [`IDLE_TIMEOUT`].
    Idle,
    /// HTTP/1.1: the exchange in progress outlived its deadline.
    Expired,
}

/// One accepted client connection.
struct Connection {
    tls: Arc<ServerConfig>,
    builders: Arc<Builders>,
    stop: watch::Receiver<bool>,
    info: ConnInfo,
}

/// A client's socket: it holds the connection's place under the cap until it is closed.
type ClientSocket = Lingering<OwnedSemaphorePermit>;

impl Connection {
    async fn serve<S>(
        mut self,
        tcp: ClientSocket,
        service: S,
        // Held to the end: the drain on shutdown waits for this connection.
        _draining_waits_for_us: hyper_util::server::graceful::Watcher,
    ) where
        S: Service<Request, Response = Response, Error = std::convert::Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        let header_read_timeout = self.builders.header_read_timeout;
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        let stream = match tokio::time::timeout(header_read_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake timed out");
                return;
            }
        };
        let tls_conn = stream.get_ref().1;
        self.info.peer_certs = tls_conn.peer_certificates().map(|c| {
            let chain = c.iter().map(|c| c.clone().into_owned()).collect();
            Arc::new(crate::auth::x509::PeerCertificates::new(chain)) as Arc<_>
        });
        // Over TLS, HTTP/2 is only ever chosen by ALPN (RFC 9113 §3.3, and what Go's net/http
        // and so kube-apiserver do); without it the client speaks HTTP/1.1. Not sniffing for
        // a prior-knowledge preface leaves no read without a deadline before the request.
        let protocol = match tls_conn.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        };
        let state = ConnState::new(protocol, header_read_timeout);
        let io = TokioIo::new(Deadlines::new(stream, state.clone()));
        let service = Exchanges::new(service, state.clone(), self.info);
        let mut drain = self.stop;
        let result = match protocol {
            Protocol::Http2 => {
                let conn = self.builders.http2.serve_connection(io, service);
                let mut conn = std::pin::pin!(conn);
                let ended = Rare::new(async {
                    tokio::select! {
                        _ = drained(&mut drain) => Ended::Drain,
                        _ = state.idle_expired() => Ended::Idle,
                    }
                });
                // Biased: the connection first, and the rare events only on their own wake-ups.
                tokio::select! {
                    biased;
                    result = conn.as_mut() => result,
                    ended = ended => {
                        if ended == Ended::Idle {
                            tracing::debug!("closing an idle HTTP/2 connection (GOAWAY)");
                        }
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            }
            Protocol::Http1 => {
                // An HTTP/1.1 connection serves one exchange at a time: the connection is the
                // exchange's task, so its deadline is enforced by closing the connection.
                let deadline = state.exchange().cloned().unwrap_or_default();
                let conn = self
                    .builders
                    .http1
                    .serve_connection(io, service)
                    .with_upgrades();
                let mut conn = std::pin::pin!(conn);
                let ended = Rare::new(async {
                    tokio::select! {
                        _ = drained(&mut drain) => Ended::Drain,
                        _ = state.idle_expired() => Ended::Idle,
                        _ = deadline.expired() => Ended::Expired,
                    }
                });
                let served = deadline.clone().scope(conn.as_mut());
                tokio::select! {
                    biased;
                    result = served => result,
                    ended = ended => match ended {
                        Ended::Drain => {
                            conn.as_mut().graceful_shutdown();
                            deadline.scope(conn).await
                        }
                        Ended::Idle => {
                            tracing::debug!("closing an idle HTTP/1.1 connection");
                            return;
                        }
                        Ended::Expired => {
                            tracing::debug!("HTTP/1.1 connection closed: its response was not taken within the request timeout");
                            return;
                        }
                    }
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}
