//! The `Retry-After` of a 429 (k8s.io/apiserver
//! `pkg/util/flowcontrol/dropped_requests_tracker.go`): 1 second while a level refuses little,
//! doubling (up to 32 s) while it keeps refusing at least three requests per second of the
//! current value, and shrinking by a second at a time once refusals drop below one per second of
//! it. Clients that honour it back off while the level is overloaded and return promptly after.
//!
//! One per priority level, touched only when that level refuses a request.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

const MAX_RETRY_AFTER: i64 = 32;

pub struct RetryAfter {
    inner: Mutex<Stats>,
}

struct Stats {
    /// Refusals per past second, oldest first.
    history: Vec<(i64, i64)>,
    current_second: i64,
    current_count: i64,
    retry_after: i64,
    last_update: i64,
}

impl Default for RetryAfter {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Stats {
                history: Vec::new(),
                current_second: 0,
                current_count: 0,
                retry_after: 1,
                last_update: 0,
            }),
        }
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl RetryAfter {
    /// Notes a refusal now; returns the `Retry-After` (seconds) to send with it.
    pub fn refused(&self) -> i64 {
        self.refused_at(unix_now())
    }

    fn refused_at(&self, now: i64) -> i64 {
        let mut s = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.current_second == now {
            s.current_count += 1;
            return s.retry_after;
        }
        let (second, count) = (s.current_second, s.current_count);
        s.history.push((second, count));
        let keep = (2 * s.retry_after).min(MAX_RETRY_AFTER);
        s.history.retain(|(t, _)| second - t <= keep);
        s.current_second = now;
        s.current_count = 1;

        let window = s.retry_after;
        let refused: i64 = s
            .history
            .iter()
            .rev()
            .take_while(|(t, _)| now - t <= window)
            .filter(|(t, _)| *t < now)
            .map(|(_, n)| n)
            .sum();
        if now - s.last_update >= window && refused >= 3 * window {
            s.retry_after = (window * 2).min(MAX_RETRY_AFTER);
            s.last_update = now;
        } else if refused < window && window > 1 {
            s.retry_after -= 1;
        }
        s.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_grows_under_sustained_refusals_and_shrinks_after() {
        let r = RetryAfter::default();
        let mut t = 1_000;
        assert_eq!(r.refused_at(t), 1);
        // Five refusals a second: doubles once per current value of seconds.
        let mut seen = Vec::new();
        for _ in 0..40 {
            t += 1;
            for _ in 0..5 {
                r.refused_at(t);
            }
            seen.push(r.refused_at(t));
        }
        // The first second's refusals count from the next one on.
        assert_eq!(seen[..2], [1, 2]);
        assert!(seen.contains(&4), "{seen:?}");
        assert!(seen.iter().all(|&v| v <= 32));
        let top = *seen.last().unwrap();
        assert!(top >= 4, "{seen:?}");
        // Then one refusal every few seconds: back down, a second at a time.
        let mut last = top;
        for _ in 0..40 {
            t += 3;
            let v = r.refused_at(t);
            assert!(v <= last);
            last = v;
        }
        assert_eq!(last, 1);
    }
}
