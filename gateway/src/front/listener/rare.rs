//! A future for the events that rarely end a connection (the drain, the idle timeout, an
//! HTTP/1.1 exchange's deadline), raced against the connection itself, which is woken for every
//! read and write.
//!
//! A plain `select!` polls every branch on each wake-up of the connection's task: the drain's
//! watch, two timers and a `Notify`, for nothing (BENCHMARKS.md, "Why the code is shaped so").
//! [`Rare`] hands its future a waker of its own, which notes that it fired before waking
//! the task; on any other wake-up, polling it is a pointer comparison and an atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

pin_project_lite::pin_project! {
    /// `future`, polled only when a waker it registered fired (and on the first poll).
    pub struct Rare<F> {
        #[pin]
        future: F,
        fired: Arc<Fired>,
        // `fired` as a waker: what `future` registers.
        waker: Waker,
        // The task's waker that `fired` holds, kept here to compare without the lock.
        task: Option<Waker>,
    }
}

/// Whether the rare future's waker fired, and the task to wake when it does.
struct Fired {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl<F> Rare<F> {
    pub fn new(future: F) -> Self {
        let fired = Arc::new(Fired {
            // The first poll polls `future`, which registers its wakers.
            fired: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Rare {
            future,
            waker: Waker::from(fired.clone()),
            fired,
            task: None,
        }
    }
}

impl<F: Future> Future for Rare<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // The task's waker is stored before the flag is read: a wake-up after the read reaches
        // this waker, one before it left the flag set.
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            *this.task = Some(cx.waker().clone());
            *this.fired.task() = Some(cx.waker().clone());
        }
        if !this.fired.fired.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        this.future.poll(&mut Context::from_waker(this.waker))
    }
}

impl Fired {
    fn task(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.task.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        // Woken outside the lock: a waker may run code of its own.
        let task = self.task().clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    /// A future that counts its polls and waits for `notify`.
    async fn counted(polls: &AtomicUsize, notify: &Notify) {
        let notified = notify.notified();
        tokio::pin!(notified);
        std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            notified.as_mut().poll(cx)
        })
        .await
    }

    #[tokio::test]
    async fn a_rare_future_is_polled_only_on_its_own_wake_ups_and_never_missed() {
        let (polls, rare_event) = (AtomicUsize::new(0), Notify::new());
        let rare = Rare::new(counted(&polls, &rare_event));
        tokio::pin!(rare);
        let mut busy_polls = 0;
        // The task is woken 100 times by the busy branch, then once by the rare event.
        let ended = std::future::poll_fn(|cx| {
            if rare.as_mut().poll(cx).is_ready() {
                return Poll::Ready(busy_polls);
            }
            busy_polls += 1;
            match busy_polls {
                ..=100 => cx.waker().wake_by_ref(),
                101 => rare_event.notify_one(),
                _ => {}
            }
            Poll::Pending
        });
        let busy_polls = tokio::time::timeout(Duration::from_secs(10), ended)
            .await
            .expect("the rare event did not wake the task");
        assert_eq!(busy_polls, 101);
        // The first poll (registering its waker) and the one its event woke.
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }
}
