//! The gateway's CPU and memory per component of the cluster (issue 38), measured with the
//! front door up: each of the kubelet, kube-controller-manager, kube-scheduler and kube-proxy
//! alone behind the gateway (the others on kube-apiserver's own loopback address), all four, and
//! none (what is left: the gateway's own loops, the harness's DNS sync, in-cluster clients of
//! `kubernetes.default`). Each row restarts the components, waits [`SETTLE`] (their start-up
//! lists and watches, reported on their own), then reads the gateway's CPU time and RSS from
//! `/proc/<pid>` at the start and the end of a steady window. Measured, not attributed: the
//! gateway's request metrics are by verb and resource, not by client.
//!
//! Opt-in, it takes about 2.5 minutes a row: `REAL_NODE_USAGE_WINDOW=<seconds>`.

use std::time::Duration;

use e2e::real_node::cluster::Component;

use super::shapes::Node;

/// Names the steady window's length in seconds; unset, the measurement is skipped.
pub const WINDOW_ENV: &str = "REAL_NODE_USAGE_WINDOW";
/// How long after the restart the window starts.
const SETTLE: Duration = Duration::from_secs(30);

/// The window `REAL_NODE_USAGE_WINDOW` asks for.
pub fn window() -> Option<Duration> {
    let secs: u64 = std::env::var(WINDOW_ENV).ok()?.parse().ok()?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// One row per arrangement, every component behind the gateway again at the end; the table
/// is Markdown, as BENCHMARKS.md keeps it.
pub async fn run(node: &mut Node, window: Duration) -> Result<String, String> {
    use Component::*;
    let rows: [(&str, &[Component]); 6] = [
        ("none (every component directly)", &[]),
        ("kubelet", &[Kubelet]),
        ("kube-controller-manager", &[ControllerManager]),
        ("kube-scheduler", &[Scheduler]),
        ("kube-proxy", &[Proxy]),
        ("all four", &Component::ALL),
    ];
    let mut table = format!(
        "| behind the gateway | CPU in the {s} s after the restart | CPU over {w} s | of one core | \
         RSS at the window's start → end |\n|---|---:|---:|---:|---:|\n",
        s = SETTLE.as_secs(),
        w = window.as_secs()
    );
    for (label, through) in rows {
        let restart = Usage::of(node);
        node.cluster.route_components(through).await?;
        tokio::time::sleep(SETTLE).await;
        let start = Usage::of(node);
        tokio::time::sleep(window).await;
        let end = Usage::of(node);
        let steady = end.cpu.saturating_sub(start.cpu).as_secs_f64();
        let row = format!(
            "| {label} | {:.2} s | {steady:.2} s | {:.2} % | {} → {} MiB |\n",
            start.cpu.saturating_sub(restart.cpu).as_secs_f64(),
            100.0 * steady / window.as_secs_f64(),
            start.rss_kib / 1024,
            end.rss_kib / 1024,
        );
        eprint!("real node [front-door]: gateway usage {row}");
        table.push_str(&row);
    }
    Ok(table)
}

/// The gateway process's CPU time and memory, from `/proc`.
pub struct Usage {
    cpu: Duration,
    rss_kib: u64,
    peak_kib: u64,
}

impl Usage {
    pub fn of(node: &Node) -> Usage {
        let pid = node
            .cluster
            .gateway_pid()
            .expect("the front door's gateway runs");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        let ticks = |i: usize| {
            fields
                .get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // SAFETY of the call: sysconf has no preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Usage {
            cpu: Duration::from_millis((ticks(14) + ticks(15)) * 1000 / hz),
            rss_kib: kib("VmRSS:"),
            peak_kib: kib("VmHWM:"),
        }
    }

    pub fn since(&self, before: &Usage) -> String {
        format!(
            "CPU {:.1} s over the checks and the e2e run (from {:.1} s to {:.1} s); RSS {} MiB \
             (peak {} MiB; {} MiB at the start)",
            (self.cpu.saturating_sub(before.cpu)).as_secs_f64(),
            before.cpu.as_secs_f64(),
            self.cpu.as_secs_f64(),
            self.rss_kib / 1024,
            self.peak_kib / 1024,
            before.rss_kib / 1024
        )
    }
}
