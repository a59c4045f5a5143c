//! Spreading a Service's requests over its endpoints, and keeping a sick one out.
//!
//! kube-aggregator with `--enable-aggregator-routing` picks a random endpoint per request and
//! keeps sending to a dead one until the EndpointSlice drops it. Here, per Service:
//! * **Power of two choices.** Two endpoints are drawn at random and the one with fewer
//!   requests in flight gets the request: a slow pod collects fewer, with no shared queue.
//! * **Ejection.** An endpoint whose request failed in transport (it could not be reached, or
//!   its connection broke before the answer; see `retry::Failure`) is taken out at once, for
//!   [`EJECTION_BASE`], doubled on each ejection in a row up to [`EJECTION_MAX`]. When the time
//!   is up it is probed (the availability probe's request, on that endpoint only) and
//!   re-admitted only if the probe passes; a failed probe ejects it again, for longer. Answers
//!   with a 5xx status do not count: the backend answered, and kube's servers answer 5xx for
//!   reasons every replica shares (their storage is down), where ejecting would only shift
//!   load.
//! * **Never nowhere.** When every endpoint is ejected they are all used again: a guess beats a
//!   certain 503.
//!
//! With one endpoint (ClusterIP routing), all of this reduces to that endpoint.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use apiservice::resolve::Endpoint;
use backon::{BackoffBuilder, ExponentialBuilder};
use http::uri::Authority;
use tokio::time::Instant;

/// The first ejection's length.
pub const EJECTION_BASE: Duration = Duration::from_secs(1);
/// The longest ejection.
pub const EJECTION_MAX: Duration = Duration::from_secs(30);
/// Probes of an ejected endpoint before it is forgotten (it has likely left the Service; if
/// not, its next failure ejects it again).
const MAX_PROBES: u32 = 20;

/// Checks one endpoint: `true` when it answered as a healthy backend does.
pub type ProbeFn =
    Arc<dyn Fn(Authority) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Why no endpoint could be picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    #[error("the Service has no endpoints")]
    NoEndpoints,
    #[error("resolved address {0:?} is not valid")]
    InvalidAddress(String),
}

/// The endpoints of one Service and their health; see the module docs.
pub struct Balancer {
    endpoints: Mutex<HashMap<Endpoint, Arc<EndpointHealth>>>,
    /// Endpoints ejected now; while 0, picking reads no health state.
    ejected: AtomicUsize,
    probe: ProbeFn,
}

/// What is known of one endpoint.
pub struct EndpointHealth {
    pub authority: Authority,
    in_flight: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    ejected: bool,
    /// Ejections in a row (each one doubles the next), reset by a success after
    /// [`EJECTION_MAX`] in service.
    ejections: u32,
    admitted_at: Option<Instant>,
}

/// The endpoint a request is sent to. Counts as in flight until dropped; hand it to the
/// response body so a stream counts for as long as it lasts.
pub struct Picked {
    pub health: Arc<EndpointHealth>,
}

// === impl Picked ===

impl Drop for Picked {
    fn drop(&mut self) {
        self.health.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl Balancer ===

impl Balancer {
    pub fn new(probe: ProbeFn) -> Arc<Self> {
        Arc::new(Self {
            endpoints: Mutex::new(HashMap::new()),
            ejected: AtomicUsize::new(0),
            probe,
        })
    }

    /// An endpoint of `candidates` for the next request, other than `avoid` when there is
    /// another; `Err` when an address is not a valid authority.
    pub fn pick(
        &self,
        candidates: &[Endpoint],
        avoid: Option<&Authority>,
    ) -> Result<Picked, PickError> {
        let mut endpoints = lock(&self.endpoints);
        // Pods come and go: forget endpoints the Service no longer has (an ejected one is kept
        // until its probes end, so its ejection count survives a brief absence).
        if endpoints.len() > 2 * candidates.len() + 16 {
            endpoints.retain(|e, h| candidates.contains(e) || lock(&h.state).ejected);
        }
        let mut health = |e: &Endpoint| -> Result<Arc<EndpointHealth>, PickError> {
            if let Some(h) = endpoints.get(e) {
                return Ok(h.clone());
            }
            let authority: Authority = e
                .authority()
                .parse()
                .map_err(|_| PickError::InvalidAddress(e.authority()))?;
            let h = Arc::new(EndpointHealth {
                authority,
                in_flight: AtomicUsize::new(0),
                state: Mutex::new(State::default()),
            });
            endpoints.insert(e.clone(), h.clone());
            Ok(h)
        };
        let chosen = if candidates.len() <= 1 {
            match candidates.first() {
                Some(e) => health(e)?,
                None => return Err(PickError::NoEndpoints),
            }
        } else {
            let mut usable = Vec::with_capacity(candidates.len());
            let any_ejected = self.ejected.load(Ordering::Relaxed) > 0;
            for e in candidates {
                let h = health(e)?;
                if avoid == Some(&h.authority) || (any_ejected && lock(&h.state).ejected) {
                    continue;
                }
                usable.push(h);
            }
            if usable.is_empty() {
                // Every endpoint is ejected (or the only other one failed just now).
                for e in candidates {
                    let h = health(e)?;
                    if avoid != Some(&h.authority) || candidates.len() == 1 {
                        usable.push(h);
                    }
                }
            }
            match usable.len() {
                0 => health(&candidates[0])?,
                1 => usable.swap_remove(0),
                n => {
                    let a = fastrand::usize(..n);
                    let mut b = fastrand::usize(..n - 1);
                    if b >= a {
                        b += 1;
                    }
                    let load = |i: usize| usable[i].in_flight.load(Ordering::Relaxed);
                    let i = if load(b) < load(a) { b } else { a };
                    usable.swap_remove(i)
                }
            }
        };
        drop(endpoints);
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Picked { health: chosen })
    }

    /// A request on `picked` got its answer.
    pub fn succeeded(&self, picked: &Picked) {
        let mut state = lock(&picked.health.state);
        if state.ejections > 0
            && !state.ejected
            && state
                .admitted_at
                .is_some_and(|t| t.elapsed() >= EJECTION_MAX)
        {
            state.ejections = 0;
        }
    }

    /// A request on `picked` failed in transport: eject the endpoint (see the module docs),
    /// unless it is the Service's only one (`alone`), which ejecting would not spare anything.
    pub fn failed(self: &Arc<Self>, picked: &Picked, alone: bool, why: &str) {
        if alone {
            return;
        }
        let health = &picked.health;
        let interval = {
            let mut state = lock(&health.state);
            if state.ejected {
                return;
            }
            state.ejected = true;
            state.ejections += 1;
            ejection_interval(state.ejections)
        };
        self.ejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            endpoint = %health.authority,
            error = why,
            ejected_for = ?interval,
            "backend endpoint ejected"
        );
        tokio::spawn(readmit(Arc::downgrade(self), health.clone(), interval));
    }

    #[cfg(test)]
    fn is_ejected(&self, authority: &str) -> bool {
        lock(&self.endpoints)
            .values()
            .any(|h| h.authority == authority && lock(&h.state).ejected)
    }
}

/// 1 s, 2 s, 4 s, ... up to [`EJECTION_MAX`].
fn ejection_interval(ejections: u32) -> Duration {
    EJECTION_BASE
        .saturating_mul(1 << ejections.saturating_sub(1).min(16))
        .min(EJECTION_MAX)
}

/// Waits out an ejection, then probes the endpoint until it passes (re-admitted) or the
/// balancer is gone; gives up, forgetting the endpoint, after [`MAX_PROBES`]. The waits are
/// `backon`'s exponential backoff (as the work queue's), from the ejection's length up to
/// [`EJECTION_MAX`]: the same steps as [`ejection_interval`], without jitter.
async fn readmit(balancer: Weak<Balancer>, health: Arc<EndpointHealth>, ejected_for: Duration) {
    let waits = ExponentialBuilder::default()
        .with_min_delay(ejected_for)
        .with_max_delay(EJECTION_MAX)
        .with_factor(2.0)
        .with_max_times(MAX_PROBES as usize)
        .build();
    for wait in waits {
        tokio::time::sleep(wait).await;
        let Some(b) = balancer.upgrade() else { return };
        let probe = (b.probe)(health.authority.clone());
        drop(b);
        let passed = probe.await;
        let Some(b) = balancer.upgrade() else { return };
        let mut state = lock(&health.state);
        if passed {
            state.ejected = false;
            state.admitted_at = Some(Instant::now());
            drop(state);
            b.ejected.fetch_sub(1, Ordering::Relaxed);
            tracing::info!(endpoint = %health.authority, "backend endpoint re-admitted after a passing probe");
            return;
        }
        // A failed probe counts as an ejection in a row: the next ejection starts longer.
        state.ejections += 1;
    }
    if let Some(b) = balancer.upgrade() {
        lock(&b.endpoints).retain(|_, h| !Arc::ptr_eq(h, &health));
        b.ejected.fetch_sub(1, Ordering::Relaxed);
        tracing::info!(endpoint = %health.authority, "backend endpoint forgotten after failing {MAX_PROBES} probes");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn endpoints(n: u16) -> Vec<Endpoint> {
        (1..=n).map(|p| Endpoint::new("127.0.0.1", p)).collect()
    }

    fn probe_passing(passes: Arc<AtomicBool>) -> ProbeFn {
        Arc::new(move |_| {
            let passes = passes.clone();
            Box::pin(async move { passes.load(Ordering::Relaxed) })
        })
    }

    #[tokio::test]
    async fn the_less_busy_of_two_gets_the_request() {
        let b = Balancer::new(probe_passing(Arc::new(AtomicBool::new(true))));
        let two = endpoints(2);
        // Hold ten requests on the first endpoint: every pick goes to the second.
        let busy: Vec<_> = (0..10).map(|_| b.pick(&two[..1], None).unwrap()).collect();
        for _ in 0..20 {
            let p = b.pick(&two, None).unwrap();
            assert_eq!(p.health.authority, "127.0.0.1:2");
        }
        drop(busy);
        // Idle again: both are used.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            seen.insert(b.pick(&two, None).unwrap().health.authority.to_string());
        }
        assert_eq!(seen.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_endpoint_is_ejected_until_a_probe_passes() {
        let passes = Arc::new(AtomicBool::new(false));
        let b = Balancer::new(probe_passing(passes.clone()));
        let three = endpoints(3);
        let sick = b.pick(&three[2..], None).unwrap();
        b.failed(&sick, false, "connection refused");
        drop(sick);
        for _ in 0..50 {
            assert_ne!(
                b.pick(&three, None).unwrap().health.authority,
                "127.0.0.1:3"
            );
        }
        // The first probe (after 1 s) fails; the next comes 2 s later.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(b.is_ejected("127.0.0.1:3"));
        passes.store(true, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert!(
            !b.is_ejected("127.0.0.1:3"),
            "re-admitted after a passing probe"
        );
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            seen.insert(b.pick(&three, None).unwrap().health.authority.to_string());
        }
        assert_eq!(seen.len(), 3);
    }

    #[tokio::test]
    async fn with_every_endpoint_ejected_they_are_all_used() {
        let b = Balancer::new(probe_passing(Arc::new(AtomicBool::new(false))));
        let two = endpoints(2);
        for e in &two {
            let p = b.pick(std::slice::from_ref(e), None).unwrap();
            b.failed(&p, false, "refused");
        }
        assert!(b.pick(&two, None).is_ok());
        let avoid: Authority = "127.0.0.1:1".parse().unwrap();
        assert_eq!(
            b.pick(&two, Some(&avoid)).unwrap().health.authority,
            "127.0.0.1:2",
            "a retry goes elsewhere when it can"
        );
    }

    #[tokio::test]
    async fn endpoints_that_left_the_service_are_forgotten() {
        let b = Balancer::new(probe_passing(Arc::new(AtomicBool::new(true))));
        for port in 1..=1000u16 {
            let _ = b.pick(&[Endpoint::new("10.0.0.1", port)], None).unwrap();
        }
        assert!(
            lock(&b.endpoints).len() <= 2 + 16 + 1,
            "pod churn grows the map"
        );
    }

    #[test]
    fn ejections_grow_to_a_limit() {
        assert_eq!(ejection_interval(1), Duration::from_secs(1));
        assert_eq!(ejection_interval(3), Duration::from_secs(4));
        assert_eq!(ejection_interval(40), EJECTION_MAX);
    }
}
