//! Step 5's end: shutting down the way kube-apiserver does. On SIGTERM or SIGINT `/readyz` fails
//! at once and the Lease is released; the gateway keeps serving for `--shutdown-delay-duration`
//! (load balancers take it out meanwhile), then stops accepting, closes long-running streams
//! (watches, exec), and lets ordinary requests finish within `--shutdown-timeout`.

use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::controllers::Controllers;

/// The two signals shutdown sends: `stop` to the listener (stop accepting), `drain` to the
/// backends (close long-running streams).
pub struct Shutdown {
    stop: watch::Sender<bool>,
    drain: watch::Sender<bool>,
    settings: ShutdownSettings,
}

impl Shutdown {
    /// Shutdown after `--shutdown-delay-duration`, within `--shutdown-timeout`; with leader
    /// election, waiting at most its renew deadline for the Lease's release.
    pub fn new(
        shutdown_delay_duration: Duration,
        shutdown_timeout: Duration,
        leader_elect_renew_deadline: Option<Duration>,
    ) -> Self {
        Self {
            stop: watch::channel(false).0,
            drain: watch::channel(false).0,
            settings: ShutdownSettings {
                shutdown_delay_duration,
                shutdown_timeout,
                leader_elect_renew_deadline,
            },
        }
    }

    /// What the listener follows: stop accepting, close connections gracefully.
    pub fn stop(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// What the backends follow: close long-running streams.
    pub fn drain(&self) -> watch::Receiver<bool> {
        self.drain.subscribe()
    }

    /// Waits for SIGTERM or SIGINT, then shuts down in kube-apiserver's order (see the module
    /// docs).
    pub async fn run(
        self,
        server: JoinHandle<GracefulShutdown>,
        controllers: Controllers,
        tracer_provider: Option<SdkTracerProvider>,
    ) {
        signal().await;
        let settings = &self.settings;
        controllers
            .shutdown_check
            .fail("the gateway is shutting down");
        // Status writes stop and the Lease is released now, not after the drain: another
        // replica takes over within a retry period.
        if let Some(leader) = &controllers.leader {
            let _ = leader.stop.send(true);
        }
        tracing::info!(delay = ?settings.shutdown_delay_duration, "shutdown requested: /readyz now fails; still serving during the delay");
        tokio::time::sleep(settings.shutdown_delay_duration).await;

        self.stop.send_replace(true);
        let graceful = match server.await {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "listener task failed");
                return;
            }
        };
        self.drain.send_replace(true);
        tracing::info!(timeout = ?settings.shutdown_timeout, "stopped accepting; closing long-running requests and waiting for in-flight ones");
        match tokio::time::timeout(settings.shutdown_timeout, graceful.shutdown()).await {
            Ok(()) => tracing::info!("all connections closed; exiting"),
            Err(_) => {
                tracing::warn!("shutdown timeout reached with requests still in flight; exiting")
            }
        }
        if let (Some(leader), Some(renew_deadline)) =
            (controllers.leader, settings.leader_elect_renew_deadline)
        {
            // Released long ago unless the core was slow; bounded like the release itself.
            let _ = tokio::time::timeout(renew_deadline, leader.task).await;
        }
        if let Some(provider) = tracer_provider {
            crate::otel::shutdown(provider).await;
        }
    }
}

/// What shutdown takes of the configuration.
struct ShutdownSettings {
    shutdown_delay_duration: Duration,
    shutdown_timeout: Duration,
    /// With leader election: how long the Lease's release may take.
    leader_elect_renew_deadline: Option<Duration>,
}

async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = int.recv() => tracing::info!("received SIGINT"),
    }
}
