//! The availability controller: kube-aggregator's `remote_available_controller.go`, one work
//! queue keyed by APIService name.
//!
//! * A new or edited route (the route controller's `watch` channel) and a Service or
//!   EndpointSlice change that makes a route's pre-check answer differently (the resolver's
//!   change channel) add its key; nothing waits for a debounce or a round.
//! * Each key is checked on its own: the Service and its endpoints first, then the discovery
//!   probe, then (with the kube source) the `Available` condition written back when it changed.
//!   Keys run concurrently, so a backend that hangs until the probe timeout holds back nobody
//!   else's result.
//! * A failed check comes back with kube-aggregator's backoff (5 ms at first), but never later
//!   than [`UNAVAILABLE_RECHECK`] (upstream: 30 s), so a backend that is back is routed again
//!   within about a second without waiting for traffic; a passed one after the availability
//!   interval (the informer resync upstream).
//! * Connection failures the proxy sees (`backend::failures`) add the key too, so a backend that
//!   dies is re-checked at once instead of at the next resync: on real traffic, and without
//!   any, on the one connection per endpoint a passed check keeps open and pinged.
//! * Every result is published at once on the results channel, which the route controller turns
//!   into the next route table.
//! * With the kube source, the stored condition is reconciled, not only written on change: a
//!   check whose result disagrees with what the APIService watch last saw on the core (a core
//!   restored from a backup, another writer) writes it again, at most once per interval, so
//!   two controllers that disagree (kube-apiserver's own beside us) trade one write per
//!   interval instead of racing; when they agree nothing is written.
//!
//! * Who writes the condition: a core that is a kube-apiserver (its local APIServices carry
//!   kube-aggregator's `automanaged` label) runs its own availability controllers, which own it;
//!   the gateway writes nothing there and keeps its results for its own routing and discovery.
//!   On any other core (one that stores APIServices as the chart's CRD) nobody else writes it:
//!   the gateway does.
//! * With several replicas, only the leader of the Lease (`leader_election`) writes: the others
//!   check, publish and route exactly as before, and forget what they last wrote, so that when
//!   one of them takes the lead every key is checked at once and its condition written where the
//!   stored one disagrees. Leadership is checked again right before each write, since a probe
//!   may outlast it.
//! * With `--readyz-aggregated-apiservice-reachable`, the readiness check
//!   `aggregated-apiservice-reachable` fails while a remote APIService's discovery probe fails
//!   from this replica. Reasons that every replica shares (no Service, no endpoints, a bad
//!   caBundle) do not count: taking this replica out of a load balancer would not help callers.
//!
//! Logs: one line per change of an APIService's state (available, unavailable, back), with the
//! reason; never one per check. One line per change of the reachability check.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apiservice::model::{available_condition, APIServiceCondition, RegisteredAPIService};
use apiservice::outage::Outage;
use apiservice::resolve::{Changes, ResolveError, ServiceResolver};
use apiservice::route_table::{Availability, Route, UnavailableReason};
use apiservice::source::{ApiServiceSet, SetReceiver, SourceError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::{AvailabilityMap, RouteTarget, Routes, Routing, Target};
use crate::control::leader_election::Leadership;
use crate::health_check::Check;
use crate::metrics::Metrics;
use crate::workqueue::{Backoff, Next, Queue, WorkQueue};

/// kube-aggregator's rate limiter for availability checks. Its 30 s cap applies to status writes
/// that failed (the core is down or refuses: no reason to ask it more often); a failed check
/// is capped by [`UNAVAILABLE_RECHECK`].
pub const AVAILABILITY_BACKOFF: Backoff = Backoff {
    min: Duration::from_millis(5),
    max: Duration::from_secs(30),
};

/// The longest an unavailable APIService waits for its next check. kube-aggregator waits up to
/// 30 s, so a restarted backend stays unavailable for up to half a minute after it serves again
/// (29.5 s measured). A check of a backend that is down costs little: five refused connects, or
/// one timed-out attempt in flight at a time for a hung one (a key never runs twice at once).
pub const UNAVAILABLE_RECHECK: Duration = Duration::from_secs(1);

/// Waiting longer than this for the Service caches is logged.
const RESOLVER_SYNC_SLOW: Duration = Duration::from_secs(10);

/// Longest wait for the Service caches before the first check. After that, checks run anyway and
/// say `ServiceAccessError` ("the Service cache has not synced yet"), which is the truth and more
/// useful than no condition at all; they re-run as soon as the caches sync.
const RESOLVER_SYNC_LIMIT: Duration = Duration::from_secs(60);

/// What the availability controller is built from.
pub struct AvailabilitySettings {
    /// The resync of a passed check, and the period of status reconciliation.
    pub interval: Duration,
    /// The retry of a failed check or status write ([`AVAILABILITY_BACKOFF`] outside tests).
    pub backoff: Backoff,
    /// The cap on the retry of a failed check ([`UNAVAILABLE_RECHECK`] outside tests).
    pub unavailable_recheck: Duration,
    /// Also the source of change notifications: see [`ServiceResolver::changes`].
    pub resolver: Arc<dyn ServiceResolver>,
    /// Present with the kube source: conditions are written back through the status subresource.
    pub kube: Option<StatusWrites>,
    /// The readiness check `aggregated-apiservice-reachable`, when asked for.
    pub reachable: Option<Arc<Check>>,
}

/// Where the `Available` condition is written, and where it is read back from.
pub struct StatusWrites {
    pub client: kube::Client,
    /// The kube source's APIService sets: what the core stores, as the watch sees it.
    pub stored: SetReceiver,
    /// With leader election: write only while this replica leads. `None`: always write.
    pub leader: Option<Leadership>,
}

/// Checks APIServices one key at a time; see the module docs.
pub struct AvailabilityController {
    routing: Arc<Routing>,
    results: watch::Sender<AvailabilityMap>,
    settings: AvailabilitySettings,
    metrics: Arc<Metrics>,
    queue: WorkQueue<String, Checked>,
    /// The `Available` condition of each APIService as the kube source last saw it.
    stored: HashMap<String, Option<APIServiceCondition>>,
    /// Whether the core runs kube-aggregator's availability controllers (it is a kube-apiserver):
    /// then it owns the `Available` condition and the gateway writes none (two writers disagree
    /// about a Service only one of them can see, and flip the condition back and forth).
    core_owns_status: bool,
    /// The APIServices this replica cannot reach, as the reachability check last said.
    unreachable: Vec<String>,
    /// Status writes to the core, logged once per outage (not per APIService and check).
    status_writes: Outage,
}

/// The outcome of [`ServiceResolver::check_endpoints`]; `None` for routes without one.
type Precheck = Option<Result<(), ResolveError>>;

/// One route as the controller knows it between checks.
struct Known {
    api_service: Arc<RegisteredAPIService>,
    target: Target,
    /// The pre-check the current result was based on: a resolver change re-checks exactly the
    /// APIServices whose pre-check now answers differently.
    precheck: Precheck,
    current: Option<Availability>,
    /// The condition last written to the core.
    written: Option<Availability>,
    /// When a write was last attempted: reconciling a disagreeing stored condition waits an
    /// interval after it (see the module docs).
    wrote_at: Option<Instant>,
}

/// What one check found.
pub struct Checked {
    precheck: Precheck,
    availability: Availability,
    write: Write,
}

/// What became of the `Available` condition on the core.
enum Write {
    /// No kube source, or the condition on the core already says this.
    NotNeeded,
    /// Another replica leads, or the core's own availability controller owns the condition:
    /// they write.
    NotLeader,
    Written,
    Failed(SourceError),
}

// === impl Write ===

impl Write {
    fn attempted(&self) -> bool {
        !matches!(self, Write::NotNeeded | Write::NotLeader)
    }
}

// === impl AvailabilityController ===

impl AvailabilityController {
    pub fn new(
        routing: Arc<Routing>,
        results: watch::Sender<AvailabilityMap>,
        settings: AvailabilitySettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let backoff = settings.backoff;
        Self {
            routing,
            results,
            settings,
            metrics,
            queue: WorkQueue::new(move |_| backoff),
            stored: HashMap::new(),
            core_owns_status: false,
            unreachable: Vec::new(),
            status_writes: Outage::new(
                "APIService status write",
                "Available conditions on the core wait until it is back",
            ),
        }
    }

    /// Adds APIService names to check now: what the proxy uses to report failed connections.
    pub fn rechecks(&self) -> Queue<String> {
        self.queue.queue().clone()
    }

    pub async fn run(mut self) {
        let mut changes = self.settings.resolver.changes();
        wait_for_resolver(self.settings.resolver.as_ref(), &mut changes).await;
        let mut routes = self.routing.subscribe();
        let mut stored = self.settings.kube.as_ref().map(|k| k.stored.clone());
        let mut leading = self
            .settings
            .kube
            .as_ref()
            .and_then(|k| k.leader.as_ref())
            .map(Leadership::subscribe);
        if let Some(set) = stored
            .as_mut()
            .and_then(|rx| rx.borrow_and_update().clone())
        {
            self.take_stored(&set);
        }
        let mut known: HashMap<String, Known> = HashMap::new();
        if let Some(table) = routes.borrow_and_update().clone() {
            self.follow_routes(&table, &mut known);
        }
        loop {
            tokio::select! {
                Some(set) = next_set(&mut stored) => self.take_stored(&set),
                Some(true) = next_leading(&mut leading) => {
                    // This replica just took the lead: check everything now and write what the
                    // core does not already say, instead of waiting for each key's resync.
                    for name in known.keys() {
                        self.queue.queue().add(name.clone());
                    }
                }
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(table) = routes.borrow_and_update().clone() {
                        self.follow_routes(&table, &mut known);
                    }
                }
                _ = changes.changed() => {
                    for (name, k) in &known {
                        if self.precheck(k) != k.precheck {
                            tracing::debug!(apiservice = %name, "Service or endpoints changed; re-checking");
                            self.queue.queue().add(name.clone());
                        }
                    }
                }
                next = self.queue.next() => match next {
                    Next::Ready(name) => match known.get(&name) {
                        Some(k) => {
                            let check = self.check(k);
                            let span = tracing::info_span!("availability_check", apiservice = %name);
                            self.queue.start(name, check.instrument(span));
                        }
                        None => self.queue.forget(&name),
                    },
                    Next::Done(name, checked) => {
                        let Some(k) = known.get_mut(&name) else {
                            self.queue.forget(&name);
                            continue;
                        };
                        let passed = checked.availability.is_available();
                        let written = self.take_in(&name, k, checked);
                        if !written {
                            self.queue.retry(name);
                        } else if !passed {
                            self.queue.retry_at_most(name, self.settings.unavailable_recheck);
                        } else {
                            self.queue.resync(name, Some(self.settings.interval));
                        }
                        self.publish(&known);
                    }
                },
            }
        }
    }

    /// Takes in a new route table: new and edited routes are checked now, gone ones forgotten.
    fn follow_routes(&mut self, table: &Routes, known: &mut HashMap<String, Known>) {
        let queue = &mut self.queue;
        let mut seen = HashMap::with_capacity(known.len());
        for route in table.routes() {
            let name = &route.api_service.name;
            seen.insert(name.clone(), ());
            match known.get_mut(name) {
                Some(k) if same_route(k, route) => continue,
                Some(k) => {
                    k.api_service = route.api_service.clone();
                    k.target = route.backend.target.clone();
                }
                None => {
                    known.insert(
                        name.clone(),
                        Known {
                            api_service: route.api_service.clone(),
                            target: route.backend.target.clone(),
                            precheck: None,
                            current: None,
                            written: None,
                            wrote_at: None,
                        },
                    );
                }
            }
            queue.queue().add(name.clone());
        }
        let before = known.len();
        known.retain(|name, _| {
            let keep = seen.contains_key(name);
            if !keep {
                queue.forget(name);
                let _ = self
                    .metrics
                    .unavailable_apiservice
                    .remove_label_values(&[name]);
            }
            keep
        });
        if known.len() != before {
            self.publish(known);
        }
    }

    fn precheck(&self, k: &Known) -> Precheck {
        match &k.target {
            Target::Remote(_) => k
                .api_service
                .service()
                .map(|svc| self.settings.resolver.check_endpoints(svc)),
            Target::Local | Target::Broken(_) => None,
        }
    }

    /// Takes in what the core now stores (a new set from the kube source).
    fn take_stored(&mut self, set: &ApiServiceSet) {
        let core_owns_status = set.apiservices.iter().any(registered_by_kube_aggregator);
        if core_owns_status != self.core_owns_status {
            self.core_owns_status = core_owns_status;
            if core_owns_status {
                tracing::info!(
                    "the core is a kube-apiserver: its own availability controller writes the \
                     APIServices' Available condition, the gateway writes none"
                );
            } else {
                tracing::info!("the gateway writes the APIServices' Available condition");
            }
        }
        self.stored = set
            .apiservices
            .iter()
            .filter_map(|api| {
                Some((
                    api.metadata.name.clone()?,
                    available_condition(api).cloned(),
                ))
            })
            .collect();
    }

    /// One availability decision for `k`'s route, and the condition written back when it
    /// changed, or when the stored one disagrees with it (at most once per interval).
    fn check(&self, k: &Known) -> impl std::future::Future<Output = Checked> + Send + 'static {
        let precheck = self.precheck(k);
        let api = k.api_service.clone();
        let target = k.target.clone();
        let written = k.written.clone();
        let kube = self
            .settings
            .kube
            .as_ref()
            .map(|k| (k.client.clone(), k.leader.clone()));
        let stored = self.stored.get(&api.name).cloned().flatten();
        let may_reconcile = k
            .wrote_at
            .is_none_or(|at| at.elapsed() >= self.settings.interval);
        let core_owns_status = self.core_owns_status;
        async move {
            let availability = match (&target, &precheck) {
                (Target::Local, _) => Availability::Available,
                // The transport could not be built (e.g. a bad caBundle): the check fails before
                // it starts.
                (Target::Broken(why), _) => {
                    Availability::unavailable(UnavailableReason::FailedDiscoveryCheck, why.as_ref())
                }
                (Target::Remote(_), Some(Err(e))) => {
                    Availability::unavailable(UnavailableReason::Resolve(e.reason), &e.message)
                }
                (Target::Remote(backend), _) => {
                    match backend.probe(&api.group, &api.version).await {
                        Ok(()) => {
                            backend.keep_connections();
                            Availability::Available
                        }
                        Err(e) => Availability::unavailable(
                            UnavailableReason::FailedDiscoveryCheck,
                            e.to_string(),
                        ),
                    }
                }
            };
            let write = match kube {
                Some(_) if core_owns_status => Write::NotLeader,
                // Asked right before writing: the probe may have outlasted the leadership.
                Some((_, Some(leader))) if !leader.is_leader() => Write::NotLeader,
                Some((client, leader))
                    if written.as_ref() != Some(&availability)
                        || (may_reconcile && disagrees(stored.as_ref(), &api, &availability)) =>
                {
                    let write = write_condition(&client, &api, &availability);
                    // A write (read, then patch) still going when the leadership lapses is
                    // dropped: at most a request already sent lands after that, well within the
                    // lease duration the others wait beyond the renew deadline.
                    match leader.and_then(|l| l.valid_until()) {
                        Some(until) => tokio::time::timeout_at(until, write)
                            .await
                            .unwrap_or(Write::NotLeader),
                        None => write.await,
                    }
                }
                _ => Write::NotNeeded,
            };
            Checked {
                precheck,
                availability,
                write,
            }
        }
    }

    /// Records a check's outcome; `false` when the status write failed (retry sooner).
    fn take_in(&self, name: &str, k: &mut Known, checked: Checked) -> bool {
        self.record(name, k.current.as_ref(), &checked.availability);
        if checked.write.attempted() {
            k.wrote_at = Some(Instant::now());
        }
        let ok = match checked.write {
            Write::NotNeeded => true,
            // What this replica once wrote says nothing about the core now: forget it, so the
            // next check as leader compares with what is stored.
            Write::NotLeader => {
                k.written = None;
                true
            }
            Write::Written => {
                k.written = Some(checked.availability.clone());
                self.status_writes.answered();
                true
            }
            Write::Failed(e) => {
                tracing::debug!(apiservice = %name, error = %e, "cannot write the Available condition");
                self.status_writes.failed(&e);
                false
            }
        };
        k.precheck = checked.precheck;
        k.current = Some(checked.availability);
        ok
    }

    /// Publishes the current results when they differ from the last ones sent.
    fn publish(&mut self, known: &HashMap<String, Known>) {
        self.update_reachable(known);
        let next: HashMap<String, Availability> = known
            .iter()
            .filter_map(|(name, k)| Some((name.clone(), k.current.clone()?)))
            .collect();
        self.results.send_if_modified(|current| {
            if **current == next {
                return false;
            }
            *current = Arc::new(next);
            true
        });
    }

    /// The reachability readiness check: fails while a remote APIService's probe fails from
    /// here. One log line per change of the set.
    fn update_reachable(&mut self, known: &HashMap<String, Known>) {
        let Some(check) = &self.settings.reachable else {
            return;
        };
        let mut unreachable: Vec<String> = known
            .iter()
            .filter(|(_, k)| matches!(k.target, Target::Remote(_)))
            .filter(|(_, k)| {
                matches!(
                    &k.current,
                    Some(Availability::Unavailable {
                        reason: UnavailableReason::FailedDiscoveryCheck,
                        ..
                    })
                )
            })
            .map(|(name, _)| name.clone())
            .collect();
        unreachable.sort();
        if unreachable == self.unreachable {
            return;
        }
        if unreachable.is_empty() {
            check.pass();
            tracing::info!(
                "readiness: every remote APIService is reachable from this replica again"
            );
        } else {
            let reason = format!(
                "this replica cannot reach {} (discovery probe failed)",
                unreachable.join(", ")
            );
            check.fail(&reason);
            tracing::warn!(apiservices = %unreachable.join(","), "readiness: /readyz fails: this replica cannot reach a remote APIService it routes to");
        }
        self.unreachable = unreachable;
    }

    /// kube-aggregator's metrics: the gauge per APIService, and a counter per transition to
    /// unavailable; one log line per transition.
    fn record(&self, name: &str, before: Option<&Availability>, now: &Availability) {
        self.metrics
            .unavailable_apiservice
            .with_label_values(&[name])
            .set(!now.is_available() as i64);
        let was_unavailable = matches!(before, Some(Availability::Unavailable { .. }));
        if let Availability::Unavailable { reason, message } = now {
            if !was_unavailable {
                let reason = match reason.as_str() {
                    "" => "UnknownReason",
                    r => r,
                };
                self.metrics
                    .unavailable_apiservice_total
                    .with_label_values(&[name, reason])
                    .inc();
                tracing::warn!(apiservice = %name, reason, details = %message, "APIService unavailable");
            }
        } else if was_unavailable || before.is_none() {
            tracing::info!(apiservice = %name, "APIService available");
        }
    }
}

/// Holds the first check until the resolver's caches are loaded, so startup does not publish
/// (and write to the core) `ServiceAccessError` for every remote APIService. Bounded: see
/// [`RESOLVER_SYNC_LIMIT`].
async fn wait_for_resolver(resolver: &dyn ServiceResolver, changes: &mut Changes) {
    let start = tokio::time::Instant::now();
    let mut logged = false;
    while !resolver.synced() {
        let waited = start.elapsed();
        if waited >= RESOLVER_SYNC_LIMIT {
            tracing::warn!(
                waited = ?waited,
                "Service/EndpointSlice caches still not synced; checking APIService availability anyway (ServiceAccessError until they sync)"
            );
            return;
        }
        let next_log = if logged {
            RESOLVER_SYNC_LIMIT
        } else {
            RESOLVER_SYNC_SLOW
        };
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(start + next_log) => {
                if !logged && !resolver.synced() {
                    tracing::warn!(
                        waited = ?start.elapsed(),
                        "waiting for the Service/EndpointSlice caches before checking APIService availability (RBAC list/watch on services and endpointslices? core reachable?)"
                    );
                    logged = true;
                }
            }
        }
    }
    if logged {
        tracing::info!(waited = ?start.elapsed(), "Service/EndpointSlice caches synced");
    }
}

/// The next set of a kube source (never, without one). `None` once the source is gone.
async fn next_set(stored: &mut Option<SetReceiver>) -> Option<Arc<ApiServiceSet>> {
    let Some(rx) = stored else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *stored = None;
        return None;
    }
    rx.borrow_and_update().clone()
}

/// The next change of leadership (never, without an election).
async fn next_leading(leading: &mut Option<watch::Receiver<bool>>) -> Option<bool> {
    let Some(rx) = leading else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        *leading = None;
        return None;
    }
    Some(*rx.borrow_and_update())
}

/// The label kube-aggregator puts on the local APIServices it registers itself (one per
/// built-in group and per CRD group-version): its presence says the core is a kube-apiserver,
/// whose `apiservice-status-*-available-controller`s keep every APIService's condition.
const KUBE_AGGREGATOR_AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

fn registered_by_kube_aggregator(
    api: &k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
) -> bool {
    api.metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(KUBE_AGGREGATOR_AUTOMANAGED))
}

/// Whether the stored condition says something else than `availability` would: another status
/// or reason. The message alone does not count: kube-apiserver's controller words the same
/// failure differently, and rewriting it would be fighting over wording.
fn disagrees(
    stored: Option<&APIServiceCondition>,
    api: &RegisteredAPIService,
    availability: &Availability,
) -> bool {
    let Some(stored) = stored else {
        return true;
    };
    let ours = availability.condition(api.is_local(), Time(k8s_openapi::jiff::Timestamp::now()));
    stored.status != ours.status || stored.reason != ours.reason
}

/// Whether `route` is checked the way `k` was: same APIService, same backend.
fn same_route(k: &Known, route: &Route<RouteTarget>) -> bool {
    let same_target = match (&k.target, &route.backend.target) {
        (Target::Local, Target::Local) => true,
        (Target::Remote(x), Target::Remote(y)) => Arc::ptr_eq(x, y),
        (Target::Broken(x), Target::Broken(y)) => x == y,
        _ => false,
    };
    same_target && k.api_service == route.api_service
}

async fn write_condition(
    client: &kube::Client,
    api: &RegisteredAPIService,
    availability: &Availability,
) -> Write {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = availability.condition(api.is_local(), now);
    match apiservice::source::kube::write_available_condition(client, &api.name, condition).await {
        Ok(()) => Write::Written,
        Err(e) => Write::Failed(e),
    }
}
