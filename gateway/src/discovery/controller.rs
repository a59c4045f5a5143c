//! The discovery controller: keeps what the core server and every remote backend say about their
//! APIs, and publishes a new merged snapshot whenever one of those inputs changes.
//!
//! One loop, one [`WorkQueue`] (kube-aggregator's `handler_discovery.go` runs one queue of
//! APIService names; ours is keyed by what is fetched):
//! * [`Key::Core`]: the core server's `/api`, `/apis` and `/openapi/v3` ([`super::core`]),
//!   resynced every [`CORE_REFRESH`] (cheap: `If-None-Match` → 304), retried sooner while it
//!   fails.
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::{merge, merge_openapi_roots, APIServiceDiscovery, RemoteDiscovery};
use apiservice::model::{RegisteredAPIService, ServiceRef};
use futures::FutureExt;
use tracing::Instrument;

use super::backends::{remote_discovery, BackendDiscovery, ServiceEntry};
use super::core::{CoreDocuments, CoreState, Refreshed};
use super::fetch::{FetchError, RootDocument, RootFetch, Source};
use super::openapi::{openapi_inputs, root_key, RemoteRoot};
use super::{DiscoveryCache, OpenApiOwner};
use crate::backend::core::CoreBackend;
use crate::backend::remote::RemoteBackend;
use crate::metrics::Metrics;
use crate::routing::{Routes, Routing, Target};
use crate::workqueue::{Backoff, Next, WorkQueue};

/// How often the core's documents are revalidated (cheap: `If-None-Match` → 304).
pub const CORE_REFRESH: Duration = Duration::from_secs(5);

/// What the loop fetches, one at a time per key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The core server's documents.
    Core,
    /// One backing Service's discovery (`/apis`, or per group-version).
    Discovery(ServiceRef),
    /// One backing Service's OpenAPI v3 root.
    OpenApi(ServiceRef),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Core => f.write_str("core"),
            Key::Discovery(svc) => write!(f, "discovery/{svc}"),
            Key::OpenApi(svc) => write!(f, "openapi/{svc}"),
        }
    }
}

/// What one fetch brought back.
pub enum Outcome {
    /// The core's documents travel with their refresh, so the loop owns them between runs.
    Core(Box<CoreDocuments>, Refreshed),
    Discovery(Result<BackendDiscovery, FetchError>),
    OpenApi(Result<RootFetch, FetchError>),
}

/// kube-aggregator's discovery backoff for backends (500 ms → 1 min); the core is retried
/// within its own refresh interval, since everything else waits for it.
fn backoff(key: &Key) -> Backoff {
    let min = Duration::from_millis(500);
    match key {
        Key::Core => Backoff {
            min,
            max: CORE_REFRESH,
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
}

/// The loop's state, owned by the loop alone.
#[derive(Default)]
struct State {
    /// The core's documents; `None` while their refresh runs.
    core_documents: Option<Box<CoreDocuments>>,
    core: Option<Arc<CoreState>>,
    table: Option<Arc<Routes>>,
    /// The APIServices of the last merged table, to tell a real change from an availability flip.
    specs: Vec<Arc<RegisteredAPIService>>,
    services: HashMap<ServiceRef, ServiceEntry>,
    /// Per remote APIService name: what its backend last said.
    remote: HashMap<String, RemoteDiscovery>,
    discovery_dirty: bool,
    openapi_dirty: bool,
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
        let mut routes = self.routing.subscribe();
        let mut queue = WorkQueue::new(backoff);
        let mut state = State {
            core_documents: Some(Box::new(CoreDocuments::new(
                Source::Core(self.core.clone()),
                self.core.url().to_owned(),
                self.refresh_interval,
            ))),
            ..State::default()
        };
        queue.queue().add(Key::Core);
        if let Some(table) = routes.borrow_and_update().clone() {
            reconcile(&mut state, table, &mut queue);
        }
        loop {
            tokio::select! {
                changed = routes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some(table) = routes.borrow_and_update().clone() {
                        reconcile(&mut state, table, &mut queue);
                    }
                }
                next = queue.next() => match next {
                    Next::Ready(key) => start(&mut state, &mut queue, key),
                    Next::Done(key, outcome) => {
                        let ok = finish(&mut state, &key, outcome);
                        match ok {
                            Some(true) => queue.resync(key.clone(), Some(self.resync(&key))),
                            Some(false) => {
                                queue.retry(key);
                            }
                            None => queue.forget(&key),
                        }
                    }
                },
            }
            publish(&self.cache, &self.metrics, &mut state);
        }
    }

    fn resync(&self, key: &Key) -> Duration {
        match key {
            Key::Core => CORE_REFRESH,
            Key::Discovery(_) | Key::OpenApi(_) => self.refresh_interval,
        }
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
                if let Some(core) = documents.state() {
                    state.core = Some(Arc::new(core));
                    state.discovery_dirty = true;
                    state.openapi_dirty = true;
                }
            }
            let ok = refreshed.complete && state.core.is_some();
            state.core_documents = Some(documents);
            Some(ok)
        }
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
    for (api, _) in &entry.apiservices {
        let next = remote_discovery(
            discovery.as_ref().ok(),
            doc.as_deref(),
            &api.group_version(),
            state.remote.get(&api.name),
        );
        if state.remote.get(&api.name) != Some(&next) {
            state.remote.insert(api.name.clone(), next);
            state.discovery_dirty = true;
        }
    }
    Some(discovery.is_ok())
}

/// Takes in one OpenAPI v3 root fetch of `svc`.
fn apply_openapi(
    state: &mut State,
    svc: &ServiceRef,
    fetch: Result<RootFetch, FetchError>,
) -> Option<bool> {
    let entry = state.services.get_mut(svc)?;
    match fetch {
        Ok(fetch) => {
            let absent = matches!(fetch, RootFetch::Absent);
            let had_root = entry.openapi.root().is_some();
            if entry.openapi.apply(fetch) {
                if absent {
                    tracing::info!(apiservice = %backend_name(entry, svc),
                        "backend has no /openapi/v3; it contributes no OpenAPI v3 paths");
                }
                state.openapi_dirty |= had_root || !absent;
            }
            Some(true)
        }
        Err(e) => {
            tracing::debug!(apiservice = %backend_name(entry, svc), error = %e,
                "cannot fetch the backend's OpenAPI v3 root; keeping the last one");
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
                let root = match owner {
                    OpenApiOwner::Remote(_) => {
                        state.services.get(svc).and_then(|e| e.openapi.root())
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::backends::tests::{doc, resources, wardle_doc};
    use crate::discovery::fetch::DISCOVERY_TIMEOUT;
    use apiservice::discovery::CoreDiscovery;
    use apiservice::route_table::Availability;
    use kube::core::discovery::v2::APIGroupDiscoveryList;
    use tokio::sync::watch;

    use apiservice::model::{Backend, RemoteBackendSpec};
    use apiservice::resolve::{Endpoint, ResolveError, ServiceResolver};
    use apiservice::route_table::RouteTable;

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
        let entry = ServiceEntry {
            apiservices: vec![(api.clone(), Availability::Available)],
            backend: Some(backend_at(addr)),
            ..Default::default()
        };
        let mut state = State::default();
        state.services.insert(wardle_service(), entry);
        state
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
            openapi: RootDocument::Unknown,
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
        let known =
            RemoteDiscovery::from_backend_document(&cached, "wardle.example.com", "v1alpha1");
        state.remote.insert(api.name.clone(), known.clone());

        let ok = apply_discovery(
            &mut state,
            &wardle_service(),
            Ok(BackendDiscovery::NotModified),
        );
        assert_eq!(ok, Some(true));
        let ok = apply_openapi(&mut state, &wardle_service(), Ok(RootFetch::NotModified));
        assert_eq!(ok, Some(true));
        assert!(!state.discovery_dirty, "a 304 must not rebuild discovery");
        assert!(!state.openapi_dirty);
        assert_eq!(state.remote[&api.name], known);
        let entry = &state.services[&wardle_service()];
        assert!(entry.doc.as_ref().is_some_and(|d| Arc::ptr_eq(d, &cached)));
        assert_eq!(entry.etag.as_deref(), Some("\"E1\""));
    }

    #[test]
    fn a_report_for_a_service_that_is_gone_is_dropped() {
        let mut state = State::default();
        let other = BackendDiscovery::Aggregated {
            doc: Arc::new(APIGroupDiscoveryList::default()),
            etag: Some("\"OLD\"".into()),
        };
        assert_eq!(
            apply_discovery(&mut state, &wardle_service(), Ok(other)),
            None
        );
        assert!(!state.discovery_dirty);
    }

    /// Drives the controller's queue for `state` until `until` holds, as `run` would.
    async fn drive(
        state: &mut State,
        queue: &mut WorkQueue<Key, Outcome>,
        mut until: impl FnMut(&State, &Key) -> bool,
    ) {
        loop {
            match queue.next().await {
                Next::Ready(key) => start(state, queue, key),
                Next::Done(key, outcome) => {
                    match finish(state, &key, outcome) {
                        Some(false) => {
                            queue.retry(key.clone());
                        }
                        _ => queue.forget(&key),
                    }
                    if until(state, &key) {
                        return;
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_backend_is_stale_after_the_discovery_timeout() {
        // The kernel accepts the connection; nobody ever answers the TLS handshake.
        let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api = wardle_apiservice("v1alpha1");
        let mut state = state_with_wardle(&api, hanging.local_addr().unwrap());
        let known = RemoteDiscovery::current(resources(&["flunders", "fischers"]));
        state.remote.insert(api.name.clone(), known.clone());
        let mut queue = WorkQueue::new(backoff);
        let started = tokio::time::Instant::now();
        queue.queue().add(Key::Discovery(wardle_service()));
        queue.queue().add(Key::OpenApi(wardle_service()));

        drive(&mut state, &mut queue, |_, key| {
            matches!(key, Key::Discovery(_))
        })
        .await;
        let waited = started.elapsed();
        assert!(
            waited >= DISCOVERY_TIMEOUT && waited < DISCOVERY_TIMEOUT + Duration::from_secs(1),
            "discovery failed after {waited:?}"
        );
        assert_eq!(
            state.remote[&api.name],
            RemoteDiscovery::failed(known.resources.clone())
        );
        assert!(state.discovery_dirty);
        // A failed fetch is retried with kube-aggregator's backoff, not at the refresh interval.
        assert!(queue.is_failing(&Key::Discovery(wardle_service())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_backend_does_not_hold_back_another_services_discovery() {
        let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api = wardle_apiservice("v1alpha1");
        let mut state = state_with_wardle(&api, hanging.local_addr().unwrap());
        // A second Service whose fetch fails at once (nothing listens on port 9).
        let refused = ServiceRef {
            namespace: "other".into(),
            name: "api".into(),
            port: 443,
        };
        let entry = ServiceEntry {
            apiservices: vec![(wardle_apiservice("v1beta1"), Availability::Available)],
            backend: Some(backend_at("127.0.0.1:9".parse().unwrap())),
            ..Default::default()
        };
        state.services.insert(refused.clone(), entry);
        let mut queue = WorkQueue::new(backoff);
        let started = tokio::time::Instant::now();
        queue.queue().add(Key::Discovery(wardle_service()));
        queue.queue().add(Key::Discovery(refused.clone()));

        drive(&mut state, &mut queue, |_, key| {
            *key == Key::Discovery(refused.clone())
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the refused Service waited {:?} for the hanging one",
            started.elapsed()
        );
        assert!(!state.remote["v1beta1.wardle.example.com"].fresh);
    }
}
