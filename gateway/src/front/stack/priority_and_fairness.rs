//! API Priority and Fairness at the front door (kube's `WithPriorityAndFairness` filter,
//! `k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go`), over the machinery of
//! `crate::control::flowcontrol`.
//!
//! Each request is classified on the caller's effective identity (authentication and
//! impersonation are above this layer) and asks its priority level for seats: it runs at once,
//! waits in its flow's queue, or is refused with kube's 429 (`Retry-After` and the
//! `X-Kubernetes-PF-FlowSchema-UID` and `X-Kubernetes-PF-PriorityLevel-UID` headers, which every
//! answer carries). A queued request waits a quarter of its own time limit at most.
//!
//! What a request holds, and for how long, is kube's:
//! * an ordinary request: its seats until its response body is finished or dropped, because a
//!   large list still occupies the server (and here the gateway's buffers) while it streams;
//! * a watch: its seats only while it starts, here until the core's response headers arrive
//!   (the watch has been accepted and begins to stream), or until the router hands it to a
//!   remote APIService, whose own flow control takes it from there (kube-aggregator's
//!   `RequestDelegated`: a watch held by an aggregated server that has not answered, or by a
//!   caller that never sends its body, must not hold seats here). The seats ride in the
//!   request as an [`WatchInitialization`] for that. The watch then counts, for as long as it
//!   streams, among the watches a write may wake (see
//!   `gateway_flowcontrol::request::watch_tracker`);
//! * exec, attach, port-forward, log, proxy and what an APIService declares long-running: not
//!   seen at all, as kube does not track them.
//!
//! The layer sits below the timeout, as kube's filter sits inside its timeout filter: time spent
//! in a queue is part of the request's time, and a response the client does not read is cut at
//! the timeout, which gives its seats back. It sits above authorization, so a request waits for
//! a seat before its SubjectAccessReview is paid for.
//!
//! With `--enable-priority-and-fairness=false` the layer is not in the stack and `limits` keeps
//! kube's older max-in-flight limits instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::Either;
use gateway_flowcontrol::request::list_sizes::ListKey;
use gateway_flowcontrol::request::watch_tracker::Registration;
use gateway_flowcontrol::{
    self as flowcontrol, Admission, FlowControl, Refusal, Schema, Seat, Waiting,
};
use http::header::HeaderName;
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::take_inner;
use super::timeout;
use crate::body::{self, BoxError, BoxFuture, Request, Response};
use crate::error::Terminated;
use crate::extensions::WatchInitialization;
use crate::identity::UserInfo;
use crate::metrics::Metrics;
use crate::request_info::RequestInfo;
use crate::status::{status_response, StatusDetails};

const FLOW_SCHEMA_UID: HeaderName = HeaderName::from_static(flowcontrol::FLOW_SCHEMA_UID_HEADER);
const PRIORITY_LEVEL_UID: HeaderName =
    HeaderName::from_static(flowcontrol::PRIORITY_LEVEL_UID_HEADER);

/// kube's words for a refusal.
const TOO_MANY_REQUESTS: &str = "Too many requests, please try again later.";

/// What every clone of the service shares.
struct Shared {
    flow_control: Arc<FlowControl>,
    /// `--request-timeout`: an ordinary request's time limit, which its `?timeout=` may shorten.
    request_timeout: Duration,
    /// `apiserver_current_inflight_requests`: requests executing (not waiting), as kube's filter
    /// counts them.
    metrics: Arc<Metrics>,
}

#[derive(Clone)]
pub struct PriorityAndFairness<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> PriorityAndFairness<S> {
    pub fn layer(
        flow_control: Arc<FlowControl>,
        request_timeout: Duration,
        metrics: &Arc<Metrics>,
    ) -> impl Layer<S, Service = Self> + Clone {
        let shared = Arc::new(Shared {
            flow_control,
            request_timeout,
            metrics: Arc::clone(metrics),
        });
        layer_fn(move |inner| Self {
            inner,
            shared: shared.clone(),
        })
    }
}

impl<S> Service<Request> for PriorityAndFairness<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    /// A request that runs at once (the usual case) or passes by costs no future of this
    /// layer's own; one that waits for its seats, or is refused, is boxed.
    type Future = Either<Running<S::Future>, BoxFuture<Result<Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // The request-info layer above answers a request it cannot parse itself.
        let Some(info) = req.extensions().get::<Arc<RequestInfo>>() else {
            return Either::Left(Running::passed_by(self.inner.call(req)));
        };
        let is_watch = info.verb() == "watch";
        if info.long_running && !is_watch {
            return Either::Left(Running::passed_by(self.inner.call(req)));
        }
        match self.shared.start(&mut req, is_watch) {
            Admission::Run(run) => Either::Left(Running {
                inner: self.inner.call(req),
                run: Some((run, self.shared.clone(), is_watch)),
            }),
            Admission::Reject(resp) => Either::Right(Box::pin(std::future::ready(Ok(resp)))),
            Admission::Wait((class, waiting)) => {
                let shared = self.shared.clone();
                let mut inner = take_inner(&mut self.inner);
                Either::Right(Box::pin(async move {
                    let mut req = req;
                    let run = match waiting.await {
                        Ok(seat) => shared.run(&mut req, class, seat, is_watch),
                        Err(_) => {
                            let retry_after = class.schema.level.retry_after.refused();
                            return Ok(refused(&class.schema, retry_after));
                        }
                    };
                    let resp = inner.call(req).await?;
                    Ok(shared.finish(resp, run, is_watch))
                }))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner call of a request that has its seats (or passes flow control by); its answer
    /// is classified and holds the seats while it streams. A named type, not a boxed `async`
    /// block: the box was an allocation and a copy of the stack below for every request.
    pub struct Running<F> {
        #[pin]
        inner: F,
        run: Option<(Run, Arc<Shared>, bool)>,
    }
}

impl<F> Running<F> {
    fn passed_by(inner: F) -> Self {
        Self { inner, run: None }
    }
}

impl<F> Future for Running<F>
where
    F: Future<Output = Result<Response, BoxError>>,
{
    type Output = Result<Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = ready!(this.inner.poll(cx))?;
        Poll::Ready(Ok(match this.run.take() {
            Some((run, shared, is_watch)) => shared.finish(resp, run, is_watch),
            None => resp,
        }))
    }
}

/// Where a request was classified.
struct Class {
    schema: Arc<Schema>,
    /// A LIST's key, to remember the size of its answer.
    list: Option<ListKey>,
}

/// A request given its seats, about to be handed on.
struct Run {
    class: Class,
    held: Held,
    /// A watch's place among the watches a write may wake (none for a watch kube does not
    /// count).
    watch: Option<Registration>,
}

impl Shared {
    /// The answer of a request that ran: classified, and holding its seats (a watch: its place
    /// among the watches) while it streams.
    fn finish(&self, mut resp: Response, run: Run, is_watch: bool) -> Response {
        let Run { class, held, watch } = run;
        classified(resp.headers_mut(), &class.schema);
        let executing = match held {
            Held::Request(executing) => executing,
            Held::Watch(started) => {
                // Started (unless delegated already): the seats go back now; the watch stays
                // counted while it streams.
                debug_assert!(is_watch);
                started.signal();
                return resp.map(|b| body::with_guard(b, watch));
            }
        };
        let list = class
            .list
            .filter(|_| resp.status() == StatusCode::OK)
            .map(|key| (self.flow_control.clone(), key));
        resp.map(|b| body::with_guard(ListSize::new(b, list), executing))
    }

    /// Classifies `req` and asks its level for seats.
    fn start(
        &self,
        req: &mut Request,
        is_watch: bool,
    ) -> Admission<Run, (Class, Waiting), Response> {
        let (info, user, query) = parts(req);
        let timeout = (!is_watch).then(|| timeout::request_limit(self.request_timeout, query));
        let decision = self.flow_control.admit(user, info, query, timeout);
        let class = Class {
            schema: decision.schema,
            list: decision.estimate.list,
        };
        match decision.admission {
            Admission::Run(seat) => Admission::Run(self.run(req, class, seat, is_watch)),
            Admission::Wait(waiting) => Admission::Wait((class, waiting)),
            Admission::Reject(Refusal { retry_after, .. }) => {
                Admission::Reject(refused(&class.schema, retry_after))
            }
        }
    }

    /// Counts `req` as executing with `seat`, and a watch among the watches, as kube does once
    /// a request is admitted. A watch's seats go into its extensions, for the router to give
    /// back when it delegates the watch.
    fn run(&self, req: &mut Request, class: Class, seat: Seat, is_watch: bool) -> Run {
        let (info, _, query) = parts(req);
        let executing = Executing {
            _seat: seat,
            _executing: self.metrics.executing(info.is_mutating()).start(),
        };
        let watch = is_watch
            .then(|| {
                self.flow_control
                    .estimator()
                    .watches()
                    .register(info, query)
            })
            .flatten();
        let held = if is_watch {
            let started = WatchInitialization::holding(executing);
            req.extensions_mut().insert(started.clone());
            Held::Watch(started)
        } else {
            Held::Request(executing)
        };
        Run { class, held, watch }
    }
}

/// What flow control reads of a request that passed the request-info layer.
fn parts(req: &Request) -> (&Arc<RequestInfo>, &Arc<UserInfo>, &str) {
    let info = req
        .extensions()
        .get::<Arc<RequestInfo>>()
        .expect("checked before the request was classified");
    let user = crate::auth::request_user(req.extensions()).unwrap_or(UserInfo::shared_anonymous());
    (info, user, req.uri().query().unwrap_or(""))
}

/// What an admitted request holds: an ordinary request its seats until its answer is done, a
/// watch until it starts or is delegated.
enum Held {
    Request(Executing),
    Watch(WatchInitialization),
}

/// A request's seats and its count among the executing requests, until it is done.
struct Executing {
    _seat: Seat,
    _executing: crate::metrics::inflight::Executing,
}

/// Names, by UID, the FlowSchema and the priority level of the request, as kube-apiserver does
/// on every answer (replacing the core's, which name the core's classification of the
/// gateway's request).
fn classified(headers: &mut HeaderMap, schema: &Schema) {
    if !schema.schema_uid.is_empty() {
        headers.insert(FLOW_SCHEMA_UID, schema.schema_uid.clone());
    }
    if !schema.level_uid.is_empty() {
        headers.insert(PRIORITY_LEVEL_UID, schema.level_uid.clone());
    }
}

/// kube's refusal: 429 with `Retry-After` (and the Status's `retryAfterSeconds`), counted as a
/// termination in self-defense.
fn refused(schema: &Schema, retry_after: i64) -> Response {
    let details = StatusDetails {
        retry_after_seconds: Some(retry_after.clamp(1, i64::from(u32::MAX)) as u32),
        ..Default::default()
    };
    let mut resp = status_response(
        StatusCode::TOO_MANY_REQUESTS,
        TOO_MANY_REQUESTS,
        Some(details),
    );
    classified(resp.headers_mut(), schema);
    resp.extensions_mut().insert(Terminated);
    resp
}

pin_project_lite::pin_project! {
    /// A LIST's answer, counted as it streams; its size is remembered for the next estimate of
    /// the same LIST once it is complete (an answer cut short says nothing about its size).
    struct ListSize<B> {
        #[pin]
        inner: B,
        bytes: u64,
        record: Option<(Arc<FlowControl>, ListKey)>,
    }
}

impl<B> ListSize<B> {
    fn new(inner: B, record: Option<(Arc<FlowControl>, ListKey)>) -> Self {
        Self {
            inner,
            bytes: 0,
            record,
        }
    }
}

impl<B> http_body::Body for ListSize<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        if this.record.is_none() {
            return this.inner.poll_frame(cx);
        }
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    *this.bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    record(this.record, *this.bytes);
                }
            }
            None => record(this.record, *this.bytes),
            Some(Err(_)) => *this.record = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn record(record: &mut Option<(Arc<FlowControl>, ListKey)>, bytes: u64) {
    if let Some((flow_control, key)) = record.take() {
        flow_control.estimator().record_list(key, bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::Method;
    use http_body_util::BodyExt;
    use serde_json::json;
    use tower::ServiceExt;

    use super::*;
    use crate::front::stack::request_info::RequestInfoService;
    use crate::status::status_json;

    /// A body that never ends, as a watch's or a large list's.
    fn endless() -> body::Body {
        body::boxed(http_body_util::StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, BoxError>,
        >()))
    }

    /// Flow control with one level, `one`, of one seat, whose limit response is `limit`
    /// (`Reject`, or `Queue`), classifying every authenticated request into it.
    fn one_seat(limit: serde_json::Value) -> Arc<FlowControl> {
        let fc = FlowControl::new(1, Duration::from_secs(15), &prometheus::Registry::new());
        let levels = vec![serde_json::from_value(json!({
            "metadata": {"name": "one", "uid": "level-uid"},
            "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 100,
                "limitResponse": limit}}
        }))
        .unwrap()];
        let schemas = vec![serde_json::from_value(json!({
            "metadata": {"name": "everyone", "uid": "schema-uid"},
            "spec": {"priorityLevelConfiguration": {"name": "one"}, "matchingPrecedence": 100,
                "rules": [{"subjects": [{"kind": "Group", "group": {"name": "system:authenticated"}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                        "namespaces": ["*"], "clusterScope": true}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}
        }))
        .unwrap()];
        fc.controller().apply(levels, schemas);
        Arc::new(fc)
    }

    fn reject() -> serde_json::Value {
        json!({"type": "Reject"})
    }

    /// request_info then priority and fairness over `inner`, as in the real stack.
    fn stack<S>(fc: &Arc<FlowControl>, inner: S) -> RequestInfoService<PriorityAndFairness<S>> {
        let metrics = Arc::new(Metrics::new());
        let apf =
            PriorityAndFairness::layer(fc.clone(), Duration::from_secs(60), &metrics).layer(inner);
        RequestInfoService::layer(None).layer(apf)
    }

    fn request(method: Method, target: &str) -> Request {
        let mut req = http::Request::builder()
            .method(method)
            .uri(target)
            .body(body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(Arc::new(UserInfo::authenticated(
                "alice".into(),
                String::new(),
                Vec::new(),
                Default::default(),
            )));
        req
    }

    /// Answers every request with an endless body (it holds its seats until dropped).
    fn holding() -> impl Service<Request, Response = Response, Error = BoxError, Future = impl Send>
           + Clone
           + Send
           + 'static {
        tower::service_fn(|_req: Request| async { Ok::<_, BoxError>(Response::new(endless())) })
    }

    async fn send<S>(svc: &S, method: Method, target: &str) -> Response
    where
        S: Service<Request, Response = Response, Error = BoxError> + Clone,
    {
        svc.clone().oneshot(request(method, target)).await.unwrap()
    }

    #[tokio::test]
    async fn a_refusal_is_kubes_429_and_every_answer_names_schema_and_level() {
        let fc = one_seat(reject());
        let svc = stack(&fc, holding());
        let cms = "/api/v1/namespaces/x/configmaps";
        let held = send(&svc, Method::GET, cms).await;
        assert_eq!(held.status(), StatusCode::OK);
        assert_eq!(
            held.headers()["x-kubernetes-pf-flowschema-uid"],
            "schema-uid"
        );
        assert_eq!(
            held.headers()["x-kubernetes-pf-prioritylevel-uid"],
            "level-uid"
        );

        let refused = send(&svc, Method::GET, cms).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()["retry-after"], "1");
        assert_eq!(
            refused.headers()["x-kubernetes-pf-flowschema-uid"],
            "schema-uid"
        );
        assert_eq!(
            refused.headers()["x-kubernetes-pf-prioritylevel-uid"],
            "level-uid"
        );
        assert!(refused.extensions().get::<Terminated>().is_some());
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        let details = StatusDetails {
            retry_after_seconds: Some(1),
            ..Default::default()
        };
        assert_eq!(
            body,
            status_json(
                StatusCode::TOO_MANY_REQUESTS,
                TOO_MANY_REQUESTS,
                Some(&details)
            )
        );

        // The seat comes back when the answer's body is done with, not at its headers.
        drop(held);
        assert_eq!(send(&svc, Method::GET, cms).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_watch_holds_its_seats_while_it_starts_and_exec_none_at_all() {
        let fc = one_seat(reject());
        let svc = stack(&fc, holding());
        let watch = send(&svc, Method::GET, "/api/v1/namespaces/x/configmaps?watch=1").await;
        assert_eq!(watch.status(), StatusCode::OK);
        assert_eq!(
            watch.headers()["x-kubernetes-pf-flowschema-uid"],
            "schema-uid"
        );
        let exec = send(&svc, Method::POST, "/api/v1/namespaces/x/pods/p/exec").await;
        assert!(exec
            .headers()
            .get("x-kubernetes-pf-flowschema-uid")
            .is_none());
        // Both stream on, and the one seat is free.
        let get = send(&svc, Method::GET, "/api/v1/namespaces/x/configmaps/c").await;
        assert_eq!(get.status(), StatusCode::OK);
        // The watch is counted among those a write to its configmaps wakes.
        let info =
            crate::request_info::parse(&Method::PUT, "/api/v1/namespaces/x/configmaps/c", "")
                .unwrap();
        assert_eq!(fc.estimator().watches().interested(&info), 1);
        drop(watch);
        assert_eq!(fc.estimator().watches().interested(&info), 0);
        drop((exec, get));
    }

    /// Issue 39, row 1: a watch the router hands to a remote APIService gives its seats back
    /// there, as kube-aggregator's proxy does, even though its answer never comes (a backend that
    /// does not answer, a caller that never sends the body it declared). An ordinary request
    /// handed on the same way keeps its seats.
    #[tokio::test]
    async fn a_delegated_watch_gives_its_seats_back_before_its_answer() {
        let fc = one_seat(reject());
        let delegating = tower::service_fn(|req: Request| async move {
            WatchInitialization::delegated(req.extensions());
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Response::new(body::empty()))
        });
        let svc = stack(&fc, delegating);
        let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/x/flunders";
        let watching = format!("{flunders}?watch=1");
        let mut watch = std::pin::pin!(send(&svc, Method::GET, &watching));
        assert!(futures::poll!(&mut watch).is_pending());
        let mut get = std::pin::pin!(send(&svc, Method::GET, flunders));
        assert!(
            futures::poll!(&mut get).is_pending(),
            "the GET has the seat the watch gave back, and is handed on"
        );
        let refused = send(&svc, Method::GET, flunders).await;
        assert_eq!(
            refused.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the GET, delegated too, keeps its seat"
        );
    }

    #[tokio::test]
    async fn a_queued_request_is_served_when_the_seat_frees() {
        let fc = one_seat(json!({"type": "Queue",
            "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 10}}));
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = {
            let calls = calls.clone();
            tower::service_fn(move |_req: Request| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(Response::new(endless())) }
            })
        };
        let svc = stack(&fc, inner);
        let held = send(&svc, Method::GET, "/version").await;
        let mut queued = std::pin::pin!(send(&svc, Method::GET, "/version"));
        assert!(futures::poll!(&mut queued).is_pending());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the second waits in its queue"
        );
        drop(held);
        assert_eq!(queued.await.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_request_waits_a_quarter_of_its_own_timeout() {
        let fc = one_seat(json!({"type": "Queue",
            "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 10}}));
        let svc = stack(&fc, holding());
        let held = send(&svc, Method::GET, "/version").await;
        let started = tokio::time::Instant::now();
        let refused = send(&svc, Method::GET, "/version?timeout=2s").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        // Without one: a quarter of --request-timeout.
        let started = tokio::time::Instant::now();
        let refused = send(&svc, Method::GET, "/version").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(started.elapsed(), Duration::from_secs(15));
        drop(held);
    }

    #[tokio::test]
    async fn a_lists_answer_sets_the_seats_of_the_next_one() {
        let fc = FlowControl::new(600, Duration::from_secs(15), &prometheus::Registry::new());
        crate::control::flowcontrol::source::use_built_in(&fc);
        let fc = Arc::new(fc);
        let inner = tower::service_fn(|req: Request| async move {
            let status = if req.uri().path().ends_with("/secrets") {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            let mut resp = Response::new(body::full(vec![b' '; 750_000]));
            *resp.status_mut() = status;
            Ok::<_, BoxError>(resp)
        });
        let svc = stack(&fc, inner);
        let seats = |target: &str| {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let info = crate::request_info::parse(&Method::GET, path, query).unwrap();
            fc.estimator().estimate(&info, query, 0).work.initial_seats
        };
        let list = "/api/v1/namespaces/x/configmaps";
        assert_eq!(seats(list), 1);
        let resp = send(&svc, Method::GET, list).await;
        // Counted as it streams: nothing is known before the body is read.
        assert_eq!(seats(list), 1);
        resp.into_body().collect().await.unwrap();
        assert_eq!(seats(list), 8);
        // A refusal of a LIST says nothing about its size.
        let other = "/api/v1/namespaces/x/secrets";
        let resp = send(&svc, Method::GET, other).await;
        resp.into_body().collect().await.unwrap();
        assert_eq!(seats(other), 1);
    }
}
