//! Step 3, controllers, for APIServices: where they come from (the core, a directory, nowhere),
//! how a Service becomes addresses (the core's EndpointSlices, a static map, or both), and the
//! route and availability controllers. Their only output is the routing snapshot (and, with
//! the kube source, status writes to the core).

use std::sync::Arc;

use apiservice::resolve::{ChainResolver, KubeResolver, ServiceResolver, StaticResolver};
use apiservice::source::SetReceiver;
use gateway_config::{ApiServiceConfig, ApiServiceSource};
use tokio::sync::watch;

use super::supervisor::Supervisor;
use super::StartError;
use crate::control::apiservices::remote_available_controller::{
    AvailabilitySettings, StatusWrites, AVAILABILITY_BACKOFF, UNAVAILABLE_RECHECK,
};
use crate::control::apiservices::{
    AvailabilityController, AvailabilityMap, BackendFactory, ProxyIdentity, RouteController,
    Routing,
};
use crate::control::core_readiness::CoreStarted;
use crate::control::leader_election::Leadership;
use crate::handlers::health::Health;
use crate::health_check::Check;
use crate::metrics::Metrics;

/// What the availability controller gets besides the APIService settings.
pub struct ApiServiceExtras {
    /// With leader election: status is written only while this replica leads.
    pub leadership: Option<Leadership>,
    /// The readiness check `aggregated-apiservice-reachable`, when asked for.
    pub reachable: Option<Arc<Check>>,
    /// The watches on the core (APIServices, Services, EndpointSlices) start once it has.
    pub core_started: CoreStarted,
    /// Flips at shutdown: the backends' long-running streams end.
    pub drain: watch::Receiver<bool>,
}

/// Starts the APIService source, Service resolution, and the route and availability
/// controllers. Their only output is the routing snapshot (and, with the kube source, status
/// writes to the core).
pub fn start(
    api: &ApiServiceConfig,
    proxy_identity: ProxyIdentity,
    kube: kube::Client,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    extras: ApiServiceExtras,
    (supervisor, health): (&Supervisor, &mut Health),
) -> Result<(), StartError> {
    let (set_tx, set_rx) = apiservice::source::channel();
    let (results_tx, results_rx) = watch::channel(AvailabilityMap::default());

    let kube_source = matches!(api.source, ApiServiceSource::Kube { .. });
    let started = extras.core_started;
    let resolver = resolver(api, &kube, kube_source, &started, (supervisor, health))?;
    start_source(api, &kube, set_tx, started, (supervisor, health));

    let status_writes = kube_source.then(|| StatusWrites {
        client: kube,
        stored: set_rx.clone(),
        leader: extras.leadership,
    });
    let settings = AvailabilitySettings {
        interval: api.availability_interval,
        backoff: AVAILABILITY_BACKOFF,
        unavailable_recheck: UNAVAILABLE_RECHECK,
        resolver: resolver.clone(),
        kube: status_writes,
        reachable: extras.reachable,
    };
    let availability =
        AvailabilityController::new(routing.clone(), results_tx, settings, metrics.clone());
    let factory = BackendFactory {
        proxy_identity,
        resolver,
        drain: extras.drain,
        failures: Some(availability.rechecks()),
        reject_forwarding_redirect: api.aggregator_reject_forwarding_redirect,
    };
    let inputs = (set_rx, results_rx);
    start_route_controller(routing, inputs, factory, metrics, (supervisor, health));
    // Its recheck queue is held by every backend the route controller built.
    supervisor.fatal(
        health,
        "loop/availability-controller",
        tracing::info_span!("availability_controller"),
        availability.run(),
    );
    Ok(())
}

/// The route controller: routes from the APIServices, their backends and their availability.
/// Started again, it builds every backend anew from the same inputs.
fn start_route_controller(
    routing: Arc<Routing>,
    (apiservices, availability): (SetReceiver, watch::Receiver<AvailabilityMap>),
    factory: BackendFactory,
    metrics: Arc<Metrics>,
    (supervisor, health): (&Supervisor, &mut Health),
) {
    supervisor.restarting(
        health,
        "loop/route-controller",
        tracing::info_span!("route_controller"),
        move || {
            RouteController::new(
                routing.clone(),
                apiservices.clone(),
                availability.clone(),
                factory.clone(),
                metrics.clone(),
            )
            .run()
        },
    );
}

/// How a Service becomes addresses: the static `services:` map, the core's Services and
/// EndpointSlices, or the static map first and then the core.
fn resolver(
    api: &ApiServiceConfig,
    kube: &kube::Client,
    kube_source: bool,
    core_started: &CoreStarted,
    (supervisor, health): (&Supervisor, &mut Health),
) -> Result<Arc<dyn ServiceResolver>, StartError> {
    let mut resolvers: Vec<Arc<dyn ServiceResolver>> = Vec::new();
    if !api.static_services.is_empty() {
        resolvers.push(Arc::new(StaticResolver::new(&api.static_services)?));
    }
    // Services and EndpointSlices are watched on the core when APIServices come from it, or when
    // no static map says where backends are.
    if kube_source || api.static_services.is_empty() {
        let (resolver, run) = KubeResolver::start(kube.clone(), api.endpoint_routing);
        // apiservice's futures carry their own spans (`service_resolver`, `apiservice_source`).
        // The resolver it feeds is the one the backends hold: it cannot be made again.
        supervisor.fatal(
            health,
            "loop/service-resolver",
            tracing::Span::current(),
            core_started.clone().then_run(run),
        );
        resolvers.push(Arc::new(resolver));
    }
    Ok(Arc::new(ChainResolver(resolvers)))
}

/// Where APIServices come from: a watch on the core, a directory of manifests, or nowhere.
fn start_source(
    api: &ApiServiceConfig,
    kube: &kube::Client,
    set_tx: apiservice::source::SetSender,
    core_started: CoreStarted,
    (supervisor, health): (&Supervisor, &mut Health),
) {
    let span = tracing::Span::current;
    match &api.source {
        ApiServiceSource::Kube { label_selector } => {
            let (kube, selector) = (kube.clone(), label_selector.clone());
            supervisor.restarting(health, "loop/apiservice-source", span(), move || {
                core_started.clone().then_run(apiservice::source::kube::run(
                    kube.clone(),
                    selector.clone(),
                    set_tx.clone(),
                ))
            });
        }
        ApiServiceSource::File { dir } => {
            let dir = dir.clone();
            supervisor.restarting(health, "loop/apiservice-source", span(), move || {
                apiservice::source::file::run(dir.clone(), set_tx.clone())
            });
        }
        ApiServiceSource::None => {
            let _ = set_tx.send(Some(Arc::default()));
        }
    }
}
