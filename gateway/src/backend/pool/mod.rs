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
//! HTTP/1.1 (anonymous callers, and backends that do not offer `h2`) goes out on
//! `pool::http1`'s kept connections, one per concurrent request; upgrades on hyper-util's
//! client.
//!
//! *Kept connections* (issues 27, 41). Every endpoint the availability controller last found
//! passing keeps one more connection that carries no requests, pinged at the APIService's
//! `http2-ping-interval`/`-timeout` (see `watcher`; an HTTP/1.1-only endpoint is probed on an
//! idle HTTP/1.1 connection at the same interval instead): a backend dying or freezing is
//! noticed without traffic. Unless the annotations say otherwise, the connections that carry requests
//! are pinged more gently ([`PoolSettings::request_pings`]): a backend late with a PING loses
//! their streams.

use std::collections::HashMap;
use std::error::Error;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::uri::Authority;
use http::Version;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Notify;
use tokio::time::Instant;

mod connect;
mod goaway;
mod http1;
mod watcher;

use self::connect::{connect, Connected, H2Conn};
use self::goaway::GoAwayWatch;
pub use self::http1::{GiveBack, Http1Connections};
use self::watcher::{Pings, Watcher};
use super::balance::{Balancer, ProbeFn};
use super::failures::{FailureSignal, Watched, WatchedStream};
use super::probe::Probe;
use crate::body::{self, Body, BoxError, Request};

/// Dials with TLS over TCP connections that report their failures (see `failures`).
pub type Connector = HttpsConnector<Watched>;
pub type HttpsClient = Client<Connector, Body>;
type H2Connection = http2::Connection<
    TokioIo<GoAwayWatch<TokioIo<MaybeHttpsStream<TokioIo<WatchedStream>>>>>,
    Body,
    TokioExecutor,
>;

/// Streams on the least busy connection before another one is opened beside it.
pub const BUSY_STREAMS: usize = 32;
/// How long an unused connection stays open (as `backend::client_builder`'s idle timeout).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a new connection may take to announce its settings before it counts as failed.
const SETTINGS_WAIT: Duration = Duration::from_secs(5);

/// The default PING interval and timeout of the connection kept to each endpoint (see
/// `watcher`): a frozen backend is noticed within their sum (2 s) after the last thing it sent,
/// and marked unavailable one probe timeout (5 s) later, inside the 8 s a frozen backend has to
/// be noticed in. It costs one 17-byte frame each way a second per endpoint; a PING missed by a
/// backend that is only slow costs one availability check, which passes, and no request.
/// `http2-ping-interval`/`-timeout` set others.
pub const PING_INTERVAL: Duration = Duration::from_secs(1);
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// The least PING interval and timeout of connections that carry requests. Their PINGs only
/// free requests stuck on a connection to a process gone silent (the kept connection notices
/// it first), so a backend may be 5 s late with an answer before their streams are cut;
/// kube-aggregator's client-go transport waits 30 s + 15 s. A request to a frozen backend then
/// fails within 7 s and is not sent to it again (see `remote`).
pub const REQUEST_PING_INTERVAL: Duration = Duration::from_secs(2);
pub const REQUEST_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long dialing one connection (TCP and TLS) may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the retries of one request may spend in all waiting for connections after its
/// first failure, and never past [`DIAL_TIMEOUT`] from its start (see
/// [`ServiceConnections::send_dialing_until`]).
pub const RETRY_DIAL_BUDGET: Duration = Duration::from_secs(5);

/// The bounds of one pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// HTTP/2 connections per endpoint of the Service (64 × a Go backend's 250 streams = 16 000
    /// concurrent requests).
    pub max_connections: usize,
    /// How long a request waits for a free stream when every connection is full.
    pub stream_wait: Duration,
    /// How often the kept connection to each endpoint is pinged, and how long a PING may go
    /// unanswered before the endpoint is re-checked: a backend that vanished without closing
    /// its connections shows up in seconds instead of the ~45 s kube-aggregator users run into.
    /// Connections that carry requests use [`Self::request_pings`].
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// The PINGs of connections that carry requests ([`Self::request_pings`]).
    pub request_ping_interval: Duration,
    pub request_ping_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 64,
            stream_wait: Duration::from_secs(10),
            ping_interval: PING_INTERVAL,
            ping_timeout: PING_TIMEOUT,
            request_ping_interval: REQUEST_PING_INTERVAL,
            request_ping_timeout: REQUEST_PING_TIMEOUT,
        }
    }
}

impl PoolSettings {
    /// The PING interval and timeout of connections that carry requests.
    pub fn request_pings(&self) -> (Duration, Duration) {
        (self.request_ping_interval, self.request_ping_timeout)
    }

    fn kept_pings(&self) -> Pings {
        Pings {
            interval: self.ping_interval,
            timeout: self.ping_timeout,
        }
    }

    /// The defaults, with what an APIService's annotations set instead. A PING setting set by
    /// annotation holds for every connection to the backend: whoever sets `1s` asks for requests
    /// on a frozen backend to be given up that fast too. Left unset, connections that carry
    /// requests get the gentler [`REQUEST_PING_INTERVAL`] and [`REQUEST_PING_TIMEOUT`].
    pub fn with(settings: &apiservice::traffic::ConnectionSettings) -> Self {
        let default = Self::default();
        Self {
            max_connections: settings
                .max_connections_per_endpoint
                .map_or(default.max_connections, usize::from),
            ping_interval: settings.ping_interval.unwrap_or(default.ping_interval),
            ping_timeout: settings.ping_timeout.unwrap_or(default.ping_timeout),
            request_ping_interval: settings
                .ping_interval
                .unwrap_or(default.request_ping_interval),
            request_ping_timeout: settings
                .ping_timeout
                .unwrap_or(default.request_ping_timeout),
            ..default
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No connection could be made (refused, TLS refused, no HTTP/2 settings): the backend may
    /// be gone.
    #[error("{0}")]
    Connect(#[source] BoxError),
    /// An upgrade request failed (hyper-util's HTTP/1.1 client).
    #[error(transparent)]
    Upgrade(hyper_util::client::legacy::Error),
    /// The request failed on a connection it was given: an HTTP/2 stream, or an HTTP/1.1
    /// connection of `pool::http1`.
    #[error(transparent)]
    Request(hyper::Error),
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
            Self::Upgrade(e) => e.is_connect(),
            Self::Request(_) | Self::Exhausted { .. } => false,
        }
    }
}

/// Whether `e` (or an error it wraps) says the server never processed the request: hyper
/// cancelled it before sending (its connection closed first), the stream was above the last
/// one the server's graceful GOAWAY (NO_ERROR) accepted, or the server reset it with
/// REFUSED_STREAM. A GOAWAY with an error code is also sent to the streams below its last
/// stream id, which the server may have processed, so it does not count.
pub fn refused_unprocessed(e: &(dyn Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return (h2.is_go_away()
                && h2.is_remote()
                && h2.reason() == Some(h2::Reason::NO_ERROR))
                || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM));
        }
        next = err.source();
    }
    false
}

/// The connections to one backend Service; see the module documentation.
pub struct ServiceConnections {
    /// Offers `h2` and `http/1.1`; what the server picks decides which client a request uses.
    connector: Connector,
    /// The same, for the kept connections; reporting nothing itself (see `watcher`).
    kept_connector: Connector,
    /// HTTP/1.1 only: upgrades.
    upgrades: HttpsClient,
    /// HTTP/1.1 only: anonymous callers, and every request to an endpoint that did not pick
    /// `h2`.
    http1: Http1Connections,
    shared: Arc<Shared>,
    /// The availability probe's own connections to the same Service: a pool full of streams
    /// never starves it (see `probe`).
    probe: Arc<Probe>,
    /// Where this Service's connections report their failures (see `failures`).
    failures: Arc<FailureSignal>,
    /// Which endpoint each request goes to (see `balance`).
    balancer: Arc<Balancer>,
}

struct Shared {
    endpoints: Mutex<HashMap<Authority, Endpoint>>,
    /// Signalled whenever a stream is freed or a connection is added or fails: waiting requests
    /// look again.
    changed: Notify,
    settings: PoolSettings,
    next_id: AtomicU64,
    /// Where a connection's failure is reported (see `failures`).
    failures: Arc<FailureSignal>,
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
    /// The connection kept without traffic (see [`ServiceConnections::keep`]).
    watcher: Option<Watcher>,
}

// === impl ServiceConnections ===

impl ServiceConnections {
    /// `connector` must offer `h2` and `http/1.1`; `http1` offers HTTP/1.1 only; `failures`
    /// is the signal `connector`'s connections report to; `kept_connector` dials as
    /// `connector` does, reporting nowhere.
    pub fn new(
        connector: Connector,
        kept_connector: Connector,
        http1: Connector,
        probe: Probe,
        failures: Arc<FailureSignal>,
        settings: PoolSettings,
    ) -> Self {
        let probe = Arc::new(probe);
        let balancer = Balancer::new(endpoint_probe(probe.clone(), failures.clone()));
        let shared = Arc::new(Shared {
            endpoints: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            settings,
            next_id: AtomicU64::new(0),
            failures: failures.clone(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_idle(Arc::downgrade(&shared)));
        }
        Self {
            connector,
            kept_connector,
            upgrades: super::client_builder().build(http1.clone()),
            http1: Http1Connections::new(http1),
            shared,
            probe,
            failures,
            balancer,
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
    pub fn upgrades(&self) -> &HttpsClient {
        &self.upgrades
    }

    /// Sends `req` (an absolute `https://` URI) on a free HTTP/2 stream to its endpoint, or over
    /// HTTP/1.1 when the endpoint does not speak HTTP/2. The stream counts as busy until the
    /// response body is finished or dropped. One attempt: whether to send again is the caller's
    /// decision (see `retry`); a connection whose server refused the stream with a GOAWAY takes
    /// no new streams.
    pub async fn send(&self, req: Request) -> Result<http::Response<Body>, PoolError> {
        let (resp, lease) = self.send_dialing_until(req, None).await?;
        Ok(resp.map(|b| body::with_guard(b, lease)))
    }

    /// [`Self::send`], with any connection it needs made (or waited for) by `dial_deadline`:
    /// the retries of one request share one deadline (see `remote`), so a backend that accepts
    /// TCP but never completes TLS costs the request one wait, not one per attempt.
    pub async fn send_dialing_until(
        &self,
        mut req: Request,
        dial_deadline: Option<Instant>,
    ) -> Result<(http::Response<Incoming>, Lease), PoolError> {
        let endpoint = req
            .uri()
            .authority()
            .cloned()
            .ok_or_else(|| PoolError::Connect("the request names no backend address".into()))?;
        let Some(stream) = self.stream(&endpoint, dial_deadline).await? else {
            return self.send_http1(req).await;
        };
        *req.version_mut() = Version::HTTP_2;
        let mut send = stream.send.clone();
        match send.send_request(req).await {
            Ok(resp) => Ok((
                resp,
                Lease {
                    _leased: Leased::Stream { _stream: stream },
                },
            )),
            Err(e) => {
                if refused_unprocessed(&e) {
                    stream.retire();
                }
                Err(PoolError::Request(e))
            }
        }
    }

    /// Keeps one connection that carries no requests open to each of `endpoints` (and to no
    /// other): HTTP/2 and pinged, or HTTP/1.1 and probed, dialed again when it closes (see
    /// `watcher`). The availability controller calls this after each passed check.
    pub fn keep(&self, endpoints: &[Authority]) {
        let mut map = self.shared.lock();
        for (authority, ep) in map.iter_mut() {
            if !endpoints.contains(authority) {
                ep.watcher = None;
            }
        }
        for authority in endpoints {
            let ep = map.entry(authority.clone()).or_default();
            if ep.watcher.is_none() {
                ep.watcher = Some(Watcher::start(
                    self.kept_connector.clone(),
                    self.failures.clone(),
                    authority.clone(),
                    self.shared.settings.kept_pings(),
                ));
            }
        }
    }

    /// Whether the connection kept to `endpoint` failed and none is up again (see `watcher`).
    pub fn unresponsive(&self, endpoint: &Authority) -> bool {
        self.shared
            .lock()
            .get(endpoint)
            .and_then(|ep| ep.watcher.as_ref())
            .is_some_and(Watcher::unresponsive)
    }

    /// The balancer over this Service's endpoints.
    pub fn balancer(&self) -> &Arc<Balancer> {
        &self.balancer
    }

    /// Sends `req` over HTTP/1.1 whatever the endpoint speaks: for anonymous callers, whom a
    /// k8s.io/apiserver backend answers on HTTP/2 with a GOAWAY for the whole connection (see
    /// `backend::core::Clients`).
    pub async fn send_http1(
        &self,
        req: Request,
    ) -> Result<(http::Response<Incoming>, Lease), PoolError> {
        let (resp, connection) = self.http1.send(req).await?;
        Ok((
            resp,
            Lease {
                _leased: Leased::Connection {
                    _connection: connection,
                },
            },
        ))
    }

    /// A free stream on a connection to `endpoint`, or `None` when the endpoint speaks HTTP/1.1
    /// only. Opens a connection when every one is full (or busy, see [`BUSY_STREAMS`]), and
    /// waits at most `stream_wait` for a stream when none may be opened.
    async fn stream(
        &self,
        endpoint: &Authority,
        dial_deadline: Option<Instant>,
    ) -> Result<Option<Stream>, PoolError> {
        let shared = &self.shared;
        let mut deadline = Instant::now() + shared.settings.stream_wait;
        if let Some(dial_deadline) = dial_deadline {
            deadline = deadline.min(dial_deadline);
        }
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.next_step(endpoint, deadline)? {
                Step::Take(stream) => return Ok(Some(stream)),
                Step::Http1 => return Ok(None),
                Step::Connect => match self.dial(endpoint, dial_deadline).await? {
                    Dialed::Http1 => return Ok(None),
                    Dialed::Stream(stream) => return Ok(Some(stream)),
                    // Taken by others meanwhile: look again.
                    Dialed::Full => {}
                },
                Step::Wait => {
                    let waiting = Counted::new(shared, endpoint, Count::Waiting);
                    // On the deadline, one last look (a stream may have been freed just now):
                    // the next step answers with `Exhausted` if there is still none.
                    let _ = tokio::time::timeout_at(deadline, changed).await;
                    drop(waiting);
                }
            }
        }
    }

    /// What a request for a stream to `endpoint` does now, decided under the pool's lock: take a
    /// stream, open a connection, or wait (counted as waiting, up to `deadline`).
    fn next_step(&self, endpoint: &Authority, deadline: Instant) -> Result<Step, PoolError> {
        let shared = &self.shared;
        let mut endpoints = shared.lock();
        let ep = endpoints.entry(endpoint.clone()).or_default();
        if ep.http1 {
            return Ok(Step::Http1);
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
                return Ok(Step::Take(Stream::take(conn, shared, endpoint)));
            }
        }
        // Every connection is full. Open one more, unless enough are already on their way for
        // the requests waiting (one for each `limit` of them).
        let limit = ep.learned_limit();
        let needed = ep.connecting == 0 || ep.waiting >= ep.connecting.saturating_mul(limit);
        if room_for_more && needed {
            ep.connecting += 1;
            return Ok(Step::Connect);
        }
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
        Ok(Step::Wait)
    }

    /// Opens the connection [`Self::next_step`] counted as connecting, by `dial_deadline` when
    /// given, and takes a stream on it.
    async fn dial(
        &self,
        endpoint: &Authority,
        dial_deadline: Option<Instant>,
    ) -> Result<Dialed, PoolError> {
        let shared = &self.shared;
        let connecting = Counted::new(shared, endpoint, Count::Connecting);
        // Boxed: a connection attempt (TCP, TLS and HTTP/2 handshakes) is a large future, and
        // inline it would make every request's future that large, to be moved and allocated on
        // every request although connecting is rare.
        let connected = match dial_deadline {
            None => Box::pin(self.connect(endpoint)).await,
            Some(at) => tokio::time::timeout_at(at, Box::pin(self.connect(endpoint)))
                .await
                .unwrap_or_else(|_| {
                    Err(PoolError::NoConnection {
                        endpoint: endpoint.clone(),
                        waited: RETRY_DIAL_BUDGET,
                    })
                }),
        };
        let mut endpoints = shared.lock();
        let ep = endpoints.entry(endpoint.clone()).or_default();
        connecting.release(ep);
        shared.changed.notify_waiters();
        match connected? {
            Connected::Http1 => {
                ep.http1 = true;
                Ok(Dialed::Http1)
            }
            Connected::Http2(conn) => {
                ep.connections.push(conn);
                Ok(match ep.least_busy_with_room() {
                    Some(conn) => Dialed::Stream(Stream::take(conn, shared, endpoint)),
                    None => Dialed::Full,
                })
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

/// The check an ejected endpoint must pass to be re-admitted: the availability probe's request
/// (`GET /apis/<group>/<version>` of an APIService on these connections) on that endpoint alone.
fn endpoint_probe(probe: Arc<Probe>, failures: Arc<FailureSignal>) -> ProbeFn {
    Arc::new(move |authority: Authority| {
        let probe = probe.clone();
        let path = failures
            .first_api_service()
            .and_then(|name| apiservice::model::GroupVersion::from_api_service_name(&name))
            .map_or_else(|| "/apis".to_owned(), |gv| gv.path());
        Box::pin(async move {
            probe
                .check(
                    || Ok(authority.clone()),
                    &path,
                    &crate::identity::DISCOVERY_USER,
                )
                .await
                .is_ok()
        })
    })
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
        endpoints.retain(|_, ep| {
            ep.watcher.is_some() || !ep.connections.is_empty() || ep.connecting + ep.waiting > 0
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
            if c.send.is_closed() {
                return false;
            }
            if c.streams > 0 {
                return true;
            }
            !c.going_away() && c.idle_since.elapsed() < IDLE_TIMEOUT
        });
    }

    fn least_busy_with_room(&mut self) -> Option<&mut H2Conn> {
        self.connections
            .iter_mut()
            .filter(|c| !c.send.is_closed() && !c.going_away() && c.streams < c.limit())
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

/// What a response holds of the connection it came on: hold it as long as the response body.
pub struct Lease {
    _leased: Leased,
}

/// What [`ServiceConnections::next_step`] decided for a request waiting for a stream.
enum Step {
    Take(Stream),
    /// The endpoint speaks HTTP/1.1 only.
    Http1,
    /// Open a connection (already counted as connecting).
    Connect,
    /// Wait for a stream to be freed or a connection to be opened (already counted as waiting).
    Wait,
}

/// What opening a connection gave the request that opened it.
enum Dialed {
    Stream(Stream),
    /// The endpoint speaks HTTP/1.1 only.
    Http1,
    /// Every stream of the new connection was taken by others first.
    Full,
}

/// Held only to be dropped: each gives its part of a connection back on drop.
enum Leased {
    /// A stream of an HTTP/2 connection.
    Stream { _stream: Stream },
    /// A whole HTTP/1.1 connection.
    Connection { _connection: GiveBack },
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
mod tests;
