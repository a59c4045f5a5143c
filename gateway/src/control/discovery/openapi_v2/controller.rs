//! The loop that keeps `/openapi/v2` current: one [`WorkQueue`] key per spec, as
//! kube-aggregator's OpenAPI `AggregationController` queues one per APIService (ours is per
//! backing Service: several APIServices served by one server share its one spec).
//!
//! * [`Key::Core`]: the core's spec; revalidated every [`RESYNC`], at every change of the
//!   routes, and after every change of the core's CRDs or APIServices at once and a few times
//!   over the next two seconds ([`FollowUps`]); retried within [`RESYNC`] while it fails.
//! * [`Key::Remote`] per backing Service: fetched at once when it first appears, at every
//!   change of the routes while its last fetch succeeded (a conditional GET), when its
//!   APIServices or backend change, when one of its APIServices turns available or unavailable
//!   (the availability controller's transitions, as the route table carries them), and when one
//!   of its connections fails (`FailureSignal::listen`); revalidated [`RESYNC`] after a success;
//!   while it fails, retried with kube-aggregator's backoff, from [`RESYNC`] doubling up to
//!   [`FAILED_MAX`].
//!
//! Fetches run concurrently, one per key at a time, so a backend that hangs until its timeout
//! holds back only its own spec. The merge runs after any fetch that changed a spec (or a change
//! of the contributing APIServices), one merge at a time.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiservice::discovery::openapi_v2_proto::EncodeError;
use apiservice::model::ServiceRef;
use apiservice::outage::Outage;
use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::merge::{build, contributors, set_changes, Contributor};
use super::spec::{log_remote, refresh, Refreshed, SpecState};
use super::OpenApiV2;
use crate::backend::core::CoreBackend;
use crate::backend::remote::RemoteBackend;
use crate::control::apiservices::{Routes, Routing};
use crate::control::discovery::core_watch::FollowUps;
use crate::control::discovery::fetch::Source;
use crate::control::discovery::DiscoveryCache;
use crate::metrics::Metrics;
use crate::workqueue::{Backoff, Next, WorkQueue};

/// How long after a successful fetch a spec is revalidated: kube-aggregator's
/// `successfulUpdateDelay`.
pub const RESYNC: Duration = Duration::from_secs(60);
/// The longest wait between retries of a failing remote spec: kube-aggregator's
/// `failedUpdateMaxExpDelay` (its backoff starts at `successfulUpdateDelay`).
pub const FAILED_MAX: Duration = Duration::from_secs(60 * 60);
/// How often one Service's connection failures may fetch its spec: a backend failing under
/// traffic reports every failed request.
const FAILURE_REFETCH_EVERY: Duration = Duration::from_secs(1);

/// Whose spec a fetch is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Core,
    Remote(ServiceRef),
}

// === impl Key ===

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Core => f.write_str("core"),
            Key::Remote(svc) => write!(f, "{svc}"),
        }
    }
}

/// A remote spec's rates are kube-aggregator's (1 min → 1 h); the core's retry stays within
/// its resync, since the merged document waits for it.
fn backoff(key: &Key) -> Backoff {
    match key {
        Key::Core => Backoff {
            min: Duration::from_millis(500),
            max: RESYNC,
        },
        Key::Remote(_) => Backoff {
            min: RESYNC,
            max: FAILED_MAX,
        },
    }
}

/// What one fetch brings back: the server's spec state after it, and what changed.
type Outcome = (SpecState, Refreshed);

/// Keeps [`DiscoveryCache`]'s `/openapi/v2` current; see the module docs.
pub struct OpenApiV2Controller {
    cache: Arc<DiscoveryCache>,
    core: Arc<CoreBackend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
}

/// One backing Service whose spec is fetched.
struct Remote {
    backend: Arc<RemoteBackend>,
    /// Its APIServices by name, and whether each was available in the last route table.
    available: Vec<(String, bool)>,
    spec: SpecState,
}

/// What a merge gives.
type Built = Result<OpenApiV2, EncodeError>;

/// A merge running on a blocking thread, and what it was started for.
struct Merging {
    task: JoinHandle<Built>,
    contributors: Vec<Contributor>,
    reasons: Vec<(String, &'static str)>,
    started: Instant,
}

/// The loop's state, owned by the loop alone.
#[derive(Default)]
struct State {
    core: SpecState,
    remotes: HashMap<ServiceRef, Remote>,
    /// The contributing APIServices of the last route table; `None` before the first one.
    contributors: Option<Vec<Contributor>>,
    /// The contributors of the document served.
    merged_from: Vec<Contributor>,
    /// Why the next merge runs (a spec added, updated or deleted), by server name.
    reasons: Vec<(String, &'static str)>,
}

// === impl OpenApiV2Controller ===

impl OpenApiV2Controller {
    pub fn new(
        cache: Arc<DiscoveryCache>,
        core: Arc<CoreBackend>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            cache,
            core,
            routing,
            metrics,
        }
    }

    pub async fn run(self) {
        let mut routes = self.routing.subscribe();
        let mut queue: WorkQueue<Key, Outcome> = WorkQueue::new(backoff);
        let mut state = State::default();
        let core_outage = Outage::new(
            "OpenAPI v2 fetch of the core",
            "the last fetched spec stays merged",
        );
        let mut core_changes = self.cache.core_changed.subscribe();
        let mut followups = FollowUps::default();
        let mut merging: Option<Merging> = None;
        queue.queue().add(Key::Core);
        if let Some(table) = routes.borrow_and_update().clone() {
            reconcile(&mut state, &table, &mut queue);
        }
        loop {
            tokio::select! {
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(table) = routes.borrow_and_update().clone() {
                        reconcile(&mut state, &table, &mut queue);
                    }
                }
                // A CRD event (or a CRD write through the gateway) changes the core's spec a
                // moment later: its own OpenAPI controller runs after the CRD is stored. The
                // core is revalidated then, a few times over two seconds, each a conditional GET.
                Ok(()) = core_changes.changed() => followups.start(tokio::time::Instant::now()),
                () = followups.next() => queue.queue().add(Key::Core),
                next = queue.next() => match next {
                    Next::Ready(key) => self.start(&state, &mut queue, key),
                    Next::Done(key, outcome) => finish(&mut state, &mut queue, key, outcome, &core_outage),
                },
                built = async { (&mut merging.as_mut().expect("polled only while merging").task).await }, if merging.is_some() => {
                    let done = merging.take().expect("polled only while merging");
                    self.merged(&mut state, done, built).await;
                }
            }
            if merging.is_none() {
                merging = start_merge(&mut state);
            }
        }
    }

    /// Starts the fetch of `key`'s spec, if its server is still wanted.
    fn start(&self, state: &State, queue: &mut WorkQueue<Key, Outcome>, key: Key) {
        let (source, mut spec) = match &key {
            Key::Core => (Source::Core(self.core.clone()), state.core.clone()),
            Key::Remote(svc) => match state.remotes.get(svc) {
                Some(remote) => (Source::Remote(remote.backend.clone()), remote.spec.clone()),
                None => return queue.forget(&key),
            },
        };
        let span = tracing::debug_span!("openapi_v2_fetch", key = %key);
        let fetch = async move {
            let refreshed = refresh(&source, &mut spec).await;
            (spec, refreshed)
        };
        queue.start(key, fetch.instrument(span));
    }

    /// Publishes a finished merge, with its metrics.
    async fn merged(
        &self,
        state: &mut State,
        done: Merging,
        built: Result<Built, tokio::task::JoinError>,
    ) {
        match built {
            Ok(Ok(doc)) => {
                // The previous document goes with this store (once no request holds it), and
                // the merge's parsed trees went with `build`: hand the memory back now rather
                // than at the next periodic trim.
                self.cache.store_openapi_v2(doc);
                crate::memory::trim_now().await;
                state.merged_from = done.contributors;
                for (apiservice, reason) in &done.reasons {
                    self.metrics
                        .openapi_v2_regeneration_count
                        .with_label_values(&[apiservice.as_str(), reason])
                        .inc();
                }
                let reason = done.reasons.first().map_or("update", |r| r.1);
                self.metrics
                    .openapi_v2_regeneration_duration
                    .with_label_values(&[reason])
                    .set(done.started.elapsed().as_secs_f64());
            }
            // Not tried again before the next change: the same inputs would fail the same way.
            Ok(Err(e)) => {
                state.merged_from = done.contributors;
                tracing::warn!(error = %e, "cannot encode the merged /openapi/v2; serving the previous one")
            }
            Err(e) => {
                state.merged_from = done.contributors;
                tracing::error!(error = %e, "merging /openapi/v2 failed")
            }
        }
    }
}

/// Takes in a new route table: which Services contribute, and which of their specs to fetch now
/// (new, changed backend, an APIService added, removed or turned available or unavailable).
fn reconcile(state: &mut State, table: &Routes, queue: &mut WorkQueue<Key, Outcome>) {
    let (contributors, services) = contributors(table);
    state.remotes.retain(|svc, _| {
        let used = services.contains_key(svc);
        if !used {
            queue.forget(&Key::Remote(svc.clone()));
        }
        used
    });
    for (svc, backing) in services {
        let key = Key::Remote(svc.clone());
        // A connection of the Service failing (reset, a PING unanswered, a connect refused)
        // fetches its spec at once, at most every `FAILURE_REFETCH_EVERY`.
        let (adds, last) = (queue.queue().clone(), Mutex::new(None::<Instant>));
        let refetch = key.clone();
        backing.backend.connections().failures().listen(
            "openapi_v2",
            Arc::new(move || {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                if last.is_none_or(|at| at.elapsed() >= FAILURE_REFETCH_EVERY) {
                    *last = Some(Instant::now());
                    adds.add(refetch.clone());
                }
            }),
        );
        match state.remotes.get_mut(&svc) {
            // Any other change of the routes (an APIService edited, a label included) revalidates
            // the specs that are fine, each a conditional GET: touching an APIService is how an
            // operator makes the gateway read its server's new spec now. A failing one keeps
            // its backoff.
            Some(remote)
                if Arc::ptr_eq(&remote.backend, &backing.backend)
                    && remote.available == backing.available =>
            {
                if !remote.spec.is_failing() {
                    queue.queue().add(key);
                }
            }
            Some(remote) => {
                remote.backend = backing.backend;
                remote.available = backing.available;
                queue.queue().add(key);
            }
            None => {
                state.remotes.insert(
                    svc,
                    Remote {
                        backend: backing.backend,
                        available: backing.available,
                        spec: SpecState::default(),
                    },
                );
                queue.queue().add(key);
            }
        }
    }
    state.contributors = Some(contributors);
    // What a route change meant for the core (an APIService or a CRD) its watchers tell too;
    // this revalidation is a 304 when nothing did.
    queue.queue().add(Key::Core);
}

/// Takes in one fetch: keeps the spec state, notes a change for the next merge, and schedules
/// the key's next fetch.
fn finish(
    state: &mut State,
    queue: &mut WorkQueue<Key, Outcome>,
    key: Key,
    (mut spec, outcome): Outcome,
    core_outage: &Outage,
) {
    let name = match &key {
        Key::Core => {
            match &outcome {
                Ok(_) => core_outage.answered(),
                Err(e) => core_outage.failed(e.as_ref()),
            }
            state.core = spec;
            "core".to_owned()
        }
        Key::Remote(svc) => {
            let Some(remote) = state.remotes.get_mut(svc) else {
                // Its APIServices went away meanwhile.
                return queue.forget(&key);
            };
            let name = remote.backend.name.to_string();
            log_remote(&mut spec, &name, &outcome);
            remote.spec = spec;
            name
        }
    };
    match outcome {
        Ok(changed) => {
            if let Some(reason) = changed {
                state.reasons.push((name, reason));
            }
            queue.resync(key, Some(RESYNC));
        }
        Err(_) => {
            queue.retry(key);
        }
    }
}

/// Starts a merge if a spec or the contributing APIServices changed since the last one, once
/// the core's spec and the route table are known.
fn start_merge(state: &mut State) -> Option<Merging> {
    let contributors = state.contributors.as_ref()?;
    let core_spec = state.core.spec.clone()?;
    let spec_of = |c: &Contributor| state.remotes.get(&c.service)?.spec.spec.clone();
    // A new APIService whose spec has not arrived yet changes nothing in the document: it is
    // counted in when its spec is, by the merge that spec starts (a merge can take seconds).
    let counted: Vec<Contributor> = contributors
        .iter()
        .filter(|c| spec_of(c).is_some() || state.merged_from.iter().any(|m| m.name == c.name))
        .cloned()
        .collect();
    let mut reasons = std::mem::take(&mut state.reasons);
    // The order the fetches finished in is not the metric's business.
    reasons.sort();
    reasons.extend(set_changes(&state.merged_from, &counted));
    if reasons.is_empty() {
        return None;
    }
    let specs: Vec<(Contributor, Bytes)> = counted
        .iter()
        .filter_map(|c| Some((c.clone(), spec_of(c)?)))
        .collect();
    let started = Instant::now();
    let task = tokio::task::spawn_blocking(move || build(&core_spec, &specs));
    Some(Merging {
        task,
        contributors: counted,
        reasons,
        started,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> ServiceRef {
        ServiceRef {
            namespace: "wardle".into(),
            name: "api".into(),
            port: 443,
        }
    }

    /// kube-aggregator's rates for a failing remote spec: a minute, doubling, up to an hour;
    /// a success starts over. The core's retries stay within its one-minute resync.
    #[tokio::test(start_paused = true)]
    async fn a_failing_remote_spec_backs_off_from_a_minute_to_an_hour() {
        let mut queue: WorkQueue<Key, ()> = WorkQueue::new(backoff);
        let remote = Key::Remote(service());
        let minutes: Vec<u64> = (0..8)
            .map(|_| queue.retry(remote.clone()).as_secs() / 60)
            .collect();
        assert_eq!(minutes, [1, 2, 4, 8, 16, 32, 60, 60]);
        queue.resync(remote.clone(), Some(RESYNC));
        assert_eq!(queue.retry(remote), RESYNC);
        let core: Vec<Duration> = (0..10).map(|_| queue.retry(Key::Core)).collect();
        assert_eq!(core[0], Duration::from_millis(500));
        assert_eq!(core[9], RESYNC);
    }
}
