//! The discovery model the gateway serves at `/api`, `/apis`, `/apis/<group>` and `/openapi/v3`.
//!
//! Everything here is pure: the controllers hand in what the core server and each APIService's
//! backend last said, [`merge()`] combines them the way kube-aggregator does, and the result is a
//! [`MergedDiscovery`] of prepared bytes plus ETags, so the request path only picks a body with
//! [`negotiate()`] and writes it. No sockets, no HTTP server, no JSON work per request.
//!
//! * [`legacy`]: turn a core server that only speaks legacy discovery (`APIGroupList` +
//!   `APIResourceList`s) into the aggregated shape.
//! * [`merge`](mod@merge): core groups + APIService groups → ordered document → bytes.
//! * [`negotiate`](mod@negotiate): which representation an `Accept` header asks for.
//! * [`openapi`]: union of the backends' `/openapi/v3` root documents.
//! * [`openapi_v2`]: the merged `/openapi/v2` spec (kube-openapi's filter and merge rules).
//! * [`openapi_v2_proto`]: that spec in the protobuf form client-go asks for (gnostic's
//!   `openapi.v2.Document`).

mod document;
pub mod legacy;
pub mod merge;
pub mod negotiate;
pub mod openapi;
pub mod openapi_v2;
pub mod openapi_v2_proto;
pub mod openapi_v2_to_v3;
mod render;

pub use document::{etag_for, DiscoveryError, MAX_JSON_DEPTH};
pub use legacy::{from_legacy, from_legacy_core};
pub use merge::{
    merge, APIServiceDiscovery, AggregatedDocument, CoreDiscovery, MergedDiscovery, RemoteDiscovery,
};
pub use negotiate::{
    accepts_legacy_json, negotiate, Negotiated, ServedVersions, CONTENT_TYPE_AGGREGATED_V2,
    CONTENT_TYPE_AGGREGATED_V2BETA1, CONTENT_TYPE_JSON,
};
pub use openapi::{merge_openapi_roots, MergedOpenApiRoot, OpenApiPath, OpenApiRoot};

/// `freshness` of a group-version whose discovery was fetched on the last attempt.
pub const FRESHNESS_CURRENT: &str = "Current";
/// `freshness` of a group-version whose last fetch failed (client-go then drops it).
pub const FRESHNESS_STALE: &str = "Stale";
/// `scope` of a namespaced resource.
pub const SCOPE_NAMESPACED: &str = "Namespaced";
/// `scope` of a cluster-scoped resource.
pub const SCOPE_CLUSTER: &str = "Cluster";
