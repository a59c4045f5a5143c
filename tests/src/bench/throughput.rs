//! Throughput scenarios: small GETs over HTTP/1.1 and HTTP/2, TLS to a remote APIService, a
//! 1 MiB response and cached aggregated discovery, each measured directly and through the gateway
//! with the same load, with throughput, latency and CPU-per-request rows.

use serde_json::{json, Value};

use super::load::{load, LoadResult, LoadSpec, Proto};
use super::memory::CpuMeter;
use super::report::{Results, Row};
use super::setup::Setup;
use super::{BoxError, Settings, AGGREGATED_V2, BENCH_GROUP};

/// Runs `spec` against the backend directly and through the gateway, and records both in `raw`
/// under `name`.
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
    // The remote scenario's caller has a client certificate, as kubectl's users do: anonymous
    // callers' requests go to remote backends over HTTP/1.1, not the HTTP/2 it measures.
    let remote = via_path.starts_with("/apis/");
    let (backend, endpoint) = if remote {
        (tls_backend, setup.via_as_user())
    } else {
        (plain_backend, setup.via())
    };
    let meter = CpuMeter::start(&[gateway, backend, me]);
    let mut via = load(
        &endpoint,
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

/// Every throughput scenario the settings want, in the table's order.
pub async fn run(
    settings: &Settings,
    setup: &Setup,
    results: &mut Results,
) -> Result<(), BoxError> {
    let Results { rows, raw, .. } = results;
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
    let name = "TLS termination + TLS to backend (remote APIService, h2 upstream, client-certificate user), HTTP/1.1, 32 connections";
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
