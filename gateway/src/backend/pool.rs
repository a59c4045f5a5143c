//! Connections to one backend Service, shared by every APIService that names it, with as many
//! HTTP/2 connections as the backend's stream limit asks for.
//!
//! *Per Service.* kube-aggregator caches its transports by TLS settings, so APIServices on one
//! Service share connections. One pool per APIService opened 4008 connections (300 MiB) for
//! 1000 APIServices on one Service; here the pool's key is what makes connections
//! interchangeable: the Service (namespace, name, port) and how it is trusted (`caBundle`,
//! `insecureSkipTLSVerify`; the server name follows from the Service). The proxy client
//! certificate is the same for every pool; the route controller starts new pools when it rotates.
//!
//! *Stream limits.* hyper-util's pooled client keeps one HTTP/2 connection per address and queues
//! every request beyond the server's `SETTINGS_MAX_CONCURRENT_STREAMS` on it, with no deadline:
//! with 250 watches open on a Go backend, the next `kubectl get` of that group waits for one of
//! them to end. Here a connection carries streams up to the limit its server announced; when
//! every connection is full another one is opened (at most [`PoolSettings::max_connections`] per
//! endpoint), and a request that still finds no free stream within
//! [`PoolSettings::stream_wait`] fails with [`PoolError::Exhausted`] (a 503 naming the
//! APIService) instead of waiting forever. Busy connections are also spread: past
//! [`BUSY_STREAMS`] streams a second connection is opened, since one connection is driven by one
//! task and shares one flow-control window (kubernetes#60042).
//!
//! HTTP/1.1 (upgrades, and backends that do not offer `h2`) stays on hyper-util's pooled
//! client, which opens a connection per concurrent request anyway.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use http::uri::Authority;
use http::{Uri, Version};
use hyper::client::conn::http2;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt;

use super::failures::{FailureSignal, Watched, WatchedStream};
use super::probe::Probe;
use super::resend::{refused_unprocessed, resendable, MAX_ATTEMPTS};
use crate::body::{self, Body, BoxError, Request};

/// Dials with TLS over TCP connections that report their failures (see `failures`).
pub type Connector = HttpsConnector<Watched>;
pub type HttpsClient = Client<Connector, Body>;
type H2Connection =
    http2::Connection<MaybeHttpsStream<TokioIo<WatchedStream>>, Body, TokioExecutor>;

/// Streams on the least busy connection before another one is opened beside it.
pub const BUSY_STREAMS: usize = 32;
/// How long an unused connection stays open (as `backend::client_builder`'s idle timeout).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a new connection may take to announce its settings before it counts as failed.
const SETTINGS_WAIT: Duration = Duration::from_secs(5);

/// The bounds of one pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// HTTP/2 connections per endpoint of the Service (64 × a Go backend's 250 streams = 16 000
    /// concurrent requests).
    pub max_connections: usize,
    /// How long a request waits for a free stream when every connection is full.
    pub stream_wait: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 64,
            stream_wait: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No connection could be made (refused, TLS refused, no HTTP/2 settings): the backend may
    /// be gone.
    #[error("{0}")]
    Connect(#[source] BoxError),
    #[error(transparent)]
    Http1(hyper_util::client::legacy::Error),
    #[error(transparent)]
    Http2(hyper::Error),
    #[error(
        "all {connections} connections to {endpoint} carry the backend's limit of concurrent \
         streams ({streams} in flight) and none became free within {}s; the backend serves too \
         many long-running requests (watches) or should allow more streams per connection",
        .waited.as_secs()
    )]
    Exhausted {
        endpoint: Authority,
        connections: usize,
        streams: usize,
        waited: Duration,
    },
    /// Other requests' attempts to connect kept failing or hanging while this one waited.
    #[error("no connection to {endpoint} could be made within {}s", .waited.as_secs())]
    NoConnection {
        endpoint: Authority,
        waited: Duration,
    },
}

impl PoolError {
    /// Whether the request failed before reaching the backend because no connection could be
    /// made (what asks the availability controller for a re-check).
    pub fn is_connect(&self) -> bool {
        match self {
            Self::Connect(_) | Self::NoConnection { .. } => true,
            Self::Http1(e) => e.is_connect(),
            Self::Http2(_) | Self::Exhausted { .. } => false,
        }
    }
}

/// The connections to one backend Service; see the module documentation.
pub struct ServiceConnections {
    /// Offers `h2` and `http/1.1`; what the server picks decides which client a request uses.
    connector: Connector,
    /// HTTP/1.1 only: upgrades, and every request to an endpoint that did not pick `h2`.
    http1: HttpsClient,
    shared: Arc<Shared>,
    /// The availability probe's own connections to the same Service: a pool full of streams
    /// never starves it (see `probe`).
    probe: Probe,
    /// Where this Service's connections report their failures (see `failures`).
    failures: Arc<FailureSignal>,
}

struct Shared {
    endpoints: Mutex<HashMap<Authority, Endpoint>>,
    /// Signalled whenever a stream is freed or a connection is added or fails: waiting requests
    /// look again.
    changed: Notify,
    settings: PoolSettings,
    next_id: AtomicU64,
}

/// The connections to one resolved address of the Service (one Pod with
/// `--enable-aggregator-routing`, the ClusterIP otherwise).
#[derive(Default)]
struct Endpoint {
    connections: Vec<H2Conn>,
    /// Connections being made for requests that found no free stream.
    connecting: usize,
    /// Requests waiting for a free stream.
    waiting: usize,
    /// The endpoint did not pick `h2`: every request goes over HTTP/1.1.
    http1: bool,
}

struct H2Conn {
    id: u64,
    send: http2::SendRequest<Body>,
    /// Polled by its own task; read here for the server's current stream limit. The task
    /// takes it out when the connection ends: that drops hyper's dispatcher, so `send` reports
    /// itself closed instead of accepting requests nobody will send.
    connection: Arc<Mutex<Option<H2Connection>>>,
    streams: usize,
    idle_since: Instant,
    /// The backend said it is closing this connection (GOAWAY): no new streams go to it, and
    /// it is dropped once its last stream ends.
    retired: bool,
}

// === impl ServiceConnections ===

impl ServiceConnections {
    /// `connector` must offer `h2` and `http/1.1`; `http1` speaks HTTP/1.1 only; `failures`
    /// is the signal `connector`'s connections report to.
    pub fn new(
        connector: Connector,
        http1: HttpsClient,
        probe: Probe,
        failures: Arc<FailureSignal>,
        settings: PoolSettings,
    ) -> Self {
        let shared = Arc::new(Shared {
            endpoints: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            settings,
            next_id: AtomicU64::new(0),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_idle(Arc::downgrade(&shared)));
        }
        Self {
            connector,
            http1,
            shared,
            probe,
            failures,
        }
    }

    /// The availability probe's connections.
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// The failure signal of these connections.
    pub fn failures(&self) -> &Arc<FailureSignal> {
        &self.failures
    }

    /// The HTTP/1.1 client, for upgrades.
    pub fn http1(&self) -> &HttpsClient {
        &self.http1
    }

    /// Sends `req` (an absolute `https://` URI) on a free HTTP/2 stream to its endpoint, or over
    /// HTTP/1.1 when the endpoint does not speak HTTP/2. The stream counts as busy until the
    /// response body is finished or dropped.
    ///
    /// A safe request with no body that the backend refused unprocessed (a stream above the
    /// last one its GOAWAY accepted, or reset with REFUSED_STREAM) is sent again on another
    /// connection, as Go's transport does for kube-aggregator: a Go server closing a busy
    /// connection gracefully otherwise turns every request in flight on it into a 503.
    pub async fn send(&self, req: Request) -> Result<http::Response<Body>, PoolError> {
        let mut again = resendable(&req);
        let mut req = req;
        for attempt in 1.. {
            match self.send_once(req).await {
                Err(Attempt::Refused(e)) if attempt < MAX_ATTEMPTS => match again.take() {
                    Some(copy) => {
                        tracing::debug!(error = %e, attempt, "backend refused the stream unprocessed; sending again");
                        again = resendable(&copy);
                        req = copy;
                    }
                    None => return Err(PoolError::Http2(e)),
                },
                Err(Attempt::Refused(e)) => return Err(PoolError::Http2(e)),
                Err(Attempt::Failed(e)) => return Err(e),
                Ok(resp) => return Ok(resp),
            }
        }
        unreachable!("the loop returns on its last attempt")
    }

    async fn send_once(&self, mut req: Request) -> Result<http::Response<Body>, Attempt> {
        let endpoint = req
            .uri()
            .authority()
            .cloned()
            .ok_or_else(|| PoolError::Connect("the request names no backend address".into()))?;
        let Some(stream) = self.stream(&endpoint).await? else {
            return Ok(self.send_http1(req).await?);
        };
        *req.version_mut() = Version::HTTP_2;
        let mut send = stream.send.clone();
        match send.send_request(req).await {
            Ok(resp) => Ok(resp.map(|b| body::with_guard(b, stream))),
            Err(e) if refused_unprocessed(&e) => {
                // No new streams go to a connection that is going away.
                stream.retire();
                Err(Attempt::Refused(e))
            }
            Err(e) => Err(Attempt::Failed(PoolError::Http2(e))),
        }
    }

    /// Sends `req` over HTTP/1.1 whatever the endpoint speaks: for anonymous callers, whom a
    /// k8s.io/apiserver backend answers on HTTP/2 with a GOAWAY for the whole connection (see
    /// `backend::core::Clients`).
    pub async fn send_http1(&self, req: Request) -> Result<http::Response<Body>, PoolError> {
        let resp = self.http1.request(req).await.map_err(PoolError::Http1)?;
        Ok(resp.map(body::boxed))
    }

    /// A free stream on a connection to `endpoint`, or `None` when the endpoint speaks HTTP/1.1
    /// only. Opens a connection when every one is full (or busy, see [`BUSY_STREAMS`]), and
    /// waits at most `stream_wait` for a stream when none may be opened.
    async fn stream(&self, endpoint: &Authority) -> Result<Option<Stream>, PoolError> {
        let shared = &self.shared;
        let deadline = Instant::now() + shared.settings.stream_wait;
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let must_connect = {
                let mut endpoints = shared.lock();
                let ep = endpoints.entry(endpoint.clone()).or_default();
                if ep.http1 {
                    return Ok(None);
                }
                ep.close_unused();
                let total = ep.connections.len() + ep.connecting;
                let room_for_more = total < shared.settings.max_connections;
                if let Some(busy) = ep.least_busy_with_room().map(|c| c.streams) {
                    if busy >= BUSY_STREAMS && room_for_more && ep.connecting == 0 {
                        // Spread the load; this request does not wait for it.
                        ep.connecting += 1;
                        let pool = self.spread();
                        let endpoint = endpoint.clone();
                        tokio::spawn(async move { pool.add_connection(&endpoint).await });
                    }
                    if let Some(conn) = ep.least_busy_with_room() {
                        return Ok(Some(Stream::take(conn, shared, endpoint)));
                    }
                }
                // Every connection is full. Open one more, unless enough are already on their
                // way for the requests waiting (one for each `limit` of them).
                let limit = ep.learned_limit();
                let needed =
                    ep.connecting == 0 || ep.waiting >= ep.connecting.saturating_mul(limit);
                if room_for_more && needed {
                    ep.connecting += 1;
                    true
                } else {
                    if Instant::now() >= deadline {
                        let waited = shared.settings.stream_wait;
                        return Err(match ep.connections.len() {
                            0 => PoolError::NoConnection {
                                endpoint: endpoint.clone(),
                                waited,
                            },
                            connections => PoolError::Exhausted {
                                endpoint: endpoint.clone(),
                                connections,
                                streams: ep.connections.iter().map(|c| c.streams).sum(),
                                waited,
                            },
                        });
                    }
                    ep.waiting += 1;
                    false
                }
            };
            if must_connect {
                let connecting = Counted::new(shared, endpoint, Count::Connecting);
                let connected = self.connect(endpoint).await;
                let mut endpoints = shared.lock();
                let ep = endpoints.entry(endpoint.clone()).or_default();
                connecting.release(ep);
                shared.changed.notify_waiters();
                match connected? {
                    Connected::Http1 => {
                        ep.http1 = true;
                        return Ok(None);
                    }
                    Connected::Http2(conn) => {
                        ep.connections.push(conn);
                        if let Some(conn) = ep.least_busy_with_room() {
                            return Ok(Some(Stream::take(conn, shared, endpoint)));
                        }
                    }
                }
                continue;
            }
            let waiting = Counted::new(shared, endpoint, Count::Waiting);
            let woken = tokio::time::timeout_at(deadline, changed).await;
            drop(waiting);
            if woken.is_err() {
                // One last look (a stream may have been freed just now); the loop answers with
                // `Exhausted` if there is still none.
                continue;
            }
        }
    }

    /// A handle for a background task that adds a connection (see [`Self::add_connection`]).
    fn spread(&self) -> Spread {
        Spread {
            connector: self.connector.clone(),
            shared: self.shared.clone(),
        }
    }

    async fn connect(&self, endpoint: &Authority) -> Result<Connected, PoolError> {
        connect(&self.connector, &self.shared, endpoint).await
    }
}

/// Adds a connection beside busy ones, without a request waiting for it.
struct Spread {
    connector: Connector,
    shared: Arc<Shared>,
}

impl Spread {
    /// The caller counted this connection in `connecting`.
    async fn add_connection(self, endpoint: &Authority) {
        let connecting = Counted::new(&self.shared, endpoint, Count::Connecting);
        let connected = connect(&self.connector, &self.shared, endpoint).await;
        let mut endpoints = self.shared.lock();
        let ep = endpoints.entry(endpoint.clone()).or_default();
        connecting.release(ep);
        match connected {
            Ok(Connected::Http2(conn)) => ep.connections.push(conn),
            Ok(Connected::Http1) => ep.http1 = true,
            Err(e) => tracing::debug!(%endpoint, error = %e, "could not open another connection"),
        }
        drop(endpoints);
        self.shared.changed.notify_waiters();
    }
}

enum Connected {
    Http2(H2Conn),
    /// The server did not pick `h2`.
    Http1,
}

/// Dials `endpoint`, and for an `h2` connection, waits for the server's settings (its stream
/// limit) before the connection takes streams.
async fn connect(
    connector: &Connector,
    shared: &Shared,
    endpoint: &Authority,
) -> Result<Connected, PoolError> {
    let uri = Uri::builder()
        .scheme("https")
        .authority(endpoint.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| PoolError::Connect(e.into()))?;
    let io = connector
        .clone()
        .oneshot(uri)
        .await
        .map_err(PoolError::Connect)?;
    if !io.connected().is_negotiated_h2() {
        return Ok(Connected::Http1);
    }
    let (send, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // Until the server's SETTINGS arrive no stream may open: 0 here marks "not yet known"
        // (h2 replaces it with the announced limit, or unlimited when none is announced).
        .initial_max_send_streams(0)
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .adaptive_window(true)
        .handshake(io)
        .await
        .map_err(|e| PoolError::Connect(e.into()))?;
    let connection = Arc::new(Mutex::new(Some(connection)));
    tokio::spawn({
        let connection = connection.clone();
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
            if let Err(e) = driven {
                tracing::debug!(error = %e, "backend connection ended");
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
    }))
}

/// Every 30 s, closes connections unused for [`IDLE_TIMEOUT`]; ends with the pool.
async fn close_idle(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut endpoints = shared.lock();
        for ep in endpoints.values_mut() {
            ep.close_unused();
        }
        endpoints.retain(|_, ep| !ep.connections.is_empty() || ep.connecting + ep.waiting > 0);
    }
}

/// The stream limit the server announced; 0 before it did and after the connection ended.
fn current_max_send_streams(connection: &Mutex<Option<H2Connection>>) -> usize {
    lock(connection)
        .as_ref()
        .map_or(0, H2Connection::current_max_send_streams)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How one send ended when it did not answer.
enum Attempt {
    /// The backend refused the stream without processing it.
    Refused(hyper::Error),
    Failed(PoolError),
}

impl From<PoolError> for Attempt {
    fn from(e: PoolError) -> Self {
        Attempt::Failed(e)
    }
}

// === impl Shared ===

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<Authority, Endpoint>> {
        lock(&self.endpoints)
    }
}

// === impl Endpoint ===

impl Endpoint {
    /// Drops closed connections and those unused for [`IDLE_TIMEOUT`].
    fn close_unused(&mut self) {
        self.connections.retain(|c| {
            !c.send.is_closed()
                && (c.streams > 0 || (!c.retired && c.idle_since.elapsed() < IDLE_TIMEOUT))
        });
    }

    fn least_busy_with_room(&mut self) -> Option<&mut H2Conn> {
        self.connections
            .iter_mut()
            .filter(|c| !c.send.is_closed() && !c.retired && c.streams < c.limit())
            .min_by_key(|c| c.streams)
    }

    /// The stream limit its connections announced (servers announce one value), 100 (what
    /// RFC 9113 recommends at least) before any did.
    fn learned_limit(&self) -> usize {
        self.connections
            .iter()
            .map(H2Conn::limit)
            .max()
            .unwrap_or(100)
            .max(1)
    }
}

// === impl H2Conn ===

impl H2Conn {
    fn limit(&self) -> usize {
        current_max_send_streams(&self.connection)
    }
}

/// A stream taken on a connection: given back when dropped (with the response body, or with
/// the request when it fails).
struct Stream {
    send: http2::SendRequest<Body>,
    connection: u64,
    endpoint: Authority,
    shared: Arc<Shared>,
}

impl Stream {
    fn take(conn: &mut H2Conn, shared: &Arc<Shared>, endpoint: &Authority) -> Self {
        conn.streams += 1;
        Self {
            send: conn.send.clone(),
            connection: conn.id,
            endpoint: endpoint.clone(),
            shared: shared.clone(),
        }
    }
}

impl Stream {
    /// Marks this stream's connection as going away (see `H2Conn::retired`).
    fn retire(&self) {
        let mut endpoints = self.shared.lock();
        let conn = endpoints
            .get_mut(&self.endpoint)
            .and_then(|ep| ep.connections.iter_mut().find(|c| c.id == self.connection));
        if let Some(conn) = conn {
            conn.retired = true;
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut endpoints = self.shared.lock();
        let conn = endpoints
            .get_mut(&self.endpoint)
            .and_then(|ep| ep.connections.iter_mut().find(|c| c.id == self.connection));
        if let Some(conn) = conn {
            conn.streams -= 1;
            if conn.streams == 0 {
                conn.idle_since = Instant::now();
            }
        }
        drop(endpoints);
        self.shared.changed.notify_waiters();
    }
}

/// One count in an endpoint's `connecting` or `waiting`, taken back when dropped, so that a
/// request that goes away while it connects or waits leaves the counts right.
struct Counted<'a> {
    shared: &'a Shared,
    endpoint: Authority,
    count: Count,
    held: bool,
}

#[derive(Clone, Copy)]
enum Count {
    Connecting,
    Waiting,
}

impl Count {
    fn of(self, ep: &mut Endpoint) -> &mut usize {
        match self {
            Self::Connecting => &mut ep.connecting,
            Self::Waiting => &mut ep.waiting,
        }
    }
}

impl<'a> Counted<'a> {
    /// For a `count` the caller already added.
    fn new(shared: &'a Shared, endpoint: &Authority, count: Count) -> Self {
        Self {
            shared,
            endpoint: endpoint.clone(),
            count,
            held: true,
        }
    }

    /// Gives the count back through an endpoint the caller already locked.
    fn release(mut self, ep: &mut Endpoint) {
        let count = self.count.of(ep);
        *count = count.saturating_sub(1);
        self.held = false;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if let Some(ep) = self.shared.lock().get_mut(&self.endpoint) {
            let count = self.count.of(ep);
            *count = count.saturating_sub(1);
        }
        self.shared.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use hyper::service::service_fn;
    use hyper_rustls::FixedServerNameResolver;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    use super::*;

    /// An HTTP/2 server over TLS allowing one stream per connection: `/hang` answers only when
    /// `release` is notified, anything else at once. Returns its address and a count of the
    /// connections it accepted.
    async fn one_stream_server(
        release: Arc<Notify>,
    ) -> (
        std::net::SocketAddr,
        Arc<AtomicUsize>,
        rustls::RootCertStore,
    ) {
        let (acceptor, roots) = tls_acceptor();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let (acceptor, release) = (acceptor.clone(), release.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let release = release.clone();
                        async move {
                            if req.uri().path() == "/hang" {
                                release.notified().await;
                            }
                            Ok::<_, std::convert::Infallible>(http::Response::new(body::full("ok")))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(1)
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        (addr, accepted, roots)
    }

    /// An HTTP/2 server over TLS whose first connection refuses every stream but `/hang`
    /// (REFUSED_STREAM), as a server closing that connection would; later connections answer
    /// everything. Returns its address, accepted connections and the streams it answered.
    async fn refusing_server() -> (
        std::net::SocketAddr,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        rustls::RootCertStore,
    ) {
        let (acceptor, roots) = tls_acceptor();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let (counted, answers) = (accepted.clone(), answered.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                let (acceptor, answers) = (acceptor.clone(), answers.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut conn) = h2::server::handshake(tls).await else {
                        return;
                    };
                    let mut held = Vec::new();
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        if req.uri().path() == "/hang" {
                            held.push(respond);
                        } else if first {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                        } else {
                            answers.fetch_add(1, Ordering::SeqCst);
                            let _ = respond.send_response(http::Response::new(()), true);
                        }
                    }
                });
            }
        });
        (addr, accepted, answered, roots)
    }

    fn tls_acceptor() -> (tokio_rustls::TlsAcceptor, rustls::RootCertStore) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["api.wardle.svc".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        (tokio_rustls::TlsAcceptor::from(Arc::new(tls)), roots)
    }

    fn pool(roots: rustls::RootCertStore, max_connections: usize) -> ServiceConnections {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(
                ServerName::try_from("api.wardle.svc").unwrap(),
            ));
        let failures = FailureSignal::new();
        let connector = builder
            .enable_http1()
            .enable_http2()
            .wrap_connector(Watched::new(http, Some(failures.clone())));
        let http1 = crate::backend::client_builder().build(connector.clone());
        let probe = Probe::new(tls, ServerName::try_from("api.wardle.svc").unwrap());
        ServiceConnections::new(
            connector,
            http1,
            probe,
            failures,
            PoolSettings {
                max_connections,
                stream_wait: Duration::from_millis(300),
            },
        )
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> Request {
        http::Request::get(format!("https://{addr}{path}"))
            .body(body::empty())
            .unwrap()
    }

    /// Sends `GET /hang` in the background and gives it time to take its stream.
    async fn hold_a_stream(
        pool: &Arc<ServiceConnections>,
        addr: std::net::SocketAddr,
    ) -> tokio::task::JoinHandle<Result<http::StatusCode, PoolError>> {
        let hanging = tokio::spawn({
            let pool = pool.clone();
            async move { pool.send(get(addr, "/hang")).await.map(|r| r.status()) }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        hanging
    }

    #[tokio::test]
    async fn a_full_connection_gets_another_beside_it() {
        let release = Arc::new(Notify::new());
        let (addr, accepted, roots) = one_stream_server(release.clone()).await;
        let pool = Arc::new(pool(roots, 4));
        let hanging = hold_a_stream(&pool, addr).await;
        let resp = tokio::time::timeout(Duration::from_secs(2), pool.send(get(addr, "/")))
            .await
            .expect("answered beside the hanging request")
            .unwrap();
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        release.notify_waiters();
        assert_eq!(hanging.await.unwrap().unwrap(), http::StatusCode::OK);
    }

    #[tokio::test]
    async fn no_free_stream_within_the_wait_is_an_error_not_a_hang() {
        let release = Arc::new(Notify::new());
        let (addr, accepted, roots) = one_stream_server(release.clone()).await;
        let pool = Arc::new(pool(roots, 1));
        let hanging = hold_a_stream(&pool, addr).await;
        let started = Instant::now();
        let Err(err) = pool.send(get(addr, "/")).await else {
            panic!("a request beside a full connection that may not grow was answered");
        };
        assert!(
            matches!(
                err,
                PoolError::Exhausted {
                    connections: 1,
                    streams: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Once the stream is free again, it is used.
        release.notify_waiters();
        assert_eq!(hanging.await.unwrap().unwrap(), http::StatusCode::OK);
        let resp = pool.send(get(addr, "/")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
    }

    #[tokio::test]
    async fn a_refused_stream_is_sent_again_on_another_connection() {
        let (addr, accepted, answered, roots) = refusing_server().await;
        let pool = Arc::new(pool(roots, 4));
        // A long request keeps the first connection open beside the refusals.
        let _hanging = hold_a_stream(&pool, addr).await;
        let resp = tokio::time::timeout(Duration::from_secs(5), pool.send(get(addr, "/")))
            .await
            .expect("answered")
            .expect("a refused GET is sent again, not failed");
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "sent again on a new connection"
        );
        // The refusing connection takes no more streams.
        let resp = pool.send(get(addr, "/")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert_eq!(answered.load(Ordering::SeqCst), 2);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
