//! Cluster DNS: dnsmasq on the node's address answers `cluster.local` names only, from a hosts
//! file this task rewrites whenever the cluster's Services change (a record per ClusterIP
//! Service, `<name>.<namespace>.svc.cluster.local`). dnsmasq re-reads a hosts directory on
//! change; the file is replaced by a rename, so it never reads half a file.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{get, HttpClient};

/// How often the Services are listed.
const PERIOD: Duration = Duration::from_secs(1);

/// Keeps `dir/services.hosts` in step with the Services of the cluster at `url`, until the task
/// is aborted.
pub async fn sync_services(client: HttpClient, url: String, dir: PathBuf) {
    let mut last = String::new();
    loop {
        if let Ok((status, _, body)) = get(&client, &format!("{url}/api/v1/services")).await {
            if status.is_success() {
                if let Ok(list) = serde_json::from_slice::<Value>(&body) {
                    let hosts = hosts_file(&list);
                    if hosts != last {
                        let tmp = dir.join(".services.tmp");
                        if std::fs::write(&tmp, &hosts).is_ok()
                            && std::fs::rename(&tmp, dir.join("services.hosts")).is_ok()
                        {
                            last = hosts;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(PERIOD).await;
    }
}

/// One `IP name` line per Service with a ClusterIP.
fn hosts_file(list: &Value) -> String {
    let mut out = String::new();
    for svc in list["items"].as_array().into_iter().flatten() {
        let ip = svc["spec"]["clusterIP"].as_str().unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let (name, namespace) = (
            svc["metadata"]["name"].as_str().unwrap_or_default(),
            svc["metadata"]["namespace"].as_str().unwrap_or_default(),
        );
        out.push_str(&format!("{ip} {name}.{namespace}.svc.cluster.local\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_per_cluster_ip_service() {
        let list = serde_json::json!({"items": [
            {"metadata": {"name": "kubernetes", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.1"}},
            {"metadata": {"name": "headless", "namespace": "a"}, "spec": {"clusterIP": "None"}},
            {"metadata": {"name": "external", "namespace": "a"}, "spec": {"type": "ExternalName"}},
        ]});
        assert_eq!(
            hosts_file(&list),
            "10.96.0.1 kubernetes.default.svc.cluster.local\n"
        );
    }
}
