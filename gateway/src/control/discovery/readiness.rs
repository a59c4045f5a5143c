//! Readiness includes discovery: `/readyz` check `poststarthook/apiservice-discovery-controller`.
//!
//! kube-apiserver's post-start hook of that name waits until its discovery manager has processed
//! every APIService it knew when it started (upstream bounded the wait at two minutes), so a new
//! replica does not serve `/apis` without the aggregated groups and make clients forget them. The
//! gateway does the same: the check passes once the first discovery fetch of every remote
//! APIService of the first complete route table has finished (a failed fetch counts: the
//! APIService is then listed `Stale`, as upstream lists it), or after [`DISCOVERY_SYNC_BOUND`].
//! An APIService without a usable backend (its Service does not resolve) cannot be fetched and
//! does not hold readiness back. After passing once, the check stays passed: later APIServices
//! and failures show up in discovery (`Stale`) and in availability, not in readiness.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use apiservice::model::ServiceRef;
use tokio::time::Instant;

use crate::health_check::Check;

/// The check's name in `/readyz?verbose`, kube-apiserver's.
pub const CHECK_NAME: &str = "poststarthook/apiservice-discovery-controller";

/// Longest `/readyz` waits for the first discovery of the APIServices known at start.
pub const DISCOVERY_SYNC_BOUND: Duration = Duration::from_secs(120);

/// Where the first discovery round stands.
pub struct DiscoveryReadiness {
    check: Arc<Check>,
    phase: Phase,
    deadline: Instant,
}

enum Phase {
    /// No complete route table yet.
    WaitingForRoutes,
    /// These Services' first discovery fetch has not finished.
    WaitingForFetches(HashSet<ServiceRef>),
    Done,
}

impl DiscoveryReadiness {
    /// Starts waiting now; `check` fails until [`Self::fetched`] saw every Service, or until the
    /// bound.
    pub fn new(check: Arc<Check>) -> Self {
        check.fail("waiting for the APIServices to be known");
        Self {
            check,
            phase: Phase::WaitingForRoutes,
            deadline: Instant::now() + DISCOVERY_SYNC_BOUND,
        }
    }

    /// The first complete route table arrived: these Services (those of remote APIServices with
    /// a backend) must be fetched once. Later tables change nothing.
    pub fn routes_known(&mut self, services: impl IntoIterator<Item = ServiceRef>) {
        if let Phase::WaitingForRoutes = self.phase {
            self.phase = Phase::WaitingForFetches(services.into_iter().collect());
            self.update();
        }
    }

    /// The discovery fetch of `svc` finished, successfully or not.
    pub fn fetched(&mut self, svc: &ServiceRef) {
        if let Phase::WaitingForFetches(pending) = &mut self.phase {
            if pending.remove(svc) {
                self.update();
            }
        }
    }

    /// When the loop must call [`Self::bound_passed`]; `None` once done.
    pub fn deadline(&self) -> Option<Instant> {
        (!matches!(self.phase, Phase::Done)).then_some(self.deadline)
    }

    /// [`DISCOVERY_SYNC_BOUND`] passed: ready, whatever is still missing.
    pub fn bound_passed(&mut self) {
        let missing = match &self.phase {
            Phase::Done => return,
            Phase::WaitingForRoutes => "the APIServices were never known".to_owned(),
            Phase::WaitingForFetches(pending) => names(pending),
        };
        tracing::warn!(bound = ?DISCOVERY_SYNC_BOUND, %missing,
            "ready without the first discovery of every APIService; they are listed Stale until fetched");
        self.done();
    }

    fn update(&mut self) {
        if let Phase::WaitingForFetches(pending) = &self.phase {
            if pending.is_empty() {
                tracing::info!("first discovery of every APIService known at start finished");
                self.done();
            } else {
                self.check.fail(&format!(
                    "waiting for the first discovery of {}",
                    names(pending)
                ));
            }
        }
    }

    fn done(&mut self) {
        self.phase = Phase::Done;
        self.check.pass();
    }
}

fn names(pending: &HashSet<ServiceRef>) -> String {
    let mut names: Vec<String> = pending.iter().map(ToString::to_string).collect();
    names.sort();
    format!("Service(s) {}", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceRef {
        ServiceRef {
            namespace: "ns".into(),
            name: name.into(),
            port: 443,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ready_once_every_service_known_at_start_was_fetched() {
        let check = Check::healthy();
        let mut readiness = DiscoveryReadiness::new(check.clone());
        assert!(!check.is_ok());
        // A fetch before the routes are known does not count for anything.
        readiness.fetched(&svc("a"));
        readiness.routes_known([svc("a"), svc("b")]);
        assert!(!check.is_ok());
        readiness.fetched(&svc("a"));
        assert!(!check.is_ok());
        // A later table with another Service does not add to the wait.
        readiness.routes_known([svc("c")]);
        readiness.fetched(&svc("b"));
        assert!(check.is_ok());
        assert_eq!(readiness.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn no_remote_apiservice_is_ready_at_once_and_the_bound_ends_any_wait() {
        let check = Check::healthy();
        let mut readiness = DiscoveryReadiness::new(check.clone());
        readiness.routes_known([]);
        assert!(check.is_ok());

        let check = Check::healthy();
        let mut readiness = DiscoveryReadiness::new(check.clone());
        readiness.routes_known([svc("hung")]);
        let deadline = readiness.deadline().unwrap();
        assert_eq!(deadline - Instant::now(), DISCOVERY_SYNC_BOUND);
        readiness.bound_passed();
        assert!(check.is_ok());
    }
}
