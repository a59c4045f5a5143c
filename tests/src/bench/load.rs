//! The load generator, in the bench process: hyper 1 client connections on tokio. HTTP/1.1 keeps
//! one request in flight per keep-alive connection; HTTP/2 runs several concurrent streams per
//! connection. A fixed warm-up, then a fixed measuring window; every latency is kept and sorted,
//! so percentiles are exact for the sample.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::{round, BoxError, Io, ONE_MIB};
use crate::harness;

/// How the table and BENCHMARKS.md describe this generator.
pub const LOAD_GENERATOR: &str =
    "bench's own load generator (hyper 1 client connections on tokio, in \
    the bench process; HTTP/1.1: one request in flight per keep-alive connection; HTTP/2: \
    several concurrent streams per connection; every latency kept, percentiles from the sorted \
    sample)";

/// Which HTTP version the generator speaks to the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

// === impl Endpoint ===

/// Where the generator sends requests: an address and, for TLS, the CA to trust.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub ca_pem: Option<Arc<str>>,
    /// A client certificate to present: an authenticated caller instead of an anonymous one.
    pub client_cert: Option<crate::certs::CertifiedPair>,
}

impl Endpoint {
    fn authority(&self) -> String {
        self.addr.to_string()
    }
}

// === impl Sender ===

/// One client connection's request handle; an HTTP/2 one is cloned per concurrent stream.
pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Sender {
    pub async fn send(
        &mut self,
        req: Request<Empty<Bytes>>,
    ) -> Result<Response<Incoming>, BoxError> {
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

    pub fn clone_h2(&self) -> Option<Sender> {
        match self {
            Sender::H2(s) => Some(Sender::H2(s.clone())),
            Sender::H1(_) => None,
        }
    }
}

/// The client TLS config of every measured connection: trusts the bench CA, offers one ALPN.
pub fn client_tls(ca_pem: &str, proto: Proto) -> Result<Arc<rustls::ClientConfig>, BoxError> {
    let alpn: &[&[u8]] = match proto {
        Proto::H1 => &[b"http/1.1"],
        Proto::H2 => &[b"h2"],
    };
    Ok(Arc::new(harness::tls_client_config(ca_pem, None, alpn)?))
}

/// Opens one connection (TCP, then TLS when `tls` is given) and completes the HTTP handshake.
pub async fn connect(
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

/// A GET for `path`, in the form each protocol expects.
pub fn request(
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

// === impl LoadSpec ===

/// One load run's shape.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub proto: Proto,
    pub connections: usize,
    /// Concurrent requests per connection (1 for HTTP/1.1).
    pub streams_per_connection: usize,
    pub path: String,
    pub accept: Option<&'static str>,
    pub warmup: Duration,
    pub duration: Duration,
}

impl LoadSpec {
    pub fn concurrency(&self) -> usize {
        self.connections * self.streams_per_connection
    }
}

// === impl LoadResult ===

/// What one load run measured.
#[derive(Clone, Debug, Default)]
pub struct LoadResult {
    pub requests: u64,
    /// Successful requests including the warm-up, to divide CPU time by.
    pub all_requests: u64,
    pub bytes: u64,
    pub errors: u64,
    /// How the errors ended: `"<status>"` for a non-2xx answer, `"transport"` for a broken or
    /// timed-out exchange; so a row with errors says what they were.
    pub error_kinds: std::collections::BTreeMap<String, u64>,
    /// The start of the first non-2xx body, to read what the server said.
    pub error_sample: Option<String>,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// CPU microseconds per request by process, filled in by `throughput::pair`.
    pub cpu_us: Vec<(&'static str, f64)>,
}

impl LoadResult {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / ONE_MIB as f64
    }
    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests, "bytes": self.bytes, "errors": self.errors,
            "error_kinds": self.error_kinds,
            "seconds": self.seconds, "requests_per_second": round(self.rps(), 1),
            "mib_per_second": round(self.mib_per_s(), 1),
            "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3),
            "p999_ms": round(self.p999_ms, 3), "max_ms": round(self.max_ms, 3),
            "cpu_us_per_request": self.cpu_us.iter().map(|(k, v)| (k.to_string(), json!(round(*v, 1)))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

// === the run ===

/// What one worker (one connection, or one HTTP/2 stream) counted.
#[derive(Default)]
struct WorkerStats {
    requests: u64,
    all_requests: u64,
    bytes: u64,
    errors: u64,
    error_kinds: std::collections::BTreeMap<String, u64>,
    error_sample: Option<String>,
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
            let status = resp.status();
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            let mut sample = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    bytes += data.len() as u64;
                    if !status.is_success() && sample.len() < 512 {
                        sample.extend_from_slice(&data[..data.len().min(512 - sample.len())]);
                    }
                }
            }
            Ok::<_, BoxError>((status, bytes, sample))
        };
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await;
        let done = Instant::now();
        let measured = started >= measure_from && done <= end;
        match outcome {
            Ok(Ok((status, bytes, _))) if status.is_success() => {
                stats.all_requests += 1;
                if measured {
                    stats.requests += 1;
                    stats.bytes += bytes;
                    let us = (done - started).as_micros().min(u32::MAX as u128) as u32;
                    stats.latencies_us.push(us);
                }
            }
            Ok(Ok((status, _, sample))) => {
                stats.errors += 1;
                if stats.error_sample.is_none() {
                    stats.error_sample = Some(String::from_utf8_lossy(&sample).into_owned());
                }
                *stats
                    .error_kinds
                    .entry(status.as_str().to_owned())
                    .or_default() += 1;
            }
            // A broken connection ends this worker; the error count shows it.
            Ok(Err(_)) | Err(_) => {
                stats.errors += 1;
                *stats.error_kinds.entry("transport".to_owned()).or_default() += 1;
                break;
            }
        }
    }
    stats
}

/// The `p`th percentile, in milliseconds, of latencies in microseconds (sorted).
pub(crate) fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs `spec` against `endpoint`: opens every connection, then warms up and measures in lockstep.
pub async fn load(endpoint: &Endpoint, spec: &LoadSpec) -> Result<LoadResult, BoxError> {
    let tls = match &endpoint.ca_pem {
        Some(ca) => {
            let alpn: &[&[u8]] = match spec.proto {
                Proto::H1 => &[b"http/1.1"],
                Proto::H2 => &[b"h2"],
            };
            Some(Arc::new(harness::tls_client_config(
                ca,
                endpoint.client_cert.as_ref(),
                alpn,
            )?))
        }
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
        total.error_sample = total.error_sample.or(stats.error_sample);
        for (kind, n) in stats.error_kinds {
            *total.error_kinds.entry(kind).or_default() += n;
        }
        total.latencies_us.extend(stats.latencies_us);
    }
    total.latencies_us.sort_unstable();
    let lat = &total.latencies_us;
    Ok(LoadResult {
        requests: total.requests,
        all_requests: total.all_requests,
        bytes: total.bytes,
        errors: total.errors,
        error_kinds: total.error_kinds,
        error_sample: total.error_sample,
        seconds: spec.duration.as_secs_f64(),
        p50_ms: percentile(lat, 50.0),
        p99_ms: percentile(lat, 99.0),
        p999_ms: percentile(lat, 99.9),
        max_ms: lat.last().map_or(0.0, |&us| us as f64 / 1000.0),
        cpu_us: Vec::new(),
    })
}
