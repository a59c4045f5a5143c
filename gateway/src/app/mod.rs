//! Start-up and shutdown: builds the pieces from a validated `Config`, wires the tower stack,
//! serves, and on SIGTERM/SIGINT shuts down the way kube-apiserver does (readiness fails at once,
//! keep serving for the delay, stop accepting, close long-running streams, let ordinary requests
//! finish within the timeout).

use std::sync::Arc;

use arc_swap::ArcSwap;
use gateway_config::tls::{self, ServerTlsSettings};
use gateway_config::Config;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tracing::Instrument;

use apiservice::resolve::{ChainResolver, KubeResolver, ServiceResolver, StaticResolver};
use gateway_config::tls::Identity;
use gateway_config::ApiServiceSource;

use crate::backend::core::{CoreBackend, CoreSetupError};
use crate::backend::kube_client;
use crate::control::discovery::{DiscoveryCache, DiscoveryController};
use crate::control::leader_election::LeaderElector;
use crate::control::routing::availability::{
    AvailabilitySettings, StatusWrites, AVAILABILITY_BACKOFF, UNAVAILABLE_RECHECK,
};
use crate::control::routing::{
    AvailabilityController, AvailabilityMap, BackendFactory, ProxyIdentity, RouteController,
    Routing,
};
use crate::front::listener::{self, ListenerSettings};
use crate::front::stack::{
    access_log::AccessLog,
    audit::{Audit, AuditCapture, AuditSink},
    authn::Authn,
    authz::{Authorizer, Authz},
    limits::LimitsService,
    rescue::Rescue,
    timeout::TimeoutService,
    trace::{RequestTracer, Trace},
    with_request_info::RequestInfoService,
};
use crate::handlers::health::{self, Health};
use crate::handlers::router::{Gateway, Router};
use crate::health_check::Check;
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("serving TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Core(#[from] CoreSetupError),
    #[error("services: {0}")]
    StaticServices(#[from] apiservice::resolve::StaticServiceError),
    #[error("proxy client certificate: {0}")]
    ProxyIdentity(tls::TlsError),
    #[error("watching certificate files: {0}")]
    Watch(#[from] notify::Error),
    #[error(transparent)]
    Tracing(#[from] crate::otel::TracingSetupError),
    #[error("audit log {path}: {source}")]
    Audit {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub async fn run(config: Config) -> Result<(), StartError> {
    tls::install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    for (kind, limit) in [
        ("readOnly", config.limits.max_readonly_inflight),
        ("mutating", config.limits.max_mutating_inflight),
    ] {
        if limit > 0 {
            metrics
                .inflight_limit
                .with_label_values(&[kind])
                .set(limit.into());
        }
    }

    let (serving, generated) = tls::ensure_serving_cert(&config.serving)?;
    let mut client_ca_files = Vec::new();
    client_ca_files.extend(config.authn.client_ca_file.clone());
    client_ca_files.extend(config.authn.requestheader_client_ca_file.clone());
    let tls_settings = ServerTlsSettings {
        serving: serving.clone(),
        client_ca_files,
        tls13_only: config.serving.tls13_only,
        cipher_suites: config.serving.cipher_suites.clone(),
    };
    let (first_tls, chain) = tls_settings.build()?;
    let (serial, not_after) = describe_leaf(&chain);
    record_expiry(&metrics, SERVING, &chain);
    let server_tls = Arc::new(ArcSwap::new(first_tls));
    let _tls_watch = {
        let server_tls = server_tls.clone();
        let settings = tls_settings.clone();
        let metrics = metrics.clone();
        tls::watch_files(
            &settings.files(),
            config.serving.cert_reload_interval,
            move || match settings.build() {
                Ok((cfg, chain)) => {
                    server_tls.store(cfg);
                    record_expiry(&metrics, SERVING, &chain);
                    let (serial, not_after) = describe_leaf(&chain);
                    tracing::info!(%serial, %not_after, "serving TLS material reloaded");
                }
                Err(e) => tracing::error!(error = %e, "keeping the previous serving TLS material"),
            },
        )?
    };

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    let address = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;

    let (drain_tx, drain_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);

    // The core gets the proxy client certificate too: certificate users reach it as X-Remote-*.
    // One reloading source feeds the core and every remote backend.
    let (proxy_identity, _proxy_identity_reload) = proxy_identity(&config, metrics.clone())?;
    let first_identity = proxy_identity.borrow().clone();
    let core = Arc::new(
        CoreBackend::new(&config.core, first_identity.as_deref(), drain_rx.clone()).await?,
    );
    tokio::spawn(
        core.clone()
            .follow_proxy_identity(proxy_identity.clone())
            .instrument(tracing::info_span!("proxy_identity")),
    );
    let (authenticator, _ca_watch) =
        crate::auth::start(&config, kube_client::client(core.clone()))?;
    let mut health = Health::new();
    let core_check = Check::unhealthy("core server not checked yet");
    health.register("core-server", health::READY, core_check.clone());
    let shutdown_check = Check::healthy();
    health.register("shutdown", health::READY_ONLY, shutdown_check.clone());
    let routing = Routing::new();
    health.register(
        "apiservice-sources-synced",
        health::READY,
        routing.synced.clone(),
    );

    if config.trust.manage {
        crate::control::trust::spawn(
            kube_client::client(core.clone()),
            crate::control::trust::TrustSources {
                client_ca_file: config.authn.client_ca_file.clone(),
                proxy_client_ca_file: config.trust.proxy_client_ca_file.clone(),
                proxy_identity: proxy_identity.clone(),
            },
        );
    }

    // Asked for by validation only with the kube source, the one that writes status.
    let (leader_stop, leader_stop_rx) = watch::channel(false);
    let elector = config.leader_election.clone().map(|settings| {
        let gauge = metrics
            .leader_election_master_status
            .with_label_values(&[settings.name.as_str()]);
        LeaderElector::new(kube_client::client(core.clone()), settings, gauge)
    });
    let (elector, leadership) = match elector {
        Some((elector, leadership)) => (Some(elector), Some(leadership)),
        None => (None, None),
    };
    let elector = elector.map(|elector| {
        tokio::spawn(
            elector
                .run(leader_stop_rx)
                .instrument(tracing::info_span!("leader_election")),
        )
    });
    let reachable = config.apiservices.readyz_reachable.then(|| {
        let check = Check::healthy();
        health.register(
            "aggregated-apiservice-reachable",
            health::READY_ONLY,
            check.clone(),
        );
        check
    });
    start_apiservices(
        &config,
        proxy_identity,
        core.clone(),
        routing.clone(),
        metrics.clone(),
        drain_rx.clone(),
        ApiServiceExtras {
            leadership,
            reachable,
        },
    )?;
    let authorizer = (config.authz.webhook || config.authz.authorize_metrics).then(|| {
        Arc::new(Authorizer::new(
            kube_client::client(core.clone()),
            routing.clone(),
            &config.authz,
        ))
    });
    let audit = match &config.audit.path {
        Some(path) if config.audit.level != gateway_config::AuditLevel::None => Some(
            AuditSink::start(
                path,
                metrics.audit_event_total.clone(),
                metrics.audit_error_total.clone(),
            )
            .map_err(|source| StartError::Audit {
                path: path.clone(),
                source,
            })?,
        ),
        _ => None,
    };
    let discovery = Arc::new(DiscoveryCache::new(routing.clone()));
    let discovery_synced = Check::unhealthy("discovery controller not started yet");
    health.register(
        crate::control::discovery::readiness::CHECK_NAME,
        health::READY,
        discovery_synced.clone(),
    );
    tokio::spawn(
        DiscoveryController::new(
            discovery.clone(),
            core.clone(),
            routing.clone(),
            metrics.clone(),
            config.apiservices.discovery_refresh_interval,
            discovery_synced,
        )
        .run()
        .instrument(tracing::info_span!("discovery_controller")),
    );
    tokio::spawn(
        crate::control::discovery::openapi_v2::OpenApiV2Controller::new(
            discovery.clone(),
            core.clone(),
            routing.clone(),
            metrics.clone(),
        )
        .run()
        .instrument(tracing::info_span!("openapi_v2")),
    );
    let gateway = Arc::new(Gateway {
        core,
        health,
        metrics: metrics.clone(),
        routing,
        discovery: discovery.clone(),
    });
    tokio::spawn(
        crate::control::core_readiness::run(gateway.core.clone(), core_check)
            .instrument(tracing::info_span!("core_readiness")),
    );

    let tracer_provider = match &config.tracing {
        Some(tracing) => {
            let provider = crate::otel::provider(tracing)?;
            tracing::info!(
                file = %tracing.file.display(),
                endpoint = %tracing.endpoint,
                sampling_rate_per_million = tracing.sampling_rate_per_million,
                "tracing requests: OTLP/gRPC export"
            );
            Some(provider)
        }
        None => None,
    };
    let stack = ServiceBuilder::new()
        .layer(AccessLog::layer(metrics.clone(), discovery.clone()))
        .layer(Audit::layer(audit))
        .layer(Trace::layer(
            tracer_provider
                .as_ref()
                .map(|p| Arc::new(RequestTracer::new(p))),
        ))
        .layer(Rescue::layer())
        .layer(RequestInfoService::layer(Some(gateway.routing.clone())))
        .layer(Authn::layer(authenticator))
        .layer(AuditCapture::layer())
        .layer(LimitsService::layer(
            &config.limits,
            Some(gateway.routing.clone()),
            metrics.clone(),
        ))
        .layer(TimeoutService::layer(config.limits.request_timeout))
        .layer(Authz::layer(authorizer))
        .service(Router::new(gateway.clone()));

    // `cert_file` only when there is a file to point a client at: a generated pair without
    // --cert-dir lives in memory only.
    match serving.cert_file() {
        Some(cert_file) => tracing::info!(
            address = %address,
            cert_file = %cert_file.display(),
            self_signed = generated,
            %serial,
            %not_after,
            core = %gateway.core.url(),
            "serving"
        ),
        None => tracing::info!(
            address = %address,
            self_signed = generated,
            %serial,
            %not_after,
            core = %gateway.core.url(),
            cert = "self-signed, in memory only: give --cert-dir to write it where clients can read it",
            "serving"
        ),
    }

    let settings = ListenerSettings {
        header_read_timeout: config.limits.header_read_timeout,
        max_header_bytes: config.limits.max_header_bytes,
        http2_max_streams: config.serving.http2_max_streams,
        max_connections: config.serving.max_client_connections,
    };
    let server = tokio::spawn(
        listener::serve(listener, server_tls, stack, settings, stop_rx)
            .instrument(tracing::info_span!("listener")),
    );

    shutdown_signal().await;
    shutdown_check.fail("the gateway is shutting down");
    // Status writes stop and the Lease is released now, not after the drain: another replica
    // takes over within a retry period.
    let _ = leader_stop.send(true);
    tracing::info!(delay = ?config.shutdown_delay, "shutdown requested: /readyz now fails; still serving during the delay");
    tokio::time::sleep(config.shutdown_delay).await;

    let _ = stop_tx.send(true);
    let graceful = match server.await {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(error = %e, "listener task failed");
            return Ok(());
        }
    };
    let _ = drain_tx.send(true);
    tracing::info!(timeout = ?config.shutdown_timeout, "stopped accepting; closing long-running requests and waiting for in-flight ones");
    match tokio::time::timeout(config.shutdown_timeout, graceful.shutdown()).await {
        Ok(()) => tracing::info!("all connections closed; exiting"),
        Err(_) => tracing::warn!("shutdown timeout reached with requests still in flight; exiting"),
    }
    if let (Some(elector), Some(settings)) = (elector, &config.leader_election) {
        // Released long ago unless the core was slow; bounded like the release itself.
        let _ = tokio::time::timeout(settings.renew_deadline, elector).await;
    }
    if let Some(provider) = tracer_provider {
        crate::otel::shutdown(provider).await;
    }
    Ok(())
}

/// Keeps the proxy client certificate current: the sender the route controller listens to, and
/// the file watcher that feeds it. Dropping it stops the reloads.
pub struct ProxyIdentityReload {
    _tx: Arc<watch::Sender<Option<Arc<Identity>>>>,
    _watcher: Option<notify::RecommendedWatcher>,
}

/// Loads the proxy client certificate and reloads it whenever its files change. A pair that does
/// not load (a half-written rotation, a key that does not match) keeps the previous identity.
fn proxy_identity(
    config: &Config,
    metrics: Arc<Metrics>,
) -> Result<(ProxyIdentity, ProxyIdentityReload), StartError> {
    let Some(pair) = config.proxy_client.clone() else {
        let (tx, rx) = watch::channel(None);
        return Ok((
            rx,
            ProxyIdentityReload {
                _tx: Arc::new(tx),
                _watcher: None,
            },
        ));
    };
    let first = Identity::load(&pair).map_err(StartError::ProxyIdentity)?;
    record_expiry(&metrics, PROXY_CLIENT, &first.certs);
    let (tx, rx) = watch::channel(Some(Arc::new(first)));
    let tx = Arc::new(tx);
    let sender = tx.clone();
    let files = [pair.cert_file.clone(), pair.key_file.clone()];
    let watcher = tls::watch_files(&files, config.serving.cert_reload_interval, move || {
        match Identity::load(&pair) {
            Ok(identity) => {
                let (serial, not_after) = describe_leaf(&identity.certs);
                record_expiry(&metrics, PROXY_CLIENT, &identity.certs);
                sender.send_replace(Some(Arc::new(identity)));
                tracing::info!(cert_file = %pair.cert_file.display(), %serial, %not_after, "proxy client certificate reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "keeping the previous proxy client certificate")
            }
        }
    })?;
    Ok((
        rx,
        ProxyIdentityReload {
            _tx: tx,
            _watcher: Some(watcher),
        },
    ))
}

/// The `certificate` label of the expiry metric for the serving certificate and for the proxy
/// client certificate.
const SERVING: &str = "serving";
const PROXY_CLIENT: &str = "proxy-client";

/// Publishes the expiry of the leaf of `chain`, the certificate now presented as `which`.
fn record_expiry(
    metrics: &Metrics,
    which: &str,
    chain: &[rustls::pki_types::CertificateDer<'static>],
) {
    if let Some(not_after) = chain.first().and_then(tls::not_after_unix) {
        metrics
            .certificate_expiration
            .with_label_values(&[which])
            .set(not_after);
    }
}

/// Serial number and expiry of a chain's leaf, for the log.
fn describe_leaf(chain: &[rustls::pki_types::CertificateDer<'static>]) -> (String, String) {
    chain
        .first()
        .map(tls::describe)
        .unwrap_or_else(|| ("none".into(), "none".into()))
}

/// What the availability controller gets besides the APIService settings.
struct ApiServiceExtras {
    /// With leader election: status is written only while this replica leads.
    leadership: Option<crate::control::leader_election::Leadership>,
    /// The readiness check `aggregated-apiservice-reachable`, when asked for.
    reachable: Option<Arc<Check>>,
}

/// Starts the APIService source, Service resolution, and the route and availability
/// controllers. Their only output is the routing snapshot (and, with the kube source, status
/// writes to the core).
fn start_apiservices(
    config: &Config,
    proxy_identity: ProxyIdentity,
    core: Arc<CoreBackend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    drain: watch::Receiver<bool>,
    extras: ApiServiceExtras,
) -> Result<(), StartError> {
    let api = &config.apiservices;
    let kube = kube_client::client(core);
    let (set_tx, set_rx) = apiservice::source::channel();
    let (results_tx, results_rx) = watch::channel(AvailabilityMap::default());

    let mut resolvers: Vec<Arc<dyn ServiceResolver>> = Vec::new();
    if !api.static_services.is_empty() {
        resolvers.push(Arc::new(StaticResolver::new(&api.static_services)?));
    }
    // Services and EndpointSlices are watched on the core when APIServices come from it, or when
    // no static map says where backends are.
    let kube_source = matches!(api.source, ApiServiceSource::Kube { .. });
    if kube_source || api.static_services.is_empty() {
        let (resolver, run) = KubeResolver::start(kube.clone(), api.endpoint_routing);
        // apiservice's futures carry their own spans (`service_resolver`, `apiservice_source`).
        tokio::spawn(run);
        resolvers.push(Arc::new(resolver));
    }
    let resolver: Arc<dyn ServiceResolver> = Arc::new(ChainResolver(resolvers));

    match &api.source {
        ApiServiceSource::Kube { label_selector } => {
            tokio::spawn(apiservice::source::kube::run(
                kube.clone(),
                label_selector.clone(),
                set_tx,
            ));
        }
        ApiServiceSource::File { dir } => {
            tokio::spawn(apiservice::source::file::run(dir.clone(), set_tx));
        }
        ApiServiceSource::None => {
            let _ = set_tx.send(Some(Arc::default()));
        }
    }

    let availability = AvailabilityController::new(
        routing.clone(),
        results_tx,
        AvailabilitySettings {
            interval: api.availability_interval,
            backoff: AVAILABILITY_BACKOFF,
            unavailable_recheck: UNAVAILABLE_RECHECK,
            resolver: resolver.clone(),
            kube: kube_source.then(|| StatusWrites {
                client: kube,
                stored: set_rx.clone(),
                leader: extras.leadership,
            }),
            reachable: extras.reachable,
        },
        metrics.clone(),
    );
    let factory = BackendFactory {
        proxy_identity,
        resolver,
        drain,
        failures: Some(availability.rechecks()),
        reject_forwarding_redirect: api.reject_forwarding_redirect,
    };
    tokio::spawn(
        RouteController::new(routing, set_rx, results_rx, factory, metrics)
            .run()
            .instrument(tracing::info_span!("route_controller")),
    );
    tokio::spawn(
        availability
            .run()
            .instrument(tracing::info_span!("availability_controller")),
    );
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = int.recv() => tracing::info!("received SIGINT"),
    }
}
