//! Start-up and shutdown. [`run`] builds the gateway in five named steps, each a function of its
//! own file, and each handed only the settings it needs:
//!
//! 1. configuration ([`tls`]): the serving certificate and the proxy client certificate, loaded
//!    and kept current from their files, and the listening socket;
//! 2. clients ([`clients`]): the core server's client, and the kube client and authenticator
//!    that ride on its transport;
//! 3. controllers ([`controllers`], [`apiservices`]): the loops that publish what the request
//!    path reads (routes and availability, discovery, trust, leader election, readiness);
//! 4. stack ([`stack`]): the tower layers every request crosses, around the router;
//! 5. listener: serving until a signal, then shutting down ([`shutdown`]) the way
//!    kube-apiserver does (readiness fails at once, keep serving for the delay, stop accepting,
//!    close long-running streams, let ordinary requests finish within the timeout).

mod apiservices;
mod clients;
mod controllers;
mod shutdown;
mod stack;
mod supervisor;
mod tls;

use std::sync::Arc;

use gateway_config::{Config, Limits, ServingConfig};
use tracing::Instrument;

use crate::backend::core::CoreSetupError;
use crate::front::listener::{self, ListenerSettings};
use crate::metrics::Metrics;

use self::clients::Clients;
use self::controllers::{ControllerSettings, Controllers};
use self::shutdown::Shutdown;
use self::tls::{ProxyIdentityReload, ServingTls};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("serving TLS: {0}")]
    Tls(#[from] gateway_config::tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Core(#[from] CoreSetupError),
    #[error(transparent)]
    Authentication(#[from] crate::auth::AuthnStartError),
    #[error("services: {0}")]
    StaticServices(#[from] apiservice::resolve::StaticServiceError),
    #[error("proxy client certificate: {0}")]
    ProxyIdentity(gateway_config::tls::TlsError),
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

/// Runs the gateway until a signal; each step gets its own part of the configuration, and
/// nothing else. rustls's process-wide crypto provider must be installed first
/// (`gateway_config::tls::install_crypto_provider`, as `main` does).
pub async fn run(config: Config) -> Result<(), StartError> {
    let Config {
        listen,
        // Built by `main` before this runs.
        runtime: _,
        serving,
        authn,
        authz,
        proxy_client,
        trust,
        core,
        apiservices,
        limits,
        shutdown_delay_duration,
        shutdown_timeout,
        leader_election,
        logging: _,
        audit,
        tracing: tracing_config,
    } = config;
    let metrics = metrics(&limits);

    // 1. Configuration: the certificates, kept current from their files, and the socket.
    let serving_tls = ServingTls::start(&serving, &authn, &metrics)?;
    let socket = tls::bind(listen).await?;
    let renew_deadline = leader_election.as_ref().map(|l| l.renew_deadline);
    let shutdown = Shutdown::new(shutdown_delay_duration, shutdown_timeout, renew_deadline);
    let reload = serving.cert_reload_interval;
    let proxy_identity = ProxyIdentityReload::start(proxy_client, reload, &metrics)?;

    // 2. Clients: the core server, and what rides on its transport.
    let parts = (&core, &authn, &authz, serving.cert_reload_interval);
    let clients = Clients::start(parts, &proxy_identity, &metrics, shutdown.drain()).await?;

    // 3. Controllers: what the request path reads, published by loops of their own.
    let settings = ControllerSettings {
        apiservices: &apiservices,
        trust: &trust,
        client_ca_file: authn.client_ca_file.clone(),
        leader_election,
        limits: &limits,
    };
    let (receiver, drain) = (proxy_identity.receiver(), shutdown.drain());
    let controllers = Controllers::start(settings, &clients, receiver, &metrics, drain)?;

    // 4. The stack every request crosses, around the router.
    let tracer_provider = stack::tracer_provider(tracing_config.as_ref())?;
    let (authenticator, gateway) = (clients.authenticator.clone(), controllers.gateway.clone());
    let parts = (&audit, &authz, &limits);
    let stack = stack::build(parts, authenticator, gateway, tracer_provider.as_ref())?;

    // 5. The listener, until a signal; then shutdown.
    serving_tls.log_started(socket.address, controllers.gateway.core.url());
    let (tls, settings) = (serving_tls.config(), listener_settings(&limits, &serving));
    let serve = listener::serve(socket.listener, tls, stack, settings, shutdown.stop());
    let server = tokio::spawn(serve.instrument(tracing::info_span!("listener")));
    shutdown.run(server, controllers, tracer_provider).await;
    // What watched files and fed certificates lives until here.
    drop((serving_tls, proxy_identity, clients));
    Ok(())
}

/// What the listener takes of the configuration: the limits on a client's connection.
fn listener_settings(limits: &Limits, serving: &ServingConfig) -> ListenerSettings {
    ListenerSettings {
        header_read_timeout: limits.header_read_timeout,
        max_header_bytes: limits.max_header_bytes,
        http2_max_streams: serving.http2_max_streams,
        max_connections: serving.max_client_connections,
    }
}

/// The metrics registry, with the configured in-flight limits published (kube's older filter
/// only: priority and fairness publishes its seats by priority level instead).
fn metrics(limits: &Limits) -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new());
    if limits.priority_and_fairness {
        return metrics;
    }
    for (kind, limit) in [
        ("readOnly", limits.max_requests_inflight),
        ("mutating", limits.max_mutating_requests_inflight),
    ] {
        if limit > 0 {
            metrics
                .inflight_limit
                .with_label_values(&[kind])
                .set(limit.into());
        }
    }
    metrics
}
