//! The soak in front of the real control plane of the real-control-plane suite (etcd,
//! kube-apiserver, sample-apiserver; `KUBEBUILDER_ASSETS` and `SAMPLE_APISERVER`), where the
//! faults are those a cluster has: in turn every few seconds, sample-apiserver killed and started
//! again, sample-apiserver frozen, a second wardle APIService added and removed, kube-apiserver
//! itself killed and started again, and the gateway's proxy client certificate and serving
//! certificate rotated on disk. The caller is an ordinary user (a client certificate, RBAC on
//! flunders and ConfigMaps), so every request is authenticated and authorized as a user's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Probe, SoakReport, Tally, AGGREGATED};
use crate::bench::memory::rss_bytes;
use crate::bench::BoxError;
use crate::certs::CertifiedPair;
use crate::harness::{self, Gateway, HttpClient, Process};
use crate::real::pki::GATEWAY_PROXY_CN;
use crate::real::sample_apiserver::{WARDLE_APISERVICE, WARDLE_GROUP, WARDLE_VERSION};
use crate::real::{ControlPlane, RealBinaries, SampleApiserver};

/// The time between faults.
const FAULT_PERIOD: Duration = Duration::from_secs(5);
/// How often the soak says how it goes.
const PROGRESS_PERIOD: Duration = Duration::from_secs(300);
/// How long a rotated certificate may take to be in use (the reload interval is 2 s).
const RELOAD_LIMIT: Duration = Duration::from_secs(10);
const SOAK_USER: &str = "soak";

const SOAK_RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: soak
rules:
- apiGroups: ["wardle.example.com"]
  resources: ["flunders"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "delete"]
- nonResourceURLs: ["/api", "/api/*", "/apis", "/apis/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: soak
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: soak
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: soak
"#;

/// Runs the soak for `length`; an error when the real binaries are not given.
pub async fn run(length: Duration) -> Result<SoakReport, BoxError> {
    let binaries = RealBinaries::from_env()?;
    eprintln!("bench: starting etcd, kube-apiserver and sample-apiserver");
    let mut plane = ControlPlane::start(&binaries).await?;
    let mut sample = SampleApiserver::start(&plane, &binaries).await?;
    let admin = plane.admin();
    admin.apply_yaml(SOAK_RBAC).await;
    admin.apply_yaml(&sample.apiservice_yaml(&plane)).await;
    admin
        .apply_yaml(&format!(
            "apiVersion: {WARDLE_GROUP}/{WARDLE_VERSION}\nkind: Flunder\nmetadata:\n  \
             name: soak\n  namespace: default\nspec: {{}}\n"
        ))
        .await;

    let serving = plane.pki.dir().join("gateway-serving");
    let serving_files = (serving.with_extension("crt"), serving.with_extension("key"));
    write_pair(&serving_pair(&plane), &serving_files)?;
    let path = |p: &Path| p.display().to_string();
    // No access log: an hour of it would be millions of lines kept by this process.
    let options = plane.gateway_options().log_level("info,access=off");
    let gateway = Gateway::start(options.args([
        "--tls-cert-file".to_owned(),
        path(&serving_files.0),
        "--tls-private-key-file".to_owned(),
        path(&serving_files.1),
        "--cert-reload-interval=2s".to_owned(),
        "--apiservice-availability-interval=5s".to_owned(),
    ]))
    .await?;

    let ca = plane.pki.cluster_ca.cert_pem().to_owned();
    let user = plane.pki.cluster_ca.issue_client(SOAK_USER, &[]);
    let clients: Vec<HttpClient> = (0..4)
        .map(|_| harness::http2_client(&ca, Some(&user)))
        .collect::<Result<_, _>>()?;
    let operator = harness::http1_client(&ca, Some(&plane.pki.admin))?;
    let base = gateway.url();
    let flunders = format!("/apis/{WARDLE_GROUP}/{WARDLE_VERSION}/namespaces/default/flunders");
    let ready = harness::wait_until(Duration::from_secs(60), || async {
        harness::get(&clients[0], &format!("{base}{flunders}"))
            .await
            .is_ok_and(|r| r.0 == http::StatusCode::OK)
    })
    .await;
    if !ready {
        return Err(format!(
            "flunders never served through the gateway:\n{}",
            gateway.process.logs()
        )
        .into());
    }
    let pid = gateway.process.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = super::Usage::of(pid, &operator, &base).await;
    let since = gateway.process.spawned_at().elapsed();

    let shared = (
        Arc::new(Mutex::new(Tally::default())),
        Arc::new(AtomicBool::new(false)),
        Instant::now(),
    );
    let probes = vec![
        Probe::list(
            flunders.clone(),
            "FlunderList",
            format!("{WARDLE_GROUP}/{WARDLE_VERSION}"),
        ),
        Probe::list(
            "/api/v1/namespaces/default/configmaps",
            "ConfigMapList",
            "v1",
        ),
        Probe::any("/apis", AGGREGATED),
        Probe::any(format!("{flunders}/soak"), "application/json"),
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
    let url = format!("{base}{flunders}?watch=1");
    let watch = super::watches(clients[0].clone(), "flunders", url, false, shared.clone());
    tasks.push(tokio::spawn(watch));
    let url = format!("{base}/api/v1/namespaces/default/configmaps?watch=1");
    let watch = super::watches(clients[2].clone(), "ConfigMaps", url, true, shared.clone());
    tasks.push(tokio::spawn(watch));

    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut core_down = Duration::ZERO;
    let mut turn = 0usize;
    let mut progress = Instant::now();
    while started.elapsed() < length {
        if progress.elapsed() >= PROGRESS_PERIOD {
            progress = Instant::now();
            let (requests, lost, misrouted) = {
                let t = shared.0.lock().unwrap();
                (t.requests, t.lost, t.misrouted)
            };
            let tasks = super::runtime_tasks(&operator, &base).await;
            eprintln!(
                "bench: {:.0} s: {requests} requests, {lost} lost, {misrouted} misrouted; gateway \
                 RSS {:.1} MB, {} fds, {tasks:?} tasks",
                started.elapsed().as_secs_f64(),
                rss_bytes(pid).unwrap_or(0) as f64 / 1e6,
                super::open_fds(pid),
            );
        }
        tokio::time::sleep(FAULT_PERIOD).await;
        let fault = match turn % 6 {
            0 => {
                sample.restart(&plane).await?;
                "sample-apiserver killed and started again"
            }
            1 => {
                super::freeze(sample.process.id(), Duration::from_secs(2)).await;
                "sample-apiserver frozen for 2 s"
            }
            2 => {
                add_and_remove(&plane, &sample).await;
                "APIService v1beta1.wardle.example.com added and removed"
            }
            3 => {
                core_down += plane.restart_kube_apiserver().await?;
                "kube-apiserver killed and started again"
            }
            4 => {
                let rotated = front_proxy_pair(&plane);
                rotate(
                    &gateway.process,
                    &rotated,
                    &plane.pki.gateway_proxy_client,
                    "proxy client certificate reloaded",
                )
                .await
            }
            _ => {
                rotate(
                    &gateway.process,
                    &serving_pair(&plane),
                    &serving_files,
                    "serving TLS material reloaded",
                )
                .await
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
    eprintln!("bench: kube-apiserver was down {core_down:?} in all");
    tokio::time::sleep(super::quiet_after(length)).await;
    let end = super::Usage::of(pid, &operator, &base).await;
    let warnings = super::warnings(&gateway.process.lines(), since);
    Ok(SoakReport::new(
        &shared,
        seconds,
        faults,
        (start, end),
        warnings,
    ))
}

/// A new serving certificate for the gateway on 127.0.0.1, from the cluster CA its clients trust.
fn serving_pair(plane: &ControlPlane) -> CertifiedPair {
    plane
        .pki
        .cluster_ca
        .issue_server(&["localhost", "127.0.0.1"])
}

/// A new proxy client certificate, with the CN kube-apiserver's allowed names list.
fn front_proxy_pair(plane: &ControlPlane) -> CertifiedPair {
    plane.pki.front_proxy_ca.issue_client(GATEWAY_PROXY_CN, &[])
}

/// Writes `pair` to `(cert, key)`, each file replaced whole (written beside it, then renamed),
/// as kubelet's and cert-manager's rotations do.
fn write_pair(
    pair: &CertifiedPair,
    (cert, key): &(std::path::PathBuf, std::path::PathBuf),
) -> std::io::Result<()> {
    for (file, pem) in [(key, &pair.key_pem), (cert, &pair.cert_pem)] {
        let next = file.with_extension("next");
        std::fs::write(&next, pem)?;
        std::fs::rename(&next, file)?;
    }
    Ok(())
}

/// Rotates the certificate in `files` to `pair` and waits for the gateway's `reloaded` line;
/// the fault's name says whether it came within [`RELOAD_LIMIT`].
async fn rotate(
    gateway: &Process,
    pair: &CertifiedPair,
    files: &(std::path::PathBuf, std::path::PathBuf),
    reloaded: &str,
) -> &'static str {
    let before = count_lines(gateway, reloaded);
    let which = if reloaded.starts_with("proxy") {
        "proxy client"
    } else {
        "serving"
    };
    if let Err(e) = write_pair(pair, files) {
        eprintln!("bench: writing the {which} certificate: {e}");
    }
    let seen = harness::wait_until(RELOAD_LIMIT, || async {
        count_lines(gateway, reloaded) > before
    })
    .await;
    match (which, seen) {
        ("proxy client", true) => "proxy client certificate rotated (in use within 10 s)",
        ("proxy client", false) => "proxy client certificate rotated, NOT reloaded within 10 s",
        (_, true) => "serving certificate rotated (in use within 10 s)",
        (_, false) => "serving certificate rotated, NOT reloaded within 10 s",
    }
}

fn count_lines(process: &Process, message: &str) -> usize {
    process
        .lines()
        .iter()
        .filter(|l| l.text.contains(message))
        .count()
}

/// A second wardle APIService (v1beta1, on the same Service) created on kube-apiserver, then
/// deleted a second later.
async fn add_and_remove(plane: &ControlPlane, sample: &SampleApiserver) {
    let admin = plane.admin();
    let v1beta1 = sample.apiservice_yaml(plane).replace("v1alpha1", "v1beta1");
    admin.apply_yaml(&v1beta1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let name = WARDLE_APISERVICE.replace("v1alpha1", "v1beta1");
    admin.run(&["delete", "apiservice", &name]).await;
}
