//! Day 2 on the node: what operators do to a running release, with users' requests going on.
//!
//! - [`restart_upgrade_drain_under_load`]: `kubectl rollout restart`, `helm upgrade` with a
//!   changed value, and `kubectl drain` of the node (the PodDisruptionBudget lets one Pod go and
//!   holds the other, since the one node is cordoned), while kubectl requests and a watch go
//!   through the gateway's Service: none may fail.
//! - [`core_outlives_the_drain`]: in the sidecar shapes the core stops only after the gateway
//!   has drained, read from the two containers' logs (kubelet timestamps).
//! - [`readiness_follows_the_core`]: with the core frozen, `/readyz` fails and the Pod leaves the
//!   Service while `/livez` passes and nothing restarts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::harness::{wait_until, Kubectl};
use e2e::real_node::pki::NODE_NAME;
use serde_json::Value;

use super::shapes::{pod_report, Installed, FULLNAME, NAMESPACE, RELEASE};

/// kubectl requests and a watch through the gateway, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(kubectl: &Kubectl) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for worker in 0..2 {
            let (stop, requests, failures) = (stop.clone(), requests.clone(), failures.clone());
            let k = kubectl.clone_session();
            tasks.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let name = format!("load-{worker}-{i}");
                    for args in [
                        vec!["-n", "default", "create", "configmap", name.as_str()],
                        vec!["-n", "default", "get", "configmap", name.as_str()],
                        vec!["get", "flunders", "-A"],
                        vec!["-n", "default", "delete", "configmap", name.as_str()],
                    ] {
                        let out = k.run(&args).await;
                        requests.fetch_add(1, Ordering::Relaxed);
                        if !out.success() {
                            failures.lock().unwrap().push(out.to_string());
                        }
                    }
                }
            }));
        }
        // A watch, started again whenever the server ends it (a draining replica closes its
        // watches cleanly); only an error exit counts as lost.
        let (stop_w, failures_w) = (stop.clone(), failures.clone());
        let k = kubectl.clone_session();
        tasks.push(tokio::spawn(async move {
            while !stop_w.load(Ordering::Relaxed) {
                let mut watch = match k.spawn(&["-n", "default", "get", "configmaps", "-w"]) {
                    Ok(watch) => watch,
                    Err(e) => {
                        failures_w.lock().unwrap().push(e.to_string());
                        return;
                    }
                };
                loop {
                    if stop_w.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(status) = watch.try_wait() {
                        if !status.success() {
                            failures_w
                                .lock()
                                .unwrap()
                                .push(format!("the watch failed ({status}):\n{}", watch.logs()));
                        }
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
        Load {
            stop,
            requests,
            failures,
            tasks,
        }
    }

    /// Stops the load; the number of requests made, and every failure.
    async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.requests.load(Ordering::Relaxed), failures)
    }
}

pub async fn rollout_status(admin: &Kubectl) {
    let out = admin
        .run(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            &format!("deployment/{FULLNAME}"),
            "--timeout=180s",
        ])
        .await;
    assert!(out.success(), "{out}\n{}", pod_report(admin).await);
}

pub async fn restart_upgrade_drain_under_load(installed: &Installed<'_>) {
    let admin = installed
        .node
        .cluster
        .admin()
        .with_timeout(Duration::from_secs(200));
    let load = Load::start(&installed.kubectl);
    tokio::time::sleep(Duration::from_secs(3)).await;

    admin
        .run_ok(&[
            "-n",
            NAMESPACE,
            "rollout",
            "restart",
            &format!("deployment/{FULLNAME}"),
        ])
        .await;
    rollout_status(&admin).await;

    installed.upgrade(&["--set", "logging.level=debug"]);
    rollout_status(&admin).await;

    // One node: the first eviction is allowed, its replacement stays Pending on the cordoned
    // node, and the PDB (maxUnavailable 1) refuses the second until the node is uncordoned.
    let drain = admin
        .run(&[
            "drain",
            NODE_NAME,
            "--pod-selector",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "--delete-emptydir-data",
            "--ignore-daemonsets",
            "--timeout=40s",
        ])
        .await;
    admin.run_ok(&["uncordon", NODE_NAME]).await;
    rollout_status(&admin).await;
    let (requests, failures) = load.stop().await;

    assert!(
        !drain.success() && drain.stderr.contains("disruption budget"),
        "kubectl drain: the PDB holds the second Pod while the first one's replacement cannot \
         be scheduled:\n{drain}"
    );
    assert!(
        drain.stdout.contains("evicted"),
        "kubectl drain evicted one Pod:\n{drain}"
    );
    assert!(requests > 20, "only {requests} requests were made");
    assert!(
        failures.is_empty(),
        "{} of {requests} requests failed during restart, upgrade and drain:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("real node: {requests} requests, none lost, through restart, upgrade and drain");
}

/// The kubelet timestamp (RFC 3339) of a `kubectl logs --timestamps` line.
fn timestamp(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or_default()
}

pub async fn core_outlives_the_drain(installed: &Installed<'_>) {
    let admin = installed
        .node
        .cluster
        .admin()
        .with_timeout(Duration::from_secs(120));
    let pods = installed.pods().await;
    let pod = pods.first().expect("a running Pod");
    let follow = |container: &str| {
        admin
            .spawn(&[
                "-n",
                NAMESPACE,
                "logs",
                "-f",
                "--timestamps",
                pod,
                "-c",
                container,
            ])
            .expect("kubectl logs -f")
    };
    let (mut gateway, mut core) = (follow("gateway"), follow("core"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    admin
        .run_ok(&["-n", NAMESPACE, "delete", "pod", pod, "--wait=false"])
        .await;
    let ended = gateway.wait_exit(Duration::from_secs(90)).await.is_some()
        && core.wait_exit(Duration::from_secs(90)).await.is_some();
    assert!(ended, "the containers' logs did not end within 90 s");
    let gateway_lines = gateway.stdout();
    let core_lines = core.stdout();
    let gateway_last = gateway_lines
        .lines()
        .last()
        .map(timestamp)
        .unwrap_or_default()
        .to_owned();
    // kube-apiserver's controllers log "Shutting down ..." or "... is exiting" once it got
    // SIGTERM (seen on the node: "APF bootstrap ensurer is exiting").
    let after_delete = |l: &&str| {
        timestamp(l)
            .parse::<k8s_openapi::jiff::Timestamp>()
            .is_ok_and(|t| t >= deleted_at)
    };
    let core_stop = core_lines
        .lines()
        .filter(after_delete)
        .find(|l| {
            l.contains("Shutting down")
                || l.contains("graceful-termination")
                || l.contains(" is exiting")
        })
        .map(timestamp)
        .unwrap_or_default()
        .to_owned();
    assert!(
        !gateway_last.is_empty() && !core_stop.is_empty(),
        "no timestamps:\n--- gateway ---\n{gateway_lines}\n--- core ---\n{core_lines}"
    );
    let parse = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().ok();
    assert!(
        parse(&core_stop) >= parse(&gateway_last),
        "the core began to shut down at {core_stop}, before the gateway's last line at \
         {gateway_last}:\n--- gateway ---\n{gateway_lines}\n--- core ---\n{core_lines}"
    );
    eprintln!(
        "real node: gateway's last line {gateway_last}, core's first shutdown line {core_stop}"
    );
    rollout_status(&admin).await;
}

pub async fn readiness_follows_the_core(installed: &Installed<'_>) {
    let cluster = &installed.node.cluster;
    let admin = cluster.admin();
    let pods = installed.pods().await;
    let pod = pods.first().expect("a running Pod").clone();
    let json = admin
        .run_ok(&["-n", NAMESPACE, "get", "pod", &pod, "-o", "json"])
        .await;
    let pod_json: Value = serde_json::from_str(&json.stdout).unwrap();
    let statuses = |key: &str| {
        pod_json["status"][key]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let all: Vec<Value> = [
        statuses("containerStatuses"),
        statuses("initContainerStatuses"),
    ]
    .concat();
    let find = |name: &str| all.iter().find(|c| c["name"] == name).cloned().unwrap();
    let core_id = find("core")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let gateway_restarts = find("gateway")["restartCount"].clone();
    let ctr = |action: &str| {
        let out = std::process::Command::new(cluster.binaries.host("ctr"))
            .arg("--address")
            .arg(&cluster.containerd)
            .args(["-n", "k8s.io", "tasks", action, &core_id])
            .output()
            .unwrap();
        assert!(out.status.success(), "ctr tasks {action}: {out:?}");
    };
    ctr("pause");
    let unready = wait_until(Duration::from_secs(60), || async {
        let ready = admin
            .run(&[
                "-n",
                NAMESPACE,
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .await;
        ready.stdout == "False"
    })
    .await;
    // Liveness would restart the gateway after 6 failures 10 s apart; 30 s frozen is 3 of them.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = admin
        .run_ok(&["-n", NAMESPACE, "get", "pod", &pod, "-o", "json"])
        .await;
    ctr("resume");
    assert!(
        unready,
        "the Pod stayed Ready with its core frozen:\n{}",
        pod_report(&admin).await
    );
    let after: Value = serde_json::from_str(&after.stdout).unwrap();
    let gateway_after = after["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gateway")
        .unwrap()
        .clone();
    assert_eq!(
        gateway_after["restartCount"], gateway_restarts,
        "the gateway was restarted while only its core was down"
    );
    let events = admin
        .run_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
        ])
        .await;
    assert!(
        !events.stdout.contains("Liveness probe failed"),
        "liveness failed while the core was down:\n{}",
        events.stdout
    );
    let ready_again = wait_until(Duration::from_secs(60), || async {
        admin
            .run(&[
                "-n",
                NAMESPACE,
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .await
            .stdout
            == "True"
    })
    .await;
    assert!(
        ready_again,
        "the Pod did not become Ready again once the core was back"
    );
}
