//! The priorities the merge needs beyond those APIServices declare.
//!
//! kube-apiserver registers a *local* APIService for every group-version it serves (built-ins
//! from a table compiled into each release, CRDs at a fixed default) and orders discovery by
//! them. The gateway does not copy one release's table: the core's groups keep the order the core
//! publishes (see [`crate::discovery::merge`]), and only where a group without an APIService of
//! its own has to be compared with one that has, the gateway assumes what kube-apiserver gives
//! a group it serves without a table entry, [`CRD_PRIORITY`].

/// `(groupPriorityMinimum, versionPriority)` kube-apiserver gives the APIService of every
/// CRD-served group-version; the gateway assumes it for a core group-version that has no
/// APIService of its own when placing APIService groups (and versions) around it.
pub const CRD_PRIORITY: (i32, i32) = (1000, 100);

/// The group priority aggregated discovery pins `apiregistration.k8s.io` to, one above the
/// maximum an APIService may declare (20000), so the aggregator's own group always comes first.
pub const APIREGISTRATION_GROUP_PRIORITY: i32 = 20001;

/// Name of the aggregator's own API group.
pub const APIREGISTRATION_GROUP: &str = "apiregistration.k8s.io";
