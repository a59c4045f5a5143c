//! Watch streams held open: what each open watch costs the gateway in memory (its client-side
//! HTTP/2 stream plus one HTTP/1.1 connection to the core), against what it costs the backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;

use super::load::{client_tls, connect, request, Endpoint, Proto, Sender};
use super::memory::{mb, rss_bytes};
use super::report::{Results, Row};
use super::setup::Setup;
use super::{BoxError, Settings};

/// How many watches share one HTTP/2 connection: the gateway's default stream limit, which is
/// kube-apiserver's (100), so each connection is full.
pub const WATCHES_PER_CONNECTION: usize = 100;

/// Opens `n` watch streams over HTTP/2 ([`WATCHES_PER_CONNECTION`] per connection) and returns
/// what keeps them open, after each delivered its first event. Each connection is opened just
/// before its streams: a connection that made no request within the header read timeout is
/// closed by the gateway.
pub async fn open_watches(
    endpoint: &Endpoint,
    n: usize,
) -> Result<(Vec<Sender>, Vec<Incoming>, Duration), BoxError> {
    let tls = client_tls(endpoint.ca_pem.as_deref().ok_or("TLS endpoint")?, Proto::H2)?;
    let per_connection = WATCHES_PER_CONNECTION;
    let mut senders = Vec::new();
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        if i % per_connection == 0 {
            senders.push(connect(endpoint, Some(&tls), Proto::H2).await?);
        }
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

/// Holds `settings.watch_streams` watches open on the backend, then through the gateway, and
/// reports what each stream costs in RSS; `idle_gateway` is the gateway's RSS before any load.
pub async fn run(
    settings: &Settings,
    setup: &Setup,
    idle_gateway: u64,
    results: &mut Results,
) -> Result<(), BoxError> {
    let Results { rows, raw, .. } = results;
    let n = settings.watch_streams;
    let name =
        format!("{n} watch streams held open (HTTP/2, {WATCHES_PER_CONNECTION} per connection)");
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
