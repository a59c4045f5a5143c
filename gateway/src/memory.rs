//! Memory comes back after peaks. glibc's allocator keeps memory freed by its per-thread arenas
//! mapped, so after thousands of watches are opened and closed the gateway's RSS stays at the
//! peak (it climbed from 228 to 312 MiB over three such rounds, and a manual `malloc_trim` brought
//! it to 23 MiB). Every few seconds, when more memory is resident than in use by more than
//! [`TRIM_THRESHOLD`] over what the last trim left, it is handed back to the system. Elsewhere
//! than glibc this does nothing.

use std::time::Duration;

/// How often the free memory is looked at.
const INTERVAL: Duration = Duration::from_secs(5);

/// Resident memory beyond what is in use, over what a trim last left, before another trim: what
/// a burst of ordinary requests reuses.
const TRIM_THRESHOLD: usize = 16 << 20;

/// Runs for the life of the process.
pub async fn trim_after_peaks() {
    let mut interval = tokio::time::interval(INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Free chunks stay counted as free after a trim (their pages are gone, the chunks are not),
    // so the allocator's free count says nothing about what is resident: a peak that reuses the
    // same chunks ends with the same free count and kept its pages. What a trim can give back is
    // resident memory not in use ("slack"); the slack a trim leaves (code, stacks, allocator
    // bookkeeping) is the baseline the next one is measured against.
    let mut slack_after_trim = 0usize;
    loop {
        interval.tick().await;
        let Some(slack) = slack() else {
            return;
        };
        if slack > slack_after_trim + TRIM_THRESHOLD {
            // Blocking: it walks and locks every arena.
            let left = tokio::task::spawn_blocking(move || {
                trim();
                self::slack()
            })
            .await;
            slack_after_trim = left.ok().flatten().unwrap_or(slack);
            tracing::debug!(
                slack_bytes = slack,
                left_bytes = slack_after_trim,
                "returned free memory to the system"
            );
        }
    }
}

/// Resident bytes the allocator does not have in use.
fn slack() -> Option<usize> {
    Some(resident_bytes()?.saturating_sub(in_use_bytes()?))
}

#[cfg(target_os = "linux")]
fn resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page).ok()?)
}

#[cfg(not(target_os = "linux"))]
fn resident_bytes() -> Option<usize> {
    None
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn in_use_bytes() -> Option<usize> {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    // Chunks in use in the arenas, and blocks mapped on their own.
    Some(info.uordblks + info.hblkhd)
}

/// Hands freed memory back now, for work known to have just freed a lot (a merge of large
/// OpenAPI specs frees several times the document it produced); runs on a blocking thread.
pub async fn trim_now() {
    let _ = tokio::task::spawn_blocking(trim).await;
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim has no preconditions; 0 keeps no padding at the top of the heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn in_use_bytes() -> Option<usize> {
    None
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
