//! Every long-running loop of the gateway runs under supervision: a loop that panics
//! or returns is never gone silently.
//!
//! Each loop has a readiness check of its own, `loop/<name>`, listed by `/readyz?verbose` as
//! kube-apiserver lists its post-start hooks. When the loop ends the supervisor logs it once,
//! counts it in `aggregation_gateway_loop_restarts_total{loop}`, fails the check, and starts the
//! loop again after a backoff (1 s doubling to 30 s; a loop that ran a minute starts over at
//! 1 s), passing the check again once it runs. A loop whose inputs cannot be made again in
//! process (it holds the only receiver of a channel) is *fatal*: its end fails `/livez` too, so
//! the kubelet restarts the container, with its own backoff.
//!
//! Debug builds read `AGGREGATION_GATEWAY_TEST_PANIC=<loop>:<n>`: the loop named panics in its
//! first `n` runs, which is how the end-to-end tests make a loop fail.

use std::future::Future;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::handlers::health::{self, Health};
use crate::health_check::Check;
use crate::metrics::Metrics;
use crate::test_hook::TestPanic;

/// The first wait before a loop that ended is started again; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A loop that ran this long before it ended starts over at [`MIN_BACKOFF`].
const STABLE: Duration = Duration::from_secs(60);

/// Starts loops under supervision.
pub struct Supervisor {
    restarts: IntCounterVec,
}

impl Supervisor {
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            restarts: metrics.loop_restarts.clone(),
        }
    }

    /// Runs the loop `start` makes, and makes it again whenever it ends. `name` is the loop's
    /// readiness check (`loop/...`) and its label; `span` wraps every run.
    pub fn restarting<F, Fut>(
        &self,
        health: &mut Health,
        name: &'static str,
        span: tracing::Span,
        start: F,
    ) where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.restarting_until(health, name, span, None, start);
    }

    /// [`Self::restarting`], for a loop that returns when `stop` turns true: a run that ends
    /// once it has is the loop's end, not started again. The handle ends with it.
    pub fn restarting_until<F, Fut>(
        &self,
        health: &mut Health,
        name: &'static str,
        span: tracing::Span,
        stop: Option<watch::Receiver<bool>>,
        mut start: F,
    ) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let check = Check::healthy();
        health.register(name, health::READY, check.clone());
        let restarts = self.restarts.with_label_values(&[loop_label(name)]);
        let mut hook = TestPanic::from_env(loop_label(name));
        let stopped = move || stop.as_ref().is_some_and(|stop| *stop.borrow());
        tokio::spawn(async move {
            let mut backoff = MIN_BACKOFF;
            loop {
                let started = Instant::now();
                let why = run_once(start(), hook.panics_now(), span.clone()).await;
                if stopped() {
                    return;
                }
                if started.elapsed() >= STABLE {
                    backoff = MIN_BACKOFF;
                }
                tracing::error!(
                    r#loop = loop_label(name),
                    "the {} loop {why}; starting it again in {backoff:?}",
                    loop_label(name)
                );
                restarts.inc();
                check.fail(&format!(
                    "the {} loop {why}; it is started again in {backoff:?}",
                    loop_label(name)
                ));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                check.pass();
            }
        })
    }

    /// Runs `run`, a loop that cannot be made again in this process: when it ends, that is
    /// logged and counted, and `/livez` fails with `/readyz`, so the kubelet restarts the
    /// container.
    pub fn fatal<Fut>(&self, health: &mut Health, name: &'static str, span: tracing::Span, run: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let check = Check::healthy();
        health.register(name, health::ALL, check.clone());
        let restarts = self.restarts.with_label_values(&[loop_label(name)]);
        let panics = TestPanic::from_env(loop_label(name)).panics_now();
        tokio::spawn(async move {
            let why = run_once(run, panics, span).await;
            tracing::error!(
                r#loop = loop_label(name),
                "the {} loop {why}; it cannot be started again in this process: /livez fails so \
                 that the container is restarted",
                loop_label(name)
            );
            restarts.inc();
            check.fail(&format!(
                "the {} loop {why}; restart the gateway",
                loop_label(name)
            ));
        });
    }
}

/// Runs `run` in a task of its own (so its panic is caught), in `span`; how it ended, in words.
/// `panics`: the test hook asks this run to panic instead.
async fn run_once<Fut>(run: Fut, panics: bool, span: tracing::Span) -> String
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let ended = tokio::spawn(
        async move {
            if panics {
                panic!("AGGREGATION_GATEWAY_TEST_PANIC asked this loop to panic");
            }
            run.await;
        }
        .instrument(span),
    )
    .await;
    ending(ended)
}

/// `discovery-controller` of `loop/discovery-controller`.
fn loop_label(name: &str) -> &str {
    name.strip_prefix("loop/").unwrap_or(name)
}

/// How a run ended, in words.
fn ending(ended: Result<(), tokio::task::JoinError>) -> String {
    match ended {
        Ok(()) => "returned".to_owned(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            format!("panicked ({message})")
        }
        Err(_) => "was cancelled".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn panics_are_told_with_their_message() {
        let ended = tokio::spawn(async { panic!("boom") }).await;
        assert_eq!(ending(ended), "panicked (boom)");
        let ended = tokio::spawn(async {}).await;
        assert_eq!(ending(ended), "returned");
    }
}
