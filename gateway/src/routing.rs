//! The routing snapshot and the two controllers that publish it. The request path only ever
//! `load`s an immutable `RouteTable`; the route controller builds the next one whenever the set
//! of APIServices or their availability changes, and the availability controller probes remote
//! backends and (with the kube source) writes the `Available` condition back to the core.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apiservice::model::{Backend, RegisteredAPIService};
use apiservice::resolve::{ResolveReason, ServiceResolver};
use apiservice::route::{Availability, RouteTable};
use apiservice::source::ApiServiceSet;
use arc_swap::ArcSwap;
use gateway_config::tls::Identity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIServiceCondition;
use tokio::sync::{watch, Notify};

use crate::backend::remote::RemoteBackend;
use crate::health::Check;
use crate::metrics::Metrics;
use crate::stack::RoutedTo;

/// What a route leads to.
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
    /// Wakes the availability controller when the APIService specs changed.
    specs_changed: Notify,
}

impl Routing {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            table: ArcSwap::from_pointee(RouteTable::empty()),
            synced: Check::unhealthy("APIService source has not completed its first sync"),
            specs_changed: Notify::new(),
        })
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
    sets: watch::Receiver<Option<ApiServiceSet>>,
    availability: watch::Receiver<AvailabilityMap>,
    factory: BackendFactory,
    metrics: Arc<Metrics>,
    backends: HashMap<String, Arc<RemoteBackend>>,
    /// The proxy identity the backends in `backends` were built with.
    built_with: Option<Arc<Identity>>,
    last_specs: Vec<RegisteredAPIService>,
    invalid: Vec<String>,
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
        sets: watch::Receiver<Option<ApiServiceSet>>,
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
        let mut specs = Vec::with_capacity(set.len());
        let mut backends = HashMap::new();
        let mut invalid = Vec::new();
        for api in set.iter() {
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
                    invalid.push(name);
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
        let (table, duplicates) = builder.build();
        for d in duplicates {
            tracing::warn!(apiservice = %d.api_service.name, "{d}");
        }
        self.backends = backends;
        let table_len = table.len();
        self.routing.table.store(Arc::new(table));
        if !self.routing.is_synced() {
            tracing::info!(apiservices = table_len, "APIService routes installed");
            self.routing.synced.pass();
        }
        if specs != self.last_specs {
            tracing::debug!(apiservices = table_len, "APIService set changed");
            self.last_specs = specs;
            self.routing.specs_changed.notify_one();
        }
    }
}

/// Probes remote APIServices on every spec change and every interval.
pub struct AvailabilityController {
    pub routing: Arc<Routing>,
    pub results: watch::Sender<AvailabilityMap>,
    pub interval: Duration,
    pub resolver: Arc<dyn ServiceResolver>,
    /// Present with the kube source: conditions are written back through the status subresource.
    pub kube: Option<kube::Client>,
    pub metrics: Arc<Metrics>,
}

impl AvailabilityController {
    pub async fn run(self) {
        let mut current: HashMap<String, Availability> = HashMap::new();
        let mut written: HashMap<String, Availability> = HashMap::new();
        loop {
            if self.routing.is_synced() {
                let table = self.routing.load_full();
                let probes = table.routes().map(|route| {
                    let resolver = self.resolver.clone();
                    async move {
                        (
                            route.api_service.name.clone(),
                            check(route, resolver.as_ref()).await,
                        )
                    }
                });
                let results: HashMap<String, Availability> = futures::future::join_all(probes)
                    .await
                    .into_iter()
                    .collect();
                self.record(&current, &results);
                if let Some(client) = &self.kube {
                    for route in table.routes() {
                        let name = &route.api_service.name;
                        let Some(result) = results.get(name) else {
                            continue;
                        };
                        if written.get(name) == Some(result) {
                            continue;
                        }
                        let condition = condition(result, route.api_service.is_local());
                        match apiservice::source::kube::write_available_condition(
                            client, name, condition,
                        )
                        .await
                        {
                            Ok(()) => {
                                written.insert(name.clone(), result.clone());
                            }
                            Err(e) => {
                                tracing::warn!(apiservice = %name, error = %e, "cannot write the Available condition")
                            }
                        }
                    }
                    written.retain(|name, _| results.contains_key(name));
                }
                if results != current {
                    current = results.clone();
                    let _ = self.results.send(Arc::new(results));
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = self.routing.specs_changed.notified() => {}
            }
        }
    }

    /// kube-aggregator's metrics: the gauge per APIService, and a counter per transition to
    /// unavailable.
    fn record(
        &self,
        before: &HashMap<String, Availability>,
        after: &HashMap<String, Availability>,
    ) {
        for (name, now) in after {
            let unavailable = !now.is_available();
            self.metrics
                .unavailable_apiservice
                .with_label_values(&[name])
                .set(unavailable as i64);
            let was_unavailable = before
                .get(name)
                .is_some_and(|b| matches!(b, Availability::Unavailable { .. }));
            if let Availability::Unavailable { reason, message } = now {
                if !was_unavailable {
                    let reason = if reason.is_empty() {
                        "UnknownReason"
                    } else {
                        reason.as_str()
                    };
                    self.metrics
                        .unavailable_apiservice_total
                        .with_label_values(&[name, reason])
                        .inc();
                    tracing::warn!(apiservice = %name, reason, message = %message, "APIService unavailable");
                }
            } else if was_unavailable || !before.contains_key(name) {
                tracing::info!(apiservice = %name, "APIService available");
            }
        }
        for name in before.keys().filter(|n| !after.contains_key(*n)) {
            let _ = self
                .metrics
                .unavailable_apiservice
                .remove_label_values(&[name]);
        }
    }
}

/// One availability decision: the Service and its endpoints first, then discovery.
async fn check(
    route: &apiservice::route::Route<RouteTarget>,
    resolver: &dyn ServiceResolver,
) -> Availability {
    let unavailable = |reason: &str, message: String| Availability::Unavailable {
        reason: reason.into(),
        message,
    };
    match &route.backend.target {
        Target::Local => Availability::Available,
        // The transport could not be built (e.g. a bad caBundle): the check fails before it starts.
        Target::Broken(why) => unavailable("FailedDiscoveryCheck", why.to_string()),
        Target::Remote(backend) => {
            let api = &route.api_service;
            if let Some(svc) = api.service() {
                if let Err(e) = resolver.check_endpoints(svc) {
                    return unavailable(e.reason.as_str(), e.message);
                }
            }
            match backend.probe(&api.group, &api.version).await {
                Ok(()) => Availability::Available,
                Err(message) => unavailable("FailedDiscoveryCheck", message),
            }
        }
    }
}

fn condition(a: &Availability, local: bool) -> APIServiceCondition {
    let (status, reason, message) = match a {
        Availability::Available if local => (
            "True",
            "Local",
            "Local APIServices are always available".to_owned(),
        ),
        Availability::Available => ("True", "Passed", "all checks passed".to_owned()),
        // kube-aggregator says Unknown when it could not look (the Service or its endpoints
        // could not be read) and False when it looked and found something wrong.
        Availability::Unavailable { reason, message }
            if [
                ResolveReason::ServiceAccessError,
                ResolveReason::EndpointsAccessError,
            ]
            .iter()
            .any(|r| r.as_str() == reason) =>
        {
            ("Unknown", reason.as_str(), message.clone())
        }
        Availability::Unavailable { reason, message } => {
            ("False", reason.as_str(), message.clone())
        }
        Availability::Unknown => ("Unknown", "Unknown", String::new()),
    };
    APIServiceCondition {
        type_: "Available".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(reason: &str) -> Availability {
        Availability::Unavailable {
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn conditions_use_kube_aggregators_statuses() {
        let c = condition(&Availability::Available, true);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("Local"))
        );
        let c = condition(&Availability::Available, false);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("Passed"))
        );
        // Could not look: Unknown. Looked and found it wrong: False.
        assert_eq!(
            condition(&unavailable("ServiceAccessError"), false).status,
            "Unknown"
        );
        assert_eq!(
            condition(&unavailable("EndpointsAccessError"), false).status,
            "Unknown"
        );
        assert_eq!(
            condition(&unavailable("ServiceNotFound"), false).status,
            "False"
        );
        assert_eq!(
            condition(&unavailable("FailedDiscoveryCheck"), false).status,
            "False"
        );
    }
}
