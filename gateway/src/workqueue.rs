//! The one shape every control loop of the gateway has: a per-key work queue, as kube-aggregator's
//! controllers use client-go's rate-limited work queues and kube-runtime's `Controller` runs its
//! reconcilers.
//!
//! * Inputs (a `watch` channel, a resolver change, a report from the proxy, a timer) call
//!   [`Queue::add`]; adding a key that is already waiting is a no-op, so a burst of events costs
//!   one run.
//! * The loop takes keys with [`WorkQueue::next`] and starts one reconcile per key with
//!   [`WorkQueue::start`]. A key is never reconciled twice at once: added while it runs, it runs
//!   again once the current run is done. Different keys run concurrently, so one backend that
//!   hangs until its timeout never holds back another key's result.
//! * When a run is done the loop decides what follows with [`WorkQueue::retry`] (failure: the
//!   key's own exponential backoff) or [`WorkQueue::resync`] (success: backoff reset, the key
//!   comes back after the periodic interval).
//!
//! The delaying and de-duplication are kube-runtime's [`scheduler`], the backoff is `backon`'s
//! exponential backoff (what kube-runtime's watcher uses). What neither gives is the part in
//! between: kube-runtime's runner is private to its `Controller`, and that `Controller` only
//! reconciles Kubernetes objects from a reflector store, while our keys are APIService names from
//! a directory as well, Services, and the core server itself. That part is this file.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use kube::runtime::scheduler::{scheduler, ScheduleRequest, Scheduler};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

type Requests<K> = UnboundedReceiverStream<ScheduleRequest<K>>;
type Running<K, O> = FuturesUnordered<Pin<Box<dyn Future<Output = (K, O)> + Send>>>;

/// Adds keys to a [`WorkQueue`] from anywhere (another task, a request handler). Cheap to clone.
pub struct Queue<K> {
    tx: mpsc::UnboundedSender<ScheduleRequest<K>>,
}

// === impl Queue ===

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<K> Queue<K> {
    /// Marks `key` dirty: it runs as soon as it is not already running.
    pub fn add(&self, key: K) {
        self.add_at(key, Instant::now());
    }

    /// Marks `key` dirty after `delay`. An earlier request for the same key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_at(key, Instant::now() + delay);
    }

    fn add_at(&self, message: K, run_at: Instant) {
        // The receiver lives as long as the loop that owns it; after that nothing is listening.
        let _ = self.tx.send(ScheduleRequest { message, run_at });
    }
}

/// The exponential backoff of a failing key: kube-aggregator's rate limiters, e.g.
/// 5 ms → 30 s for availability and 500 ms → 1 min for discovery.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

// === impl Backoff ===

impl Backoff {
    fn start(self) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
            .build()
    }
}

/// What [`WorkQueue::next`] hands the loop.
pub enum Next<K, O> {
    /// `key` is due: start its reconcile with [`WorkQueue::start`] (or drop it if it no longer
    /// exists).
    Ready(K),
    /// A reconcile finished with `outcome`; the key may run again from now on.
    Done(K, O),
}

/// A per-key work queue with concurrent, per-key-exclusive reconciles; see the module docs.
pub struct WorkQueue<K, O> {
    queue: Queue<K>,
    scheduler: Pin<Box<Scheduler<K, Requests<K>>>>,
    running: Running<K, O>,
    running_keys: HashSet<K>,
    /// Keys that failed last time, with where they are in their backoff.
    failing: HashMap<K, ExponentialBackoff>,
    backoff: Box<dyn Fn(&K) -> Backoff + Send + Sync>,
}

// === impl WorkQueue ===

impl<K, O> WorkQueue<K, O>
where
    K: Clone + Eq + Hash + Send + Unpin + 'static,
    O: Send + 'static,
{
    /// `backoff` gives each key's retry policy (several kinds of key can share one queue).
    pub fn new(backoff: impl Fn(&K) -> Backoff + Send + Sync + 'static) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            queue: Queue { tx },
            scheduler: Box::pin(scheduler(UnboundedReceiverStream::new(rx))),
            running: FuturesUnordered::new(),
            running_keys: HashSet::new(),
            failing: HashMap::new(),
            backoff: Box::new(backoff),
        }
    }

    /// A handle that adds keys to this queue.
    pub fn queue(&self) -> &Queue<K> {
        &self.queue
    }

    /// The next due key or finished reconcile. Cancel-safe: nothing is lost when another branch
    /// of a `select!` wins.
    pub async fn next(&mut self) -> Next<K, O> {
        let Self {
            scheduler,
            running,
            running_keys,
            ..
        } = self;
        let finished = {
            let held: &HashSet<K> = running_keys;
            let mut due = scheduler.as_mut().hold_unless(|k| !held.contains(k));
            tokio::select! {
                Some(finished) = running.next(), if !running.is_empty() => finished,
                Some(key) = due.next() => return Next::Ready(key),
            }
        };
        let (key, outcome) = finished;
        running_keys.remove(&key);
        Next::Done(key, outcome)
    }

    /// Runs `reconcile` for `key`; its outcome comes back from [`WorkQueue::next`].
    pub fn start(&mut self, key: K, reconcile: impl Future<Output = O> + Send + 'static) {
        self.running_keys.insert(key.clone());
        self.running
            .push(Box::pin(async move { (key, reconcile.await) }));
    }

    /// The run failed: `key` comes back after the next step of its backoff, which is returned.
    pub fn retry(&mut self, key: K) -> Duration {
        self.retry_at_most(key, Duration::MAX)
    }

    /// [`WorkQueue::retry`], but never later than `max`: for a key whose failure is worth
    /// watching closely (an unavailable backend that may be back any moment) while its backoff
    /// still grows from the first quick retries.
    pub fn retry_at_most(&mut self, key: K, max: Duration) -> Duration {
        let policy = (self.backoff)(&key);
        let delay = self
            .failing
            .entry(key.clone())
            .or_insert_with(|| policy.start())
            .next()
            .unwrap_or(policy.max)
            .min(max);
        self.queue.add_after(key, delay);
        delay
    }

    /// The run succeeded: the backoff starts over, and `key` comes back after `interval` (the
    /// periodic resync; `None` for keys that only run when an input marks them).
    pub fn resync(&mut self, key: K, interval: Option<Duration>) {
        self.failing.remove(&key);
        if let Some(interval) = interval {
            self.queue.add_after(key, interval);
        }
    }

    /// Forgets a key that no longer exists: its backoff goes. A resync already scheduled still
    /// comes out of [`WorkQueue::next`]; the loop drops keys it does not know.
    pub fn forget(&mut self, key: &K) {
        self.failing.remove(key);
    }

    /// Whether `key`'s last run failed (it is in its backoff).
    pub fn is_failing(&self, key: &K) -> bool {
        self.failing.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn quick(_: &&'static str) -> Backoff {
        Backoff {
            min: Duration::from_millis(5),
            max: Duration::from_secs(30),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_key_does_not_hold_back_another() {
        let mut q: WorkQueue<&'static str, &'static str> = WorkQueue::new(quick);
        q.queue().add("hung");
        q.queue().add("healthy");
        let started = Instant::now();
        let mut done = Vec::new();
        while done.len() < 2 {
            match q.next().await {
                Next::Ready(key) => {
                    let wait = if key == "hung" { 5_000 } else { 10 };
                    q.start(key, async move {
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        key
                    });
                }
                Next::Done(key, _) => done.push((key, started.elapsed())),
            }
        }
        assert_eq!(done[0].0, "healthy");
        assert!(done[0].1 < Duration::from_millis(100), "{done:?}");
        assert_eq!(done[1].0, "hung");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_it_runs_runs_again_once_not_twice_at_once() {
        let mut q: WorkQueue<&'static str, ()> = WorkQueue::new(quick);
        let runs = Arc::new(AtomicUsize::new(0));
        let concurrent = Arc::new(AtomicUsize::new(0));
        q.queue().add("a");
        let mut finished = 0;
        while finished < 2 {
            match q.next().await {
                Next::Ready(key) => {
                    let (runs, concurrent) = (runs.clone(), concurrent.clone());
                    assert_eq!(concurrent.fetch_add(1, Ordering::SeqCst), 0);
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Three more adds while it runs: they collapse into one more run.
                    for _ in 0..3 {
                        q.queue().add(key);
                    }
                    q.start(key, async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        concurrent.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                Next::Done(..) => finished += 1,
            }
        }
        // The second run added the key again; nothing more is due after it.
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_success_resets() {
        let mut q: WorkQueue<&'static str, ()> = WorkQueue::new(|_| Backoff {
            min: Duration::from_millis(5),
            max: Duration::from_millis(40),
        });
        // backon adds no jitter unless asked (its float steps round to the microsecond).
        let ms = |d: Duration| (d.as_secs_f64() * 1e3).round() as u64;
        let delays: Vec<u64> = (0..6).map(|_| ms(q.retry("a"))).collect();
        assert_eq!(delays, [5, 10, 20, 40, 40, 40]);
        assert!(q.is_failing(&"a"));
        q.resync("a", None);
        assert!(!q.is_failing(&"a"));
        assert_eq!(ms(q.retry("a")), 5);
        // A cap shortens the wait, not the backoff: it keeps growing underneath.
        let capped: Vec<u64> = (0..4)
            .map(|_| ms(q.retry_at_most("a", Duration::from_millis(15))))
            .collect();
        assert_eq!(capped, [10, 15, 15, 15]);
        assert_eq!(ms(q.retry("a")), 40);
    }

    #[tokio::test(start_paused = true)]
    async fn resync_brings_a_key_back_after_the_interval() {
        let mut q: WorkQueue<&'static str, ()> = WorkQueue::new(quick);
        let start = Instant::now();
        q.resync("a", Some(Duration::from_secs(30)));
        match q.next().await {
            Next::Ready(key) => assert_eq!(key, "a"),
            Next::Done(..) => panic!("nothing was running"),
        }
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }
}
