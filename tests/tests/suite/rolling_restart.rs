//! A rolling restart behind a real load balancer loses nothing: two gateway replicas behind
//! HAProxy (Debian's, health-checking `/readyz` as a kubeadm HA set-up does), a steady load of
//! short requests and open watches through it, one replica sent SIGTERM and restarted, then the
//! other. No short request fails; every watch ends cleanly (the client reads the end of the
//! stream, never a reset) and resumes from the last resourceVersion it saw.
//!
//! What makes it work is the gateway's shutdown order: `/readyz` fails at once, the replica keeps
//! serving for `--shutdown-delay-duration` while HAProxy's checks take it out of rotation, then it
//! stops accepting, ends its watches and lets in-flight requests finish.
//!
//! Needs `haproxy` on PATH (`.ci/run` installs Debian's package); without it the test says so
//! and passes, except in CI (`CI=true`), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use e2e::harness::{self, FixtureCore, Gateway, Process};
use e2e::scenario::{Pki, Scenario};

const TOKEN: &str = "Bearer e2e-default-token";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
/// HAProxy checks every 200 ms and takes a server out after two failures: the shutdown delay
/// leaves it five times that.
const REPLICA_ARGS: [&str; 2] = ["--shutdown-delay-duration=2s", "--shutdown-timeout=10s"];

type PlainClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn haproxy() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join("haproxy"))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// HAProxy in HTTP mode: plain HTTP for the test's clients, TLS to the replicas, `/readyz`
/// checked every 200 ms (down after 2 failures, up after 2 passes). `retries 0`: a connection a
/// replica refuses reaches the client as a 503 instead of being retried out of sight, so the
/// figures are the gateway's own (with a shutdown delay of 0 s they show the failures).
struct HaProxy {
    _process: Process,
    url: String,
    stats: String,
    _dir: tempfile::TempDir,
}

impl HaProxy {
    async fn start(binary: &PathBuf, replicas: &[(&str, u16)]) -> HaProxy {
        let (port, stats_port) = (free_port(), free_port());
        let mut cfg = format!(
            "global\n  maxconn 4096\n\
             defaults\n  mode http\n  retries 0\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n\
             frontend api\n  bind 127.0.0.1:{port}\n  default_backend gateways\n\
             frontend stats\n  bind 127.0.0.1:{stats_port}\n  stats enable\n  stats uri /stats\n\
             backend gateways\n  balance roundrobin\n  option httpchk\n  http-check send meth GET uri /readyz\n  http-check expect status 200\n  default-server ssl verify none inter 200ms fall 2 rise 2\n"
        );
        for (name, port) in replicas {
            cfg.push_str(&format!("  server {name} 127.0.0.1:{port} check\n"));
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, cfg).unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg("-db").arg("-f").arg(&file);
        let process = Process::spawn("haproxy", cmd).unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let up = harness::wait_until(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(up, "haproxy did not listen:\n{}", process.logs());
        HaProxy {
            _process: process,
            url,
            stats: format!("http://127.0.0.1:{stats_port}/stats;csv"),
            _dir: dir,
        }
    }

    /// Whether HAProxy's health checks currently count `server` as UP.
    async fn is_up(&self, client: &PlainClient, server: &str) -> bool {
        let Ok(resp) = client.get(self.stats.parse().unwrap()).await else {
            return false;
        };
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let status = header.iter().position(|h| *h == "status").unwrap();
        lines.any(|l| {
            let cols: Vec<&str> = l.split(',').collect();
            cols.first() == Some(&"gateways")
                && cols.get(1) == Some(&server)
                && cols.get(status) == Some(&"UP")
        })
    }

    async fn wait_status(&self, client: &PlainClient, server: &str, up: bool) {
        let reached = harness::wait_until(Duration::from_secs(10), || async {
            self.is_up(client, server).await == up
        })
        .await;
        assert!(
            reached,
            "haproxy never saw {server} {}",
            if up { "UP" } else { "DOWN" }
        );
    }
}

#[derive(Default)]
struct Figures {
    sent: AtomicU64,
    failed: AtomicU64,
    failures: Mutex<Vec<String>>,
    watches_opened: AtomicU64,
    watches_ended_cleanly: AtomicU64,
    watches_reset: AtomicU64,
    resumes_refused: AtomicU64,
    watch_events: AtomicU64,
}

impl Figures {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut list = self.failures.lock().unwrap();
        if list.len() < 20 {
            list.push(what);
        }
    }
}

async fn send(
    client: &PlainClient,
    base: &str,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Bytes), String> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("authorization", TOKEN);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(Full::new(body)).unwrap()),
    )
    .await
    .map_err(|_| "timed out".to_owned())?
    .map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    Ok((status, bytes))
}

/// One worker of short requests: reads on the core and on the remote APIService, and now and
/// then a write (which feeds the configmap watches), until `stop`.
async fn short_requests(worker: usize, base: String, figures: Arc<Figures>, stop: Arc<AtomicBool>) {
    let client: PlainClient = Client::builder(TokioExecutor::new()).build_http();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (method, path, body, want) = match n % 3 {
            0 => (
                http::Method::POST,
                CONFIGMAPS,
                Some(json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": format!("load-{worker}-{n}")},
                            "data": {"n": n.to_string()}})),
                StatusCode::CREATED,
            ),
            1 => (http::Method::GET, CONFIGMAPS, None, StatusCode::OK),
            _ => (http::Method::GET, FLUNDERS, None, StatusCode::OK),
        };
        figures.sent.fetch_add(1, Ordering::Relaxed);
        match send(&client, &base, method.clone(), path, body).await {
            Ok((status, _)) if status == want => {}
            Ok((status, body)) => figures.fail(format!(
                "{method} {path}: {status} {}",
                String::from_utf8_lossy(&body)
            )),
            Err(e) => figures.fail(format!("{method} {path}: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One watch of `path`, resumed from the last resourceVersion each time it ends, until `stop`.
async fn watch(path: &'static str, base: String, figures: Arc<Figures>, stop: Arc<AtomicBool>) {
    let client: PlainClient = Client::builder(TokioExecutor::new()).build_http();
    let (status, body) = send(&client, &base, http::Method::GET, path, None)
        .await
        .expect("the first list");
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_slice(&body).unwrap();
    let mut rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    while !stop.load(Ordering::Relaxed) {
        let req = Request::get(format!(
            "{base}{path}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
        ))
        .header("authorization", TOKEN)
        .body(Full::new(Bytes::new()))
        .unwrap();
        let resp = match client.request(req).await {
            Ok(resp) => resp,
            Err(e) => {
                figures.fail(format!("watch {path}: {e:?}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if resp.status() != StatusCode::OK {
            // 410 Gone would mean the watch could not resume where it ended.
            figures.resumes_refused.fetch_add(1, Ordering::Relaxed);
            figures.fail(format!("watch {path} from {rv}: {}", resp.status()));
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        figures.watches_opened.fetch_add(1, Ordering::Relaxed);
        let mut body = resp.into_body();
        let mut pending = Vec::new();
        let ended = loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(e.to_string()),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            pending.extend_from_slice(&data);
                            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = pending.drain(..=end).collect();
                                if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                                    if let Some(v) = event["object"]["metadata"]["resourceVersion"].as_str() {
                                        rv = v.to_owned();
                                    }
                                    figures.watch_events.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                },
                _ = wait_for(&stop) => return,
            }
        };
        match ended {
            Ok(()) => {
                figures
                    .watches_ended_cleanly
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                figures.watches_reset.fetch_add(1, Ordering::Relaxed);
                figures.fail(format!("watch {path} broke: {e}"));
            }
        }
    }
}

async fn wait_for(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM to `old`, which must exit on its own; then a new replica on the same port, back in
/// HAProxy's rotation.
async fn roll(
    pki: &Pki,
    core: &FixtureCore,
    config: &Path,
    old: &mut Gateway,
    server: &str,
    lb: &HaProxy,
    stats: &PlainClient,
) -> Gateway {
    let port = old.addr.port();
    let sent_at = Instant::now();
    old.process.signal("TERM").unwrap();
    lb.wait_status(stats, server, false).await;
    eprintln!(
        "roll {server}: haproxy took it out {} ms after SIGTERM",
        sent_at.elapsed().as_millis()
    );
    let status = old.process.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{server} did not exit cleanly after SIGTERM: {status:?}\n{}",
        old.process.logs()
    );
    let new = pki
        .spawn_gateway_at(core, config, &REPLICA_ARGS, port)
        .await;
    lb.wait_status(stats, server, true).await;
    eprintln!(
        "roll {server}: back in rotation {} ms after SIGTERM",
        sent_at.elapsed().as_millis()
    );
    new
}

#[tokio::test]
async fn a_rolling_restart_behind_haproxy_fails_no_request_and_ends_every_watch_cleanly() {
    let Some(haproxy) = haproxy() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "haproxy is not installed, and CI must run this test: .ci/run installs Debian's haproxy"
        );
        eprintln!(
            "SKIPPED: haproxy is not installed here (apt-get install haproxy); this test runs in CI"
        );
        return;
    };
    let mut s = Scenario::wardle().gateway_args(&REPLICA_ARGS).start().await;
    s.register_wardle_until_available().await;
    let config = s
        .pki
        .gateway_config(&[("wardle", "api", s.backend("wardle"))], "");
    let mut b = s.pki.start_gateway(&s.core, &config, &REPLICA_ARGS).await;

    let lb = HaProxy::start(
        &haproxy,
        &[("a", s.gateway.addr.port()), ("b", b.addr.port())],
    )
    .await;
    let stats: PlainClient = Client::builder(TokioExecutor::new()).build_http();
    lb.wait_status(&stats, "a", true).await;
    lb.wait_status(&stats, "b", true).await;

    let figures = Arc::new(Figures::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..4 {
        tasks.push(tokio::spawn(short_requests(
            worker,
            lb.url.clone(),
            figures.clone(),
            stop.clone(),
        )));
    }
    for path in [CONFIGMAPS, CONFIGMAPS, FLUNDERS, FLUNDERS] {
        tasks.push(tokio::spawn(watch(
            path,
            lb.url.clone(),
            figures.clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let new_a = roll(&s.pki, &s.core, &config, &mut s.gateway, "a", &lb, &stats).await;
    drop(std::mem::replace(&mut s.gateway, new_a));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let new_b = roll(&s.pki, &s.core, &config, &mut b, "b", &lb, &stats).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();

    let f = &*figures;
    let (sent, failed) = (
        f.sent.load(Ordering::Relaxed),
        f.failed.load(Ordering::Relaxed),
    );
    let (opened, clean, reset, refused, events) = (
        f.watches_opened.load(Ordering::Relaxed),
        f.watches_ended_cleanly.load(Ordering::Relaxed),
        f.watches_reset.load(Ordering::Relaxed),
        f.resumes_refused.load(Ordering::Relaxed),
        f.watch_events.load(Ordering::Relaxed),
    );
    eprintln!(
        "rolling restart of 2 replicas behind haproxy in {} ms: {sent} short requests sent, \
         {failed} failed; {opened} watches opened, {clean} ended cleanly and resumed, {reset} \
         reset, {refused} resumes refused; {events} watch events",
        took.as_millis()
    );
    let failures = f.failures.lock().unwrap().clone();
    assert_eq!(failed, 0, "failed requests:\n{}", failures.join("\n"));
    assert_eq!(reset, 0, "watches reset");
    assert_eq!(refused, 0, "watches that could not resume");
    // Each of the four watches was on one replica or the other, and both were restarted.
    assert!(
        clean >= 4,
        "only {clean} watches ended (cleanly) during the roll"
    );
    assert!(sent > 200, "too little load to mean anything: {sent}");
    drop(new_b);
}
