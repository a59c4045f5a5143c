//! Pod start latency as a user sees it: from the create request to the Pod's `Running` phase,
//! read back through the cluster's API endpoint (kube-apiserver, or the gateway in front of it).
//!
//! Pods are started one after another (the scheduler, the kubelet and the runtime are not loaded
//! by each other's work), each a single `pause` container that needs no pull; the phase is polled
//! every 50 ms, so a figure is at most that much late.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;

use super::cluster::PAUSE_IMAGE;
use super::Cluster;
use crate::harness::{get, send};

/// How long one Pod may take to run.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts `count` Pods in a new namespace `namespace` one after another and returns each one's
/// create → Running time; the namespace is deleted afterwards (not waited for).
pub async fn latencies(
    cluster: &Cluster,
    namespace: &str,
    count: usize,
) -> Result<Vec<Duration>, String> {
    let client = cluster.admin_client();
    let base = &cluster.url;
    let post = |url: String, body: serde_json::Value| {
        let request = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        send(&client, request)
    };
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace}});
    let (status, _, body) = post(format!("{base}/api/v1/namespaces"), ns)
        .await
        .map_err(|e| e.to_string())?;
    if status != StatusCode::CREATED {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    // The namespace's default ServiceAccount comes from a controller; Pods wait for it.
    let account = format!("{base}/api/v1/namespaces/{namespace}/serviceaccounts/default");
    let deadline = Instant::now() + START_TIMEOUT;
    while !matches!(get(&client, &account).await, Ok((StatusCode::OK, _, _))) {
        if Instant::now() > deadline {
            return Err(format!("{namespace} got no default ServiceAccount"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("start-{i}")},
            "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
                "containers": [{"name": "pause", "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never"}]}});
        let pods = format!("{base}/api/v1/namespaces/{namespace}/pods");
        let started = Instant::now();
        let (status, _, body) = post(pods.clone(), pod).await.map_err(|e| e.to_string())?;
        if status != StatusCode::CREATED {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        let url = format!("{pods}/start-{i}");
        loop {
            if let Ok((StatusCode::OK, _, body)) = get(&client, &url).await {
                let pod: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if pod["status"]["phase"] == "Running" {
                    break;
                }
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "{namespace}/start-{i} did not run in {START_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        took.push(started.elapsed());
    }
    let delete = http::Request::delete(format!("{base}/api/v1/namespaces/{namespace}"))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let _ = send(&client, delete).await;
    Ok(took)
}

/// The median of `durations` (the upper one of an even count's middle two).
pub fn median(durations: &[Duration]) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}
