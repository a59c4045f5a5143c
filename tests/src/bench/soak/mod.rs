//! Soaks with faults (issue 41): mixed traffic through the gateway (lists of aggregated groups
//! and of the core, aggregated discovery, ConfigMap mutations, watches) while faults come in turn
//! every few seconds. [`fixtures`] runs it on the fixture servers (backends killed, frozen, an
//! APIService added and removed); [`real`] in front of a real kube-apiserver and sample-apiserver,
//! where the core itself is killed and started again and certificates are rotated too.
//!
//! What both count: requests and their answers; *lost* requests (no HTTP answer within 15 s: a
//! transport error or a timeout); answers *from the wrong backend* (a list of another kind or
//! group, or a 404 where an aggregated list was asked for: the core answered it); watch streams
//! that ended, and how, and watches that *stalled* (open, with the ConfigMaps they watch changing,
//! but no event for 15 s); the gateway's RSS, open file descriptors and live tasks at the start
//! and after the traffic stopped and a quiet moment passed; and its warnings and errors by
//! message, beside the faults that caused them. Lost, misrouted and stalled must be zero; a
//! backend that is down is answered 503 by the gateway, which counts as an answer.

pub mod fixtures;
pub mod real;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::json;

use crate::harness::{self, HttpClient, LogLine};
use crate::scenario::json_or_null;

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// A request without an answer this long is lost.
const ANSWER_LIMIT: Duration = Duration::from_secs(15);
/// A watch of ConfigMaps that are being changed, open this long without an event, has stalled.
const STALL_LIMIT: Duration = Duration::from_secs(15);

/// What a soak saw.
#[derive(Debug, Default)]
pub struct SoakReport {
    pub seconds: f64,
    pub requests: u64,
    /// By status code.
    pub answers: BTreeMap<u16, u64>,
    pub lost: u64,
    /// Answers whose body broke off after the status line (the server behind died mid-answer,
    /// as a client of that server directly sees too).
    pub cut: u64,
    /// The first lost requests: what, when (seconds into the soak) and why.
    pub lost_samples: Vec<String>,
    pub misrouted: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// By watch: how its streams ended.
    pub watch_ends: BTreeMap<&'static str, WatchEnds>,
    pub rss_start: u64,
    pub rss_end: u64,
    pub fds_start: usize,
    pub fds_end: usize,
    pub tasks_start: Option<u64>,
    pub tasks_end: Option<u64>,
    /// The gateway's WARN and ERROR lines during the soak, by message.
    pub warnings: BTreeMap<String, u64>,
    /// The first answer of each status other than 200 and 201 (its start).
    pub samples: BTreeMap<u16, String>,
}

/// The gateway's resources at one moment.
struct Usage {
    rss: u64,
    fds: usize,
    tasks: Option<u64>,
}

impl Usage {
    async fn of(pid: u32, client: &HttpClient, base: &str) -> Usage {
        Usage {
            rss: crate::bench::memory::rss_bytes(pid).unwrap_or(0),
            fds: open_fds(pid),
            tasks: runtime_tasks(client, base).await,
        }
    }
}

impl SoakReport {
    /// The report of a soak that took `seconds`, from what its probes tallied in `shared`.
    fn new(
        shared: &Shared,
        seconds: f64,
        faults: BTreeMap<&'static str, u64>,
        (start, end): (Usage, Usage),
        warnings: BTreeMap<String, u64>,
    ) -> SoakReport {
        let t = std::mem::take(&mut *shared.0.lock().unwrap());
        SoakReport {
            seconds,
            requests: t.requests,
            answers: t.answers,
            lost: t.lost,
            cut: t.cut,
            lost_samples: t.lost_samples,
            misrouted: t.misrouted,
            faults,
            watch_ends: t.watch_ends,
            rss_start: start.rss,
            rss_end: end.rss,
            fds_start: start.fds,
            fds_end: end.fds,
            tasks_start: start.tasks,
            tasks_end: end.tasks,
            samples: t.samples,
            warnings,
        }
    }
}

/// How one watch's streams ended: cleanly (end of stream), with a transport error (a reset
/// stream, a closed connection, no answer), or stalled.
#[derive(Debug, Default, Clone, Copy)]
pub struct WatchEnds {
    pub clean: u64,
    pub error: u64,
    pub stalled: u64,
}

#[derive(Default)]
struct Tally {
    requests: u64,
    answers: BTreeMap<u16, u64>,
    lost: u64,
    cut: u64,
    lost_samples: Vec<String>,
    misrouted: u64,
    watch_ends: BTreeMap<&'static str, WatchEnds>,
    samples: BTreeMap<u16, String>,
}

/// How many lost requests the report describes.
const LOST_SAMPLES: usize = 10;

/// How one request ended.
enum Ending {
    Answered(StatusCode, Bytes),
    /// The status line came, the body broke off.
    Cut(StatusCode),
    /// No status line within [`ANSWER_LIMIT`], or the connection failed before one.
    Lost(String),
}

/// Sends `req` and reads the whole answer, within [`ANSWER_LIMIT`] for the status line and as
/// long again for the body.
async fn exchange(client: &HttpClient, req: Request<Full<Bytes>>) -> Ending {
    let resp = match tokio::time::timeout(ANSWER_LIMIT, harness::send_streaming(client, req)).await
    {
        Err(_) => return Ending::Lost(format!("no status line within {ANSWER_LIMIT:?}")),
        Ok(Err(e)) => return Ending::Lost(e.to_string()),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    match tokio::time::timeout(ANSWER_LIMIT, resp.into_body().collect()).await {
        Ok(Ok(body)) => Ending::Answered(status, body.to_bytes()),
        Ok(Err(_)) | Err(_) => Ending::Cut(status),
    }
}

impl Tally {
    /// Counts how a request for `what`, sent at `at` into the soak, ended; the body of a
    /// complete answer.
    fn ended(&mut self, what: &str, at: Duration, ending: Ending) -> Option<(StatusCode, Bytes)> {
        self.requests += 1;
        match ending {
            Ending::Answered(status, body) => {
                self.answered(status, &body);
                Some((status, body))
            }
            Ending::Cut(status) => {
                *self.answers.entry(status.as_u16()).or_default() += 1;
                self.cut += 1;
                None
            }
            Ending::Lost(why) => {
                self.lost += 1;
                if self.lost_samples.len() < LOST_SAMPLES {
                    self.lost_samples
                        .push(format!("{what} at {:.1} s: {why}", at.as_secs_f64()));
                }
                None
            }
        }
    }

    fn answered(&mut self, status: StatusCode, body: &[u8]) {
        *self.answers.entry(status.as_u16()).or_default() += 1;
        if !matches!(status.as_u16(), 200 | 201) {
            self.samples.entry(status.as_u16()).or_insert_with(|| {
                String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned()
            });
        }
    }
}

/// The tally, the stop flag, and when the soak's traffic started.
type Shared = (Arc<Mutex<Tally>>, Arc<AtomicBool>, Instant);

/// One request of the traffic's round, and what a right answer to it is.
#[derive(Clone)]
struct Probe {
    path: String,
    accept: &'static str,
    /// For a list of an aggregated group: its `kind` and `apiVersion`.
    list: Option<(&'static str, String)>,
}

impl Probe {
    fn any(path: impl Into<String>, accept: &'static str) -> Self {
        Self {
            path: path.into(),
            accept,
            list: None,
        }
    }

    fn list(path: impl Into<String>, kind: &'static str, api_version: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            accept: "application/json",
            list: Some((kind, api_version.into())),
        }
    }

    /// Whether `status` and `body` came from some other server than the one this names.
    fn misrouted(&self, status: StatusCode, body: &[u8]) -> bool {
        let Some((kind, api_version)) = &self.list else {
            return false;
        };
        match status {
            // Only the core says a group's resource does not exist.
            StatusCode::NOT_FOUND => true,
            StatusCode::OK => {
                let doc = json_or_null(body);
                doc["kind"] != *kind || doc["apiVersion"] != *api_version.as_str()
            }
            _ => false,
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The gateway's live tasks, from its `/metrics`.
async fn runtime_tasks(client: &HttpClient, base: &str) -> Option<u64> {
    let (status, _, body) = harness::get(client, &format!("{base}/metrics"))
        .await
        .ok()?;
    if status != StatusCode::OK {
        return None;
    }
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("aggregation_gateway_runtime_tasks "))
        .and_then(|v| v.trim().parse().ok())
}

/// The gateway's WARN and ERROR lines after `since`, counted by message.
fn warnings(lines: &[LogLine], since: Duration) -> BTreeMap<String, u64> {
    let mut by_message = BTreeMap::new();
    for line in lines.iter().filter(|l| l.at >= since) {
        let doc = json_or_null(line.text.as_bytes());
        if matches!(doc["level"].as_str(), Some("WARN" | "ERROR")) {
            let message = doc["message"].as_str().unwrap_or(&line.text).to_owned();
            *by_message.entry(message).or_default() += 1;
        }
    }
    by_message
}

/// One client's requests in turn until stopped.
async fn traffic(
    client: HttpClient,
    base: String,
    probes: Vec<Probe>,
    first: usize,
    shared: Shared,
) {
    let (tally, stop, started) = shared;
    let mut i = first;
    while !stop.load(Ordering::Relaxed) {
        let probe = &probes[i % probes.len()];
        i += 1;
        let req = Request::get(format!("{base}{}", probe.path))
            .header("accept", probe.accept)
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        let at = started.elapsed();
        let ending = exchange(&client, req).await;
        let mut t = tally.lock().unwrap();
        if let Some((status, body)) = t.ended(&format!("GET {}", probe.path), at, ending) {
            if probe.misrouted(status, &body) {
                t.misrouted += 1;
            }
        }
    }
}

/// ConfigMaps created and deleted one after the other in `namespace` until stopped: the
/// mutations of the traffic, and the events its ConfigMap watch waits for.
async fn mutations(client: HttpClient, base: String, namespace: &'static str, shared: Shared) {
    let (tally, stop, started) = shared;
    let url = format!("{base}/api/v1/namespaces/{namespace}/configmaps");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let name = format!("soak-{n}");
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"n": n.to_string()}});
        let create = Request::post(&url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let delete = Request::delete(format!("{url}/{name}"))
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        for (what, req) in [("POST a ConfigMap", create), ("DELETE a ConfigMap", delete)] {
            let at = started.elapsed();
            let ending = exchange(&client, req).await;
            tally.lock().unwrap().ended(what, at, ending);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A watch on `url` (called `name` in the report), opened again whenever it ends, until stopped.
/// With `stalls`, what it watches keeps changing: a stream open [`STALL_LIMIT`] without a frame
/// has stalled (counted, and opened again).
async fn watches(
    client: HttpClient,
    name: &'static str,
    url: String,
    stalls: bool,
    shared: Shared,
) {
    let (tally, stop, _) = shared;
    tally.lock().unwrap().watch_ends.entry(name).or_default();
    while !stop.load(Ordering::Relaxed) {
        let req = Request::get(&url)
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        let Ok(Ok(resp)) =
            tokio::time::timeout(ANSWER_LIMIT, harness::send_streaming(&client, req)).await
        else {
            tally
                .lock()
                .unwrap()
                .watch_ends
                .entry(name)
                .or_default()
                .error += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if resp.status() != StatusCode::OK {
            // Refused while its backend is down: asked again shortly, as a reflector would.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let mut body = resp.into_body();
        let mut last_frame = Instant::now();
        let ended = loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(500), body.frame()).await {
                Err(_) if stalls && last_frame.elapsed() > STALL_LIMIT => break None,
                Err(_) => continue,
                Ok(Some(Ok(_))) => last_frame = Instant::now(),
                Ok(None) => break Some(true),
                Ok(Some(Err(_))) => break Some(false),
            }
        };
        let mut t = tally.lock().unwrap();
        let ends = t.watch_ends.entry(name).or_default();
        match ended {
            Some(true) => ends.clean += 1,
            Some(false) => ends.error += 1,
            None => ends.stalled += 1,
        }
    }
}

/// How long the gateway is left alone after the traffic stopped, before its RSS, fds and tasks
/// are read again: long enough for idle connections to close in a long soak.
fn quiet_after(length: Duration) -> Duration {
    (length / 4).clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// Stops process `pid` (SIGSTOP) for `how_long`.
async fn freeze(pid: u32, how_long: Duration) {
    let signal = |name: &str| {
        let _ = std::process::Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status();
    };
    signal("STOP");
    tokio::time::sleep(how_long).await;
    signal("CONT");
}

impl SoakReport {
    /// The figures, one per line, for the terminal and BENCHMARKS.md.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mb = |b: u64| b as f64 / 1e6;
        let or_unknown = |n: Option<u64>| n.map_or("?".to_owned(), |n| n.to_string());
        out.push_str(&format!("| soak length | {:.0} s |\n", self.seconds));
        out.push_str(&format!("| requests | {} |\n", self.requests));
        for (code, n) in &self.answers {
            out.push_str(&format!("| answered {code} | {n} |\n"));
        }
        out.push_str(&format!(
            "| lost (no status line within 15 s, or the connection failed before one) | {} |\n",
            self.lost
        ));
        out.push_str(&format!(
            "| answers cut after their status line (the server behind died mid-answer) | {} |\n",
            self.cut
        ));
        for sample in &self.lost_samples {
            out.push_str(&format!("| lost: {} |  |\n", sample.replace('|', "\\|")));
        }
        out.push_str(&format!(
            "| answered by the wrong backend | {} |\n",
            self.misrouted
        ));
        for (fault, n) in &self.faults {
            out.push_str(&format!("| fault: {fault} | {n} |\n"));
        }
        for (name, ends) in &self.watch_ends {
            out.push_str(&format!(
                "| watch of {name}: streams ended at end of stream / with a transport error / stalled | {} / {} / {} |\n",
                ends.clean, ends.error, ends.stalled
            ));
        }
        out.push_str(&format!(
            "| gateway RSS start → end | {:.1} → {:.1} MB |\n",
            mb(self.rss_start),
            mb(self.rss_end)
        ));
        out.push_str(&format!(
            "| gateway open fds start → end | {} → {} |\n",
            self.fds_start, self.fds_end
        ));
        out.push_str(&format!(
            "| gateway tasks start → end | {} → {} |\n",
            or_unknown(self.tasks_start),
            or_unknown(self.tasks_end)
        ));
        for (message, n) in &self.warnings {
            out.push_str(&format!("| gateway logged: {message} | {n} |\n"));
        }
        for (status, body) in &self.samples {
            let body = body.replace('|', "\\|").replace('\n', " ");
            out.push_str(&format!("| first {status} answer | {body} |\n"));
        }
        out
    }

    /// What must not happen, in words; empty when nothing did.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lost > 0 {
            failures.push(format!("{} request(s) lost", self.lost));
        }
        if self.misrouted > 0 {
            failures.push(format!("{} answered by the wrong backend", self.misrouted));
        }
        let stalls: u64 = self.watch_ends.values().map(|e| e.stalled).sum();
        if stalls > 0 {
            failures.push(format!(
                "{stalls} watch stream(s) stalled (open, no event for 15 s while ConfigMaps changed)"
            ));
        }
        failures
    }
}
