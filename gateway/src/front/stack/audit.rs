//! The audit log: one JSON line per request, shaped like kube-apiserver's `audit.k8s.io/v1`
//! `Event` at level `Metadata`, so existing audit tooling reads it.
//!
//! - Every request gets an audit ID: the client's `Audit-ID` header when it sent a sane one, a
//!   fresh UUID otherwise. It is set on the request (so the core and remote APIServices log the
//!   same ID) and on the response, whether or not an audit log is written, as kube-apiserver does.
//! - Stage: `ResponseComplete` when the response body has been sent (or abandoned); long-running
//!   requests (watch, exec, ...) are logged once at `ResponseStarted`, when their stream starts.
//! - Events leave the request path through a bounded channel to a writer thread. When the
//!   channel is full the event is dropped and counted (`apiserver_audit_error_total{plugin="log"}`):
//!   auditing never blocks a request.
//!
//! Two layers: `Audit` (outermost but for the access log, so it also sees 429/413/504 and
//! every other answer the stack gives itself) and `AuditCapture` right after authentication,
//! which hands the authenticated user and the parsed verb back to the outer layer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use futures::future::Either;

use http::{HeaderMap, HeaderName, HeaderValue};
use k8s_openapi::jiff::Timestamp;
use prometheus::IntCounter;
use serde::Serialize;
use tokio::sync::mpsc;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::authz::AuthzOutcome;
use crate::auth::Authenticated;
use crate::body::BoxFuture;
use crate::body::{self, BoxError, Request, Response};
use crate::extensions::RequestContext;
use crate::identity::UserInfo;
use crate::request_info::RequestInfo;

pub const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

/// How many events may wait for the writer before new ones are dropped.
const QUEUE: usize = 10_000;

#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventUser {
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

// === impl EventUser ===

impl From<&UserInfo> for EventUser {
    fn from(u: &UserInfo) -> Self {
        Self {
            username: u.name.clone(),
            uid: u.uid.clone(),
            groups: u.groups.clone(),
            extra: u.extra.clone(),
        }
    }
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct ResponseStatus {
    pub code: u16,
}

/// kube's `audit.k8s.io/v1` Event, the fields a `Metadata` level event carries.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: &'static str,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: &'static str,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: EventUser,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<EventUser>,
    #[serde(rename = "sourceIPs")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    pub response_status: ResponseStatus,
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<&'static str, String>,
}

/// kube's MicroTime: RFC 3339 with microseconds.
fn micro_time(t: Timestamp) -> String {
    format!("{t:.6}")
}

/// Where events go: the channel to the writer thread, and the counters.
pub struct AuditSink {
    tx: mpsc::Sender<Event>,
    events: IntCounter,
    dropped: IntCounter,
}

// === impl AuditSink ===

impl AuditSink {
    /// Opens the log (`-` is stdout; a file is appended to, created with mode 0600 as
    /// kube-apiserver's: it holds who did what, and request URIs) and starts the writer thread.
    pub fn start(
        path: &str,
        events: IntCounter,
        dropped: IntCounter,
    ) -> std::io::Result<Arc<Self>> {
        let out: Box<dyn Write + Send> = if path == "-" {
            Box::new(std::io::stdout())
        } else {
            let mut options = std::fs::OpenOptions::new();
            options.create(true).append(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            Box::new(options.open(path)?)
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer_dropped = dropped.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_events(rx, out, writer_dropped))?;
        Ok(Arc::new(Self {
            tx,
            events,
            dropped,
        }))
    }

    fn send(&self, event: Event) {
        match self.tx.try_send(event) {
            Ok(()) => self.events.inc(),
            Err(_) => self.dropped.inc(),
        }
    }
}

/// The writer thread: one line per event, flushed whenever the queue runs empty.
fn write_events(mut rx: mpsc::Receiver<Event>, out: Box<dyn Write + Send>, dropped: IntCounter) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut failing = false;
    while let Some(event) = rx.blocking_recv() {
        let mut next = Some(event);
        while let Some(event) = next {
            let mut line = serde_json::to_vec(&event).unwrap_or_default();
            line.push(b'\n');
            if let Err(e) = out.write_all(&line) {
                dropped.inc();
                if !failing {
                    tracing::error!(error = %e, "cannot write the audit log; events are dropped");
                    failing = true;
                }
            }
            next = rx.try_recv().ok();
        }
        if out.flush().is_ok() {
            failing = false;
        }
    }
    let _ = out.flush();
}

/// What the capture layer learns after authentication: the user who authenticated and, when
/// impersonating, the impersonated user (kube's `user` and `impersonatedUser`).
#[derive(Default)]
struct Captured {
    user: OnceLock<(Arc<UserInfo>, Option<Arc<UserInfo>>)>,
    verb: OnceLock<String>,
}

#[derive(Clone)]
struct CaptureSlot(Arc<Captured>);

fn valid_audit_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// The request's audit ID: the client's, or a new one written into the request.
fn ensure_audit_id(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&AUDIT_ID).filter(|v| valid_audit_id(v)) {
        return v.clone();
    }
    // The text is the value's own buffer, so the request's copy and the response's share one
    // allocation: a value copied from a slice is promoted to a shared one (a second
    // allocation) the first time it is cloned.
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
    let value = HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text))
        .expect("a UUID is a valid header value");
    headers.insert(AUDIT_ID, value.clone());
    value
}

/// kube's `SourceIPs`: the X-Forwarded-For chain, X-Real-Ip, then the peer, without repeats.
fn source_ips(headers: &HeaderMap, peer: Option<IpAddr>) -> Vec<String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for v in headers.get_all("x-forwarded-for") {
        if let Ok(s) = v.to_str() {
            ips.extend(s.split(',').filter_map(|p| p.trim().parse::<IpAddr>().ok()));
        }
    }
    if ips.is_empty() {
        if let Some(ip) = headers
            .get("x-real-ip")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
        {
            ips.push(ip);
        }
    }
    if let Some(peer) = peer {
        if !ips.contains(&peer) {
            ips.push(peer);
        }
    }
    ips.into_iter().map(|ip| ip.to_string()).collect()
}

#[derive(Clone)]
pub struct Audit<S> {
    inner: S,
    /// `None`: no audit log (only the Audit-ID header is handled).
    sink: Option<Arc<AuditSink>>,
}

// === impl Audit ===

impl<S> Audit<S> {
    pub fn layer(sink: Option<Arc<AuditSink>>) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            sink: sink.clone(),
        })
    }
}

/// An event waiting for its response to finish; sent when dropped.
struct Pending {
    event: Option<Event>,
    started: Instant,
    sink: Arc<AuditSink>,
}

// === impl Pending ===

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut event) = self.event.take() else {
            return;
        };
        event.stage_timestamp = micro_time(Timestamp::now());
        event.annotations.insert(
            "aggregation-gateway/latency",
            format!("{:?}", self.started.elapsed()),
        );
        self.sink.send(event);
    }
}

// === impl Audit ===

impl<S> Service<Request> for Audit<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    /// Without an audit sink (the default) a named future that only adds the Audit-ID.
    type Future = Either<WithAuditId<S::Future>, BoxFuture<Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let audit_id = ensure_audit_id(req.headers_mut());
        let Some(sink) = self.sink.clone() else {
            return Either::Left(WithAuditId {
                inner: self.inner.call(req),
                audit_id: Some(audit_id),
            });
        };
        let started = Instant::now();
        let received = Timestamp::now();
        let captured = Arc::new(Captured::default());
        req.extensions_mut().insert(CaptureSlot(captured.clone()));
        let request_uri = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| req.uri().path().to_owned());
        // Kept for the way out: the router records the route in it.
        let context = RequestContext::of(req.extensions()).cloned();
        let peer = context.as_ref().map(|c| c.conn.remote.ip());
        let source_ips = source_ips(req.headers(), peer);
        let user_agent = req
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let method_verb = req.method().as_str().to_ascii_lowercase();
        let fut = self.inner.call(req);
        Either::Right(Box::pin(async move {
            let Ok(mut resp) = fut.await;
            resp.headers_mut().insert(AUDIT_ID, audit_id.clone());
            let (user, impersonated) = match captured.user.get() {
                Some((requestor, impersonated)) => (
                    EventUser::from(&**requestor),
                    impersonated.as_deref().map(EventUser::from),
                ),
                None => (EventUser::from(&UserInfo::default()), None),
            };
            let verb = captured.verb.get().cloned().unwrap_or(method_verb);
            let long_running = resp.extensions().get::<LongRunning>().is_some();
            let mut annotations = BTreeMap::new();
            if let Some(outcome) = resp.extensions().get::<AuthzOutcome>() {
                if let Some(decision) = outcome.decision {
                    annotations.insert("authorization.k8s.io/decision", decision.to_owned());
                }
                annotations.insert("authorization.k8s.io/reason", outcome.reason.to_string());
            }
            if let Some(target) = context.as_deref().and_then(RequestContext::route) {
                annotations.insert("aggregation-gateway/routed-to", target.label().to_owned());
            }
            let event = Event {
                kind: "Event",
                api_version: "audit.k8s.io/v1",
                level: "Metadata",
                audit_id: audit_id.to_str().unwrap_or_default().to_owned(),
                stage: if long_running {
                    "ResponseStarted"
                } else {
                    "ResponseComplete"
                },
                request_uri,
                verb,
                user,
                impersonated_user: impersonated,
                source_ips,
                user_agent,
                response_status: ResponseStatus {
                    code: resp.status().as_u16(),
                },
                request_received_timestamp: micro_time(received),
                stage_timestamp: String::new(),
                annotations,
            };
            let pending = Pending {
                event: Some(event),
                started,
                sink,
            };
            if long_running {
                // Logged now; the stream may last for hours.
                drop(pending);
                return Ok(resp);
            }
            Ok(resp.map(|b| body::with_guard(b, pending)))
        }))
    }
}

/// Marks a response to a long-running request (set by the capture layer).
#[derive(Clone, Copy, Debug)]
struct LongRunning;

/// Sits after authentication: records who the caller is and the parsed verb for `Audit`.
#[derive(Clone)]
pub struct AuditCapture<S> {
    inner: S,
}

// === impl AuditCapture ===

impl<S> AuditCapture<S> {
    pub fn layer() -> impl Layer<S, Service = Self> + Clone {
        layer_fn(|inner| Self { inner })
    }
}

impl<S> Service<Request> for AuditCapture<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    type Future = MarkLongRunning<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let ext = req.extensions();
        let long_running = ext
            .get::<Arc<RequestInfo>>()
            .is_some_and(|i| i.long_running);
        if let Some(CaptureSlot(slot)) = ext.get::<CaptureSlot>() {
            if let Some(auth) = ext.get::<Authenticated>() {
                let _ = slot
                    .user
                    .set((auth.requestor.clone(), auth.impersonated.clone()));
            } else if let Some(user) = ext.get::<Arc<UserInfo>>() {
                let _ = slot.user.set((user.clone(), None));
            }
            if let Some(info) = ext.get::<Arc<RequestInfo>>() {
                let _ = slot.verb.set(info.verb().to_owned());
            }
        }
        MarkLongRunning {
            inner: self.inner.call(req),
            long_running,
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner future; its response carries the Audit-ID header.
    pub struct WithAuditId<F> {
        #[pin]
        inner: F,
        audit_id: Option<HeaderValue>,
    }
}

impl<F> Future for WithAuditId<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(mut resp) = ready!(this.inner.poll(cx));
        if let Some(audit_id) = this.audit_id.take() {
            resp.headers_mut().insert(AUDIT_ID, audit_id);
        }
        Poll::Ready(Ok(resp))
    }
}

pin_project_lite::pin_project! {
    /// The inner future; the response of a long-running request is marked [`LongRunning`].
    pub struct MarkLongRunning<F> {
        #[pin]
        inner: F,
        long_running: bool,
    }
}

impl<F> Future for MarkLongRunning<F>
where
    F: Future<Output = Result<Response, BoxError>>,
{
    type Output = Result<Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if *this.long_running {
            resp.extensions_mut().insert(LongRunning);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_has_six_digits() {
        let t: Timestamp = "2024-05-01T10:20:30.123456789Z".parse().unwrap();
        assert_eq!(micro_time(t), "2024-05-01T10:20:30.123456Z");
        let whole: Timestamp = "2024-05-01T10:20:30Z".parse().unwrap();
        assert_eq!(micro_time(whole), "2024-05-01T10:20:30.000000Z");
    }

    #[test]
    fn audit_id_is_kept_or_generated() {
        let mut h = HeaderMap::new();
        h.insert(AUDIT_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(ensure_audit_id(&mut h), "abc-123");
        let mut h = HeaderMap::new();
        let id = ensure_audit_id(&mut h);
        assert_eq!(id.len(), 36);
        assert_eq!(h[AUDIT_ID], id);
        let mut h = HeaderMap::new();
        h.insert(AUDIT_ID, HeaderValue::from_static("has space"));
        assert_ne!(ensure_audit_id(&mut h), "has space");
    }

    #[test]
    fn source_ips_follow_kube() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("10.0.0.1, 10.0.0.2"),
        );
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            source_ips(&h, Some(peer)),
            ["10.0.0.1", "10.0.0.2", "127.0.0.1"]
        );
        assert_eq!(source_ips(&HeaderMap::new(), Some(peer)), ["127.0.0.1"]);
    }

    #[test]
    fn event_has_kube_shape() {
        let event = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: "Metadata",
            audit_id: "id".into(),
            stage: "ResponseComplete",
            request_uri: "/apis/x/v1/foos?limit=1".into(),
            verb: "list".into(),
            user: EventUser::from(&UserInfo::authenticated(
                "alice".into(),
                String::new(),
                vec!["dev".into()],
                BTreeMap::new(),
            )),
            impersonated_user: None,
            source_ips: vec!["127.0.0.1".into()],
            user_agent: None,
            response_status: ResponseStatus { code: 200 },
            request_received_timestamp: "t0".into(),
            stage_timestamp: "t1".into(),
            annotations: BTreeMap::from([("authorization.k8s.io/decision", "allow".into())]),
        };
        let v = serde_json::to_value(&event).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                "auditID": "id", "stage": "ResponseComplete", "requestURI": "/apis/x/v1/foos?limit=1",
                "verb": "list", "user": {"username": "alice", "groups": ["dev", "system:authenticated"]},
                "sourceIPs": ["127.0.0.1"], "responseStatus": {"code": 200},
                "requestReceivedTimestamp": "t0", "stageTimestamp": "t1",
                "annotations": {"authorization.k8s.io/decision": "allow"}})
        );
    }
}
