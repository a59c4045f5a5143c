//! One queue of a queue set (k8s.io/apiserver `fairqueuing/queueset/types.go`'s `queue` and
//! `fifo_list.go`): the requests waiting in arrival order, the sums the dispatcher and the
//! shuffle sharder compare, and the queue's virtual start time.

use std::collections::VecDeque;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Admitted, Description};
use crate::request::seats::{CompletedWork, SeatSeconds};

/// A request waiting in a queue.
pub struct Waiter {
    pub id: u64,
    pub work: CompletedWork,
    /// R when it arrived: its queue's virtual start never precedes it.
    pub arrival_r: SeatSeconds,
    pub arrived: Instant,
    pub description: Description,
    /// Told when it is dispatched. Dropped unsent when it is taken out for any other reason.
    pub tx: oneshot::Sender<Admitted>,
}

/// Sums over the waiting requests of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSum {
    pub initial_seats: u64,
    pub max_seats: u64,
    pub total_work: SeatSeconds,
}

#[derive(Default)]
pub struct Queue {
    waiting: VecDeque<Waiter>,
    sum: QueueSum,
    /// R at which its next request is dispatched in the virtual world.
    pub next_dispatch_r: SeatSeconds,
    /// Requests from this queue executing, in their initial phase.
    pub executing: u32,
    /// Seats those requests hold, including final phases still running.
    pub seats_in_use: u32,
}

impl Queue {
    pub fn waiting(&self) -> &VecDeque<Waiter> {
        &self.waiting
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn sum(&self) -> QueueSum {
        self.sum
    }

    pub fn oldest(&self) -> Option<&Waiter> {
        self.waiting.front()
    }

    /// Counts toward the virtual clock's rate: something waits or executes here.
    pub fn is_active(&self) -> bool {
        !self.waiting.is_empty() || self.executing > 0
    }

    /// Nothing waits, executes or lingers here: the queue may be dropped.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.executing == 0 && self.seats_in_use == 0
    }

    pub fn push(&mut self, w: Waiter) {
        self.sum.initial_seats += u64::from(w.work.estimate.initial_seats);
        self.sum.max_seats += u64::from(w.work.max_seats());
        self.sum.total_work = self.sum.total_work.wrapping_add(w.work.total);
        self.waiting.push_back(w);
    }

    pub fn pop(&mut self) -> Option<Waiter> {
        let w = self.waiting.pop_front()?;
        self.deduct(&w);
        Some(w)
    }

    /// Takes out the waiter `id`, if it is still here. A queue can grow past its level's queue
    /// length limit (kube's queue-full rule applies only while every seat is in use, and a wide
    /// request at the head can wait with seats free), but ids are handed out in increasing order
    /// and pushed at the back, so the queue is sorted by id and a binary search finds it.
    pub fn remove(&mut self, id: u64) -> Option<Waiter> {
        let at = self.waiting.binary_search_by_key(&id, |w| w.id).ok()?;
        let w = self.waiting.remove(at)?;
        self.deduct(&w);
        Some(w)
    }

    fn deduct(&mut self, w: &Waiter) {
        self.sum.initial_seats -= u64::from(w.work.estimate.initial_seats);
        self.sum.max_seats -= u64::from(w.work.max_seats());
        self.sum.total_work = self.sum.total_work.wrapping_sub(w.work.total);
    }

    /// Winds the readings of R held here back by `by` (an epoch advance).
    pub fn rewind(&mut self, by: SeatSeconds) -> bool {
        let mut ok = true;
        let before = self.next_dispatch_r;
        self.next_dispatch_r = before.wrapping_sub(by);
        ok &= self.next_dispatch_r <= before;
        for w in &mut self.waiting {
            let before = w.arrival_r;
            w.arrival_r = before.wrapping_sub(by);
            ok &= w.arrival_r <= before;
        }
        ok
    }
}
