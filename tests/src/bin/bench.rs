//! The benchmark harness: what the gateway costs compared with talking to the backend directly,
//! measured in the same run.
//!
//! ```text
//! cargo run --release -p e2e --bin bench -- [--short] [--json out.json] [--gateway PATH] [--write-benchmarks-md]
//! ```
//!
//! One run starts, all on loopback:
//! - two **static backends** (this binary, `bench serve-backend`, each its own process so its RSS
//!   and CPU are its own): one plain HTTP (the gateway's core server, as a sidecar core on
//!   loopback would be), one TLS (for "direct" measurements and as the remote APIService
//!   `v1.bench.example.com`). They answer from prepared bytes: a small JSON object, 1 MiB, an
//!   aggregated discovery `/apis` with ETag, and watches that send one event and stay open. The
//!   point is the gateway's overhead, so the backend must be cheap;
//! - the **gateway** (release build unless `--gateway` names another binary), TLS in front;
//! - the **load generator**, in this process: hyper client connections (HTTP/1.1 keep-alive, one
//!   request in flight per connection, or HTTP/2 with several streams per connection), a fixed
//!   warm-up then a fixed measuring window, every latency kept and sorted for percentiles.
//!
//! Every proxied figure is measured twice with the same generator, the same client TLS and the
//! same concurrency: against the backend directly (TLS, as a client would reach an API server
//! without the gateway) and through the gateway. The table reports both and their ratio; targets
//! are on ratios or on the gateway's own resources. On a 2-core machine the generator, the
//! gateway and the backend share the CPUs; that is true of the direct run as well, so the ratio
//! is fair, but absolute numbers are lower than a dedicated load machine would show.
//!
//! Route-table and discovery rebuilds are timed in this process with the gateway's own
//! `apiservice` types (no sockets). Memory is `VmRSS` from `/proc/<pid>/status`.
//!
//! `--short` runs every scenario for about a second (CI checks that the table is produced);
//! the full mode is what `BENCHMARKS.md` shows, and `--write-benchmarks-md` rewrites that file
//! (keeping the hand-written notes below its marker).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiservice::discovery::merge::{merge, APIServiceDiscovery, CoreDiscovery, RemoteDiscovery};
use apiservice::model::{Backend, RegisteredAPIService, RemoteBackendSpec, ServiceRef};
use apiservice::route::{Availability, Lookup, RouteTable};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use e2e::certs::{install_crypto, CertifiedPair, TestCa};
use e2e::harness::{self, Gateway, GatewayOptions, Process};
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_core::discovery::v2::APIGroupDiscoveryList;
use serde_json::{json, Value};
use sha2::{Digest, Sha512};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

const LOAD_GENERATOR: &str = "bench's own load generator (hyper 1 client connections on tokio, in \
    the bench process; HTTP/1.1: one request in flight per keep-alive connection; HTTP/2: \
    several concurrent streams per connection; every latency kept, percentiles from the sorted \
    sample)";

const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const BENCH_GROUP: &str = "bench.example.com";
const ONE_MIB: usize = 1 << 20;

#[derive(Parser, Debug)]
#[command(about = "Gateway overhead benchmarks: direct vs via the gateway, same run")]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// A few seconds per scenario (CI); the table is produced but targets mean little.
    #[arg(long)]
    short: bool,
    /// Where to write the JSON results [default: <workspace>/target/bench/bench.json].
    #[arg(long)]
    json: Option<PathBuf>,
    /// The gateway binary [default: build `aggregation-gateway` with this binary's profile].
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// Rewrite <workspace>/BENCHMARKS.md with this run's table and machine.
    #[arg(long)]
    write_benchmarks_md: bool,
    /// Watch streams held open [default: 10000, short: 200].
    #[arg(long)]
    watch_streams: Option<usize>,
    /// Measuring window per side of a throughput scenario, seconds [default: 5, short: 1].
    #[arg(long)]
    duration: Option<f64>,
    /// Run only the scenarios whose name contains this text (e.g. "small GET"), for profiling
    /// one of them; the table then has just those rows.
    #[arg(long, conflicts_with = "write_benchmarks_md")]
    only: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Internal: the static backend (prints `listening on ADDR`).
    #[command(hide = true)]
    ServeBackend {
        #[arg(long)]
        tls_cert: Option<PathBuf>,
        #[arg(long)]
        tls_key: Option<PathBuf>,
    },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    install_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Some(Sub::ServeBackend { tls_cert, tls_key }) => {
            runtime.block_on(serve_backend(tls_cert, tls_key))
        }
        None => runtime.block_on(run(cli)),
    }
}

// =================================================================================================
// The static backend
// =================================================================================================

/// Prepared answers of the static backend.
struct Documents {
    small: Bytes,
    big: Bytes,
    apis: Bytes,
    apis_etag: HeaderValue,
    api: Bytes,
    api_etag: HeaderValue,
    event: Bytes,
}

impl Documents {
    fn new() -> Documents {
        let small = Bytes::from(
            serde_json::to_vec(&json!({
                "kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": "bench", "namespace": "default", "resourceVersion": "1",
                             "uid": "6b1f2c3e-0000-4000-8000-000000000001",
                             "creationTimestamp": "2025-01-01T00:00:00Z"},
                "data": {"key": "value", "other": "a somewhat longer value to make a realistic small object"}
            }))
            .expect("static JSON"),
        );
        let apis = Bytes::from(serde_json::to_vec(&core_apis_doc()).expect("static JSON"));
        let api = Bytes::from(serde_json::to_vec(&core_api_doc()).expect("static JSON"));
        let mut event = serde_json::to_vec(&json!({"type": "ADDED", "object": serde_json::from_slice::<Value>(&small).expect("json")})).expect("json");
        event.push(b'\n');
        Documents {
            apis_etag: etag(&apis),
            api_etag: etag(&api),
            small,
            big: Bytes::from(vec![b'x'; ONE_MIB]),
            apis,
            api,
            event: Bytes::from(event),
        }
    }
}

fn etag(body: &[u8]) -> HeaderValue {
    let hex = hex::encode_upper(Sha512::digest(body));
    HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header value")
}

fn resource(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Value {
    json!({
        "resource": plural,
        "responseKind": {"group": group, "version": version, "kind": kind},
        "scope": if namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": kind.to_ascii_lowercase(),
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    })
}

fn group_entry(group: &str, version: &str, resources: Vec<Value>) -> Value {
    let metadata = if group.is_empty() {
        json!({})
    } else {
        json!({ "name": group })
    };
    json!({
        "metadata": metadata,
        "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
    })
}

fn discovery_list(items: Vec<Value>) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// A kube-sized `/apis`: 40 groups with 6 resources each (about as large as a small cluster's).
fn core_apis_doc() -> Value {
    let mut items = Vec::new();
    for g in 0..40 {
        let group = format!("group{g}.k8s.example.io");
        let resources = (0..6)
            .map(|r| {
                resource(
                    &group,
                    "v1",
                    &format!("things{r}"),
                    &format!("Thing{r}"),
                    r % 2 == 0,
                )
            })
            .collect();
        items.push(group_entry(&group, "v1", resources));
    }
    items.push(group_entry(
        BENCH_GROUP,
        "v1",
        vec![resource(BENCH_GROUP, "v1", "things", "Thing", true)],
    ));
    discovery_list(items)
}

fn core_api_doc() -> Value {
    let resources = [
        ("configmaps", "ConfigMap", true),
        ("namespaces", "Namespace", false),
        ("pods", "Pod", true),
        ("secrets", "Secret", true),
        ("services", "Service", true),
    ]
    .iter()
    .map(|(p, k, n)| resource("", "v1", p, k, *n))
    .collect();
    discovery_list(vec![group_entry("", "v1", resources)])
}

type BackendBody = BoxBody<Bytes, Infallible>;

fn full(bytes: Bytes) -> BackendBody {
    Full::new(bytes).boxed()
}

fn backend_answer(docs: &Documents, req: &Request<Incoming>) -> Response<BackendBody> {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let aggregated = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("apidiscovery.k8s.io"));
    let json_response = |body: Bytes| {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(body))
            .expect("static response")
    };
    if query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
    {
        let first = futures::stream::once(std::future::ready(Ok::<_, Infallible>(Frame::data(
            docs.event.clone(),
        ))));
        let stream = futures::StreamExt::chain(first, futures::stream::pending());
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .expect("static response");
    }
    match path {
        "/readyz" | "/livez" | "/healthz" => Response::new(full(Bytes::from_static(b"ok"))),
        "/apis" | "/api" if aggregated => {
            let (body, tag) = if path == "/apis" {
                (&docs.apis, &docs.apis_etag)
            } else {
                (&docs.api, &docs.api_etag)
            };
            let matched = req
                .headers()
                .get(header::IF_NONE_MATCH)
                .is_some_and(|v| v == tag);
            let builder = Response::builder()
                .header(header::CONTENT_TYPE, AGGREGATED_V2)
                .header(header::ETAG, tag.clone())
                .header(header::VARY, "Accept");
            if matched {
                builder
                    .status(StatusCode::NOT_MODIFIED)
                    .body(full(Bytes::new()))
                    .expect("static response")
            } else {
                builder.body(full(body.clone())).expect("static response")
            }
        }
        "/api" => json_response(Bytes::from_static(
            br#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#,
        )),
        "/openapi/v3" | "/openapi/v2" | "/apis" => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(full(Bytes::from_static(b"not found")))
            .expect("static response"),
        "/bench/1mib" => Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(full(docs.big.clone()))
            .expect("static response"),
        _ => json_response(docs.small.clone()),
    }
}

fn tls_server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, BoxError> {
    let pair = CertifiedPair {
        cert_pem: std::fs::read_to_string(cert)?,
        key_pem: std::fs::read_to_string(key)?,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(pair.cert_chain()?, pair.private_key()?)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn serve_backend(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<(), BoxError> {
    let tls = match (cert, key) {
        (Some(c), Some(k)) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            tls_server_config(&c, &k)?,
        ))),
        _ => None,
    };
    let docs = Arc::new(Documents::new());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("listening on {scheme}://{}", listener.local_addr()?);
    // The bench owns this process and kills it when done (harness `Process`, killed on drop).
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE under the watch scenario: back off instead of spinning.
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let docs = docs.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = backend_answer(&docs, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(20_000);
            let io: Box<dyn Io> = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => Box::new(stream),
                    Err(_) => return,
                },
                None => Box::new(tcp),
            };
            let _ = builder.serve_connection(TokioIo::new(io), service).await;
        });
    }
}

// =================================================================================================
// The load generator
// =================================================================================================

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    H1,
    H2,
}

/// Where the generator sends requests: an address and, for TLS, the CA to trust.
#[derive(Clone)]
struct Endpoint {
    addr: SocketAddr,
    ca_pem: Option<Arc<str>>,
}

impl Endpoint {
    fn authority(&self) -> String {
        self.addr.to_string()
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Sender {
    async fn send(&mut self, req: Request<Empty<Bytes>>) -> Result<Response<Incoming>, BoxError> {
        match self {
            Sender::H1(s) => {
                s.ready().await?;
                Ok(s.send_request(req).await?)
            }
            Sender::H2(s) => {
                s.ready().await?;
                Ok(s.send_request(req).await?)
            }
        }
    }

    fn clone_h2(&self) -> Option<Sender> {
        match self {
            Sender::H2(s) => Some(Sender::H2(s.clone())),
            Sender::H1(_) => None,
        }
    }
}

fn client_tls(ca_pem: &str, proto: Proto) -> Result<Arc<rustls::ClientConfig>, BoxError> {
    let alpn: &[&[u8]] = match proto {
        Proto::H1 => &[b"http/1.1"],
        Proto::H2 => &[b"h2"],
    };
    Ok(Arc::new(harness::tls_client_config(ca_pem, None, alpn)?))
}

async fn connect(
    endpoint: &Endpoint,
    tls: Option<&Arc<rustls::ClientConfig>>,
    proto: Proto,
) -> Result<Sender, BoxError> {
    let tcp = TcpStream::connect(endpoint.addr).await?;
    tcp.set_nodelay(true)?;
    let io: Box<dyn Io> = match tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::IpAddress(endpoint.addr.ip().into());
            Box::new(
                tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await?,
            )
        }
        None => Box::new(tcp),
    };
    let io = TokioIo::new(io);
    Ok(match proto {
        Proto::H1 => {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H1(sender)
        }
        Proto::H2 => {
            let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .handshake(io)
                .await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H2(sender)
        }
    })
}

fn request(
    endpoint: &Endpoint,
    proto: Proto,
    path: &str,
    accept: Option<&str>,
) -> Request<Empty<Bytes>> {
    let scheme = if endpoint.ca_pem.is_some() {
        "https"
    } else {
        "http"
    };
    let mut builder = match proto {
        // HTTP/1.1: origin-form target plus Host.
        Proto::H1 => Request::get(path).header(header::HOST, endpoint.authority()),
        // HTTP/2: the authority travels in the URI (`:authority`).
        Proto::H2 => Request::get(format!("{scheme}://{}{path}", endpoint.authority())),
    };
    if let Some(accept) = accept {
        builder = builder.header(header::ACCEPT, accept);
    }
    builder.body(Empty::new()).expect("valid request")
}

/// One load run's shape.
#[derive(Clone, Debug)]
struct LoadSpec {
    proto: Proto,
    connections: usize,
    /// Concurrent requests per connection (1 for HTTP/1.1).
    streams_per_connection: usize,
    path: String,
    accept: Option<&'static str>,
    warmup: Duration,
    duration: Duration,
}

impl LoadSpec {
    fn concurrency(&self) -> usize {
        self.connections * self.streams_per_connection
    }
}

#[derive(Clone, Debug, Default)]
struct LoadResult {
    requests: u64,
    /// Successful requests including the warm-up, to divide CPU time by.
    all_requests: u64,
    bytes: u64,
    errors: u64,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// CPU microseconds per request by process, filled in by [`pair`].
    cpu_us: Vec<(&'static str, f64)>,
}

impl LoadResult {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / ONE_MIB as f64
    }
    fn to_json(&self) -> Value {
        json!({
            "requests": self.requests, "bytes": self.bytes, "errors": self.errors,
            "seconds": self.seconds, "requests_per_second": round(self.rps(), 1),
            "mib_per_second": round(self.mib_per_s(), 1),
            "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3),
            "p999_ms": round(self.p999_ms, 3), "max_ms": round(self.max_ms, 3),
            "cpu_us_per_request": self.cpu_us.iter().map(|(k, v)| (k.to_string(), json!(round(*v, 1)))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

#[derive(Default)]
struct WorkerStats {
    requests: u64,
    all_requests: u64,
    bytes: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn worker(
    mut sender: Sender,
    endpoint: Endpoint,
    spec: Arc<LoadSpec>,
    measure_from: Instant,
    end: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats {
        latencies_us: Vec::with_capacity(64 * 1024),
        ..WorkerStats::default()
    };
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let req = request(&endpoint, spec.proto, &spec.path, spec.accept);
        let exchange = async {
            let resp = sender.send(req).await?;
            let ok = resp.status().is_success();
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    bytes += data.len() as u64;
                }
            }
            Ok::<_, BoxError>((ok, bytes))
        };
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await;
        let done = Instant::now();
        let measured = started >= measure_from && done <= end;
        match outcome {
            Ok(Ok((true, bytes))) => {
                stats.all_requests += 1;
                if measured {
                    stats.requests += 1;
                    stats.bytes += bytes;
                    let us = (done - started).as_micros().min(u32::MAX as u128) as u32;
                    stats.latencies_us.push(us);
                }
            }
            Ok(Ok((false, _))) => stats.errors += 1,
            // A broken connection ends this worker; the error count shows it.
            Ok(Err(_)) | Err(_) => {
                stats.errors += 1;
                break;
            }
        }
    }
    stats
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

async fn load(endpoint: &Endpoint, spec: &LoadSpec) -> Result<LoadResult, BoxError> {
    let tls = match &endpoint.ca_pem {
        Some(ca) => Some(client_tls(ca, spec.proto)?),
        None => None,
    };
    let mut senders = Vec::new();
    for _ in 0..spec.connections {
        let sender = connect(endpoint, tls.as_ref(), spec.proto).await?;
        for _ in 1..spec.streams_per_connection {
            senders.push(sender.clone_h2().ok_or("HTTP/1.1 carries one stream")?);
        }
        senders.push(sender);
    }
    let spec_arc = Arc::new(spec.clone());
    let measure_from = Instant::now() + spec.warmup;
    let end = measure_from + spec.duration;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|sender| {
            tokio::spawn(worker(
                sender,
                endpoint.clone(),
                spec_arc.clone(),
                measure_from,
                end,
            ))
        })
        .collect();
    let mut total = WorkerStats::default();
    for task in tasks {
        let stats = task.await?;
        total.requests += stats.requests;
        total.all_requests += stats.all_requests;
        total.bytes += stats.bytes;
        total.errors += stats.errors;
        total.latencies_us.extend(stats.latencies_us);
    }
    total.latencies_us.sort_unstable();
    let lat = &total.latencies_us;
    Ok(LoadResult {
        requests: total.requests,
        all_requests: total.all_requests,
        bytes: total.bytes,
        errors: total.errors,
        seconds: spec.duration.as_secs_f64(),
        p50_ms: percentile(lat, 50.0),
        p99_ms: percentile(lat, 99.0),
        p999_ms: percentile(lat, 99.9),
        max_ms: lat.last().map_or(0.0, |&us| us as f64 / 1000.0),
        cpu_us: Vec::new(),
    })
}

// =================================================================================================
// Memory
// =================================================================================================

/// `VmRSS` of a process in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// User + system CPU time a process has used so far, in seconds (`/proc/<pid>/stat`).
fn cpu_seconds(pid: u32) -> f64 {
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

/// CPU microseconds per request each process spent during a load run.
struct CpuMeter {
    pids: Vec<u32>,
    start: Vec<f64>,
}

impl CpuMeter {
    fn start(pids: &[u32]) -> CpuMeter {
        CpuMeter {
            pids: pids.to_vec(),
            start: pids.iter().map(|&p| cpu_seconds(p)).collect(),
        }
    }
    fn per_request_us(&self, requests: u64) -> Vec<f64> {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(&p, &s)| (cpu_seconds(p) - s) * 1e6 / requests.max(1) as f64)
            .collect()
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Samples the peak RSS of some processes every 50 ms until dropped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<HashMap<u32, u64>>,
}

impl RssSampler {
    fn start(pids: Vec<u32>) -> RssSampler {
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

    async fn finish(self) -> HashMap<u32, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

fn raise_nofile_limit() -> (u64, u64) {
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

// =================================================================================================
// Results
// =================================================================================================

/// One table row. `direct`/`via` are in `unit`; `ratio` is via ÷ direct.
#[derive(Clone, Debug)]
struct Row {
    scenario: String,
    metric: String,
    unit: &'static str,
    direct: Option<f64>,
    via: Option<f64>,
    target: String,
    met: Option<bool>,
    note: String,
}

impl Row {
    fn new(scenario: &str, metric: &str, unit: &'static str) -> Row {
        Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            unit,
            direct: None,
            via: None,
            target: "—".to_owned(),
            met: None,
            note: String::new(),
        }
    }
    fn values(mut self, direct: Option<f64>, via: Option<f64>) -> Row {
        self.direct = direct;
        self.via = via;
        self
    }
    fn target(mut self, target: impl Into<String>, met: Option<bool>) -> Row {
        self.target = target.into();
        self.met = met;
        self
    }
    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }
    fn ratio(&self) -> Option<f64> {
        match (self.direct, self.via) {
            (Some(d), Some(v)) if d > 0.0 => Some(v / d),
            _ => None,
        }
    }
    fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario, "metric": self.metric, "unit": self.unit,
            "direct": self.direct.map(|v| round(v, 4)), "via_gateway": self.via.map(|v| round(v, 4)),
            "ratio": self.ratio().map(|v| round(v, 3)), "target": self.target,
            "met": self.met, "note": self.note,
        })
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn fmt_value(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "—".to_owned(),
        Some(v) => {
            let n = if v >= 1000.0 {
                format!("{v:.0}")
            } else if v >= 100.0 {
                format!("{v:.1}")
            } else if v >= 1.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.3}")
            };
            format!("{n} {unit}")
        }
    }
}

fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | metric | direct | via gateway | ratio | target | met? | notes |\n|---|---|---:|---:|---:|---|---|---|\n",
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let ratio = r.ratio().map_or("—".to_owned(), |x| format!("{x:.2}×"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.metric,
            fmt_value(r.direct, r.unit),
            fmt_value(r.via, r.unit),
            ratio,
            r.target,
            met,
            r.note
        ));
    }
    out
}

// =================================================================================================
// The run
// =================================================================================================

struct Settings {
    short: bool,
    warmup: Duration,
    duration: Duration,
    watch_streams: usize,
    repeats: usize,
    only: Option<String>,
}

impl Settings {
    fn wants(&self, scenario: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| scenario.contains(only))
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    _plain: harness::FixtureServer,
    tls_backend: harness::FixtureServer,
    gateway: Gateway,
    gateway_options: GatewayOptions,
    ca_pem: Arc<str>,
    plain_pid: u32,
}

impl Setup {
    fn direct(&self) -> Endpoint {
        Endpoint {
            addr: self.tls_backend.addr,
            ca_pem: Some(self.ca_pem.clone()),
        }
    }
    fn via(&self) -> Endpoint {
        Endpoint {
            addr: self.gateway.addr,
            ca_pem: Some(self.ca_pem.clone()),
        }
    }
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    let short = cli.short;
    let settings = Settings {
        short,
        warmup: Duration::from_secs_f64(if short { 0.3 } else { 1.0 }),
        duration: Duration::from_secs_f64(cli.duration.unwrap_or(if short { 1.0 } else { 5.0 })),
        watch_streams: cli
            .watch_streams
            .unwrap_or(if short { 200 } else { 10_000 }),
        repeats: if short { 3 } else { 15 },
        only: cli.only.clone(),
    };
    let (nofile, nofile_max) = raise_nofile_limit();
    eprintln!("bench: open-file limit {nofile} (hard {nofile_max})");
    let gateway_binary = match cli.gateway.clone() {
        Some(path) => path,
        None => tokio::task::spawn_blocking(harness::ensure_gateway_built).await??,
    };
    eprintln!("bench: gateway binary {}", gateway_binary.display());

    let mut rows = Vec::new();
    let mut raw = serde_json::Map::new();

    // In-process first, while nothing else competes for the CPU.
    if settings.wants("route-table rebuild") || settings.wants("discovery rebuild") {
        eprintln!("bench: route table and discovery rebuilds (in process)");
        rebuild_benchmarks(&settings, &mut rows, &mut raw);
    }

    let setup = start_everything(&gateway_binary).await?;
    let gateway_pid = setup.gateway.process.id();
    let tls_pid = setup.tls_backend.process.id();

    // Idle: the gateway has started, synced and served a handful of requests.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_gateway = rss_bytes(gateway_pid).unwrap_or(0);
    let idle_backend = rss_bytes(tls_pid).unwrap_or(0);

    let sampler = RssSampler::start(vec![gateway_pid, tls_pid]);
    throughput_scenarios(&settings, &setup, &mut rows, &mut raw).await?;
    let peaks = sampler.finish().await;

    rows.push(
        Row::new("resident memory", "RSS idle", "MB")
            .values(Some(mb(idle_backend)), Some(mb(idle_gateway)))
            .target("< 30 MB", Some(mb(idle_gateway) < 30.0))
            .note("direct = the TLS static backend process"),
    );
    let load_gateway = peaks.get(&gateway_pid).copied().unwrap_or(0);
    let load_backend = peaks.get(&tls_pid).copied().unwrap_or(0);
    rows.push(
        Row::new("resident memory", "RSS peak under load", "MB")
            .values(Some(mb(load_backend)), Some(mb(load_gateway)))
            .note("peak over all throughput scenarios (sampled every 50 ms)"),
    );

    if settings.wants("watch streams held open") {
        watch_scenario(&settings, &setup, idle_gateway, &mut rows, &mut raw).await?;
    }
    if settings.wants("start to ready") {
        ready_scenario(&settings, &setup, &mut rows, &mut raw).await?;
    }
    drop(setup);

    let table = markdown_table(&rows);
    println!("\n{table}");
    println!("load generator: {LOAD_GENERATOR}");

    let machine = machine_facts();
    let mode = if short { "short" } else { "full" };
    let doc = json!({
        "mode": mode,
        "machine": machine,
        "load_generator": LOAD_GENERATOR,
        "gateway_binary": gateway_binary.display().to_string(),
        "settings": {
            "warmup_seconds": settings.warmup.as_secs_f64(),
            "duration_seconds": settings.duration.as_secs_f64(),
            "watch_streams": settings.watch_streams,
            "open_file_limit": nofile,
        },
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "raw": raw,
        "table_markdown": table,
    });
    let json_path = cli
        .json
        .clone()
        .unwrap_or_else(|| harness::workspace_root().join("target/bench/bench.json"));
    if let Some(parent) = json_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&json_path, serde_json::to_vec_pretty(&doc)?)?;
    println!("JSON written to {}", json_path.display());
    if cli.write_benchmarks_md {
        let path = harness::workspace_root().join("BENCHMARKS.md");
        write_benchmarks_md(&path, &table, &rows, &machine, mode)?;
        println!("{} updated", path.display());
    }
    Ok(())
}

async fn start_everything(gateway_binary: &Path) -> Result<Setup, BoxError> {
    let dir = tempfile::Builder::new().prefix("bench-").tempdir()?;
    let ca = TestCa::try_new("bench-ca")?;
    let ca_file = ca.write(dir.path(), "ca.crt")?;
    let ca_pem: Arc<str> = Arc::from(ca.cert_pem());
    let (backend_cert, backend_key) = ca
        .issue_server(&["api.bench.svc", "localhost", "127.0.0.1"])
        .write(dir.path(), "backend")?;
    let (gateway_cert, gateway_key) = ca
        .issue_server(&["localhost", "127.0.0.1"])
        .write(dir.path(), "gateway")?;
    let (proxy_cert, proxy_key) = ca
        .issue_client("aggregator", &[])
        .write(dir.path(), "proxy-client")?;
    let me = std::env::current_exe()?;
    let plain =
        harness::FixtureServer::start_binary("backend-plain", &me, &["serve-backend"]).await?;
    let backend_cert_s = backend_cert.display().to_string();
    let backend_key_s = backend_key.display().to_string();
    let tls_backend = harness::FixtureServer::start_binary(
        "backend-tls",
        &me,
        &[
            "serve-backend",
            "--tls-cert",
            &backend_cert_s,
            "--tls-key",
            &backend_key_s,
        ],
    )
    .await?;

    let apiservices = dir.path().join("apiservices");
    std::fs::create_dir_all(&apiservices)?;
    let ca_b64 = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(ca.cert_pem())
    };
    std::fs::write(
        apiservices.join("bench.yaml"),
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.{BENCH_GROUP}\n\
             spec:\n  group: {BENCH_GROUP}\n  version: v1\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  \
             caBundle: {ca_b64}\n  service:\n    namespace: bench\n    name: api\n    port: 443\n"
        ),
    )?;
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "services:\n- namespace: bench\n  name: api\n  port: 443\n  urls: [\"https://{}\"]\n",
            tls_backend.addr
        ),
    )?;
    let _ = ca_file;
    let p = |p: &Path| p.display().to_string();
    let mut args = vec![
        "--config".to_owned(),
        p(&config),
        "--tls-cert-file".to_owned(),
        p(&gateway_cert),
        "--tls-private-key-file".to_owned(),
        p(&gateway_key),
        "--proxy-client-cert-file".to_owned(),
        p(&proxy_cert),
        "--proxy-client-key-file".to_owned(),
        p(&proxy_key),
        "--apiservice-source".to_owned(),
        "file".to_owned(),
        "--apiservice-dir".to_owned(),
        p(&apiservices),
        "--apiservice-availability-interval".to_owned(),
        "1s".to_owned(),
    ];
    // Requests carry no credentials (anonymous); nothing to review. The remote route would ask
    // the core for a SubjectAccessReview, which the static core cannot answer.
    let help = Command::new(gateway_binary).arg("--help").output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--authorization-webhook", "--authentication-token-webhook"] {
        if help.contains(&format!("{flag}[=")) || help.contains(&format!("{flag} ")) {
            args.push(format!("{flag}=false"));
        }
    }
    // The per-request access log is silenced: at tens of thousands of requests per second its
    // lines (captured by this process) would measure the log pipeline, not the proxy.
    let options = GatewayOptions::new(plain.url())
        .args(args)
        .log_level("info,access=warn");
    let mut options = options;
    options.binary = Some(gateway_binary.to_path_buf());
    let gateway = Gateway::start(options.clone()).await?;
    let plain_pid = plain.process.id();
    let setup = Setup {
        _dir: dir,
        _plain: plain,
        tls_backend,
        gateway,
        gateway_options: options,
        ca_pem,
        plain_pid,
    };
    // Ready, discovery merged and the remote APIService available.
    let via = setup.via();
    let tls = client_tls(&setup.ca_pem, Proto::H1)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    for path in [
        "/readyz",
        &format!("/apis/{BENCH_GROUP}/v1/namespaces/default/things/x"),
        "/apis",
    ] {
        loop {
            let ok = async {
                let mut s = connect(&via, Some(&tls), Proto::H1).await?;
                let accept = (path == "/apis").then_some(AGGREGATED_V2);
                let resp = s.send(request(&via, Proto::H1, path, accept)).await?;
                let status = resp.status();
                let body = resp.into_body().collect().await?.to_bytes();
                let good = status == StatusCode::OK
                    && (path != "/apis"
                        || body
                            .windows(BENCH_GROUP.len())
                            .any(|w| w == BENCH_GROUP.as_bytes()));
                Ok::<_, BoxError>(good)
            }
            .await
            .unwrap_or(false);
            if ok {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the gateway did not answer {path} with 200 within 60s\n{}",
                    setup.gateway.process.logs()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(setup)
}

/// Runs `spec` against the backend directly and through the gateway.
async fn pair(
    setup: &Setup,
    name: &str,
    direct_path: &str,
    via_path: &str,
    spec: &LoadSpec,
    raw: &mut serde_json::Map<String, Value>,
) -> Result<(LoadResult, LoadResult), BoxError> {
    eprintln!("bench: {name}");
    let me = std::process::id();
    let (gateway, tls_backend, plain_backend) = (
        setup.gateway.process.id(),
        setup.tls_backend.process.id(),
        setup.plain_pid,
    );
    let meter = CpuMeter::start(&[tls_backend, me]);
    let mut direct = load(
        &setup.direct(),
        &LoadSpec {
            path: direct_path.to_owned(),
            ..spec.clone()
        },
    )
    .await?;
    let cpu = meter.per_request_us(direct.all_requests);
    direct.cpu_us = vec![("backend", cpu[0]), ("load generator", cpu[1])];
    // Via the gateway: the remote scenario's backend is the TLS one, the others' the plain core.
    let backend = if via_path.starts_with("/apis/") {
        tls_backend
    } else {
        plain_backend
    };
    let meter = CpuMeter::start(&[gateway, backend, me]);
    let mut via = load(
        &setup.via(),
        &LoadSpec {
            path: via_path.to_owned(),
            ..spec.clone()
        },
    )
    .await?;
    let cpu = meter.per_request_us(via.all_requests);
    via.cpu_us = vec![
        ("gateway", cpu[0]),
        ("backend", cpu[1]),
        ("load generator", cpu[2]),
    ];
    eprintln!(
        "bench:   direct {:.0} req/s p99 {:.3} ms errors {}; via {:.0} req/s p99 {:.3} ms errors {}",
        direct.rps(),
        direct.p99_ms,
        direct.errors,
        via.rps(),
        via.p99_ms,
        via.errors
    );
    raw.insert(
        name.to_owned(),
        json!({
            "protocol": format!("{:?}", spec.proto),
            "connections": spec.connections,
            "streams_per_connection": spec.streams_per_connection,
            "concurrency": spec.concurrency(),
            "direct_path": direct_path, "via_path": via_path,
            "direct": direct.to_json(), "via_gateway": via.to_json(),
        }),
    );
    Ok((direct, via))
}

/// Throughput, p50 and p99 rows for a small-request scenario.
fn latency_rows(
    rows: &mut Vec<Row>,
    scenario: &str,
    d: &LoadResult,
    v: &LoadResult,
    targets: bool,
) {
    let errors = d.errors + v.errors;
    let note = if errors > 0 {
        format!("{} direct / {} via errors", d.errors, v.errors)
    } else {
        String::new()
    };
    let ratio = v.rps() / d.rps();
    let mut row = Row::new(scenario, "throughput", "req/s")
        .values(Some(d.rps()), Some(v.rps()))
        .note(note);
    if targets {
        row = row.target("≥ 0.6× direct", Some(ratio >= 0.6));
    }
    rows.push(row);
    rows.push(Row::new(scenario, "p50 latency", "ms").values(Some(d.p50_ms), Some(v.p50_ms)));
    let added = v.p99_ms - d.p99_ms;
    let mut row = Row::new(scenario, "p99 latency", "ms")
        .values(Some(d.p99_ms), Some(v.p99_ms))
        .note(format!("added {added:.3} ms"));
    if targets {
        row = row.target("added < 1 ms", Some(added < 1.0));
    }
    rows.push(row);
    cpu_row(rows, scenario, d, v);
}

/// Server-side CPU per request: the backend's when direct, the gateway's when proxied. The note
/// has every process's share, which explains throughput ratios on a machine the generator shares.
fn cpu_row(rows: &mut Vec<Row>, scenario: &str, d: &LoadResult, v: &LoadResult) {
    let get = |r: &LoadResult, k: &str| r.cpu_us.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let parts = |r: &LoadResult| {
        r.cpu_us
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    rows.push(
        Row::new(
            scenario,
            "CPU per request: backend (direct) vs gateway (via)",
            "µs",
        )
        .values(get(d, "backend"), get(v, "gateway"))
        .note(format!("direct: {}; via: {}", parts(d), parts(v))),
    );
}

async fn throughput_scenarios(
    settings: &Settings,
    setup: &Setup,
    rows: &mut Vec<Row>,
    raw: &mut serde_json::Map<String, Value>,
) -> Result<(), BoxError> {
    let base = LoadSpec {
        proto: Proto::H1,
        connections: 32,
        streams_per_connection: 1,
        path: String::new(),
        accept: None,
        warmup: settings.warmup,
        duration: settings.duration,
    };
    let core_path = "/api/v1/namespaces/default/configmaps/bench";

    let name = "small GET, HTTP/1.1 keep-alive, 32 connections";
    if settings.wants(name) {
        let (d, v) = pair(setup, name, core_path, core_path, &base, raw).await?;
        latency_rows(rows, name, &d, &v, true);
    }

    let h2 = LoadSpec {
        proto: Proto::H2,
        connections: 4,
        streams_per_connection: 8,
        ..base.clone()
    };
    let name = "small GET, HTTP/2, 32 streams on 4 connections";
    if settings.wants(name) {
        let (d, v) = pair(setup, name, core_path, core_path, &h2, raw).await?;
        latency_rows(rows, name, &d, &v, true);
    }

    let remote_path = format!("/apis/{BENCH_GROUP}/v1/namespaces/default/things/bench");
    let name = "TLS termination + TLS to backend (remote APIService, h2 upstream), HTTP/1.1, 32 connections";
    if settings.wants(name) {
        let (d, v) = pair(setup, name, &remote_path, &remote_path, &base, raw).await?;
        latency_rows(rows, name, &d, &v, false);
    }

    let big = LoadSpec {
        connections: 8,
        ..base.clone()
    };
    let name = "1 MiB response, HTTP/1.1, 8 connections";
    if settings.wants(name) {
        let (d, v) = pair(setup, name, "/bench/1mib", "/bench/1mib", &big, raw).await?;
        rows.push(
            Row::new(name, "throughput", "MiB/s").values(Some(d.mib_per_s()), Some(v.mib_per_s())),
        );
        rows.push(Row::new(name, "p99 latency", "ms").values(Some(d.p99_ms), Some(v.p99_ms)));
        cpu_row(rows, name, &d, &v);
    }

    let apis = LoadSpec {
        accept: Some(AGGREGATED_V2),
        ..base.clone()
    };
    let name = "aggregated discovery /apis (gateway: from cache), HTTP/1.1, 32 connections";
    if !settings.wants(name) {
        return Ok(());
    }
    let (d, v) = pair(setup, name, "/apis", "/apis", &apis, raw).await?;
    let ratio = v.rps() / d.rps();
    let d_size = d.bytes as f64 / d.requests.max(1) as f64;
    let v_size = v.bytes as f64 / v.requests.max(1) as f64;
    rows.push(
        Row::new(name, "throughput", "req/s")
            .values(Some(d.rps()), Some(v.rps()))
            .target("≥ 0.8× core's own static document", Some(ratio >= 0.8))
            .note(format!(
                "document {:.1} KB direct (the core's), {:.1} KB via (merged)",
                d_size / 1e3,
                v_size / 1e3
            )),
    );
    rows.push(Row::new(name, "p99 latency", "ms").values(Some(d.p99_ms), Some(v.p99_ms)));
    cpu_row(rows, name, &d, &v);
    Ok(())
}

// ---- watches ------------------------------------------------------------------------------------

/// Opens `n` watch streams over HTTP/2 (500 streams per connection) and returns what keeps them
/// open, after each delivered its first event.
async fn open_watches(
    endpoint: &Endpoint,
    n: usize,
) -> Result<(Vec<Sender>, Vec<Incoming>, Duration), BoxError> {
    let tls = client_tls(endpoint.ca_pem.as_deref().ok_or("TLS endpoint")?, Proto::H2)?;
    let per_connection = 500;
    let mut senders = Vec::new();
    for _ in 0..n.div_ceil(per_connection) {
        senders.push(connect(endpoint, Some(&tls), Proto::H2).await?);
    }
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let mut sender = senders[i / per_connection]
            .clone_h2()
            .ok_or("HTTP/2 sender")?;
        let req = request(
            endpoint,
            Proto::H2,
            &format!("/api/v1/namespaces/ns{}/configmaps?watch=true", i % 100),
            None,
        );
        let permit = semaphore.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let opened = async {
                let resp = sender.send(req).await?;
                if resp.status() != StatusCode::OK {
                    return Err::<Incoming, BoxError>(
                        format!("watch got {}", resp.status()).into(),
                    );
                }
                let mut body = resp.into_body();
                match body.frame().await {
                    Some(Ok(_)) => Ok(body),
                    Some(Err(e)) => Err(e.into()),
                    None => Err("watch ended at once".into()),
                }
            };
            tokio::time::timeout(Duration::from_secs(60), opened)
                .await
                .map_err(|_| BoxError::from("watch did not open within 60s"))?
        }));
    }
    let mut bodies = Vec::with_capacity(n);
    for task in tasks {
        bodies.push(task.await??);
    }
    Ok((senders, bodies, started.elapsed()))
}

async fn watch_scenario(
    settings: &Settings,
    setup: &Setup,
    idle_gateway: u64,
    rows: &mut Vec<Row>,
    raw: &mut serde_json::Map<String, Value>,
) -> Result<(), BoxError> {
    let n = settings.watch_streams;
    let name = format!("{n} watch streams held open (HTTP/2, 500 per connection)");
    eprintln!("bench: {name}");
    let measure = |pid: u32, endpoint: Endpoint| async move {
        // Let connections from earlier scenarios close and memory settle first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = rss_bytes(pid).unwrap_or(0);
        let (senders, bodies, took) = open_watches(&endpoint, n).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = rss_bytes(pid).unwrap_or(0);
        drop(bodies);
        drop(senders);
        Ok::<_, BoxError>((before, after, took))
    };
    let (d_before, d_after, d_took) =
        measure(setup.tls_backend.process.id(), setup.direct()).await?;
    let (v_before, v_after, v_took) = measure(setup.gateway.process.id(), setup.via()).await?;
    let per = |before: u64, after: u64| after.saturating_sub(before) as f64 / n as f64 / 1024.0;
    let (d_per, v_per) = (per(d_before, d_after), per(v_before, v_after));
    rows.push(
        Row::new(&name, "RSS per stream", "KiB")
            .values(Some(d_per), Some(v_per))
            .note("direct = the static backend's own cost per stream; via = the gateway's (client h2 stream + one HTTP/1.1 connection to the core)"),
    );
    let projected = idle_gateway as f64 + v_per * 1024.0 * 10_000.0;
    let (total, target_note) = if n >= 10_000 {
        (v_after as f64, "measured")
    } else {
        (projected, "projected to 10 000 from idle + per-stream")
    };
    rows.push(
        Row::new(&name, "gateway RSS with the streams open", "MB")
            .values(Some(mb(d_after)), Some(mb(v_after)))
            .target("< 300 MB at 10 000 streams", Some(total < 300e6))
            .note(format!("{target_note}: {:.1} MB", total / 1e6)),
    );
    rows.push(
        Row::new(&name, "time to open all streams", "s")
            .values(Some(d_took.as_secs_f64()), Some(v_took.as_secs_f64())),
    );
    raw.insert(
        "watch".into(),
        json!({
            "streams": n,
            "direct": {"rss_before": d_before, "rss_after": d_after, "open_seconds": d_took.as_secs_f64()},
            "via_gateway": {"rss_before": v_before, "rss_after": v_after, "open_seconds": v_took.as_secs_f64()},
        }),
    );
    Ok(())
}

// ---- time to ready ------------------------------------------------------------------------------

async fn ready_scenario(
    settings: &Settings,
    setup: &Setup,
    rows: &mut Vec<Row>,
    raw: &mut serde_json::Map<String, Value>,
) -> Result<(), BoxError> {
    eprintln!("bench: time to ready");
    let runs = if settings.short { 2 } else { 7 };
    let options = &setup.gateway_options;
    let binary = options.binary.clone().ok_or("gateway binary")?;
    let mut serving = Vec::new();
    let mut ready = Vec::new();
    for _ in 0..runs {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let cert_dir = tempfile::Builder::new().prefix("bench-gw-").tempdir()?;
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
            "--cert-dir",
        ])
        .arg(cert_dir.path())
        .args(["--core-url", &options.core_url])
        .args([
            "--logging-format",
            "json",
            "--log-level",
            &options.log_level,
        ])
        .args(&options.args);
        let endpoint = Endpoint {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            ca_pem: Some(setup.ca_pem.clone()),
        };
        let tls = client_tls(&setup.ca_pem, Proto::H1)?;
        let spawned = Instant::now();
        let mut process = Process::spawn("gateway-ready", cmd)?;
        let deadline = spawned + Duration::from_secs(30);
        let mut took = None;
        while Instant::now() < deadline {
            let ok = async {
                let mut s = connect(&endpoint, Some(&tls), Proto::H1).await?;
                let resp = s
                    .send(request(&endpoint, Proto::H1, "/readyz", None))
                    .await?;
                Ok::<_, BoxError>(resp.status() == StatusCode::OK)
            }
            .await
            .unwrap_or(false);
            if ok {
                took = Some(spawned.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let serving_at = process
            .lines()
            .iter()
            .find(|l| harness::parse_serving_line(&l.text).is_some())
            .map(|l| l.at);
        process.kill();
        drop(cert_dir);
        let took =
            took.ok_or_else(|| format!("gateway not ready within 30s:\n{}", process.logs()))?;
        ready.push(took.as_secs_f64() * 1000.0);
        serving.extend(serving_at.map(|d| d.as_secs_f64() * 1000.0));
    }
    let ready_ms = median(&mut ready);
    let serving_ms = median(&mut serving);
    let name = "start to ready (core already answering)";
    rows.push(
        Row::new(name, "spawn → `serving` log line", "ms")
            .values(None, Some(serving_ms))
            .note(format!("median of {runs}")),
    );
    rows.push(
        Row::new(name, "spawn → /readyz 200 (polled every 5 ms)", "ms")
            .values(None, Some(ready_ms))
            .target("< 200 ms", Some(ready_ms < 200.0))
            .note(format!("median of {runs}; every run: {}", join_ms(&ready))),
    );
    raw.insert(
        "ready".into(),
        json!({"serving_ms": serving, "ready_ms": ready}),
    );
    Ok(())
}

fn join_ms(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// ---- route table and discovery rebuilds ---------------------------------------------------------

fn registered(i: usize, backends: usize) -> RegisteredAPIService {
    let group = format!("g{i}.bench.example.com");
    RegisteredAPIService {
        name: format!("v1.{group}"),
        group,
        version: "v1".into(),
        group_priority_minimum: 1000,
        version_priority: 15,
        backend: Backend::Remote(RemoteBackendSpec {
            service: ServiceRef {
                namespace: "bench".into(),
                name: format!("backend{}", i % backends),
                port: 443,
            },
            ca_bundle: None,
            insecure_skip_tls_verify: true,
        }),
    }
}

fn time_median(repeats: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    median(&mut samples)
}

fn rebuild_benchmarks(
    settings: &Settings,
    rows: &mut Vec<Row>,
    raw: &mut serde_json::Map<String, Value>,
) {
    let backends = 50;
    let sizes = [10usize, 500, 10_000];
    let core: CoreDiscovery = CoreDiscovery {
        api: serde_json::from_value(core_api_doc()).expect("valid discovery document"),
        apis: serde_json::from_value(core_apis_doc()).expect("valid discovery document"),
    };
    let mut out = serde_json::Map::new();
    for &n in &sizes {
        let services: Vec<Arc<RegisteredAPIService>> =
            (0..n).map(|i| Arc::new(registered(i, backends))).collect();

        // Route table: what the routing controller does on every APIService change.
        let build = || {
            let mut builder = RouteTable::<usize>::builder();
            for (i, s) in services.iter().enumerate() {
                builder.insert(s.clone(), i, Availability::Available);
            }
            builder.build().0
        };
        let route_ms = time_median(settings.repeats, || {
            std::hint::black_box(build());
        });
        let table = build();
        let paths: Vec<String> = (0..1024)
            .map(|i| {
                format!(
                    "/apis/g{}.bench.example.com/v1/namespaces/default/things/x",
                    (i * 7919) % n
                )
            })
            .collect();
        let lookups = if settings.short { 200_000 } else { 5_000_000 };
        let lookup_ns = {
            let mut samples: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let mut hits = 0usize;
                    for i in 0..lookups {
                        if let Lookup::GroupVersion(_) =
                            table.lookup(std::hint::black_box(&paths[i & 1023]))
                        {
                            hits += 1;
                        }
                    }
                    assert_eq!(hits, lookups, "every lookup hits");
                    t.elapsed().as_nanos() as f64 / lookups as f64
                })
                .collect();
            median(&mut samples)
        };

        // Discovery: each backend's document lists its APIServices' group-versions; the rebuild
        // reads every APIService's entry from its backend's document and merges.
        let mut backend_docs: Vec<Vec<Value>> = vec![Vec::new(); backends];
        for (i, s) in services.iter().enumerate() {
            let resources = (0..5)
                .map(|r| {
                    resource(
                        &s.group,
                        "v1",
                        &format!("things{r}"),
                        &format!("Thing{r}"),
                        true,
                    )
                })
                .collect();
            backend_docs[i % backends].push(group_entry(&s.group, "v1", resources));
        }
        let backend_docs: Vec<APIGroupDiscoveryList> = backend_docs
            .into_iter()
            .map(|items| serde_json::from_value(discovery_list(items)).expect("valid document"))
            .collect();
        let rebuild = || {
            let remotes: Vec<RemoteDiscovery> = services
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    RemoteDiscovery::from_backend_document(
                        &backend_docs[i % backends],
                        &s.group,
                        &s.version,
                    )
                })
                .collect();
            let inputs: Vec<APIServiceDiscovery<'_>> = services
                .iter()
                .zip(&remotes)
                .map(|(s, r)| APIServiceDiscovery::new(s, Some(r)))
                .collect();
            merge(&core, &inputs).expect("merge")
        };
        let merged = rebuild();
        let discovery_ms = time_median(
            settings.repeats.min(if n >= 10_000 { 5 } else { 15 }),
            || {
                std::hint::black_box(rebuild());
            },
        );
        out.insert(
            n.to_string(),
            json!({
                "route_table_build_ms": route_ms, "lookup_ns": lookup_ns,
                "discovery_rebuild_ms": discovery_ms, "apis_v2_bytes": merged.apis.v2.len(),
            }),
        );
    }
    let get = |n: usize, key: &str| out[&n.to_string()][key].as_f64().unwrap_or(f64::NAN);
    for &n in &sizes {
        let ms = get(n, "route_table_build_ms");
        let mut row = Row::new(
            "route-table rebuild (in process)",
            &format!("{n} APIServices"),
            "ms",
        )
        .values(None, Some(ms))
        .note(format!("median of {}", settings.repeats));
        if n == 10_000 {
            row = row.target("< 20 ms", Some(ms < 20.0));
        }
        rows.push(row);
    }
    let small = get(10, "lookup_ns");
    let large = get(10_000, "lookup_ns");
    rows.push(
        Row::new(
            "route lookup (in process)",
            "ns per lookup, 10 vs 10 000 APIServices",
            "ns",
        )
        .values(Some(small), Some(large))
        .target(
            "independent of size (ratio < 2×)",
            Some(large / small < 2.0),
        )
        .note("direct column = 10-entry table, via column = 10 000-entry table"),
    );
    for &n in &sizes {
        let ms = get(n, "discovery_rebuild_ms");
        let bytes = out[&n.to_string()]["apis_v2_bytes"].as_u64().unwrap_or(0);
        let mut row = Row::new(
            "discovery rebuild (in process, 50 backends)",
            &format!("{n} APIServices"),
            "ms",
        )
        .values(None, Some(ms))
        .note(format!("merged /apis {:.0} KB", bytes as f64 / 1e3));
        if n == 500 {
            row = row.target("< 50 ms", Some(ms < 50.0));
        }
        rows.push(row);
    }
    raw.insert("rebuilds".into(), Value::Object(out));
}

// ---- machine facts and BENCHMARKS.md ------------------------------------------------------------

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine_facts() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": model,
        "memory_gib": round(mem_kb as f64 / 1024.0 / 1024.0, 1),
        "kernel": command_line("uname", &["-r"]),
        "rustc": command_line("rustc", &["--version"]),
        "date": command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        // Other work on the machine shows here (the bench itself adds about 2-3 while running).
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    })
}

const NOTES_MARKER: &str = "<!-- Notes below this line are written by hand and kept when the bench rewrites this file. -->";

fn write_benchmarks_md(
    path: &Path,
    table: &str,
    rows: &[Row],
    machine: &Value,
    mode: &str,
) -> Result<(), BoxError> {
    let kept = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.split_once(NOTES_MARKER)
                .map(|(_, notes)| notes.to_owned())
        })
        .unwrap_or_else(|| "\n".to_owned());
    let missed: Vec<String> = rows
        .iter()
        .filter(|r| r.met == Some(false))
        .map(|r| {
            format!(
                "- {} — {}: {} via the gateway ({} direct{}), target {}.",
                r.scenario,
                r.metric,
                fmt_value(r.via, r.unit),
                fmt_value(r.direct, r.unit),
                r.ratio()
                    .map_or(String::new(), |x| format!(", ratio {x:.2}×")),
                r.target
            )
        })
        .collect();
    let s = |k: &str| machine[k].as_str().unwrap_or("?").to_owned();
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(
        "What the gateway costs compared with talking to the backend directly, measured in the same \
         run by `tests/src/bin/bench.rs`:\n\n    cargo run --release -p e2e --bin bench -- --write-benchmarks-md\n\n\
         (`--short` for the CI smoke run, `--json FILE` for the raw numbers). It starts a static \
         hyper backend (plain HTTP as the core, TLS as a remote APIService and as the direct \
         target), the release gateway in front of it, and the load generator, all on loopback. \
         Each proxied figure is measured against the backend directly and through the gateway with \
         the same client, TLS and concurrency; the ratio is via ÷ direct. Absolute numbers depend \
         on the machine; the ratios are the point.\n\n",
    );
    out.push_str(&format!(
        "Latest {mode} run: {} — {} × {} (nproc {}), {} GiB RAM, Linux {}, {}; load average \
         at the end of the run {}.\n\n",
        s("date"),
        machine["nproc"],
        s("cpu"),
        machine["nproc"],
        machine["memory_gib"],
        s("kernel"),
        s("rustc"),
        s("loadavg_at_end"),
    ));
    out.push_str(&format!("Load generator: {LOAD_GENERATOR}. The generator, the gateway and the backend share the machine's CPUs, in the direct run as well.\n\n"));
    out.push_str(table);
    out.push_str("\n## Missed targets (generated)\n\n");
    if missed.is_empty() {
        out.push_str("None.\n");
    } else {
        out.push_str(&missed.join("\n"));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(NOTES_MARKER);
    out.push_str(&kept);
    std::fs::write(path, out)?;
    Ok(())
}
