//! Step 3, controllers: the loops that publish what the request path reads (routes, discovery,
//! trust, leadership, readiness, API Priority and Fairness), and the health checks they keep. Each runs in a task and a span of its own; what the router needs of them
//! is gathered in one [`Gateway`].
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

use std::sync::Arc;

use gateway_config::{ApiServiceSource, Config};
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
use crate::handlers::health::{self, Health};
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

impl Controllers {
    pub fn start(
        config: &Config,
        clients: &Clients,
        proxy_identity: ProxyIdentity,
        metrics: &Arc<Metrics>,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, StartError> {
        let mut health = Health::new();
        let supervisor = Supervisor::new(metrics);
        let published = metrics.clone();
        supervisor.restarting(
            &mut health,
            "loop/inflight-metrics",
            tracing::info_span!("inflight_metrics"),
            move || published.clone().publish_inflight(),
        );
        // Every run follows the receiver as it was at start: one restarted after a rotation it
        // missed sees that rotation as a change and applies it at once.
        let (core, identity) = (clients.core.clone(), proxy_identity.clone());
        supervisor.restarting(
            &mut health,
            "loop/proxy-identity",
            tracing::info_span!("proxy_identity"),
            move || core.clone().follow_proxy_identity(identity.clone()),
        );
        let core_check = Check::unhealthy("core server not checked yet");
        health.register("core-server", health::READY, core_check.clone());
        let shutdown_check = Check::healthy();
        health.register("shutdown", health::READY_ONLY, shutdown_check.clone());
        let (core_started_tx, core_started) = core_readiness::core_started();
        let routing = Routing::new();
        health.register(
            "apiservice-sources-synced",
            health::READY,
            routing.synced.clone(),
        );

        if config.trust.manage {
            let sources = trust::TrustSources {
                client_ca_file: config.authn.client_ca_file.clone(),
                proxy_client_ca_file: config.trust.proxy_client_ca_file.clone(),
                proxy_identity: proxy_identity.clone(),
            };
            if trust::has_anything_to_publish(&sources) {
                let (started, kube) = (core_started.clone(), clients.kube());
                supervisor.restarting(
                    &mut health,
                    "loop/authentication-configmap",
                    tracing::info_span!("authentication_configmap"),
                    move || {
                        started
                            .clone()
                            .then_run(trust::run(kube.clone(), sources.clone()))
                    },
                );
            }
        }

        // Asked for by validation only with the kube source, the one that writes status.
        let (leader, leadership) = match start_leader_election(
            config,
            clients,
            metrics,
            &core_started,
            (&supervisor, &mut health),
        ) {
            Some((leader, leadership)) => (Some(leader), Some(leadership)),
            None => (None, None),
        };
        let reachable = config.apiservices.readyz_reachable.then(|| {
            let check = Check::healthy();
            health.register(
                "aggregated-apiservice-reachable",
                health::READY_ONLY,
                check.clone(),
            );
            check
        });
        apiservices::start(
            &config.apiservices,
            proxy_identity,
            clients.kube(),
            routing.clone(),
            metrics.clone(),
            ApiServiceExtras {
                leadership,
                reachable,
                core_started: core_started.clone(),
                drain,
            },
            (&supervisor, &mut health),
        )?;

        let discovery = start_discovery(
            config,
            clients,
            &routing,
            metrics,
            (&supervisor, &mut health),
            core_started.clone(),
        );
        let flow_control = config.limits.priority_and_fairness.then(|| {
            start_flow_control(
                config,
                clients,
                metrics,
                (&supervisor, &mut health),
                core_started.clone(),
            )
        });
        let followers = core_release::Followers {
            discovery: discovery.clone(),
            flow_control: flow_control.clone(),
        };
        let core = clients.core.clone();
        supervisor.restarting(
            &mut health,
            "loop/core-release",
            tracing::info_span!("core_release"),
            move || core_release::run(core.clone(), core_started.clone(), followers.clone()),
        );
        let (core, started_tx) = (clients.core.clone(), core_started_tx);
        supervisor.restarting(
            &mut health,
            "loop/core-readiness",
            tracing::info_span!("core_readiness"),
            move || core_readiness::run(core.clone(), core_check.clone(), started_tx.clone()),
        );
        let gateway = Arc::new(Gateway {
            core: clients.core.clone(),
            health,
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

/// The Lease on the core that decides which replica writes APIService status, when configured.
fn start_leader_election(
    config: &Config,
    clients: &Clients,
    metrics: &Metrics,
    core_started: &CoreStarted,
    (supervisor, health): (&Supervisor, &mut Health),
) -> Option<(Leader, Leadership)> {
    let settings = config.leader_election.clone()?;
    let gauge = metrics
        .leader_election_master_status
        .with_label_values(&[settings.name.as_str()]);
    let check = Check::healthy();
    health.register(
        leader_election::CHECK_NAME,
        health::HEALTHZ_ONLY,
        check.clone(),
    );
    let (elector, leadership) = LeaderElector::new(clients.kube(), settings, gauge, check);
    let (stop, stop_rx) = watch::channel(false);
    let started = core_started.clone();
    let task = supervisor.restarting_until(
        health,
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
    config: &Config,
    clients: &Clients,
    metrics: &Metrics,
    (supervisor, health): (&Supervisor, &mut Health),
    core_started: CoreStarted,
) -> Arc<FlowControl> {
    let limits = &config.limits;
    let flow_control = Arc::new(FlowControl::new(
        limits
            .max_readonly_inflight
            .saturating_add(limits.max_mutating_inflight),
        limits.request_timeout / 4,
        metrics.registry(),
    ));
    flowcontrol::source::use_built_in(&flow_control);
    if matches!(config.apiservices.source, ApiServiceSource::Kube { .. }) {
        // The core's FlowSchemas are read once the core has started, as every other watch on it;
        // until then the built-in configuration is in force.
        let (kube, fc) = (clients.kube(), flow_control.clone());
        supervisor.restarting(
            health,
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
    supervisor.restarting(
        health,
        "loop/flowcontrol-borrowing",
        tracing::info_span!("flowcontrol_borrowing"),
        move || FlowControl::run_borrowing(fc.clone()),
    );
    flow_control
}

/// The discovery controller (merged discovery and OpenAPI v3) and the OpenAPI v2 loop, with the
/// readiness check that waits for the first discovery of the APIServices.
fn start_discovery(
    config: &Config,
    clients: &Clients,
    routing: &Arc<Routing>,
    metrics: &Arc<Metrics>,
    (supervisor, health): (&Supervisor, &mut Health),
    core_started: CoreStarted,
) -> Arc<DiscoveryCache> {
    let discovery = Arc::new(DiscoveryCache::new(routing.clone()));
    let synced = Check::unhealthy("discovery controller not started yet");
    health.register(readiness::CHECK_NAME, health::READY, synced.clone());
    let (cache, core, routes, m) = (
        discovery.clone(),
        clients.core.clone(),
        routing.clone(),
        metrics.clone(),
    );
    let (refresh, started) = (
        config.apiservices.discovery_refresh_interval,
        core_started.clone(),
    );
    // Started again, a controller fetches everything anew; the snapshot it replaces stays
    // served meanwhile.
    supervisor.restarting(
        health,
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
        metrics.clone(),
    );
    supervisor.restarting(
        health,
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
