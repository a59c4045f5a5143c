//! A priority level as requests meet it: its queue set behind one mutex, a request's seats as a
//! guard that frees them when dropped, and the wait for a seat as a future with a deadline (the
//! request side of kube's `queueset.go` and `apf_filter.go`'s `Handle`).
//!
//! A request takes the level's lock once to start (and again when it ends); nothing else is
//! shared between requests of different levels, and nothing is held across an await.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use crate::admission::Admission;
use crate::fairqueuing::queueset::{Admitted, Description, Finished, QueueSet, Queued};
use crate::metrics::{FlowMetrics, LevelMetrics, RejectReason};
use crate::model::LimitResponse;
use crate::request::seats::WorkEstimate;
use crate::retry_after::RetryAfter;

/// One priority level's live state. It outlives configurations: a level that keeps its name
/// keeps its queues (and the requests in them) across changes of its spec.
pub struct PriorityLevel {
    pub name: Arc<str>,
    /// The `exempt` level (validation ties the type to the name, so it never changes).
    exempt: bool,
    queues: Mutex<QueueSet>,
    pub metrics: Arc<LevelMetrics>,
    /// The `Retry-After` of its refusals.
    pub retry_after: RetryAfter,
}

impl PriorityLevel {
    pub fn new(
        name: Arc<str>,
        limit_response: LimitResponse,
        metrics: Arc<LevelMetrics>,
    ) -> Arc<Self> {
        let queues = QueueSet::new(
            name.clone(),
            limit_response,
            metrics.clone(),
            Instant::now(),
        );
        Arc::new(Self {
            exempt: limit_response == LimitResponse::Exempt,
            name,
            queues: Mutex::new(queues),
            metrics,
            retry_after: RetryAfter::default(),
        })
    }

    /// The queue set, locked. A panic while it was held cannot leave it half-updated in a way
    /// worse than refusing every request, so a poisoned lock is taken as is.
    pub fn lock(&self) -> MutexGuard<'_, QueueSet> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for `estimate`'s seats for a request of flow `hash`. A queued request waits at
    /// most `wait_limit`.
    pub fn start(
        self: &Arc<Self>,
        hash: u64,
        estimate: WorkEstimate,
        description: Description,
        wait_limit: Duration,
    ) -> Admission<Seat, Waiting, RejectReason> {
        let arrived = Instant::now();
        let flow = Arc::clone(&description.flow);
        let watch = description.is_watch();
        let started = self.lock().start(arrived, hash, estimate, description);
        match started {
            Admission::Run(admitted) => {
                if !self.exempt {
                    flow.waited(true, arrived.elapsed().as_secs_f64());
                }
                Admission::Run(Seat {
                    level: self.clone(),
                    admitted,
                    flow,
                    watch,
                })
            }
            Admission::Reject(reason) => {
                flow.rejected(reason);
                flow.waited(false, arrived.elapsed().as_secs_f64());
                Admission::Reject(reason)
            }
            Admission::Wait(Queued { queue, id, rx }) => Admission::Wait(Waiting {
                level: Some(self.clone()),
                queue,
                id,
                rx,
                deadline: Box::pin(tokio::time::sleep_until(arrived + wait_limit)),
                flow,
                watch,
                arrived,
            }),
        }
    }

    fn finish(self: &Arc<Self>, admitted: &Admitted, flow: &Arc<FlowMetrics>, watch: bool) {
        let now = Instant::now();
        flow.executed(
            watch,
            now.saturating_duration_since(admitted.started)
                .as_secs_f64(),
        );
        let finished = self.lock().finish(now, admitted);
        if let Finished::Linger(after) = finished {
            let (level, admitted, flow) = (self.clone(), *admitted, flow.clone());
            let release = move || level.lock().release_final(Instant::now(), &admitted, &flow);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        tokio::time::sleep(after).await;
                        release();
                    });
                }
                Err(_) => release(),
            }
        }
    }
}

/// Seats held by an executing request; dropping it ends the request's initial phase (its final
/// phase, if any, ends on its own after the estimated latency).
pub struct Seat {
    level: Arc<PriorityLevel>,
    admitted: Admitted,
    flow: Arc<FlowMetrics>,
    watch: bool,
}

impl Seat {
    pub fn level(&self) -> &Arc<PriorityLevel> {
        &self.level
    }

    pub fn seats(&self) -> u32 {
        self.admitted.work.max_seats()
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.level.finish(&self.admitted, &self.flow, self.watch);
    }
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat")
            .field("level", &self.level.name)
            .field("seats", &self.seats())
            .finish()
    }
}

/// A request waiting in its queue. Dropping it before it resolves takes the request out of the
/// queue (the client went away), or, if it was dispatched meanwhile, gives the seats back.
pub struct Waiting {
    /// `None` once resolved.
    level: Option<Arc<PriorityLevel>>,
    queue: u32,
    id: u64,
    rx: oneshot::Receiver<Admitted>,
    deadline: Pin<Box<Sleep>>,
    flow: Arc<FlowMetrics>,
    watch: bool,
    arrived: Instant,
}

impl Waiting {
    fn seat(&mut self, level: Arc<PriorityLevel>, admitted: Admitted) -> Seat {
        self.flow.waited(true, self.arrived.elapsed().as_secs_f64());
        Seat {
            level,
            admitted,
            flow: self.flow.clone(),
            watch: self.watch,
        }
    }

    /// Takes the request out of its queue for `reason`; the seats instead if it was dispatched
    /// meanwhile.
    fn leave(
        &mut self,
        level: Arc<PriorityLevel>,
        reason: RejectReason,
    ) -> Result<Seat, RejectReason> {
        let removed = level
            .lock()
            .cancel(Instant::now(), self.queue, self.id, reason);
        if removed {
            self.flow.rejected(reason);
            self.flow
                .waited(false, self.arrived.elapsed().as_secs_f64());
            return Err(reason);
        }
        // Dispatched under the lock before we took it: the seats are in the channel.
        match self.rx.try_recv() {
            Ok(admitted) => Ok(self.seat(level, admitted)),
            Err(_) => Err(reason),
        }
    }
}

impl Future for Waiting {
    type Output = Result<Seat, RejectReason>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(level) = this.level.clone() else {
            return Poll::Ready(Err(RejectReason::Cancelled));
        };
        match Pin::new(&mut this.rx).poll(cx) {
            Poll::Ready(Ok(admitted)) => {
                this.level = None;
                return Poll::Ready(Ok(this.seat(level, admitted)));
            }
            Poll::Ready(Err(_)) => {
                // The queue set let go of it without dispatching it; only `leave` does that.
                this.level = None;
                return Poll::Ready(Err(RejectReason::TimeOut));
            }
            Poll::Pending => {}
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.level = None;
            return Poll::Ready(this.leave(level, RejectReason::TimeOut));
        }
        Poll::Pending
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(level) = self.level.take() {
            // A seat handed over here is dropped at once: the request is gone.
            let _ = self.leave(level, RejectReason::Cancelled);
        }
    }
}
