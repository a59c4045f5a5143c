//! The control side: loops that watch the core, the APIServices and the backends, and publish
//! immutable snapshots the request path reads with one load. All run on the one work-queue shape
//! of `crate::workqueue`:
//!
//! * [`apiservices`]: the route controller (APIServices -> the route table the router reads)
//!   and the availability controller (kube-aggregator's `remote_available_controller.go`);
//! * [`discovery`]: the discovery controller (core and remote documents -> merged discovery and
//!   the OpenAPI v3 root), the OpenAPI v2 loop, and the snapshot they publish
//!   ([`discovery::DiscoveryCache`]);
//! * [`trust`]: kube-system/extension-apiserver-authentication kept current;
//! * [`leader_election`]: the Lease that decides which replica writes APIService status;
//! * [`core_readiness`]: the `core-server` readiness check;
//! * [`core_release`]: the core's Kubernetes release, and the behaviours that follow it;
//! * [`flowcontrol`]: API Priority and Fairness: the FlowSchemas and PriorityLevelConfigurations
//!   (the core's, or kube's built-in ones) digested into the classification and the priority
//!   levels (seats and queues) the front's `priority_and_fairness` layer admits requests by.
//!
//! Imports from: the backends (the clients the loops fetch and probe with) and the bottom.

pub mod apiservices;
pub mod core_readiness;
pub mod core_release;
pub mod discovery;
pub mod flowcontrol;
pub mod leader_election;
pub mod trust;
