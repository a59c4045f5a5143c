//! The request timeout (kube-apiserver's --request-timeout, 60 s) bounds the whole exchange of an
//! ordinary request, writing the response to the client included: a request without response
//! headers by then gets 504, and a response the client has not taken in by then is cut off (the
//! HTTP/2 stream is reset, the HTTP/1.1 connection closed), which frees its in-flight slot and its
//! buffers. Without the second half, a client that stops reading (an HTTP/2 connection that
//! announces a zero flow-control window, an HTTP/1.1 client that reads nothing) would hold slots
//! and memory forever, because hyper polls a response body only as fast as the client takes it.
//! A client's own `?timeout=` shortens the limit, never extends it. Long-running requests (watch,
//! exec, attach, portforward, log, proxy) are exempt, and so is a 101's tunnel.
//!
//! The cut itself is the listener's: it runs every exchange under an [`ExchangeDeadline`] (each
//! HTTP/2 stream in a task of its own, an HTTP/1.1 connection one exchange at a time) and ends it
//! when the deadline this layer armed passes. The deadline reaches this layer as a task-local
//! because hyper polls an HTTP/2 stream's service future in the stream's task, which nothing in the
//! request can name.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::Either;
use tokio::sync::Notify;
use tokio::time::{Instant, Timeout};
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::{BoxError, Request, Response};
use crate::error::GatewayError;
use crate::request_info::RequestInfo;

/// After a 504, how long the client has to read that Status before the exchange is cut.
const TIMEOUT_STATUS_GRACE: Duration = Duration::from_secs(5);

/// How often the waiter of an unarmed [`ExchangeDeadline`] looks again. Below the default
/// request timeout (60 s), so that an exchange armed with it does not wake the waiter: waking it
/// on every arm cost an HTTP/1.1 connection one more poll per request, since a small exchange
/// is usually armed and disarmed again before the waiter runs.
const UNARMED_RECHECK: Duration = Duration::from_secs(30);

tokio::task_local! {
    static EXCHANGE: ExchangeDeadline;
}

// === impl ExchangeDeadline ===

/// The deadline of the exchange being served, armed by [`TimeoutService`] and enforced by the
/// listener. Unarmed (long-running requests, requests not yet past the timeout layer) it never
/// expires.
#[derive(Clone, Default)]
pub struct ExchangeDeadline(Arc<DeadlineState>);

#[derive(Default)]
struct DeadlineState {
    armed: Mutex<Armed>,
    changed: Notify,
}

#[derive(Clone, Copy, Default)]
struct Armed {
    /// When the exchange must be over; `None` while unarmed.
    at: Option<Instant>,
    /// What the waiter in [`ExchangeDeadline::expired`] sleeps until (`None`: it never looked):
    /// the armed deadline, or [`UNARMED_RECHECK`] from when it found none. Arming it for
    /// later, or disarming it, wakes nobody: the waiter reads the deadline again when its sleep
    /// ends. So an HTTP/1.1 connection's exchanges, armed and disarmed one after another (most
    /// within one poll of the connection), cost it no wake-up and no timer each.
    waking: Option<Instant>,
}

impl ExchangeDeadline {
    /// Runs `fut` with this deadline as the current exchange's.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        EXCHANGE.scope(self, fut).await
    }

    /// The exchange being served by this task, if the listener runs it under a deadline.
    fn current() -> Option<Self> {
        EXCHANGE.try_with(Clone::clone).ok()
    }

    fn armed_state(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.0.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arm(&self, at: Instant) {
        let earlier = {
            let mut armed = self.armed_state();
            armed.at = Some(at);
            armed.waking.is_none_or(|waking| at < waking)
        };
        if earlier {
            self.0.changed.notify_waiters();
        }
    }

    /// The exchange is over (its response was written or dropped): nothing to enforce until
    /// the next one arms it.
    pub fn disarm(&self) {
        self.armed_state().at = None;
    }

    fn armed(&self) -> Option<Instant> {
        self.armed_state().at
    }

    /// Resolves once an armed deadline has passed while still armed. One waiter per deadline
    /// (the listener's).
    pub async fn expired(&self) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let waking = {
                let mut armed = self.armed_state();
                let waking = armed.at.unwrap_or_else(|| Instant::now() + UNARMED_RECHECK);
                armed.waking = Some(waking);
                waking
            };
            tokio::select! {
                _ = tokio::time::sleep_until(waking) => {
                    if self.armed().is_some_and(|at| at <= Instant::now()) {
                        return;
                    }
                }
                _ = changed => {}
            }
        }
    }
}

#[derive(Clone)]
pub struct TimeoutService<S> {
    inner: S,
    limit: Duration,
}

impl<S> TimeoutService<S> {
    pub fn layer(limit: Duration) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self { inner, limit })
    }
}

/// `?timeout=` as a Go duration, when present and valid; read (decoded, first value) as the
/// backend's `URL.Query().Get("timeout")` reads it.
fn client_timeout(query: &str) -> Option<Duration> {
    let raw = crate::request_info::query_value(query, "timeout")?;
    std::str::from_utf8(&raw)
        .ok()?
        .parse::<gateway_config::GoDuration>()
        .ok()
        .map(|d| d.0)
        .filter(|d| !d.is_zero())
}

/// An ordinary request's time limit: `limit` (`--request-timeout`), shortened by its own
/// `?timeout=`.
pub(super) fn request_limit(limit: Duration, query: &str) -> Duration {
    client_timeout(query).map_or(limit, |d| d.min(limit))
}

impl<S> Service<Request> for TimeoutService<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    /// Long-running requests: the inner call itself.
    type Future = Either<S::Future, Deadline<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        if req
            .extensions()
            .get::<Arc<RequestInfo>>()
            .is_some_and(|i| i.long_running)
        {
            return Either::Left(self.inner.call(req));
        }
        let limit = request_limit(self.limit, req.uri().query().unwrap_or(""));
        let deadline = Instant::now() + limit;
        Either::Right(Deadline {
            inner: tokio::time::timeout_at(deadline, self.inner.call(req)),
            deadline,
            limit,
            exchange: None,
        })
    }
}

pin_project_lite::pin_project! {
    /// An ordinary request's future under its time limit: 504 when the limit passes first, and
    /// the exchange's deadline armed either way (see the module docs).
    pub struct Deadline<F> {
        #[pin]
        inner: Timeout<F>,
        deadline: Instant,
        limit: Duration,
        // Read on the first poll: that runs in the exchange's own task (see the module docs).
        exchange: Option<Option<ExchangeDeadline>>,
    }
}

impl<F> Future for Deadline<F>
where
    F: Future<Output = Result<Response, BoxError>>,
{
    type Output = Result<Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let exchange = this.exchange.get_or_insert_with(ExchangeDeadline::current);
        let arm = |at| {
            if let Some(exchange) = exchange.as_ref() {
                exchange.arm(at);
            }
        };
        Poll::Ready(match ready!(this.inner.poll(cx)) {
            Ok(Ok(resp)) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => Ok(resp),
            Ok(result) => {
                arm(*this.deadline);
                result
            }
            Err(_) => {
                arm(Instant::now() + TIMEOUT_STATUS_GRACE);
                Err(GatewayError::Timeout(*this.limit).into())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use http::header::{CONNECTION, UPGRADE};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::body;
    use crate::front::stack::request_info::RequestInfoService;

    #[test]
    fn client_timeout_is_parsed() {
        assert_eq!(client_timeout("timeout=32s"), Some(Duration::from_secs(32)));
        assert_eq!(
            client_timeout("limit=500&timeout=1m"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(client_timeout("timeoutSeconds=5"), None);
        assert_eq!(client_timeout("timeout=bogus"), None);
        assert_eq!(
            client_timeout("%74imeout=%33s"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            client_timeout("timeout=2s&timeout=1s"),
            Some(Duration::from_secs(2))
        );
    }

    /// Whether `deadline.expired()` resolves within `within` (paused time).
    async fn expires_within(deadline: &ExchangeDeadline, within: Duration) -> bool {
        tokio::time::timeout(within, deadline.expired())
            .await
            .is_ok()
    }

    /// A task waiting for `deadline` to expire, as the listener does, once it waits.
    async fn waiting(deadline: &ExchangeDeadline) -> tokio::task::JoinHandle<()> {
        let deadline = deadline.clone();
        let waiter = tokio::spawn(async move { deadline.expired().await });
        tokio::task::yield_now().await;
        waiter
    }

    /// Arms `deadline` for `after` from now and checks that `waiter` sees it expire then.
    async fn expires_on_time(
        deadline: &ExchangeDeadline,
        waiter: tokio::task::JoinHandle<()>,
        after: Duration,
    ) {
        let at = Instant::now() + after;
        deadline.arm(at);
        tokio::time::timeout(LIMIT * 10, waiter)
            .await
            .expect("the armed deadline passed unnoticed")
            .unwrap();
        // Give or take the timer's millisecond.
        let late = Instant::now() - at;
        assert!(
            late < Duration::from_millis(2),
            "{late:?} after the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_exchange_deadline_is_enforced_whatever_came_before_it() {
        let deadline = ExchangeDeadline::default();
        let waiter = waiting(&deadline).await;
        // Exchanges armed and disarmed one after another (the waiter sleeps until the first
        // deadline, and is not woken for the later ones): none passes while armed.
        let start = Instant::now();
        for i in 1..=5 {
            deadline.arm(start + Duration::from_secs(10 * i));
            tokio::time::sleep(Duration::from_secs(9)).await;
            deadline.disarm();
        }
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!waiter.is_finished(), "a disarmed deadline expired");
        // Armed again, unwatched since its last sleep ended: it is woken for this one.
        expires_on_time(&deadline, waiter, Duration::from_secs(30)).await;

        // Armed later than the deadline the waiter sleeps until: found when that sleep ends,
        // enforced on time.
        let deadline = ExchangeDeadline::default();
        deadline.arm(Instant::now() + Duration::from_secs(10));
        let waiter = waiting(&deadline).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        deadline.disarm();
        expires_on_time(&deadline, waiter, Duration::from_secs(15)).await;

        // Armed, after the waiter found it unarmed, for later than it looks again: not woken,
        // found when it looks, enforced on time.
        let deadline = ExchangeDeadline::default();
        let waiter = waiting(&deadline).await;
        expires_on_time(
            &deadline,
            waiter,
            UNARMED_RECHECK * 2 + Duration::from_secs(3),
        )
        .await;

        // Armed earlier than the deadline the waiter sleeps until: it wakes for the earlier one.
        let deadline = ExchangeDeadline::default();
        deadline.arm(Instant::now() + LIMIT);
        let waiter = waiting(&deadline).await;
        expires_on_time(&deadline, waiter, Duration::from_secs(5)).await;
        // Unarmed, it never expires.
        deadline.disarm();
        assert!(!expires_within(&deadline, LIMIT * 10).await);
    }

    fn request(method: &str, uri: &str) -> Request {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, "SPDY/3.1")
            .body(body::empty())
            .unwrap()
    }

    /// request_info then the timeout over `inner`, as in the real stack.
    fn stack<S>(inner: S) -> RequestInfoService<TimeoutService<S>> {
        RequestInfoService::layer(None).layer(TimeoutService::layer(LIMIT).layer(inner))
    }

    const LIMIT: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_upgrade_to_an_ordinary_resource_is_timed_out() {
        let hung = tower::service_fn(|_req: Request| std::future::pending());
        let Err(err) = stack(hung)
            .oneshot(request("GET", "/api/v1/namespaces/x/configmaps"))
            .await
        else {
            panic!("a hung ordinary request got an answer");
        };
        let err = err.downcast_ref::<GatewayError>().unwrap();
        assert_eq!(err.code(), http::StatusCode::GATEWAY_TIMEOUT);

        // exec is long-running by its subresource: never cut.
        let hung = tower::service_fn(|_req: Request| std::future::pending());
        let exec = stack(hung).oneshot(request("POST", "/api/v1/namespaces/x/pods/p/exec"));
        assert!(tokio::time::timeout(LIMIT * 10, exec).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_101_is_not_cut_once_its_headers_are_in() {
        let switching = tower::service_fn(|_req: Request| async {
            let stream =
                futures::stream::pending::<Result<http_body::Frame<bytes::Bytes>, BoxError>>();
            let mut resp = Response::new(body::boxed(http_body_util::StreamBody::new(stream)));
            *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
            Ok::<_, BoxError>(resp)
        });
        let resp = stack(switching)
            .oneshot(request("GET", "/api/v1/namespaces/x/configmaps"))
            .await
            .unwrap();
        assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
        let mut body = resp.into_body();
        let still_open = tokio::time::timeout(LIMIT * 10, body.frame()).await;
        assert!(still_open.is_err(), "the deadline reached past the 101");
    }
}
