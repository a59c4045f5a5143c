//! The `core-server` readiness check, kept current by a probe of the core's `/readyz`: every 5 s
//! while it passes, every 500 ms while it fails, so a core that comes back is seen quickly. A
//! readiness probe is a timer by nature (kube-apiserver's own health checks poll too); the same
//! loop refreshes the service-account token the gateway sends, once a minute.
//!
//! The check's reason (`/readyz/core-server`) says what failed and what to check, naming the
//! `--core-url` flag rather than the address; the log has the address once, at start.

use std::sync::Arc;
use std::time::Duration;

use apiservice::outage::Outage;
use http::{Method, StatusCode};

use crate::backend::core::CoreBackend;
use crate::error::core_unreachable;
use crate::health_check::Check;

/// How long the probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Keeps the `core-server` readiness check current. Any HTTP answer below 500 from the core's
/// `/readyz` counts: the question is whether requests can reach it, not who may read that path.
pub async fn run(core: Arc<CoreBackend>, check: Arc<Check>) {
    let mut refresh_token = tokio::time::interval(Duration::from_secs(60));
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
            }
            Ok(Ok(resp)) => {
                let reason = format!(
                    "the core server (--core-url) answered /readyz with {}; check the core \
                     server's own /readyz?verbose",
                    resp.status()
                );
                outage.failed_with(&reason);
                check.fail(&reason);
            }
            Ok(Err(e)) => {
                outage.failed(&e);
                check.fail(&e.public_message());
            }
            Err(_) => {
                let cause = format!("no answer to /readyz within {PROBE_TIMEOUT:?}");
                outage.failed_with(&cause);
                check.fail(&core_unreachable(&cause));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(if check.is_ok() { Duration::from_secs(5) } else { Duration::from_millis(500) }) => {}
            _ = refresh_token.tick() => core.refresh_token(),
        }
    }
}
