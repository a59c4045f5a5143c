//! The opt-in readiness check `aggregated-apiservice-reachable`: a replica that cannot reach a
//! remote APIService it routes to says so on `/readyz`, so a load balancer sends callers to the
//! replicas that can; off by default, since a backend down for everyone would take every replica
//! out.

use std::time::Duration;

use e2e::harness::{self, Gateway};
use e2e::scenario::{Scenario, WARDLE_GROUP};
use http::StatusCode;

const NAME: &str = "v1alpha1.wardle.example.com";
const CHECK: &str = "aggregated-apiservice-reachable";

async fn probe(gateway: &Gateway, path: &str) -> (StatusCode, String) {
    let client = gateway.http1_client(None);
    let (status, _, body) = harness::get(&client, &format!("{}{path}", gateway.url()))
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_replica_that_cannot_reach_a_backend_fails_readyz_only_when_asked() {
    let mut s = Scenario::wardle()
        .gateway_args(&["--readyz-aggregated-apiservice-reachable"])
        .start()
        .await;
    // A second replica with the defaults, in front of the same core and backend.
    let config = s
        .pki
        .gateway_config(&[("wardle", "api", s.backend("wardle"))], "");
    let plain = s.pki.start_gateway(&s.core, &config, &[]).await;
    s.register_wardle_until_available().await;

    let (status, verbose) = probe(&s.gateway, "/readyz?verbose").await;
    assert_eq!(status, StatusCode::OK, "{verbose}");
    assert!(verbose.contains(&format!("[+]{CHECK} ok\n")), "{verbose}");
    let (_, plain_verbose) = probe(&plain, "/readyz?verbose").await;
    assert!(
        !plain_verbose.contains(CHECK),
        "off by default:\n{plain_verbose}"
    );

    // The backend goes away: the replica that asked for the check turns unready, and says why
    // on the check's own path; it stays alive.
    let addr = s.backend("wardle").addr;
    s.backend_mut("wardle").process.kill();
    let unready = harness::wait_until(Duration::from_secs(5), || async {
        probe(&s.gateway, "/readyz").await.0 == StatusCode::INTERNAL_SERVER_ERROR
    })
    .await;
    assert!(unready, "still ready without its backend\n{}", s.logs());
    let (_, verbose) = probe(&s.gateway, "/readyz?verbose").await;
    assert!(
        verbose.contains(&format!("[-]{CHECK} failed: reason withheld\n")),
        "{verbose}"
    );
    let (status, why) = probe(&s.gateway, &format!("/readyz/{CHECK}")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(why.contains(NAME), "{why}");
    assert_eq!(probe(&s.gateway, "/livez").await.0, StatusCode::OK);
    assert_eq!(
        probe(&s.gateway, &format!("/readyz?exclude={CHECK}"))
            .await
            .0,
        StatusCode::OK,
        "nothing else failed"
    );
    // Without the flag the same outage leaves the replica ready (it answers 503 for the group).
    assert_eq!(probe(&plain, "/readyz").await.0, StatusCode::OK);

    // Back on the same address: ready again, without a restart.
    let _backend = s
        .pki
        .start_backend(WARDLE_GROUP, "v1alpha1", &["--listen", &addr.to_string()])
        .await;
    let ready = harness::wait_until(Duration::from_secs(5), || async {
        probe(&s.gateway, "/readyz").await.0 == StatusCode::OK
    })
    .await;
    assert!(
        ready,
        "not ready again after the backend came back\n{}",
        s.logs()
    );
}
