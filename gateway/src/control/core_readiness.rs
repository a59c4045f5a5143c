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
    let mut start_watch = StartWatch::default();
    let outage = Outage::new(
        "core readiness probe",
        "/readyz fails its core-server check until it is back",
    );
    let mut reached = false;
    loop {
        let answer = probe(&core, &check, &outage, &mut reached).await;
        if !*started.borrow() {
            let status = answer.map(|s| s.to_string()).unwrap_or_default();
            match start_watch.observe(answer, Instant::now()) {
                Verdict::Waiting => {}
                Verdict::Started { after_refusals } => {
                    if after_refusals {
                        tracing::info!(core = %core.url(), %status, "core server started");
                    }
                    started.send_replace(true);
                }
                Verdict::GaveUpWaiting => {
                    tracing::warn!(
                        core = %core.url(),
                        %status,
                        "the core server has refused /readyz to the gateway's identity for {}s; \
                         starting the watches on it without knowing whether it is ready",
                        REFUSED_READYZ_WAIT.as_secs()
                    );
                    started.send_replace(true);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(if check.is_ok() && *started.borrow() { Duration::from_secs(5) } else { Duration::from_millis(500) }) => {}
            _ = refresh_token.tick() => core.refresh_token(),
        }
    }
}

/// One `GET /readyz`: passes or fails the check, and returns the status (`None`: no answer).
async fn probe(
    core: &CoreBackend,
    check: &Check,
    outage: &Outage,
    reached: &mut bool,
) -> Option<StatusCode> {
    let req = http::Request::builder()
        .method(Method::GET)
        .uri("/readyz")
        .body(crate::body::empty())
        .expect("static request");
    match tokio::time::timeout(PROBE_TIMEOUT, core.send_own(req)).await {
        Ok(Ok(resp)) if resp.status() < StatusCode::INTERNAL_SERVER_ERROR => {
            if !*reached {
                tracing::info!(core = %core.url(), "core server reachable");
                *reached = true;
            }
            outage.answered();
            check.pass();
            Some(resp.status())
        }
        Ok(Ok(resp)) => {
            let reason = format!(
                "the core server (--core-url) answered /readyz with {}; check the core server's \
                 own /readyz?verbose",
                resp.status()
            );
            outage.failed_with(&reason);
            check.fail(&reason);
            Some(resp.status())
        }
        Ok(Err(e)) => {
            outage.failed(&e);
            check.fail(&e.public_message());
            None
        }
        Err(_) => {
            let cause = format!("no answer to /readyz within {PROBE_TIMEOUT:?}");
            outage.failed_with(&cause);
            check.fail(&core_unreachable(&cause));
            None
        }
    }
}

/// Whether the core has started (see [`CoreStarted`]), from its `/readyz` answers in turn.
#[derive(Debug, Default)]
struct StartWatch {
    /// Since when every answer has been a 401 or 403.
    refused_since: Option<Instant>,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Not started yet, or no answer: the watches wait.
    Waiting,
    /// An answer below 500 other than a refusal; `after_refusals` when 401s or 403s came first.
    Started { after_refusals: bool },
    /// 401 or 403 without a break for [`REFUSED_READYZ_WAIT`]: the watches start without knowing.
    GaveUpWaiting,
}

impl StartWatch {
    /// Takes the probe's answer at `now`: its status, or `None` when it got none.
    fn observe(&mut self, answer: Option<StatusCode>, now: Instant) -> Verdict {
        match answer {
            Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                let since = *self.refused_since.get_or_insert(now);
                if now.duration_since(since) < REFUSED_READYZ_WAIT {
                    Verdict::Waiting
                } else {
                    Verdict::GaveUpWaiting
                }
            }
            Some(status) if status < StatusCode::INTERNAL_SERVER_ERROR => Verdict::Started {
                after_refusals: self.refused_since.take().is_some(),
            },
            _ => {
                // Only an unbroken run of refusals counts towards the fallback: a core between
                // its RBAC sync (403) and its post-start hooks (500) is still starting.
                self.refused_since = None;
                Verdict::Waiting
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kube-apiserver coming up: 403 while its RBAC authorizer syncs, 500 while its post-start
    /// hooks run, then 403 again for a gateway identity it does not let read `/readyz`. The 30 s
    /// count starts again after the 500s, so the watches wait 30 s from the second run of 403s.
    #[test]
    fn only_an_unbroken_run_of_refusals_counts_towards_the_fallback() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut watch = StartWatch::default();
        let forbidden = Some(StatusCode::FORBIDDEN);
        assert_eq!(watch.observe(forbidden, at(0)), Verdict::Waiting);
        assert_eq!(watch.observe(forbidden, at(25)), Verdict::Waiting);
        let starting = Some(StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(watch.observe(starting, at(26)), Verdict::Waiting);
        assert_eq!(watch.observe(forbidden, at(27)), Verdict::Waiting);
        assert_eq!(watch.observe(None, at(28)), Verdict::Waiting);
        assert_eq!(watch.observe(forbidden, at(29)), Verdict::Waiting);
        assert_eq!(
            watch.observe(forbidden, at(45)),
            Verdict::Waiting,
            "the 500 and the missing answer broke the run of 403s"
        );
        assert_eq!(watch.observe(forbidden, at(59)), Verdict::GaveUpWaiting);
    }

    #[test]
    fn any_other_answer_below_500_is_started() {
        let t0 = Instant::now();
        let mut watch = StartWatch::default();
        assert_eq!(
            watch.observe(Some(StatusCode::OK), t0),
            Verdict::Started {
                after_refusals: false
            }
        );
        let mut watch = StartWatch::default();
        assert_eq!(
            watch.observe(Some(StatusCode::UNAUTHORIZED), t0),
            Verdict::Waiting
        );
        assert_eq!(
            watch.observe(Some(StatusCode::NOT_FOUND), t0 + Duration::from_secs(1)),
            Verdict::Started {
                after_refusals: true
            },
            "a core without /readyz has nothing to wait for"
        );
    }
}
