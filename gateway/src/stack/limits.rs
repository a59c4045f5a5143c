//! In-flight limits (kube-apiserver's --max-requests-inflight and
//! --max-mutating-requests-inflight) answered with 429 and `Retry-After`, and the request body
//! limit answered with 413. Long-running requests are not counted: they would otherwise hold
//! slots for hours.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::CONTENT_LENGTH;
use http_body_util::Limited;
use prometheus::IntGauge as Gauge;
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::BoxFuture;
use crate::body::{self, BoxError, Request, Response};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::request_info::RequestInfo;

struct Slots {
    limit: u32,
    used: AtomicU32,
}

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

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

struct InflightGuard {
    _slot: SlotGuard,
    gauge: Gauge,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The limits and their counters, shared by every clone of the service.
#[derive(Clone)]
struct Shared {
    readonly: Arc<Slots>,
    mutating: Arc<Slots>,
    max_body: u64,
    metrics: Arc<Metrics>,
}

#[derive(Clone)]
pub struct LimitsService<S> {
    inner: S,
    limits: Shared,
}

impl<S> LimitsService<S> {
    pub fn layer(
        limits: &gateway_config::Limits,
        metrics: Arc<Metrics>,
    ) -> impl Layer<S, Service = Self> + Clone {
        let slots = |limit| {
            Arc::new(Slots {
                limit,
                used: AtomicU32::new(0),
            })
        };
        let limits = Shared {
            readonly: slots(limits.max_readonly_inflight),
            mutating: slots(limits.max_mutating_inflight),
            max_body: limits.max_request_body_bytes,
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
    type Future = BoxFuture<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let info = req.extensions().get::<RequestInfo>();
        let long_running = info.is_some_and(|i| i.long_running);
        if long_running {
            return Box::pin(self.inner.call(req));
        }
        let mutating = info.is_some_and(|i| i.is_mutating());
        let limits = &self.limits;
        let max_body = limits.max_body;
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max_body) {
            limits
                .metrics
                .rejected
                .with_label_values(&["RequestEntityTooLarge"])
                .inc();
            return Box::pin(
                async move { Err(GatewayError::BodyTooLarge { limit: max_body }.into()) },
            );
        }
        let (slots, kind, kind_name) = if mutating {
            (&limits.mutating, "mutating", "mutating")
        } else {
            (&limits.readonly, "readOnly", "read-only")
        };
        let Some(guard) = slots.try_take() else {
            limits
                .metrics
                .rejected
                .with_label_values(&["TooManyRequests"])
                .inc();
            return Box::pin(async move {
                Err(GatewayError::TooManyRequests { kind: kind_name }.into())
            });
        };
        let gauge = limits.metrics.inflight.with_label_values(&[kind]);
        gauge.inc();
        let guard = InflightGuard {
            _slot: guard,
            gauge,
        };
        // A chunked body has no length up front; Limited ends it with an error past the limit,
        // which the backends report as 413.
        let req = if declared.is_none() && max_body > 0 {
            req.map(|b| body::boxed(Limited::new(b, max_body as usize)))
        } else {
            req
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| body::with_guard(b, guard)))
        })
    }
}
