//! The route controller: one loop that turns the APIService set, the availability results and
//! the proxy client certificate into the next [`RouteTable`], and publishes it on [`Routing`].
//! Its key is the whole table: rebuilding it is cheap and keeps it consistent, so there is no
//! per-APIService queue here.

use std::collections::HashMap;
use std::sync::Arc;

use apiservice::model::{APIService, Backend, RegisteredAPIService, RemoteBackendSpec};
use apiservice::resolve::ServiceResolver;
use apiservice::route_table::{Availability, RouteTable};
use apiservice::source::{ApiServiceSet, Refusal};
use apiservice::traffic::{ConnectionSettings, TrafficPolicy};
use gateway_config::tls::Identity;
use tokio::sync::watch;

use super::{AvailabilityMap, RouteTarget, Routing, Target};
use crate::backend::pool::ServiceConnections;
use crate::backend::remote::{RemoteBackend, RemoteSetupError};
use crate::extensions::RoutedTo;
use crate::metrics::Metrics;
use crate::workqueue::Queue;

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
    /// The availability controller's queue, told of connection failures on real traffic.
    pub failures: Option<Queue<String>>,
    /// `--aggregator-reject-forwarding-redirect`.
    pub reject_forwarding_redirect: bool,
}

/// Builds route tables from APIService sets and availability results.
pub struct RouteController {
    routing: Arc<Routing>,
    sets: watch::Receiver<Option<Arc<ApiServiceSet>>>,
    availability: watch::Receiver<AvailabilityMap>,
    factory: BackendFactory,
    metrics: Arc<Metrics>,
    backends: HashMap<String, Arc<RemoteBackend>>,
    /// Connections per backend Service and trust, shared by the APIServices that name it.
    connections: HashMap<(RemoteBackendSpec, ConnectionSettings), Arc<ServiceConnections>>,
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
            connections: HashMap::new(),
            built_with: None,
            last_specs: Vec::new(),
            invalid: Vec::new(),
            invalid_files: Vec::new(),
        }
    }

    /// Rebuilds the table whenever an input changes, for as long as the process runs. An input
    /// whose sender is gone (the `none` source sends its one empty set and is done) never
    /// changes again, which is no reason to stop following the others.
    pub async fn run(mut self) {
        let (mut sets, mut availability, mut identity) = (true, true, true);
        loop {
            self.rebuild();
            tokio::select! {
                changed = self.sets.changed(), if sets => sets = changed.is_ok(),
                changed = self.availability.changed(), if availability => {
                    availability = changed.is_ok();
                }
                changed = self.factory.proxy_identity.changed(), if identity => {
                    identity = changed.is_ok();
                }
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// The connections for `spec`: those of an APIService with the same spec, in this table
    /// or the last one, or new ones.
    fn service_connections(
        &mut self,
        name: &str,
        spec: &RemoteBackendSpec,
        settings: &ConnectionSettings,
        identity: &Option<Arc<Identity>>,
    ) -> Result<Arc<ServiceConnections>, RemoteSetupError> {
        let key = (spec.clone(), *settings);
        if let Some(shared) = self.connections.get(&key) {
            return Ok(shared.clone());
        }
        let shared = Arc::new(RemoteBackend::service_connections(
            name,
            spec,
            settings,
            identity.as_deref(),
        )?);
        self.connections.insert(key, shared.clone());
        Ok(shared)
    }

    /// Builds the next table from the current APIService set, availability results and proxy
    /// identity, and publishes it. Backends and connections whose spec did not change are
    /// kept, so their connections and in-flight requests carry on.
    pub(super) fn rebuild(&mut self) {
        let identity = self.factory.proxy_identity.borrow_and_update().clone();
        let Some(set) = self.sets.borrow_and_update().clone() else {
            return;
        };
        self.follow_identity(&identity);
        let availability = self.availability.borrow_and_update().clone();
        let mut builder = RouteTable::builder();
        let mut specs = Vec::with_capacity(set.apiservices.len());
        let mut backends = HashMap::new();
        let mut connections = HashMap::new();
        let (mut invalid, invalid_files) = self.count_refusals(&set.refused);
        let last_specs = std::mem::take(&mut self.last_specs);
        let previous: HashMap<&str, &TrafficPolicy> = last_specs
            .iter()
            .map(|s| (s.name.as_str(), &s.traffic))
            .collect();
        for api in &set.apiservices {
            let Some(registered) = self.registered(api, &previous, &mut invalid) else {
                continue;
            };
            let target = match &registered.backend {
                Backend::Local => Target::Local,
                Backend::Remote(spec) => self.remote_target(&registered, spec, &identity),
            };
            if let (Target::Remote(b), Backend::Remote(spec)) = (&target, &registered.backend) {
                backends.insert(registered.name.clone(), b.clone());
                connections.insert(
                    (spec.clone(), registered.traffic.connections),
                    b.connections().clone(),
                );
            }
            let available = match &target {
                Target::Local => Availability::Available,
                _ => availability
                    .get(&registered.name)
                    .cloned()
                    .unwrap_or_else(|| Availability::of(api)),
            };
            let routed_to =
                RoutedTo::api_service(&registered.name, matches!(target, Target::Local));
            specs.push(registered.clone());
            builder.insert(registered, RouteTarget { target, routed_to }, available);
        }
        self.forget_fixed(invalid, invalid_files);
        let (table, duplicates) = builder.build();
        for d in duplicates {
            tracing::warn!(apiservice = %d.api_service.name, "{d}");
        }
        self.backends = backends;
        // Connections no APIService names any more close once their last request ends.
        self.connections = connections;
        let table_len = table.len();
        self.routing.publish(table);
        if !self.routing.is_synced() {
            tracing::info!(apiservices = table_len, "APIService routes installed");
            self.routing.synced.pass();
        }
        if specs != last_specs {
            tracing::debug!(apiservices = table_len, "APIService set changed");
        }
        self.last_specs = specs;
    }

    /// A rotated proxy client certificate: every remote backend and connection is built again.
    fn follow_identity(&mut self, identity: &Option<Arc<Identity>>) {
        if same_identity(identity, &self.built_with) {
            return;
        }
        if self.built_with.is_some() || !self.backends.is_empty() {
            tracing::info!(
                backends = self.backends.len(),
                "proxy client certificate changed; rebuilding remote backends"
            );
        }
        self.backends.clear();
        self.connections.clear();
        self.built_with = identity.clone();
    }

    /// The source refused these manifests and has logged why, naming the file: only count
    /// them here (names and files). A kept last good version is in the set and routed.
    fn count_refusals(&self, refused: &[Refusal]) -> (Vec<String>, Vec<String>) {
        let mut invalid = Vec::new();
        let mut invalid_files = Vec::new();
        for refused in refused {
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
        (invalid, invalid_files)
    }

    /// The validated APIService, its traffic settings logged when they changed; `None` (counted
    /// in `invalid`, logged once) when it does not validate.
    fn registered(
        &self,
        api: &APIService,
        previous: &HashMap<&str, &TrafficPolicy>,
        invalid: &mut Vec<String>,
    ) -> Option<RegisteredAPIService> {
        match RegisteredAPIService::try_from(api) {
            Ok(r) => {
                if previous.get(r.name.as_str()).copied() != Some(&r.traffic) {
                    log_traffic(&r);
                }
                Some(r)
            }
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
                None
            }
        }
    }

    /// A remote APIService's backend: the one of the last table when its spec is unchanged,
    /// else a new one on its Service's shared connections.
    fn remote_target(
        &mut self,
        registered: &RegisteredAPIService,
        spec: &RemoteBackendSpec,
        identity: &Option<Arc<Identity>>,
    ) -> Target {
        if let Some(b) = self
            .backends
            .get(&registered.name)
            .filter(|b| b.same_spec(spec, &registered.traffic.connections))
        {
            return Target::Remote(b.clone());
        }
        match self.service_connections(
            &registered.name,
            spec,
            &registered.traffic.connections,
            identity,
        ) {
            Ok(shared) => {
                let b = RemoteBackend::with_connections(
                    registered,
                    spec,
                    shared,
                    self.factory.resolver.clone(),
                    self.factory.drain.clone(),
                );
                let b = b.rejecting_forwarding_redirects(self.factory.reject_forwarding_redirect);
                Target::Remote(Arc::new(match &self.factory.failures {
                    Some(queue) => b.reporting_failures_to(queue.clone()),
                    None => b,
                }))
            }
            Err(e) => {
                tracing::warn!(apiservice = %registered.name, error = %e, "cannot build the backend transport");
                Target::Broken(e.to_string().into())
            }
        }
    }

    /// Removes the invalid-APIService and invalid-manifest series of those fixed since the last
    /// table, and remembers the current ones.
    fn forget_fixed(&mut self, invalid: Vec<String>, invalid_files: Vec<String>) {
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
    }
}

/// One line when an APIService's traffic annotations take effect (or are ignored), so an
/// operator sees that `console` is now long-running, or why it is not.
fn log_traffic(api: &RegisteredAPIService) {
    let traffic = &api.traffic;
    if !traffic.ignored.is_empty() {
        tracing::warn!(
            apiservice = %api.name,
            ignored = ?traffic.ignored,
            "APIService annotations ignored; fix them to take effect"
        );
    }
    if !traffic.long_running.is_empty() || traffic.connections != Default::default() {
        let c = &traffic.connections;
        tracing::info!(
            apiservice = %api.name,
            long_running_subresources = ?traffic.long_running.subresources,
            long_running_verbs = ?traffic.long_running.verbs,
            max_connections_per_endpoint = ?c.max_connections_per_endpoint,
            http2_ping_interval = ?c.ping_interval,
            http2_ping_timeout = ?c.ping_timeout,
            "APIService traffic settings"
        );
    }
}
