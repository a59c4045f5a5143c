//! Discovery as the core's Kubernetes release has it: the gateway reads the release from the
//! core's `/version`, says once which behaviours it follows, and serves `v2beta1` only where the
//! core does.

use std::time::{Duration, Instant};

use e2e::certs::CertifiedPair;
use e2e::scenario::{json_or_null, Pki, Scenario};
use http::StatusCode;

use super::{
    aggregated_apis, get, group_names, start, wardle_and_legacy, GROUPS, KUBECTL_1_29, V2BETA1,
};

/// [`wardle_and_legacy`] started in front of a core that reports Kubernetes `1.<minor>`.
async fn in_front_of_a_core_of(minor: u32) -> (Scenario, CertifiedPair) {
    let pki = Pki::for_services(&["wardle", "legacy"]);
    start(wardle_and_legacy(pki).core_args(&["--minor", &minor.to_string()])).await
}

/// In front of a core of 1.33 or newer, which no longer serves `apidiscovery.k8s.io/v2beta1`
/// (kube's `AggregatedDiscoveryRemoveBetaType`, on by default from 1.33 and locked from 1.35),
/// the gateway answers as the core does: kubectl 1.29's Accept gets the legacy `APIGroupList`
/// from its trailing `application/json`, a v2beta1-only Accept gets 406, v2 is unchanged; and the
/// gateway says once which release it follows.
#[tokio::test]
async fn in_front_of_a_core_without_v2beta1_the_gateway_serves_none_either() {
    let (s, alice) = in_front_of_a_core_of(36).await;
    let logged = s
        .gateway
        .process
        .wait_for_line(
            |l| l.contains("the core server is Kubernetes v1.36.4: following 1.36"),
            Duration::from_secs(10),
        )
        .await;
    let line = logged.unwrap_or_else(|| panic!("no release line:\n{}", s.logs()));
    assert!(line.contains("apidiscovery.k8s.io/v2 only"), "{line}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, headers, body) = get(&s, &alice, "/apis", &[("accept", KUBECTL_1_29)]).await;
        assert_eq!(status, StatusCode::OK);
        if headers["content-type"] == "application/json" {
            let doc = json_or_null(&body);
            assert_eq!(doc["kind"], "APIGroupList", "{doc}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {:?}",
            headers["content-type"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _, _) = get(&s, &alice, "/apis", &[("accept", V2BETA1)]).await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    let (status, _, body) = get(&s, &alice, "/api", &[("accept", KUBECTL_1_29)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_or_null(&body)["kind"], "APIVersions");
    let doc = aggregated_apis(&s, &alice).await;
    assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2");
    assert_eq!(group_names(&doc), GROUPS);
}

/// A core newer than the newest release the gateway was tested with is followed as that
/// release, with a warning naming both, and served as usual.
#[tokio::test]
async fn a_core_newer_than_the_newest_tested_release_gets_a_warning_and_is_served() {
    let (s, alice) = in_front_of_a_core_of(40).await;
    let logged = s
        .gateway
        .process
        .wait_for_line(
            |l| l.contains("WARN") && l.contains("v1.40.4, newer than the newest release"),
            Duration::from_secs(10),
        )
        .await;
    let line = logged.unwrap_or_else(|| panic!("no warning:\n{}", s.logs()));
    assert!(line.contains("following 1.36"), "{line}");
    let doc = aggregated_apis(&s, &alice).await;
    assert_eq!(group_names(&doc), GROUPS);
}
