//! Two more gateway replicas on kube-apiserver, electing a writer with their own Lease: the
//! protocol against the real coordination.k8s.io (create, updates that conflict on a stale
//! resourceVersion, the admin identity's rights): one holder, and the other takes over within
//! seconds when the holder is killed without releasing it. (Who writes status is shown on the
//! fixture core in tests/leader_election.rs; here kube-apiserver's own controller writes it too.)

use std::time::{Duration, Instant};

use e2e::harness::{wait_until, Gateway};
use http::StatusCode;
use serde_json::Value;

use super::session::Real;

const LEASE: &str = "ha-check";
const LEASE_DURATION: Duration = Duration::from_secs(3);

fn campaign_identity(gateway: &Gateway) -> Option<String> {
    gateway.process.lines().iter().find_map(|line| {
        let v: Value = serde_json::from_str(&line.text).ok()?;
        let fields = v.get("fields").unwrap_or(&v);
        fields["message"]
            .as_str()?
            .starts_with("leader election: campaigning")
            .then(|| fields["identity"].as_str().map(str::to_owned))?
    })
}

async fn holder(real: &Real) -> Option<String> {
    let url = format!(
        "{}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{LEASE}",
        real.plane.url
    );
    let (status, lease) = real
        .fetch(&real.direct_client(), &url, "application/json")
        .await;
    (status == StatusCode::OK)
        .then(|| lease["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .flatten()
}

async fn replica(real: &Real) -> Gateway {
    Gateway::start(real.plane.gateway_options().args([
        format!("--leader-elect-resource-name={LEASE}"),
        "--leader-elect-lease-duration=3s".to_owned(),
        "--leader-elect-renew-deadline=2s".to_owned(),
        "--leader-elect-retry-period=250ms".to_owned(),
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn one_holder_and_a_handover(real: &Real) {
    let mut x = replica(real).await;
    let mut y = replica(real).await;
    let ids_logged = wait_until(Duration::from_secs(10), || async {
        campaign_identity(&x).is_some() && campaign_identity(&y).is_some()
    })
    .await;
    assert!(ids_logged, "no campaign lines:\n{}", x.process.logs());
    let (x_id, y_id) = (
        campaign_identity(&x).unwrap(),
        campaign_identity(&y).unwrap(),
    );
    let held = wait_until(Duration::from_secs(10), || async {
        holder(real).await.is_some_and(|h| h == x_id || h == y_id)
    })
    .await;
    assert!(
        held,
        "neither replica took Lease {LEASE}:\n{}",
        x.process.logs()
    );
    // Settled: the same holder across several renewals.
    let first = holder(real).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder(real).await.as_deref(), Some(first.as_str()));

    let (leader, successor) = if first == x_id {
        (&mut x, y_id)
    } else {
        (&mut y, x_id)
    };
    leader.process.signal("KILL").unwrap();
    let killed = Instant::now();
    let handed_over = wait_until(LEASE_DURATION + Duration::from_secs(4), || async {
        holder(real).await.as_deref() == Some(successor.as_str())
    })
    .await;
    let took = killed.elapsed();
    eprintln!(
        "real control plane: Lease {LEASE} handed over {} ms after the holder was killed",
        took.as_millis()
    );
    assert!(handed_over, "the other replica never took Lease {LEASE}");
}
