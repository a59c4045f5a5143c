//! The discovery controller's loop pieces, driven without a server where one is not needed.

use super::*;
use crate::control::discovery::backends::tests::{doc, resources, wardle_doc};
use crate::control::discovery::fetch::DISCOVERY_TIMEOUT;
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
        traffic: Default::default(),
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
    let known = RemoteDiscovery::from_backend_document(&cached, "wardle.example.com", "v1alpha1");
    state.remote.insert(api.name.clone(), known.clone());

    let ok = apply_discovery(
        &mut state,
        &wardle_service(),
        Ok(BackendDiscovery::NotModified),
    );
    assert_eq!(ok, Some(true));
    let ok = apply_openapi(
        &mut state,
        &wardle_service(),
        Ok(RemoteOpenApi {
            root: RootFetch::NotModified,
            converted: None,
        }),
    );
    assert_eq!(ok, Some(true));
    assert!(!state.discovery_dirty, "a 304 must not rebuild discovery");
    assert!(!state.openapi_dirty);
    assert_eq!(state.remote[&api.name], known);
    let entry = &state.services[&wardle_service()];
    assert!(entry.doc.as_ref().is_some_and(|d| Arc::ptr_eq(d, &cached)));
    assert_eq!(entry.etag.as_deref(), Some("\"E1\""));
}

#[test]
fn a_backend_without_openapi_v3_serves_its_v2_converted_until_it_has_a_root() {
    let api = wardle_apiservice("v1alpha1");
    let mut state = state_with_wardle(&api, "127.0.0.1:9".parse().unwrap());
    let key = "apis/wardle.example.com/v1alpha1".to_owned();
    let converted = |etag: &str| {
        let mut root = apiservice::discovery::OpenApiRoot::default();
        root.paths.insert(key.clone(), Default::default());
        let doc = crate::control::discovery::openapi_converted::ConvertedDocument {
            key: key.clone(),
            json: bytes::Bytes::from_static(b"{}"),
            etag: etag.to_owned(),
            root,
        };
        ConvertedSpecs {
            v2_etag: Some(etag.to_owned()),
            documents: [(key.clone(), Arc::new(doc))].into(),
        }
    };
    let mut fetch = |root, converted| {
        state.openapi_dirty = false;
        apply_openapi(
            &mut state,
            &wardle_service(),
            Ok(RemoteOpenApi { root, converted }),
        );
        let entry = &state.services[&wardle_service()];
        (state.openapi_dirty, entry.converted.documents.len())
    };
    // 404 on /openapi/v3, a v2 spec: one converted document, and a new root to publish.
    assert_eq!(
        fetch(
            RootFetch::Absent,
            Some(V2Fetch::Converted(converted("\"A\"")))
        ),
        (true, 1)
    );
    // The v2 spec revalidated with a 304: nothing to rebuild.
    assert_eq!(
        fetch(RootFetch::Absent, Some(V2Fetch::NotModified)),
        (false, 1)
    );
    // The same document converted again (say after an APIService edit): nothing either.
    assert_eq!(
        fetch(
            RootFetch::Absent,
            Some(V2Fetch::Converted(converted("\"A\"")))
        ),
        (false, 1)
    );
    // The backend gained /openapi/v3: its own root replaces the conversion.
    let root = RootFetch::Root(Default::default(), Some("\"R\"".into()));
    assert_eq!(fetch(root, None), (true, 0));
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
