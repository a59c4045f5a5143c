//! What the proxy sees of a backend dying, told to the availability controller at once.
//!
//! kube-aggregator learns that a backend is gone only from its next availability check, up to
//! its 30 s resync later. The gateway is in a better place: it holds connections to every
//! backend. So a remote backend's traffic connections report ([`FailureSignal`]):
//! * a connection that could not be made (refused, unreachable, TLS refused);
//! * a request that failed in transport (reset, closed mid-response);
//! * a pooled connection the backend closed or reset, seen when it happens, not at the next
//!   request: the process behind it may have died ([`Watched`]);
//! * a pooled connection whose HTTP/2 PING went unanswered: the process may be frozen;
//! * the connection kept to each endpoint of every routed Service, which carries no requests
//!   (`pool::watcher`): closed without GOAWAY, reset, a PING unanswered, a re-dial failing, and
//!   its return; once per change, so this holds with no traffic at all.
//!
//! Besides the availability controller, others may listen ([`FailureSignal::listen`]): the
//! discovery controller re-fetches the Service's discovery at once on a failure (not on a plain
//! close, which a backend sending GOAWAY after each request would turn into a fetch loop), so a
//! frozen backend goes `Stale` without waiting for its availability check to time out first.
//!
//! A report only asks for a re-check of the APIService; the check decides. So a report that
//! means nothing (a backend closing an idle connection, a tunnel ending) costs one probe and
//! punishes nobody, and reports are rate-limited per backend so a flood of failing requests
//! is not a flood of messages.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::workqueue::Queue;

/// What a connection the backend closed (end of stream) is reported as.
pub const CLOSED: &str = "closed by the backend";

/// Connection failures of one backend Service's connections, for the availability
/// controller's queue. The connections are shared by every APIService that names the Service
/// (see `pool`), so a failure asks for a re-check of each of them.
pub struct FailureSignal {
    api_services: Mutex<Vec<Arc<str>>>,
    reports: OnceLock<Reports>,
    /// Other loops told of each report, by who listens (one entry each, replaced).
    listeners: Mutex<Vec<(&'static str, Listener)>>,
}

/// What a listener does with a report: mark its own key dirty.
pub type Listener = Arc<dyn Fn() + Send + Sync>;

struct Reports {
    queue: Queue<String>,
    last: Mutex<Option<Instant>>,
}

impl FailureSignal {
    /// At most one report per this interval per Service: the queue de-duplicates anyway.
    pub const EVERY: Duration = Duration::from_millis(200);

    /// A signal for no APIService yet, reporting nowhere until [`FailureSignal::report_to`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            api_services: Mutex::new(Vec::new()),
            reports: OnceLock::new(),
            listeners: Mutex::new(Vec::new()),
        })
    }

    /// `api_service` sends on these connections: failures re-check it too.
    pub fn add_api_service(&self, api_service: &Arc<str>) {
        let mut names = self.api_services.lock().unwrap_or_else(|e| e.into_inner());
        if !names.contains(api_service) {
            names.push(api_service.clone());
        }
    }

    /// One APIService sending on these connections (what an endpoint probe checks).
    pub fn first_api_service(&self) -> Option<Arc<str>> {
        self.api_services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first()
            .cloned()
    }

    /// From now on, failures ask `queue` to re-check the APIServices (set once).
    pub fn report_to(&self, queue: Queue<String>) {
        let _ = self.reports.set(Reports {
            queue,
            last: Mutex::new(None),
        });
    }

    /// Reports of failures (not of a connection the backend merely closed) also call
    /// `listener`; a second listener named `who` replaces the first (a loop that subscribes
    /// again on every change of its inputs holds one entry).
    pub fn listen(&self, who: &'static str, listener: Listener) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        listeners.retain(|(name, _)| *name != who);
        listeners.push((who, listener));
    }

    /// Asks for a re-check because of `what`, unless one was asked for within [`Self::EVERY`];
    /// tells the listeners of every failure but [`CLOSED`] (their queues de-duplicate).
    pub fn report(&self, what: &'static str) {
        let Some(reports) = self.reports.get() else {
            return;
        };
        if what != CLOSED {
            // A backend closing a connection may only be done with it (a GOAWAY, an idle
            // timeout): the availability check tells, and its result reaches the listeners.
            let listeners: Vec<Listener> = self
                .listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(_, l)| l.clone())
                .collect();
            for listener in listeners {
                listener();
            }
        }
        let now = Instant::now();
        let Ok(mut last) = reports.last.try_lock() else {
            return; // another connection is reporting right now
        };
        if last.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            return;
        }
        *last = Some(now);
        let names = self
            .api_services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for name in names {
            tracing::debug!(
                apiservice = %name,
                what,
                "backend connection failed; re-checking availability"
            );
            reports.queue.add(name.to_string());
        }
    }
}

// === impl Watched ===

/// An `HttpConnector` whose connections report failures: connects that fail, and connections
/// the backend closes or resets. `None` reports nothing (e.g. upgrade tunnels, which end
/// whenever the session does).
#[derive(Clone)]
pub struct Watched {
    inner: HttpConnector,
    signal: Option<Arc<FailureSignal>>,
}

impl Watched {
    pub fn new(inner: HttpConnector, signal: Option<Arc<FailureSignal>>) -> Self {
        Self { inner, signal }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Uri> for Watched {
    type Response = TokioIo<WatchedStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let signal = self.signal.clone();
        Box::pin(async move {
            match connecting.await {
                Ok(io) => Ok(TokioIo::new(WatchedStream {
                    inner: io.into_inner(),
                    signal,
                })),
                Err(e) => {
                    if let Some(signal) = &signal {
                        signal.report("connect failed");
                    }
                    Err(e.into())
                }
            }
        })
    }
}

/// A backend connection that reports its end when the backend ends it: end of stream or an
/// error while reading, an error while writing. Once per connection.
pub struct WatchedStream {
    inner: TcpStream,
    signal: Option<Arc<FailureSignal>>,
}

impl WatchedStream {
    fn ended(&mut self, what: &'static str) {
        if let Some(signal) = self.signal.take() {
            signal.report(what);
        }
    }
}

impl Connection for WatchedStream {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.ended(CLOSED)
            }
            Poll::Ready(Err(_)) => self.ended("read failed"),
            _ => {}
        }
        polled
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &polled {
            self.ended("write failed");
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Err(_)) = &polled {
            self.ended("write failed");
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // We are closing it: whatever the backend does next is not news.
        self.signal = None;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
