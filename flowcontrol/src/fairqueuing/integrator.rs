//! Time-weighted statistics of a level's seat demand (k8s.io/apiserver
//! `fairqueuing/integrator.go`): the average, standard deviation and high watermark of "seats in
//! use plus seats waiting" over a borrowing period, which decide how many seats the level gets
//! in the next one.
//!
//! It lives inside its queue set and is updated under the queue set's lock, on the changes the
//! queue set makes anyway; kube's has a lock of its own.

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Results {
    /// Seconds covered.
    pub duration: f64,
    pub average: f64,
    pub deviation: f64,
    pub max: f64,
}

#[derive(Clone, Debug)]
pub struct Integrator {
    last: Instant,
    x: f64,
    max: f64,
    elapsed: f64,
    integral_x: f64,
    integral_xx: f64,
}

impl Integrator {
    pub fn new(now: Instant) -> Self {
        Self {
            last: now,
            x: 0.0,
            max: 0.0,
            elapsed: 0.0,
            integral_x: 0.0,
            integral_xx: 0.0,
        }
    }

    /// The value changes to `x` at `now`.
    pub fn set(&mut self, x: f64, now: Instant) {
        self.advance(now);
        self.x = x;
        self.max = self.max.max(x);
    }

    fn advance(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.elapsed += dt;
        self.integral_x += self.x * dt;
        self.integral_xx += self.x * self.x * dt;
    }

    /// The statistics since the last reset; starts a new period holding the current value.
    pub fn reset(&mut self, now: Instant) -> Results {
        self.advance(now);
        let mut r = Results {
            duration: self.elapsed,
            max: self.max,
            ..Default::default()
        };
        if self.elapsed > 0.0 {
            r.average = self.integral_x / self.elapsed;
            let variance = self.integral_xx / self.elapsed - r.average * r.average;
            // Rounding can make a constant's variance slightly negative.
            r.deviation = variance.max(0.0).sqrt();
        }
        self.elapsed = 0.0;
        self.integral_x = 0.0;
        self.integral_xx = 0.0;
        self.max = self.x;
        r
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn demand_is_averaged_over_time_not_over_changes() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut i = Integrator::new(t0);
        // 2 seats for 1 s, then 6 seats for 3 s, with a short burst of 50 in between.
        i.set(2.0, at(0));
        i.set(50.0, at(1000));
        i.set(6.0, at(1001));
        let r = i.reset(at(4001));
        assert!((r.duration - 4.001).abs() < 1e-9);
        let avg = (2.0 * 1.0 + 50.0 * 0.001 + 6.0 * 3.0) / 4.001;
        assert!((r.average - avg).abs() < 1e-9, "{r:?}");
        assert_eq!(r.max, 50.0);
        assert!(r.deviation > 0.0);
        // The next period starts from the current value.
        let r = i.reset(at(5001));
        assert_eq!((r.average, r.max, r.deviation), (6.0, 6.0, 0.0));
    }
}
