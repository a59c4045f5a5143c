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

use gateway_config::{Config, Limits};
use tracing::Instrument;

use crate::backend::core::CoreSetupError;
use crate::front::listener::{self, ListenerSettings};
use crate::metrics::Metrics;

use self::clients::Clients;
use self::controllers::Controllers;
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

pub async fn run(config: Config) -> Result<(), StartError> {
    gateway_config::tls::install_crypto_provider();
    let metrics = metrics(&config.limits);

    // 1. Configuration: the certificates, kept current from their files, and the socket.
    let serving = ServingTls::start(&config.serving, &config.authn, &metrics)?;
    let socket = tls::bind(config.listen).await?;
    let shutdown = Shutdown::new();
    let proxy_identity = ProxyIdentityReload::start(
        config.proxy_client.clone(),
        config.serving.cert_reload_interval,
        &metrics,
    )?;

    // 2. Clients: the core server, and what rides on its transport.
    let clients = Clients::start(&config, &proxy_identity, shutdown.drain()).await?;

    // 3. Controllers: what the request path reads, published by loops of their own.
    let controllers = Controllers::start(
        &config,
        &clients,
        proxy_identity.receiver(),
        &metrics,
        shutdown.drain(),
    )?;

    // 4. The stack every request crosses, around the router.
    let tracer_provider = stack::tracer_provider(config.tracing.as_ref())?;
    let stack = stack::build(
        &config,
        clients.authenticator.clone(),
        controllers.gateway.clone(),
        tracer_provider.as_ref(),
    )?;

    // 5. The listener, until a signal; then shutdown.
    serving.log_started(socket.address, controllers.gateway.core.url());
    let settings = listener_settings(&config);
    let server = tokio::spawn(
        listener::serve(
            socket.listener,
            serving.config(),
            stack,
            settings,
            shutdown.stop(),
        )
        .instrument(tracing::info_span!("listener")),
    );
    shutdown
        .run(&config, server, controllers, tracer_provider)
        .await;
    // What watched files and fed certificates lives until here.
    drop((serving, proxy_identity, clients));
    Ok(())
}

/// What the listener takes of the configuration: the limits on a client's connection.
fn listener_settings(config: &Config) -> ListenerSettings {
    ListenerSettings {
        header_read_timeout: config.limits.header_read_timeout,
        max_header_bytes: config.limits.max_header_bytes,
        http2_max_streams: config.serving.http2_max_streams,
        max_connections: config.serving.max_client_connections,
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
        ("readOnly", limits.max_readonly_inflight),
        ("mutating", limits.max_mutating_inflight),
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
