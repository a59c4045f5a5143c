//! The discovery controller: keeps what the core server and every remote backend say about their
//! APIs, and publishes a new merged snapshot whenever one of those inputs changes.
//!
//! One loop, one [`WorkQueue`] (kube-aggregator's `handler_discovery.go` runs one queue of
//! APIService names; ours is keyed by what is fetched):
//! * [`Key::Core`]: the core server's `/api` and `/apis` ([`super::core`]), and
//!   [`Key::CoreOpenApi`], its `/openapi/v3` root, apart so a slow root never delays a new CRD
//!   group; both revalidated (cheap: `If-None-Match` → 304) on every event of the core watchers
//!   ([`super::core_watch`]), after every write to CRDs or APIServices passing through the gateway,
//!   and every [`CORE_RESYNC`]; a core whose CRDs or APIServices cannot be watched (one refused
//!   is enough) is polled every [`CORE_POLL`] instead. Retried sooner while it fails.
//! * [`Key::Discovery`] and [`Key::OpenApi`] per backing Service ([`super::backends`]): added when
//!   one of the Service's APIServices changed (added, edited, availability flipped), resynced
//!   every refresh interval, retried with kube-aggregator's backoff (500 ms → 1 min) while they
//!   fail. The OpenAPI root has its own key so a slow root never holds back discovery going
//!   `Stale`.
//! * the routing snapshot arrives on the route controller's `watch` channel; a new one is
//!   compared per Service, so an availability flip of one APIService refetches one Service.
//!
//! Fetches run concurrently, one per key at a time, so a backend that hangs for its whole
//! timeout never delays another backend or a routing change. All JSON work (parsing, merging,
//! serialising) happens here, once per change; handlers only serve the bytes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::{merge, merge_openapi_roots, APIServiceDiscovery, RemoteDiscovery};
use apiservice::model::{RegisteredAPIService, ServiceRef};
use futures::FutureExt;
use tracing::Instrument;

use super::backends::{
    remote_discovery, seen_through_availability, BackendDiscovery, RemoteOpenApi, ServiceEntry,
};
use super::core::{CoreDocuments, CoreState, Refreshed};
use super::core_watch::{unlisted, CoreWatchers, FollowUps, ListingRetry};
use super::fetch::{fetch_root, FetchError, RootDocument, RootFetch, Source};
use super::openapi::{openapi_inputs, root_key, RemoteRoot};
use super::openapi_converted::{ConvertedSpecs, V2Fetch};
use super::readiness::DiscoveryReadiness;
use super::{DiscoveryCache, OpenApiOwner};
use crate::backend::core::CoreBackend;
use crate::backend::kube_client;
use crate::backend::remote::RemoteBackend;
use crate::control::apiservices::{Routes, Routing, Target};
use crate::health_check::Check;
use crate::metrics::Metrics;
use crate::workqueue::{Backoff, Next, Queue, WorkQueue};

/// How often the core's documents are revalidated while its CRDs or its APIServices cannot be
/// watched (cheap: `If-None-Match` → 304).
pub const CORE_POLL: Duration = Duration::from_secs(1);
/// How often they are revalidated while the watchers report changes.
pub const CORE_RESYNC: Duration = Duration::from_secs(30);
/// Longest wait between retries of a failing core fetch.
const CORE_RETRY_MAX: Duration = Duration::from_secs(5);

/// What the loop fetches, one at a time per key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The core server's discovery documents.
    Core,
    /// The core server's OpenAPI v3 root.
    CoreOpenApi,
    /// One backing Service's discovery (`/apis`, or per group-version).
    Discovery(ServiceRef),
    /// One backing Service's OpenAPI v3 root.
    OpenApi(ServiceRef),
}

// === impl Key ===

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Core => f.write_str("core"),
            Key::CoreOpenApi => f.write_str("openapi/core"),
            Key::Discovery(svc) => write!(f, "discovery/{svc}"),
            Key::OpenApi(svc) => write!(f, "openapi/{svc}"),
        }
    }
}

/// What one fetch brought back.
pub enum Outcome {
    /// The core's documents travel with their refresh, so the loop owns them between runs.
    Core(Box<CoreDocuments>, Refreshed),
    CoreOpenApi(Result<RootFetch, FetchError>),
    Discovery(Result<BackendDiscovery, FetchError>),
    OpenApi(Result<RemoteOpenApi, FetchError>),
}

/// kube-aggregator's discovery backoff for backends (500 ms → 1 min); the core is retried
/// within its own refresh interval, since everything else waits for it.
fn backoff(key: &Key) -> Backoff {
    let min = Duration::from_millis(500);
    match key {
        Key::Core | Key::CoreOpenApi => Backoff {
            min,
            max: CORE_RETRY_MAX,
        },
        Key::Discovery(_) | Key::OpenApi(_) => Backoff {
            min,
            max: Duration::from_secs(60),
        },
    }
}

/// Builds and publishes the merged discovery and OpenAPI v3 snapshots; see the module docs.
pub struct DiscoveryController {
    cache: Arc<DiscoveryCache>,
    core: Arc<CoreBackend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    refresh_interval: Duration,
    /// The `/readyz` check of the first discovery round ([`super::readiness`]).
    ready: Arc<Check>,
}

/// The loop's state, owned by the loop alone.
#[derive(Default)]
struct State {
    /// The core's documents; `None` while their refresh runs.
    core_documents: Option<Box<CoreDocuments>>,
    core: Option<Arc<CoreState>>,
    /// The core's OpenAPI v3 root as last fetched (also in `core` once discovery is known).
    core_openapi: RootDocument,
    /// Where the core's OpenAPI root is fetched from.
    core_source: Option<Source>,
    table: Option<Arc<Routes>>,
    /// The APIServices of the last merged table, to tell a real change from an availability flip.
    specs: Vec<Arc<RegisteredAPIService>>,
    services: HashMap<ServiceRef, ServiceEntry>,
    /// Per remote APIService name: what its backend last said.
    remote: HashMap<String, RemoteDiscovery>,
    discovery_dirty: bool,
    openapi_dirty: bool,
    /// Served group-versions of the core's established CRDs, as its watcher last said.
    established: Arc<BTreeSet<String>>,
    /// Group-versions of the local APIServices of the last table: the core registers one
    /// before its discovery lists the group-version (a new CRD's), and the merge leaves such a
    /// group-version out until it does.
    local: BTreeSet<String>,
    /// Early re-fetches while one of `established` is not in the core's documents yet.
    listing: ListingRetry,
    /// Whether an established CRD may be missing from the published documents (see
    /// `DiscoveryCache::listing_pending`).
    listing_pending: bool,
}

// === impl DiscoveryController ===

impl DiscoveryController {
    pub fn new(
        cache: Arc<DiscoveryCache>,
        core: Arc<CoreBackend>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
        refresh_interval: Duration,
        ready: Arc<Check>,
    ) -> Self {
        Self {
            cache,
            core,
            routing,
            metrics,
            refresh_interval,
            ready,
        }
    }

    pub async fn run(self) {
        let mut routes = self.routing.subscribe();
        let (mut watchers, mut signals) = CoreWatchers::new(kube_client::client(self.core.clone()));
        let mut queue = WorkQueue::new(backoff);
        let mut state = State {
            core_documents: Some(Box::new(CoreDocuments::new(
                Source::Core(self.core.clone()),
                self.refresh_interval,
            ))),
            core_source: Some(Source::Core(self.core.clone())),
            ..State::default()
        };
        let mut readiness = DiscoveryReadiness::new(self.ready.clone());
        let mut openapi_followups = FollowUps::default();
        revalidate_core(queue.queue());
        if let Some(table) = routes.borrow_and_update().clone() {
            reconcile(&mut state, table, &mut queue);
            readiness.routes_known(fetchable(&state));
        }
        loop {
            let mut fetched = None;
            let deadline = readiness.deadline();
            tokio::select! {
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(table) = routes.borrow_and_update().clone() {
                        reconcile(&mut state, table, &mut queue);
                        readiness.routes_known(fetchable(&state));
                    }
                }
                () = sleep_until_some(deadline), if deadline.is_some() => readiness.bound_passed(),
                Ok(()) = signals.changed() => {
                    let established = signals.borrow_and_update().established.clone();
                    if established != state.established {
                        // Until the next fetch of the core's documents says otherwise, a new
                        // group-version may be missing from them.
                        state.listing_pending |= !established.is_subset(&state.established);
                        state.established = established;
                        state.listing.reset();
                    }
                    core_changed(&self.cache, queue.queue(), &mut openapi_followups);
                }
                () = self.cache.core_written.notified() => {
                    core_changed(&self.cache, queue.queue(), &mut openapi_followups);
                }
                () = openapi_followups.next() => queue.queue().add(Key::CoreOpenApi),
                next = queue.next() => match next {
                    Next::Ready(key) => start(&mut state, &mut queue, key),
                    Next::Done(key, outcome) => {
                        let ok = finish(&mut state, &key, outcome);
                        match &key {
                            Key::Core => after_core_fetch(&mut state, &mut watchers, queue.queue()),
                            Key::Discovery(svc) => fetched = Some(svc.clone()),
                            Key::CoreOpenApi | Key::OpenApi(_) => {}
                        }
                        match ok {
                            Some(true) => {
                                let interval = match key {
                                    Key::Core | Key::CoreOpenApi if watchers.watching() => CORE_RESYNC,
                                    Key::Core | Key::CoreOpenApi => CORE_POLL,
                                    Key::Discovery(_) | Key::OpenApi(_) => self.refresh_interval,
                                };
                                queue.resync(key.clone(), Some(interval))
                            }
                            Some(false) => {
                                queue.retry(key);
                            }
                            None => queue.forget(&key),
                        }
                    }
                },
            }
            publish(&self.cache, &self.metrics, &mut state);
            self.cache.listing_pending.send_if_modified(|p| {
                std::mem::replace(p, state.listing_pending) != state.listing_pending
            });
            // After publishing: a ready replica serves what it fetched.
            if let Some(svc) = fetched {
                readiness.fetched(&svc);
            }
        }
    }
}

/// The core's CRDs or APIServices changed (a watch event, or a write through the gateway): its
/// documents are revalidated now, its OpenAPI v3 root again over the next two seconds (the
/// core publishes a CRD's schema a moment after storing it), and the `/openapi/v2` loop is told.
fn core_changed(cache: &DiscoveryCache, queue: &Queue<Key>, openapi: &mut FollowUps) {
    revalidate_core(queue);
    openapi.start(tokio::time::Instant::now());
    cache.core_changed.send_modify(|n| *n = n.wrapping_add(1));
}

/// Marks the core's documents (discovery and OpenAPI root) for revalidation now.
fn revalidate_core(queue: &Queue<Key>) {
    queue.add(Key::Core);
    queue.add(Key::CoreOpenApi);
}

/// After a fetch of the core's documents: starts the watchers the core turned out to serve, and
/// fetches again soon while an established CRD is missing from them.
fn after_core_fetch(state: &mut State, watchers: &mut CoreWatchers, queue: &Queue<Key>) {
    let Some(core) = &state.core else { return };
    watchers.start_served(&core.discovery);
    let expected: BTreeSet<String> = state.established.union(&state.local).cloned().collect();
    let missing = unlisted(&expected, &core.discovery);
    let retry = state.listing.next(&missing);
    state.listing_pending = retry.is_some();
    if let Some(delay) = retry {
        tracing::debug!(group_versions = ?missing, ?delay,
            "an established CustomResourceDefinition is not in the core's discovery yet");
        queue.add_after(Key::Core, delay);
    }
}

/// The Services whose discovery can be fetched: those of remote APIServices with a backend.
fn fetchable(state: &State) -> Vec<ServiceRef> {
    state
        .services
        .iter()
        .filter(|(_, entry)| entry.backend.is_some())
        .map(|(svc, _)| svc.clone())
        .collect()
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Starts the fetch `key` stands for, if it still means something.
fn start(state: &mut State, queue: &mut WorkQueue<Key, Outcome>, key: Key) {
    let span = tracing::info_span!("discovery_fetch", key = %key);
    match &key {
        Key::Core => {
            let Some(mut documents) = state.core_documents.take() else {
                return;
            };
            let fetch = async move {
                let refreshed = documents.refresh().await;
                Outcome::Core(documents, refreshed)
            };
            queue.start(key, fetch.instrument(span));
        }
        Key::CoreOpenApi => {
            let Some(source) = state.core_source.clone() else {
                return;
            };
            let etag = state.core_openapi.etag().map(str::to_owned);
            let fetch = async move { fetch_root(&source, etag.as_deref()).await };
            queue.start(key, fetch.map(Outcome::CoreOpenApi).instrument(span));
        }
        Key::Discovery(svc) => {
            let fetch = state
                .services
                .get(svc)
                .and_then(ServiceEntry::discovery_fetch);
            match fetch {
                Some(fetch) => queue.start(key, fetch.map(Outcome::Discovery).instrument(span)),
                None => queue.forget(&key),
            }
        }
        Key::OpenApi(svc) => {
            let fetch = state
                .services
                .get(svc)
                .and_then(ServiceEntry::openapi_fetch);
            match fetch {
                Some(fetch) => queue.start(key, fetch.map(Outcome::OpenApi).instrument(span)),
                None => queue.forget(&key),
            }
        }
    }
}

/// Takes in one finished fetch. `Some(true)` when it succeeded (resync later), `Some(false)`
/// when it failed (retry with backoff), `None` when its Service is gone meanwhile.
fn finish(state: &mut State, key: &Key, outcome: Outcome) -> Option<bool> {
    match (key, outcome) {
        (Key::Core, Outcome::Core(documents, refreshed)) => {
            if refreshed.changed {
                if let Some(discovery) = documents.discovery() {
                    state.core = Some(Arc::new(CoreState {
                        discovery,
                        openapi: state.core_openapi.clone(),
                    }));
                    state.discovery_dirty = true;
                    state.openapi_dirty = true;
                }
            }
            let ok = refreshed.complete && state.core.is_some();
            state.core_documents = Some(documents);
            Some(ok)
        }
        (Key::CoreOpenApi, Outcome::CoreOpenApi(result)) => apply_core_openapi(state, result),
        (Key::Discovery(svc), Outcome::Discovery(result)) => apply_discovery(state, svc, result),
        (Key::OpenApi(svc), Outcome::OpenApi(result)) => apply_openapi(state, svc, result),
        (key, _) => {
            tracing::error!(%key, "a fetch reported for another kind of key; ignored");
            None
        }
    }
}

/// Takes in a new routing snapshot: which Services back which APIServices, and which of
/// them must be fetched now (new, edited, or availability changed).
fn reconcile(state: &mut State, table: Arc<Routes>, queue: &mut WorkQueue<Key, Outcome>) {
    let mut by_service: HashMap<ServiceRef, (Vec<_>, Option<Arc<RemoteBackend>>)> = HashMap::new();
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
    state.services.retain(|key, _| {
        let used = by_service.contains_key(key);
        if !used {
            queue.forget(&Key::Discovery(key.clone()));
            queue.forget(&Key::OpenApi(key.clone()));
        }
        used
    });
    let mut dirty_services = Vec::new();
    for (key, (mut apiservices, backend)) in by_service {
        apiservices.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let entry = state.services.entry(key.clone()).or_default();
        let same_backend = match (&entry.backend, &backend) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if let Some(backend) = &backend {
            // A connection of the Service failing (closed, reset, a PING unanswered) fetches
            // its discovery at once: a dead backend goes `Stale` without waiting for its
            // availability check to fail first.
            let (queue, key) = (queue.queue().clone(), Key::Discovery(key.clone()));
            backend
                .connections()
                .failures()
                .listen("discovery", Arc::new(move || queue.add(key.clone())));
        }
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
    let local: BTreeSet<String> = specs
        .iter()
        // The legacy core group (`v1.`) is in `/api`, which this does not follow.
        .filter(|a| a.is_local() && !a.is_legacy_core())
        .map(|a| a.group_version().to_string())
        .collect();
    if !local.is_subset(&state.local) {
        // Until the core's documents say otherwise, a new local group-version may be missing
        // from them: fetch them now, and again shortly while it is (`ListingRetry`).
        state.listing_pending = true;
        state.listing.reset();
        queue.queue().add(Key::Core);
    }
    state.local = local;
    if specs != state.specs {
        state.specs = specs;
        state.discovery_dirty = true;
    }
    // OpenAPI owners hold backend handles, which a spec change replaces.
    state.openapi_dirty = true;
    state.table = Some(table);
    // An availability check that failed turns the APIService `Stale` now, not after the fetch
    // below, which a backend slow to answer may take its whole timeout over.
    for entry in state.services.values() {
        for (api, availability) in &entry.apiservices {
            let Some(current) = state.remote.get(&api.name) else {
                continue;
            };
            let next = seen_through_availability(current.clone(), availability);
            if &next != current {
                state.remote.insert(api.name.clone(), next);
                state.discovery_dirty = true;
            }
        }
    }
    for key in dirty_services {
        queue.queue().add(Key::Discovery(key.clone()));
        queue.queue().add(Key::OpenApi(key));
    }
}

/// The name logs use for a Service's fetches: its first APIService's backend, or the Service.
fn backend_name(entry: &ServiceEntry, svc: &ServiceRef) -> String {
    entry
        .backend
        .as_ref()
        .map_or_else(|| svc.to_string(), |b| b.name.to_string())
}

/// Takes in one discovery fetch of `svc`: updates its cache and its APIServices' entries.
fn apply_discovery(
    state: &mut State,
    svc: &ServiceRef,
    mut discovery: Result<BackendDiscovery, FetchError>,
) -> Option<bool> {
    let entry = state.services.get_mut(svc)?;
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
        let apiservice = backend_name(entry, svc);
        match &error {
            Some(e) => {
                tracing::warn!(%apiservice, error = %e,
                    "cannot fetch discovery from the backend; its group-versions are served as Stale")
            }
            None => tracing::info!(%apiservice, "backend discovery fetched"),
        }
        entry.last_error = error;
    }
    let doc = entry.doc.clone();
    for (api, availability) in &entry.apiservices {
        let fetched = remote_discovery(
            discovery.as_ref().ok(),
            doc.as_deref(),
            &api.group_version(),
            state.remote.get(&api.name),
        );
        let next = seen_through_availability(fetched, availability);
        if state.remote.get(&api.name) != Some(&next) {
            state.remote.insert(api.name.clone(), next);
            state.discovery_dirty = true;
        }
    }
    Some(discovery.is_ok())
}

/// Takes in one fetch of the core's OpenAPI v3 root.
fn apply_core_openapi(state: &mut State, fetch: Result<RootFetch, FetchError>) -> Option<bool> {
    match fetch {
        Ok(fetch) => {
            let absent = matches!(fetch, RootFetch::Absent);
            if state.core_openapi.apply(fetch) {
                if absent {
                    tracing::info!("the core server has no /openapi/v3; the gateway serves the remote backends' paths only");
                }
                if let Some(core) = &state.core {
                    state.core = Some(Arc::new(CoreState {
                        discovery: core.discovery.clone(),
                        openapi: state.core_openapi.clone(),
                    }));
                }
                state.openapi_dirty = true;
            }
            Some(true)
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot fetch the core's OpenAPI v3 root; keeping the last one");
            Some(false)
        }
    }
}

/// Takes in one OpenAPI fetch of `svc`: its v3 root, or the v2 spec converted in its place.
fn apply_openapi(
    state: &mut State,
    svc: &ServiceRef,
    fetch: Result<RemoteOpenApi, FetchError>,
) -> Option<bool> {
    let entry = state.services.get_mut(svc)?;
    if fetch.is_ok() && entry.openapi_error.take().is_some() {
        tracing::info!(apiservice = %backend_name(entry, svc),
            "the backend's OpenAPI documents are usable again");
    }
    match fetch {
        Ok(RemoteOpenApi { root, converted }) => {
            let absent = matches!(root, RootFetch::Absent);
            let had_root = entry.openapi.root().is_some();
            if entry.openapi.apply(root) {
                state.openapi_dirty |= had_root || !absent;
                if absent && matches!(converted, Some(V2Fetch::Absent)) {
                    tracing::info!(apiservice = %backend_name(entry, svc),
                        "backend has no /openapi/v3 and no /openapi/v2; it contributes no OpenAPI v3 paths");
                }
            }
            let next = match converted {
                Some(V2Fetch::NotModified) => None,
                Some(V2Fetch::Converted(specs)) => Some(specs),
                // A v3 root, or neither v3 nor v2: nothing converted to serve.
                Some(V2Fetch::Absent) | None => Some(ConvertedSpecs::default()),
            };
            if let Some(next) = next.filter(|next| *next != entry.converted) {
                let apiservice = backend_name(entry, svc);
                match (
                    entry.converted.documents.is_empty(),
                    next.documents.is_empty(),
                ) {
                    (true, false) => tracing::info!(%apiservice,
                        "backend has no /openapi/v3; serving its /openapi/v2 converted to v3"),
                    (false, true) => tracing::info!(%apiservice,
                        "no longer serving a converted OpenAPI v3 document for the backend"),
                    _ => tracing::debug!(%apiservice, "converted OpenAPI v3 documents updated"),
                }
                entry.converted = next;
                state.openapi_dirty = true;
            }
            Some(true)
        }
        // A document the backend sent that cannot be used is the backend's to fix: said once.
        Err(e) if e.is_bad_document() => {
            let why = e.to_string();
            if entry.openapi_error.as_deref() != Some(&why) {
                tracing::warn!(apiservice = %backend_name(entry, svc), error = %why,
                    "the backend's OpenAPI document cannot be used; keeping the last documents");
                entry.openapi_error = Some(why);
            }
            Some(false)
        }
        Err(e) => {
            tracing::debug!(apiservice = %backend_name(entry, svc), error = %e,
                "cannot fetch the backend's OpenAPI; keeping the last documents");
            Some(false)
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
            RootDocument::Unknown => return,
            RootDocument::Absent => None,
            RootDocument::Root { root, .. } => Some(root),
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
                let key = root_key(&route.api_service.group_version());
                let entry = state.services.get(svc);
                let (owner, root) = match (owner, entry) {
                    (OpenApiOwner::Remote(b), Some(e)) => {
                        match (e.openapi.root(), e.converted.documents.get(&key)) {
                            (Some(root), _) => (OpenApiOwner::Remote(b), Some(root)),
                            // No v3 root: its v2 spec converted, if it has one.
                            (None, Some(doc)) => {
                                (OpenApiOwner::Converted(doc.clone()), Some(&doc.root))
                            }
                            (None, None) => (OpenApiOwner::Remote(b), None),
                        }
                    }
                    (owner, _) => (owner, None),
                };
                Some(RemoteRoot {
                    owner,
                    key,
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

#[cfg(test)]
mod tests;
