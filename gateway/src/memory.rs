//! Memory comes back after peaks. The gateway allocates with mimalloc (see `main.rs`), which
//! gives a page back to the system (after its purge delay, 1 s) once every block in it is free
//! and the page's own thread has looked at it again: blocks freed by another thread wait in the
//! page until then, and a thread only looks when it allocates from that page or collects. Under
//! tokio, a watch's buffers are allocated on one worker and often freed on another, and once
//! thousands of watches are closed the workers go idle: nobody looks, and resident memory stayed
//! at the peak (266–323 MB after three rounds of 10 000 watches in an earlier trial, where glibc
//! with `malloc_trim` comes back to about 25 MB).
//!
//! So every [`INTERVAL`] each runtime thread collects its own heap ([`collect_if_asked`], run by
//! the runtime's park hook, so it costs an atomic load per park in between), and the thread that
//! asks for it collects the pages left by threads that ended (tokio's blocking pool).
//! (Transparent huge pages are off for mimalloc's memory, the crate's `no_thp`: with them an
//! idle gateway was 43 MB resident instead of 25.)

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often every runtime thread collects its heap.
const INTERVAL: Duration = Duration::from_secs(5);

/// Collections asked for so far; a thread that has seen fewer collects when it next parks.
static ASKED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last of [`ASKED`] this thread collected for.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Runs for the life of the process, on the runtime whose threads [`collect_if_asked`] hooks.
/// `threads` is how many of them there are: one small task each wakes a thread that may be
/// parked since before the peak ended, so that it parks again and collects.
pub async fn collect_after_peaks(threads: usize) {
    let mut interval = tokio::time::interval(INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        ASKED.fetch_add(1, Ordering::Relaxed);
        for _ in 0..threads {
            tokio::spawn(tokio::task::yield_now());
        }
        // Pages of ended threads, and this thread's own.
        collect_if_asked();
    }
}

/// The runtime's park hook: collects this thread's heap if a collection was asked for since
/// its last one. A parking thread has nothing else to do.
pub fn collect_if_asked() {
    let asked = ASKED.load(Ordering::Relaxed);
    if COLLECTED.get() != asked {
        COLLECTED.set(asked);
        collect();
    }
}

/// Hands freed memory back now, for work known to have just freed a lot (a merge of large
/// OpenAPI specs frees several times the document it produced): every runtime thread collects
/// when it next parks, this one at once.
pub async fn trim_now() {
    ASKED.fetch_add(1, Ordering::Relaxed);
    collect_if_asked();
}

fn collect() {
    // SAFETY: mi_collect has no preconditions; `true` also returns the pages of ended threads
    // and does not wait for mimalloc's purge delay.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
