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

pub mod legacy;
pub mod merge;
pub mod negotiate;
pub mod openapi;
pub mod openapi_v2;
pub mod openapi_v2_proto;
pub mod openapi_v2_to_v3;
mod render;

pub use legacy::{from_legacy, from_legacy_core};
pub use merge::{
    merge, APIServiceDiscovery, AggregatedDocument, CoreDiscovery, MergedDiscovery, RemoteDiscovery,
};
pub use negotiate::{
    accepts_legacy_json, negotiate, Negotiated, CONTENT_TYPE_AGGREGATED_V2,
    CONTENT_TYPE_AGGREGATED_V2BETA1, CONTENT_TYPE_JSON,
};
pub use openapi::{merge_openapi_roots, MergedOpenApiRoot, OpenApiPath, OpenApiRoot};

/// How deep a JSON document from a server may nest: serde_json's recursion limit, which every
/// document the gateway reads from the core or a backend is parsed with (a deeper one is a parse
/// error, never a stack overflow). Walks over parsed documents that follow their structure by
/// recursion (the protobuf and YAML writers) are bounded by it; walks that follow references
/// between definitions, which no parser bounds, use worklists.
pub const MAX_JSON_DEPTH: usize = 128;

/// `freshness` of a group-version whose discovery was fetched on the last attempt.
pub const FRESHNESS_CURRENT: &str = "Current";
/// `freshness` of a group-version whose last fetch failed (client-go then drops it).
pub const FRESHNESS_STALE: &str = "Stale";
/// `scope` of a namespaced resource.
pub const SCOPE_NAMESPACED: &str = "Namespaced";
/// `scope` of a cluster-scoped resource.
pub const SCOPE_CLUSTER: &str = "Cluster";

/// Why a discovery document could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Serialising a prepared document failed (cannot happen with the types used here, but
    /// serde's API is fallible and we do not panic).
    #[error("serialising the {document} discovery document: {source}")]
    Serialize {
        /// Which document: `/apis`, `/api`, `/apis/<group>`, `/openapi/v3`.
        document: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The quoted ETag kube-apiserver sends for a JSON body: `"` + uppercase hex SHA-512 + `"`
/// (`etag.go` in apiserver's aggregated discovery, and kube-openapi's handler3).
pub fn etag_for(json: &[u8]) -> String {
    use sha2::{Digest, Sha512};
    let digest = Sha512::digest(json);
    let mut out = String::with_capacity(130);
    out.push('"');
    out.push_str(&hex::encode_upper(digest));
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_is_quoted_uppercase_sha512() {
        let etag = etag_for(b"{}");
        assert_eq!(etag.len(), 130);
        assert!(etag.starts_with('"') && etag.ends_with('"'));
        let hex = &etag[1..129];
        assert!(hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)));
        // sha512("{}") — fixed value, so a change of algorithm or case shows up here.
        assert!(hex.starts_with("27C74670ADB75075FAD058D5CEAF7B20C4E7786C83BAE8A32F626F9782AF34C9"));
    }
}
