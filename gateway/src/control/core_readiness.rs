//! The `core-server` readiness check, kept current by a probe of the core's `/readyz`: every 5 s
//! while it passes, every 500 ms while it fails, so a core that comes back is seen quickly. A
//! readiness probe is a timer by nature (kube-apiserver's own health checks poll too); the same
//! loop refreshes the service-account token the gateway sends, once a minute.
//!
//! The check's reason (`/readyz/core-server`) says what failed and what to check, naming the
//! `--core-url` flag rather than the address; the log has the address once, at start.
//!
//! The first pass also starts the controllers that list and watch on the core ([`CoreStarted`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiservice::outage::Outage;
use http::{Method, StatusCode};
use tokio::sync::watch;

use crate::backend::core::CoreBackend;
use crate::error::core_unreachable;
use crate::health_check::Check;

/// How long the probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the core's `/readyz` has passed once since the gateway started: what the controllers
/// that list and watch on the core wait for before their first request.
///
/// A starting kube-apiserver accepts connections well before it can answer them: until its
/// informers have synced, its RBAC authorizer finds no binding or role and refuses every request
/// with 403, `/readyz` included (anyone may read it only through the `system:public-info-viewer`
/// role); then `/readyz` answers 500 until its post-start hooks have run (`rbac/bootstrap-roles`
/// among them). A gateway started beside it, as a sidecar core is, would log a Forbidden per
/// watch and back off; it waits for any other answer below 500 from `/readyz` instead (a 2xx, or
/// a 404 from a core without one, which has nothing to wait for). A 401 or 403 is waited out for at most [`REFUSED_READYZ_WAIT`]: a
/// core may refuse `/readyz` to the gateway's identity for good.
#[derive(Clone)]
pub struct CoreStarted(watch::Receiver<bool>);

impl CoreStarted {
    /// Resolves once the core's `/readyz` has passed (at once if it already has).
    pub async fn wait(mut self) {
        // An error means the readiness loop is gone, which happens only at shutdown.
        let _ = self.0.wait_for(|started| *started).await;
    }

    /// `fut`, started only once the core is.
    pub async fn then_run<F: Future>(self, fut: F) -> F::Output {
        self.wait().await;
        fut.await
    }
}

/// How long a `/readyz` that answers 401 or 403 holds the watches back.
pub const REFUSED_READYZ_WAIT: Duration = Duration::from_secs(30);

/// A [`CoreStarted`] and the switch [`run`] flips on the first pass.
pub fn core_started() -> (watch::Sender<bool>, CoreStarted) {
    let (tx, rx) = watch::channel(false);
    (tx, CoreStarted(rx))
}

/// Keeps the `core-server` readiness check current, and flips `started` once the core has
/// started ([`CoreStarted`]). Any HTTP answer below 500 from the core's `/readyz` passes the check:
/// the question is whether requests can reach it, not who may read that path.
pub async fn run(core: Arc<CoreBackend>, check: Arc<Check>, started: watch::Sender<bool>) {
    let mut refresh_token = tokio::time::interval(Duration::from_secs(60));
    let mut refused_since: Option<Instant> = None;
    let outage = Outage::new(
        "core readiness probe",
        "/readyz fails its core-server check until it is back",
    );
    let mut reached = false;
    loop {
        let req = http::Request::builder()
            .method(Method::GET)
            .uri("/readyz")
            .body(crate::body::empty())
            .expect("static request");
        let outcome = tokio::time::timeout(PROBE_TIMEOUT, core.send_own(req)).await;
        match outcome {
            Ok(Ok(resp)) if resp.status() < StatusCode::INTERNAL_SERVER_ERROR => {
                if !reached {
                    tracing::info!(core = %core.url(), "core server reachable");
                    reached = true;
                }
                outage.answered();
                check.pass();
                if !*started.borrow() && has_started(&core, resp.status(), &mut refused_since) {
                    started.send_replace(true);
                }
            }
            Ok(Ok(resp)) => {
                let reason = format!(
                    "the core server (--core-url) answered /readyz with {}; check the core \
                     server's own /readyz?verbose",
                    resp.status()
                );
                outage.failed_with(&reason);
                check.fail(&reason);
                // Only an unbroken run of refusals counts towards the fallback: a core between
                // its RBAC sync (403) and its post-start hooks (500) is still starting.
                refused_since = None;
            }
            Ok(Err(e)) => {
                outage.failed(&e);
                check.fail(&e.public_message());
                refused_since = None;
            }
            Err(_) => {
                let cause = format!("no answer to /readyz within {PROBE_TIMEOUT:?}");
                outage.failed_with(&cause);
                check.fail(&core_unreachable(&cause));
                refused_since = None;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(if check.is_ok() && *started.borrow() { Duration::from_secs(5) } else { Duration::from_millis(500) }) => {}
            _ = refresh_token.tick() => core.refresh_token(),
        }
    }
}

/// Whether a `/readyz` answer below 500 means the core has started (see [`CoreStarted`]).
fn has_started(
    core: &CoreBackend,
    status: StatusCode,
    refused_since: &mut Option<Instant>,
) -> bool {
    if status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN {
        if refused_since.is_some() {
            tracing::info!(core = %core.url(), %status, "core server started");
        }
        return true;
    }
    let since = *refused_since.get_or_insert_with(Instant::now);
    if since.elapsed() < REFUSED_READYZ_WAIT {
        return false;
    }
    tracing::warn!(
        core = %core.url(),
        %status,
        "the core server has refused /readyz to the gateway's identity for {}s; starting the \
         watches on it without knowing whether it is ready",
        REFUSED_READYZ_WAIT.as_secs()
    );
    true
}
