//! Leader election on a `coordination.k8s.io/v1` Lease on the core, so that of several replicas
//! only one writes APIService status (kube-apiserver's HA deployments fight over that condition,
//! kubernetes#111890). Every replica still probes and routes on its own results; only the write
//! back is the leader's.
//!
//! The protocol is client-go's `leaderelection` with a `LeaseLock`, so it interoperates with what
//! operators know (`kubectl get lease`, `holderIdentity`, `leaseTransitions`):
//!
//! * A candidate reads the Lease every retry period. It takes the Lease when nobody holds it, or
//!   when the holder's record has not changed for the record's `leaseDurationSeconds`, measured
//!   on the candidate's own clock from when it *saw* the record change (never from the
//!   `renewTime` another machine's clock wrote). Taking and renewing are updates carrying the
//!   `resourceVersion` read, so of two candidates racing, one gets a conflict.
//! * The leader renews every retry period. It may write status only while its last successful
//!   renewal started less than the renew deadline ago, and it gives up the moment that is no
//!   longer so. The renew deadline is shorter than the lease duration (validated), so the
//!   leader has stopped writing before any other replica may consider the Lease expired: never
//!   two writers at once, given clocks that run at about the same rate.
//! * On shutdown the leader stops writing first, then releases the Lease (clears the holder), so
//!   another replica takes over within a retry period instead of a lease duration.
//!
//! Why not a crate: `kube-leader-election` needs kube 4 (we are on kube 5), and
//! `kube-lease-manager` 0.13 keeps reporting leadership while its renewals fail (its watch loop
//! only logs and backs off), has no renew deadline, takes the Lease with server-side apply
//! conflicts and judges expiry by the holder's wall clock. The protocol itself is a page of code
//! on kube's `Api<Lease>`.
//!
//! A core that serves no `coordination.k8s.io/v1` Leases (a Kubernetes-style server that is not
//! kube-apiserver), or one whose authorization refuses the gateway's identity the Lease (RBAC
//! without the chart's Role), makes every replica a candidate forever, and no replica writes
//! status. That is said, not guessed around (taking over the writing without a Lease would make
//! several replicas fight over the condition): one log line naming the fix (`--leader-elect=false`,
//! or the verbs to grant), and the `/healthz` check [`CHECK_NAME`] failing with the same text
//! while it lasts. Neither is an outage of the core: it answered. On `/healthz`
//! only, as kube-controller-manager and kube-scheduler report their leader election: not on
//! `/readyz`, which would take every replica out of its Service for what is a status-writing
//! problem (the proxy works), nor on `/livez`, since a restart changes nothing.
//!
//! Logs: one line per change of leadership (this replica leads, stops leading, or sees another
//! leader), one when the core turns out to serve no Leases or to forbid this one (and one when it
//! lets a replica take it again), and one per outage of the core ([`Outage`]); metric `leader_election_master_status{name}` as
//! kube's components export it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiservice::outage::{root_cause, Outage};
use gateway_config::LeaderElection;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use prometheus::IntGauge;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::health_check::Check;

/// Who writes the Lease, as `managedFields` shows it.
const FIELD_MANAGER: &str = "aggregation-gateway";
/// The `/healthz` check that fails while no replica can lead, named as kube-controller-manager
/// and kube-scheduler name theirs (`/healthz/leaderElection`).
pub const CHECK_NAME: &str = "leaderElection";
/// The group-version whose `leases` the election needs.
const LEASES_GROUP_VERSION: &str = "coordination.k8s.io/v1";

/// Whether this replica may write status now. Cheap to clone; read by the availability
/// controller before every status write.
#[derive(Clone)]
pub struct Leadership {
    shared: Arc<Shared>,
}

struct Shared {
    /// Until when this replica may write: the start of its last successful renewal plus the
    /// renew deadline. `None` while it is not the leader.
    valid_until: Mutex<Option<Instant>>,
    /// Flips when this replica starts or stops leading.
    leading: watch::Sender<bool>,
}

// === impl Leadership ===

impl Leadership {
    fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                valid_until: Mutex::new(None),
                leading: watch::channel(false).0,
            }),
        }
    }

    /// True while this replica holds the Lease and its last renewal is recent enough.
    pub fn is_leader(&self) -> bool {
        self.valid_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Until when this replica may write, if it leads.
    pub fn valid_until(&self) -> Option<Instant> {
        *self
            .shared
            .valid_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `true` when this replica starts leading, `false` when it stops.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.shared.leading.subscribe()
    }

    fn set(&self, until: Option<Instant>) {
        *self
            .shared
            .valid_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = until;
        self.shared.leading.send_if_modified(|leading| {
            let changed = *leading != until.is_some();
            *leading = until.is_some();
            changed
        });
    }
}

/// Runs the election for one replica; see the module docs.
pub struct LeaderElector {
    api: Api<Lease>,
    /// For the core's discovery, asked when the Lease cannot be created.
    client: kube::Client,
    settings: LeaderElection,
    identity: String,
    leadership: Leadership,
    /// `leader_election_master_status{name=<lease name>}`.
    master_status: IntGauge,
    /// The Lease record last read and when it was first seen in that state.
    observed: Option<(LeaseSpec, Instant)>,
    /// Why the last attempt failed, for the reason a leader steps down.
    last_error: Option<String>,
    /// Reads and writes of the Lease, logged once per outage of the core.
    outage: Outage,
    /// Fails while the core refuses the Lease for good ([`CHECK_NAME`]).
    check: Arc<Check>,
    /// Why the core refuses the Lease, while it does; each change is logged once.
    refused: Option<Refusal>,
}

/// Why the core answers, but no replica can hold the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// It serves no `coordination.k8s.io/v1` Leases.
    NotServed,
    /// Its authorization refuses the gateway's identity the Lease (403).
    Forbidden,
}

// === impl LeaderElector ===

impl LeaderElector {
    /// An elector for `settings`' Lease, identified as `<hostname>_<uuid>` like kube's
    /// components (the hostname is the Pod's name in a cluster).
    pub fn new(
        client: kube::Client,
        settings: LeaderElection,
        master_status: IntGauge,
        check: Arc<Check>,
    ) -> (Self, Leadership) {
        let identity = format!("{}_{}", crate::host::name(), uuid::Uuid::new_v4());
        let leadership = Leadership::new();
        master_status.set(0);
        let elector = Self {
            api: Api::namespaced(client.clone(), &settings.namespace),
            client,
            settings,
            identity,
            leadership: leadership.clone(),
            master_status,
            observed: None,
            last_error: None,
            outage: Self::outage(),
            check,
            refused: None,
        };
        (elector, leadership)
    }

    /// An elector for the same replica (its identity, its [`Leadership`]) that has observed
    /// nothing yet: what runs again after a run ended. A replica that led keeps its Lease: its
    /// first renewal under the same identity succeeds.
    pub fn restarted(&self) -> Self {
        Self {
            api: self.api.clone(),
            client: self.client.clone(),
            settings: self.settings.clone(),
            identity: self.identity.clone(),
            leadership: self.leadership.clone(),
            master_status: self.master_status.clone(),
            observed: None,
            last_error: None,
            outage: Self::outage(),
            check: self.check.clone(),
            refused: None,
        }
    }

    fn outage() -> Outage {
        Outage::new(
            "leader election",
            "a leader stops writing APIService status at its renew deadline",
        )
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Campaigns, leads, and campaigns again after losing the Lease, until `stop` turns true;
    /// then stops writing and releases the Lease if it holds it.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        tracing::info!(
            lease = %self.lease_name(),
            identity = %self.identity,
            "leader election: campaigning for the Lease that decides which replica writes APIService status"
        );
        loop {
            // Candidate: try every retry period (jittered, as client-go does, so that replicas
            // started together do not keep colliding).
            let renewed_at = loop {
                if *stop.borrow() {
                    return;
                }
                let started = Instant::now();
                if self.attempt(self.settings.renew_deadline).await {
                    break started;
                }
                tokio::select! {
                    _ = tokio::time::sleep(jittered(self.settings.retry_period)) => {}
                    _ = stop.changed() => return,
                }
            };
            self.lead(renewed_at);
            // Leader: renew every retry period; give up once the last successful renewal
            // started a renew deadline ago.
            let mut renewed_at = renewed_at;
            let reason = loop {
                tokio::select! {
                    _ = tokio::time::sleep(self.settings.retry_period) => {}
                    _ = stop.changed() => {
                        self.step_down("shutting down");
                        self.release().await;
                        return;
                    }
                }
                let deadline = renewed_at + self.settings.renew_deadline;
                let started = Instant::now();
                let left = deadline.saturating_duration_since(started);
                if self.attempt(left).await {
                    renewed_at = started;
                    self.leadership
                        .set(Some(started + self.settings.renew_deadline));
                    continue;
                }
                if self.held_by_another() {
                    break "another replica holds the Lease".to_owned();
                }
                if Instant::now() >= deadline {
                    break format!(
                        "could not renew the Lease within the renew deadline ({:?}): {}",
                        self.settings.renew_deadline,
                        self.last_error.as_deref().unwrap_or("timed out")
                    );
                }
            };
            self.step_down(&reason);
        }
    }

    /// Whether the core's discovery lists `leases` in `coordination.k8s.io/v1`; asked after a
    /// 404 on the Lease, which may also mean a missing namespace. `true` when it cannot tell.
    async fn core_serves_leases(&self) -> bool {
        match self
            .client
            .list_api_group_resources(LEASES_GROUP_VERSION)
            .await
        {
            Ok(list) => list.resources.iter().any(|r| r.name == "leases"),
            Err(e) => !is_not_found(&e),
        }
    }

    /// The core refuses the Lease for `refusal`'s reason: said once, and the check fails, until
    /// a replica may take the Lease again. `detail` is the core's own message, for a 403.
    fn refused(&mut self, refusal: Refusal, detail: &str) {
        if self.refused == Some(refusal) {
            return;
        }
        self.refused = Some(refusal);
        let lease = self.lease_name();
        let why = match refusal {
            Refusal::NotServed => format!(
                "the core serves no {LEASES_GROUP_VERSION} Leases, so no replica can take the \
                 Lease {lease} and APIService status is never written (kubectl get apiservices \
                 shows Unknown); run a single replica with --leader-elect=false to write status \
                 without a Lease"
            ),
            Refusal::Forbidden => format!(
                "the core forbids the gateway's identity the Lease {lease} ({detail}), so no \
                 replica can lead and APIService status is never written (kubectl get \
                 apiservices shows Unknown); grant it get, create and update on \
                 leases.coordination.k8s.io in namespace {} (the Helm chart's leader-election \
                 Role does), or run a single replica with --leader-elect=false",
                self.settings.namespace
            ),
        };
        tracing::error!(lease = %lease, "leader election: {why}");
        self.check.fail(&why);
    }

    /// The core lets replicas read and write the Lease (again): the check passes.
    fn accepted(&mut self) {
        if self.refused.take().is_some() {
            tracing::info!(
                lease = %self.lease_name(),
                "leader election: the core serves the Lease to this replica now"
            );
            self.check.pass();
        }
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.settings.namespace, self.settings.name)
    }

    fn lead(&mut self, renewed_at: Instant) {
        self.leadership
            .set(Some(renewed_at + self.settings.renew_deadline));
        self.master_status.set(1);
        tracing::info!(
            lease = %self.lease_name(),
            identity = %self.identity,
            "leader election: this replica leads and writes APIService status"
        );
    }

    fn step_down(&mut self, reason: &str) {
        self.leadership.set(None);
        self.master_status.set(0);
        tracing::warn!(
            lease = %self.lease_name(),
            identity = %self.identity,
            reason,
            "leader election: this replica stopped leading and no longer writes APIService status"
        );
    }

    fn held_by_another(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|(spec, _)| holder(spec).is_some_and(|h| h != self.identity))
    }

    /// One try to take or renew the Lease within `limit`; `true` when this replica holds it now.
    async fn attempt(&mut self, limit: Duration) -> bool {
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(Ok(held)) => {
                self.outage.answered();
                self.accepted();
                self.last_error = None;
                held
            }
            Ok(Err(e)) => {
                if let Some(message) = forbidden(&e) {
                    self.outage.answered();
                    self.refused(Refusal::Forbidden, &message);
                } else if is_not_found(&e) && !self.core_serves_leases().await {
                    self.outage.answered();
                    self.refused(Refusal::NotServed, "");
                } else {
                    self.outage.failed(&e);
                }
                self.last_error = Some(root_cause(&e));
                false
            }
            Err(_) => {
                let e = format!("no answer from the core within {limit:?}");
                self.outage.failed_with(&e);
                self.last_error = Some(e);
                false
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`: create the Lease if there is none, take it if it is free
    /// or expired, renew it if it is ours; `false` when another replica holds it or won a race.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&params, &lease).await {
                Ok(created) => {
                    self.observe(created.spec.unwrap_or_default());
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = lease.spec.clone().unwrap_or_default();
        let seen_at = self.observe(record.clone());
        let ours = holder(&record) == Some(self.identity.as_str());
        if !ours && holder(&record).is_some() {
            let duration = record
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map_or(self.settings.lease_duration, |s| {
                    Duration::from_secs(s as u64)
                });
            if Instant::now() < seen_at + duration {
                return Ok(false);
            }
        }
        let mut next = record.clone();
        next.holder_identity = Some(self.identity.clone());
        next.lease_duration_seconds = Some(self.lease_seconds());
        next.renew_time = Some(now.clone());
        if !ours {
            next.acquire_time = Some(now);
            next.lease_transitions = Some(record.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(next);
        // `lease` still carries the resourceVersion read: a concurrent change is a conflict.
        match self.api.replace(&self.settings.name, &params, &lease).await {
            Ok(updated) => {
                self.observe(updated.spec.unwrap_or_default());
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records the Lease as read; returns when it was first seen in this state. Logs a new
    /// holder once.
    fn observe(&mut self, record: LeaseSpec) -> Instant {
        if let Some((seen, at)) = &self.observed {
            if *seen == record {
                return *at;
            }
        }
        let before = self
            .observed
            .as_ref()
            .and_then(|(spec, _)| holder(spec).map(str::to_owned));
        if let Some(new) = holder(&record) {
            if before.as_deref() != Some(new) && new != self.identity {
                tracing::info!(lease = %self.lease_name(), leader = %new, "leader election: another replica leads");
            }
        }
        let now = Instant::now();
        self.observed = Some((record, now));
        now
    }

    /// Clears the holder so that another replica takes over at its next try. Only after
    /// [`Self::step_down`]: nothing is written from here on.
    async fn release(&mut self) {
        let outcome = tokio::time::timeout(self.settings.renew_deadline, async {
            let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
                return Ok(false);
            };
            let Some(spec) = lease.spec.as_mut() else {
                return Ok(false);
            };
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            let now = MicroTime(Timestamp::now());
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            };
            self.api
                .replace(&self.settings.name, &params, &lease)
                .await
                .map(|_| true)
        })
        .await;
        match outcome {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.lease_name(), "leader election: released the Lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.lease_name(), error = %e, "leader election: could not release the Lease; another replica takes over once it expires")
            }
            Err(_) => {
                tracing::warn!(lease = %self.lease_name(), "leader election: releasing the Lease timed out; another replica takes over once it expires")
            }
        }
    }

    /// The lease duration in the Lease's whole seconds, rounded up.
    fn lease_seconds(&self) -> i32 {
        let d = self.settings.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// A 403 from the core: its authorization refuses the request; the core's message says whom and
/// which verb.
fn forbidden(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(status) if status.code == 403 => Some(status.message.clone()),
        _ => None,
    }
}

/// A 404 from the core: no such object, or no such resource.
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

/// The holder a Lease names; an empty name is nobody (client-go writes "" on release).
fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// client-go's `wait.Jitter(period, 1.2)`: a wait between one and 2.2 periods.
fn jittered(period: Duration) -> Duration {
    let fraction = f64::from(uuid::Uuid::new_v4().as_bytes()[0]) / 255.0;
    period + period.mul_f64(1.2 * fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_at_its_deadline_without_a_renewal() {
        let leadership = Leadership::new();
        let mut changes = leadership.subscribe();
        assert!(!leadership.is_leader());
        leadership.set(Some(Instant::now() + Duration::from_secs(2)));
        assert!(leadership.is_leader());
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(leadership.is_leader());
        // No renewal came: the write permission lapses on its own, whatever the elector does.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!leadership.is_leader());
        leadership.set(None);
        assert!(!*changes.borrow_and_update());
    }

    #[test]
    fn jitter_stays_within_client_gos_bounds() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(1));
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_millis(2200),
                "{d:?}"
            );
        }
    }

    #[test]
    fn an_empty_holder_is_nobody() {
        let mut spec = LeaseSpec::default();
        assert_eq!(holder(&spec), None);
        spec.holder_identity = Some(String::new());
        assert_eq!(holder(&spec), None);
        spec.holder_identity = Some("a_1".into());
        assert_eq!(holder(&spec), Some("a_1"));
    }
}
