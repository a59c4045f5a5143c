//! The gateway's `/openapi/v3` root: the union of the backends' root documents.
//!
//! kube-aggregator proxies OpenAPI v3 rather than merging specs: its root is the union of every
//! APIService's root `paths` map, and `/openapi/v3/<path>` goes to whichever backend listed that
//! path. We do the same. Each entry's `serverRelativeURL` is kept as the backend gave it: it is
//! `/openapi/v3/<path>?hash=<HASH>`, which already points through the gateway, and the hash is
//! the backend's own (the GV document is proxied unchanged, so the hash stays valid).
//!
//! Clash rule: **later inputs win** (as kube's loop overwrites). kube iterates a Go map, so its
//! winner is random; callers here pass the inputs in ascending precedence — the core first, then
//! remote APIServices in ascending priority (lowest groupPriorityMinimum/versionPriority first) —
//! so the highest-priority backend owns a contested path. Callers that want a backend to own
//! only its APIService's group-versions filter its `paths` before merging.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{etag_for, DiscoveryError};

/// One entry of an OpenAPI v3 root document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenApiPath {
    #[serde(rename = "serverRelativeURL")]
    pub server_relative_url: String,
}

/// An OpenAPI v3 root document (`GET /openapi/v3`): keys like `apis/apps/v1`, `api/v1` (no
/// leading slash). Unknown top-level fields are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenApiRoot {
    #[serde(default)]
    pub paths: BTreeMap<String, OpenApiPath>,
}

/// The merged root, ready to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedOpenApiRoot<B> {
    /// `{"paths":{...}}`, keys sorted (as Go's `json.Marshal` sorts map keys).
    pub body: Bytes,
    /// Quoted uppercase hex SHA-512 of `body`.
    pub etag: String,
    /// Which backend answers `/openapi/v3/<path>` for each path key.
    pub owners: HashMap<String, B>,
}

/// Unions the `paths` of the given root documents; on a key clash the later input wins (module
/// docs). `B` identifies a backend and is whatever the caller routes by.
pub fn merge_openapi_roots<B: Clone>(
    inputs: &[(B, OpenApiRoot)],
) -> Result<MergedOpenApiRoot<B>, DiscoveryError> {
    let mut paths: BTreeMap<&str, (&OpenApiPath, &B)> = BTreeMap::new();
    for (backend, root) in inputs {
        for (key, path) in &root.paths {
            paths.insert(key.as_str(), (path, backend));
        }
    }

    #[derive(Serialize)]
    struct Root<'a> {
        paths: BTreeMap<&'a str, &'a OpenApiPath>,
    }
    let root = Root {
        paths: paths.iter().map(|(k, (p, _))| (*k, *p)).collect(),
    };
    let body = serde_json::to_vec(&root).map_err(|source| DiscoveryError::Serialize {
        document: "/openapi/v3".to_owned(),
        source,
    })?;
    let etag = etag_for(&body);
    let owners = paths
        .into_iter()
        .map(|(k, (_, b))| (k.to_owned(), b.clone()))
        .collect();
    Ok(MergedOpenApiRoot {
        body: Bytes::from(body),
        etag,
        owners,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(json: &str) -> OpenApiRoot {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn union_with_later_inputs_winning() {
        let core = root(
            r#"{"paths":{
                "api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AAA"},
                "apis/apps/v1":{"serverRelativeURL":"/openapi/v3/apis/apps/v1?hash=BBB"},
                "apis/metrics.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io/v1beta1?hash=OLD"}}}"#,
        );
        let metrics = root(
            r#"{"paths":{"apis/metrics.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io/v1beta1?hash=NEW"}},
                "extra":"ignored"}"#,
        );
        let merged = merge_openapi_roots(&[("core", core), ("metrics", metrics)]).unwrap();
        assert_eq!(
            std::str::from_utf8(&merged.body).unwrap(),
            concat!(
                r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AAA"},"#,
                r#""apis/apps/v1":{"serverRelativeURL":"/openapi/v3/apis/apps/v1?hash=BBB"},"#,
                r#""apis/metrics.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/metrics.k8s.io/v1beta1?hash=NEW"}}}"#
            )
        );
        assert_eq!(merged.owners["api/v1"], "core");
        assert_eq!(merged.owners["apis/metrics.k8s.io/v1beta1"], "metrics");
        assert_eq!(merged.etag, etag_for(&merged.body));
        assert_eq!(merged.etag.len(), 130);
    }

    #[test]
    fn empty_inputs_give_empty_paths() {
        let merged = merge_openapi_roots::<u32>(&[]).unwrap();
        assert_eq!(&merged.body[..], br#"{"paths":{}}"#);
        assert!(merged.owners.is_empty());
        let missing_paths = root("{}");
        assert!(missing_paths.paths.is_empty());
    }
}
