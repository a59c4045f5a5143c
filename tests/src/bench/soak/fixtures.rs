//! The soak on the fixtures: two aggregated groups (one backend HTTP/2, one HTTP/1.1-only) and
//! the fixture core, while, in turn every few seconds, the HTTP/1.1 backend is killed and started
//! again on its port, the HTTP/2 one frozen and thawed, and a third APIService added and removed
//! on the core.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

use super::{Probe, SoakReport, Tally, AGGREGATED};
use crate::bench::BoxError;
use crate::harness::{self, HttpClient};
use crate::scenario::{core_client, create_on_core, Pki, Scenario};

const ALPHA: &str = "alpha.example.com";
const BETA: &str = "beta.example.com";
const GAMMA: &str = "gamma.example.com";
/// The time between faults.
const FAULT_PERIOD: Duration = Duration::from_secs(3);

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
    let start = super::Usage::of(pid, &clients[0], &base).await;
    let since = s.gateway.process.spawned_at().elapsed();

    let shared = (
        Arc::new(Mutex::new(Tally::default())),
        Arc::new(AtomicBool::new(false)),
        Instant::now(),
    );
    let probes = vec![
        Probe::list(flunders(ALPHA), "FlunderList", format!("{ALPHA}/v1")),
        Probe::list(flunders(BETA), "FlunderList", format!("{BETA}/v1")),
        Probe::any("/api/v1/namespaces/default/configmaps", "application/json"),
        Probe::any("/apis", AGGREGATED),
    ];
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let (client, base, probes) = (client.clone(), base.clone(), probes.clone());
        tasks.push(tokio::spawn(super::traffic(
            client,
            base,
            probes,
            i,
            shared.clone(),
        )));
    }
    tasks.push(tokio::spawn(super::mutations(
        clients[1].clone(),
        base.clone(),
        "default",
        shared.clone(),
    )));
    let flunder_watches = [
        (ALPHA, "alpha's flunders (HTTP/2)"),
        (BETA, "beta's flunders (HTTP/1.1)"),
    ];
    for (group, name) in flunder_watches {
        let url = format!("{base}{}?watch=1", flunders(group));
        let watch = super::watches(clients[0].clone(), name, url, false, shared.clone());
        tasks.push(tokio::spawn(watch));
    }
    let url = format!("{base}/api/v1/namespaces/default/configmaps?watch=1");
    let watch = super::watches(
        clients[2].clone(),
        "the core's ConfigMaps",
        url,
        true,
        shared.clone(),
    );
    tasks.push(tokio::spawn(watch));

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
                super::freeze(s.backend("alpha").process.id(), Duration::from_secs(2)).await;
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
    shared.1.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(super::quiet_after(length)).await;
    let end = super::Usage::of(pid, &clients[0], &base).await;
    let warnings = super::warnings(&s.gateway.process.lines(), since);
    Ok(SoakReport::new(
        &shared,
        seconds,
        faults,
        (start, end),
        warnings,
    ))
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
