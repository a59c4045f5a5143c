//! The `Available` condition the gateway writes on the core, as an operator reading
//! `kubectl get apiservice -o yaml` sees it: who wrote it (`managedFields`), and that it is
//! reconciled, not only written when the gateway's own view changes.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{self, FixtureCore};
use e2e::scenario::{
    available_condition, clear_core_requests, core_client, core_requests, json_or_null, Scenario,
};
use http::StatusCode;
use http_body_util::Full;
use serde_json::{json, Value};

const NAME: &str = "v1alpha1.wardle.example.com";
const APISERVICE: &str = "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.wardle.example.com";

/// APIService `NAME` as the core stores it.
async fn stored(core: &FixtureCore) -> Value {
    let (status, _, body) = harness::get(&core_client(), &format!("{}{APISERVICE}", core.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    json_or_null(&body)
}

/// The wardle backend registered on the core (kube source) with the availability interval
/// `interval`, once the gateway has written `Available=True`.
async fn registered(interval: &str) -> Scenario {
    let s = Scenario::wardle()
        .availability_interval(interval)
        .start()
        .await;
    s.register_wardle_until_available().await;
    s
}

/// Every status write names the gateway as its field manager, as kube-apiserver's availability
/// controller names itself `kube-apiserver`: an operator sees in `managedFields` who wrote the
/// condition (it was `unknown`).
#[tokio::test]
async fn status_writes_name_the_gateway_as_field_manager() {
    let s = registered("1s").await;
    let api = stored(&s.core).await;
    let status_managers: Vec<&str> = api["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["subresource"] == "status")
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert_eq!(status_managers, ["aggregation-gateway"], "{api:#}");

    // And on the wire: the status write carried `fieldManager`.
    let writes: Vec<String> = core_requests(&s.core)
        .await
        .into_iter()
        .filter(|r| r["method"] == "PATCH")
        .filter_map(|r| r["path"].as_str().map(str::to_owned))
        .filter(|p| p.contains("/status"))
        .collect();
    assert!(!writes.is_empty(), "no status write recorded");
    for path in &writes {
        assert!(path.contains("fieldManager=aggregation-gateway"), "{path}");
    }
}

/// A status overwritten behind the gateway's back (a core restored from a backup, another
/// writer) is corrected within one availability interval, though the gateway's own view never
/// changed; and while the stored status agrees, nothing is written at all.
#[tokio::test]
async fn a_status_overwritten_behind_the_gateways_back_is_corrected_within_the_interval() {
    let interval = Duration::from_secs(2);
    let s = registered("2s").await;

    let restored = json!({"status": {"conditions": [{
        "type": "Available",
        "status": "False",
        "reason": "RestoredFromBackup",
        "message": "an old status",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
    }]}});
    let req = http::Request::patch(format!(
        "{}{APISERVICE}/status?fieldManager=backup-restore",
        s.core.url()
    ))
    .header("content-type", "application/merge-patch+json")
    .body(Full::new(Bytes::from(restored.to_string())))
    .unwrap();
    let since = Instant::now();
    let (status, _, _) = harness::send(&core_client(), req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        available_condition(&s.core, NAME).await,
        Some(("False".into(), "RestoredFromBackup".into()))
    );

    let corrected = harness::wait_until(Duration::from_secs(10), || async {
        available_condition(&s.core, NAME).await == Some(("True".into(), "Passed".into()))
    })
    .await;
    let took = since.elapsed();
    eprintln!(
        "reaction: overwritten status -> corrected {} ms",
        took.as_millis()
    );
    assert!(corrected, "never corrected\n{}", s.logs());
    assert!(
        took <= interval + Duration::from_millis(1500),
        "corrected after {} ms, more than one interval ({} ms)",
        took.as_millis(),
        interval.as_millis()
    );

    // Agreed: two more intervals without a single status write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    clear_core_requests(&s.core).await;
    tokio::time::sleep(interval * 2 + Duration::from_millis(500)).await;
    let writes: Vec<Value> = core_requests(&s.core)
        .await
        .into_iter()
        .filter(|r| r["method"] != "GET" && r["path"].as_str().is_some_and(|p| p.contains(NAME)))
        .collect();
    assert!(writes.is_empty(), "writes while agreeing: {writes:#?}");
}

/// Issue 24, finding 4: a kube-apiserver core runs its own availability controller, which marked
/// an APIService whose Service it could not see `False (ServiceNotFound)` while the gateway,
/// which could reach the backend, wrote `True`: the condition flipped 5 times a minute. A core
/// whose local APIServices carry kube-aggregator's `automanaged` label owns the condition; the
/// gateway writes none there, and still routes by its own probes.
#[tokio::test]
async fn the_gateway_writes_no_status_on_a_core_that_runs_its_own_availability_controller() {
    let s = Scenario::wardle().availability_interval("1s").start().await;
    // What kube-apiserver registers for each built-in group, with the condition it writes.
    let local = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.apps",
                     "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
        "spec": {"group": "apps", "version": "v1", "groupPriorityMinimum": 17800, "versionPriority": 15},
    });
    let req = http::Request::post(format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices",
        s.core.url()
    ))
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from(local.to_string())))
    .unwrap();
    let (status, _, body) = harness::send(&core_client(), req).await.unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );

    let api = s
        .pki
        .apiservice(e2e::scenario::WARDLE_GROUP, "v1alpha1", "wardle");
    s.kubectl(&s.user("alice", &[]))
        .apply_yaml(&api.yaml())
        .await;
    // The core's own controller, which cannot see the Service, says so.
    let theirs = json!({"status": {"conditions": [{
        "type": "Available", "status": "False", "reason": "ServiceNotFound",
        "message": "service/api in \"wardle\" is not present",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    let req = http::Request::patch(format!(
        "{}{APISERVICE}/status?fieldManager=kube-apiserver",
        s.core.url()
    ))
    .header("content-type", "application/merge-patch+json")
    .body(Full::new(Bytes::from(theirs.to_string())))
    .unwrap();
    let (status, _, _) = harness::send(&core_client(), req).await.unwrap();
    assert_eq!(status, StatusCode::OK);

    // The gateway routes wardle by its own probe...
    let alice = s.user("alice", &["dev"]);
    let routed = harness::wait_until(Duration::from_secs(10), || async {
        s.kubectl(&alice)
            .run(&["get", "flunders", "-A"])
            .await
            .success()
    })
    .await;
    assert!(routed, "the gateway never routed wardle\n{}", s.logs());
    // ...and over several availability intervals writes nothing over the core's condition.
    clear_core_requests(&s.core).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let writes: Vec<Value> = core_requests(&s.core)
        .await
        .into_iter()
        .filter(|r| r["method"] == "PATCH" || r["method"] == "PUT")
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains("/status")))
        .collect();
    assert!(
        writes.is_empty(),
        "status writes on a core that owns them: {writes:#?}"
    );
    assert_eq!(
        available_condition(&s.core, NAME).await,
        Some(("False".into(), "ServiceNotFound".into())),
        "the core's condition stays"
    );
}
