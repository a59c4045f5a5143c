//! Several replicas, one core: only the replica holding the Lease writes APIService status, and
//! another takes over within seconds when it goes away, killed or shut down. A core that serves
//! no Leases is said clearly, with the fix (`--leader-elect=false`).
//!
//! The two replicas are made to disagree, as replicas on different nodes do when a network path
//! breaks: `a` reaches the wardle backend, `b` is given an address where nothing listens. The
//! stored `Available` condition then shows who writes. Two writers would flip it back and forth
//! every availability interval (each reconciles what it sees against what the other wrote); one
//! writer keeps it still, and a new leader turns it to its own view.

use std::time::{Duration, Instant};

use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions};
use e2e::scenario::{self, available_condition, core_client, json_or_null, Scenario, WARDLE_GROUP};
use http::StatusCode;
use serde_json::Value;

const NAME: &str = "v1alpha1.wardle.example.com";
const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/aggregation-gateway";
/// Short timings so that a handover takes seconds, not the default 15 s.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const ELECTION: [&str; 5] = [
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=250ms",
    // The Lease is released at SIGTERM, before this delay.
    "--shutdown-delay-duration=1s",
    "--shutdown-timeout=2s",
];
/// The scenario's own gateway checks every second; the other replicas are told the same, so that
/// two writers would each reconcile the other's condition every second.
const EVERY_SECOND: &str = "--apiservice-availability-interval=1s";

fn replica_args() -> Vec<&'static str> {
    ELECTION.iter().copied().chain([EVERY_SECOND]).collect()
}

/// The `identity` field of this replica's JSON log line whose message starts with `message`.
fn logged_identity(gateway: &Gateway, message: &str) -> Option<String> {
    gateway.process.lines().iter().find_map(|line| {
        let v: Value = serde_json::from_str(&line.text).ok()?;
        let fields = v.get("fields").unwrap_or(&v);
        fields["message"]
            .as_str()?
            .starts_with(message)
            .then(|| fields["identity"].as_str().map(str::to_owned))?
    })
}

/// The identity a replica campaigns under (logged once at start).
async fn identity(gateway: &Gateway) -> String {
    let found = harness::wait_until(Duration::from_secs(10), || async {
        logged_identity(gateway, "leader election: campaigning").is_some()
    })
    .await;
    assert!(found, "no campaign line:\n{}", gateway.process.logs());
    logged_identity(gateway, "leader election: campaigning").unwrap()
}

/// The Lease as the core stores it; null until the first replica has created it (a replica
/// logs its campaign before its first write reaches the core).
async fn lease(core: &FixtureCore) -> Value {
    let (status, _, body) = harness::get(&core_client(), &format!("{}{LEASE}", core.url()))
        .await
        .unwrap();
    if status == StatusCode::NOT_FOUND {
        return Value::Null;
    }
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    json_or_null(&body)
}

async fn holder(core: &FixtureCore) -> String {
    lease(core).await["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `leader_election_master_status{name="aggregation-gateway"}` on this replica's /metrics.
async fn master_status(s: &Scenario, gateway: &Gateway) -> Option<String> {
    let admin = s.user("admin", &["system:masters"]);
    let (status, _, body) = scenario::get_raw(gateway, &admin, "/metrics", &[]).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).lines().find_map(|l| {
        l.strip_prefix("leader_election_master_status{name=\"aggregation-gateway\"} ")
            .map(str::to_owned)
    })
}

/// Samples the stored condition every 100 ms for `window`: every distinct value seen.
async fn conditions_during(core: &FixtureCore, window: Duration) -> Vec<Option<(String, String)>> {
    let mut seen = Vec::new();
    let end = Instant::now() + window;
    while Instant::now() < end {
        let c = available_condition(core, NAME).await;
        if !seen.contains(&c) {
            seen.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// Waits for the stored condition to read `status`; how long it took.
async fn until_condition(core: &FixtureCore, status: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    harness::wait_until(limit, || async {
        available_condition(core, NAME)
            .await
            .is_some_and(|(s, _)| s == status)
    })
    .await
    .then(|| start.elapsed())
}

#[tokio::test]
async fn one_replica_writes_status_and_another_takes_over_when_it_goes_away() {
    // Replica a: the scenario's gateway, whose static Service map reaches the backend.
    let mut s = Scenario::wardle().gateway_args(&ELECTION).start().await;
    let a_id = identity(&s.gateway).await;
    let leads = harness::wait_until(Duration::from_secs(10), || async {
        holder(&s.core).await == a_id
    })
    .await;
    assert!(leads, "a never took the Lease:\n{}", s.logs());

    // Replica b: the same core, the backend's Service at a closed port.
    let dead = s.pki.gateway_config(
        &[],
        "services:\n- namespace: wardle\n  name: api\n  port: 443\n  urls: [\"https://127.0.0.1:1\"]\n",
    );
    let mut b = s.pki.start_gateway(&s.core, &dead, &replica_args()).await;
    let b_id = identity(&b).await;
    assert_ne!(a_id, b_id);

    s.kubectl(&s.user("alice", &[]))
        .apply_yaml(&s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle").yaml())
        .await;
    assert!(
        until_condition(&s.core, "True", Duration::from_secs(10))
            .await
            .is_some(),
        "the leader never wrote Available=True\n{}",
        s.logs()
    );
    // b routes on its own view all the same: it answers 503 for the group a serves.
    let alice = s.user("alice", &[]);
    let b_view = harness::wait_until(Duration::from_secs(5), || async {
        scenario::get_raw(&b, &alice, "/apis/wardle.example.com/v1alpha1", &[])
            .await
            .0
            == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(
        b_view,
        "b does not see the backend as unavailable\n{}",
        b.process.logs()
    );

    // Exactly one writer: over four availability intervals the stored condition never moves,
    // though b finds the backend unreachable at every check.
    let seen = conditions_during(&s.core, Duration::from_secs(4)).await;
    assert_eq!(
        seen,
        [Some(("True".to_owned(), "Passed".to_owned()))],
        "the stored condition changed while a led: two writers\n--- b ---\n{}",
        b.process.logs()
    );
    assert_eq!(holder(&s.core).await, a_id);
    assert_eq!(master_status(&s, &s.gateway).await.as_deref(), Some("1"));
    assert_eq!(master_status(&s, &b).await.as_deref(), Some("0"));

    // The leader is killed (no release): b takes over once the Lease expires, and writes.
    let transitions = lease(&s.core).await["spec"]["leaseTransitions"].as_i64();
    s.gateway.process.signal("KILL").unwrap();
    let took = until_condition(&s.core, "False", LEASE_DURATION + Duration::from_secs(4))
        .await
        .unwrap_or_else(|| panic!("b never wrote its view\n--- b ---\n{}", b.process.logs()));
    eprintln!(
        "handover: leader killed -> new leader's status written {} ms (lease duration {} ms)",
        took.as_millis(),
        LEASE_DURATION.as_millis()
    );
    assert_eq!(holder(&s.core).await, b_id);
    assert_eq!(
        lease(&s.core).await["spec"]["leaseTransitions"].as_i64(),
        transitions.map(|t| t + 1)
    );
    assert_eq!(
        available_condition(&s.core, NAME).await,
        Some(("False".to_owned(), "FailedDiscoveryCheck".to_owned()))
    );
    s.gateway.process.kill();

    // A replica that reaches the backend again; b, the leader, shuts down gracefully: it
    // releases the Lease, so the handover takes a retry period, not a lease duration.
    let c = s
        .pki
        .start_gateway(&s.core, &scenario_config(&s), &replica_args())
        .await;
    let c_id = identity(&c).await;
    let seen = conditions_during(&s.core, Duration::from_secs(2)).await;
    assert_eq!(
        seen,
        [Some((
            "False".to_owned(),
            "FailedDiscoveryCheck".to_owned()
        ))],
        "c wrote while b led"
    );
    b.process.signal("TERM").unwrap();
    let took = until_condition(&s.core, "True", LEASE_DURATION + Duration::from_secs(4))
        .await
        .unwrap_or_else(|| panic!("c never wrote its view\n--- c ---\n{}", c.process.logs()));
    eprintln!(
        "handover: leader sent SIGTERM -> new leader's status written {} ms",
        took.as_millis()
    );
    assert!(
        took < LEASE_DURATION,
        "after SIGTERM the handover took {} ms, as long as an expired Lease: b did not release it\n--- b ---\n{}",
        took.as_millis(),
        b.process.logs()
    );
    assert_eq!(holder(&s.core).await, c_id);
    assert!(
        b.process.wait_exit(Duration::from_secs(10)).await.is_some(),
        "b did not exit"
    );
    let b_logs = b.process.logs();
    assert!(
        b_logs.contains("leader election: released the Lease"),
        "{b_logs}"
    );
}

/// Issue 27: a core that serves no `coordination.k8s.io/v1` Leases (the fixture started
/// `--without-leases`). The gateway logs it once, naming `--leader-elect=false` as the fix, and
/// `/healthz/leaderElection` fails with the same text, while `/readyz` stays ready (the proxy
/// works); no status is written. A replica started with `--leader-elect=false` writes it. Before:
/// one warning about a failed Lease request, no check, and the condition never written.
#[tokio::test]
async fn a_core_without_leases_is_said_clearly_and_leader_elect_false_writes_status() {
    const SAID: &str = "the core serves no coordination.k8s.io/v1 Leases";
    const FIX: &str = "--leader-elect=false";
    let s = Scenario::wardle()
        .core_args(&["--without-leases"])
        .gateway_args(&ELECTION)
        .start()
        .await;
    s.kubectl(&s.user("alice", &[]))
        .apply_yaml(&s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle").yaml())
        .await;
    let line = said_once(&s, SAID).await;
    assert!(line.contains(FIX), "{line}");
    assert_unled_but_serving(&s, &[SAID, FIX]).await;
    assert_eq!(available_condition(&s.core, NAME).await, None);

    // The fix: one replica that writes status without a Lease.
    let b = s
        .pki
        .start_gateway(&s.core, &scenario_config(&s), &[FIX, EVERY_SECOND])
        .await;
    assert!(
        until_condition(&s.core, "True", Duration::from_secs(10))
            .await
            .is_some(),
        "the replica started with {FIX} never wrote Available=True\n{}",
        b.process.logs()
    );
}

/// A core whose authorization refuses the gateway's identity the Lease (every request on
/// `leases.coordination.k8s.io` gets 403, as RBAC without the chart's leader-election Role). The
/// gateway says so once, with the core's own message, the verbs to grant and the other fix; the
/// `/healthz` check fails with that text and `/readyz` stays ready. The core answered, so it is
/// not reported as the core's outage. Before: the 403 was logged as "cannot use the core server",
/// as if the core were down, and nothing said what to grant.
#[tokio::test]
async fn a_core_that_forbids_the_lease_is_said_clearly_with_the_verbs_to_grant() {
    const SAID: &str = "the core forbids the gateway's identity the Lease";
    const GRANT: &str =
        "grant it get, create and update on leases.coordination.k8s.io in namespace kube-system";
    let s = Scenario::wardle()
        .core_args(&["--forbid", "leases.coordination.k8s.io"])
        .gateway_args(&ELECTION)
        .start()
        .await;
    let line = said_once(&s, SAID).await;
    for part in [GRANT, "is forbidden", "--leader-elect=false"] {
        assert!(line.contains(part), "no {part:?} in {line}");
    }
    let outage: Vec<_> = lines_with(&s, "cannot use the core server")
        .into_iter()
        .filter(|l| l.contains("leader election"))
        .collect();
    assert!(
        outage.is_empty(),
        "a 403 reported as an outage: {outage:#?}"
    );

    assert_unled_but_serving(&s, &[SAID, GRANT]).await;
}

/// The gateway's log lines that contain `text`.
fn lines_with(s: &Scenario, text: &str) -> Vec<String> {
    s.gateway
        .process
        .lines()
        .into_iter()
        .filter(|l| l.text.contains(text))
        .map(|l| l.text)
        .collect()
}

/// The one line that says `text`: it comes within 10 s and is not repeated in the many retry
/// periods (250 ms) of the next 2 s.
async fn said_once(s: &Scenario, text: &str) -> String {
    let said = harness::wait_until(Duration::from_secs(10), || async {
        !lines_with(s, text).is_empty()
    })
    .await;
    assert!(said, "nothing said: {text:?}\n{}", s.logs());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut lines = lines_with(s, text);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    lines.remove(0)
}

/// `/healthz/leaderElection` fails with every one of `texts`, while `/readyz` passes: a
/// replica that cannot lead still serves.
async fn assert_unled_but_serving(s: &Scenario, texts: &[&str]) {
    let admin = s.user("admin", &["system:masters"]);
    let (status, _, body) =
        scenario::get_raw(&s.gateway, &admin, "/healthz/leaderElection", &[]).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    for text in texts {
        assert!(body.contains(text), "no {text:?} in {body}");
    }
    let (status, _, body) = scenario::get_raw(&s.gateway, &admin, "/readyz", &[]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a replica that cannot lead still serves: {}",
        String::from_utf8_lossy(&body)
    );
}

/// The config of the scenario's own gateway: the static Service map that reaches the backend.
fn scenario_config(s: &Scenario) -> std::path::PathBuf {
    s.pki
        .gateway_config(&[("wardle", "api", s.backend("wardle"))], "")
}

/// Issue 41: the leader elector runs under the supervisor. Made to panic in its first run (the
/// debug builds' test hook), it is logged once and counted, started again after its backoff, and
/// then campaigns and takes the Lease; at SIGTERM it still releases it (a loop asked to stop is
/// not started again). Before: the elector's task died with the panic, no replica ever led (no
/// APIService status written), and `/readyz` said ok.
#[tokio::test]
async fn a_leader_elector_that_panics_is_started_again_and_leads() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let mut gateway = Gateway::start(
        GatewayOptions::new(core.url())
            .args(ELECTION)
            .env("AGGREGATION_GATEWAY_TEST_PANIC", "leader-election:1"),
    )
    .await
    .unwrap();
    let id = identity(&gateway).await;
    let leads = harness::wait_until(Duration::from_secs(10), || async {
        holder(&core).await == id
    })
    .await;
    assert!(leads, "never took the Lease:\n{}", gateway.process.logs());
    let ended: Vec<String> = gateway
        .process
        .lines()
        .into_iter()
        .map(|l| l.text)
        .filter(|l| l.contains("the leader-election loop panicked"))
        .collect();
    assert_eq!(ended.len(), 1, "one line per end: {ended:#?}");
    let metrics = scenario::metrics(&gateway).await;
    for series in [
        r#"aggregation_gateway_loop_restarts_total{loop="leader-election"} 1"#,
        r#"leader_election_master_status{name="aggregation-gateway"} 1"#,
    ] {
        assert!(metrics.contains(series), "no {series}:\n{metrics}");
    }

    gateway.process.signal("TERM").unwrap();
    assert!(
        gateway
            .process
            .wait_exit(Duration::from_secs(10))
            .await
            .is_some(),
        "did not exit:\n{}",
        gateway.process.logs()
    );
    assert_eq!(holder(&core).await, "", "the Lease was not released");
    assert!(
        gateway
            .process
            .logs()
            .contains("leader election: released the Lease"),
        "{}",
        gateway.process.logs()
    );
}
