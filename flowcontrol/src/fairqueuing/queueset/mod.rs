//! Fair queuing for server requests: one priority level's queues and seats (k8s.io/apiserver
//! `fairqueuing/queueset/queueset.go`; the technique is explained in that package's `doc.go`).
//!
//! A level has a concurrency limit in seats. A request that finds a seat free and nobody waiting
//! runs at once; otherwise it waits in one of its flow's queues (shuffle sharding), or is refused
//! when that queue is full. Whenever seats free up, the waiting request with the smallest
//! *virtual finish time* goes next: each queue has a virtual start time that advances by the work
//! of every request it dispatches, measured on a clock R that runs at the rate each active queue
//! would be served if seats were shared equally. A flow that sends more than its share builds up
//! a virtual start far in the future and waits; a flow that sends little is served almost at once.
//!
//! This is a state machine with no locks, no clock and no tasks of its own: the caller
//! (`dispatch.rs`) holds it under its level's one mutex and passes the time in. Everything here is
//! kube's algorithm, step for step, including its anti-windup bound and epoch advance; the
//! differences are in the bookkeeping only: the clock's rate comes from running sums instead of
//! a scan of every queue, a queue left over after its level's queue count was lowered is dropped
//! from the end only (so a queue's index never changes while a request refers to it), and a
//! request that can run at once skips the queue it would have left straight away (same outcome,
//! no wake-up).

mod dump;
mod queue;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use gateway_request::identity::UserInfo;
use gateway_request::request_info::RequestInfo;

use crate::admission::Admission;
use crate::fairqueuing::integrator::{Integrator, Results};
use crate::fairqueuing::shuffle_shard::{Dealer, Hand};
use crate::metrics::{DispatchReading, FlowMetrics, LevelMetrics, RejectReason};
use crate::model::{Distinguisher, LimitResponse};
use crate::request::seats::{CompletedWork, SeatSeconds, WorkEstimate};

pub use dump::{Counts, QueueDump, RequestDump};
pub use queue::QueueSum;
use queue::{Queue, Waiter};

/// kube's guess at every request's service time (`estimatedServiceDuration`), corrected by the
/// real one when the request ends.
const ESTIMATED_SERVICE: Duration = Duration::from_millis(3);
/// R is wound back by this much once it passes [`HIGH_R`], before it can overflow.
const R_DECREMENT: SeatSeconds = SeatSeconds(u64::MAX / 2);
const HIGH_R: SeatSeconds = SeatSeconds(u64::MAX / 2 + u64::MAX / 4);

/// Who a request is, for the metrics and the debug dumps. Held by value (its parts are shared),
/// so that a request that runs at once allocates nothing here.
#[derive(Clone)]
pub struct Description {
    pub flow: Arc<FlowMetrics>,
    pub schema: Arc<str>,
    pub distinguisher: Option<Distinguisher>,
    pub user: Arc<UserInfo>,
    pub info: Arc<RequestInfo>,
}

impl Description {
    /// The flow distinguisher, as the dumps show it.
    pub fn flow_distinguisher(&self) -> &str {
        match self.distinguisher {
            Some(Distinguisher::ByUser) => &self.user.name,
            Some(Distinguisher::ByNamespace) => self.info.namespace(),
            None => "",
        }
    }

    pub fn is_watch(&self) -> bool {
        self.info.verb() == "watch"
    }
}

/// A request given its seats.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    /// Its entry among the executing requests.
    pub slot: usize,
    /// The queue it came through (none at an exempt or rejecting level).
    pub queue: Option<u32>,
    pub work: CompletedWork,
    pub started: Instant,
}

/// A request waiting in queue `queue` under `id`; `rx` gets its seats when it is dispatched.
pub struct Queued {
    pub queue: u32,
    pub id: u64,
    pub rx: oneshot::Receiver<Admitted>,
}

/// What finishing a request leaves behind.
pub enum Finished {
    /// Every seat is free.
    Done,
    /// Its final seats stay taken this long (watch events of a write): release them then with
    /// [`QueueSet::release_final`].
    Linger(Duration),
}

/// A request that is executing, for the dumps.
struct Running {
    description: Description,
    queue: Option<u32>,
    work: WorkEstimate,
    arrived: Instant,
    started: Instant,
}

pub struct QueueSet {
    /// The level's name, for the log.
    name: Arc<str>,
    limit_response: LimitResponse,
    dealer: Option<Dealer>,
    /// Queues beyond this many are left over from an earlier configuration and drain away.
    desired_queues: usize,
    queue_length_limit: usize,
    concurrency_limit: u32,
    queues: Vec<Queue>,
    current_r: SeatSeconds,
    last_sync: Instant,
    robin: usize,
    enqueues: usize,
    waiting: u32,
    seats_waiting: u64,
    executing: u32,
    seats_in_use: u64,
    /// The part of `seats_in_use` held through queues.
    seats_in_queues: u64,
    /// Queues with a request waiting or executing.
    active_queues: u32,
    counts: Counts,
    running: Vec<Option<Running>>,
    free_slots: Vec<usize>,
    next_id: u64,
    demand: Integrator,
    metrics: Arc<LevelMetrics>,
}

impl QueueSet {
    pub fn new(
        name: Arc<str>,
        limit_response: LimitResponse,
        metrics: Arc<LevelMetrics>,
        now: Instant,
    ) -> Self {
        let mut qs = Self {
            name,
            limit_response: LimitResponse::Reject,
            dealer: None,
            desired_queues: 0,
            queue_length_limit: 0,
            concurrency_limit: 0,
            queues: Vec::new(),
            current_r: SeatSeconds::ZERO,
            last_sync: now,
            robin: 0,
            enqueues: 0,
            waiting: 0,
            seats_waiting: 0,
            executing: 0,
            seats_in_use: 0,
            seats_in_queues: 0,
            active_queues: 0,
            counts: Counts::default(),
            running: Vec::new(),
            free_slots: Vec::new(),
            next_id: 0,
            demand: Integrator::new(now),
            metrics,
        };
        qs.set_limit_response(limit_response);
        qs
    }

    /// A new queuing configuration. More queues are added at once; fewer take effect as the
    /// surplus queues at the end empty.
    pub fn set_limit_response(&mut self, limit_response: LimitResponse) {
        self.limit_response = limit_response;
        match limit_response {
            LimitResponse::Queue(q) => {
                self.dealer = Some(q.dealer());
                self.desired_queues = q.queues as usize;
                self.queue_length_limit = q.queue_length_limit as usize;
                if self.queues.len() < self.desired_queues {
                    self.queues.resize_with(self.desired_queues, Queue::default);
                }
            }
            LimitResponse::Reject | LimitResponse::Exempt => {
                self.dealer = None;
                self.desired_queues = 0;
            }
        }
        self.trim_queues();
    }

    pub fn concurrency_limit(&self) -> u32 {
        self.concurrency_limit
    }

    /// A new concurrency limit: as many waiting requests as now fit are dispatched.
    pub fn set_concurrency_limit(&mut self, limit: u32, now: Instant) {
        self.sync(now);
        self.concurrency_limit = limit;
        self.dispatch_all(now);
    }

    /// Nothing waiting and nothing executing.
    pub fn is_idle(&self) -> bool {
        self.waiting == 0 && self.executing == 0
    }

    /// The seat demand since the last call (for borrowing).
    pub fn take_demand(&mut self, now: Instant) -> Results {
        self.demand.reset(now)
    }

    /// Starts a request: admitted at once, queued, or rejected.
    pub fn start(
        &mut self,
        now: Instant,
        hash: u64,
        estimate: WorkEstimate,
        description: Description,
    ) -> Admission<Admitted, Queued, RejectReason> {
        self.sync(now);
        let work = CompletedWork::new(estimate, ESTIMATED_SERVICE);
        let LimitResponse::Queue(_) = self.limit_response else {
            return self.start_unqueued(now, work, description);
        };
        let q = self.shuffle_shard(hash);
        if self.seats_in_use >= u64::from(self.concurrency_limit)
            && self.queues[q].len() >= self.queue_length_limit
        {
            self.counts.rejected += 1;
            return Admission::Reject(RejectReason::QueueFull);
        }
        // kube dispatches only while seats are free, whatever the width (a write's lingering
        // final phase can keep them all).
        if self.waiting == 0
            && self.seats_in_use < u64::from(self.concurrency_limit)
            && self.can_accommodate(work.max_seats())
        {
            return self.dispatch_at_once(now, q, work, description);
        }
        self.enqueue(now, q, work, description)
    }

    /// A level without queues: exempt, or rejecting what does not fit.
    fn start_unqueued(
        &mut self,
        now: Instant,
        work: CompletedWork,
        description: Description,
    ) -> Admission<Admitted, Queued, RejectReason> {
        if self.limit_response != LimitResponse::Exempt && !self.can_accommodate(work.max_seats()) {
            self.counts.rejected += 1;
            return Admission::Reject(RejectReason::ConcurrencyLimit);
        }
        Admission::Run(self.run(now, None, work, now, description))
    }

    /// It would be the only request waiting, and it fits: kube enqueues and dispatches it in the
    /// same breath; this does the same to the books without the queue.
    fn dispatch_at_once(
        &mut self,
        now: Instant,
        q: usize,
        mut work: CompletedWork,
        description: Description,
    ) -> Admission<Admitted, Queued, RejectReason> {
        let queue = &mut self.queues[q];
        if !queue.is_active() {
            queue.next_dispatch_r = self.current_r;
        }
        queue.next_dispatch_r = queue.next_dispatch_r.max(self.current_r);
        let s = queue.next_dispatch_r;
        self.robin = q;
        self.metrics.dispatch(&DispatchReading {
            r: self.current_r.to_f64(),
            s: s.to_f64(),
            s_min: s.to_f64(),
            s_max: s.to_f64(),
            discounted_s_min: s.to_f64(),
            discounted_s_max: s.to_f64(),
        });
        work.fit_final_seats(self.concurrency_limit);
        self.queues[q].next_dispatch_r = s.wrapping_add(work.total);
        // kube observes the length right after enqueueing, itself included.
        description.flow.queue_length(1);
        Admission::Run(self.run(now, Some(q as u32), work, now, description))
    }

    /// Puts the request in queue `q` and dispatches what the free seats allow.
    fn enqueue(
        &mut self,
        now: Instant,
        q: usize,
        work: CompletedWork,
        description: Description,
    ) -> Admission<Admitted, Queued, RejectReason> {
        let seats = work.max_seats();
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = oneshot::channel();
        let was_active = self.queues[q].is_active();
        if !was_active {
            self.queues[q].next_dispatch_r = self.current_r;
        }
        let flow = Arc::clone(&description.flow);
        flow.queued(1, seats);
        self.queues[q].push(Waiter {
            id,
            work,
            arrival_r: self.current_r,
            arrived: now,
            description,
            tx,
        });
        self.note_activity(q, was_active);
        self.waiting += 1;
        self.seats_waiting += u64::from(seats);
        self.note_demand(now);
        flow.queue_length(self.queues[q].len());
        self.bound_next_dispatch(q);
        self.dispatch_all(now);
        Admission::Wait(Queued {
            queue: q as u32,
            id,
            rx,
        })
    }

    /// Takes a waiting request out of its queue (it waited too long, or its client left).
    /// `false` when it is no longer waiting: it was dispatched, and its seats must be finished.
    pub fn cancel(&mut self, now: Instant, queue: u32, id: u64, reason: RejectReason) -> bool {
        self.sync(now);
        let q = queue as usize;
        let Some(was_active) = self.queues.get(q).map(Queue::is_active) else {
            return false;
        };
        let Some(w) = self.queues[q].remove(id) else {
            return false;
        };
        self.note_activity(q, was_active);
        self.waiting -= 1;
        self.seats_waiting -= u64::from(w.work.max_seats());
        w.description.flow.queued(-1, w.work.max_seats());
        self.counts.rejected += 1;
        match reason {
            RejectReason::TimeOut => self.counts.timed_out += 1,
            _ => self.counts.cancelled += 1,
        }
        self.note_demand(now);
        self.bound_next_dispatch(q);
        self.trim_queues();
        true
    }

    /// A request's initial phase is over.
    pub fn finish(&mut self, now: Instant, a: &Admitted) -> Finished {
        self.sync(now);
        let outcome = self.end(now, a);
        self.dispatch_all(now);
        outcome
    }

    fn end(&mut self, now: Instant, a: &Admitted) -> Finished {
        let Some(running) = self.running.get_mut(a.slot).and_then(Option::take) else {
            return Finished::Done;
        };
        self.free_slots.push(a.slot);
        self.executing -= 1;
        let flow = &running.description.flow;
        flow.executing(-1);
        let served = now.saturating_duration_since(a.started);
        if let Some(q) = a.queue.map(|q| q as usize) {
            let was_active = self.queues[q].is_active();
            let queue = &mut self.queues[q];
            queue.executing -= 1;
            // Charge the queue what the request really took instead of the estimate.
            let correction = SeatSeconds::seats_times_nanos(
                f64::from(a.work.estimate.initial_seats),
                ESTIMATED_SERVICE.as_nanos() as i128 - served.as_nanos() as i128,
            );
            queue.next_dispatch_r = queue.next_dispatch_r.wrapping_sub(correction);
            self.note_activity(q, was_active);
            self.bound_next_dispatch(q);
        }
        if a.work.estimate.additional_latency.is_zero() {
            self.release_seats(now, a.queue, a.work.max_seats(), flow);
            Finished::Done
        } else {
            Finished::Linger(a.work.estimate.additional_latency)
        }
    }

    /// The final phase of a request that lingered is over.
    pub fn release_final(&mut self, now: Instant, a: &Admitted, flow: &FlowMetrics) {
        self.sync(now);
        self.release_seats(now, a.queue, a.work.max_seats(), flow);
        self.dispatch_all(now);
    }

    fn release_seats(&mut self, now: Instant, queue: Option<u32>, seats: u32, flow: &FlowMetrics) {
        self.seats_in_use -= u64::from(seats);
        flow.executing_seats(-i64::from(seats));
        if let Some(q) = queue {
            self.queues[q as usize].seats_in_use -= seats;
            self.seats_in_queues -= u64::from(seats);
        }
        self.note_demand(now);
        self.trim_queues();
    }

    /// Gives `work` its seats and records it as executing.
    fn run(
        &mut self,
        now: Instant,
        queue: Option<u32>,
        work: CompletedWork,
        arrived: Instant,
        description: Description,
    ) -> Admitted {
        let seats = work.max_seats();
        self.executing += 1;
        self.seats_in_use += u64::from(seats);
        self.counts.dispatched += 1;
        if let Some(q) = queue.map(|q| q as usize) {
            let was_active = self.queues[q].is_active();
            self.queues[q].executing += 1;
            self.queues[q].seats_in_use += seats;
            self.seats_in_queues += u64::from(seats);
            self.note_activity(q, was_active);
        }
        let flow = &description.flow;
        flow.dispatched();
        flow.executing(1);
        flow.executing_seats(i64::from(seats));
        self.note_demand(now);
        let entry = Running {
            description,
            queue,
            work: work.estimate,
            arrived,
            started: now,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.running[s] = Some(entry);
                s
            }
            None => {
                self.running.push(Some(entry));
                self.running.len() - 1
            }
        };
        Admitted {
            slot,
            queue,
            work,
            started: now,
        }
    }

    /// Ends at once a request whose waiter was gone when it was dispatched.
    fn unrun(&mut self, now: Instant, a: &Admitted) {
        let flow = match self.running.get(a.slot) {
            Some(Some(r)) => Arc::clone(&r.description.flow),
            _ => return,
        };
        if let Finished::Linger(_) = self.end(now, a) {
            self.release_seats(now, a.queue, a.work.max_seats(), &flow);
        }
    }

    /// Dispatches waiting requests while seats are free (kube's `dispatchAsMuchAsPossibleLocked`).
    fn dispatch_all(&mut self, now: Instant) {
        while self.waiting > 0
            && self.seats_in_use < u64::from(self.concurrency_limit)
            && self.dispatch_one(now)
        {}
    }

    /// Dispatches the oldest request of the queue with the earliest virtual finish, if it fits.
    fn dispatch_one(&mut self, now: Instant) -> bool {
        let Some(q) = self.pick_queue() else {
            return false;
        };
        let was_active = self.queues[q].is_active();
        let Some(mut w) = self.queues[q].pop() else {
            return false;
        };
        // Take back what enqueueing counted, before the final phase is narrowed to fit.
        let queued_seats = w.work.max_seats();
        w.work.fit_final_seats(self.concurrency_limit);
        self.waiting -= 1;
        self.seats_waiting -= u64::from(queued_seats);
        w.description.flow.queued(-1, queued_seats);
        self.note_activity(q, was_active);
        if w.tx.is_closed() {
            // Its waiter is gone (it can only go under this lock, so this is belt and braces).
            self.counts.cancelled += 1;
            self.note_demand(now);
            self.bound_next_dispatch(q);
            return true;
        }
        let start_r = self.queues[q].next_dispatch_r;
        self.queues[q].next_dispatch_r = start_r.wrapping_add(w.work.total);
        let admitted = self.run(now, Some(q as u32), w.work, w.arrived, w.description);
        if w.tx.send(admitted).is_err() {
            self.unrun(now, &admitted);
        }
        self.bound_next_dispatch(q);
        true
    }

    /// The queue whose oldest request has the earliest virtual finish, searched round-robin
    /// from the one after the last dispatch so that ties take turns; `None` when that request
    /// does not fit yet (it is not passed over: later, smaller requests wait behind it).
    fn pick_queue(&mut self) -> Option<usize> {
        let n = self.queues.len();
        let mut best: Option<(SeatSeconds, usize)> = None;
        let (mut s_min, mut s_max) = (SeatSeconds::MAX, SeatSeconds::ZERO);
        let (mut ds_min, mut ds_max) = (SeatSeconds::MAX, SeatSeconds::ZERO);
        for step in 1..=n {
            let i = (self.robin + step) % n;
            let queue = &self.queues[i];
            let Some(oldest) = queue.oldest() else {
                continue;
            };
            let s = queue.next_dispatch_r;
            let in_progress =
                SeatSeconds::seats_times(f64::from(queue.seats_in_use), ESTIMATED_SERVICE);
            s_min = s_min.min(s);
            s_max = s_max.max(s);
            ds_min = ds_min.min(s.wrapping_sub(in_progress));
            ds_max = ds_max.max(s.wrapping_sub(in_progress));
            let finish = s.wrapping_add(oldest.work.total);
            if best.is_none_or(|(f, _)| finish < f) {
                best = Some((finish, i));
            }
        }
        let (_, q) = best?;
        let oldest = self.queues[q].oldest()?;
        if !self.can_accommodate(oldest.work.max_seats()) {
            oldest.description.flow.no_accommodation();
            return None;
        }
        self.robin = q;
        self.metrics.dispatch(&DispatchReading {
            r: self.current_r.to_f64(),
            s: self.queues[q].next_dispatch_r.to_f64(),
            s_min: s_min.to_f64(),
            s_max: s_max.to_f64(),
            discounted_s_min: ds_min.to_f64(),
            discounted_s_max: ds_max.to_f64(),
        });
        Some(q)
    }

    /// Whether `seats` more fit now. A request wider than the whole limit runs alone.
    fn can_accommodate(&self, seats: u32) -> bool {
        match self.limit_response {
            LimitResponse::Exempt => true,
            _ if seats > self.concurrency_limit => self.executing == 0,
            _ => self.seats_in_use + u64::from(seats) <= u64::from(self.concurrency_limit),
        }
    }

    /// The least loaded queue (by waiting work) of the flow's hand, starting from a rotating
    /// offset so that equal queues take turns.
    fn shuffle_shard(&mut self, hash: u64) -> usize {
        let dealer = self.dealer.expect("a queuing level has a dealer");
        let mut hand: Hand = [0; 60];
        let hand = dealer.deal(hash, &mut hand);
        let offset = self.enqueues % hand.len();
        self.enqueues = self.enqueues.wrapping_add(1);
        let mut best = (SeatSeconds::MAX, hand[offset]);
        for i in 0..hand.len() {
            let q = hand[(offset + i) % hand.len()];
            let work = self.queues[q].sum().total_work;
            if work < best.0 {
                best = (work, q);
            }
        }
        best.1
    }

    /// kube's anti-windup: a queue's virtual start never precedes its oldest request's arrival,
    /// so a queue that cannot use its share does not bank credit.
    fn bound_next_dispatch(&mut self, q: usize) {
        let queue = &mut self.queues[q];
        if let Some(arrival) = queue.oldest().map(|w| w.arrival_r) {
            if queue.next_dispatch_r < arrival {
                queue.next_dispatch_r = arrival;
            }
        }
    }

    /// Advances R to `now`, at the rate the state since the last change gave it.
    fn sync(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last_sync);
        self.last_sync = now;
        if self.active_queues > 0 {
            let demand =
                (self.seats_in_queues + self.seats_waiting).min(u64::from(self.concurrency_limit));
            let rate = demand as f64 / f64::from(self.active_queues);
            let before = self.current_r;
            self.current_r = before.wrapping_add(SeatSeconds::seats_times(rate, dt));
            if self.current_r < before {
                tracing::error!(priority_level = %self.name, "the fair queuing clock overflowed");
            } else if self.current_r >= HIGH_R {
                self.advance_epoch();
            }
        }
        self.metrics.current_r(self.current_r.to_f64());
    }

    /// Winds R and every reading of it back by [`R_DECREMENT`].
    fn advance_epoch(&mut self) {
        self.current_r = self.current_r.wrapping_sub(R_DECREMENT);
        let mut ok = true;
        for queue in &mut self.queues {
            if queue.len() == 0 && queue.executing == 0 {
                queue.next_dispatch_r = SeatSeconds::ZERO;
                continue;
            }
            ok &= queue.rewind(R_DECREMENT);
        }
        self.metrics.epoch_advanced(ok);
    }

    fn note_activity(&mut self, q: usize, was_active: bool) {
        match (was_active, self.queues[q].is_active()) {
            (false, true) => self.active_queues += 1,
            (true, false) => self.active_queues -= 1,
            _ => {}
        }
    }

    fn note_demand(&mut self, now: Instant) {
        self.demand
            .set((self.seats_in_use + self.seats_waiting) as f64, now);
    }

    /// Drops surplus queues from the end once they are idle.
    fn trim_queues(&mut self) {
        while self.queues.len() > self.desired_queues
            && self.queues.last().is_some_and(Queue::is_idle)
        {
            self.queues.pop();
            if self.robin >= self.queues.len() {
                self.robin = self.queues.len().saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests;
