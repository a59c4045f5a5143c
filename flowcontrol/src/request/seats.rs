//! Units of work: seat-seconds in kube's fixed point (`request/seat_seconds.go`) and a request's
//! work estimate (`request/width.go`'s `WorkEstimate`).
//!
//! A request occupies *seats* while it executes: one for most, more for a large LIST, and for a
//! write watched by many, a few more for a short while after it ends (the watch events it
//! causes). Fair queuing charges each queue the seat-seconds its requests use.

use std::fmt;
use std::time::Duration;

/// Work in seat-seconds, as an integer number of 10⁻⁸ seat-seconds. Readings of the progress meter
/// wrap as kube's `uint64` does: subtracting a negative increment adds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeatSeconds(pub u64);

const SCALE: f64 = 1e8;

impl SeatSeconds {
    pub const MAX: Self = Self(u64::MAX);
    pub const ZERO: Self = Self(0);

    /// `seats × duration`; `duration` may be negative (in nanoseconds), as when a request ran for
    /// less than its estimate.
    pub fn seats_times_nanos(seats: f64, nanos: i128) -> Self {
        let v = (seats * nanos as f64 / (1e9 / SCALE)).round() as i64;
        Self(v as u64)
    }

    pub fn seats_times(seats: f64, d: Duration) -> Self {
        Self::seats_times_nanos(seats, d.as_nanos() as i128)
    }

    pub fn to_f64(self) -> f64 {
        self.0 as f64 / SCALE
    }

    /// How long `seats` seats take to do this much work.
    pub fn duration_per_seat(self, seats: f64) -> Duration {
        Duration::from_nanos((self.0 as f64 / seats * (1e9 / SCALE)) as u64)
    }

    pub fn wrapping_add(self, o: Self) -> Self {
        Self(self.0.wrapping_add(o.0))
    }

    pub fn wrapping_sub(self, o: Self) -> Self {
        Self(self.0.wrapping_sub(o.0))
    }
}

impl fmt::Display for SeatSeconds {
    /// kube's form: `12.00000345ss`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scale = SCALE as u64;
        write!(f, "{}.{:08}ss", self.0 / scale, self.0 % scale)
    }
}

/// How much of the server a request takes: `initial_seats` while it executes, then
/// `final_seats` for `additional_latency` after it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkEstimate {
    pub initial_seats: u32,
    pub final_seats: u32,
    pub additional_latency: Duration,
}

impl WorkEstimate {
    pub fn seats(n: u32) -> Self {
        Self {
            initial_seats: n,
            ..Default::default()
        }
    }

    /// The most seats it holds at any time: what must be free for it to start.
    pub fn max_seats(&self) -> u32 {
        self.initial_seats.max(self.final_seats)
    }
}

/// An estimate with its work computed, for a queue set whose requests are expected to take
/// `service` (kube's `completedWorkEstimate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletedWork {
    pub estimate: WorkEstimate,
    /// Initial plus final work.
    pub total: SeatSeconds,
    /// Final work alone.
    pub final_work: SeatSeconds,
}

impl CompletedWork {
    pub fn new(estimate: WorkEstimate, service: Duration) -> Self {
        let final_work =
            SeatSeconds::seats_times(f64::from(estimate.final_seats), estimate.additional_latency);
        let initial = SeatSeconds::seats_times(f64::from(estimate.initial_seats), service);
        Self {
            estimate,
            total: initial.wrapping_add(final_work),
            final_work,
        }
    }

    pub fn max_seats(&self) -> u32 {
        self.estimate.max_seats()
    }

    /// Narrows the final phase to at most `limit` seats, lengthening it so that its work stays
    /// the same: a request must never wait for more seats than its level can ever have.
    ///
    /// A level whose limit is 0 (lent out whole, or no shares) is left alone: its too-wide rule
    /// lets one request run when nothing else does, and a phase stretched over zero seats would
    /// never end.
    pub fn fit_final_seats(&mut self, limit: u32) {
        if limit > 0 && self.estimate.final_seats > limit {
            self.estimate.final_seats = limit;
            self.estimate.additional_latency = self.final_work.duration_per_seat(f64::from(limit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seat_seconds_read_as_kube_writes_them() {
        assert_eq!(
            SeatSeconds::seats_times(3.0, Duration::from_millis(5)).to_string(),
            "0.01500000ss"
        );
        assert_eq!(
            SeatSeconds::seats_times(2.0, Duration::from_secs(7)).to_string(),
            "14.00000000ss"
        );
        // A negative increment subtracted is an addition, as kube's uint64 arithmetic has it.
        let r = SeatSeconds(1_000);
        let minus = SeatSeconds::seats_times_nanos(1.0, -200);
        assert_eq!(r.wrapping_sub(minus), SeatSeconds(1_020));
    }

    #[test]
    fn no_seats_leave_the_final_phase_as_it_is() {
        let estimate = WorkEstimate {
            initial_seats: 1,
            final_seats: 3,
            additional_latency: Duration::from_millis(5),
        };
        let mut work = CompletedWork::new(estimate, Duration::from_secs(1));
        work.fit_final_seats(0);
        assert_eq!(work.estimate, estimate);
    }

    #[test]
    fn a_wide_final_phase_is_narrowed_without_losing_work() {
        let estimate = WorkEstimate {
            initial_seats: 1,
            final_seats: 8,
            additional_latency: Duration::from_millis(10),
        };
        let mut work = CompletedWork::new(estimate, Duration::from_millis(3));
        assert_eq!(work.max_seats(), 8);
        let before = work.final_work;
        work.fit_final_seats(4);
        assert_eq!(work.estimate.final_seats, 4);
        assert_eq!(work.estimate.additional_latency, Duration::from_millis(20));
        assert_eq!(work.final_work, before);
    }
}
