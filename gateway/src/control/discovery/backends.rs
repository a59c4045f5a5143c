//! Remote backends' documents, fetched once per backing Service as kube-aggregator does:
//! `GET /apis` (aggregated `Accept`, revalidated with `If-None-Match`, 5 s) and `GET /openapi/v3`.
//! A backend without aggregated discovery is asked `/apis/<g>/<v>` per APIService. A failed fetch
//! keeps the last resources, marked `Stale`. When they are fetched is the discovery controller's
//! business (the `Discovery` and `OpenApi` keys of its work queue); this file only knows how, and
//! what one Service's cache holds between fetches.

use std::collections::HashMap;
use std::sync::Arc;

use apiservice::discovery::legacy::convert_resources;
use apiservice::discovery::RemoteDiscovery;
use apiservice::model::{GroupVersion, RegisteredAPIService};
use apiservice::route_table::Availability;
use http::header;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::discovery::v2::{APIGroupDiscoveryList, APIResourceDiscovery};

use super::fetch::{
    is_aggregated_content_type, FetchError, RootDocument, RootFetch, Source, ACCEPT_AGGREGATED,
    DISCOVERY_TIMEOUT,
};
use super::openapi_converted::{fetch_converted, ConvertedSpecs, V2Fetch};
use crate::backend::remote::RemoteBackend;

/// What one fetch of a backend's discovery produced.
#[derive(Debug)]
pub enum BackendDiscovery {
    /// 304: the cached aggregated document is still current.
    NotModified,
    Aggregated {
        doc: Arc<APIGroupDiscoveryList>,
        etag: Option<String>,
    },
    /// The backend has no aggregated discovery: per group-version results of
    /// `/apis/<g>/<v>`.
    Legacy(HashMap<GroupVersion, Result<Vec<APIResourceDiscovery>, String>>),
}

/// kube-aggregator's `fetchFreshDiscoveryForService`: aggregated `/apis` first; 304 keeps the
/// cache; 5xx or no answer is an error (the APIServices go `Stale`); any other answer without
/// the aggregated `Content-Type` (404, 406, plain JSON from a server that ignores `Accept`)
/// means a legacy server, asked per group-version.
pub async fn fetch_backend_discovery(
    source: &Source,
    etag: Option<&str>,
    group_versions: &[GroupVersion],
) -> Result<BackendDiscovery, FetchError> {
    const PATH: &str = "/apis";
    let answer = source
        .get(PATH, ACCEPT_AGGREGATED, etag, DISCOVERY_TIMEOUT)
        .await?;
    match answer.status {
        StatusCode::NOT_MODIFIED if etag.is_some() => return Ok(BackendDiscovery::NotModified),
        StatusCode::NOT_MODIFIED => {
            return Err(FetchError::UnexpectedNotModified {
                path: PATH.to_owned(),
            })
        }
        status if status.is_server_error() => {
            return Err(FetchError::Status {
                path: PATH.to_owned(),
                status,
            })
        }
        StatusCode::OK if is_aggregated_content_type(answer.headers.get(header::CONTENT_TYPE)) => {
            let doc: APIGroupDiscoveryList = answer.decode(PATH, "aggregated discovery list")?;
            return Ok(BackendDiscovery::Aggregated {
                doc: Arc::new(doc),
                etag: answer.etag(),
            });
        }
        _ => {}
    }
    let fetches = group_versions.iter().map(|gv| async move {
        let path = gv.path();
        let result = match source
            .get(&path, "application/json", None, DISCOVERY_TIMEOUT)
            .await
        {
            Ok(a) if a.status == StatusCode::OK => a
                .decode::<APIResourceList>(&path, "APIResourceList")
                .map(|list| convert_resources(&list.resources))
                .map_err(|e| e.to_string()),
            Ok(a) => Err(FetchError::Status {
                path: path.clone(),
                status: a.status,
            }
            .to_string()),
            Err(e) => Err(e.to_string()),
        };
        (gv.clone(), result)
    });
    Ok(BackendDiscovery::Legacy(
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .collect(),
    ))
}

/// The next [`RemoteDiscovery`] of one APIService after a fetch of its Service. `doc` is the
/// Service's aggregated document after applying the fetch (the cached one for a 304); `fetch` is
/// `None` when the fetch failed.
pub fn remote_discovery(
    fetch: Option<&BackendDiscovery>,
    doc: Option<&APIGroupDiscoveryList>,
    gv: &GroupVersion,
    previous: Option<&RemoteDiscovery>,
) -> RemoteDiscovery {
    let failed = || RemoteDiscovery::failed(previous.and_then(|p| p.resources.clone()));
    match fetch {
        Some(BackendDiscovery::NotModified | BackendDiscovery::Aggregated { .. }) => match doc {
            Some(doc) => RemoteDiscovery::from_backend_document(doc, &gv.group, &gv.version),
            None => failed(),
        },
        Some(BackendDiscovery::Legacy(results)) => match results.get(gv) {
            Some(Ok(resources)) => RemoteDiscovery::current(resources.clone()),
            _ => failed(),
        },
        None => failed(),
    }
}

/// One view of a backend: an APIService its availability check found unavailable is
/// served `Stale` with its last resources, whatever its discovery fetch said, as kube-aggregator
/// serves it (its discovery goes through the proxy, which refuses an unavailable APIService).
pub fn seen_through_availability(
    discovery: RemoteDiscovery,
    availability: &Availability,
) -> RemoteDiscovery {
    match availability {
        Availability::Unavailable { .. } => RemoteDiscovery::failed(discovery.resources),
        Availability::Available | Availability::Unknown => discovery,
    }
}

/// One backing Service and the remote APIServices pointing at it.
#[derive(Default)]
pub struct ServiceEntry {
    /// Sorted by name; what the last routing snapshot said.
    pub apiservices: Vec<(Arc<RegisteredAPIService>, Availability)>,
    /// The backend of the first APIService with a usable transport.
    pub backend: Option<Arc<RemoteBackend>>,
    pub etag: Option<String>,
    pub doc: Option<Arc<APIGroupDiscoveryList>>,
    pub openapi: RootDocument,
    /// The documents served for its group-versions while it has no `/openapi/v3`.
    pub converted: ConvertedSpecs,
    /// The last discovery error, logged once per change.
    pub last_error: Option<String>,
    /// The last OpenAPI document the backend sent that could not be used, logged once per
    /// change.
    pub openapi_error: Option<String>,
}

impl ServiceEntry {
    /// The next discovery fetch, revalidating what is cached; `None` without a usable transport
    /// (e.g. a bad caBundle): nothing to ask, its APIServices stay `Stale`.
    pub fn discovery_fetch(
        &self,
    ) -> Option<
        impl std::future::Future<Output = Result<BackendDiscovery, FetchError>> + Send + 'static,
    > {
        let source = Source::Remote(self.backend.clone()?);
        let etag = self.doc.as_ref().and(self.etag.clone());
        let group_versions: Vec<GroupVersion> = self
            .apiservices
            .iter()
            .map(|(a, _)| a.group_version())
            .collect();
        Some(
            async move { fetch_backend_discovery(&source, etag.as_deref(), &group_versions).await },
        )
    }

    /// The next OpenAPI v3 root fetch, revalidating a root it holds; after a 404 it goes on
    /// to the v2 spec, converted for the Service's group-versions (`openapi_converted`).
    pub fn openapi_fetch(
        &self,
    ) -> Option<impl std::future::Future<Output = Result<RemoteOpenApi, FetchError>> + Send + 'static>
    {
        let source = Source::Remote(self.backend.clone()?);
        let etag = self.openapi.etag().map(str::to_owned);
        let group_versions: Vec<GroupVersion> = self
            .apiservices
            .iter()
            .map(|(a, _)| a.group_version())
            .collect();
        let v2_etag = self
            .converted
            .covers(&group_versions)
            .then(|| self.converted.v2_etag.clone())
            .flatten();
        Some(async move {
            let root = super::fetch::fetch_root(&source, etag.as_deref()).await?;
            let converted = match root {
                RootFetch::Absent => {
                    Some(fetch_converted(&source, v2_etag.as_deref(), group_versions).await?)
                }
                _ => None,
            };
            Ok(RemoteOpenApi { root, converted })
        })
    }
}

/// One fetch of a remote Service's OpenAPI: its v3 root, and the v2 fallback after a 404.
pub struct RemoteOpenApi {
    pub root: RootFetch,
    /// `Some` only when the root was absent.
    pub converted: Option<V2Fetch>,
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn resources(names: &[&str]) -> Vec<APIResourceDiscovery> {
        names
            .iter()
            .map(|n| APIResourceDiscovery {
                resource: Some((*n).to_owned()),
                ..Default::default()
            })
            .collect()
    }

    pub(crate) fn doc(json: serde_json::Value) -> APIGroupDiscoveryList {
        serde_json::from_value(json).unwrap()
    }

    pub(crate) fn wardle_doc() -> APIGroupDiscoveryList {
        doc(serde_json::json!({
            "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": [{
                "metadata": {"creationTimestamp": null, "name": "wardle.example.com"},
                "versions": [{"version": "v1alpha1", "freshness": "Current", "resources": [
                    {"resource": "flunders", "responseKind": {"group": "", "version": "", "kind": "Flunder"},
                     "scope": "Namespaced", "singularResource": "flunder", "verbs": ["get", "list"]}
                ]}]
            }]
        }))
    }

    #[test]
    fn aggregated_answers_fill_current_entries() {
        let gv = GroupVersion::new("wardle.example.com", "v1alpha1");
        let d = wardle_doc();
        let fetch = BackendDiscovery::Aggregated {
            doc: Arc::new(d.clone()),
            etag: Some("\"E\"".into()),
        };
        let next = remote_discovery(Some(&fetch), Some(&d), &gv, None);
        assert!(next.fresh);
        assert_eq!(next.resources.as_ref().map(Vec::len), Some(1));
        // A 304 reuses the cached document.
        let again = remote_discovery(
            Some(&BackendDiscovery::NotModified),
            Some(&d),
            &gv,
            Some(&next),
        );
        assert_eq!(again, next);
        // A group-version the backend does not list: an empty but current entry.
        let other = GroupVersion::new("wardle.example.com", "v1beta1");
        assert_eq!(
            remote_discovery(Some(&fetch), Some(&d), &other, None),
            RemoteDiscovery::not_listed()
        );
    }

    #[test]
    fn failures_keep_the_last_resources_as_stale() {
        let gv = GroupVersion::new("wardle.example.com", "v1alpha1");
        let before = RemoteDiscovery::current(resources(&["flunders", "fischers"]));
        let after = remote_discovery(None, None, &gv, Some(&before));
        assert!(!after.fresh);
        assert_eq!(after.resources, before.resources);
        // Never fetched successfully: a version-only stale entry.
        let never = remote_discovery(None, None, &gv, None);
        assert_eq!(never, RemoteDiscovery::failed(None));
        // And back to current on the next success.
        let d = wardle_doc();
        let fetch = BackendDiscovery::Aggregated {
            doc: Arc::new(d.clone()),
            etag: None,
        };
        assert!(remote_discovery(Some(&fetch), Some(&d), &gv, Some(&after)).fresh);
    }

    #[test]
    fn legacy_backends_are_read_per_group_version() {
        let ok = GroupVersion::new("wardle.example.com", "v1alpha1");
        let bad = GroupVersion::new("wardle.example.com", "v1beta1");
        let mut results = HashMap::new();
        results.insert(ok.clone(), Ok(resources(&["flunders"])));
        results.insert(
            bad.clone(),
            Err("GET /apis/wardle.example.com/v1beta1: 503".into()),
        );
        let fetch = BackendDiscovery::Legacy(results);
        let a = remote_discovery(Some(&fetch), None, &ok, None);
        assert!(a.fresh);
        let previous = RemoteDiscovery::current(resources(&["fischers"]));
        let b = remote_discovery(Some(&fetch), None, &bad, Some(&previous));
        assert!(!b.fresh);
        assert_eq!(b.resources, previous.resources);
    }

    #[test]
    fn a_legacy_conversion_of_a_backend_list_folds_subresources() {
        let list: APIResourceList = serde_json::from_value(serde_json::json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "wardle.example.com/v1alpha1",
            "resources": [
                {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder", "verbs": ["get"]},
                {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder", "verbs": ["get"]}
            ]
        }))
        .unwrap();
        let converted = convert_resources(&list.resources);
        assert_eq!(converted.len(), 1);
        assert_eq!(converted[0].subresources.len(), 1);
    }
}
