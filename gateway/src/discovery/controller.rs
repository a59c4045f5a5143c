//! The discovery controller: keeps what the core server and every remote backend say about their
//! APIs, and publishes a new merged snapshot whenever one of those inputs changes.
//!
//! Three kinds of input, each refreshed on its own schedule:
//! * **the core server**: `/api`, `/apis` (aggregated `Accept`, revalidated with `If-None-Match`)
//!   and `/openapi/v3`, every [`CORE_REFRESH`], so new CRD-like groups of the core show up
//!   quickly. A core that answers without the aggregated `Content-Type` is read the legacy way
//!   (`/apis` then every `/apis/<g>/<v>`, `/api` + `/api/<v>`) and converted.
//! * **remote backends**, once per backing Service as kube-aggregator does: `GET /apis` (5 s) and
//!   `GET /openapi/v3`, every refresh interval and whenever one of its APIServices changed
//!   (added, edited, availability flipped). A backend without aggregated discovery is asked
//!   `/apis/<g>/<v>` per APIService. A failed fetch keeps the last resources, marked `Stale`.
//! * **the routing snapshot**: which APIServices exist and which backend serves each, checked
//!   every [`ROUTING_POLL`] by pointer (a new APIService must show up within 2 s).
//!
//! Fetches run in their own tasks and report back over a channel, so a backend that hangs for
//! its whole timeout never delays another backend or a routing change; discovery and the
//! OpenAPI root of one Service report separately, so a slow root never delays discovery. All
//! JSON work (parsing, merging, serialising) happens here, once per change; handlers only serve
//! the bytes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiservice::discovery::legacy::convert_resources;
use apiservice::discovery::{
    from_legacy, from_legacy_core, merge, merge_openapi_roots, APIServiceDiscovery, CoreDiscovery,
    OpenApiRoot, RemoteDiscovery,
};
use apiservice::model::{GroupVersion, RegisteredAPIService, ServiceRef};
use apiservice::route::Availability;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, APIVersions};
use kube::core::discovery::v2::{APIGroupDiscoveryList, APIResourceDiscovery};
use tokio::sync::{mpsc, watch};

use super::openapi::{openapi_inputs, root_key, RemoteRoot};
use super::{DiscoveryCache, OpenApiOwner};
use crate::backend::core::CoreBackend;
use crate::backend::remote::RemoteBackend;
use crate::body::{self, BoxError};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::routing::{Routes, Routing, Target};

/// How often the core's documents are revalidated (cheap: `If-None-Match` → 304).
pub const CORE_REFRESH: Duration = Duration::from_secs(5);
/// Retry interval while the core has never answered.
const CORE_RETRY: Duration = Duration::from_secs(1);
/// How often the routing snapshot is compared with the last one seen.
pub const ROUTING_POLL: Duration = Duration::from_millis(200);
/// kube-aggregator's limit for a backend's discovery (`handler_discovery.go`).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Limit for an OpenAPI v3 root document.
const OPENAPI_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest discovery or OpenAPI root document accepted (a real cluster's `/apis` is ~60 KB).
const MAX_DOCUMENT_BYTES: usize = 32 << 20;

/// What client-go sends for `/api` and `/apis`; also what we ask the core and backends.
pub const ACCEPT_AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// Why fetching a document failed; the message names the path and what to check.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {path}: {source}")]
    Request {
        path: String,
        #[source]
        source: GatewayError,
    },
    #[error("GET {path}: no complete answer within {}s", .timeout.as_secs())]
    Timeout { path: String, timeout: Duration },
    #[error("GET {path}: reading the body: {source}")]
    Body {
        path: String,
        #[source]
        source: BoxError,
    },
    #[error("GET {path}: unexpected status {status}")]
    Status { path: String, status: StatusCode },
    #[error("GET {path}: 304 Not Modified without a cached document")]
    UnexpectedNotModified { path: String },
    #[error("GET {path}: decoding the {what}: {source}")]
    Decode {
        path: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Whether a response `Content-Type` announces an aggregated discovery list (v2 or v2beta1).
///
/// client-go's rule (`ContentTypeIsGVK`): media type `application/json` and the parameters
/// `g=apidiscovery.k8s.io`, `v=v2|v2beta1`, `as=APIGroupDiscoveryList` in any order; other
/// parameters (`charset`) are allowed. Anything else is a legacy document.
pub fn is_aggregated_content_type(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mut parts = ct.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return false;
    }
    let (mut g, mut v, mut kind) = (false, false, false);
    for param in parts {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match key.trim().to_ascii_lowercase().as_str() {
            "g" => g = value == "apidiscovery.k8s.io",
            "v" => v = value == "v2" || value == "v2beta1",
            "as" => kind = value == "APIGroupDiscoveryList",
            _ => {}
        }
    }
    g && v && kind
}

/// One answer, fully read.
struct Fetched {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Fetched {
    fn etag(&self) -> Option<String> {
        self.headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<T, FetchError> {
        serde_json::from_slice(&self.body).map_err(|source| FetchError::Decode {
            path: path.to_owned(),
            what,
            source,
        })
    }
}

/// Where a document is fetched from, with the gateway's own credentials.
#[derive(Clone)]
enum Source {
    Core(Arc<CoreBackend>),
    Remote(Arc<RemoteBackend>),
}

impl Source {
    async fn get(
        &self,
        path: &str,
        accept: &'static str,
        if_none_match: Option<&str>,
        timeout: Duration,
    ) -> Result<Fetched, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
        if let Some(v) = if_none_match.and_then(|e| HeaderValue::from_str(e).ok()) {
            headers.insert(header::IF_NONE_MATCH, v);
        }
        let request = async {
            let resp = match self {
                Source::Core(core) => {
                    let mut req = http::Request::builder()
                        .method(Method::GET)
                        .uri(path)
                        .body(body::empty())
                        .map_err(|e| FetchError::Request {
                            path: path.to_owned(),
                            source: GatewayError::Internal(e.to_string()),
                        })?;
                    *req.headers_mut() = headers;
                    core.send_own(req).await
                }
                // The outer timeout bounds the whole exchange; this one only the headers.
                Source::Remote(remote) => remote.get(path, headers, timeout).await,
            }
            .map_err(|source| FetchError::Request {
                path: path.to_owned(),
                source,
            })?;
            let (parts, incoming) = resp.into_parts();
            let body = Limited::new(incoming, MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map_err(|source| FetchError::Body {
                    path: path.to_owned(),
                    source,
                })?
                .to_bytes();
            Ok(Fetched {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(timeout, request)
            .await
            .map_err(|_| FetchError::Timeout {
                path: path.to_owned(),
                timeout,
            })?
    }
}

// ---------------------------------------------------------------------------------------------
// The core server
// ---------------------------------------------------------------------------------------------

/// The core's OpenAPI v3 root as last seen.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum CoreOpenApi {
    /// Never answered: `/openapi/v3` falls through to the core.
    #[default]
    Unknown,
    /// The core has no `/openapi/v3` (404).
    Absent,
    Root(OpenApiRoot),
}

/// What the core server serves, as published to the merge loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreState {
    pub discovery: CoreDiscovery,
    pub openapi: CoreOpenApi,
}

/// One of the core's discovery documents (`/api` or `/apis`) with what revalidating it needs.
struct CoreDocument {
    path: &'static str,
    doc: Option<APIGroupDiscoveryList>,
    /// ETag of the aggregated answer, `None` in legacy mode.
    etag: Option<String>,
    /// Legacy mode: the index document (`APIVersions`/`APIGroupList`) last converted and when
    /// its per-version lists were fetched, so they are re-read only when the index changed or
    /// once per refresh interval.
    legacy: Option<(Bytes, Instant)>,
}

impl CoreDocument {
    fn new(path: &'static str) -> Self {
        Self {
            path,
            doc: None,
            etag: None,
            legacy: None,
        }
    }

    /// Revalidates the document; `Ok(true)` when it changed.
    async fn refresh(
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
                let fresh = self.legacy.as_ref().is_some_and(|(index, at)| {
                    *index == answer.body && at.elapsed() < legacy_refresh
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
                self.legacy = Some((answer.body.clone(), Instant::now()));
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

/// An OpenAPI v3 root with what revalidating it needs.
#[derive(Default)]
struct RootDocument {
    etag: Option<String>,
    root: Option<OpenApiRoot>,
}

/// Outcome of fetching an OpenAPI v3 root.
enum RootFetch {
    NotModified,
    Root(OpenApiRoot, Option<String>),
    /// 404: the server has no OpenAPI v3.
    Absent,
}

async fn fetch_root(source: &Source, etag: Option<&str>) -> Result<RootFetch, FetchError> {
    const PATH: &str = "/openapi/v3";
    let answer = source
        .get(PATH, "application/json", etag, OPENAPI_TIMEOUT)
        .await?;
    match answer.status {
        StatusCode::NOT_MODIFIED if etag.is_some() => Ok(RootFetch::NotModified),
        StatusCode::OK => Ok(RootFetch::Root(
            answer.decode(PATH, "OpenAPI v3 root")?,
            answer.etag(),
        )),
        StatusCode::NOT_FOUND => Ok(RootFetch::Absent),
        status => Err(FetchError::Status {
            path: PATH.to_owned(),
            status,
        }),
    }
}

/// Polls the core server and publishes [`CoreState`] when it changed. The first value is sent
/// once both `/api` and `/apis` were read.
struct CorePoller {
    source: Source,
    url: String,
    legacy_refresh: Duration,
    api: CoreDocument,
    apis: CoreDocument,
    openapi: RootDocument,
    openapi_state: CoreOpenApi,
    last_error: Option<String>,
}

impl CorePoller {
    async fn run(mut self, out: watch::Sender<Option<Arc<CoreState>>>) {
        loop {
            let changed = self.poll().await;
            if changed {
                if let (Some(api), Some(apis)) = (&self.api.doc, &self.apis.doc) {
                    let state = CoreState {
                        discovery: CoreDiscovery {
                            api: api.clone(),
                            apis: apis.clone(),
                        },
                        openapi: self.openapi_state.clone(),
                    };
                    if out.send(Some(Arc::new(state))).is_err() {
                        return;
                    }
                }
            }
            if out.is_closed() {
                return;
            }
            let ready = self.api.doc.is_some() && self.apis.doc.is_some();
            tokio::time::sleep(if ready { CORE_REFRESH } else { CORE_RETRY }).await;
        }
    }

    /// One round; `true` when anything published changed.
    async fn poll(&mut self) -> bool {
        let source = &self.source;
        let legacy_refresh = self.legacy_refresh;
        let (api, apis, root) = tokio::join!(
            self.api.refresh(source, legacy_refresh),
            self.apis.refresh(source, legacy_refresh),
            fetch_root(source, self.openapi.etag.as_deref()),
        );
        let mut changed = false;
        let mut errors = Vec::new();
        for result in [api, apis] {
            match result {
                Ok(c) => changed |= c,
                Err(e) => errors.push(e.to_string()),
            }
        }
        match root {
            Ok(RootFetch::NotModified) => {}
            Ok(RootFetch::Root(root, etag)) => {
                self.openapi.etag = etag;
                self.openapi.root = Some(root.clone());
                let next = CoreOpenApi::Root(root);
                changed |= next != self.openapi_state;
                self.openapi_state = next;
            }
            Ok(RootFetch::Absent) => {
                if self.openapi_state != CoreOpenApi::Absent {
                    tracing::info!(core = %self.url, "the core server has no /openapi/v3; the gateway serves the remote backends' paths only");
                }
                self.openapi = RootDocument::default();
                changed |= self.openapi_state != CoreOpenApi::Absent;
                self.openapi_state = CoreOpenApi::Absent;
            }
            Err(e) => errors.push(e.to_string()),
        }
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        if error != self.last_error {
            match &error {
                Some(e) => {
                    tracing::warn!(core = %self.url, error = %e, "cannot refresh the core server's discovery; serving the last known documents")
                }
                None => tracing::info!(core = %self.url, "core server discovery refreshed"),
            }
            self.last_error = error;
        }
        changed
    }
}

// ---------------------------------------------------------------------------------------------
// Remote backends
// ---------------------------------------------------------------------------------------------

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

/// One half of a Service's fetch, reported as soon as it is done: the OpenAPI root may take up
/// to [`OPENAPI_TIMEOUT`], and waiting for it would hold a failed discovery back from `Stale`
/// for longer than kube-aggregator's [`DISCOVERY_TIMEOUT`].
enum ServiceReport {
    Discovery(Result<BackendDiscovery, FetchError>),
    OpenApi(Result<RootFetch, FetchError>),
}

/// A report of one fetch, sent back to the merge loop.
struct ServiceFetched {
    key: ServiceRef,
    /// The fetch it belongs to (see [`ServiceEntry::running`]).
    job: u64,
    report: ServiceReport,
}

/// Everything a fetch task needs, copied out of the loop's state.
struct FetchJob {
    key: ServiceRef,
    job: u64,
    backend: Arc<RemoteBackend>,
    etag: Option<String>,
    group_versions: Vec<GroupVersion>,
    openapi_etag: Option<String>,
}

impl FetchJob {
    /// The next fetch of `entry`, revalidating whatever it has cached; `None` without a usable
    /// transport (e.g. a bad caBundle): nothing to ask, its APIServices stay `Stale`.
    fn for_entry(key: &ServiceRef, job: u64, entry: &ServiceEntry) -> Option<FetchJob> {
        Some(FetchJob {
            key: key.clone(),
            job,
            backend: entry.backend.clone()?,
            etag: entry.doc.as_ref().and(entry.etag.clone()),
            group_versions: entry
                .apiservices
                .iter()
                .map(|(a, _)| a.group_version())
                .collect(),
            openapi_etag: entry.openapi.root.as_ref().and(entry.openapi.etag.clone()),
        })
    }

    /// Fetches discovery and the OpenAPI root concurrently and reports each when it is done.
    async fn run(self, results: mpsc::UnboundedSender<ServiceFetched>) {
        let source = Source::Remote(self.backend.clone());
        let send = |report| {
            let _ = results.send(ServiceFetched {
                key: self.key.clone(),
                job: self.job,
                report,
            });
        };
        tokio::join!(
            async {
                let fetched =
                    fetch_backend_discovery(&source, self.etag.as_deref(), &self.group_versions)
                        .await;
                send(ServiceReport::Discovery(fetched));
            },
            async {
                let fetched = fetch_root(&source, self.openapi_etag.as_deref()).await;
                send(ServiceReport::OpenApi(fetched));
            },
        );
    }
}

/// kube-aggregator's `fetchFreshDiscoveryForService`: aggregated `/apis` first; 304 keeps the
/// cache; 5xx or no answer is an error (the APIServices go `Stale`); any other answer without
/// the aggregated `Content-Type` (404, 406, plain JSON from a server that ignores `Accept`)
/// means a legacy server, asked per group-version.
async fn fetch_backend_discovery(
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
/// Service's aggregated document after applying the fetch (the cached one for a 304).
pub fn remote_discovery(
    fetch: Result<&BackendDiscovery, ()>,
    doc: Option<&APIGroupDiscoveryList>,
    gv: &GroupVersion,
    previous: Option<&RemoteDiscovery>,
) -> RemoteDiscovery {
    let failed = || RemoteDiscovery::failed(previous.and_then(|p| p.resources.clone()));
    match fetch {
        Ok(BackendDiscovery::NotModified | BackendDiscovery::Aggregated { .. }) => match doc {
            Some(doc) => RemoteDiscovery::from_backend_document(doc, &gv.group, &gv.version),
            None => failed(),
        },
        Ok(BackendDiscovery::Legacy(results)) => match results.get(gv) {
            Some(Ok(resources)) => RemoteDiscovery::current(resources.clone()),
            _ => failed(),
        },
        Err(()) => failed(),
    }
}

/// One backing Service and the remote APIServices pointing at it.
struct ServiceEntry {
    /// Sorted by name; what the last routing snapshot said.
    apiservices: Vec<(Arc<RegisteredAPIService>, Availability)>,
    /// The backend of the first APIService with a usable transport.
    backend: Option<Arc<RemoteBackend>>,
    etag: Option<String>,
    doc: Option<Arc<APIGroupDiscoveryList>>,
    openapi: RootDocument,
    /// The fetch under way: its number and how many of its two reports are still due.
    running: Option<(u64, u8)>,
    /// Something changed while a fetch was running: fetch again when it has reported.
    refetch: bool,
    last_error: Option<String>,
}

impl ServiceEntry {
    fn new() -> Self {
        Self {
            apiservices: Vec::new(),
            backend: None,
            etag: None,
            doc: None,
            openapi: RootDocument::default(),
            running: None,
            refetch: false,
            last_error: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The merge loop
// ---------------------------------------------------------------------------------------------

/// Builds and publishes the merged discovery and OpenAPI v3 snapshots; see the module docs.
pub struct DiscoveryController {
    cache: Arc<DiscoveryCache>,
    core: Arc<CoreBackend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    refresh_interval: Duration,
}

/// The loop's state, owned by the loop alone.
#[derive(Default)]
struct State {
    core: Option<Arc<CoreState>>,
    table: Option<Arc<Routes>>,
    /// The APIServices of the last merged table, to tell a real change from an availability flip.
    specs: Vec<Arc<RegisteredAPIService>>,
    services: HashMap<ServiceRef, ServiceEntry>,
    /// Per remote APIService name: what its backend last said.
    remote: HashMap<String, RemoteDiscovery>,
    discovery_dirty: bool,
    openapi_dirty: bool,
    /// Number of the last fetch started, so a report is matched to its fetch.
    last_job: u64,
}

impl DiscoveryController {
    pub fn new(
        cache: Arc<DiscoveryCache>,
        core: Arc<CoreBackend>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
        refresh_interval: Duration,
    ) -> Self {
        Self {
            cache,
            core,
            routing,
            metrics,
            refresh_interval,
        }
    }

    pub async fn run(self) {
        let (core_tx, mut core_rx) = watch::channel(None);
        tokio::spawn(
            CorePoller {
                source: Source::Core(self.core.clone()),
                url: self.core.url().to_owned(),
                legacy_refresh: self.refresh_interval,
                api: CoreDocument::new("/api"),
                apis: CoreDocument::new("/apis"),
                openapi: RootDocument::default(),
                openapi_state: CoreOpenApi::Unknown,
                last_error: None,
            }
            .run(core_tx),
        );
        let (results_tx, mut results_rx) = mpsc::unbounded_channel();
        let mut poll = tokio::time::interval(ROUTING_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh = tokio::time::interval(self.refresh_interval);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state = State::default();
        loop {
            tokio::select! {
                _ = poll.tick() => {
                    if self.routing.is_synced() {
                        let table = self.routing.load_full();
                        if !state.table.as_ref().is_some_and(|t| Arc::ptr_eq(t, &table)) {
                            self.reconcile(&mut state, table, &results_tx);
                        }
                    }
                }
                _ = refresh.tick() => {
                    let keys: Vec<ServiceRef> = state.services.keys().cloned().collect();
                    for key in keys {
                        spawn_fetch(&mut state, &key, &results_tx);
                    }
                }
                changed = core_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    state.core = core_rx.borrow_and_update().clone();
                    state.discovery_dirty = true;
                    state.openapi_dirty = true;
                }
                Some(fetched) = results_rx.recv() => {
                    apply(&mut state, fetched, &results_tx);
                }
            }
            publish(&self.cache, &self.metrics, &mut state);
        }
    }

    /// Takes in a new routing snapshot: which Services back which APIServices, and which of
    /// them must be fetched now (new, edited, or availability changed).
    fn reconcile(
        &self,
        state: &mut State,
        table: Arc<Routes>,
        results: &mpsc::UnboundedSender<ServiceFetched>,
    ) {
        let mut by_service: HashMap<ServiceRef, (Vec<_>, Option<Arc<RemoteBackend>>)> =
            HashMap::new();
        for route in table.routes() {
            let Some(svc) = route.api_service.service() else {
                continue;
            };
            let (apiservices, backend) = by_service.entry(svc.clone()).or_default();
            apiservices.push((route.api_service.clone(), route.available.clone()));
            if let (None, Target::Remote(b)) = (&backend, &route.backend.target) {
                *backend = Some(b.clone());
            }
        }
        state.services.retain(|key, _| by_service.contains_key(key));
        let mut dirty_services = Vec::new();
        for (key, (mut apiservices, backend)) in by_service {
            apiservices.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            let entry = state
                .services
                .entry(key.clone())
                .or_insert_with(ServiceEntry::new);
            let same_backend = match (&entry.backend, &backend) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if entry.apiservices != apiservices || !same_backend {
                entry.apiservices = apiservices;
                entry.backend = backend;
                dirty_services.push(key);
            }
        }
        // Forget APIServices that are gone or no longer remote; fill in new ones from a cached
        // aggregated document so they do not flap to `Stale` while their Service is refetched.
        let remote_names: HashSet<&str> = state
            .services
            .values()
            .flat_map(|e| e.apiservices.iter().map(|(a, _)| a.name.as_str()))
            .collect();
        state
            .remote
            .retain(|name, _| remote_names.contains(name.as_str()));
        for entry in state.services.values() {
            let Some(doc) = &entry.doc else { continue };
            for (api, _) in &entry.apiservices {
                if !state.remote.contains_key(&api.name) {
                    state.remote.insert(
                        api.name.clone(),
                        RemoteDiscovery::from_backend_document(doc, &api.group, &api.version),
                    );
                }
            }
        }
        let specs: Vec<Arc<RegisteredAPIService>> =
            table.routes().map(|r| r.api_service.clone()).collect();
        if specs != state.specs {
            state.specs = specs;
            state.discovery_dirty = true;
        }
        // OpenAPI owners hold backend handles, which a spec change replaces.
        state.openapi_dirty = true;
        state.table = Some(table);
        for key in dirty_services {
            spawn_fetch(state, &key, results);
        }
    }
}

/// Publishes new snapshots for whatever input changed since the last call. A merge that gives
/// the document already served is not a rebuild: the snapshot (and with it the ETag clients
/// revalidate against) stays, and `aggregator_discovery_aggregation_count_total` does not move.
fn publish(cache: &DiscoveryCache, metrics: &Metrics, state: &mut State) {
    let (Some(core), Some(table)) = (state.core.clone(), state.table.clone()) else {
        return;
    };
    if state.discovery_dirty {
        state.discovery_dirty = false;
        let apiservices: Vec<APIServiceDiscovery<'_>> = table
            .routes()
            .map(|r| {
                APIServiceDiscovery::new(&r.api_service, state.remote.get(&r.api_service.name))
            })
            .collect();
        match merge(&core.discovery, &apiservices) {
            Ok(merged) if cache.merged().is_some_and(|m| *m == merged) => {}
            Ok(merged) => {
                metrics
                    .discovery_aggregation_total
                    .with_label_values::<&str>(&[])
                    .inc();
                tracing::debug!(etag = %merged.apis.etag, "merged discovery rebuilt");
                cache.store_merged(merged);
            }
            Err(e) => tracing::error!(error = %e, "cannot build the merged discovery document"),
        }
    }
    if state.openapi_dirty {
        let core_root = match &core.openapi {
            CoreOpenApi::Unknown => return,
            CoreOpenApi::Absent => None,
            CoreOpenApi::Root(root) => Some(root),
        };
        state.openapi_dirty = false;
        let remotes: Vec<RemoteRoot<'_, OpenApiOwner>> = table
            .routes()
            .filter_map(|route| {
                let svc = route.api_service.service()?;
                let owner = match &route.backend.target {
                    Target::Remote(b) => OpenApiOwner::Remote(b.clone()),
                    // A claimed path without a usable backend: not listed, never the core's.
                    _ => OpenApiOwner::Core,
                };
                let root = match owner {
                    OpenApiOwner::Remote(_) => state
                        .services
                        .get(svc)
                        .and_then(|e| e.openapi.root.as_ref()),
                    OpenApiOwner::Core => None,
                };
                Some(RemoteRoot {
                    owner,
                    key: root_key(&route.api_service.group_version()),
                    name: route.api_service.name.as_str(),
                    group_priority_minimum: route.api_service.group_priority_minimum,
                    version_priority: route.api_service.version_priority,
                    root,
                })
            })
            .collect();
        match merge_openapi_roots(&openapi_inputs(OpenApiOwner::Core, core_root, remotes)) {
            Ok(root) => cache.store_openapi(root),
            Err(e) => tracing::error!(error = %e, "cannot build the OpenAPI v3 root"),
        }
    }
}

/// Starts a fetch of one Service unless one is running (then it is repeated when that reports).
fn spawn_fetch(
    state: &mut State,
    key: &ServiceRef,
    results: &mpsc::UnboundedSender<ServiceFetched>,
) {
    let Some(entry) = state.services.get_mut(key) else {
        return;
    };
    if entry.running.is_some() {
        entry.refetch = true;
        return;
    }
    let Some(job) = FetchJob::for_entry(key, state.last_job + 1, entry) else {
        return;
    };
    state.last_job = job.job;
    entry.running = Some((job.job, 2));
    entry.refetch = false;
    tokio::spawn(job.run(results.clone()));
}

/// Takes in one report of a fetch: updates the Service's cache and its APIServices' entries,
/// and starts the fetch a change asked for meanwhile once both reports are in.
fn apply(
    state: &mut State,
    fetched: ServiceFetched,
    results: &mpsc::UnboundedSender<ServiceFetched>,
) {
    let Some(entry) = state.services.get_mut(&fetched.key) else {
        return; // the Service is no longer used
    };
    // A report of a fetch started before the Service was dropped and added again.
    let Some((job, due)) = entry.running.as_mut() else {
        return;
    };
    if *job != fetched.job {
        return;
    }
    *due -= 1;
    if *due == 0 {
        entry.running = None;
    }
    let name = entry
        .backend
        .as_ref()
        .map_or_else(|| fetched.key.to_string(), |b| b.name.to_string());

    match fetched.report {
        ServiceReport::Discovery(mut discovery) => {
            match &discovery {
                Ok(BackendDiscovery::Aggregated { doc, etag }) => {
                    entry.doc = Some(doc.clone());
                    entry.etag = etag.clone();
                }
                Ok(BackendDiscovery::Legacy(_)) => {
                    entry.doc = None;
                    entry.etag = None;
                }
                Ok(BackendDiscovery::NotModified) | Err(_) => {}
            }
            if matches!(discovery, Ok(BackendDiscovery::NotModified)) && entry.doc.is_none() {
                discovery = Err(FetchError::UnexpectedNotModified {
                    path: "/apis".into(),
                });
            }
            let error = discovery.as_ref().err().map(|e| e.to_string());
            if error != entry.last_error {
                match &error {
                    Some(e) => {
                        tracing::warn!(service = %fetched.key, apiservice = %name, error = %e,
                        "cannot fetch discovery from the backend; its group-versions are served as Stale")
                    }
                    None => {
                        tracing::info!(service = %fetched.key, apiservice = %name, "backend discovery fetched")
                    }
                }
                entry.last_error = error;
            }
            let doc = entry.doc.clone();
            for (api, _) in &entry.apiservices {
                let next = remote_discovery(
                    discovery.as_ref().map_err(|_| ()),
                    doc.as_deref(),
                    &api.group_version(),
                    state.remote.get(&api.name),
                );
                if state.remote.get(&api.name) != Some(&next) {
                    state.remote.insert(api.name.clone(), next);
                    state.discovery_dirty = true;
                }
            }
        }
        ServiceReport::OpenApi(Ok(RootFetch::NotModified)) => {}
        ServiceReport::OpenApi(Ok(RootFetch::Root(root, etag))) => {
            if entry.openapi.root.as_ref() != Some(&root) {
                state.openapi_dirty = true;
            }
            entry.openapi = RootDocument {
                etag,
                root: Some(root),
            };
        }
        ServiceReport::OpenApi(Ok(RootFetch::Absent)) => {
            if entry.openapi.root.is_some() || entry.openapi.etag.is_none() {
                tracing::info!(service = %fetched.key, apiservice = %name,
                    "backend has no /openapi/v3; it contributes no OpenAPI v3 paths");
            }
            if entry.openapi.root.is_some() {
                state.openapi_dirty = true;
            }
            // The empty ETag marks "absent already logged" without a root to revalidate.
            entry.openapi = RootDocument {
                etag: Some(String::new()),
                root: None,
            };
        }
        ServiceReport::OpenApi(Err(e)) => {
            tracing::debug!(service = %fetched.key, apiservice = %name, error = %e,
                "cannot fetch the backend's OpenAPI v3 root; keeping the last one");
        }
    }

    if entry.running.is_none() && entry.refetch {
        let key = fetched.key.clone();
        spawn_fetch(state, &key, results);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(v: &'static str) -> HeaderValue {
        HeaderValue::from_static(v)
    }

    #[test]
    fn aggregated_content_type_follows_client_go() {
        for yes in [
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            // any order, spaces, extra parameters, case-insensitive names and media type
            "application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io",
            "Application/JSON;G=apidiscovery.k8s.io;V=v2;AS=APIGroupDiscoveryList;charset=utf-8",
            "application/json;g=\"apidiscovery.k8s.io\";v=v2;as=APIGroupDiscoveryList",
        ] {
            assert!(is_aggregated_content_type(Some(&ct(yes))), "{yes}");
        }
        for no in [
            "application/json",
            "application/json; charset=utf-8",
            "application/json;g=apidiscovery.k8s.io;v=v1;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2",
            "application/json;g=other.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=apigroupdiscoverylist",
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "text/plain",
            "",
        ] {
            assert!(!is_aggregated_content_type(Some(&ct(no))), "{no}");
        }
        assert!(!is_aggregated_content_type(None));
    }

    fn resources(names: &[&str]) -> Vec<APIResourceDiscovery> {
        names
            .iter()
            .map(|n| APIResourceDiscovery {
                resource: Some((*n).to_owned()),
                ..Default::default()
            })
            .collect()
    }

    fn doc(json: serde_json::Value) -> APIGroupDiscoveryList {
        serde_json::from_value(json).unwrap()
    }

    fn wardle_doc() -> APIGroupDiscoveryList {
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
        let next = remote_discovery(Ok(&fetch), Some(&d), &gv, None);
        assert!(next.fresh);
        assert_eq!(next.resources.as_ref().map(Vec::len), Some(1));
        // A 304 reuses the cached document.
        let again = remote_discovery(
            Ok(&BackendDiscovery::NotModified),
            Some(&d),
            &gv,
            Some(&next),
        );
        assert_eq!(again, next);
        // A group-version the backend does not list: an empty but current entry.
        let other = GroupVersion::new("wardle.example.com", "v1beta1");
        assert_eq!(
            remote_discovery(Ok(&fetch), Some(&d), &other, None),
            RemoteDiscovery::not_listed()
        );
    }

    #[test]
    fn failures_keep_the_last_resources_as_stale() {
        let gv = GroupVersion::new("wardle.example.com", "v1alpha1");
        let before = RemoteDiscovery::current(resources(&["flunders", "fischers"]));
        let after = remote_discovery(Err(()), None, &gv, Some(&before));
        assert!(!after.fresh);
        assert_eq!(after.resources, before.resources);
        // Never fetched successfully: a version-only stale entry.
        let never = remote_discovery(Err(()), None, &gv, None);
        assert_eq!(never, RemoteDiscovery::failed(None));
        // And back to current on the next success.
        let d = wardle_doc();
        let fetch = BackendDiscovery::Aggregated {
            doc: Arc::new(d.clone()),
            etag: None,
        };
        assert!(remote_discovery(Ok(&fetch), Some(&d), &gv, Some(&after)).fresh);
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
        let a = remote_discovery(Ok(&fetch), None, &ok, None);
        assert!(a.fresh);
        let previous = RemoteDiscovery::current(resources(&["fischers"]));
        let b = remote_discovery(Ok(&fetch), None, &bad, Some(&previous));
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

    // ---- the merge loop's bookkeeping ---------------------------------------------------------

    use apiservice::model::{Backend, RemoteBackendSpec};
    use apiservice::resolve::{Endpoint, ResolveError, ServiceResolver};
    use apiservice::route::RouteTable;

    /// Every Service resolves to one fixed address.
    struct FixedAddress(std::net::SocketAddr);

    impl ServiceResolver for FixedAddress {
        fn resolve(&self, _: &ServiceRef) -> Result<Endpoint, ResolveError> {
            Ok(Endpoint::new(self.0.ip().to_string(), self.0.port()))
        }
    }

    fn wardle_service() -> ServiceRef {
        ServiceRef {
            namespace: "wardle".into(),
            name: "api".into(),
            port: 443,
        }
    }

    fn wardle_apiservice(version: &str) -> Arc<RegisteredAPIService> {
        Arc::new(RegisteredAPIService {
            name: format!("{version}.wardle.example.com"),
            group: "wardle.example.com".into(),
            version: version.into(),
            group_priority_minimum: 1000,
            version_priority: 15,
            backend: Backend::Remote(RemoteBackendSpec {
                service: wardle_service(),
                ca_bundle: None,
                insecure_skip_tls_verify: true,
            }),
        })
    }

    fn backend_at(addr: std::net::SocketAddr) -> Arc<RemoteBackend> {
        let api = wardle_apiservice("v1alpha1");
        let Backend::Remote(spec) = &api.backend else {
            unreachable!("wardle_apiservice is remote")
        };
        let (_, drain) = watch::channel(false);
        Arc::new(RemoteBackend::new(&api, spec, None, Arc::new(FixedAddress(addr)), drain).unwrap())
    }

    /// The wardle Service with `api` pointing at it, its backend at `addr`.
    fn state_with_wardle(api: &Arc<RegisteredAPIService>, addr: std::net::SocketAddr) -> State {
        let mut entry = ServiceEntry::new();
        entry.apiservices = vec![(api.clone(), Availability::Available)];
        entry.backend = Some(backend_at(addr));
        let mut state = State::default();
        state.services.insert(wardle_service(), entry);
        state
    }

    fn report(job: u64, report: ServiceReport) -> ServiceFetched {
        ServiceFetched {
            key: wardle_service(),
            job,
            report,
        }
    }

    fn core_with_groups(groups: &[&str]) -> Arc<CoreState> {
        let items: Vec<serde_json::Value> = groups
            .iter()
            .map(|g| {
                serde_json::json!({
                    "metadata": {"name": g},
                    "versions": [{"version": "v1", "freshness": "Current", "resources": [
                        {"resource": "things", "responseKind": {"group": "", "version": "", "kind": "Thing"},
                         "scope": "Namespaced", "singularResource": "thing", "verbs": ["get"]}
                    ]}]
                })
            })
            .collect();
        Arc::new(CoreState {
            discovery: CoreDiscovery {
                api: APIGroupDiscoveryList::default(),
                apis: doc(serde_json::json!({
                    "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                    "metadata": {}, "items": items
                })),
            },
            openapi: CoreOpenApi::Unknown,
        })
    }

    #[test]
    fn only_a_changed_document_counts_as_a_rebuild() {
        let cache = DiscoveryCache::new(Routing::new());
        let metrics = Metrics::new();
        let rebuilds = || {
            metrics
                .discovery_aggregation_total
                .with_label_values::<&str>(&[])
                .get()
        };
        let mut state = State {
            core: Some(core_with_groups(&["apps"])),
            table: Some(Arc::new(RouteTable::empty())),
            discovery_dirty: true,
            ..State::default()
        };
        publish(&cache, &metrics, &mut state);
        assert_eq!(rebuilds(), 1);
        let first = cache.merged().unwrap();

        // The core sent a new document that says the same: the served snapshot stays.
        state.core = Some(core_with_groups(&["apps"]));
        state.discovery_dirty = true;
        publish(&cache, &metrics, &mut state);
        assert_eq!(rebuilds(), 1);
        assert!(Arc::ptr_eq(&first, &cache.merged().unwrap()));

        state.core = Some(core_with_groups(&["apps", "batch"]));
        state.discovery_dirty = true;
        publish(&cache, &metrics, &mut state);
        assert_eq!(rebuilds(), 2);
        assert_ne!(cache.merged().unwrap().apis.etag, first.apis.etag);
    }

    #[test]
    fn a_backend_answering_304_changes_nothing() {
        let api = wardle_apiservice("v1alpha1");
        // Nothing listens there: no request is made in this test.
        let mut state = state_with_wardle(&api, "127.0.0.1:9".parse().unwrap());
        let cached = Arc::new(wardle_doc());
        let entry = state.services.get_mut(&wardle_service()).unwrap();
        entry.doc = Some(cached.clone());
        entry.etag = Some("\"E1\"".into());
        entry.running = Some((7, 2));
        let known =
            RemoteDiscovery::from_backend_document(&cached, "wardle.example.com", "v1alpha1");
        state.remote.insert(api.name.clone(), known.clone());

        // The next fetch revalidates what is cached.
        let job = FetchJob::for_entry(&wardle_service(), 8, entry).unwrap();
        assert_eq!(job.etag.as_deref(), Some("\"E1\""));

        let (tx, _rx) = mpsc::unbounded_channel();
        // A late report of an earlier fetch is not taken for this one.
        let other = BackendDiscovery::Aggregated {
            doc: Arc::new(APIGroupDiscoveryList::default()),
            etag: Some("\"OLD\"".into()),
        };
        apply(
            &mut state,
            report(6, ServiceReport::Discovery(Ok(other))),
            &tx,
        );
        apply(
            &mut state,
            report(
                7,
                ServiceReport::Discovery(Ok(BackendDiscovery::NotModified)),
            ),
            &tx,
        );
        apply(
            &mut state,
            report(7, ServiceReport::OpenApi(Ok(RootFetch::NotModified))),
            &tx,
        );
        assert!(!state.discovery_dirty, "a 304 must not rebuild discovery");
        assert!(!state.openapi_dirty);
        assert_eq!(state.remote[&api.name], known);
        let entry = &state.services[&wardle_service()];
        assert!(entry.doc.as_ref().is_some_and(|d| Arc::ptr_eq(d, &cached)));
        assert_eq!(entry.etag.as_deref(), Some("\"E1\""));
        assert!(entry.running.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_backend_is_stale_after_the_discovery_timeout() {
        // The kernel accepts the connection; nobody ever answers the TLS handshake.
        let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api = wardle_apiservice("v1alpha1");
        let mut state = state_with_wardle(&api, hanging.local_addr().unwrap());
        let known = RemoteDiscovery::current(resources(&["flunders", "fischers"]));
        state.remote.insert(api.name.clone(), known.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let started = tokio::time::Instant::now();
        spawn_fetch(&mut state, &wardle_service(), &tx);

        let mut reports = 0;
        while state.services[&wardle_service()].running.is_some() {
            let fetched = rx.recv().await.unwrap();
            reports += 1;
            if let ServiceReport::Discovery(result) = &fetched.report {
                assert!(result.is_err());
                let waited = started.elapsed();
                assert!(
                    waited >= DISCOVERY_TIMEOUT
                        && waited < DISCOVERY_TIMEOUT + Duration::from_secs(1),
                    "discovery failed after {waited:?}"
                );
                apply(&mut state, fetched, &tx);
                assert_eq!(
                    state.remote[&api.name],
                    RemoteDiscovery::failed(known.resources.clone())
                );
                assert!(state.discovery_dirty);
            } else {
                apply(&mut state, fetched, &tx);
            }
        }
        assert_eq!(reports, 2);
    }
}
