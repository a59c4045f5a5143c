//! API Priority and Fairness (KEP-1040; k8s.io/apiserver `pkg/util/flowcontrol`): the gateway's
//! in-flight limit, as kube-apiserver's, divided among priority levels so that one noisy client
//! never starves the others.
//!
//! Every request is classified by the FlowSchemas into a priority level and a flow (its user or
//! namespace). Each level owns a share of the server's seats (`--max-requests-inflight` plus
//! `--max-mutating-requests-inflight`), lends what it does not use and borrows what others do
//! not; within a level, flows are shuffle-sharded into queues served by fair queuing. A request
//! that finds no seat waits in its queue, or is refused with 429 when the queue is full.
//!
//! The pieces, each mirroring its kube package or file:
//! * `bootstrap`: kube's built-in FlowSchemas and PriorityLevelConfigurations, as data.
//! * `model`: the API objects read, defaulted and validated.
//! * `rules`, `classifier`: matching, and the index that finds the first matching FlowSchema
//!   without a scan of all of them; `remembered`: each thread's memory of recent
//!   classifications, keyed by the configuration's generation.
//! * `request/` (kube's `flowcontrol/request`): how many seats a request takes and for how long
//!   (`width`, `seats`, `list_sizes`, `watch_tracker`).
//! * `fairqueuing/` (kube's `flowcontrol/fairqueuing`): the queues, fair queuing and dispatch
//!   (`queueset/`, `dispatch`, `integrator`, `shuffle_shard`).
//! * `conc_alloc`, `controller`: dividing and lending seats among levels.
//! * `retry_after`, `metrics`, `debug`: what clients and operators see.
//!
//! The configuration comes from outside: the gateway's `control::flowcontrol::source` follows the
//! core's FlowSchemas (or puts kube's built-in ones in force) and calls [`FlowControl`]'s
//! `apply_*` methods. This crate depends only on `gateway-request` beneath it.
//!
//! On the request path: one lock-free load of the configuration, the classification (usually
//! remembered by the thread), and one short lock of the request's level to start it (again to
//! finish it); nothing is allocated when the level has a free seat. Everything that depends
//! only on the configuration (sorted schemas, the index, metric series, header values, seat
//! limits) is computed when the configuration changes.

pub mod admission;
pub mod bootstrap;
pub mod classifier;
pub mod conc_alloc;
pub mod controller;
pub mod debug;
pub mod fairqueuing;
pub mod metrics;
pub mod model;
pub mod remembered;
pub mod request;
pub mod retry_after;
pub mod rules;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gateway_request::identity::UserInfo;
use gateway_request::request_info::RequestInfo;

pub use admission::Admission;
pub use controller::{Controller, Schema, Summary};
pub use fairqueuing::dispatch::{Seat, Waiting};
pub use metrics::RejectReason;
pub use request::width::Estimate;

use fairqueuing::queueset::Description;
use model::Distinguisher;
use request::width;
use rules::RequestDigest;

/// kube's response headers naming (by UID) the FlowSchema and priority level of a request.
pub const FLOW_SCHEMA_UID_HEADER: &str = "x-kubernetes-pf-flowschema-uid";
pub const PRIORITY_LEVEL_UID_HEADER: &str = "x-kubernetes-pf-prioritylevel-uid";

/// API Priority and Fairness for one server.
pub struct FlowControl {
    controller: Controller,
    estimator: width::Estimator,
    /// How long a request may wait in its queue.
    wait_limit: Duration,
    /// Whether kube's built-in objects are in force, and whose: the core's release's (set by
    /// the gateway's `control::core_release`). One lock, so a release read while the core's own
    /// objects arrive never puts the built-in ones back over them.
    built_in: Mutex<BuiltIn>,
}

#[derive(Default)]
struct BuiltIn {
    release: bootstrap::Release,
    in_force: bool,
}

/// What flow control decided for a request.
pub struct Decision {
    /// Where it was classified (for the response headers and the log).
    pub schema: Arc<Schema>,
    pub estimate: Estimate,
    pub admission: Admission<Seat, Waiting, Refusal>,
}

/// Why a request was refused, and the `Retry-After` its 429 carries.
#[derive(Debug)]
pub struct Refusal {
    pub reason: RejectReason,
    pub retry_after: i64,
}

impl FlowControl {
    /// `server_limit` seats in all; a queued request without a time limit of its own waits at
    /// most `wait_limit` (kube: a quarter of the request timeout, at most a minute).
    pub fn new(server_limit: u32, wait_limit: Duration, registry: &prometheus::Registry) -> Self {
        Self {
            controller: Controller::new(server_limit, metrics::Metrics::new(registry)),
            estimator: width::Estimator::default(),
            wait_limit: wait_limit.min(Duration::from_secs(60)),
            built_in: Mutex::new(BuiltIn::default()),
        }
    }

    /// Puts kube's built-in objects of the core's release in force; the summary when that
    /// changed the configuration.
    pub fn apply_built_in(&self) -> Option<controller::Summary> {
        let mut built_in = self.built_in.lock().unwrap_or_else(|e| e.into_inner());
        built_in.in_force = true;
        let (levels, schemas) = controller::built_in_objects_of(built_in.release);
        self.controller.apply(levels, schemas)
    }

    /// Puts the core's own objects in force.
    pub fn apply_core(
        &self,
        levels: Vec<k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration>,
        schemas: Vec<k8s_openapi::api::flowcontrol::v1::FlowSchema>,
    ) -> Option<controller::Summary> {
        let mut built_in = self.built_in.lock().unwrap_or_else(|e| e.into_inner());
        built_in.in_force = false;
        self.controller.apply(levels, schemas)
    }

    /// Follows the core's release: its built-in objects from now on, and at once if the
    /// built-in ones are in force.
    pub fn follow_release(&self, release: bootstrap::Release) -> Option<controller::Summary> {
        let mut built_in = self.built_in.lock().unwrap_or_else(|e| e.into_inner());
        if built_in.release == release {
            return None;
        }
        built_in.release = release;
        if !built_in.in_force {
            return None;
        }
        let (levels, schemas) = controller::built_in_objects_of(release);
        self.controller.apply(levels, schemas)
    }

    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    pub fn estimator(&self) -> &width::Estimator {
        &self.estimator
    }

    /// How long a request may wait in its queue (kube's `getRequestWaitContext`): a quarter of
    /// its own time limit when it has one (`timeout`), else the server's default; never more
    /// than a minute.
    pub fn wait_limit(&self, timeout: Option<Duration>) -> Duration {
        timeout
            .map_or(self.wait_limit, |t| t / 4)
            .min(Duration::from_secs(60))
    }

    /// Classifies the request of `user` described by `info` (with its raw `query`) and asks its
    /// level for seats. `timeout` is the request's own time limit, if it has one (a watch has
    /// none): it waits in a queue for a quarter of that at most.
    pub fn admit(
        &self,
        user: &Arc<UserInfo>,
        info: &Arc<RequestInfo>,
        query: &str,
        timeout: Option<Duration>,
    ) -> Decision {
        let config = self.controller.current();
        let remembered::Classified {
            schema,
            flow_hash: hash,
        } = remembered::classified(config.generation, user, info, || {
            let schema = Arc::clone(config.classifier.classify(RequestDigest { info, user }));
            let flow_hash = if schema.hashed {
                let distinguisher = match schema.spec.distinguisher {
                    Some(Distinguisher::ByUser) => user.name.as_str(),
                    Some(Distinguisher::ByNamespace) => info.namespace(),
                    None => "",
                };
                schema.flow_hashes.get(distinguisher)
            } else {
                0
            };
            remembered::Classified { schema, flow_hash }
        });
        drop(config);
        let estimate = self.estimator.estimate(info, query, schema.max_seats);
        schema.flow.estimated_seats(estimate.work.max_seats());
        if let Some(n) = estimate.watch_count {
            schema.flow.watch_count(n as usize);
        }
        let description = Description {
            flow: schema.flow.clone(),
            schema: schema.spec.name.clone(),
            distinguisher: schema.spec.distinguisher,
            user: user.clone(),
            info: info.clone(),
        };
        let admission =
            match schema
                .level
                .start(hash, estimate.work, description, self.wait_limit(timeout))
            {
                Admission::Run(seat) => Admission::Run(seat),
                Admission::Wait(waiting) => Admission::Wait(waiting),
                Admission::Reject(reason) => Admission::Reject(Refusal {
                    reason,
                    retry_after: schema.level.retry_after.refused(),
                }),
            };
        Decision {
            schema,
            estimate,
            admission,
        }
    }

    /// Lends and borrows seats among the levels every borrowing period, for as long as the flow
    /// control lives (the task holds it weakly, so dropping the gateway ends it).
    pub async fn run_borrowing(this: Weak<Self>) {
        let mut every = tokio::time::interval(controller::BORROWING_PERIOD);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(flow_control) = this.upgrade() else {
                return;
            };
            flow_control.controller.adjust_borrowing();
        }
    }

    /// `dump_priority_levels`.
    pub fn dump_priority_levels(&self) -> String {
        debug::priority_levels(&self.controller.levels())
    }

    /// `dump_queues`.
    pub fn dump_queues(&self) -> String {
        debug::queues(&self.controller.levels())
    }

    /// `dump_requests`, with `?includeRequestDetails` when `details`.
    pub fn dump_requests(&self, details: bool) -> String {
        debug::requests(&self.controller.levels(), details)
    }
}

#[cfg(test)]
mod tests;

/// Helpers shared by the unit tests of the pieces.
#[cfg(test)]
pub(crate) mod testing {
    use http::Method;

    use gateway_request::identity::UserInfo;
    use gateway_request::request_info::{parse, RequestInfo};

    /// The attributes of `method target` (`target` with its query).
    pub fn info(method: Method, target: &str) -> RequestInfo {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        parse(&method, path, query).unwrap()
    }

    /// A user with exactly these groups.
    pub fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).into()).collect(),
            ..Default::default()
        }
    }
}
