//! kube's `apiserver_flowcontrol_*` families (k8s.io/apiserver
//! `pkg/util/flowcontrol/metrics/metrics.go`), with kube's names, label names and buckets, so
//! that kube's APF dashboards and alerts read the gateway unchanged.
//!
//! Requests never look a series up by its labels: each FlowSchema of a configuration holds the
//! series of its (priority level, flow schema) pair and each level its own, created on first use
//! as kube creates them, so a series appears once something happens to it.

use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, MetricVecBuilder};
use prometheus::{Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

const QUEUE_LENGTH_BUCKETS: [f64; 8] = [0.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];
const DURATION_BUCKETS: [f64; 13] = [
    0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0,
];
const WATCH_COUNT_BUCKETS: [f64; 6] = [0.0, 1.0, 10.0, 100.0, 1000.0, 10000.0];
const SEATS_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0];

/// Why a request was refused (kube's `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// Its queue was full and no seat was free.
    QueueFull,
    /// A level that does not queue had no seat free.
    ConcurrencyLimit,
    /// It waited in its queue past its wait limit.
    TimeOut,
    /// The client gave up while it waited.
    Cancelled,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue-full",
            Self::ConcurrencyLimit => "concurrency-limit",
            Self::TimeOut => "time-out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The families, registered once.
pub struct Metrics {
    rejected: IntCounterVec,
    dispatched: IntCounterVec,
    inqueue_requests: GaugeVec,
    inqueue_seats: GaugeVec,
    queue_length: HistogramVec,
    executing_requests: GaugeVec,
    executing_seats: GaugeVec,
    wait_duration: HistogramVec,
    execution_seconds: HistogramVec,
    watch_count: HistogramVec,
    work_estimated_seats: HistogramVec,
    no_accommodation: IntCounterVec,
    epoch_advance: IntCounterVec,
    current_r: GaugeVec,
    dispatch_r: GaugeVec,
    latest_s: GaugeVec,
    next_s_bounds: GaugeVec,
    next_discounted_s_bounds: GaugeVec,
    nominal_limit: GaugeVec,
    /// kube 1.33's name for `nominal_limit_seats` (removed in 1.34), for dashboards built on it.
    concurrency_limit: GaugeVec,
    lower_limit: GaugeVec,
    upper_limit: GaugeVec,
    current_limit: GaugeVec,
    demand_high_watermark: GaugeVec,
    demand_average: GaugeVec,
    demand_stdev: GaugeVec,
    demand_smoothed: GaugeVec,
    target_seats: GaugeVec,
    pub seat_fair_frac: Gauge,
}

fn name(n: &str) -> String {
    format!("apiserver_flowcontrol_{n}")
}

fn register<T: Collector + Clone + 'static>(registry: &Registry, c: T) -> T {
    registry
        .register(Box::new(c.clone()))
        .expect("flowcontrol metrics registered once");
    c
}

fn counter(r: &Registry, n: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name(n), help), labels).expect("valid metric"),
    )
}

fn gauge(r: &Registry, n: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(
        r,
        GaugeVec::new(Opts::new(name(n), help), labels).expect("valid metric"),
    )
}

fn histogram(r: &Registry, n: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    register(
        r,
        HistogramVec::new(
            HistogramOpts::new(name(n), help).buckets(buckets.to_vec()),
            labels,
        )
        .expect("valid metric"),
    )
}

const PL: &str = "priority_level";
const FS: &str = "flow_schema";

impl Metrics {
    pub fn new(r: &Registry) -> Arc<Self> {
        Arc::new(Self {
            rejected: counter(r, "rejected_requests_total", "Number of requests rejected by API Priority and Fairness subsystem", &[PL, FS, "reason"]),
            dispatched: counter(r, "dispatched_requests_total", "Number of requests executed by API Priority and Fairness subsystem", &[PL, FS]),
            inqueue_requests: gauge(r, "current_inqueue_requests", "Number of requests currently pending in queues of the API Priority and Fairness subsystem", &[PL, FS]),
            inqueue_seats: gauge(r, "current_inqueue_seats", "Number of seats currently pending in queues of the API Priority and Fairness subsystem", &[PL, FS]),
            queue_length: histogram(r, "request_queue_length_after_enqueue", "Length of queue in the API Priority and Fairness subsystem, as seen by each request after it is enqueued", &QUEUE_LENGTH_BUCKETS, &[PL, FS]),
            executing_requests: gauge(r, "current_executing_requests", "Number of requests in initial (for a WATCH) or any (for a non-WATCH) execution stage in the API Priority and Fairness subsystem", &[PL, FS]),
            executing_seats: gauge(r, "current_executing_seats", "Concurrency (number of seats) occupied by the currently executing (initial stage for a WATCH, any stage otherwise) requests in the API Priority and Fairness subsystem", &[PL, FS]),
            wait_duration: histogram(r, "request_wait_duration_seconds", "Length of time a request spent waiting in its queue", &DURATION_BUCKETS, &[PL, FS, "execute"]),
            execution_seconds: histogram(r, "request_execution_seconds", "Duration of initial stage (for a WATCH) or any (for a non-WATCH) stage of request execution in the API Priority and Fairness subsystem", &DURATION_BUCKETS, &[PL, FS, "type"]),
            watch_count: histogram(r, "watch_count_samples", "count of watchers for mutating requests in API Priority and Fairness", &WATCH_COUNT_BUCKETS, &[PL, FS]),
            work_estimated_seats: histogram(r, "work_estimated_seats", "Number of estimated seats (maximum of initial and final seats) associated with requests in API Priority and Fairness", &SEATS_BUCKETS, &[PL, FS]),
            no_accommodation: counter(r, "request_dispatch_no_accommodation_total", "Number of times a dispatch attempt resulted in a non accommodation due to lack of available seats", &[PL, FS]),
            epoch_advance: counter(r, "epoch_advance_total", "Number of times the queueset's progress meter jumped backward", &[PL, "success"]),
            current_r: gauge(r, "current_r", "R(time of last change)", &[PL]),
            dispatch_r: gauge(r, "dispatch_r", "R(time of last dispatch)", &[PL]),
            latest_s: gauge(r, "latest_s", "S(most recently dispatched request)", &[PL]),
            next_s_bounds: gauge(r, "next_s_bounds", "min and max, over queues, of S(oldest waiting request in queue)", &[PL, "bound"]),
            next_discounted_s_bounds: gauge(r, "next_discounted_s_bounds", "min and max, over queues, of S(oldest waiting request in queue) - estimated work in progress", &[PL, "bound"]),
            nominal_limit: gauge(r, "nominal_limit_seats", "Nominal number of execution seats configured for each priority level", &[PL]),
            concurrency_limit: gauge(r, "request_concurrency_limit", "Nominal number of execution seats configured for each priority level", &[PL]),
            lower_limit: gauge(r, "lower_limit_seats", "Configured lower bound on number of execution seats available to each priority level", &[PL]),
            upper_limit: gauge(r, "upper_limit_seats", "Configured upper bound on number of execution seats available to each priority level", &[PL]),
            current_limit: gauge(r, "current_limit_seats", "current derived number of execution seats available to each priority level", &[PL]),
            demand_high_watermark: gauge(r, "demand_seats_high_watermark", "High watermark, over last adjustment period, of demand_seats", &[PL]),
            demand_average: gauge(r, "demand_seats_average", "Time-weighted average, over last adjustment period, of demand_seats", &[PL]),
            demand_stdev: gauge(r, "demand_seats_stdev", "Time-weighted standard deviation, over last adjustment period, of demand_seats", &[PL]),
            demand_smoothed: gauge(r, "demand_seats_smoothed", "Smoothed seat demands", &[PL]),
            target_seats: gauge(r, "target_seats", "Seat allocation targets", &[PL]),
            seat_fair_frac: register(r, Gauge::new(name("seat_fair_frac"), "Fair fraction of server's concurrency to allocate to each priority level that can use it").expect("valid metric")),
        })
    }
}

/// A family of series by label values.
trait Family: Clone {
    type Series;
    fn series(&self, labels: &[&str]) -> Self::Series;
}

impl<B: MetricVecBuilder> Family for prometheus::core::MetricVec<B> {
    type Series = B::M;
    fn series(&self, labels: &[&str]) -> B::M {
        self.with_label_values(labels)
    }
}

/// A series created on first use.
struct Lazy<F: Family> {
    vec: F,
    labels: Vec<Arc<str>>,
    cell: OnceLock<F::Series>,
}

impl<F: Family> Lazy<F> {
    fn new(vec: &F, labels: &[&Arc<str>], extra: &[&str]) -> Self {
        let mut l: Vec<Arc<str>> = labels.iter().map(|a| Arc::clone(a)).collect();
        l.extend(extra.iter().map(|s| Arc::from(*s)));
        Self {
            vec: vec.clone(),
            labels: l,
            cell: OnceLock::new(),
        }
    }

    fn get(&self) -> &F::Series {
        self.cell.get_or_init(|| {
            let values: Vec<&str> = self.labels.iter().map(|l| &**l).collect();
            self.vec.series(&values)
        })
    }
}

type LazyCounter = Lazy<IntCounterVec>;
type LazyGauge = Lazy<GaugeVec>;
type LazyHistogram = Lazy<HistogramVec>;

/// The series of one (priority level, flow schema) pair.
pub struct FlowMetrics {
    rejected: [LazyCounter; 4],
    dispatched: LazyCounter,
    inqueue_requests: LazyGauge,
    inqueue_seats: LazyGauge,
    queue_length: LazyHistogram,
    executing_requests: LazyGauge,
    executing_seats: LazyGauge,
    wait_executed: LazyHistogram,
    wait_rejected: LazyHistogram,
    execution_regular: LazyHistogram,
    execution_watch: LazyHistogram,
    watch_count: LazyHistogram,
    work_estimated_seats: LazyHistogram,
    no_accommodation: LazyCounter,
}

impl FlowMetrics {
    pub fn new(m: &Metrics, level: &Arc<str>, schema: &Arc<str>) -> Self {
        let ls = [level, schema];
        let reason = |r: RejectReason| Lazy::new(&m.rejected, &ls, &[r.as_str()]);
        Self {
            rejected: [
                reason(RejectReason::QueueFull),
                reason(RejectReason::ConcurrencyLimit),
                reason(RejectReason::TimeOut),
                reason(RejectReason::Cancelled),
            ],
            dispatched: Lazy::new(&m.dispatched, &ls, &[]),
            inqueue_requests: Lazy::new(&m.inqueue_requests, &ls, &[]),
            inqueue_seats: Lazy::new(&m.inqueue_seats, &ls, &[]),
            queue_length: Lazy::new(&m.queue_length, &ls, &[]),
            executing_requests: Lazy::new(&m.executing_requests, &ls, &[]),
            executing_seats: Lazy::new(&m.executing_seats, &ls, &[]),
            wait_executed: Lazy::new(&m.wait_duration, &ls, &["true"]),
            wait_rejected: Lazy::new(&m.wait_duration, &ls, &["false"]),
            execution_regular: Lazy::new(&m.execution_seconds, &ls, &["regular"]),
            execution_watch: Lazy::new(&m.execution_seconds, &ls, &["watch"]),
            watch_count: Lazy::new(&m.watch_count, &ls, &[]),
            work_estimated_seats: Lazy::new(&m.work_estimated_seats, &ls, &[]),
            no_accommodation: Lazy::new(&m.no_accommodation, &ls, &[]),
        }
    }

    pub fn rejected(&self, reason: RejectReason) {
        let i = match reason {
            RejectReason::QueueFull => 0,
            RejectReason::ConcurrencyLimit => 1,
            RejectReason::TimeOut => 2,
            RejectReason::Cancelled => 3,
        };
        self.rejected[i].get().inc();
    }

    pub fn dispatched(&self) {
        self.dispatched.get().inc();
    }

    pub fn queued(&self, delta: i64, seats: u32) {
        self.inqueue_requests.get().add(delta as f64);
        self.inqueue_seats
            .get()
            .add(delta as f64 * f64::from(seats));
    }

    pub fn queue_length(&self, len: usize) {
        self.queue_length.get().observe(len as f64);
    }

    pub fn executing(&self, delta: i64) {
        self.executing_requests.get().add(delta as f64);
    }

    pub fn executing_seats(&self, delta: i64) {
        self.executing_seats.get().add(delta as f64);
    }

    pub fn waited(&self, executed: bool, seconds: f64) {
        let h = if executed {
            &self.wait_executed
        } else {
            &self.wait_rejected
        };
        h.get().observe(seconds);
    }

    pub fn executed(&self, watch: bool, seconds: f64) {
        let h = if watch {
            &self.execution_watch
        } else {
            &self.execution_regular
        };
        h.get().observe(seconds);
    }

    pub fn watch_count(&self, n: usize) {
        self.watch_count.get().observe(n as f64);
    }

    pub fn estimated_seats(&self, seats: u32) {
        self.work_estimated_seats.get().observe(f64::from(seats));
    }

    pub fn no_accommodation(&self) {
        self.no_accommodation.get().inc();
    }
}

/// The series of one priority level.
pub struct LevelMetrics {
    current_r: Gauge,
    dispatch_r: Gauge,
    latest_s: Gauge,
    next_s: [Gauge; 2],
    next_discounted_s: [Gauge; 2],
    epoch_advance: [LazyCounter; 2],
    nominal_limit: Gauge,
    concurrency_limit: Gauge,
    lower_limit: Gauge,
    upper_limit: Gauge,
    current_limit: Gauge,
    demand_high_watermark: Gauge,
    demand_average: Gauge,
    demand_stdev: Gauge,
    demand_smoothed: Gauge,
    target_seats: Gauge,
}

/// What the dispatcher saw when it picked a queue (kube's `SetDispatchMetrics`).
pub struct DispatchReading {
    pub r: f64,
    pub s: f64,
    pub s_min: f64,
    pub s_max: f64,
    pub discounted_s_min: f64,
    pub discounted_s_max: f64,
}

/// One borrowing period's outcome for a level.
pub struct Adjustment {
    pub high_watermark: f64,
    pub average: f64,
    pub stdev: f64,
    pub smoothed: f64,
    pub target: f64,
    pub current_limit: u32,
}

impl LevelMetrics {
    pub fn new(m: &Metrics, level: &Arc<str>) -> Self {
        let l = &**level;
        let bounds = |v: &GaugeVec| {
            [
                v.with_label_values(&[l, "min"]),
                v.with_label_values(&[l, "max"]),
            ]
        };
        Self {
            current_r: m.current_r.with_label_values(&[l]),
            dispatch_r: m.dispatch_r.with_label_values(&[l]),
            latest_s: m.latest_s.with_label_values(&[l]),
            next_s: bounds(&m.next_s_bounds),
            next_discounted_s: bounds(&m.next_discounted_s_bounds),
            epoch_advance: [
                Lazy::new(&m.epoch_advance, &[level], &["true"]),
                Lazy::new(&m.epoch_advance, &[level], &["false"]),
            ],
            nominal_limit: m.nominal_limit.with_label_values(&[l]),
            concurrency_limit: m.concurrency_limit.with_label_values(&[l]),
            lower_limit: m.lower_limit.with_label_values(&[l]),
            upper_limit: m.upper_limit.with_label_values(&[l]),
            current_limit: m.current_limit.with_label_values(&[l]),
            demand_high_watermark: m.demand_high_watermark.with_label_values(&[l]),
            demand_average: m.demand_average.with_label_values(&[l]),
            demand_stdev: m.demand_stdev.with_label_values(&[l]),
            demand_smoothed: m.demand_smoothed.with_label_values(&[l]),
            target_seats: m.target_seats.with_label_values(&[l]),
        }
    }

    pub fn current_r(&self, r: f64) {
        self.current_r.set(r);
    }

    pub fn dispatch(&self, d: &DispatchReading) {
        self.dispatch_r.set(d.r);
        self.latest_s.set(d.s);
        self.next_s[0].set(d.s_min);
        self.next_s[1].set(d.s_max);
        self.next_discounted_s[0].set(d.discounted_s_min);
        self.next_discounted_s[1].set(d.discounted_s_max);
    }

    pub fn epoch_advanced(&self, success: bool) {
        self.epoch_advance[usize::from(!success)].get().inc();
    }

    pub fn limits(&self, nominal: u32, lower: u32, upper: u32) {
        self.nominal_limit.set(f64::from(nominal));
        self.concurrency_limit.set(f64::from(nominal));
        self.lower_limit.set(f64::from(lower));
        self.upper_limit.set(f64::from(upper));
    }

    pub fn adjusted(&self, a: &Adjustment) {
        self.demand_high_watermark.set(a.high_watermark);
        self.demand_average.set(a.average);
        self.demand_stdev.set(a.stdev);
        self.demand_smoothed.set(a.smoothed);
        self.target_seats.set(a.target);
        self.current_limit.set(f64::from(a.current_limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_carry_kubes_names_and_labels_once_used() {
        let registry = Registry::new();
        let m = Metrics::new(&registry);
        let (pl, fs): (Arc<str>, Arc<str>) = ("global-default".into(), "global-default".into());
        let flow = FlowMetrics::new(&m, &pl, &fs);
        let level = LevelMetrics::new(&m, &pl);
        flow.rejected(RejectReason::QueueFull);
        flow.dispatched();
        flow.waited(true, 0.01);
        level.limits(49, 25, 649);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for series in [
            r#"apiserver_flowcontrol_rejected_requests_total{flow_schema="global-default",priority_level="global-default",reason="queue-full"} 1"#,
            r#"apiserver_flowcontrol_dispatched_requests_total{flow_schema="global-default",priority_level="global-default"} 1"#,
            r#"apiserver_flowcontrol_request_wait_duration_seconds_count{execute="true",flow_schema="global-default",priority_level="global-default"} 1"#,
            r#"apiserver_flowcontrol_nominal_limit_seats{priority_level="global-default"} 49"#,
            r#"apiserver_flowcontrol_upper_limit_seats{priority_level="global-default"} 649"#,
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
        // Nothing was ever refused for a time-out: no such series, as in kube.
        assert!(!text.contains("time-out"), "{text}");
    }
}
