//! One health condition a controller keeps current and `/livez`, `/readyz` and `/healthz` read
//! (see `handlers::health`): an atomic flag and the reason when it is down. It sits at the bottom
//! so that the controllers that flip checks do not import the handler that serves them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

/// One named condition that can be healthy or not, with the reason when not.
#[derive(Default)]
pub struct Check {
    ok: AtomicBool,
    reason: ArcSwapOption<String>,
}

impl Check {
    pub fn healthy() -> Arc<Self> {
        let c = Self::default();
        c.ok.store(true, Ordering::Relaxed);
        Arc::new(c)
    }

    pub fn unhealthy(reason: &str) -> Arc<Self> {
        let c = Arc::new(Self::default());
        c.fail(reason);
        c
    }

    pub fn pass(&self) {
        self.ok.store(true, Ordering::Release);
        self.reason.store(None);
    }

    pub fn fail(&self, reason: &str) {
        self.reason.store(Some(Arc::new(reason.to_owned())));
        self.ok.store(false, Ordering::Release);
    }

    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Acquire)
    }

    /// Why it failed, for the single check's answer (never the verbose list).
    pub(crate) fn reason(&self) -> String {
        self.reason
            .load_full()
            .map(|r| (*r).clone())
            .unwrap_or_else(|| "not ready".into())
    }
}
