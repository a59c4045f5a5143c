//! The core server's discovery documents: `/api` and `/apis` (aggregated `Accept`, revalidated
//! with `If-None-Match`). Its `/openapi/v3` root is fetched on a key of its own (a slow root
//! must not hold back a new CRD group). A core that answers without the aggregated
//! `Content-Type` is read the legacy way (`/apis` then every `/apis/<g>/<v>`, `/api` +
//! `/api/<v>`) and converted. When they are read is the discovery controller's business (the
//! `Core` key of its work queue); this file only knows how.

use std::time::{Duration, Instant};

use apiservice::discovery::{from_legacy, from_legacy_core, CoreDiscovery};
use apiservice::outage::Outage;
use bytes::Bytes;
use http::header;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, APIVersions};
use kube::core::discovery::v2::APIGroupDiscoveryList;

use super::fetch::{
    is_aggregated_content_type, FetchError, Fetched, RootDocument, Source, ACCEPT_AGGREGATED,
    DISCOVERY_TIMEOUT,
};

/// What the core server serves, as the merge uses it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreState {
    pub discovery: CoreDiscovery,
    pub openapi: RootDocument,
}

/// One of the core's discovery documents (`/api` or `/apis`) with what revalidating it needs.
pub struct CoreDocument {
    path: &'static str,
    doc: Option<APIGroupDiscoveryList>,
    /// ETag of the aggregated answer, `None` in legacy mode.
    etag: Option<String>,
    /// Legacy mode: the index document (`APIVersions`/`APIGroupList`) last converted and when
    /// its per-version lists were fetched, so they are re-read only when the index changed or
    /// once per refresh interval.
    legacy: Option<LegacyIndex>,
}

/// A legacy index document as last converted.
struct LegacyIndex {
    body: Bytes,
    converted_at: Instant,
}

// === impl CoreDocument ===

impl CoreDocument {
    pub fn new(path: &'static str) -> Self {
        Self {
            path,
            doc: None,
            etag: None,
            legacy: None,
        }
    }

    /// Revalidates the document; `Ok(true)` when it changed.
    pub async fn refresh(
        &mut self,
        core: &Source,
        legacy_refresh: Duration,
    ) -> Result<bool, FetchError> {
        let etag = self.doc.as_ref().and(self.etag.as_deref());
        let answer = core
            .get(self.path, ACCEPT_AGGREGATED, etag, DISCOVERY_TIMEOUT)
            .await?;
        let next = match answer.status {
            StatusCode::NOT_MODIFIED if self.doc.is_some() => return Ok(false),
            StatusCode::NOT_MODIFIED => {
                return Err(FetchError::UnexpectedNotModified {
                    path: self.path.to_owned(),
                })
            }
            StatusCode::OK
                if is_aggregated_content_type(answer.headers.get(header::CONTENT_TYPE)) =>
            {
                let doc: APIGroupDiscoveryList =
                    answer.decode(self.path, "aggregated discovery list")?;
                self.etag = answer.etag();
                self.legacy = None;
                doc
            }
            StatusCode::OK => {
                let fresh = self.legacy.as_ref().is_some_and(|index| {
                    index.body == answer.body && index.converted_at.elapsed() < legacy_refresh
                });
                if fresh && self.doc.is_some() {
                    return Ok(false);
                }
                let doc = if self.path == "/api" {
                    legacy_core(core, &answer).await?
                } else {
                    legacy_groups(core, &answer).await?
                };
                self.etag = None;
                self.legacy = Some(LegacyIndex {
                    body: answer.body.clone(),
                    converted_at: Instant::now(),
                });
                doc
            }
            // client-go tolerates a server without `/api`; so do we.
            StatusCode::NOT_FOUND if self.path == "/api" => APIGroupDiscoveryList::default(),
            status => {
                return Err(FetchError::Status {
                    path: self.path.to_owned(),
                    status,
                })
            }
        };
        let changed = self.doc.as_ref() != Some(&next);
        self.doc = Some(next);
        Ok(changed)
    }
}

/// Legacy `/api` (`APIVersions`) plus every `/api/<v>`, converted.
async fn legacy_core(core: &Source, index: &Fetched) -> Result<APIGroupDiscoveryList, FetchError> {
    let versions: APIVersions = index.decode("/api", "APIVersions")?;
    let paths: Vec<String> = versions
        .versions
        .iter()
        .map(|v| format!("/api/{v}"))
        .collect();
    let lists = resource_lists(core, &paths).await;
    Ok(from_legacy_core(&versions, &lists))
}

/// Legacy `/apis` (`APIGroupList`) plus every `/apis/<g>/<v>`, converted.
async fn legacy_groups(
    core: &Source,
    index: &Fetched,
) -> Result<APIGroupDiscoveryList, FetchError> {
    let groups: APIGroupList = index.decode("/apis", "APIGroupList")?;
    let paths: Vec<String> = groups
        .groups
        .iter()
        .flat_map(|g| g.versions.iter())
        .map(|v| format!("/apis/{}", v.group_version))
        .collect();
    let lists = resource_lists(core, &paths).await;
    Ok(from_legacy(&groups, &lists))
}

/// Fetches resource lists in parallel; a failed one is left out (the conversion then marks
/// that group-version `Stale`).
async fn resource_lists(source: &Source, paths: &[String]) -> Vec<APIResourceList> {
    let fetches = paths.iter().map(|path| async move {
        let result = match source
            .get(path, "application/json", None, DISCOVERY_TIMEOUT)
            .await
        {
            Ok(a) if a.status == StatusCode::OK => {
                a.decode::<APIResourceList>(path, "APIResourceList")
            }
            Ok(a) => Err(FetchError::Status {
                path: path.clone(),
                status: a.status,
            }),
            Err(e) => Err(e),
        };
        result
            .map_err(|e| tracing::debug!(error = %e, "legacy discovery of a group-version failed"))
            .ok()
    });
    futures::future::join_all(fetches)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Everything known about the core's documents between two refreshes.
pub struct CoreDocuments {
    source: Source,
    legacy_refresh: Duration,
    api: CoreDocument,
    apis: CoreDocument,
    outage: Outage,
}

/// What one refresh of the core's documents found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refreshed {
    /// Something the merge uses changed.
    pub changed: bool,
    /// Every document answered (an error keeps the last known one and is retried sooner).
    pub complete: bool,
}

// === impl CoreDocuments ===

impl CoreDocuments {
    pub fn new(source: Source, legacy_refresh: Duration) -> Self {
        Self {
            source,
            legacy_refresh,
            api: CoreDocument::new("/api"),
            apis: CoreDocument::new("/apis"),
            outage: Outage::new(
                "core discovery fetch",
                "the last known /api and /apis of the core are served",
            ),
        }
    }

    /// What the merge needs, once both `/api` and `/apis` were read.
    pub fn discovery(&self) -> Option<CoreDiscovery> {
        Some(CoreDiscovery {
            api: self.api.doc.clone()?,
            apis: self.apis.doc.clone()?,
        })
    }

    /// Revalidates both documents concurrently; a failure is logged once per outage.
    pub async fn refresh(&mut self) -> Refreshed {
        let source = &self.source;
        let legacy_refresh = self.legacy_refresh;
        let (api, apis) = tokio::join!(
            self.api.refresh(source, legacy_refresh),
            self.apis.refresh(source, legacy_refresh),
        );
        let mut changed = false;
        let mut failed = None;
        for result in [api, apis] {
            match result {
                Ok(c) => changed |= c,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match &failed {
            Some(e) => self.outage.failed(e),
            None => self.outage.answered(),
        }
        Refreshed {
            changed,
            complete: failed.is_none(),
        }
    }
}
