//! One HTTP/2 connection to a backend: dialing it (TLS, ALPN), waiting for the stream limit its
//! server announces before it takes streams, and the task that drives it.

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use http::uri::Authority;
use http::Uri;
use hyper::client::conn::http2;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;
use tower::ServiceExt;

use super::super::failures::WatchedStream;
use super::goaway::{GoAwaySeen, GoAwayWatch};
use super::{lock, Connector, H2Connection, PoolError, Shared, DIAL_TIMEOUT, SETTINGS_WAIT};

use crate::body::Body;

/// An HTTP/2 connection of the pool, with the streams it carries.
pub(super) struct H2Conn {
    pub(super) id: u64,
    pub(super) send: http2::SendRequest<Body>,
    /// Polled by its own task; read here for the server's current stream limit. The task
    /// takes it out when the connection ends: that drops hyper's dispatcher, so `send` reports
    /// itself closed instead of accepting requests nobody will send.
    connection: Arc<Mutex<Option<H2Connection>>>,
    pub(super) streams: usize,
    pub(super) idle_since: Instant,
    /// The backend refused a stream on this connection: no new streams go to it, and it is
    /// dropped once its last stream ends.
    pub(super) retired: bool,
    /// The backend sent GOAWAY on it: the same as `retired` (see `goaway`).
    pub(super) goaway: Arc<GoAwaySeen>,
}

// === impl H2Conn ===

impl H2Conn {
    pub(super) fn limit(&self) -> usize {
        current_max_send_streams(&self.connection)
    }

    /// Whether the backend is done with this connection: it refused a stream or sent GOAWAY.
    pub(super) fn going_away(&self) -> bool {
        self.retired || self.goaway.seen()
    }
}

pub(super) enum Connected {
    Http2(H2Conn),
    /// The server did not pick `h2`.
    Http1,
}

/// A dialed TLS connection. Boxed: its state is large, and dialing is rare.
pub(super) type DialedIo = Box<MaybeHttpsStream<TokioIo<WatchedStream>>>;

/// What dialing an endpoint gave: a TLS connection that picked `h2`, or one that did not.
pub(super) enum Dialed {
    Http2(DialedIo),
    /// The server did not pick `h2`: the connection speaks HTTP/1.1.
    Http1(DialedIo),
}

/// Dials `endpoint` (TCP and TLS, within [`DIAL_TIMEOUT`]).
pub(super) async fn dial(connector: &Connector, endpoint: &Authority) -> Result<Dialed, PoolError> {
    let uri = Uri::builder()
        .scheme("https")
        .authority(endpoint.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| PoolError::Connect(e.into()))?;
    // The TCP connect has its own 5 s limit; this one bounds the TLS handshake too, which a
    // frozen process (accepting in the kernel, answering nothing) would otherwise hold forever.
    let io = tokio::time::timeout(DIAL_TIMEOUT, connector.clone().oneshot(uri))
        .await
        .map_err(|_| {
            PoolError::Connect(
                format!("no TLS connection within {}s", DIAL_TIMEOUT.as_secs()).into(),
            )
        })?
        .map_err(PoolError::Connect)?;
    if io.connected().is_negotiated_h2() {
        Ok(Dialed::Http2(Box::new(io)))
    } else {
        Ok(Dialed::Http1(Box::new(io)))
    }
}

/// Dials `endpoint`, and for an `h2` connection, waits for the server's settings (its stream
/// limit) before the connection takes streams.
pub(super) async fn connect(
    connector: &Connector,
    shared: &Arc<Shared>,
    endpoint: &Authority,
) -> Result<Connected, PoolError> {
    let io = match dial(connector, endpoint).await? {
        Dialed::Http2(io) => *io,
        Dialed::Http1(_) => return Ok(Connected::Http1),
    };
    let (io, goaway) = GoAwayWatch::new(TokioIo::new(io));
    let io = TokioIo::new(io);
    let (interval, timeout) = shared.settings.request_pings();
    let (send, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // Until the server's SETTINGS arrive no stream may open: 0 here marks "not yet known"
        // (h2 replaces it with the announced limit, or unlimited when none is announced).
        .initial_max_send_streams(0)
        .keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true)
        .adaptive_window(true)
        .handshake(io)
        .await
        .map_err(|e| PoolError::Connect(e.into()))?;
    let connection = Arc::new(Mutex::new(Some(connection)));
    tokio::spawn({
        let connection = connection.clone();
        let pool = Arc::downgrade(shared);
        let endpoint = endpoint.clone();
        async move {
            let driven = poll_fn(|cx| {
                let mut slot = lock(&connection);
                let Some(driving) = slot.as_mut() else {
                    return Poll::Ready(Ok(()));
                };
                let ended = std::task::ready!(driving.poll_unpin(cx));
                *slot = None;
                Poll::Ready(ended)
            })
            .await;
            let Some(pool) = pool.upgrade() else { return };
            if let Err(e) = driven {
                tracing::debug!(%endpoint, error = %e, "backend connection ended");
                // A PING unanswered (hyper drops the socket without a read or write failing,
                // so `failures::Watched` does not see it) or an HTTP/2 protocol error.
                pool.failures.report("connection failed");
            }
        }
    });
    // hyper shows the limit but signals no event when the SETTINGS frame is read: look at it
    // until it is known (once per connection, usually within one round trip).
    let settled = async {
        while current_max_send_streams(&connection) == 0 {
            if send.is_closed() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    };
    match tokio::time::timeout(SETTINGS_WAIT, settled).await {
        Ok(true) => {}
        Ok(false) => {
            return Err(PoolError::Connect(
                "the backend closed the connection".into(),
            ))
        }
        Err(_) => {
            return Err(PoolError::Connect(
                format!(
                    "no HTTP/2 settings from the backend within {}s",
                    SETTINGS_WAIT.as_secs()
                )
                .into(),
            ))
        }
    }
    Ok(Connected::Http2(H2Conn {
        id: shared.next_id.fetch_add(1, Ordering::Relaxed),
        send,
        connection,
        streams: 0,
        idle_since: Instant::now(),
        retired: false,
        goaway,
    }))
}

/// The stream limit the server announced; 0 before it did and after the connection ended.
pub(super) fn current_max_send_streams(connection: &Mutex<Option<H2Connection>>) -> usize {
    lock(connection)
        .as_ref()
        .map_or(0, H2Connection::current_max_send_streams)
}
