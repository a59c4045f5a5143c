//! The `Available` condition of `v1alpha1.wardle.example.com`, which two controllers keep: the
//! gateway's availability controller (probing every 5 s here) and kube-apiserver's own (resync
//! every 30 s). Both reach the same sample-apiserver, so they must agree, and agreeing means
//! neither writes once the condition is right.

use std::time::{Duration, Instant};

use e2e::real::sample_apiserver::WARDLE_APISERVICE;
use http_body_util::BodyExt;

use super::session::Real;

/// The window over which status writes are counted. The issue asks for a minute; 35 s is enough
/// to tell: it holds at least one of kube-apiserver's 30 s resyncs and seven of the gateway's 5 s
/// probes, and a fight needs only one write from each side to show (2 writes), while two
/// controllers that agree write nothing.
const FIGHT_WINDOW: Duration = Duration::from_secs(35);

pub async fn get_apiservices(real: &Real) {
    let (direct, through) = real.admins();
    let row = |out: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(WARDLE_APISERVICE))
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .map(str::to_owned)
            .collect()
    };
    let got = through.run_ok(&["get", "apiservices"]).await.stdout;
    let want = direct.run_ok(&["get", "apiservices"]).await.stdout;
    assert_eq!(
        row(&got),
        vec![WARDLE_APISERVICE, "wardle/api", "True"],
        "kubectl get apiservices through the gateway:\n{got}"
    );
    assert_eq!(row(&got), row(&want));
    let managers = direct
        .run_ok(&[
            "get",
            "apiservice",
            WARDLE_APISERVICE,
            "--show-managed-fields",
            "-o",
            "jsonpath={range .metadata.managedFields[*]}{.manager}/{.subresource} {end}",
        ])
        .await
        .stdout;
    eprintln!("real control plane: managers of {WARDLE_APISERVICE}: {managers}");
}

pub async fn no_status_fight(real: &Real) {
    let client = real.direct_client();
    let list = format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices/{WARDLE_APISERVICE}",
        real.plane.url
    );
    let (_, object) = real.fetch(&client, &list, "application/json").await;
    let rv = object["metadata"]["resourceVersion"]
        .as_str()
        .expect("the APIService has a resourceVersion")
        .to_owned();
    let url = format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices?watch=1&resourceVersion={rv}&\
         fieldSelector=metadata.name%3D{WARDLE_APISERVICE}",
        real.plane.url
    );
    let response =
        e2e::harness::send_streaming(&client, real.admin_request(&url, "application/json"))
            .await
            .unwrap();
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let deadline = Instant::now() + FIGHT_WINDOW;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline.into(), body.frame()).await {
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    let events: Vec<serde_json::Value> = buffer
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    let writes: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "MODIFIED")
        .map(|e| e["object"]["status"].to_string())
        .collect();
    assert!(
        writes.len() <= 1,
        "{} status writes to {WARDLE_APISERVICE} in {FIGHT_WINDOW:?}: the gateway and \
         kube-apiserver fight over it:\n{}",
        writes.len(),
        writes.join("\n")
    );
    eprintln!(
        "real control plane: {} status writes to {WARDLE_APISERVICE} in {FIGHT_WINDOW:?}",
        writes.len()
    );
}
