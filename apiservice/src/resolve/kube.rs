//! Services resolved from the core server: kube-aggregator's ClusterIP and endpoint routing over
//! cluster-wide caches of Services (a kube-rs reflector store) and EndpointSlices (a
//! [`SliceIndex`]), kept current by watchers running beside the resolver.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint as DiscoveryEndpoint, EndpointSlice};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, Instrument};

use super::slice_index::{SliceIndex, SliceWriter};
use super::{Changes, Endpoint, Endpoints, ResolveError, ResolveReason, ServiceResolver};
use crate::model::ServiceRef;
use crate::outage::Outage;

// === impl KubeResolver ===

/// Resolves Services from cluster-wide caches of Services and EndpointSlices kept by watchers.
pub struct KubeResolver {
    services: Store<Service>,
    services_synced: Arc<AtomicBool>,
    slices: Arc<SliceIndex>,
    endpoint_routing: bool,
    /// Rotates endpoint picks; seeded from the clock so gateway replicas do not all start on the
    /// same pod. Round-robin spreads load at least as well as kube's `rand.Intn`.
    next: AtomicUsize,
    /// Bumped by the watchers after every event they applied to the caches.
    changed: Arc<watch::Sender<()>>,
}

impl KubeResolver {
    /// The resolver and the future that keeps its caches current (spawn it; it runs until
    /// dropped). `endpoint_routing` is `--enable-aggregator-routing`.
    ///
    /// Needs RBAC `list` and `watch` on `services` and `endpointslices.discovery.k8s.io` in all
    /// namespaces.
    pub fn start(
        client: Client,
        endpoint_routing: bool,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let services_outage = Arc::new(Outage::new(
            "Service watch",
            "routes use the last known Services",
        ));
        let slices_outage = Arc::new(Outage::new(
            "EndpointSlice watch",
            "routes use the last known endpoints",
        ));
        let services_client = services_outage.client(client.clone());
        let service_events = watcher(Api::<Service>::all(services_client), Default::default())
            .default_backoff()
            // Only spec is read; annotations (last-applied-configuration) and managedFields are
            // most of a cached object's size.
            .modify(|s: &mut Service| {
                s.managed_fields_mut().clear();
                s.annotations_mut().clear();
            });
        let slice_events = watcher(
            Api::<EndpointSlice>::all(slices_outage.client(client)),
            Default::default(),
        )
        .default_backoff()
        .modify(|s: &mut EndpointSlice| {
            s.managed_fields_mut().clear();
            s.annotations_mut().clear();
        });
        Self::from_streams(
            (service_events, services_outage),
            (slice_events, slices_outage),
            endpoint_routing,
        )
    }

    /// [`KubeResolver::start`] fed by any event streams (tests feed them directly).
    fn from_streams<S, E>(
        (service_events, services_outage): (S, Arc<Outage>),
        (slice_events, slices_outage): (E, Arc<Outage>),
        endpoint_routing: bool,
    ) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        S: Stream<Item = Result<watcher::Event<Service>, watcher::Error>> + Send + 'static,
        E: Stream<Item = Result<watcher::Event<EndpointSlice>, watcher::Error>> + Send + 'static,
    {
        let (services, services_writer) = reflector::store::<Service>();
        let services_synced = Arc::new(AtomicBool::new(false));
        let slices = Arc::new(SliceIndex::default());
        let resolver = Self::from_parts(
            services,
            Arc::clone(&services_synced),
            Arc::clone(&slices),
            endpoint_routing,
        );

        // The reflector has applied an event to the store by the time it reaches us, so a
        // subscriber woken here reads the new state.
        let changed = Arc::clone(&resolver.changed);
        let services_task = drive_cache(
            service_events.reflect(services_writer),
            services_outage,
            move |e| {
                if matches!(e, watcher::Event::InitDone) {
                    services_synced.store(true, Ordering::Release);
                }
                changed.send_replace(());
            },
        )
        .instrument(tracing::info_span!("cache", kind = "Service"));

        let changed = Arc::clone(&resolver.changed);
        let mut slice_writer = SliceWriter::new(slices);
        let slices_task = drive_cache(slice_events, slices_outage, move |e| {
            slice_writer.apply_watcher_event(e);
            changed.send_replace(());
        })
        .instrument(tracing::info_span!("cache", kind = "EndpointSlice"));

        // The task runs in this span wherever it is spawned, so log lines name the resolver and
        // (from the spans above) the cache without repeating it.
        let span = tracing::info_span!("service_resolver", resolver = "kube", endpoint_routing);
        let task = async move {
            futures::join!(services_task, slices_task);
        }
        .instrument(span);
        (resolver, task)
    }

    pub(super) fn from_parts(
        services: Store<Service>,
        services_synced: Arc<AtomicBool>,
        slices: Arc<SliceIndex>,
        endpoint_routing: bool,
    ) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as usize)
            .unwrap_or(0);
        Self {
            services,
            services_synced,
            slices,
            endpoint_routing,
            next: AtomicUsize::new(seed),
            changed: Arc::new(watch::Sender::new(())),
        }
    }

    /// Whether both caches hold a complete list.
    pub fn synced(&self) -> bool {
        self.services_synced.load(Ordering::Acquire) && self.slices.synced()
    }

    fn service(&self, r: &ServiceRef) -> Result<Arc<Service>, ResolveError> {
        if !self.services_synced.load(Ordering::Acquire) {
            return Err(ResolveError::cannot_check(
                ResolveReason::ServiceAccessError,
                r,
                "the Service cache has not synced yet",
            ));
        }
        self.services
            .get(&ObjectRef::new(&r.name).within(&r.namespace))
            .ok_or_else(|| ResolveError::not_present(r))
    }

    fn slices_synced(&self, r: &ServiceRef) -> Result<(), ResolveError> {
        if self.slices.synced() {
            Ok(())
        } else {
            Err(ResolveError::cannot_check(
                ResolveReason::EndpointsAccessError,
                r,
                "the EndpointSlice cache has not synced yet",
            ))
        }
    }

    /// kube's `ResolveCluster`.
    fn resolve_cluster_ip(&self, r: &ServiceRef) -> Result<Endpoint, ResolveError> {
        let svc = self.service(r)?;
        let spec = svc.spec.as_ref();
        let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
        match service_type(&svc) {
            "ClusterIP" if cluster_ip == "None" => Err(ResolveError::unroutable(
                r#"cannot route to service with ClusterIP "None""#,
            )),
            "ClusterIP" | "NodePort" | "LoadBalancer" => {
                // The Service port equals the APIService's port by construction of the match.
                find_port(&svc, r.port).ok_or_else(|| ResolveError::not_listening(r))?;
                if cluster_ip.is_empty() {
                    return Err(ResolveError::unroutable(format!(
                        "service/{} in {:?} has no clusterIP",
                        r.name, r.namespace
                    )));
                }
                Ok(Endpoint::new(cluster_ip, r.port))
            }
            "ExternalName" => match spec.and_then(|s| s.external_name.as_deref()) {
                Some(name) if !name.is_empty() => Ok(Endpoint::new(name, r.port)),
                _ => Err(ResolveError::unroutable(format!(
                    "service/{} in {:?} has type ExternalName but no externalName",
                    r.name, r.namespace
                ))),
            },
            other => Err(ResolveError::unroutable(format!(
                "unsupported service type {other:?}"
            ))),
        }
    }

    /// kube's `ResolveEndpoint`: a ready endpoint from the Service's EndpointSlices, on the
    /// endpoint port whose name equals the Service port's name (the targetPort as resolved by
    /// the EndpointSlice controller).
    fn resolve_endpoint(&self, r: &ServiceRef) -> Result<Endpoint, ResolveError> {
        self.with_ready_endpoints(r, |n, candidates| {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            candidates
                .nth(i)
                .map(|(host, port)| Endpoint::new(host.clone(), port))
        })
    }

    /// Every ready endpoint of the Service, for the balancer (see [`Self::resolve_endpoint`]).
    fn ready_endpoints(&self, r: &ServiceRef) -> Result<Endpoints, ResolveError> {
        self.with_ready_endpoints(r, |_, candidates| {
            Some(
                candidates
                    .map(|(host, port)| Endpoint::new(host.clone(), port))
                    .collect(),
            )
        })
    }

    /// Calls `pick` with the number of ready endpoints (at least one) and an iterator over
    /// them; `MissingEndpoints` when there are none or `pick` finds nothing.
    fn with_ready_endpoints<T>(
        &self,
        r: &ServiceRef,
        pick: impl FnOnce(usize, &mut dyn Iterator<Item = (&String, u16)>) -> Option<T>,
    ) -> Result<T, ResolveError> {
        let svc = self.service(r)?;
        let port = find_port(&svc, r.port).ok_or_else(|| ResolveError::not_listening(r))?;
        match service_type(&svc) {
            "ClusterIP" | "NodePort" | "LoadBalancer" => {}
            other => {
                return Err(ResolveError::unroutable(format!(
                    "unsupported service type {other:?}"
                )))
            }
        }
        self.slices_synced(r)?;
        let port_name = port.name.as_deref().unwrap_or("");
        let picked = self.slices.with_service(&r.namespace, &r.name, |slices| {
            let slices = slices?;
            // Counted, then walked again to the pick: no allocation to count.
            let candidates = || {
                slices.values().flat_map(|slice| {
                    let port = endpoint_port(slice, port_name);
                    slice
                        .endpoints
                        .as_endpoints()
                        .iter()
                        .filter(|e| is_ready(e))
                        .filter_map(move |e| Some((e.addresses.first()?, port?)))
                })
            };
            let n = candidates().count();
            if n == 0 {
                return None;
            }
            pick(n, &mut candidates())
        });
        picked.ok_or_else(|| {
            ResolveError::new(
                ResolveReason::MissingEndpoints,
                format!("no endpoints available for service {:?}", r.name),
            )
        })
    }
}

// === impl KubeResolver as ServiceResolver ===

impl ServiceResolver for KubeResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        if self.endpoint_routing {
            self.resolve_endpoint(svc)
        } else {
            self.resolve_cluster_ip(svc)
        }
    }

    fn endpoints(&self, svc: &ServiceRef) -> Result<Endpoints, ResolveError> {
        if self.endpoint_routing {
            self.ready_endpoints(svc)
        } else {
            self.resolve_cluster_ip(svc).map(|e| Endpoints::from([e]))
        }
    }

    /// The remote availability controller's Service and EndpointSlice checks, in its order and
    /// with its messages. Only `ClusterIP` Services are checked beyond existence, as in kube.
    fn check_endpoints(&self, r: &ServiceRef) -> Result<(), ResolveError> {
        let svc = self.service(r)?;
        if service_type(&svc) != "ClusterIP" {
            return Ok(());
        }
        let port = find_port(&svc, r.port).ok_or_else(|| ResolveError::not_listening(r))?;
        let port_name = port.name.as_deref().unwrap_or("");
        self.slices_synced(r)?;
        self.slices.with_service(&r.namespace, &r.name, |slices| {
            let slices = slices.filter(|s| !s.is_empty()).ok_or_else(|| {
                ResolveError::new(
                    ResolveReason::EndpointsNotFound,
                    format!(
                        "cannot find endpointslices for service/{} in {:?}",
                        r.name, r.namespace
                    ),
                )
            })?;
            let available = slices.values().any(|s| {
                s.endpoints.as_endpoints().iter().any(is_ready) && endpoint_port(s, port_name).is_some()
            });
            if available {
                Ok(())
            } else {
                Err(ResolveError::new(
                    ResolveReason::MissingEndpoints,
                    format!(
                        "endpointslices for service/{} in {:?} have no addresses with port name {:?}",
                        r.name, r.namespace, port_name
                    ),
                ))
            }
        })
    }

    fn synced(&self) -> bool {
        KubeResolver::synced(self)
    }

    fn changes(&self) -> Changes {
        Changes::from(self.changed.subscribe())
    }
}

// === Service and EndpointSlice fields, read as kube reads them ===

/// `spec.type`, defaulted as the API server does.
fn service_type(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .filter(|t| !t.is_empty())
        .unwrap_or("ClusterIP")
}

fn find_port(svc: &Service, port: u16) -> Option<&ServicePort> {
    svc.spec
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.port == i32::from(port))
}

/// The slice's port number for the named Service port. An unnamed port is `""` on both sides
/// (a missing name counts as `""`; kube requires it set, but hand-written slices omit it).
fn endpoint_port(slice: &EndpointSlice, port_name: &str) -> Option<u16> {
    slice
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref().unwrap_or("") == port_name)
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// `EndpointSlice.endpoints` is a list up to Kubernetes 1.35 and optional from 1.36 on; the
/// library must build against whichever version the binary picks, so read it through this.
trait EndpointList {
    fn as_endpoints(&self) -> &[DiscoveryEndpoint];
}

impl EndpointList for Vec<DiscoveryEndpoint> {
    fn as_endpoints(&self) -> &[DiscoveryEndpoint] {
        self
    }
}

impl EndpointList for Option<Vec<DiscoveryEndpoint>> {
    fn as_endpoints(&self) -> &[DiscoveryEndpoint] {
        self.as_deref().unwrap_or_default()
    }
}

/// Ready unless explicitly not (`conditions.ready` nil means ready, as in kube).
fn is_ready(e: &DiscoveryEndpoint) -> bool {
    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
}

// === the watchers ===

/// Runs one cache's watcher stream, handing every event to `apply`. kube-rs' default backoff
/// spaces retries out, and an outage is logged once ([`Outage`]).
async fn drive_cache<K, S>(
    events: S,
    outage: Arc<Outage>,
    mut apply: impl FnMut(&watcher::Event<K>),
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut synced = false;
    while let Some(event) = events.next().await {
        outage.watch_event(&event);
        if let Ok(event) = event {
            if !synced && matches!(event, watcher::Event::InitDone) {
                info!("cache synced");
                synced = true;
            }
            apply(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::fixtures::*;
    use crate::resolve::{ChainResolver, StaticResolver};
    use kube::runtime::reflector::store::Writer;
    use serde_json::json;

    #[test]
    fn not_synced_is_an_access_error_not_not_found() {
        let r = KubeResolver::from_parts(
            Writer::<Service>::default().as_reader(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(SliceIndex::default()),
            false,
        );
        assert!(!r.synced());
        assert_eq!(
            err(r.resolve(&svc_ref(443))),
            (
                ResolveReason::ServiceAccessError,
                r#"service/api in "wardle" cannot be checked due to: the Service cache has not synced yet"#.into()
            )
        );
    }

    #[test]
    fn cluster_ip_rules_and_messages() {
        let missing = resolver(vec![], vec![], false);
        assert!(missing.synced());
        assert_eq!(
            err(missing.resolve(&svc_ref(443))),
            (
                ResolveReason::ServiceNotFound,
                r#"service/api in "wardle" is not present"#.into()
            )
        );

        let r = resolver(vec![cluster_ip("10.96.0.5", https_port())], vec![], false);
        // ClusterIP routing does not look at endpoints: no slices, still routable.
        assert_eq!(
            r.resolve(&svc_ref(443)).unwrap(),
            Endpoint::new("10.96.0.5", 443)
        );
        assert_eq!(
            err(r.resolve(&svc_ref(8443))),
            (
                ResolveReason::ServicePortError,
                r#"service/api in "wardle" is not listening on port 8443"#.into()
            )
        );

        let v6 = resolver(vec![cluster_ip("fd00::5", https_port())], vec![], false);
        assert_eq!(
            v6.resolve(&svc_ref(443)).unwrap().authority(),
            "[fd00::5]:443"
        );

        let headless = resolver(vec![cluster_ip("None", https_port())], vec![], false);
        assert_eq!(
            err(headless.resolve(&svc_ref(443))),
            (
                ResolveReason::Unroutable,
                r#"cannot route to service with ClusterIP "None""#.into()
            )
        );

        let node_port = resolver(
            vec![service(
                "api",
                json!({"type": "NodePort", "clusterIP": "10.0.0.9", "ports": https_port()}),
            )],
            vec![],
            false,
        );
        assert_eq!(
            node_port.resolve(&svc_ref(443)).unwrap(),
            Endpoint::new("10.0.0.9", 443)
        );

        // Type defaults to ClusterIP when unset.
        let untyped = resolver(
            vec![service(
                "api",
                json!({"clusterIP": "10.0.0.7", "ports": https_port()}),
            )],
            vec![],
            false,
        );
        assert_eq!(
            untyped.resolve(&svc_ref(443)).unwrap(),
            Endpoint::new("10.0.0.7", 443)
        );
    }

    #[test]
    fn external_name_uses_the_api_service_port() {
        let r = resolver(
            vec![service(
                "api",
                json!({"type": "ExternalName", "externalName": "api.example.com"}),
            )],
            vec![],
            false,
        );
        assert_eq!(
            r.resolve(&svc_ref(9443)).unwrap(),
            Endpoint::new("api.example.com", 9443)
        );
        // kube checks ports and endpoints only for ClusterIP Services.
        assert_eq!(r.check_endpoints(&svc_ref(9443)), Ok(()));

        let routed = resolver(
            vec![service(
                "api",
                json!({"type": "ExternalName", "externalName": "x", "ports": https_port()}),
            )],
            vec![],
            true,
        );
        assert_eq!(
            err(routed.resolve(&svc_ref(443))),
            (
                ResolveReason::Unroutable,
                r#"unsupported service type "ExternalName""#.into()
            )
        );

        let odd = resolver(
            vec![service("api", json!({"type": "Weird"}))],
            vec![],
            false,
        );
        assert_eq!(
            err(odd.resolve(&svc_ref(443))).1,
            r#"unsupported service type "Weird""#
        );
    }

    #[test]
    fn availability_checks_follow_kube() {
        let svc = cluster_ip("10.96.0.5", https_port());
        let port = json!([{"name": "https", "port": 8443}]);

        let r = resolver(vec![svc.clone()], vec![], false);
        assert_eq!(
            err(r.check_endpoints(&svc_ref(443))),
            (
                ResolveReason::EndpointsNotFound,
                r#"cannot find endpointslices for service/api in "wardle""#.into()
            )
        );
        assert_eq!(
            err(r.check_endpoints(&svc_ref(80))).0,
            ResolveReason::ServicePortError
        );
        assert_eq!(
            err(resolver(vec![], vec![], false).check_endpoints(&svc_ref(443))).0,
            ResolveReason::ServiceNotFound
        );

        let missing = (
            ResolveReason::MissingEndpoints,
            r#"endpointslices for service/api in "wardle" have no addresses with port name "https""#.into(),
        );
        let not_ready = slice(
            "api-1",
            port.clone(),
            json!([{"addresses": ["10.1.0.1"], "conditions": {"ready": false}}]),
        );
        let r = resolver(vec![svc.clone()], vec![not_ready.clone()], false);
        assert_eq!(err(r.check_endpoints(&svc_ref(443))), missing);

        let wrong_port_name = slice(
            "api-2",
            json!([{"name": "metrics", "port": 9090}]),
            json!([ready("10.1.0.2")]),
        );
        let r = resolver(
            vec![svc.clone()],
            vec![not_ready.clone(), wrong_port_name],
            false,
        );
        assert_eq!(err(r.check_endpoints(&svc_ref(443))), missing);

        // `conditions.ready` unset counts as ready.
        let unknown_ready = slice("api-3", port, json!([{"addresses": ["10.1.0.3"]}]));
        let r = resolver(vec![svc], vec![not_ready, unknown_ready], false);
        assert_eq!(r.check_endpoints(&svc_ref(443)), Ok(()));
    }

    #[test]
    fn endpoint_routing_picks_ready_endpoints_on_the_named_port() {
        let svc = cluster_ip("None", https_port()); // headless is fine when routing to endpoints
        let slices = vec![
            slice(
                "api-a",
                json!([{"name": "https", "port": 8443}, {"name": "metrics", "port": 9090}]),
                json!([ready("10.1.0.1"), {"addresses": ["10.1.0.9"], "conditions": {"ready": false}}]),
            ),
            slice(
                "api-b",
                json!([{"name": "https", "port": 8443}]),
                json!([ready("10.1.0.2")]),
            ),
            slice(
                "api-c",
                json!([{"name": "metrics", "port": 9090}]),
                json!([ready("10.1.0.3")]),
            ),
        ];
        let r = resolver(vec![svc.clone()], slices, true);
        let mut seen: Vec<Endpoint> = (0..6).map(|_| r.resolve(&svc_ref(443)).unwrap()).collect();
        seen.sort_by(|a, b| a.host.cmp(&b.host));
        seen.dedup();
        assert_eq!(
            seen,
            [
                Endpoint::new("10.1.0.1", 8443),
                Endpoint::new("10.1.0.2", 8443)
            ]
        );

        let empty = resolver(
            vec![svc.clone()],
            vec![slice(
                "api-a",
                json!([{"name": "https", "port": 8443}]),
                json!([]),
            )],
            true,
        );
        assert_eq!(
            err(empty.resolve(&svc_ref(443))),
            (
                ResolveReason::MissingEndpoints,
                r#"no endpoints available for service "api""#.into()
            )
        );
        assert_eq!(
            err(empty.resolve(&svc_ref(444))).0,
            ResolveReason::ServicePortError
        );

        // Unnamed ports match each other.
        let unnamed = resolver(
            vec![cluster_ip(
                "10.0.0.1",
                json!([{"port": 443, "targetPort": 6443}]),
            )],
            vec![slice(
                "api-a",
                json!([{"port": 6443}]),
                json!([ready("10.1.0.4")]),
            )],
            true,
        );
        assert_eq!(
            unnamed.resolve(&svc_ref(443)).unwrap(),
            Endpoint::new("10.1.0.4", 6443)
        );
    }

    /// Waits, through change notifications only, until `ready` holds.
    async fn until(changes: &mut Changes, ready: impl Fn() -> bool) {
        while !ready() {
            tokio::time::timeout(std::time::Duration::from_secs(5), changes.changed())
                .await
                .expect("a change notification within 5s");
        }
    }

    #[tokio::test]
    async fn watchers_announce_every_change_after_applying_it() {
        type Events<K> =
            futures::channel::mpsc::UnboundedSender<Result<watcher::Event<K>, watcher::Error>>;
        fn send<K>(tx: &Events<K>, events: Vec<watcher::Event<K>>) {
            for e in events {
                tx.unbounded_send(Ok(e)).unwrap();
            }
        }
        let (services_tx, services_rx) = futures::channel::mpsc::unbounded();
        let (slices_tx, slices_rx) = futures::channel::mpsc::unbounded();
        let outage = || Arc::new(Outage::new("watch", "nothing changes"));
        let (kube, task) =
            KubeResolver::from_streams((services_rx, outage()), (slices_rx, outage()), false);
        let task = tokio::spawn(task);
        let statics: Arc<dyn ServiceResolver> = Arc::new(StaticResolver::new(&[]).unwrap());
        let chain = ChainResolver(vec![statics, Arc::new(kube)]);
        let mut changes = chain.changes();
        assert!(!chain.synced());

        send(
            &services_tx,
            list(vec![cluster_ip("10.96.0.5", https_port())]),
        );
        until(&mut changes, || chain.resolve(&svc_ref(443)).is_ok()).await;
        // The EndpointSlice cache is still loading.
        assert!(!chain.synced());
        assert_eq!(
            err(chain.check_endpoints(&svc_ref(443))).0,
            ResolveReason::EndpointsAccessError
        );

        send(&slices_tx, list(vec![]));
        until(&mut changes, || chain.synced()).await;
        assert_eq!(
            err(chain.check_endpoints(&svc_ref(443))).0,
            ResolveReason::EndpointsNotFound
        );

        let ready_slice = slice(
            "api-1",
            json!([{"name": "https", "port": 8443}]),
            json!([ready("10.1.0.1")]),
        );
        send(&slices_tx, vec![watcher::Event::Apply(ready_slice)]);
        until(&mut changes, || {
            chain.check_endpoints(&svc_ref(443)).is_ok()
        })
        .await;

        send(
            &services_tx,
            vec![watcher::Event::Delete(cluster_ip(
                "10.96.0.5",
                https_port(),
            ))],
        );
        until(&mut changes, || {
            chain
                .resolve(&svc_ref(443))
                .is_err_and(|e| e.reason == ResolveReason::ServiceNotFound)
        })
        .await;

        // Once the resolver and its watchers are gone nothing can change: the wait pends instead
        // of spinning on closed channels.
        drop((chain, services_tx, slices_tx));
        task.await.unwrap();
        let quiet =
            tokio::time::timeout(std::time::Duration::from_millis(100), changes.changed()).await;
        assert!(quiet.is_err());
        let none = tokio::time::timeout(
            std::time::Duration::from_millis(10),
            Changes::none().changed(),
        )
        .await;
        assert!(none.is_err());
    }
}
