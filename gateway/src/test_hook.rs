//! The debug builds' way for end-to-end tests to make a long-running task fail:
//! `AGGREGATION_GATEWAY_TEST_PANIC=<name>:<n>` makes the task named panic in its first `n` runs.
//! Release builds never read it. It sits on the ground floor so that the supervisor (`app`) and
//! the watchers the controllers restart themselves (`control`) share one hook.

/// How many of a task's first runs panic.
pub struct TestPanic {
    remaining: u32,
}

impl TestPanic {
    /// The hook for the task called `name` (`discovery-controller`, `core-watch/apiservices`).
    pub fn from_env(name: &str) -> Self {
        let remaining = if cfg!(debug_assertions) {
            std::env::var("AGGREGATION_GATEWAY_TEST_PANIC")
                .ok()
                .and_then(|v| {
                    let (target, times) = v.rsplit_once(':')?;
                    (target == name).then(|| times.parse().ok())?
                })
                .unwrap_or(0)
        } else {
            0
        };
        Self { remaining }
    }

    /// Whether the run starting now panics.
    pub fn panics_now(&mut self) -> bool {
        let panics = self.remaining > 0;
        self.remaining = self.remaining.saturating_sub(1);
        panics
    }
}
