//! Start to ready: how long a fresh gateway takes, with the core already answering, from spawn to
//! its `serving` log line and to the first `/readyz` 200.
//!
//! Each run starts a gateway like the one under load (same options, through the harness) on a
//! port chosen beforehand, so `/readyz` can be polled from the moment the process exists rather
//! than from the moment it announces its address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;

use super::load::{client_tls, connect, request, Endpoint, Proto};
use super::report::{Results, Row};
use super::setup::Setup;
use super::{median, BoxError, Settings};
use crate::harness::{self, Gateway};

/// How long one gateway may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn run(
    settings: &Settings,
    setup: &Setup,
    results: &mut Results,
) -> Result<(), BoxError> {
    eprintln!("bench: time to ready");
    let runs = if settings.short { 2 } else { 7 };
    let mut serving = Vec::new();
    let mut ready = Vec::new();
    for _ in 0..runs {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let endpoint = Endpoint {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            ca_pem: Some(setup.ca_pem.clone()),
            client_cert: None,
        };
        let tls = client_tls(&setup.ca_pem, Proto::H1)?;
        let options = setup.gateway_options.clone().secure_port(port);
        // `start` spawns the process before its first await, so the poll starts right after the
        // spawn; both are measured from the process's spawn instant.
        let (gateway, ready_at) =
            tokio::join!(Gateway::start(options), poll_ready(&endpoint, &tls));
        let mut gateway = gateway?;
        let spawned = gateway.process.spawned_at();
        let serving_at = gateway
            .process
            .lines()
            .iter()
            .find(|l| harness::parse_serving_line(&l.text).is_some())
            .map(|l| l.at);
        gateway.process.kill();
        let took = ready_at
            .map(|at| at - spawned)
            .ok_or_else(|| format!("gateway not ready within 30s:\n{}", gateway.process.logs()))?;
        ready.push(took.as_secs_f64() * 1000.0);
        serving.extend(serving_at.map(|d| d.as_secs_f64() * 1000.0));
    }
    let ready_ms = median(&mut ready);
    let serving_ms = median(&mut serving);
    let name = "start to ready (core already answering)";
    results.rows.push(
        Row::new(name, "spawn → `serving` log line", "ms")
            .values(None, Some(serving_ms))
            .note(format!("median of {runs}")),
    );
    results.rows.push(
        Row::new(name, "spawn → /readyz 200 (polled every 5 ms)", "ms")
            .values(None, Some(ready_ms))
            .target("< 200 ms", Some(ready_ms < 200.0))
            .note(format!("median of {runs}; every run: {}", join_ms(&ready))),
    );
    results.raw.insert(
        "ready".into(),
        json!({"serving_ms": serving, "ready_ms": ready}),
    );
    Ok(())
}

/// Polls `/readyz` every 5 ms, a new connection each time, until it answers 200: when it did, or
/// `None` after [`READY_TIMEOUT`].
async fn poll_ready(endpoint: &Endpoint, tls: &Arc<rustls::ClientConfig>) -> Option<Instant> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        let ok = async {
            let mut s = connect(endpoint, Some(tls), Proto::H1).await?;
            let resp = s
                .send(request(endpoint, Proto::H1, "/readyz", None))
                .await?;
            Ok::<_, BoxError>(resp.status() == StatusCode::OK)
        }
        .await
        .unwrap_or(false);
        if ok {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn join_ms(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}
