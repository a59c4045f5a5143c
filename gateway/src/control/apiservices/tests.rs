//! The route and availability controllers together, over a fake resolver.

use super::remote_available_controller::AvailabilitySettings;
use super::*;
use crate::metrics::Metrics;
use apiservice::resolve::ServiceResolver;
use apiservice::source::{ApiServiceSet, Refusal};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

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
        failures: None,
        reject_forwarding_redirect: true,
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
        AvailabilityController::new(
            routing.clone(),
            results_tx,
            AvailabilitySettings {
                interval: Duration::from_secs(3600),
                // Failed checks are not retried within a test either: what is probed is what a
                // change asked for.
                backoff: crate::workqueue::Backoff {
                    min: Duration::from_secs(3600),
                    max: Duration::from_secs(3600),
                },
                unavailable_recheck: Duration::from_secs(3600),
                resolver,
                kube: None,
                reachable: None,
            },
            metrics.clone(),
        )
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
    // One check: its parallel attempts each pick an endpoint.
    let one_check = crate::backend::probe::ATTEMPTS;
    assert_eq!(resolver.dialled("a"), one_check);

    // A change that leaves every pre-check as it was probes nothing.
    resolver.set("c", Ok(()));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(resolver.dialled("a"), one_check);
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
