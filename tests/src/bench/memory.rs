//! What the processes use, read from `/proc`: resident memory (`VmRSS`), CPU time (utime +
//! stime, turned into microseconds per request), and the open-file limit the watch scenario needs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `VmRSS` of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes in (decimal) megabytes, the table's unit.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// User + system CPU time a process has used so far, in seconds (`/proc/<pid>/stat`).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks / hz
}

/// Context switches of all a process's threads so far, voluntary (a thread waited: for I/O, a
/// lock, a wake-up) and not (the scheduler took the core), from `/proc/<pid>/task/*/status`.
pub fn context_switches(pid: u32) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let field = |status: &str, name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut total = (0, 0);
    for task in tasks.filter_map(|t| t.ok()) {
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            total.0 += field(&status, "voluntary_ctxt_switches:");
            total.1 += field(&status, "nonvoluntary_ctxt_switches:");
        }
    }
    total
}

// === impl CpuMeter ===

/// CPU microseconds per request each process spent during a load run.
pub struct CpuMeter {
    pids: Vec<u32>,
    start: Vec<f64>,
}

impl CpuMeter {
    pub fn start(pids: &[u32]) -> CpuMeter {
        CpuMeter {
            pids: pids.to_vec(),
            start: pids.iter().map(|&p| cpu_seconds(p)).collect(),
        }
    }
    pub fn per_request_us(&self, requests: u64) -> Vec<f64> {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(&p, &s)| (cpu_seconds(p) - s) * 1e6 / requests.max(1) as f64)
            .collect()
    }
}

// === impl RssSampler ===

/// Samples the peak RSS of some processes every 50 ms until finished.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<HashMap<u32, u64>>,
}

impl RssSampler {
    pub fn start(pids: Vec<u32>) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = HashMap::new();
            while !flag.load(Ordering::Relaxed) {
                for &pid in &pids {
                    let now = rss_bytes(pid).unwrap_or(0);
                    let e = peak.entry(pid).or_insert(0);
                    *e = (*e).max(now);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        });
        RssSampler { stop, task }
    }

    pub async fn finish(self) -> HashMap<u32, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Raises the soft open-file limit to the hard one (the watch scenario holds thousands of
/// sockets), and returns the limits in effect: (soft, hard). Children inherit it.
pub fn raise_nofile_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}
