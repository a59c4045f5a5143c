//! What a queue set shows of itself in kube's debug dumps (`queueset.go`'s `Dump`).

use tokio::time::Instant;

use super::{Description, QueueSet, QueueSum};
use crate::request::seats::{SeatSeconds, WorkEstimate};

/// Counters kube's `dump_priority_levels` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub dispatched: u64,
    pub rejected: u64,
    pub timed_out: u64,
    pub cancelled: u64,
}

impl QueueSet {
    pub fn counts(&self) -> Counts {
        self.counts
    }

    pub fn waiting(&self) -> u32 {
        self.waiting
    }

    pub fn executing(&self) -> u32 {
        self.executing
    }

    pub fn queues(&self) -> impl Iterator<Item = QueueDump> + '_ {
        self.queues.iter().map(|q| QueueDump {
            waiting: q.len(),
            executing: q.executing,
            seats_in_use: q.seats_in_use,
            next_dispatch_r: q.next_dispatch_r,
            sum: q.sum(),
        })
    }

    /// Every request, waiting (by queue and position) or executing (position `-1`, queue `-1`
    /// when it came through none).
    pub fn requests(&self) -> Vec<RequestDump> {
        let mut out = Vec::new();
        for (qi, q) in self.queues.iter().enumerate() {
            for (ri, w) in q.waiting().iter().enumerate() {
                out.push(RequestDump {
                    queue: qi as i64,
                    position: ri as i64,
                    description: w.description.clone(),
                    work: w.work.estimate,
                    arrived: w.arrived,
                    started: None,
                });
            }
        }
        for r in self.running.iter().flatten() {
            out.push(RequestDump {
                queue: r.queue.map_or(-1, i64::from),
                position: -1,
                description: r.description.clone(),
                work: r.work,
                arrived: r.arrived,
                started: Some(r.started),
            });
        }
        out
    }
}

pub struct QueueDump {
    pub waiting: usize,
    pub executing: u32,
    pub seats_in_use: u32,
    pub next_dispatch_r: SeatSeconds,
    pub sum: QueueSum,
}

pub struct RequestDump {
    pub queue: i64,
    pub position: i64,
    pub description: Description,
    pub work: WorkEstimate,
    pub arrived: Instant,
    pub started: Option<Instant>,
}
