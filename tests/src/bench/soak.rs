//! A soak with faults (issue 41), on the fixtures: mixed traffic through the gateway (lists of
//! two aggregated groups and of the core, aggregated discovery, a watch per group) while, in
//! turn every few seconds, one backend is killed and started again on its port, the other
//! (HTTP/1.1-only) frozen and thawed, and a third APIService added and removed on the core.
//!
//! What it counts: requests and their answers; *lost* requests (no HTTP answer within 15 s: a
//! transport error or a timeout); answers *from the wrong backend* (a FlunderList of the other
//! group); watch streams that ended, and how; and the gateway's RSS and open file descriptors at
//! the start and after the traffic has stopped and a quiet moment passed. Lost and misrouted
//! requests must be zero; a backend that is down is answered 503 by the gateway, which counts as
//! an answer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::memory::rss_bytes;
use super::BoxError;
use crate::harness::{self, HttpClient};
use crate::scenario::{core_client, create_on_core, json_or_null, Pki, Scenario};

const ALPHA: &str = "alpha.example.com";
const BETA: &str = "beta.example.com";
const GAMMA: &str = "gamma.example.com";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// A request without an answer this long is lost.
const ANSWER_LIMIT: Duration = Duration::from_secs(15);
/// The time between faults.
const FAULT_PERIOD: Duration = Duration::from_secs(3);

/// What a soak saw.
#[derive(Debug, Default)]
pub struct SoakReport {
    pub seconds: f64,
    pub requests: u64,
    /// By status code.
    pub answers: BTreeMap<u16, u64>,
    pub lost: u64,
    pub misrouted: u64,
    pub faults: BTreeMap<&'static str, u64>,
    /// Watch streams that ended: cleanly (end of stream) and with a transport error.
    pub watch_ends_clean: u64,
    pub watch_ends_error: u64,
    pub rss_start: u64,
    pub rss_end: u64,
    pub fds_start: usize,
    pub fds_end: usize,
}

#[derive(Default)]
struct Tally {
    requests: u64,
    answers: BTreeMap<u16, u64>,
    lost: u64,
    misrouted: u64,
    watch_ends_clean: u64,
    watch_ends_error: u64,
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn flunders(group: &str) -> String {
    format!("/apis/{group}/v1/namespaces/default/flunders")
}

/// Runs the soak for `length`.
pub async fn run(length: Duration) -> Result<SoakReport, BoxError> {
    let builder = Scenario::with_pki(Pki::for_services(&["alpha", "beta"]))
        .backend("alpha", ALPHA, "v1", &[])
        .backend("beta", BETA, "v1", &["--http1-only"]);
    let mut s = builder.start().await;
    for (group, namespace) in [(ALPHA, "alpha"), (BETA, "beta")] {
        register(&s, group, namespace).await?;
    }
    let user = s.user("soak", &[]);
    let ca = s.gateway.ca_pem()?;
    let clients: Vec<HttpClient> = (0..4)
        .map(|_| harness::http2_client(&ca, Some(&user)))
        .collect::<Result<_, _>>()?;
    let base = s.gateway.url();
    // Both groups answer before anything is measured.
    let ready = harness::wait_until(Duration::from_secs(20), || async {
        let mut ok = true;
        for group in [ALPHA, BETA] {
            let url = format!("{base}{}", flunders(group));
            ok &= harness::get(&clients[0], &url)
                .await
                .is_ok_and(|r| r.0 == StatusCode::OK);
        }
        ok
    })
    .await;
    if !ready {
        return Err(format!("the backends never answered:\n{}", s.logs()).into());
    }
    let pid = s.gateway.process.id();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss_start, fds_start) = (rss_bytes(pid).unwrap_or(0), open_fds(pid));

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        tasks.push(tokio::spawn(traffic(
            client.clone(),
            base.clone(),
            i,
            tally.clone(),
            stop.clone(),
        )));
    }
    for group in [ALPHA, BETA] {
        tasks.push(tokio::spawn(watches(
            clients[0].clone(),
            format!("{base}{}?watch=1", flunders(group)),
            tally.clone(),
            stop.clone(),
        )));
    }

    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut turn = 0usize;
    while started.elapsed() < length {
        tokio::time::sleep(FAULT_PERIOD).await;
        let fault = match turn % 3 {
            0 => {
                restart(&mut s, "beta", BETA, &["--http1-only"]).await?;
                "backend killed and started again (HTTP/1.1)"
            }
            1 => {
                freeze(&s, "alpha", Duration::from_secs(2)).await;
                "backend frozen for 2 s (HTTP/2)"
            }
            _ => {
                add_and_remove(&s).await?;
                "APIService added and removed"
            }
        };
        *faults.entry(fault).or_default() += 1;
        turn += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss_end, fds_end) = (rss_bytes(pid).unwrap_or(0), open_fds(pid));
    let t = std::mem::take(&mut *tally.lock().unwrap());
    Ok(SoakReport {
        seconds,
        requests: t.requests,
        answers: t.answers,
        lost: t.lost,
        misrouted: t.misrouted,
        faults,
        watch_ends_clean: t.watch_ends_clean,
        watch_ends_error: t.watch_ends_error,
        rss_start,
        rss_end,
        fds_start,
        fds_end,
    })
}

/// `group`'s APIService on the core, served by the backend of `namespace`.
async fn register(s: &Scenario, group: &str, namespace: &str) -> Result<(), BoxError> {
    let object: Value = serde_saphyr::from_str(&s.pki.apiservice(group, "v1", namespace).yaml())?;
    let status = create_on_core(
        &s.core,
        "/apis/apiregistration.k8s.io/v1/apiservices",
        object,
    )
    .await;
    if status != StatusCode::CREATED {
        return Err(format!("registering {group}: {status}").into());
    }
    Ok(())
}

/// One client's requests in turn until `stop`.
async fn traffic(
    client: HttpClient,
    base: String,
    first: usize,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
) {
    let paths = [
        (flunders(ALPHA), "application/json", Some(ALPHA)),
        (flunders(BETA), "application/json", Some(BETA)),
        (
            "/api/v1/namespaces/default/configmaps".to_owned(),
            "application/json",
            None,
        ),
        ("/apis".to_owned(), AGGREGATED, None),
    ];
    let mut i = first;
    while !stop.load(Ordering::Relaxed) {
        let (path, accept, group) = &paths[i % paths.len()];
        i += 1;
        let req = Request::get(format!("{base}{path}"))
            .header("accept", *accept)
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        let answer = tokio::time::timeout(ANSWER_LIMIT, harness::send(&client, req)).await;
        let mut t = tally.lock().unwrap();
        t.requests += 1;
        match answer {
            Ok(Ok((status, _, body))) => {
                *t.answers.entry(status.as_u16()).or_default() += 1;
                if let (StatusCode::OK, Some(group)) = (status, group) {
                    let doc = json_or_null(&body);
                    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
                    if doc["kind"] != "FlunderList" || !api_version.starts_with(group) {
                        t.misrouted += 1;
                    }
                }
            }
            _ => t.lost += 1,
        }
    }
}

/// A watch on `url`, opened again whenever it ends, until `stop`.
async fn watches(client: HttpClient, url: String, tally: Arc<Mutex<Tally>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let req = Request::get(&url)
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        let Ok(Ok(resp)) =
            tokio::time::timeout(ANSWER_LIMIT, harness::send_streaming(&client, req)).await
        else {
            tally.lock().unwrap().watch_ends_error += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if resp.status() != StatusCode::OK {
            // Refused while its backend is down: asked again shortly, as a reflector would.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let mut body = resp.into_body();
        let ended = loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(500), body.frame()).await {
                Err(_) | Ok(Some(Ok(_))) => continue,
                Ok(None) => break true,
                Ok(Some(Err(_))) => break false,
            }
        };
        let mut t = tally.lock().unwrap();
        if ended {
            t.watch_ends_clean += 1;
        } else {
            t.watch_ends_error += 1;
        }
    }
}

/// Kills the backend of `namespace` and starts it again on the same port.
async fn restart(
    s: &mut Scenario,
    namespace: &str,
    group: &str,
    args: &[&str],
) -> Result<(), BoxError> {
    let port = s.backend(namespace).addr.port();
    s.backend_mut(namespace).process.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listen = format!("127.0.0.1:{port}");
    let backend = s
        .pki
        .start_backend(group, "v1", &[&["--listen", &listen][..], args].concat())
        .await;
    *s.backend_mut(namespace) = backend;
    Ok(())
}

/// Stops the backend of `namespace` (SIGSTOP) for `how_long`.
async fn freeze(s: &Scenario, namespace: &str, how_long: Duration) {
    let pid = s.backend(namespace).process.id().to_string();
    let signal = |name: &str| {
        let _ = std::process::Command::new("kill")
            .args([format!("-{name}"), pid.clone()])
            .status();
    };
    signal("STOP");
    tokio::time::sleep(how_long).await;
    signal("CONT");
}

/// A third APIService (on alpha's Service) created on the core, then deleted a second later.
async fn add_and_remove(s: &Scenario) -> Result<(), BoxError> {
    register(s, GAMMA, "alpha").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let url = format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices/v1.{GAMMA}",
        s.core.url()
    );
    let req = Request::delete(url)
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let (status, _, _) = harness::send(&core_client(), req).await?;
    if !status.is_success() {
        return Err(format!("deleting v1.{GAMMA}: {status}").into());
    }
    Ok(())
}

impl SoakReport {
    /// The figures, one per line, for the terminal and BENCHMARKS.md.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mb = |b: u64| b as f64 / 1e6;
        out.push_str(&format!("| soak length | {:.0} s |\n", self.seconds));
        out.push_str(&format!("| requests | {} |\n", self.requests));
        for (code, n) in &self.answers {
            out.push_str(&format!("| answered {code} | {n} |\n"));
        }
        out.push_str(&format!(
            "| lost (no answer within 15 s) | {} |\n",
            self.lost
        ));
        out.push_str(&format!(
            "| answered by the wrong backend | {} |\n",
            self.misrouted
        ));
        for (fault, n) in &self.faults {
            out.push_str(&format!("| fault: {fault} | {n} |\n"));
        }
        out.push_str(&format!(
            "| watch streams ended: end of stream / transport error | {} / {} |\n",
            self.watch_ends_clean, self.watch_ends_error
        ));
        out.push_str(&format!(
            "| gateway RSS start → end | {:.1} → {:.1} MB |\n",
            mb(self.rss_start),
            mb(self.rss_end)
        ));
        out.push_str(&format!(
            "| gateway open fds start → end | {} → {} |\n",
            self.fds_start, self.fds_end
        ));
        out
    }
}
