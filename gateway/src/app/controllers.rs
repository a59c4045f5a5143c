//! Step 3, controllers: the loops that publish what the request path reads (routes, discovery,
//! trust, leadership, readiness, API Priority and Fairness), and the health checks they keep.
//! Each runs in a task and a span of its own; what the router needs of them is gathered in one
//! [`Gateway`].
//!
//! The checks are registered in the order `/readyz?verbose` lists them: `core-server`,
//! `shutdown`, `apiservice-sources-synced`, `leaderElection` (`/healthz` only, with leader
//! election), `aggregated-apiservice-reachable` (when asked for), and the discovery controller's;
//! among them, one `loop/<name>` per loop, in the order the loops start: every loop runs under
//! the [`Supervisor`], which fails its check while it is down and starts it again.
//!
//! The loops that list and watch on the core (the APIService source, Service resolution, leader
//! election, the trust ConfigMap, discovery and OpenAPI) make their first request only once the
//! core's `/readyz` has passed ([`CoreStarted`]): a kube-apiserver that is still starting refuses
//! them with 403.

use std::path::PathBuf;
use std::sync::Arc;

use gateway_config::{ApiServiceConfig, ApiServiceSource, LeaderElection, Limits, TrustConfig};
use gateway_flowcontrol::FlowControl;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::apiservices::{self, ApiServiceExtras};
use super::clients::Clients;
use super::supervisor::Supervisor;
use super::StartError;
use crate::control::apiservices::{ProxyIdentity, Routing};
use crate::control::core_readiness::{self, CoreStarted};
use crate::control::core_release;
use crate::control::discovery::openapi_v2::OpenApiV2Controller;
use crate::control::discovery::{readiness, DiscoveryCache, DiscoveryController};
use crate::control::flowcontrol;
use crate::control::leader_election::{self, LeaderElector, Leadership};
use crate::control::trust;
use crate::handlers::health::{self, Endpoint, Health};
use crate::handlers::router::Gateway;
use crate::health_check::Check;
use crate::metrics::Metrics;

pub struct Controllers {
    /// What the router reads on every request.
    pub gateway: Arc<Gateway>,
    /// Fails at shutdown: `/readyz` turns unready before the listener stops.
    pub shutdown_check: Arc<Check>,
    /// The leader elector, when APIService status is written by one replica only.
    pub leader: Option<Leader>,
}

/// A running leader elector and how to make it release the Lease.
pub struct Leader {
    pub stop: watch::Sender<bool>,
    pub task: JoinHandle<()>,
}

/// What every loop is started with: the supervisor that owns it, the checks it registers (in
/// `/readyz?verbose` order), the signal that the core has started (the loops on the core wait for
/// it) and the metrics.
struct Loops {
    supervisor: Supervisor,
    health: Health,
    core_started: CoreStarted,
    metrics: Arc<Metrics>,
}

impl Loops {
    /// The loops' supervisor and checks, and the sender that tells them the core has started.
    fn new(metrics: &Arc<Metrics>) -> (Self, watch::Sender<bool>) {
        let (core_started_tx, core_started) = core_readiness::core_started();
        let loops = Self {
            supervisor: Supervisor::new(metrics),
            health: Health::new(),
            core_started,
            metrics: metrics.clone(),
        };
        (loops, core_started_tx)
    }

    /// Registers `check` as `name` on `endpoints`; the check, for its owner.
    fn check(
        &mut self,
        name: &'static str,
        endpoints: &'static [Endpoint],
        check: Arc<Check>,
    ) -> Arc<Check> {
        self.health.register(name, endpoints, check.clone());
        check
    }

    /// The supervisor and the checks, as the loops of other files take them.
    fn supervised(&mut self) -> (&Supervisor, &mut Health) {
        (&self.supervisor, &mut self.health)
    }
}

/// What the controllers take of the configuration, each part as its flags name it.
pub struct ControllerSettings<'a> {
    pub apiservices: &'a ApiServiceConfig,
    pub trust: &'a TrustConfig,
    /// `--client-ca-file`, published in the trust ConfigMap.
    pub client_ca_file: Option<PathBuf>,
    pub leader_election: Option<LeaderElection>,
    pub limits: &'a Limits,
}

impl Controllers {
    pub fn start(
        settings: ControllerSettings<'_>,
        clients: &Clients,
        proxy_identity: ProxyIdentity,
        metrics: &Arc<Metrics>,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, StartError> {
        let (mut loops, core_started_tx) = Loops::new(metrics);
        let unchecked = Check::unhealthy("core server not checked yet");
        let core_check = loops.check("core-server", health::READY, unchecked);
        let shutdown_check = loops.check("shutdown", health::READY_ONLY, Check::healthy());
        let routing = Routing::new();
        let synced = routing.synced.clone();
        loops.check("apiservice-sources-synced", health::READY, synced);

        start_publishers(clients, &proxy_identity, &mut loops);
        let trust = (settings.trust, settings.client_ca_file);
        start_trust(trust, clients, &proxy_identity, &mut loops);
        // Asked for by validation only with the kube source, the one that writes status.
        let (leader, leadership) =
            start_leader_election(settings.leader_election, clients, &mut loops).unzip();
        let extras = ApiServiceExtras {
            leadership,
            reachable: None,
            core_started: loops.core_started.clone(),
            drain,
        };
        let routes = (&routing, extras);
        let api = settings.apiservices;
        start_apiservices(api, clients, proxy_identity, routes, &mut loops)?;

        let refresh = api.discovery_refresh_interval;
        let discovery = start_discovery(refresh, clients, &routing, &mut loops);
        let source = &api.source;
        let flow_control = (settings.limits.priority_and_fairness)
            .then(|| start_flow_control(settings.limits, source, clients, &mut loops));
        let followers = core_release::Followers {
            discovery: discovery.clone(),
            flow_control: flow_control.clone(),
        };
        let readiness = (core_check, core_started_tx);
        start_core_loops(clients, followers, readiness, &mut loops);
        let gateway = Arc::new(Gateway {
            core: clients.core.clone(),
            health: loops.health,
            metrics: metrics.clone(),
            routing,
            discovery,
            flow_control,
        });
        Ok(Self {
            gateway,
            shutdown_check,
            leader,
        })
    }
}

/// The APIService source, the route and availability controllers and Service resolution
/// (`apiservices::start`), with the `aggregated-apiservice-reachable` check when asked for.
fn start_apiservices(
    api: &ApiServiceConfig,
    clients: &Clients,
    proxy_identity: ProxyIdentity,
    (routing, mut extras): (&Arc<Routing>, ApiServiceExtras),
    loops: &mut Loops,
) -> Result<(), StartError> {
    extras.reachable = api.readyz_reachable.then(|| {
        let name = "aggregated-apiservice-reachable";
        loops.check(name, health::READY_ONLY, Check::healthy())
    });
    let (kube, metrics) = (clients.kube(), loops.metrics.clone());
    let (supervisor, health) = loops.supervised();
    let supervised = (supervisor, health);
    apiservices::start(
        api,
        proxy_identity,
        kube,
        routing.clone(),
        metrics,
        extras,
        supervised,
    )
}

/// The loops that publish what clients and metrics read: the in-flight gauge's one-second
/// publisher, and the proxy client certificate handed to the core's client as it rotates.
fn start_publishers(clients: &Clients, proxy_identity: &ProxyIdentity, loops: &mut Loops) {
    let published = loops.metrics.clone();
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/inflight-metrics",
        tracing::info_span!("inflight_metrics"),
        move || published.clone().publish_inflight(),
    );
    // Every run follows the receiver as it was at start: one restarted after a rotation it
    // missed sees that rotation as a change and applies it at once.
    let (core, identity) = (clients.core.clone(), proxy_identity.clone());
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/proxy-identity",
        tracing::info_span!("proxy_identity"),
        move || core.clone().follow_proxy_identity(identity.clone()),
    );
}

/// `kube-system/extension-apiserver-authentication` kept up to date with the gateway's client
/// CA and proxy identity, once the core has started, when it is managed and there is anything
/// to publish.
fn start_trust(
    (trust, client_ca_file): (&TrustConfig, Option<PathBuf>),
    clients: &Clients,
    proxy_identity: &ProxyIdentity,
    loops: &mut Loops,
) {
    if !trust.manage {
        return;
    }
    let sources = trust::TrustSources {
        client_ca_file,
        proxy_client_ca_file: trust.proxy_client_ca_file.clone(),
        proxy_identity: proxy_identity.clone(),
    };
    if !trust::has_anything_to_publish(&sources) {
        return;
    }
    let (kube, core_started) = (clients.kube(), loops.core_started.clone());
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/authentication-configmap",
        tracing::info_span!("authentication_configmap"),
        move || {
            core_started
                .clone()
                .then_run(trust::run(kube.clone(), sources.clone()))
        },
    );
}

/// The loops that watch the core itself: its readiness (which starts every loop waiting for
/// it) and its release (which the discovery cache and flow control follow).
fn start_core_loops(
    clients: &Clients,
    followers: core_release::Followers,
    (core_check, started_tx): (Arc<Check>, watch::Sender<bool>),
    loops: &mut Loops,
) {
    let (core, core_started) = (clients.core.clone(), loops.core_started.clone());
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/core-release",
        tracing::info_span!("core_release"),
        move || core_release::run(core.clone(), core_started.clone(), followers.clone()),
    );
    let core = clients.core.clone();
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/core-readiness",
        tracing::info_span!("core_readiness"),
        move || core_readiness::run(core.clone(), core_check.clone(), started_tx.clone()),
    );
}

/// The Lease on the core that decides which replica writes APIService status, when configured.
fn start_leader_election(
    settings: Option<LeaderElection>,
    clients: &Clients,
    loops: &mut Loops,
) -> Option<(Leader, Leadership)> {
    let settings = settings?;
    let gauge = loops
        .metrics
        .leader_election_master_status
        .with_label_values(&[settings.name.as_str()]);
    let check = loops.check(
        leader_election::CHECK_NAME,
        health::HEALTHZ_ONLY,
        Check::healthy(),
    );
    let (elector, leadership) = LeaderElector::new(clients.kube(), settings, gauge, check);
    let (stop, stop_rx) = watch::channel(false);
    let started = loops.core_started.clone();
    let task = loops.supervisor.restarting_until(
        &mut loops.health,
        "loop/leader-election",
        tracing::info_span!("leader_election"),
        Some(stop_rx.clone()),
        move || {
            started
                .clone()
                .then_run(elector.restarted().run(stop_rx.clone()))
        },
    );
    Some((Leader { stop, task }, leadership))
}

/// API Priority and Fairness: kube's built-in configuration at once, then, with the kube
/// APIService source, the core's FlowSchemas and PriorityLevelConfigurations as they change (the
/// `file` and `none` sources keep the built-in one: their core need not be kube-apiserver); and
/// the loop that lends seats between levels.
fn start_flow_control(
    limits: &Limits,
    source: &ApiServiceSource,
    clients: &Clients,
    loops: &mut Loops,
) -> Arc<FlowControl> {
    let flow_control = Arc::new(FlowControl::new(
        limits
            .max_requests_inflight
            .saturating_add(limits.max_mutating_requests_inflight),
        limits.request_timeout / 4,
        loops.metrics.registry(),
    ));
    flowcontrol::source::use_built_in(&flow_control);
    if matches!(source, ApiServiceSource::Kube { .. }) {
        // The core's FlowSchemas are read once the core has started, as every other watch on it;
        // until then the built-in configuration is in force.
        let (kube, fc) = (clients.kube(), flow_control.clone());
        let core_started = loops.core_started.clone();
        loops.supervisor.restarting(
            &mut loops.health,
            "loop/flowcontrol-source",
            tracing::info_span!("flowcontrol_source"),
            move || {
                core_started
                    .clone()
                    .then_run(flowcontrol::source::run(kube.clone(), fc.clone()))
            },
        );
    }
    let fc = Arc::downgrade(&flow_control);
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/flowcontrol-borrowing",
        tracing::info_span!("flowcontrol_borrowing"),
        move || FlowControl::run_borrowing(fc.clone()),
    );
    flow_control
}

/// The discovery controller (merged discovery and OpenAPI v3) and the OpenAPI v2 loop, with the
/// readiness check that waits for the first discovery of the APIServices.
fn start_discovery(
    refresh: std::time::Duration,
    clients: &Clients,
    routing: &Arc<Routing>,
    loops: &mut Loops,
) -> Arc<DiscoveryCache> {
    let discovery = Arc::new(DiscoveryCache::new(routing.clone()));
    let not_started = Check::unhealthy("discovery controller not started yet");
    let synced = loops.check(readiness::CHECK_NAME, health::READY, not_started);
    let (cache, core, routes, m) = (
        discovery.clone(),
        clients.core.clone(),
        routing.clone(),
        loops.metrics.clone(),
    );
    let started = loops.core_started.clone();
    // Started again, a controller fetches everything anew; the snapshot it replaces stays
    // served meanwhile.
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/discovery-controller",
        tracing::info_span!("discovery_controller"),
        move || {
            let controller = DiscoveryController::new(
                cache.clone(),
                core.clone(),
                routes.clone(),
                m.clone(),
                refresh,
                synced.clone(),
            );
            started.clone().then_run(controller.run())
        },
    );
    let (cache, core, routes, m) = (
        discovery.clone(),
        clients.core.clone(),
        routing.clone(),
        loops.metrics.clone(),
    );
    let core_started = loops.core_started.clone();
    loops.supervisor.restarting(
        &mut loops.health,
        "loop/openapi-v2",
        tracing::info_span!("openapi_v2"),
        move || {
            let openapi_v2 =
                OpenApiV2Controller::new(cache.clone(), core.clone(), routes.clone(), m.clone());
            core_started.clone().then_run(openapi_v2.run())
        },
    );
    discovery
}
