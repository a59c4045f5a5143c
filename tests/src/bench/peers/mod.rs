//! The gateway beside its peers (issue 17): nginx and HAProxy started on the same backends, with
//! the same certificate, measured by the same `wrk` in the same run, for both shapes a sidecar
//! gateway serves:
//! - **fallthrough**: TLS in, plain HTTP to the core (a path no APIService claims);
//! - **remote**: TLS in, TLS to the remote APIService's backend (`/apis/bench.example.com/v1/...`).
//!
//! Rounds are interleaved (each round visits direct, gateway, nginx, HAProxy and the gateway with
//! priority and fairness off, starting one further along each time) so that whatever else the
//! shared machine does spreads over all of them; the table has medians over rounds. Each measured run also records the serving process's
//! CPU time and, where the machine has hardware counters, its instructions ([`counters`]) per
//! request, which do not depend on what else runs.
//!
//! The part runs only when `wrk`, `nginx` and `haproxy` are on `PATH` (Debian's packages);
//! otherwise the report says it was skipped and why.

pub mod callgrind;
pub mod counters;
pub mod proxies;
pub mod wrk;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use self::callgrind::{Callgrind, Counts};
use self::counters::{Counting, PerfStat};
use self::proxies::Peer;
use self::wrk::{WrkResult, WrkSpec};
use super::load::{client_tls, connect, request, Endpoint, Proto};
use super::memory::{context_switches, CpuMeter};
use super::report::{Results, Section};
use super::setup::Setup;
use super::{median, BoxError, Settings, BENCH_GROUP};
use crate::harness::Gateway;

/// The scenario name (`--only` matches it) and the report section's title.
pub const NAME: &str = "peers: the gateway beside nginx and HAProxy (wrk)";

/// The tools this part needs on `PATH`.
const TOOLS: [&str; 3] = ["wrk", "nginx", "haproxy"];

/// Issue 17's load: 32 keep-alive connections; two wrk threads, one per core.
const CONNECTIONS: usize = 32;
const WRK_THREADS: usize = 2;
/// Connections while a proxy runs under callgrind. Some 50 times slower there, a proxy with 32
/// connections is overloaded far beyond anything the timed rounds do, and what it does then
/// depends on timing (HAProxy's TLS-to-backend path, counted with 32 connections, took 2.5 times
/// the instructions per request it took with 4, at a p99 of a second); 4 keeps every proxy
/// answering promptly, so the counts are the work a request costs.
const CALLGRIND_CONNECTIONS: usize = 4;

/// The small JSON document through the core (any path no APIService claims falls through).
const CORE_PATH: &str = "/api/v1/namespaces/default/configmaps/bench";

/// Who serves a measured run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Direct,
    Gateway,
    Nginx,
    Haproxy,
    /// The same gateway with `--enable-priority-and-fairness=false`, so that what priority and
    /// fairness costs is read within one run.
    GatewayWithoutApf,
}

const SERVERS: [Server; 5] = [
    Server::Direct,
    Server::Gateway,
    Server::Nginx,
    Server::Haproxy,
    Server::GatewayWithoutApf,
];

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::Direct => "direct TLS backend",
            Server::Gateway => "gateway",
            Server::Nginx => "nginx (1 worker)",
            Server::Haproxy => "HAProxy (1 thread)",
            Server::GatewayWithoutApf => "gateway, priority and fairness off",
        }
    }
}

/// One of issue 17's two shapes.
struct Shape {
    key: &'static str,
    label: &'static str,
    path: String,
}

fn shapes() -> [Shape; 2] {
    [
        Shape {
            key: "fallthrough",
            label: "fallthrough: TLS in → plain HTTP to the core",
            path: CORE_PATH.to_owned(),
        },
        Shape {
            key: "remote",
            label: "remote: TLS in → TLS to the remote APIService",
            path: format!("/apis/{BENCH_GROUP}/v1/namespaces/default/things/bench"),
        },
    ]
}

/// What one measured run gave.
struct Sample {
    wrk: WrkResult,
    /// The serving process's user + system CPU time per request.
    cpu_us: f64,
    /// Its threads' context switches per request: voluntary, and not.
    switches: (f64, f64),
    /// Its instructions per request, or why there is no figure.
    instructions: Result<f64, String>,
}

/// The run's processes, by who serves.
struct Targets<'a> {
    setup: &'a Setup,
    nginx: Peer,
    haproxy: Peer,
    without_apf: Gateway,
}

impl Targets<'_> {
    fn addr(&self, server: Server) -> SocketAddr {
        match server {
            Server::Direct => self.setup.tls_backend.addr,
            Server::Gateway => self.setup.gateway.addr,
            Server::Nginx => self.nginx.addr,
            Server::Haproxy => self.haproxy.addr,
            Server::GatewayWithoutApf => self.without_apf.addr,
        }
    }

    /// The process whose CPU and instructions count as the server's: the proxy's, or the TLS
    /// backend's when direct.
    fn pid(&self, server: Server) -> u32 {
        match server {
            Server::Direct => self.setup.tls_backend.process.id(),
            Server::Gateway => self.setup.gateway.process.id(),
            Server::Nginx => self.nginx.pid(),
            Server::Haproxy => self.haproxy.pid(),
            Server::GatewayWithoutApf => self.without_apf.process.id(),
        }
    }
}

/// Measures the peers when the tools are installed, and adds the section to `results`.
pub async fn run(
    settings: &Settings,
    setup: &Setup,
    results: &mut Results,
) -> Result<(), BoxError> {
    let missing: Vec<&str> = TOOLS.into_iter().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        let line = format!(
            "skipped: nginx/haproxy/wrk not installed (not on PATH: {})",
            missing.join(", ")
        );
        eprintln!("bench: {NAME}: {line}");
        results
            .raw
            .insert(NAME.to_owned(), json!({ "skipped": line }));
        results.sections.push(Section::new(NAME, line));
        return Ok(());
    }
    let (rounds, seconds) = if settings.short { (1, 1) } else { (5, 3) };
    let counting = counters::probe(settings.short);
    match &counting {
        Counting::Perf => {}
        Counting::Callgrind(why) => {
            eprintln!("bench: {NAME}: {why}; instructions are counted under callgrind")
        }
        Counting::Unavailable(why) => {
            eprintln!("bench: {NAME}: instructions per request n/a: {why}")
        }
    }

    let dir = tempfile::Builder::new().prefix("bench-peers-").tempdir()?;
    // For profiling (BENCH_KEEP_PEERS_DIR set): keep the configurations and callgrind's dumps.
    let dir = if std::env::var_os("BENCH_KEEP_PEERS_DIR").is_some() {
        let path = dir.keep();
        eprintln!("bench: {NAME}: keeping {}", path.display());
        Kept::Path(path)
    } else {
        Kept::Temp(dir)
    };
    eprintln!("bench: {NAME}: starting nginx and HAProxy");
    let targets = Targets {
        setup,
        nginx: proxies::start_nginx(setup, dir.path(), None).await?,
        haproxy: proxies::start_haproxy(setup, dir.path(), None).await?,
        without_apf: start_gateway_without_apf(setup).await?,
    };
    let shapes = shapes();
    for shape in &shapes {
        for server in SERVERS {
            check_answers(setup, targets.addr(server), server, shape).await?;
        }
    }

    // Warm-up: TLS sessions, upstream connection pools, caches; not measured.
    for shape in &shapes {
        for server in SERVERS {
            wrk::run(&spec(&targets, server, shape, 1)).await?;
        }
    }
    // samples[shape][server][round]
    let mut samples: Vec<Vec<Vec<Sample>>> = shapes
        .iter()
        .map(|_| SERVERS.iter().map(|_| Vec::new()).collect())
        .collect();
    for round in 0..rounds {
        for (s, shape) in shapes.iter().enumerate() {
            for i in 0..SERVERS.len() {
                let k = (i + round) % SERVERS.len();
                let server = SERVERS[k];
                let sample = measure(&targets, server, shape, seconds, &counting).await?;
                eprintln!(
                    "bench:   round {} {} {}: {:.0} req/s p99 {:.2} ms errors {}, context switches per request {:.2} voluntary {:.2} not",
                    round + 1,
                    shape.key,
                    server.label(),
                    sample.wrk.requests_per_s,
                    sample.wrk.p99_ms,
                    sample.wrk.errors,
                    sample.switches.0,
                    sample.switches.1
                );
                samples[s][k].push(sample);
            }
        }
    }

    drop(targets);

    let mut summaries: Vec<Vec<Summary>> = samples
        .iter()
        .map(|by_server| summarize(by_server))
        .collect();
    let mut counted = Vec::new();
    if matches!(counting, Counting::Callgrind(_)) {
        counted = callgrind_pass(setup, dir.path(), &shapes, seconds).await?;
        for (shape, by_server) in summaries.iter_mut().enumerate() {
            for (k, summary) in by_server.iter_mut().enumerate() {
                let per_request = counted
                    .iter()
                    .find(|c| c.shape == shape && c.server == SERVERS[k])
                    .and_then(|c| c.per_request.as_ref().ok().copied());
                summary.instructions = per_request.map(|p| p.instructions);
                summary.allocations = per_request.map(|p| p.allocations);
            }
        }
    }
    let markdown = section_markdown(&shapes, &summaries, rounds, seconds, &counting);
    let raw_rounds: Vec<Value> = shapes
        .iter()
        .zip(&samples)
        .flat_map(|(shape, by_server)| {
            SERVERS
                .iter()
                .zip(by_server)
                .flat_map(move |(server, runs)| {
                    runs.iter().enumerate().map(move |(round, r)| {
                        json!({
                            "shape": shape.key, "server": server.label(), "round": round + 1,
                            "requests": r.wrk.requests, "seconds": r.wrk.seconds,
                            "requests_per_s": r.wrk.requests_per_s,
                            "p50_ms": r.wrk.p50_ms, "p99_ms": r.wrk.p99_ms,
                            "errors": r.wrk.errors, "cpu_us_per_request": r.cpu_us,
                            "context_switches_per_request": {
                                "voluntary": r.switches.0, "nonvoluntary": r.switches.1,
                            },
                            "instructions_per_request": r.instructions.as_ref().ok(),
                        })
                    })
                })
        })
        .collect();
    results.raw.insert(
        NAME.to_owned(),
        json!({
            "wrk": format!("wrk -t{WRK_THREADS} -c{CONNECTIONS} -d{seconds}s --latency"),
            "rounds": rounds,
            "seconds_per_run": seconds,
            "instructions": match &counting {
                Counting::Perf => "perf stat -e instructions".to_owned(),
                Counting::Callgrind(why) => format!("callgrind ({why})"),
                Counting::Unavailable(why) => format!("n/a: {why}"),
            },
            "runs": raw_rounds,
            "callgrind": counted.iter().map(|c| json!({
                "shape": shapes[c.shape].key, "server": c.server.label(),
                "requests": c.requests,
                "instructions_per_request": c.per_request.as_ref().ok().map(|p| p.instructions),
                "allocations_per_request": c.per_request.as_ref().ok().map(|p| p.allocations),
                "error": c.per_request.as_ref().err(),
            })).collect::<Vec<_>>(),
        }),
    );
    results.sections.push(Section::new(NAME, markdown));
    Ok(())
}

/// The run's directory: removed at the end, or kept for profiling.
enum Kept {
    Temp(tempfile::TempDir),
    Path(PathBuf),
}

impl Kept {
    fn path(&self) -> &std::path::Path {
        match self {
            Kept::Temp(dir) => dir.path(),
            Kept::Path(path) => path,
        }
    }
}

/// Whether an executable named `tool` is in one of `PATH`'s directories.
fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir: PathBuf| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn spec(targets: &Targets, server: Server, shape: &Shape, seconds: u64) -> WrkSpec {
    WrkSpec {
        threads: WRK_THREADS,
        connections: CONNECTIONS,
        duration: Duration::from_secs(seconds),
        url: format!("https://{}{}", targets.addr(server), shape.path),
    }
}

/// Before anything is measured: every server answers the shape's path with 200 and the
/// backend's document, so a misrouted peer (a 404 page is small and fast) cannot pass as fast.
async fn check_answers(
    setup: &Setup,
    addr: SocketAddr,
    server: Server,
    shape: &Shape,
) -> Result<(), BoxError> {
    let endpoint = Endpoint {
        addr,
        ca_pem: Some(setup.ca_pem.clone()),
        client_cert: None,
    };
    let tls = client_tls(&setup.ca_pem, Proto::H1)?;
    let mut sender = connect(&endpoint, Some(&tls), Proto::H1).await?;
    let response = sender
        .send(request(
            &endpoint,
            Proto::H1,
            &shape.path,
            Some("application/json"),
        ))
        .await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let document = serde_json::from_slice::<Value>(&body).ok();
    let is_the_document = document
        .as_ref()
        .is_some_and(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "bench");
    if status != StatusCode::OK || !is_the_document {
        return Err(format!(
            "{} answered {} for {} with {status} and {:?}, not the backend's document",
            server.label(),
            shape.key,
            shape.path,
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
        .into());
    }
    Ok(())
}

/// One measured run, with the serving process's CPU time and instructions around it.
async fn measure(
    targets: &Targets<'_>,
    server: Server,
    shape: &Shape,
    seconds: u64,
    counting: &Counting,
) -> Result<Sample, BoxError> {
    let pid = targets.pid(server);
    let perf = match counting {
        Counting::Perf => Some(PerfStat::attach(pid).await),
        Counting::Callgrind(_) | Counting::Unavailable(_) => None,
    };
    let meter = CpuMeter::start(&[pid]);
    let switched = context_switches(pid);
    let wrk = wrk::run(&spec(targets, server, shape, seconds)).await?;
    let cpu_us = meter.per_request_us(wrk.requests)[0];
    let requests = wrk.requests.max(1) as f64;
    let now = context_switches(pid);
    let switches = (
        now.0.saturating_sub(switched.0) as f64 / requests,
        now.1.saturating_sub(switched.1) as f64 / requests,
    );
    let instructions = match (perf, counting) {
        (Some(Ok(perf)), _) => perf
            .finish()
            .await
            .map(|n| n as f64 / requests)
            .map_err(|e| e.to_string()),
        (Some(Err(e)), _) => Err(e.to_string()),
        (None, Counting::Unavailable(why)) => Err(why.clone()),
        (None, Counting::Callgrind(_)) => Err("counted under callgrind, separately".to_owned()),
        (None, Counting::Perf) => Err("not counted".to_owned()),
    };
    if let Err(why) = &instructions {
        if matches!(counting, Counting::Perf) {
            eprintln!(
                "bench:   instructions of {} not counted: {why}",
                server.label()
            );
        }
    }
    Ok(Sample {
        wrk,
        cpu_us,
        switches,
        instructions,
    })
}

/// A proxy under callgrind: one of the peers, or a second gateway started like the first.
enum Counted {
    Gateway(Gateway),
    Peer(Peer),
}

/// What callgrind counted for one proxy and shape.
struct CallgrindFigure {
    shape: usize,
    server: Server,
    requests: u64,
    per_request: Result<PerRequest, String>,
}

/// Callgrind's counts divided by the requests served.
#[derive(Clone, Copy)]
struct PerRequest {
    instructions: f64,
    /// Blocks asked of the C allocator (see [`Counts::allocations`]).
    allocations: f64,
}

/// Starts each proxy once more under callgrind and counts its instructions over one wrk run per
/// shape. A proxy that fails here costs its figures (reported), not the run.
async fn callgrind_pass(
    setup: &Setup,
    dir: &std::path::Path,
    shapes: &[Shape],
    seconds: u64,
) -> Result<Vec<CallgrindFigure>, BoxError> {
    let cg = Callgrind::new(dir)?;
    let mut figures = Vec::new();
    for server in [
        Server::Gateway,
        Server::Nginx,
        Server::Haproxy,
        Server::GatewayWithoutApf,
    ] {
        eprintln!("bench: {NAME}: {} under callgrind", server.label());
        let started = match server {
            Server::Gateway => start_gateway_under(setup, &cg, GATEWAY_UNDER_CALLGRIND, &[])
                .await
                .map(Counted::Gateway),
            Server::GatewayWithoutApf => start_gateway_under(
                setup,
                &cg,
                GATEWAY_WITHOUT_APF_UNDER_CALLGRIND,
                &["--enable-priority-and-fairness=false"],
            )
            .await
            .map(Counted::Gateway),
            Server::Nginx => proxies::start_nginx(setup, dir, Some(&cg))
                .await
                .map(Counted::Peer),
            _ => proxies::start_haproxy(setup, dir, Some(&cg))
                .await
                .map(Counted::Peer),
        };
        let (addr, pid, name) = match &started {
            Ok(Counted::Gateway(g)) => (
                g.addr,
                g.process.id(),
                if server == Server::Gateway {
                    GATEWAY_UNDER_CALLGRIND
                } else {
                    GATEWAY_WITHOUT_APF_UNDER_CALLGRIND
                },
            ),
            Ok(Counted::Peer(p)) => (p.addr, p.pid(), p.process.name()),
            Err(e) => {
                eprintln!(
                    "bench:   {} did not start under callgrind: {e}",
                    server.label()
                );
                for shape in 0..shapes.len() {
                    figures.push(CallgrindFigure {
                        shape,
                        server,
                        requests: 0,
                        per_request: Err(format!("did not start under callgrind: {e}")),
                    });
                }
                continue;
            }
        };
        let name = name.to_owned();
        for (s, shape) in shapes.iter().enumerate() {
            let counted = count_one(setup, &cg, addr, pid, &name, server, shape, seconds).await;
            let (requests, per_request) = match counted {
                Ok((requests, counts)) => {
                    let per = |n: u64| n as f64 / requests.max(1) as f64;
                    let per = PerRequest {
                        instructions: per(counts.instructions),
                        allocations: per(counts.allocations),
                    };
                    eprintln!(
                        "bench:   {} {}: {:.0} instructions and {:.1} allocations per request ({requests} requests)",
                        shape.key,
                        server.label(),
                        per.instructions,
                        per.allocations,
                    );
                    (requests, Ok(per))
                }
                Err(e) => {
                    eprintln!(
                        "bench:   {} {}: not counted: {e}",
                        shape.key,
                        server.label()
                    );
                    (0, Err(e.to_string()))
                }
            };
            figures.push(CallgrindFigure {
                shape: s,
                server,
                requests,
                per_request,
            });
        }
    }
    Ok(figures)
}

/// The bench's gateway once more (same flags, backends and certificates) with priority and
/// fairness off.
async fn start_gateway_without_apf(setup: &Setup) -> Result<Gateway, BoxError> {
    let options = setup
        .gateway_options
        .clone()
        .args(["--enable-priority-and-fairness=false"]);
    Ok(Gateway::start(options).await?)
}

/// The labels of the gateways' callgrind dumps.
const GATEWAY_UNDER_CALLGRIND: &str = "gateway-callgrind";
const GATEWAY_WITHOUT_APF_UNDER_CALLGRIND: &str = "gateway-without-apf-callgrind";

/// The bench's gateway once more (same flags, backends and certificates, and `extra`), under
/// callgrind, its dumps labelled `name`.
async fn start_gateway_under(
    setup: &Setup,
    cg: &Callgrind,
    name: &str,
    extra: &[&str],
) -> Result<Gateway, BoxError> {
    let binary = setup
        .gateway_options
        .binary
        .clone()
        .ok_or("the bench's gateway options name no binary")?;
    // Remote discovery is revalidated every minute: a refresh (fetch, decode, publish: about
    // 5k instructions a request's worth) landing in one counted window and not the other
    // moved the fallthrough figure by up to 7%. The counts are about requests, so none runs.
    let mut options = setup
        .gateway_options
        .clone()
        .binary(cg.script(name, &binary)?)
        .args(["--discovery-refresh-interval", "1h"])
        .args(extra.iter().copied());
    options.startup_timeout = Duration::from_secs(180);
    Ok(Gateway::start(options).await?)
}

/// Waits until the proxy answers the shape (the gateway's remote APIService becomes available
/// a little after it serves), warms it up, then counts two wrk runs, a short and a long one, and
/// returns the difference (requests, instructions): each run opens its 32 connections with a TLS
/// handshake, which under callgrind is a sizeable share of a short run; the difference leaves the
/// cost of the requests alone.
#[allow(clippy::too_many_arguments)]
async fn count_one(
    setup: &Setup,
    cg: &Callgrind,
    addr: SocketAddr,
    pid: u32,
    name: &str,
    server: Server,
    shape: &Shape,
    seconds: u64,
) -> Result<(u64, Counts), BoxError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while let Err(e) = check_answers(setup, addr, server, shape).await {
        if std::time::Instant::now() > deadline {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let spec = |seconds: u64| WrkSpec {
        threads: WRK_THREADS,
        connections: CALLGRIND_CONNECTIONS,
        duration: Duration::from_secs(seconds),
        url: format!("https://{addr}{}", shape.path),
    };
    wrk::run(&spec(2)).await?;
    let (short_requests, short) = counted_run(cg, pid, name, &spec(1)).await?;
    let (long_requests, long) = counted_run(cg, pid, name, &spec(seconds + 2)).await?;
    // Too few requests between the runs and the handshakes' share does not cancel reliably.
    if long_requests < short_requests + 200 || long.instructions < short.instructions {
        return Err(format!(
            "too few requests to count ({short_requests} then {long_requests}): the machine is too busy"
        )
        .into());
    }
    Ok((
        long_requests - short_requests,
        Counts {
            instructions: long.instructions - short.instructions,
            allocations: long.allocations.saturating_sub(short.allocations),
        },
    ))
}

/// One wrk run between zeroing and dumping the counters: (requests, counts).
async fn counted_run(
    cg: &Callgrind,
    pid: u32,
    name: &str,
    spec: &WrkSpec,
) -> Result<(u64, Counts), BoxError> {
    cg.zero(pid).await?;
    let result = wrk::run(spec).await?;
    let counts = cg.dump(name, pid).await?;
    if result.errors > 0 {
        return Err(format!("{} errors in a counted run", result.errors).into());
    }
    Ok((result.requests, counts))
}

/// One server's medians over the rounds of one shape.
struct Summary {
    requests_per_s: f64,
    /// Median of the per-round ratios to the direct run of the same round.
    ratio: f64,
    p99_ms: f64,
    cpu_us: f64,
    instructions: Option<f64>,
    /// Under callgrind only.
    allocations: Option<f64>,
    errors: u64,
}

fn summarize(by_server: &[Vec<Sample>]) -> Vec<Summary> {
    let direct = &by_server[0];
    by_server
        .iter()
        .map(|runs| {
            let col =
                |f: &dyn Fn(&Sample) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
            let mut ratios: Vec<f64> = runs
                .iter()
                .zip(direct)
                .map(|(r, d)| r.wrk.requests_per_s / d.wrk.requests_per_s)
                .collect();
            let mut instructions: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.instructions.as_ref().ok().copied())
                .collect();
            Summary {
                requests_per_s: col(&|r| r.wrk.requests_per_s),
                ratio: median(&mut ratios),
                p99_ms: col(&|r| r.wrk.p99_ms),
                cpu_us: col(&|r| r.cpu_us),
                instructions: (!instructions.is_empty()).then(|| median(&mut instructions)),
                allocations: None,
                errors: runs.iter().map(|r| r.wrk.errors).sum(),
            }
        })
        .collect()
}

/// The section: how it was measured, the table, and issue 17's targets per shape.
fn section_markdown(
    shapes: &[Shape],
    summaries: &[Vec<Summary>],
    rounds: usize,
    seconds: u64,
    counting: &Counting,
) -> String {
    let mut out = String::new();
    // The long counted run under callgrind (`count_one`).
    let long = seconds + 2;
    let instructions_method = match counting {
        Counting::Perf => "`perf stat -e instructions -p <pid>` attached to the serving process \
             during each measured run, divided by the requests wrk completed"
            .to_owned(),
        Counting::Callgrind(why) => format!(
            "{why}, so each proxy was started once more under valgrind's callgrind, which counts \
             instructions in software, and counted over a 1 s and a {long} s wrk run per shape \
             with {CALLGRIND_CONNECTIONS} connections, after a 2 s warm-up (`callgrind_control -z`, \
             then `-d`, around each): the difference in instructions divided by the difference in \
             requests, so the TLS handshakes each run starts with cancel out (allocations per request \
             likewise: the calls into the C allocator's `malloc`, `calloc` and aligned \
             allocation in the same dumps, not `realloc`). Fewer connections \
             than the timed rounds because a proxy under callgrind runs some 50 times slower and \
             32 connections overload it into timing-dependent work (HAProxy's TLS-to-backend \
             path took 2.5 times the instructions per request); with {CALLGRIND_CONNECTIONS} \
             each proxy handles fewer requests per wake-up than at full speed, all three alike. The gateway's figure also \
             has its background work in those seconds (the remote APIService's availability \
             check every second, discovery), not separated out"
        ),
        Counting::Unavailable(why) => format!("n/a: {why}"),
    };
    let _ = write!(
        out,
        "`wrk -t{WRK_THREADS} -c{CONNECTIONS} -d{seconds}s --latency -H 'Accept: application/json'` \
         over TLS against the TLS backend directly, the gateway, nginx (one process, \
         `master_process off`, upstream `keepalive` with `proxy_http_version 1.1`) and HAProxy \
         (`nbthread 1`, `http-reuse always`). nginx and HAProxy use the gateway's serving \
         certificate, proxy to the same two backends and verify the remote backend's certificate \
         against the bench CA as `api.bench.svc`, as the gateway does; none writes an access log. \
         wrk presents no client certificate, so its requests are anonymous (allowed, as kube-apiserver \
         allows them by default; the bench's static core cannot answer the TokenReview a bearer \
         token would need); the gateway then reaches the remote backend over HTTP/1.1, as nginx and \
         HAProxy do (the main table's remote row is a client-certificate user over HTTP/2). \
         {rounds} round(s) of {seconds} s after one unmeasured second each; every round visits the \
         five servers, starting one further along each time; figures are medians over rounds, the \
         ratio is the median of each round's ratio to that round's direct run. CPU per request: the \
         serving process's user + system time (`/proc`) per request — the proxy's, or the \
         backend's for the direct row. The last row of each shape is the same gateway started a \
         second time with `--enable-priority-and-fairness=false`, so that what priority and \
         fairness costs is read in the same run. Instructions per request: {instructions_method}.\n\n"
    );
    out.push_str(
        "| shape | server | req/s | ratio to direct | p99 | CPU per request | instructions per request | allocations per request | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (shape, by_server) in shapes.iter().zip(summaries) {
        for (server, s) in SERVERS.iter().zip(by_server) {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.2}× | {:.2} ms | {:.1} µs | {} | {} | {} |",
                shape.label,
                server.label(),
                s.requests_per_s,
                s.ratio,
                s.p99_ms,
                s.cpu_us,
                s.instructions
                    .map_or("n/a".to_owned(), |n| format!("{:.0}", n)),
                s.allocations
                    .map_or("n/a".to_owned(), |n| format!("{:.1}", n)),
                s.errors
            );
        }
    }
    out.push_str("\nIssue 17's targets (the gateway against nginx and HAProxy, this run):\n\n");
    for (shape, by_server) in shapes.iter().zip(summaries) {
        let [_, gateway, nginx, haproxy, ..] = by_server.as_slice() else {
            continue;
        };
        let yes = |met: bool| if met { "met" } else { "**not met**" };
        let best_peer = nginx.ratio.max(haproxy.ratio);
        let _ = write!(
            out,
            "- {}: throughput ratio {:.2} vs nginx {:.2}, HAProxy {:.2} (at least both: {}); \
             p99 {:.2} ms vs 1.2 × nginx's {:.2} ms = {:.2} ms ({})",
            shape.key,
            gateway.ratio,
            nginx.ratio,
            haproxy.ratio,
            yes(gateway.ratio >= best_peer),
            gateway.p99_ms,
            nginx.p99_ms,
            1.2 * nginx.p99_ms,
            yes(gateway.p99_ms <= 1.2 * nginx.p99_ms),
        );
        match (gateway.instructions, nginx.instructions) {
            (Some(g), Some(n)) => {
                let _ = writeln!(
                    out,
                    "; instructions per request {g:.0} vs 1.2 × nginx's {n:.0} = {:.0} ({}).",
                    1.2 * n,
                    yes(g <= 1.2 * n)
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "; instructions per request n/a, CPU per request {:.1} µs vs nginx's {:.1} µs ({:.2}×).",
                    gateway.cpu_us,
                    nginx.cpu_us,
                    gateway.cpu_us / nginx.cpu_us
                );
            }
        }
        if let Some(off) = by_server.get(4) {
            let _ = writeln!(
                out,
                "- {}: priority and fairness on ÷ off, same run: throughput {:.2}× ({:.0} vs {:.0} req/s), \
                 p99 {:.2} vs {:.2} ms, CPU per request {:.1} vs {:.1} µs.",
                shape.key,
                gateway.requests_per_s / off.requests_per_s,
                gateway.requests_per_s,
                off.requests_per_s,
                gateway.p99_ms,
                off.p99_ms,
                gateway.cpu_us,
                off.cpu_us
            );
        }
    }
    out
}
