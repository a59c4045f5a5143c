//! The routing snapshot and the two controllers that publish it. The request path only ever
//! `load`s an immutable `RouteTable`; the route controller builds the next one whenever the set
//! of APIServices or their availability changes, and the availability controller probes remote
//! backends and (with the kube source) writes the `Available` condition back to the core.

use std::collections::HashMap;
use std::sync::Arc;

use apiservice::model::{Backend, RegisteredAPIService};
use apiservice::resolve::ServiceResolver;
use apiservice::route::{Availability, RouteTable};
use apiservice::source::{ApiServiceSet, Refusal};
use arc_swap::ArcSwap;
use gateway_config::tls::Identity;
use tokio::sync::watch;

use crate::backend::remote::RemoteBackend;

pub mod availability;
use crate::health::Check;
use crate::metrics::Metrics;
use crate::request::RoutedTo;
pub use availability::AvailabilityController;

/// What a route leads to.
#[derive(Clone)]
pub enum Target {
    /// A local APIService: served by the core server.
    Local,
    Remote(Arc<RemoteBackend>),
    /// A remote APIService whose transport could not be built (e.g. a bad caBundle): requests
    /// get a 503 naming the reason.
    Broken(Arc<str>),
}

/// A route's target plus how responses from it are tagged (`apiservice/<name>`), both built
/// once per route table so the request path only clones `Arc`s.
pub struct RouteTarget {
    pub target: Target,
    pub routed_to: RoutedTo,
}

pub type Routes = RouteTable<RouteTarget>;
pub type AvailabilityMap = Arc<HashMap<String, Availability>>;

/// The current routes plus the signals around them.
pub struct Routing {
    table: ArcSwap<Routes>,
    /// Readiness check `apiservice-sources-synced`: passes after the first complete set.
    pub synced: Arc<Check>,
    /// The same table for the controllers that follow it (availability, discovery): `None`
    /// until the first complete set, then every table the route controller builds.
    updates: watch::Sender<Option<Arc<Routes>>>,
}

impl Routing {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            table: ArcSwap::from_pointee(RouteTable::empty()),
            synced: Check::unhealthy("APIService source has not completed its first sync"),
            updates: watch::channel(None).0,
        })
    }

    /// Every route table from the first complete one on; see [`Routing::publish`].
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Routes>>> {
        self.updates.subscribe()
    }

    /// Installs `table` for the request path and hands it to the controllers that follow it.
    fn publish(&self, table: Routes) {
        let table = Arc::new(table);
        self.table.store(table.clone());
        self.updates.send_replace(Some(table));
    }

    pub fn load(&self) -> arc_swap::Guard<Arc<Routes>> {
        self.table.load()
    }

    pub fn load_full(&self) -> Arc<Routes> {
        self.table.load_full()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.is_ok()
    }

    /// For `--apiservice-source=none`: no APIServices, routing is complete at once.
    pub fn mark_synced_empty(&self) {
        self.synced.pass();
    }
}

/// The proxy client certificate remote backends present. A new value (the files were rotated)
/// makes the route controller rebuild every `RemoteBackend`; requests already in flight keep the
/// backend (and connections) they started with.
pub type ProxyIdentity = watch::Receiver<Option<Arc<Identity>>>;

/// Everything a remote backend is built from besides its APIService.
#[derive(Clone)]
pub struct BackendFactory {
    pub proxy_identity: ProxyIdentity,
    pub resolver: Arc<dyn ServiceResolver>,
    pub drain: watch::Receiver<bool>,
}

/// Builds route tables from APIService sets and availability results.
pub struct RouteController {
    routing: Arc<Routing>,
    sets: watch::Receiver<Option<Arc<ApiServiceSet>>>,
    availability: watch::Receiver<AvailabilityMap>,
    factory: BackendFactory,
    metrics: Arc<Metrics>,
    backends: HashMap<String, Arc<RemoteBackend>>,
    /// The proxy identity the backends in `backends` were built with.
    built_with: Option<Arc<Identity>>,
    last_specs: Vec<RegisteredAPIService>,
    /// Names with `aggregation_gateway_invalid_apiservice` set, to remove the ones that are fixed.
    invalid: Vec<String>,
    /// Files with `aggregation_gateway_invalid_apiservice_manifest` set.
    invalid_files: Vec<String>,
}

fn same_identity(a: &Option<Arc<Identity>>, b: &Option<Arc<Identity>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl RouteController {
    pub fn new(
        routing: Arc<Routing>,
        sets: watch::Receiver<Option<Arc<ApiServiceSet>>>,
        availability: watch::Receiver<AvailabilityMap>,
        factory: BackendFactory,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            routing,
            sets,
            availability,
            factory,
            metrics,
            backends: HashMap::new(),
            built_with: None,
            last_specs: Vec::new(),
            invalid: Vec::new(),
            invalid_files: Vec::new(),
        }
    }

    pub async fn run(mut self) {
        loop {
            self.rebuild();
            tokio::select! {
                changed = self.sets.changed() => if changed.is_err() { return },
                changed = self.availability.changed() => if changed.is_err() { return },
                changed = self.factory.proxy_identity.changed() => if changed.is_err() { return },
            }
        }
    }

    fn rebuild(&mut self) {
        let identity = self.factory.proxy_identity.borrow_and_update().clone();
        let Some(set) = self.sets.borrow_and_update().clone() else {
            return;
        };
        if !same_identity(&identity, &self.built_with) {
            if self.built_with.is_some() || !self.backends.is_empty() {
                tracing::info!(
                    backends = self.backends.len(),
                    "proxy client certificate changed; rebuilding remote backends"
                );
            }
            self.backends.clear();
            self.built_with = identity.clone();
        }
        let availability = self.availability.borrow_and_update().clone();
        let mut builder = RouteTable::builder();
        let mut specs = Vec::with_capacity(set.apiservices.len());
        let mut backends = HashMap::new();
        let mut invalid = Vec::new();
        let mut invalid_files = Vec::new();
        // The source refused these manifests and has logged why, naming the file: only count
        // them here. A kept last good version is in `set.apiservices` and routed below.
        for refused in &set.refused {
            match refused {
                Refusal::File { path, reason } => {
                    let path = path.display().to_string();
                    tracing::debug!(file = path, reason, "APIService manifest file refused");
                    self.metrics
                        .invalid_apiservice_manifest
                        .with_label_values(&[&path])
                        .set(1);
                    invalid_files.push(path);
                }
                Refusal::ApiService { name, kept, reason } => {
                    tracing::debug!(
                        apiservice = name,
                        kept,
                        reason,
                        "APIService manifest refused"
                    );
                    self.metrics
                        .invalid_apiservice
                        .with_label_values(&[name])
                        .set(1);
                    invalid.push(name.clone());
                }
            }
        }
        for api in &set.apiservices {
            let registered = match RegisteredAPIService::try_from(api) {
                Ok(r) => r,
                Err(e) => {
                    let name = api.metadata.name.clone().unwrap_or_default();
                    if !self.invalid.contains(&name) {
                        tracing::warn!(apiservice = %name, error = %e, "APIService is invalid and is not routed");
                    }
                    self.metrics
                        .invalid_apiservice
                        .with_label_values(&[&name])
                        .set(1);
                    if !invalid.contains(&name) {
                        invalid.push(name);
                    }
                    continue;
                }
            };
            let target = match &registered.backend {
                Backend::Local => Target::Local,
                Backend::Remote(spec) => match self.backends.get(&registered.name) {
                    Some(b) if b.same_spec(spec) => Target::Remote(b.clone()),
                    _ => match RemoteBackend::new(
                        &registered,
                        spec,
                        identity.as_deref(),
                        self.factory.resolver.clone(),
                        self.factory.drain.clone(),
                    ) {
                        Ok(b) => Target::Remote(Arc::new(b)),
                        Err(e) => {
                            tracing::warn!(apiservice = %registered.name, error = %e, "cannot build the backend transport");
                            Target::Broken(e.to_string().into())
                        }
                    },
                },
            };
            if let Target::Remote(b) = &target {
                backends.insert(registered.name.clone(), b.clone());
            }
            let available = match &target {
                Target::Local => Availability::Available,
                _ => availability
                    .get(&registered.name)
                    .cloned()
                    .unwrap_or_else(|| Availability::of(api)),
            };
            let routed_to = RoutedTo::api_service(&registered.name);
            specs.push(registered.clone());
            builder.insert(registered, RouteTarget { target, routed_to }, available);
        }
        for gone in self.invalid.iter().filter(|n| !invalid.contains(n)) {
            let _ = self.metrics.invalid_apiservice.remove_label_values(&[gone]);
        }
        self.invalid = invalid;
        for gone in self
            .invalid_files
            .iter()
            .filter(|f| !invalid_files.contains(f))
        {
            let _ = self
                .metrics
                .invalid_apiservice_manifest
                .remove_label_values(&[gone]);
        }
        self.invalid_files = invalid_files;
        let (table, duplicates) = builder.build();
        for d in duplicates {
            tracing::warn!(apiservice = %d.api_service.name, "{d}");
        }
        self.backends = backends;
        let table_len = table.len();
        self.routing.publish(table);
        if !self.routing.is_synced() {
            tracing::info!(apiservices = table_len, "APIService routes installed");
            self.routing.synced.pass();
        }
        if specs != self.last_specs {
            tracing::debug!(apiservices = table_len, "APIService set changed");
            self.last_specs = specs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use apiservice::resolve::{Changes, ResolveError, ResolveReason};

    use apiservice::model::{APIService, ServiceRef};
    use apiservice::resolve::Endpoint;

    /// Services in whichever namespaces `answers` names; each resolves to a closed local port,
    /// so a probe fails fast with FailedDiscoveryCheck once the pre-check passes.
    struct FakeResolver {
        synced: AtomicBool,
        /// namespace → the pre-check's answer; absent means ServiceNotFound.
        answers: Mutex<HashMap<String, Result<(), ResolveError>>>,
        /// namespace → probes that dialled it.
        dialled: Mutex<HashMap<String, usize>>,
        port: u16,
        /// Namespaces whose Service resolves to a listener that never answers.
        hanging: Mutex<Option<(String, std::net::TcpListener)>>,
        changed: watch::Sender<()>,
        checks: AtomicUsize,
    }

    impl FakeResolver {
        fn new(synced: bool) -> Arc<Self> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            Arc::new(Self {
                synced: AtomicBool::new(synced),
                answers: Mutex::default(),
                dialled: Mutex::default(),
                port,
                hanging: Mutex::default(),
                changed: watch::Sender::new(()),
                checks: AtomicUsize::new(0),
            })
        }

        fn set(&self, namespace: &str, answer: Result<(), ResolveError>) {
            self.answers
                .lock()
                .unwrap()
                .insert(namespace.into(), answer);
            self.changed.send_replace(());
        }

        fn dialled(&self, namespace: &str) -> usize {
            self.dialled
                .lock()
                .unwrap()
                .get(namespace)
                .copied()
                .unwrap_or(0)
        }
    }

    impl ServiceResolver for FakeResolver {
        fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
            *self
                .dialled
                .lock()
                .unwrap()
                .entry(svc.namespace.clone())
                .or_default() += 1;
            if let Some((ns, listener)) = self.hanging.lock().unwrap().as_ref() {
                if *ns == svc.namespace {
                    let port = listener.local_addr().unwrap().port();
                    return Ok(Endpoint::new("127.0.0.1", port));
                }
            }
            Ok(Endpoint::new("127.0.0.1", self.port))
        }

        fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
            self.checks.fetch_add(1, Ordering::Relaxed);
            if !self.synced() {
                return Err(ResolveError::new(
                    ResolveReason::ServiceAccessError,
                    "the Service cache has not synced yet",
                ));
            }
            self.answers
                .lock()
                .unwrap()
                .get(&svc.namespace)
                .cloned()
                .unwrap_or_else(|| Err(ResolveError::not_present(svc)))
        }

        fn synced(&self) -> bool {
            self.synced.load(Ordering::Acquire)
        }

        fn changes(&self) -> Changes {
            Changes::from(self.changed.subscribe())
        }
    }

    /// `v1.<namespace>.io`, served by Service `<namespace>/api`.
    fn remote(namespace: &str) -> APIService {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("v1.{namespace}.io")},
            "spec": {"group": format!("{namespace}.io"), "version": "v1",
                     "groupPriorityMinimum": 100, "versionPriority": 10,
                     "insecureSkipTLSVerify": true,
                     "service": {"namespace": namespace, "name": "api", "port": 443}},
        }))
        .unwrap()
    }

    struct Fixture {
        routing: Arc<Routing>,
        controller: RouteController,
        sets: watch::Sender<Option<Arc<ApiServiceSet>>>,
        results: watch::Receiver<AvailabilityMap>,
        metrics: Arc<Metrics>,
    }

    /// A route controller over `set` (its table installed) and, started beside it, an
    /// availability controller with a one-hour interval: only a spec change or a resolver change
    /// can make it check again within a test.
    fn start(resolver: Arc<FakeResolver>, set: ApiServiceSet) -> Fixture {
        let routing = Routing::new();
        let metrics = Arc::new(Metrics::new());
        let (sets, sets_rx) = watch::channel(Some(Arc::new(set)));
        let (results_tx, results) = watch::channel(AvailabilityMap::default());
        let factory = BackendFactory {
            proxy_identity: watch::channel(None).1,
            resolver: resolver.clone(),
            drain: watch::channel(false).1,
        };
        let mut controller = RouteController::new(
            routing.clone(),
            sets_rx,
            results.clone(),
            factory,
            metrics.clone(),
        );
        controller.rebuild();
        tokio::spawn(
            AvailabilityController {
                routing: routing.clone(),
                results: results_tx,
                interval: Duration::from_secs(3600),
                // Failed checks are not retried within a test either: what is probed is what a
                // change asked for.
                backoff: crate::workqueue::Backoff {
                    min: Duration::from_secs(3600),
                    max: Duration::from_secs(3600),
                },
                resolver,
                kube: None,
                metrics: metrics.clone(),
            }
            .run(),
        );
        Fixture {
            routing,
            controller,
            sets,
            results,
            metrics,
        }
    }

    fn reason(results: &AvailabilityMap, name: &str) -> String {
        match results.get(name) {
            Some(Availability::Unavailable { reason, .. }) => reason.to_string(),
            other => format!("{other:?}"),
        }
    }

    async fn next_results(rx: &mut watch::Receiver<AvailabilityMap>) -> AvailabilityMap {
        tokio::time::timeout(Duration::from_secs(3), rx.changed())
            .await
            .expect("availability results within 3s")
            .unwrap();
        rx.borrow_and_update().clone()
    }

    #[tokio::test]
    async fn the_first_check_waits_for_the_service_caches() {
        let resolver = FakeResolver::new(false);
        let mut f = start(resolver.clone(), ApiServiceSet::accepted(vec![remote("a")]));
        assert!(f.routing.is_synced());

        // Checking now would only say ServiceAccessError (and write Unknown to the core).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(resolver.checks.load(Ordering::Relaxed), 0);
        assert!(f.results.borrow().is_empty());

        resolver.synced.store(true, Ordering::Release);
        resolver.changed.send_replace(());
        let results = next_results(&mut f.results).await;
        assert_eq!(reason(&results, "v1.a.io"), "ServiceNotFound");
    }

    #[tokio::test]
    async fn a_service_change_rechecks_only_the_apiservices_it_affects() {
        let resolver = FakeResolver::new(true);
        let mut f = start(
            resolver.clone(),
            ApiServiceSet::accepted(vec![remote("a"), remote("b")]),
        );
        let results = next_results(&mut f.results).await;
        assert_eq!(reason(&results, "v1.a.io"), "ServiceNotFound");
        assert_eq!(reason(&results, "v1.b.io"), "ServiceNotFound");

        // Service a/api appears: v1.a.io is probed at once, not after the hour.
        resolver.set("a", Ok(()));
        let results = next_results(&mut f.results).await;
        assert_eq!(reason(&results, "v1.a.io"), "FailedDiscoveryCheck");
        assert_eq!(reason(&results, "v1.b.io"), "ServiceNotFound");
        assert_eq!(resolver.dialled("a"), 1);

        // A change that leaves every pre-check as it was probes nothing.
        resolver.set("c", Ok(()));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(resolver.dialled("a"), 1);
        assert_eq!(resolver.dialled("b"), 0);

        // Losing the endpoints is seen as promptly.
        resolver.set(
            "a",
            Err(ResolveError::new(
                ResolveReason::MissingEndpoints,
                "no endpoints",
            )),
        );
        let results = next_results(&mut f.results).await;
        assert_eq!(reason(&results, "v1.a.io"), "MissingEndpoints");
        drop(f.sets);
    }

    #[tokio::test]
    async fn a_hung_backend_does_not_delay_another_apiservices_result() {
        let resolver = FakeResolver::new(true);
        // Service a/api accepts connections and never answers (the probe waits 5 s for it);
        // b/api refuses at once.
        let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        *resolver.hanging.lock().unwrap() = Some(("a".into(), hang));
        resolver.set("a", Ok(()));
        resolver.set("b", Ok(()));
        let started = std::time::Instant::now();
        let mut f = start(
            resolver.clone(),
            ApiServiceSet::accepted(vec![remote("a"), remote("b")]),
        );
        let results = next_results(&mut f.results).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the first result took {:?}",
            started.elapsed()
        );
        assert_eq!(reason(&results, "v1.b.io"), "FailedDiscoveryCheck");
        assert!(!results.contains_key("v1.a.io"), "{results:?}");

        // The hung one is reported on its own once its probe times out.
        let results = tokio::time::timeout(
            Duration::from_secs(8),
            f.results.wait_for(|r| r.contains_key("v1.a.io")),
        )
        .await
        .expect("the hung backend's result within its probe timeout")
        .unwrap()
        .clone();
        assert_eq!(reason(&results, "v1.a.io"), "FailedDiscoveryCheck");
    }

    fn refused(name: &str, reason: &str, kept: bool) -> Refusal {
        Refusal::ApiService {
            name: name.into(),
            kept,
            reason: reason.into(),
        }
    }

    #[tokio::test]
    async fn refused_manifests_are_counted_and_kept_versions_routed() {
        let resolver = FakeResolver::new(true);
        let set = ApiServiceSet {
            // v1.a.io's last good version is kept; v1.b.io has none.
            apiservices: vec![remote("a"), remote("c")],
            refused: vec![
                Refusal::File {
                    path: "/m/x.yaml".into(),
                    reason: "/m/x.yaml:1:1: bad".into(),
                },
                refused("v1.a.io", "/m/a.yaml:1: invalid", true),
                refused("v1.b.io", "/m/b.yaml:1: invalid", false),
            ],
        };
        let mut f = start(resolver, set);
        let routed: Vec<String> = f
            .routing
            .load()
            .routes()
            .map(|r| r.api_service.name.clone())
            .collect();
        assert_eq!(routed, ["v1.a.io", "v1.c.io"]);
        let text = f.metrics.encode();
        for line in [
            "aggregation_gateway_invalid_apiservice{name=\"v1.a.io\"} 1",
            "aggregation_gateway_invalid_apiservice{name=\"v1.b.io\"} 1",
            "aggregation_gateway_invalid_apiservice_manifest{file=\"/m/x.yaml\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(
            !text.contains("name=\"v1.c.io\"} 1\naggregation_gateway"),
            "{text}"
        );

        // Fixed manifests: the series go away.
        f.sets
            .send(Some(Arc::new(ApiServiceSet::accepted(vec![
                remote("a"),
                remote("b"),
            ]))))
            .unwrap();
        f.controller.rebuild();
        let text = f.metrics.encode();
        assert!(
            !text.contains("aggregation_gateway_invalid_apiservice{"),
            "{text}"
        );
        assert!(
            !text.contains("aggregation_gateway_invalid_apiservice_manifest{"),
            "{text}"
        );
        assert_eq!(f.routing.load().routes().count(), 2);
    }
}
