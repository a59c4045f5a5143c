use std::collections::HashMap;

use prometheus::Registry;

use super::*;
use crate::fairqueuing::shuffle_shard::hash_flow_id;
use crate::metrics::Metrics;
use crate::model::Queuing;

fn metrics() -> (Arc<Metrics>, Arc<LevelMetrics>) {
    let m = Metrics::new(&Registry::new());
    let l = Arc::new(LevelMetrics::new(&m, &"test".into()));
    (m, l)
}

/// A queue set of `limit` with `concurrency` seats, and the time it starts at.
fn queue_set(limit: LimitResponse, concurrency: u32) -> (Arc<Metrics>, QueueSet, Instant) {
    let (m, l) = metrics();
    let now = Instant::now();
    let mut qs = QueueSet::new("test".into(), limit, l, now);
    qs.set_concurrency_limit(concurrency, now);
    (m, qs, now)
}

fn queuing(queues: u32, hand_size: u32, queue_length_limit: u32) -> LimitResponse {
    LimitResponse::Queue(Queuing {
        queues,
        hand_size,
        queue_length_limit,
    })
}

fn description(m: &Metrics, flow: &str) -> Description {
    Description {
        flow: Arc::new(FlowMetrics::new(m, &"test".into(), &flow.into())),
        schema: flow.into(),
        distinguisher: None,
        user: Arc::new(UserInfo::default()),
        info: Arc::new(RequestInfo::default()),
    }
}

impl QueueSet {
    /// The running sums agree with a recount.
    fn check(&self) {
        let active = self.queues.iter().filter(|q| q.is_active()).count() as u32;
        assert_eq!(self.active_queues, active, "active queues");
        let waiting: usize = self.queues.iter().map(Queue::len).sum();
        assert_eq!(self.waiting as usize, waiting, "waiting");
        let queued_seats: u64 = self.queues.iter().map(|q| u64::from(q.seats_in_use)).sum();
        assert_eq!(self.seats_in_queues, queued_seats, "seats in queues");
        let seats_waiting: u64 = self.queues.iter().map(|q| q.sum().max_seats).sum();
        assert_eq!(self.seats_waiting, seats_waiting, "seats waiting");
        assert!(self.seats_in_use >= self.seats_in_queues);
        assert_eq!(
            self.executing as usize,
            self.running.iter().flatten().count(),
            "executing"
        );
    }
}

/// A request as the simulation tracks it.
enum Pending {
    Queued(oneshot::Receiver<Admitted>),
}

/// Runs `qs` in simulated time: every request takes `service`; returns the dispatch order.
struct Sim {
    qs: QueueSet,
    m: Arc<Metrics>,
    now: Instant,
    service: Duration,
    running: Vec<(Instant, Admitted, &'static str)>,
    waiting: Vec<(Pending, &'static str)>,
    order: Vec<&'static str>,
    rejected: HashMap<&'static str, usize>,
}

impl Sim {
    fn new(limit: LimitResponse, concurrency: u32, service: Duration) -> Self {
        let (m, l) = metrics();
        let now = Instant::now();
        let mut qs = QueueSet::new("test".into(), limit, l, now);
        qs.set_concurrency_limit(concurrency, now);
        Self {
            qs,
            m,
            now,
            service,
            running: Vec::new(),
            waiting: Vec::new(),
            order: Vec::new(),
            rejected: HashMap::new(),
        }
    }

    fn submit(&mut self, flow: &'static str, seats: u32) {
        let hash = hash_flow_id("fs", flow);
        let d = description(&self.m, flow);
        match self.qs.start(self.now, hash, WorkEstimate::seats(seats), d) {
            Admission::Run(a) => self.admitted(a, flow),
            Admission::Wait(Queued { rx, .. }) => self.waiting.push((Pending::Queued(rx), flow)),
            Admission::Reject(_) => *self.rejected.entry(flow).or_default() += 1,
        }
        self.collect();
        self.qs.check();
    }

    fn admitted(&mut self, a: Admitted, flow: &'static str) {
        self.order.push(flow);
        self.running.push((self.now + self.service, a, flow));
    }

    /// Moves dispatched waiters to running.
    fn collect(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for (Pending::Queued(mut rx), flow) in waiting {
            match rx.try_recv() {
                Ok(a) => self.admitted(a, flow),
                Err(_) => self.waiting.push((Pending::Queued(rx), flow)),
            }
        }
    }

    /// Finishes the next request to end.
    fn step(&mut self) -> bool {
        let Some(i) = (0..self.running.len()).min_by_key(|&i| self.running[i].0) else {
            return false;
        };
        let (end, a, _) = self.running.remove(i);
        self.now = self.now.max(end);
        if let Finished::Linger(d) = self.qs.finish(self.now, &a) {
            self.now += d;
            let flow = description(&self.m, "x").flow.clone();
            self.qs.release_final(self.now, &a, &flow);
        }
        self.collect();
        self.qs.check();
        true
    }
}

#[test]
fn a_flooding_flow_gets_its_share_and_a_quiet_one_is_served_at_once() {
    let mut sim = Sim::new(queuing(64, 6, 50), 4, Duration::from_millis(10));
    // The flood fills the seats and its queues.
    for _ in 0..400 {
        sim.submit("flood", 1);
    }
    let flood_rejected = sim.rejected["flood"];
    assert!(flood_rejected > 0, "a full hand of queues refuses");
    assert_eq!(sim.order.len(), 4);
    // The quiet flow asks once in a while: its queue is one more active queue beside the
    // flood's six, so each of its requests goes within one round of them, ahead of the
    // hundreds of flood requests queued before it.
    for _ in 0..10 {
        sim.submit("quiet", 1);
        let before = sim.order.len();
        let mut steps = 0;
        while !sim.order[before..].contains(&"quiet") {
            sim.step();
            steps += 1;
        }
        assert!(steps <= 7, "quiet waited {steps} dispatches");
        for _ in 0..5 {
            sim.step();
        }
    }
    assert!(!sim.rejected.contains_key("quiet"));
}

#[test]
fn two_busy_flows_share_the_seats_equally() {
    let mut sim = Sim::new(queuing(64, 6, 50), 3, Duration::from_millis(10));
    for _ in 0..40 {
        sim.submit("a", 1);
    }
    // b arrives later with as much backlog, then both stay busy.
    for _ in 0..40 {
        sim.submit("b", 1);
    }
    for _ in 0..40 {
        sim.step();
    }
    let counts = |from: usize| {
        let mut c = HashMap::new();
        for f in &sim.order[from..] {
            *c.entry(*f).or_insert(0) += 1;
        }
        c
    };
    // Once both wait, dispatches alternate (a had a head start of its first seats).
    let c = counts(3);
    let (a, b): (usize, usize) = (c["a"], c["b"]);
    assert!(a.abs_diff(b) <= 2, "a {a} b {b}: {:?}", sim.order);
}

#[test]
fn a_wide_flow_gets_fewer_requests_through_for_the_same_seats() {
    let mut sim = Sim::new(queuing(64, 6, 50), 4, Duration::from_millis(10));
    for _ in 0..40 {
        sim.submit("wide", 4);
        sim.submit("narrow", 1);
        sim.submit("narrow", 1);
        sim.submit("narrow", 1);
        sim.submit("narrow", 1);
    }
    for _ in 0..60 {
        sim.step();
    }
    let wide = sim.order.iter().filter(|f| **f == "wide").count();
    let narrow = sim.order.iter().filter(|f| **f == "narrow").count();
    // Equal seat-seconds while both wait: about four narrow requests per wide one.
    assert!(sim.qs.waiting() > 0);
    assert!(
        (3 * wide..=5 * wide).contains(&narrow),
        "wide {wide} narrow {narrow}"
    );
}

#[test]
fn a_full_queue_refuses_and_the_queue_drains_in_order() {
    let mut sim = Sim::new(queuing(1, 1, 3), 1, Duration::from_millis(5));
    for _ in 0..6 {
        sim.submit("f", 1);
    }
    // One runs, three wait, two are refused.
    assert_eq!(sim.order.len(), 1);
    assert_eq!(sim.qs.waiting(), 3);
    assert_eq!(sim.rejected["f"], 2);
    assert_eq!(sim.qs.counts().rejected, 2);
    while sim.step() {}
    assert_eq!(sim.order.len(), 4);
    assert!(sim.qs.is_idle());
}

#[test]
fn a_level_that_does_not_queue_refuses_past_its_limit() {
    let mut sim = Sim::new(LimitResponse::Reject, 2, Duration::from_millis(5));
    for _ in 0..3 {
        sim.submit("f", 1);
    }
    assert_eq!(sim.order.len(), 2);
    assert_eq!(sim.rejected["f"], 1);
    // A request wider than the whole limit runs alone once nothing else does.
    while sim.step() {}
    sim.submit("wide", 5);
    assert_eq!(sim.order.last(), Some(&"wide"));
    sim.submit("f", 1);
    assert_eq!(sim.rejected["f"], 2);
}

#[test]
fn the_exempt_level_never_refuses() {
    let mut sim = Sim::new(LimitResponse::Exempt, 0, Duration::from_millis(5));
    for _ in 0..100 {
        sim.submit("admin", 3);
    }
    assert_eq!(sim.order.len(), 100);
    assert_eq!(sim.qs.executing(), 100);
    while sim.step() {}
    assert!(sim.qs.is_idle());
}

#[test]
fn a_wide_request_at_the_head_is_not_overtaken() {
    let mut sim = Sim::new(queuing(1, 1, 10), 4, Duration::from_millis(10));
    for _ in 0..3 {
        sim.submit("f", 1);
    }
    sim.submit("f", 4);
    sim.submit("f", 1);
    // The wide one waits for all four seats; the narrow one behind it waits too.
    assert_eq!(sim.order, ["f"; 3]);
    sim.step();
    sim.step();
    assert_eq!(sim.order.len(), 3);
    sim.step();
    assert_eq!(sim.order.len(), 4);
    assert_eq!(sim.qs.waiting(), 1);
}

#[test]
fn final_seats_are_held_until_released() {
    let (m, mut qs, now) = queue_set(queuing(8, 2, 10), 2);
    let estimate = WorkEstimate {
        initial_seats: 1,
        final_seats: 2,
        additional_latency: Duration::from_millis(5),
    };
    let Admission::Run(a) = qs.start(now, 1, estimate, description(&m, "w")) else {
        panic!("not admitted");
    };
    let Admission::Wait(Queued { mut rx, .. }) =
        qs.start(now, 2, WorkEstimate::seats(1), description(&m, "r"))
    else {
        panic!("not queued");
    };
    let Finished::Linger(d) = qs.finish(now, &a) else {
        panic!("no final phase");
    };
    assert_eq!(d, Duration::from_millis(5));
    // Still both seats taken.
    assert!(rx.try_recv().is_err());
    qs.check();
    let flow = description(&m, "w").flow.clone();
    qs.release_final(now + d, &a, &flow);
    assert!(rx.try_recv().is_ok());
    qs.check();
}

/// A write watched by many lingers on more seats than the level has; narrowed when it is
/// dispatched, it must take back from the waiting seats exactly what it added when queued.
#[test]
fn a_narrowed_write_leaves_no_seats_waiting() {
    let (m, mut qs, now) = queue_set(queuing(8, 2, 10), 2);
    let Admission::Run(a) = qs.start(now, 1, WorkEstimate::seats(2), description(&m, "r")) else {
        panic!("not admitted");
    };
    let wide = WorkEstimate {
        initial_seats: 1,
        final_seats: 5,
        additional_latency: Duration::from_millis(5),
    };
    let Admission::Wait(Queued { mut rx, .. }) = qs.start(now, 2, wide, description(&m, "w"))
    else {
        panic!("not queued");
    };
    qs.finish(now, &a);
    let admitted = rx.try_recv().expect("dispatched once the level is free");
    qs.check();
    assert_eq!(qs.seats_waiting, 0, "seats still counted as waiting");
    if let Finished::Linger(d) = qs.finish(now, &admitted) {
        assert!(d < Duration::from_secs(1), "final phase {d:?}");
        let flow = description(&m, "w").flow.clone();
        qs.release_final(now + d, &admitted, &flow);
    }
    assert!(qs.is_idle());
}

/// A level with no seats (lent out whole, or no shares) runs nothing, as kube's does: a request
/// waits in its queue until it times out. Before, a write watched by many ran at once with its
/// final phase stretched over zero seats, and held a seat for good.
#[test]
fn a_level_with_no_seats_runs_nothing_and_leaks_nothing() {
    let (m, mut qs, now) = queue_set(queuing(8, 2, 10), 0);
    let wide = WorkEstimate {
        initial_seats: 1,
        final_seats: 2,
        additional_latency: Duration::from_millis(5),
    };
    let Admission::Wait(Queued { queue, id, rx }) = qs.start(now, 1, wide, description(&m, "w"))
    else {
        panic!("a level with no seats ran a request");
    };
    assert!(qs.cancel(now, queue, id, RejectReason::TimeOut));
    drop(rx);
    qs.check();
    assert!(qs.is_idle());
}

#[test]
fn a_cancelled_request_leaves_its_queue() {
    let (m, mut qs, now) = queue_set(queuing(8, 2, 10), 1);
    let Admission::Run(a) = qs.start(now, 1, WorkEstimate::seats(1), description(&m, "f")) else {
        panic!()
    };
    let Admission::Wait(Queued { queue, id, rx }) =
        qs.start(now, 1, WorkEstimate::seats(1), description(&m, "f"))
    else {
        panic!()
    };
    assert!(qs.cancel(now, queue, id, RejectReason::TimeOut));
    assert!(!qs.cancel(now, queue, id, RejectReason::TimeOut));
    drop(rx);
    qs.check();
    assert_eq!(qs.counts().timed_out, 1);
    qs.finish(now, &a);
    assert!(qs.is_idle());
    qs.check();
}

#[test]
fn fewer_queues_take_effect_as_the_surplus_drains() {
    let (m, mut qs, now) = queue_set(queuing(16, 2, 10), 1);
    let mut running = Vec::new();
    let mut waiting = Vec::new();
    // Queue requests until one waits beyond the fourth queue.
    for hash in 1.. {
        match qs.start(now, hash, WorkEstimate::seats(1), description(&m, "f")) {
            Admission::Run(a) => running.push(a),
            Admission::Wait(Queued { queue, rx, .. }) => {
                waiting.push(rx);
                if queue >= 4 {
                    break;
                }
            }
            Admission::Reject(_) => unreachable!(),
        }
    }
    qs.set_limit_response(queuing(4, 2, 10));
    assert!(qs.queues().count() > 4, "a queue with requests stays");
    qs.check();
    while let Some(a) = running.pop() {
        qs.finish(now, &a);
        qs.check();
        for rx in &mut waiting {
            if let Ok(a) = rx.try_recv() {
                running.push(a);
            }
        }
    }
    assert!(qs.is_idle());
    assert_eq!(qs.queues().count(), 4);
}
