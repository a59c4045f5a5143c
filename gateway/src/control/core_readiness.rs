//! The `core-server` readiness check, kept current by a probe of the core's `/readyz`: every 5 s
//! while it passes, every 500 ms while it fails, so a core that comes back is seen quickly. A
//! readiness probe is a timer by nature (kube-apiserver's own health checks poll too); the same
//! loop refreshes the service-account token the gateway sends, once a minute.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::backend::core::CoreBackend;
use crate::health_check::Check;

/// Keeps the `core-server` readiness check current. Any HTTP answer below 500 from the core's
/// `/readyz` counts: the question is whether requests can reach it, not who may read that path.
pub async fn run(core: Arc<CoreBackend>, check: Arc<Check>) {
    let mut refresh_token = tokio::time::interval(Duration::from_secs(60));
    loop {
        let req = http::Request::builder()
            .method(Method::GET)
            .uri("/readyz")
            .body(crate::body::empty())
            .expect("static request");
        let outcome = tokio::time::timeout(Duration::from_secs(2), core.send_own(req)).await;
        match outcome {
            Ok(Ok(resp)) if resp.status() < StatusCode::INTERNAL_SERVER_ERROR => {
                if !check.is_ok() {
                    tracing::info!(core = %core.url(), "core server reachable");
                }
                check.pass();
            }
            Ok(Ok(resp)) => check.fail(&format!(
                "core server at {} answered /readyz with {}",
                core.url(),
                resp.status()
            )),
            Ok(Err(e)) => {
                if check.is_ok() {
                    tracing::warn!(error = %e, "core server unreachable");
                }
                check.fail(&e.to_string());
            }
            Err(_) => check.fail(&format!(
                "core server at {} did not answer /readyz within 2s",
                core.url()
            )),
        }
        tokio::select! {
            _ = tokio::time::sleep(if check.is_ok() { Duration::from_secs(5) } else { Duration::from_millis(500) }) => {}
            _ = refresh_token.tick() => core.refresh_token(),
        }
    }
}
