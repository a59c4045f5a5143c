//! `apiserver_current_inflight_requests` as kube-apiserver reports it: the most requests of a
//! kind executing at once during the last second, published every second and then counted
//! again from nothing (its `requestWatermark` and `startWatermarkMaintenance`). An instantaneous
//! count would read lower at scrape time than kube's gauge does under the same load, and the
//! dashboards and alerts written for kube's would misjudge it.
//!
//! Both filters feed it: the in-flight limits and, when it is on, priority and fairness (each
//! counting requests that execute, not those that wait in a queue).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;

/// How often the high watermark is published (kube's `inflightUsageMetricUpdatePeriod`).
pub const PUBLISH_PERIOD: Duration = Duration::from_secs(1);

/// One `request_kind`'s executing requests: how many now, and the most since the last publish.
#[derive(Debug)]
pub struct Watermark {
    executing: AtomicI64,
    high: AtomicI64,
    gauge: IntGauge,
}

/// A request counted as executing until it is dropped.
#[derive(Debug)]
pub struct Executing(Arc<Watermark>);

// === impl Watermark ===

impl Watermark {
    pub fn new(gauge: IntGauge) -> Arc<Self> {
        Arc::new(Self {
            executing: AtomicI64::new(0),
            high: AtomicI64::new(0),
            gauge,
        })
    }

    /// Counts a request as executing until the guard is dropped. As kube does, both the count
    /// at the start and the count after the end are observed.
    pub fn start(self: &Arc<Self>) -> Executing {
        let now = self.executing.fetch_add(1, Ordering::Relaxed) + 1;
        self.observe(now);
        Executing(Arc::clone(self))
    }

    fn observe(&self, executing: i64) {
        // A load first: under steady load the watermark is already this high, and a plain read
        // does not take the cache line away from the other workers.
        if executing > self.high.load(Ordering::Relaxed) {
            self.high.fetch_max(executing, Ordering::Relaxed);
        }
    }

    /// Sets the gauge to the most seen since the last call, and starts counting again from
    /// nothing: a second with no request starting or ending publishes 0, as kube's does.
    pub fn publish(&self) {
        self.gauge.set(self.high.swap(0, Ordering::Relaxed));
    }
}

// === impl Executing ===

impl Drop for Executing {
    fn drop(&mut self) {
        let now = self.0.executing.fetch_sub(1, Ordering::Relaxed) - 1;
        self.0.observe(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watermark() -> Arc<Watermark> {
        Watermark::new(IntGauge::new("apiserver_current_inflight_requests", "test").unwrap())
    }

    #[test]
    fn the_gauge_shows_the_most_at_once_in_the_period_not_the_count_at_the_end() {
        let w = watermark();
        let requests: Vec<Executing> = (0..5).map(|_| w.start()).collect();
        drop(requests);
        let one = w.start();
        w.publish();
        assert_eq!(w.gauge.get(), 5, "five executed at once in this period");
        drop(one);
        w.publish();
        assert_eq!(
            w.gauge.get(),
            0,
            "the period saw only the end, with none left executing"
        );
        w.publish();
        assert_eq!(w.gauge.get(), 0, "a quiet period publishes 0");
    }

    #[test]
    fn each_period_starts_again_from_nothing() {
        let w = watermark();
        let long: Vec<Executing> = (0..3).map(|_| w.start()).collect();
        w.publish();
        assert_eq!(w.gauge.get(), 3);
        let short = w.start();
        drop(short);
        w.publish();
        assert_eq!(
            w.gauge.get(),
            4,
            "three still executing plus the one that came and went"
        );
        drop(long);
    }
}
