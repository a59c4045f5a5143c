//! Memory comes back after peaks. glibc's allocator keeps memory freed by its per-thread arenas
//! mapped, so after thousands of watches are opened and closed the gateway's RSS stays at the
//! peak (it climbed from 228 to 312 MiB over three such rounds, and a manual `malloc_trim` brought
//! it to 23 MiB). Every few seconds, when the arenas hold more free memory than
//! [`TRIM_THRESHOLD`], it is handed back to the system. Elsewhere than glibc this does nothing.

use std::time::Duration;

/// How often the free memory is looked at.
const INTERVAL: Duration = Duration::from_secs(5);

/// Free memory kept in the arenas before a trim: what a burst of ordinary requests reuses.
const TRIM_THRESHOLD: usize = 16 << 20;

/// Runs for the life of the process.
pub async fn trim_after_peaks() {
    let mut interval = tokio::time::interval(INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Free chunks stay counted as free after a trim (their pages are gone, the chunks are not),
    // so a trim is due when the free memory has moved since the last one, not merely when high.
    let mut after_last_trim = 0usize;
    loop {
        interval.tick().await;
        let Some(free) = free_in_arenas() else {
            return;
        };
        if free > TRIM_THRESHOLD && free.abs_diff(after_last_trim) > TRIM_THRESHOLD / 4 {
            // Blocking: it walks and locks every arena.
            let trimmed = tokio::task::spawn_blocking(move || {
                trim();
                free_in_arenas()
            })
            .await;
            after_last_trim = trimmed.ok().flatten().unwrap_or(free);
            tracing::debug!(free_bytes = free, "returned free memory to the system");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn free_in_arenas() -> Option<usize> {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    Some(info.fordblks)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim has no preconditions; 0 keeps no padding at the top of the heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn free_in_arenas() -> Option<usize> {
    None
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
