//! kube's debug dumps, `/debug/api_priority_and_fairness/dump_priority_levels`, `dump_queues`
//! and `dump_requests` (k8s.io/apiserver `pkg/util/flowcontrol/apf_controller_debug.go`), in
//! kube's layout: comma-separated columns aligned with spaces, one row per level, per queue, or
//! per request (`?includeRequestDetails=1` adds who asked for what).

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use crate::controller::LevelView;

/// Rows of cells, aligned as Go's `tabwriter` (minimum width 8, padding 1) aligns kube's.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&str]) -> Self {
        Self {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        // Every cell but a row's last is followed by ",\t" and aligned.
        let mut widths = vec![0usize; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(row.len().saturating_sub(1)) {
                widths[i] = widths[i].max((cell.chars().count() + 2).max(8));
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    out.push_str(cell);
                } else {
                    let text = format!("{cell},");
                    let pad = widths[i].saturating_sub(text.chars().count());
                    out.push_str(&text);
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
        out
    }
}

/// `dump_priority_levels`: one row per level, by name.
pub fn priority_levels(levels: &[LevelView]) -> String {
    let mut t = Table::new(&[
        "PriorityLevelName",
        "ActiveQueues",
        "IsIdle",
        "IsQuiescing",
        "WaitingRequests",
        "ExecutingRequests",
        "DispatchedRequests",
        "RejectedRequests",
        "TimedoutRequests",
        "CancelledRequests",
    ]);
    for l in levels {
        let qs = l.level.lock();
        let active = qs.queues().filter(|q| q.waiting > 0).count();
        let c = qs.counts();
        t.row(vec![
            l.name.to_string(),
            active.to_string(),
            qs.is_idle().to_string(),
            l.quiescing.to_string(),
            qs.waiting().to_string(),
            qs.executing().to_string(),
            c.dispatched.to_string(),
            c.rejected.to_string(),
            c.timed_out.to_string(),
            c.cancelled.to_string(),
        ]);
    }
    t.render()
}

/// `dump_queues`: one row per queue of every level.
pub fn queues(levels: &[LevelView]) -> String {
    let mut t = Table::new(&[
        "PriorityLevelName",
        "Index",
        "PendingRequests",
        "ExecutingRequests",
        "SeatsInUse",
        "NextDispatchR",
        "InitialSeatsSum",
        "MaxSeatsSum",
        "TotalWorkSum",
    ]);
    for l in levels {
        for (i, q) in l.level.lock().queues().enumerate() {
            t.row(vec![
                l.name.to_string(),
                i.to_string(),
                q.waiting.to_string(),
                q.executing.to_string(),
                q.seats_in_use.to_string(),
                q.next_dispatch_r.to_string(),
                q.sum.initial_seats.to_string(),
                q.sum.max_seats.to_string(),
                q.sum.total_work.to_string(),
            ]);
        }
    }
    t.render()
}

/// `dump_requests`: one row per waiting or executing request.
pub fn requests(levels: &[LevelView], details: bool) -> String {
    let mut headers = vec![
        "PriorityLevelName",
        "FlowSchemaName",
        "QueueIndex",
        "RequestIndexInQueue",
        "FlowDistingsher",
        "ArriveTime",
        "InitialSeats",
        "FinalSeats",
        "AdditionalLatency",
        "StartTime",
    ];
    if details {
        headers.extend([
            "UserName",
            "Verb",
            "APIPath",
            "Namespace",
            "Name",
            "APIVersion",
            "Resource",
            "SubResource",
        ]);
    }
    let mut t = Table::new(&headers);
    let (wall, mono) = (SystemTime::now(), Instant::now());
    for l in levels {
        let requests = l.level.lock().requests();
        for r in requests {
            let d = &r.description;
            let mut row = vec![
                l.name.to_string(),
                d.schema.to_string(),
                r.queue.to_string(),
                r.position.to_string(),
                d.flow_distinguisher().to_owned(),
                rfc3339(wall, mono, Some(r.arrived)),
                r.work.initial_seats.to_string(),
                r.work.final_seats.to_string(),
                go_duration(r.work.additional_latency),
                rfc3339(wall, mono, r.started),
            ];
            if details {
                let i = &d.info;
                let gv = if i.api_group().is_empty() {
                    i.api_version().to_owned()
                } else {
                    format!("{}/{}", i.api_group(), i.api_version())
                };
                row.extend([
                    d.user.name.clone(),
                    i.verb().to_owned(),
                    i.path().to_owned(),
                    i.namespace().to_owned(),
                    i.name().to_owned(),
                    gv,
                    i.resource().to_owned(),
                    i.subresource().to_owned(),
                ]);
            }
            t.row(row);
        }
    }
    t.render()
}

/// An instant as Go's `time.RFC3339Nano` in UTC; Go's zero time for none.
fn rfc3339(wall: SystemTime, mono: Instant, at: Option<Instant>) -> String {
    let Some(at) = at else {
        return "0001-01-01T00:00:00Z".to_owned();
    };
    let then = wall - mono.saturating_duration_since(at);
    Timestamp::try_from(then).map_or_else(|_| String::new(), |t| t.to_string())
}

/// A duration as Go's `Duration.String` writes it (`0s`, `5ms`, `1.5s`, `2m3s`).
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let frac = |value: u128, unit: u128, suffix: &str| {
        let whole = value / unit;
        let rest = value % unit;
        let mut s = whole.to_string();
        if rest > 0 {
            let digits = unit.to_string().len() - 1;
            let f = format!("{rest:0digits$}");
            s.push('.');
            s.push_str(f.trim_end_matches('0'));
        }
        s.push_str(suffix);
        s
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return frac(nanos, 1_000, "µs");
    }
    if nanos < 1_000_000_000 {
        return frac(nanos, 1_000_000, "ms");
    }
    let secs = nanos / 1_000_000_000;
    let (h, m) = (secs / 3600, (secs / 60) % 60);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    out.push_str(&frac(nanos % 60_000_000_000, 1_000_000_000, "s"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(15), "15ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(5), "5ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(123), "2m3s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ] {
            assert_eq!(go_duration(d), want);
        }
    }

    #[test]
    fn columns_are_aligned_as_kubes_tabwriter_aligns_them() {
        let mut t = Table::new(&["PriorityLevelName", "Index", "Last"]);
        t.row(vec!["exempt".into(), "0".into(), "x".into()]);
        assert_eq!(
            t.render(),
            "PriorityLevelName, Index,  Last\n\
             exempt,            0,      x\n"
        );
    }
}
