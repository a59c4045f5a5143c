//! Overload: what hostile clients cost the gateway and everyone else. While 1 000 HTTP/1.1
//! clients hold requests for a 1 MiB response they never read, and one HTTP/2 connection that
//! announces a zero flow-control window holds as many such requests as it may open streams, the
//! scenario measures the gateway's RSS, the latency of its health probes (exempt from the
//! in-flight limits, as kube-apiserver's are) and the requests per second served to well-behaved
//! clients, against the same figures without the attackers. The attackers' requests are ordinary
//! ones: each holds an in-flight slot until the request timeout cuts its exchange.
//!
//! Then the memory rounds: three times, the configured number of watches is opened through the
//! gateway and closed; RSS afterwards should be back near idle (the allocator returns memory).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::load::{client_tls, connect, load, request, Endpoint, LoadResult, LoadSpec, Proto};
use super::memory::{mb, rss_bytes, RssSampler};
use super::report::{Results, Row};
use super::setup::Setup;
use super::watch::open_watches;
use super::{median, BoxError, Settings};

/// The scenario's name in the table.
pub const NAME: &str = "overload";

/// What the attackers hold open; dropping it closes their connections.
pub struct Attack {
    _slow_readers: Vec<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    _zero_window: Vec<h2::RecvStream>,
    /// Streams of the zero-window connection answered 200 (each holds its response unread).
    pub held_by_zero_window: usize,
}

/// Opens `slow` HTTP/1.1 connections that each ask for `path` (a large answer) and read
/// nothing, and one HTTP/2 connection with a zero window that opens as many such streams as the
/// gateway answers (up to its stream limit), as the endpoint's caller (anonymous without a
/// client certificate).
pub async fn attack(endpoint: &Endpoint, slow: usize, path: &str) -> Result<Attack, BoxError> {
    let ca = endpoint.ca_pem.as_deref().ok_or("TLS endpoint")?;
    let name = rustls::pki_types::ServerName::IpAddress(endpoint.addr.ip().into());
    // The zero-window connection first, so its streams hold slots rather than collect 429s.
    let h2 = client_tls(ca, Proto::H2)?;
    let tcp = tokio::net::TcpStream::connect(endpoint.addr).await?;
    let tls = tokio_rustls::TlsConnector::from(h2)
        .connect(name.clone(), tcp)
        .await?;
    let (mut sender, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tls)
        .await?;
    tokio::spawn(conn);
    let mut zero_window = Vec::new();
    // Until the gateway's stream limit stops us (its SETTINGS), or 1 000.
    for _ in 0..1000 {
        let ready = tokio::time::timeout(Duration::from_millis(500), sender.ready()).await;
        let Ok(Ok(ready)) = ready else { break };
        sender = ready;
        let req = http::Request::get(format!("https://{}{path}", endpoint.addr)).body(())?;
        let (response, _) = sender.send_request(req, true)?;
        // Not answered at once: the stream waits for a seat (or a 429); the attack holds what it
        // holds.
        match tokio::time::timeout(Duration::from_secs(2), response).await {
            Ok(Ok(resp)) if resp.status() == StatusCode::OK => zero_window.push(resp.into_body()),
            _ => break,
        }
    }
    let h1 = client_tls(ca, Proto::H1)?;
    // All at once: one after the other, the first would have been cut by the request timeout
    // before the last is in.
    let slow_readers = futures::future::try_join_all((0..slow).map(|_| {
        let (h1, name) = (h1.clone(), name.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(endpoint.addr).await?;
            let mut tls = tokio_rustls::TlsConnector::from(h1)
                .connect(name, tcp)
                .await?;
            tls.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", endpoint.addr).as_bytes(),
            )
            .await?;
            Ok::<_, BoxError>(tls)
        }
    }))
    .await?;

    Ok(Attack {
        held_by_zero_window: zero_window.len(),
        _slow_readers: slow_readers,
        _zero_window: zero_window,
    })
}

/// Latencies (ms, sorted) of `n` sequential `GET /healthz` on one keep-alive connection.
async fn probe_latencies(endpoint: &Endpoint, n: usize) -> Result<Vec<f64>, BoxError> {
    let tls = client_tls(endpoint.ca_pem.as_deref().ok_or("TLS endpoint")?, Proto::H1)?;
    let mut sender = connect(endpoint, Some(&tls), Proto::H1).await?;
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let resp = sender
            .send(request(endpoint, Proto::H1, "/healthz", None))
            .await?;
        let status = resp.status();
        http_body_util::BodyExt::collect(resp.into_body()).await?;
        if status != StatusCode::OK {
            return Err(format!("/healthz answered {status}").into());
        }
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(latencies)
}

fn p99(sorted: &[f64]) -> f64 {
    sorted
        .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Runs the scenario against the bench gateway; `idle_gateway` is its RSS before any load. A
/// failure names its step and carries the gateway's last log lines.
pub async fn run(
    settings: &Settings,
    setup: &Setup,
    idle_gateway: u64,
    results: &mut Results,
) -> Result<(), BoxError> {
    measure(settings, setup, idle_gateway, results)
        .await
        .map_err(|e| {
            let logs = setup.gateway.process.logs();
            let tail: Vec<&str> = logs.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "{NAME}: {e}\n--- last gateway log lines ---\n{}",
                tail.join("\n")
            )
            .into()
        })
}

async fn measure(
    settings: &Settings,
    setup: &Setup,
    idle_gateway: u64,
    results: &mut Results,
) -> Result<(), BoxError> {
    let Results { rows, raw, .. } = results;
    let slow = if settings.short { 100 } else { 1000 };
    let probes = if settings.short { 50 } else { 500 };
    let name = format!("{NAME}: {slow} slow HTTP/1.1 readers + 1 zero-window HTTP/2 connection");
    eprintln!("bench: {name}");
    let gateway = setup.gateway.process.id();
    let via = setup.via();
    let well_behaved = LoadSpec {
        proto: Proto::H1,
        connections: 8,
        streams_per_connection: 1,
        path: "/api/v1/namespaces/default/configmaps/bench".to_owned(),
        accept: None,
        warmup: settings.warmup,
        duration: settings.duration,
    };

    tokio::time::sleep(Duration::from_millis(500)).await;
    let calm_probes = probe_latencies(&via, probes)
        .await
        .map_err(|e| format!("probes without attackers: {e}"))?;
    let calm = load(&via, &well_behaved)
        .await
        .map_err(|e| format!("load without attackers: {e}"))?;

    let sampler = RssSampler::start(vec![gateway]);
    let attack = attack(&via, slow, "/bench/1mib")
        .await
        .map_err(|e| format!("opening the attack: {e}"))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacked_probes = probe_latencies(&via, probes)
        .await
        .map_err(|e| format!("probes while attacked: {e}"))?;
    let attacked = load(&via, &well_behaved)
        .await
        .map_err(|e| format!("load while attacked: {e}"))?;
    let attacked_rss = rss_bytes(gateway).unwrap_or(0);
    let held_streams = attack.held_by_zero_window;
    drop(attack);
    let attack_peak = sampler.finish().await.get(&gateway).copied().unwrap_or(0);

    // The memory rounds; one in short mode, which only checks that the table is produced.
    let rounds = if settings.short { 1 } else { 3 };
    let mut after_rounds = Vec::new();
    for round in 1..=rounds {
        let (senders, bodies, _) = open_watches(&via, settings.watch_streams)
            .await
            .map_err(|e| format!("watch round {round}: {e}"))?;
        drop(bodies);
        drop(senders);
        // Longer than the gateway's trim interval (5 s): memory is handed back after peaks.
        tokio::time::sleep(Duration::from_secs(7)).await;
        after_rounds.push(rss_bytes(gateway).unwrap_or(0));
    }
    let settled = *after_rounds.last().unwrap_or(&0);

    let served = |r: &LoadResult| r.rps();
    let refused = |r: &LoadResult| {
        let all = r.requests + r.errors;
        if all == 0 {
            0.0
        } else {
            r.errors as f64 / all as f64 * 100.0
        }
    };
    rows.push(
        Row::new(&name, "gateway RSS while attacked", "MB")
            .values(Some(mb(idle_gateway)), Some(mb(attack_peak)))
            .note(format!(
                "direct = idle; via = peak during the attack ({:.1} MB 1 s in); the zero-window connection held {held_streams} streams",
                mb(attacked_rss)
            )),
    );
    let mut calm_sorted = calm_probes.clone();
    let mut attacked_sorted = attacked_probes.clone();
    let (calm_p50, attacked_p50) = (median(&mut calm_sorted), median(&mut attacked_sorted));
    rows.push(
        Row::new(&name, "GET /healthz p50 latency", "ms")
            .values(Some(calm_p50), Some(attacked_p50))
            .note("direct = without the attackers, via = with them; one keep-alive connection"),
    );
    rows.push(
        Row::new(&name, "GET /healthz p99 latency", "ms")
            .values(Some(p99(&calm_probes)), Some(p99(&attacked_probes)))
            .target(
                "< 100 ms while attacked",
                Some(p99(&attacked_probes) < 100.0),
            ),
    );
    rows.push(
        Row::new(&name, "well-behaved small GETs served", "req/s")
            .values(Some(served(&calm)), Some(served(&attacked)))
            .note(format!(
                "direct = without the attackers, via = with them (8 HTTP/1.1 connections); refused with 429 while attacked: {:.0} %",
                refused(&attacked)
            )),
    );
    let growth = settled.saturating_sub(idle_gateway);
    rows.push(
        Row::new(
            &name,
            &format!("gateway RSS after {rounds} rounds of watches"),
            "MB",
        )
        .values(Some(mb(idle_gateway)), Some(mb(settled)))
        .target("within 64 MiB of idle", Some(growth < 64 << 20))
        .note(format!(
            "direct = idle; {} watches opened and closed per round; after each round: {}",
            settings.watch_streams,
            after_rounds
                .iter()
                .map(|b| format!("{:.1} MB", mb(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    );
    raw.insert(
        "overload".into(),
        json!({
            "slow_readers": slow,
            "zero_window_streams": held_streams,
            "rss_idle": idle_gateway,
            "rss_attack_peak": attack_peak,
            "rss_after_rounds": after_rounds,
            "healthz_ms": {"calm": calm_probes, "attacked": attacked_probes},
            "well_behaved": {"calm": calm.to_json(), "attacked": attacked.to_json()},
        }),
    );
    Ok(())
}
