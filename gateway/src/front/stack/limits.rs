//! In-flight limits (kube-apiserver's --max-requests-inflight and
//! --max-mutating-requests-inflight) answered with 429 and `Retry-After`, and the request body
//! limit answered with 413.
//!
//! The in-flight limits are kube's older filter, in force only with
//! `--enable-priority-and-fairness=false`, as in kube; by default `priority_and_fairness` shares
//! their sum out instead and this layer keeps the body limit alone.
//!
//! Not counted: long-running requests (they would hold slots for hours), and the probes
//! (`GET`/`HEAD` of `/livez`, `/readyz`, `/healthz` and their checks), which kube-apiserver serves
//! at its `exempt` priority level so that a kubelet's probe is never refused for load.
//!
//! The body limit keeps the gateway's own endpoints and the core from large bodies. Requests
//! proxied to a remote APIService are left to that backend, as kube-aggregator leaves them,
//! unless `--apiservice-max-request-body-bytes` sets a cap for them.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route_table::Lookup;
use futures::future::Either;
use http::header::CONTENT_LENGTH;
use http::Method;
use http_body_util::Limited;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use crate::body::BoxFuture;
use crate::body::{self, BoxError, Request, Response};
use crate::control::apiservices::{Routing, Target};
use crate::error::GatewayError;
use crate::handlers::health::Endpoint;
use crate::metrics::inflight::Executing;
use crate::metrics::Metrics;
use crate::request_info::{decided_path, RequestInfo};

struct Slots {
    limit: u32,
    used: AtomicU32,
}

// === impl Slots ===

impl Slots {
    fn try_take(self: &Arc<Self>) -> Option<SlotGuard> {
        if self.limit == 0 {
            self.used.fetch_add(1, Ordering::AcqRel);
            return Some(SlotGuard(self.clone()));
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| SlotGuard(self.clone()))
    }
}

/// Frees its slot (and the gauge) when the response body is finished or dropped, not when
/// headers are sent: a large list still occupies the server while it streams.
struct SlotGuard(Arc<Slots>);

// === impl SlotGuard ===

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

struct InflightGuard {
    _slot: SlotGuard,
    _executing: Executing,
}

/// The limits and their counters, shared by every clone of the service.
#[derive(Clone)]
struct Shared {
    /// Without priority and fairness: the two in-flight limits.
    inflight: bool,
    readonly: Arc<Slots>,
    mutating: Arc<Slots>,
    /// 0: no limit.
    max_body: u64,
    /// For requests to remote APIServices; 0: no limit.
    max_remote_body: u64,
    /// Where a request with a body is going, to choose its limit.
    routing: Option<Arc<Routing>>,
    metrics: Arc<Metrics>,
}

// === impl Shared ===

impl Shared {
    /// The body limit for `req` (0: none): the remote one when the routing snapshot sends it to
    /// a remote APIService.
    fn body_limit(&self, req: &Request, info: Option<&RequestInfo>) -> u64 {
        let Some(routing) = &self.routing else {
            return self.max_body;
        };
        let path = info.map_or(req.uri().path(), |i| i.path());
        let table = routing.load_full();
        match table.lookup(path) {
            Lookup::GroupVersion(route) | Lookup::LegacyCore(route)
                if matches!(route.backend.target, Target::Remote(_)) =>
            {
                self.max_remote_body
            }
            _ => self.max_body,
        }
    }
}

/// A probe kube-apiserver would serve at its `exempt` priority level: one the router answers
/// itself, so on the path it answers by (the decoded one).
fn is_probe(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && Endpoint::from_path(decided_path(req)).is_some()
}

#[derive(Clone)]
pub struct LimitsService<S> {
    inner: S,
    limits: Shared,
}

// === impl LimitsService ===

impl<S> LimitsService<S> {
    /// `routing` tells requests to remote APIServices apart (their body limit is
    /// `apiservice_max_request_body_bytes`); without it every request gets `max_request_body_bytes`.
    pub fn layer(
        limits: &gateway_config::Limits,
        routing: Option<Arc<Routing>>,
        metrics: Arc<Metrics>,
    ) -> impl Layer<S, Service = Self> + Clone {
        let slots = |limit| {
            Arc::new(Slots {
                limit,
                used: AtomicU32::new(0),
            })
        };
        let limits = Shared {
            inflight: !limits.priority_and_fairness,
            readonly: slots(limits.max_requests_inflight),
            mutating: slots(limits.max_mutating_requests_inflight),
            max_body: limits.max_request_body_bytes,
            max_remote_body: limits.apiservice_max_request_body_bytes,
            routing,
            metrics,
        };
        layer_fn(move |inner| Self {
            inner,
            limits: limits.clone(),
        })
    }
}

impl<S> Service<Request> for LimitsService<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    /// A request with nothing to watch (no in-flight slot, no chunked body: with priority and
    /// fairness on, every GET) is the inner call itself, with no future of this layer's own.
    type Future = Either<S::Future, BoxFuture<Result<Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let info = req.extensions().get::<Arc<RequestInfo>>().map(|i| &**i);
        let long_running = info.is_some_and(|i| i.long_running);
        if long_running || is_probe(&req) {
            return Either::Left(self.inner.call(req));
        }
        let mutating = info.is_some_and(|i| i.is_mutating());
        let limits = &self.limits;
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // Only a body that may be over the limit costs a look at the routes.
        let may_exceed = match declared {
            Some(n) => limits.max_body > 0 && n > limits.max_body,
            None => !http_body::Body::is_end_stream(req.body()),
        };
        let max_body = if may_exceed {
            limits.body_limit(&req, info)
        } else {
            limits.max_body
        };
        if max_body > 0 && declared.is_some_and(|n| n > max_body) {
            return Either::Right(too_large(max_body));
        }
        let guard = if limits.inflight {
            match limits.take_slot(mutating) {
                Ok(guard) => Some(guard),
                Err(refused) => return Either::Right(Box::pin(async move { Err(refused.into()) })),
            }
        } else {
            None
        };
        // A chunked body has no length up front: it is cut at the limit, and the failure it
        // causes downstream (the backend's request fails) is answered as the 413 it is. A body
        // already at its end (a GET's) has nothing to cut.
        let chunked =
            declared.is_none() && max_body > 0 && !http_body::Body::is_end_stream(req.body());
        if guard.is_none() && !chunked {
            return Either::Left(self.inner.call(req));
        }
        let overflow = Arc::new(AtomicBool::new(false));
        let req = if chunked {
            let seen = overflow.clone();
            req.map(|b| {
                body::boxed(OverflowSeen {
                    inner: Limited::new(b, max_body as usize),
                    seen,
                })
            })
        } else {
            req
        };
        let fut = self.inner.call(req);
        Either::Right(Box::pin(async move {
            let result = fut.await;
            if overflow.load(Ordering::Acquire) {
                drop(result);
                return too_large(max_body).await;
            }
            let resp = result?;
            Ok(match guard {
                Some(guard) => resp.map(|b| body::with_guard(b, guard)),
                None => resp,
            })
        }))
    }
}

impl Shared {
    /// An in-flight slot of the request's kind, or the 429 refusing it.
    fn take_slot(&self, mutating: bool) -> Result<InflightGuard, GatewayError> {
        let (slots, kind_name) = if mutating {
            (&self.mutating, "mutating")
        } else {
            (&self.readonly, "read-only")
        };
        let Some(guard) = slots.try_take() else {
            return Err(GatewayError::TooManyRequests { kind: kind_name });
        };
        Ok(InflightGuard {
            _slot: guard,
            _executing: self.metrics.executing(mutating).start(),
        })
    }
}

fn too_large(limit: u64) -> BoxFuture<Result<Response, BoxError>> {
    Box::pin(async move { Err(GatewayError::BodyTooLarge { limit }.into()) })
}

pin_project_lite::pin_project! {
    /// A length-limited request body that remembers when it hit its limit.
    struct OverflowSeen<B> {
        #[pin]
        inner: Limited<B>,
        seen: Arc<AtomicBool>,
    }
}

// === impl OverflowSeen ===

impl<B> http_body::Body for OverflowSeen<B>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, BoxError>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &frame {
            if e.is::<http_body_util::LengthLimitError>() {
                this.seen.store(true, Ordering::Release);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::header::{CONNECTION, UPGRADE};
    use http::StatusCode;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    use super::*;
    use crate::front::stack::request_info::RequestInfoService;

    /// A GET of `target` as the request-info layer leaves it: parsed.
    fn parsed_get(target: &str) -> Request {
        let mut req = http::Request::get(target).body(body::empty()).unwrap();
        assert!(crate::request_info::ensure_parsed(&mut req), "{target}");
        req
    }

    #[test]
    fn probes_are_told_by_the_path_the_router_answers_on() {
        // The router answers health on the decoded path, so an encoded probe is one too, and a
        // path under `/healthz` naming no check is the health handler's 404: neither ever
        // reaches a backend, so neither takes a seat from those that do.
        for target in [
            "/healthz",
            "/%68ealthz",
            "/readyz/p%69ng",
            "/%68ealthz/../api/v1/namespaces/default/configmaps",
        ] {
            assert!(is_probe(&parsed_get(target)), "{target}");
        }
        for target in [
            "/api/v1/namespaces/healthz/pods",
            "/metrics",
            "/apis/x/v1/healthz",
        ] {
            assert!(!is_probe(&parsed_get(target)), "{target}");
        }
    }

    fn limits(readonly: u32, max_body: u64) -> gateway_config::Limits {
        gateway_config::Limits {
            priority_and_fairness: false,
            max_requests_inflight: readonly,
            max_mutating_requests_inflight: 1,
            request_timeout: Duration::from_secs(60),
            max_request_body_bytes: max_body,
            apiservice_max_request_body_bytes: 0,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 1 << 20,
        }
    }

    /// A body that never ends, as a watch or a large list would keep its slot.
    fn endless() -> body::Body {
        body::boxed(http_body_util::StreamBody::new(futures::stream::pending::<
            Result<http_body::Frame<bytes::Bytes>, BoxError>,
        >()))
    }

    /// The answer as the client gets it (errors become a Status through `rescue`).
    fn status(result: &Result<Response, BoxError>) -> StatusCode {
        match result {
            Ok(resp) => resp.status(),
            Err(e) => match e.downcast_ref::<GatewayError>() {
                Some(e) => e.code(),
                None => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    fn request(method: &str, uri: &str, upgrade: bool) -> Request {
        let mut b = http::Request::builder().method(method).uri(uri);
        if upgrade {
            b = b.header(CONNECTION, "Upgrade").header(UPGRADE, "SPDY/3.1");
        }
        b.body(body::empty()).unwrap()
    }

    /// request_info then limits over `inner`, as in the real stack.
    fn stack<S>(limits: &gateway_config::Limits, inner: S) -> RequestInfoService<LimitsService<S>> {
        let limits = LimitsService::layer(limits, None, Arc::new(Metrics::new())).layer(inner);
        RequestInfoService::layer(None).layer(limits)
    }

    #[tokio::test]
    async fn an_upgrade_to_an_ordinary_resource_is_counted_and_body_limited() {
        let inner = tower::service_fn(|_req: Request| async {
            Ok::<_, BoxError>(Response::new(endless()))
        });
        let svc = stack(&limits(1, 10), inner);
        let configmaps = "/api/v1/namespaces/x/configmaps";

        let held = svc.clone().oneshot(request("GET", configmaps, true)).await;
        assert_eq!(status(&held), StatusCode::OK);
        for upgrade in [true, false] {
            let refused = svc
                .clone()
                .oneshot(request("GET", configmaps, upgrade))
                .await;
            assert_eq!(status(&refused), StatusCode::TOO_MANY_REQUESTS, "{upgrade}");
        }
        // exec is long-running by its subresource, upgrade or not: never counted.
        let exec = svc
            .clone()
            .oneshot(request("POST", "/api/v1/namespaces/x/pods/p/exec", true))
            .await;
        assert_eq!(status(&exec), StatusCode::OK);

        drop(held);
        let after = svc.clone().oneshot(request("GET", configmaps, true)).await;
        assert_eq!(status(&after), StatusCode::OK);
        drop(after);

        let mut big = request("POST", configmaps, true);
        big.headers_mut()
            .insert(CONTENT_LENGTH, http::HeaderValue::from_static("11"));
        let big = svc.clone().oneshot(big).await;
        assert_eq!(status(&big), StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// Reads an HTTP/1.1 response head from `io`.
    async fn read_head(io: &mut tokio::io::DuplexStream) -> String {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(io.read(&mut byte).await.unwrap(), 1, "connection closed");
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    async fn echo(io: &mut tokio::io::DuplexStream, text: &[u8]) {
        io.write_all(text).await.unwrap();
        let mut back = vec![0u8; text.len()];
        io.read_exact(&mut back).await.unwrap();
        assert_eq!(back, text);
    }

    #[tokio::test]
    async fn a_switched_connection_gives_its_slot_back_once_the_101_is_sent() {
        // Answers an upgrade with 101 and echoes the tunnel, as exec endpoints do; the 101
        // carries an endless body, so only hyper dropping it (it cannot send a body after a
        // 101) frees the slot.
        let inner = tower::service_fn(|mut req: Request| async move {
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(upgraded) = on_upgrade.await {
                    let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
            let mut resp = Response::new(endless());
            if crate::backend::proxy::is_upgrade(req.headers()) {
                *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                resp.headers_mut()
                    .insert(CONNECTION, http::HeaderValue::from_static("Upgrade"));
                resp.headers_mut()
                    .insert(UPGRADE, http::HeaderValue::from_static("SPDY/3.1"));
            }
            Ok::<_, BoxError>(resp)
        });
        let svc = stack(&limits(1, 1 << 20), inner);
        let per_conn = {
            let svc = svc.clone();
            tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                svc.clone().oneshot(req.map(body::boxed))
            })
        };
        let (mut client, server) = tokio::io::duplex(4096);
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(server), TowerToHyperService::new(per_conn))
                .with_upgrades(),
        );

        client
            .write_all(
                b"GET /api/v1/namespaces/x/configmaps HTTP/1.1\r\nHost: gw\r\n\
                  Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n",
            )
            .await
            .unwrap();
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        echo(&mut client, b"ping").await;

        // The tunnel is open, and the only read-only slot is free again.
        let next = svc
            .clone()
            .oneshot(request("GET", "/api/v1/namespaces/x/configmaps", false))
            .await;
        assert_eq!(status(&next), StatusCode::OK);
        // A request still streaming its body keeps the slot, as before.
        let refused = svc
            .clone()
            .oneshot(request("GET", "/api/v1/namespaces/x/configmaps", true))
            .await;
        assert_eq!(status(&refused), StatusCode::TOO_MANY_REQUESTS);
        drop(next);
        echo(&mut client, b"still open").await;
    }
}
