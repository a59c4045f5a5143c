//! The serving rounds' figures: each side's rounds added up, and the table rows comparing the
//! gateway's cached merge with the static file of the same bytes.

use serde_json::{json, Value};

use super::super::load::LoadResult;
use super::super::median;
use super::super::memory::mb;
use super::super::report::Row;
use super::NAME;

/// One side's rounds added up.
#[derive(Default)]
pub(super) struct Side {
    requests: u64,
    all_requests: u64,
    bytes: u64,
    errors: u64,
    seconds: f64,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    /// Server CPU seconds over all requests including warm-ups.
    cpu_seconds: f64,
}

impl Side {
    pub(super) fn add(&mut self, r: &LoadResult, cpu_us: f64) {
        self.requests += r.requests;
        self.all_requests += r.all_requests;
        self.bytes += r.bytes;
        self.errors += r.errors;
        self.seconds += r.seconds;
        self.p50_ms.push(r.p50_ms);
        self.p99_ms.push(r.p99_ms);
        self.cpu_seconds += cpu_us * r.all_requests as f64 / 1e6;
    }
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds.max(f64::EPSILON)
    }
    fn p50(&self) -> f64 {
        median(&mut self.p50_ms.clone())
    }
    fn p99(&self) -> f64 {
        median(&mut self.p99_ms.clone())
    }
    fn cpu_us(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.all_requests.max(1) as f64
    }
    fn to_json(&self) -> Value {
        json!({
            "requests": self.requests, "errors": self.errors, "seconds": self.seconds,
            "requests_per_second": self.rps(), "bytes": self.bytes,
            "p50_ms_by_round": self.p50_ms, "p99_ms_by_round": self.p99_ms,
            "server_cpu_us_per_request": self.cpu_us(),
        })
    }
}

/// One representation served both ways.
pub(super) struct Serving {
    pub(super) form: &'static str,
    pub(super) bytes: usize,
    pub(super) direct: Side,
    pub(super) via: Side,
}

impl Serving {
    pub(super) fn to_json(&self) -> Value {
        json!({"form": self.form, "document_bytes": self.bytes,
               "static_file": self.direct.to_json(), "gateway": self.via.to_json()})
    }
}

pub(super) fn serving_rows(rows: &mut Vec<Row>, s: &Serving, connections: usize) {
    let scenario = format!(
        "{NAME}: serving the cached merge, {} ({:.1} MB), HTTP/1.1, {connections} connections (direct = the same bytes as a static file)",
        s.form,
        mb(s.bytes as u64)
    );
    let (d, v) = (&s.direct, &s.via);
    let errors = if d.errors + v.errors > 0 {
        format!("; {} static / {} gateway errors", d.errors, v.errors)
    } else {
        String::new()
    };
    let ratio = v.rps() / d.rps().max(f64::EPSILON);
    rows.push(
        Row::new(&scenario, "throughput", "req/s")
            .values(Some(d.rps()), Some(v.rps()))
            .target("≥ 0.9× static file", Some(ratio >= 0.9))
            .note(format!(
                "{} interleaved rounds of {:.0} s per side{errors}",
                d.p50_ms.len(),
                d.seconds / d.p50_ms.len().max(1) as f64
            )),
    );
    rows.push(Row::new(&scenario, "p50 latency", "ms").values(Some(d.p50()), Some(v.p50())));
    rows.push(
        Row::new(&scenario, "p99 latency", "ms")
            .values(Some(d.p99()), Some(v.p99()))
            .note("median of the rounds' p99"),
    );
    let cpu = v.cpu_us() / d.cpu_us().max(f64::EPSILON);
    rows.push(
        Row::new(
            &scenario,
            "CPU per request: static backend (direct) vs gateway (via)",
            "µs",
        )
        .values(Some(d.cpu_us()), Some(v.cpu_us()))
        .target("≤ 1.1× static file", Some(cpu <= 1.1)),
    );
}
