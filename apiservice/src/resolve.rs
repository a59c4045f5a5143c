//! How the Service an APIService names becomes an address to dial.
//!
//! Mirrors kube-aggregator's resolvers (`pkg/apiserver/resolvers.go`, apiserver
//! `pkg/util/proxy/proxy.go`) and the Service/EndpointSlice checks of its remote availability
//! controller, with the same error texts, so what `kubectl get apiservices` shows reads as it does
//! on a real cluster:
//! - ClusterIP routing (default): the Service's `clusterIP` and the APIService's port;
//!   `ExternalName` Services resolve to their DNS name.
//! - Endpoint routing (`--enable-aggregator-routing`): a ready endpoint of the Service, picked
//!   per call, so load spreads over pods instead of riding one connection to the ClusterIP.
//! - Static services from the config file: fixed URLs for backends outside any cluster.
//!
//! Resolution sits on the request path, so it is synchronous and reads in-memory state only: the
//! kube resolver's caches are kept current by watchers running beside it. Whoever must react to
//! that state changing (the availability controller re-checks APIServices when their Service or
//! endpoints change, and waits for the caches before its first check) subscribes with
//! [`ServiceResolver::changes`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::{Stream, StreamExt};
use gateway_config::StaticService;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint as DiscoveryEndpoint, EndpointSlice};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::model::{ConditionStatus, ServiceRef};

/// Label EndpointSlices carry to name their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A resolved address. `host` is a DNS name or an IP literal, IPv6 without brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }

    /// `host:port`, with an IPv6 host in brackets (`[fd00::1]:443`), as URLs and `Host` need it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `https://<authority>`: aggregated servers always speak TLS.
    pub fn url(&self) -> String {
        format!("https://{}", self.authority())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.authority())
    }
}

/// Why a Service did not resolve, as kube-aggregator's availability condition names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResolveReason {
    /// The Service does not exist (condition `False`).
    ServiceNotFound,
    /// The Service could not be looked up, e.g. its cache has not synced (`Unknown`).
    ServiceAccessError,
    /// The Service has no port with the APIService's port number (`False`).
    ServicePortError,
    /// The EndpointSlices could not be looked up (`Unknown`).
    EndpointsAccessError,
    /// The Service has no EndpointSlices at all (`False`).
    EndpointsNotFound,
    /// No ready endpoint serves the Service port (`False`).
    MissingEndpoints,
    /// The Service exists but cannot be routed to: headless in ClusterIP mode, an unsupported
    /// type, no address. kube reports these from its discovery probe, as `FailedDiscoveryCheck`.
    Unroutable,
}

impl ResolveReason {
    /// The `reason` kube-aggregator writes on the `Available` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceNotFound => "ServiceNotFound",
            Self::ServiceAccessError => "ServiceAccessError",
            Self::ServicePortError => "ServicePortError",
            Self::EndpointsAccessError => "EndpointsAccessError",
            Self::EndpointsNotFound => "EndpointsNotFound",
            Self::MissingEndpoints => "MissingEndpoints",
            Self::Unroutable => "FailedDiscoveryCheck",
        }
    }

    /// The condition status kube uses with this reason: `Unknown` when we could not look, `False`
    /// when we looked and it is wrong.
    pub fn condition_status(self) -> ConditionStatus {
        match self {
            Self::ServiceAccessError | Self::EndpointsAccessError => ConditionStatus::Unknown,
            _ => ConditionStatus::False,
        }
    }
}

impl fmt::Display for ResolveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Service that did not resolve. `message` is kube's wording and goes into the condition as is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ResolveError {
    pub reason: ResolveReason,
    pub message: String,
}

impl ResolveError {
    pub fn new(reason: ResolveReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// `service/<name> in "<ns>" is not present`
    pub fn not_present(svc: &ServiceRef) -> Self {
        Self::new(
            ResolveReason::ServiceNotFound,
            format!("service/{} in {:?} is not present", svc.name, svc.namespace),
        )
    }

    fn cannot_check(reason: ResolveReason, svc: &ServiceRef, why: &str) -> Self {
        Self::new(
            reason,
            format!(
                "service/{} in {:?} cannot be checked due to: {why}",
                svc.name, svc.namespace
            ),
        )
    }

    fn not_listening(svc: &ServiceRef) -> Self {
        Self::new(
            ResolveReason::ServicePortError,
            format!(
                "service/{} in {:?} is not listening on port {}",
                svc.name, svc.namespace, svc.port
            ),
        )
    }

    fn unroutable(message: impl Into<String>) -> Self {
        Self::new(ResolveReason::Unroutable, message)
    }
}

/// Turns a Service reference into an address. Implementations read in-memory state only.
pub trait ServiceResolver: Send + Sync + 'static {
    /// The address to dial for one request or connection. Successive calls may return different
    /// addresses (round-robin over static URLs, endpoint routing).
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError>;

    /// kube-aggregator's availability pre-checks, before any discovery probe: the Service exists,
    /// and for a ClusterIP Service it listens on the port and has a ready endpoint for it. Routing
    /// does not depend on this (ClusterIP routing never looks at endpoints); availability does.
    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.resolve(svc).map(drop)
    }

    /// Whether the state this resolver reads is loaded. Before that, lookups answer
    /// `ServiceAccessError` rather than a misleading `ServiceNotFound`.
    fn synced(&self) -> bool {
        true
    }

    /// Fires after the state this resolver reads changed (including becoming synced). A
    /// resolver whose state never changes returns [`Changes::none`].
    fn changes(&self) -> Changes {
        Changes::none()
    }
}

/// A subscription to one or more resolvers' state changes. Changes are coalesced: one wake-up
/// after several changes, never a queue to work through.
#[derive(Debug, Default)]
pub struct Changes(Vec<watch::Receiver<()>>);

/// A subscription to a resolver that bumps `watch::Sender<()>` after each change.
impl From<watch::Receiver<()>> for Changes {
    fn from(rx: watch::Receiver<()>) -> Self {
        Self(vec![rx])
    }
}

impl Changes {
    /// Never fires.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Both subscriptions in one.
    pub fn merge(mut self, other: Changes) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Waits for a change not seen yet, and marks every pending change seen. Pends forever when
    /// nothing can change any more (no resolver with changing state, or all of them gone).
    pub async fn changed(&mut self) {
        loop {
            if self.0.is_empty() {
                return std::future::pending().await;
            }
            let waits = self.0.iter_mut().map(|rx| Box::pin(rx.changed()));
            let (result, index, _) = futures::future::select_all(waits).await;
            if result.is_ok() {
                self.mark_seen();
                return;
            }
            // That resolver's watchers are gone; its state is final.
            self.0.swap_remove(index);
        }
    }

    /// Forgets changes that happened so far (e.g. the rest of a burst after a debounce).
    pub fn mark_seen(&mut self) {
        for rx in &mut self.0 {
            rx.mark_unchanged();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Static services

/// A static service URL that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("services: {namespace}/{name}: url {url:?} {problem}")]
pub struct StaticServiceError {
    pub namespace: String,
    pub name: String,
    pub url: String,
    pub problem: &'static str,
}

struct StaticEntry {
    /// `None` matches any port.
    port: Option<u16>,
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
}

/// Services reached at fixed URLs from the config file (`services:`), for backends outside any
/// cluster. Several URLs for one service are used in turn.
pub struct StaticResolver {
    /// namespace → name → entries; nested so lookups borrow the `ServiceRef`'s strings.
    services: HashMap<String, HashMap<String, Vec<StaticEntry>>>,
}

impl StaticResolver {
    pub fn new(services: &[StaticService]) -> Result<Self, StaticServiceError> {
        let mut map: HashMap<String, HashMap<String, Vec<StaticEntry>>> = HashMap::new();
        for s in services {
            let endpoints = s
                .urls
                .iter()
                .map(|url| {
                    parse_https_url(url).map_err(|problem| StaticServiceError {
                        namespace: s.namespace.clone(),
                        name: s.name.clone(),
                        url: url.clone(),
                        problem,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            map.entry(s.namespace.clone())
                .or_default()
                .entry(s.name.clone())
                .or_default()
                .push(StaticEntry {
                    port: s.port,
                    endpoints,
                    next: AtomicUsize::new(0),
                });
        }
        Ok(Self { services: map })
    }

    /// The entry for exactly this port, else one that matches any port.
    fn entry(&self, svc: &ServiceRef) -> Option<&StaticEntry> {
        let entries = self.services.get(&svc.namespace)?.get(&svc.name)?;
        entries
            .iter()
            .find(|e| e.port == Some(svc.port))
            .or_else(|| entries.iter().find(|e| e.port.is_none()))
            .filter(|e| !e.endpoints.is_empty())
    }
}

impl ServiceResolver for StaticResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        let entry = self
            .entry(svc)
            .ok_or_else(|| ResolveError::not_present(svc))?;
        let i = entry.next.fetch_add(1, Ordering::Relaxed) % entry.endpoints.len();
        Ok(entry.endpoints[i].clone())
    }

    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.entry(svc)
            .map(drop)
            .ok_or_else(|| ResolveError::not_present(svc))
    }
}

/// `https://host[:port][/]` → endpoint (port 443 by default). Paths are refused: the proxy
/// forwards the client's path unchanged, so a path here would be silently ignored.
fn parse_https_url(url: &str) -> Result<Endpoint, &'static str> {
    let rest = url
        .strip_prefix("https://")
        .ok_or("must be an https:// URL")?;
    let authority = match rest.find(['/', '?', '#']) {
        Some(i) if &rest[i..] == "/" => &rest[..i],
        Some(_) => return Err("must not have a path, query or fragment"),
        None => rest,
    };
    if authority.contains('@') {
        return Err("must not contain user information");
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("has an unclosed '[' in its host")?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or("has junk after its IPv6 host")?),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err("needs brackets around an IPv6 host"),
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    let port = match port {
        None => 443,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err("has an invalid port"),
        },
    };
    Ok(Endpoint::new(host, port))
}

// ---------------------------------------------------------------------------------------------
// Chain

/// Asks each resolver in turn; the first that knows the Service answers. A resolver "does not
/// know" a Service when it says `ServiceNotFound`; any other error is final (the Service exists
/// there but is broken, and a later resolver must not paper over it). Typically
/// `[static, kube]`: fixed URLs from the config override the cluster.
pub struct ChainResolver(pub Vec<Arc<dyn ServiceResolver>>);

impl ChainResolver {
    fn first<T>(
        &self,
        svc: &ServiceRef,
        f: impl Fn(&dyn ServiceResolver) -> Result<T, ResolveError>,
    ) -> Result<T, ResolveError> {
        let mut last = None;
        for r in &self.0 {
            match f(r.as_ref()) {
                Err(e) if e.reason == ResolveReason::ServiceNotFound => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| ResolveError::not_present(svc)))
    }
}

impl ServiceResolver for ChainResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        self.first(svc, |r| r.resolve(svc))
    }

    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.first(svc, |r| r.check_endpoints(svc))
    }

    fn synced(&self) -> bool {
        self.0.iter().all(|r| r.synced())
    }

    fn changes(&self) -> Changes {
        self.0
            .iter()
            .fold(Changes::none(), |all, r| all.merge(r.changes()))
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes Services and EndpointSlices

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
        let service_events = watcher(Api::<Service>::all(client.clone()), Default::default())
            .default_backoff()
            // Only spec is read; annotations (last-applied-configuration) and managedFields are
            // most of a cached object's size.
            .modify(|s: &mut Service| {
                s.managed_fields_mut().clear();
                s.annotations_mut().clear();
            });
        let slice_events = watcher(Api::<EndpointSlice>::all(client), Default::default())
            .default_backoff()
            .modify(|s: &mut EndpointSlice| {
                s.managed_fields_mut().clear();
                s.annotations_mut().clear();
            });
        Self::from_streams(service_events, slice_events, endpoint_routing)
    }

    /// [`KubeResolver::start`] fed by any event streams (tests feed them directly).
    fn from_streams<S, E>(
        service_events: S,
        slice_events: E,
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
            "Service",
            service_events.reflect(services_writer),
            move |e| {
                if matches!(e, watcher::Event::InitDone) {
                    services_synced.store(true, Ordering::Release);
                }
                changed.send_replace(());
            },
        );

        let changed = Arc::clone(&resolver.changed);
        let mut slice_writer = SliceWriter::new(slices);
        let slices_task = drive_cache("EndpointSlice", slice_events, move |e| {
            slice_writer.apply_watcher_event(e);
            changed.send_replace(());
        });

        let task = async move {
            futures::join!(services_task, slices_task);
        };
        (resolver, task)
    }

    fn from_parts(
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
            // Counted, then walked again to the pick: no allocation per request.
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
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            candidates()
                .nth(i)
                .map(|(host, port)| Endpoint::new(host.clone(), port))
        });
        picked.ok_or_else(|| {
            ResolveError::new(
                ResolveReason::MissingEndpoints,
                format!("no endpoints available for service {:?}", r.name),
            )
        })
    }
}

impl ServiceResolver for KubeResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        if self.endpoint_routing {
            self.resolve_endpoint(svc)
        } else {
            self.resolve_cluster_ip(svc)
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

/// Runs one cache's watcher stream, handing every event to `apply` and logging errors. kube-rs'
/// default backoff spaces retries out, so an outage logs every few seconds, not in a loop.
async fn drive_cache<K, S>(what: &'static str, events: S, mut apply: impl FnMut(&watcher::Event<K>))
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut failing = false;
    let mut synced = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if matches!(event, watcher::Event::InitDone) {
                    if !synced {
                        info!(kind = what, "cache synced");
                        synced = true;
                    } else if failing {
                        info!(kind = what, "watch recovered");
                    }
                    failing = false;
                }
                apply(&event);
            }
            Err(error) => {
                failing = true;
                warn!(kind = what, %error, "watch failed; serving from the last known state and retrying with backoff");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// EndpointSlice index

type SlicesByName = BTreeMap<String, Arc<EndpointSlice>>;

/// EndpointSlices indexed by their Service, as kube's `NewEndpointSliceIndexerGetter` does: a
/// request looks at one Service's slices instead of scanning every slice in the cluster.
///
/// Readers take a short read lock (as kube-runtime's `Store` does); the one writer is the watcher
/// task. Relists are buffered and swapped in at `InitDone`, like the reflector.
#[derive(Default)]
struct SliceIndex {
    map: RwLock<SliceMap>,
    synced: AtomicBool,
}

#[derive(Default)]
struct SliceMap {
    /// namespace → service name → slice name → slice.
    by_service: HashMap<String, HashMap<String, SlicesByName>>,
    /// (namespace, slice name) → service name, to find a slice's old entry when it changes.
    owner: HashMap<(String, String), String>,
}

impl SliceIndex {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn with_service<R>(
        &self,
        ns: &str,
        svc: &str,
        f: impl FnOnce(Option<&SlicesByName>) -> R,
    ) -> R {
        // A poisoned lock only means a writer panicked mid-update; the map is still usable.
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        f(map.by_service.get(ns).and_then(|m| m.get(svc)))
    }
}

impl SliceMap {
    fn remove(&mut self, ns: &str, slice_name: &str) {
        let Some(svc) = self.owner.remove(&(ns.to_owned(), slice_name.to_owned())) else {
            return;
        };
        if let Some(services) = self.by_service.get_mut(ns) {
            if let Some(slices) = services.get_mut(&svc) {
                slices.remove(slice_name);
                if slices.is_empty() {
                    services.remove(&svc);
                }
            }
            if services.is_empty() {
                self.by_service.remove(ns);
            }
        }
    }

    fn insert(&mut self, slice: &EndpointSlice) {
        let (Some(ns), Some(name)) = (
            slice.metadata.namespace.as_deref(),
            slice.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.remove(ns, name);
        // Slices not managed for a Service (no label) are nobody's endpoints here.
        let Some(svc) = slice.labels().get(SERVICE_NAME_LABEL) else {
            return;
        };
        self.owner
            .insert((ns.to_owned(), name.to_owned()), svc.clone());
        self.by_service
            .entry(ns.to_owned())
            .or_default()
            .entry(svc.clone())
            .or_default()
            .insert(name.to_owned(), Arc::new(slice.clone()));
    }
}

/// The watcher side of a [`SliceIndex`].
struct SliceWriter {
    index: Arc<SliceIndex>,
    /// The relist in progress, swapped in at `InitDone`.
    buffer: Option<SliceMap>,
}

impl SliceWriter {
    fn new(index: Arc<SliceIndex>) -> Self {
        Self {
            index,
            buffer: None,
        }
    }

    fn apply_watcher_event(&mut self, event: &watcher::Event<EndpointSlice>) {
        match event {
            watcher::Event::Init => self.buffer = Some(SliceMap::default()),
            watcher::Event::InitApply(slice) => self
                .buffer
                .get_or_insert_with(SliceMap::default)
                .insert(slice),
            watcher::Event::InitDone => {
                let next = self.buffer.take().unwrap_or_default();
                *self
                    .index
                    .map
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = next;
                self.index.synced.store(true, Ordering::Release);
            }
            watcher::Event::Apply(slice) => self
                .index
                .map
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(slice),
            watcher::Event::Delete(slice) => {
                if let (Some(ns), Some(name)) = (
                    slice.metadata.namespace.as_deref(),
                    slice.metadata.name.as_deref(),
                ) {
                    self.index
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(ns, name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use serde_json::json;

    fn svc_ref(port: u16) -> ServiceRef {
        ServiceRef {
            namespace: "wardle".into(),
            name: "api".into(),
            port,
        }
    }

    fn service(name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "wardle", "name": name},
            "spec": spec,
        }))
        .unwrap()
    }

    fn cluster_ip(ip: &str, ports: serde_json::Value) -> Service {
        service(
            "api",
            json!({"type": "ClusterIP", "clusterIP": ip, "ports": ports}),
        )
    }

    fn https_port() -> serde_json::Value {
        json!([{"name": "https", "port": 443, "targetPort": 8443}])
    }

    fn slice(name: &str, ports: serde_json::Value, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "wardle", "name": name,
                         "labels": {SERVICE_NAME_LABEL: "api"}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn ready(ip: &str) -> serde_json::Value {
        json!({"addresses": [ip], "conditions": {"ready": true}})
    }

    fn list<K: Clone>(items: Vec<K>) -> Vec<watcher::Event<K>> {
        let mut events = vec![watcher::Event::Init];
        events.extend(items.into_iter().map(watcher::Event::InitApply));
        events.push(watcher::Event::InitDone);
        events
    }

    fn resolver(
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
        endpoint_routing: bool,
    ) -> KubeResolver {
        let mut writer = Writer::<Service>::default();
        for e in list(services) {
            writer.apply_watcher_event(&e);
        }
        let index = Arc::new(SliceIndex::default());
        let mut slice_writer = SliceWriter::new(Arc::clone(&index));
        for e in list(slices) {
            slice_writer.apply_watcher_event(&e);
        }
        KubeResolver::from_parts(
            writer.as_reader(),
            Arc::new(AtomicBool::new(true)),
            index,
            endpoint_routing,
        )
    }

    fn err(r: Result<impl fmt::Debug, ResolveError>) -> (ResolveReason, String) {
        let e = r.unwrap_err();
        (e.reason, e.message)
    }

    #[test]
    fn endpoint_authority_brackets_ipv6() {
        assert_eq!(Endpoint::new("10.0.0.1", 443).authority(), "10.0.0.1:443");
        assert_eq!(Endpoint::new("fd00::1", 443).authority(), "[fd00::1]:443");
        assert_eq!(
            Endpoint::new("fd00::1", 8443).url(),
            "https://[fd00::1]:8443"
        );
        assert_eq!(
            Endpoint::new("api.example.com", 1).to_string(),
            "api.example.com:1"
        );
    }

    #[test]
    fn reasons_map_to_kube_condition_reasons() {
        assert_eq!(ResolveReason::ServiceNotFound.as_str(), "ServiceNotFound");
        assert_eq!(ResolveReason::MissingEndpoints.as_str(), "MissingEndpoints");
        assert_eq!(ResolveReason::Unroutable.as_str(), "FailedDiscoveryCheck");
        assert_eq!(
            ResolveReason::ServiceAccessError.condition_status(),
            ConditionStatus::Unknown
        );
        assert_eq!(
            ResolveReason::ServicePortError.condition_status(),
            ConditionStatus::False
        );
    }

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

    #[test]
    fn slice_index_relists_swap_at_init_done() {
        let index = Arc::new(SliceIndex::default());
        let mut w = SliceWriter::new(Arc::clone(&index));
        let port = json!([{"name": "https", "port": 8443}]);
        let count =
            |index: &SliceIndex| index.with_service("wardle", "api", |s| s.map_or(0, |s| s.len()));

        for e in list(vec![
            slice("a", port.clone(), json!([])),
            slice("b", port.clone(), json!([])),
        ]) {
            w.apply_watcher_event(&e);
        }
        assert!(index.synced());
        assert_eq!(count(&index), 2);

        // Mid-relist, readers still see the previous complete state.
        w.apply_watcher_event(&watcher::Event::Init);
        w.apply_watcher_event(&watcher::Event::InitApply(slice(
            "c",
            port.clone(),
            json!([]),
        )));
        assert_eq!(count(&index), 2);
        w.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(count(&index), 1);

        // A slice relabelled to another Service moves; a deleted one goes.
        let mut moved = slice("c", port.clone(), json!([]));
        moved
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.into(), "other".into());
        w.apply_watcher_event(&watcher::Event::Apply(moved.clone()));
        assert_eq!(count(&index), 0);
        assert_eq!(
            index.with_service("wardle", "other", |s| s.map_or(0, |s| s.len())),
            1
        );
        w.apply_watcher_event(&watcher::Event::Delete(moved));
        assert!(index.map.read().unwrap().by_service.is_empty());
        assert!(index.map.read().unwrap().owner.is_empty());
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
        let (kube, task) = KubeResolver::from_streams(services_rx, slices_rx, false);
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

    fn static_service(port: Option<u16>, urls: &[&str]) -> StaticService {
        StaticService {
            namespace: "wardle".into(),
            name: "api".into(),
            port,
            urls: urls.iter().map(|u| u.to_string()).collect(),
        }
    }

    #[test]
    fn static_urls_rotate_and_port_none_matches_any() {
        let r = StaticResolver::new(&[
            static_service(None, &["https://a.example:8443", "https://[fd00::1]/"]),
            static_service(Some(9443), &["https://10.0.0.1"]),
        ])
        .unwrap();
        let picks: Vec<_> = (0..3).map(|_| r.resolve(&svc_ref(443)).unwrap()).collect();
        assert_eq!(
            picks,
            [
                Endpoint::new("a.example", 8443),
                Endpoint::new("fd00::1", 443),
                Endpoint::new("a.example", 8443)
            ]
        );
        assert_eq!(
            r.resolve(&svc_ref(9443)).unwrap(),
            Endpoint::new("10.0.0.1", 443)
        );
        assert_eq!(r.check_endpoints(&svc_ref(1)), Ok(()));
        let other = ServiceRef {
            name: "nope".into(),
            ..svc_ref(443)
        };
        assert_eq!(err(r.resolve(&other)).0, ResolveReason::ServiceNotFound);
    }

    #[test]
    fn static_url_errors() {
        for (url, problem) in [
            ("http://a", "must be an https:// URL"),
            ("https://a/apis", "must not have a path, query or fragment"),
            ("https://u@a", "must not contain user information"),
            ("https://fd00::1:443", "needs brackets around an IPv6 host"),
            ("https://[fd00::1", "has an unclosed '[' in its host"),
            ("https://a:0", "has an invalid port"),
            ("https://a:x", "has an invalid port"),
            ("https://:443", "has no host"),
        ] {
            let e = StaticResolver::new(&[static_service(None, &[url])])
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert_eq!(e.problem, problem, "{url}");
        }
    }

    #[test]
    fn chain_falls_through_only_on_not_found() {
        let statics: Arc<dyn ServiceResolver> = Arc::new(
            StaticResolver::new(&[static_service(Some(443), &["https://static"])]).unwrap(),
        );
        let kube: Arc<dyn ServiceResolver> = Arc::new(resolver(
            vec![
                cluster_ip("10.0.0.1", https_port()),
                service("other", json!({"clusterIP": "None", "ports": https_port()})),
            ],
            vec![],
            false,
        ));
        let chain = ChainResolver(vec![statics, kube]);
        assert!(ServiceResolver::synced(&chain));
        assert_eq!(chain.resolve(&svc_ref(443)).unwrap().host, "static");
        // Port 8443 is not in the static map: the cluster answers, with its error.
        assert_eq!(
            err(chain.resolve(&svc_ref(8443))).0,
            ResolveReason::ServicePortError
        );
        let other = ServiceRef {
            name: "other".into(),
            ..svc_ref(443)
        };
        assert_eq!(err(chain.resolve(&other)).0, ResolveReason::Unroutable);
        let gone = ServiceRef {
            name: "gone".into(),
            ..svc_ref(443)
        };
        assert_eq!(
            err(chain.resolve(&gone)).1,
            r#"service/gone in "wardle" is not present"#
        );
        assert_eq!(
            err(ChainResolver(vec![]).resolve(&gone)).0,
            ResolveReason::ServiceNotFound
        );
    }
}
