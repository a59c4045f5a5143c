//! API Priority and Fairness beside kube-apiserver's own: the gateway reads kube-apiserver's
//! FlowSchemas and PriorityLevelConfigurations (the mandatory and suggested objects
//! kube-apiserver keeps) and classifies each caller as kube-apiserver does. Both name the
//! FlowSchema and the priority level of every answer by UID (`X-Kubernetes-PF-*`), and the UIDs
//! of kube-apiserver's objects differ from those of the gateway's built-in copy, so equal headers
//! mean the same objects chose the same schema. The gateway replaces the core's headers with its
//! own, and its `apiserver_flowcontrol_dispatched_requests_total` shows that it, not only the
//! core behind it, dispatched the requests there.

use std::collections::BTreeMap;

use e2e::harness::{send, HttpClient};
use e2e::real::pki::{ADMIN_TOKEN, ALICE_TOKEN};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

use super::session::Real;

const FLOW_SCHEMA_UID: &str = "x-kubernetes-pf-flowschema-uid";
const PRIORITY_LEVEL_UID: &str = "x-kubernetes-pf-prioritylevel-uid";
const FLOWCONTROL: &str = "/apis/flowcontrol.apiserver.k8s.io/v1";

/// `GET url` with a bearer token: status and headers.
async fn get_as(client: &HttpClient, url: &str, token: &str) -> (StatusCode, HeaderMap) {
    let request = Request::get(url)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "application/json")
        .body(Full::default())
        .unwrap();
    let (status, headers, _) = send(client, request)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (status, headers)
}

/// Names by UID of kube-apiserver's objects of `resource`, and for FlowSchemas the level each
/// names: uid -> (name, level).
async fn objects_by_uid(real: &Real, resource: &str) -> BTreeMap<String, (String, String)> {
    let url = format!("{}{FLOWCONTROL}/{resource}", real.plane.url);
    let (status, list) = real
        .fetch(&real.direct_client(), &url, "application/json")
        .await;
    assert_eq!(status, StatusCode::OK, "{url}: {list}");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .map(|o: &Value| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&o["metadata"]["uid"]),
                (
                    text(&o["metadata"]["name"]),
                    text(&o["spec"]["priorityLevelConfiguration"]["name"]),
                ),
            )
        })
        .collect()
}

/// The same requests from three callers, straight to kube-apiserver and through the gateway:
/// `admin` (`system:masters`: `exempt`), `alice` (only `system:authenticated`: `global-default`),
/// and a ServiceAccount (`service-accounts` -> `workload-low`). Each answer through the gateway
/// names the FlowSchema and priority level kube-apiserver's answer names, and the gateway's
/// metrics count the dispatches under those names.
pub async fn classifies_as_kube_apiserver(real: &Real) {
    let admin = real.plane.admin();
    admin
        .run_ok(&[
            "create",
            "serviceaccount",
            "pf-quiet",
            "--namespace",
            "default",
        ])
        .await;
    let service_account = admin
        .run_ok(&["create", "token", "pf-quiet", "--namespace", "default"])
        .await
        .stdout
        .trim()
        .to_owned();
    let schemas = objects_by_uid(real, "flowschemas").await;
    let levels = objects_by_uid(real, "prioritylevelconfigurations").await;

    let callers = [
        ("admin", ADMIN_TOKEN, "/api/v1/namespaces"),
        ("alice", ALICE_TOKEN, "/version"),
        ("the ServiceAccount", service_account.as_str(), "/version"),
        (
            "the ServiceAccount",
            service_account.as_str(),
            "/api/v1/namespaces/default/configmaps",
        ),
    ];
    let (direct, through) = (real.direct_client(), real.gateway_client());
    let mut seen = Vec::new();
    for (caller, token, path) in callers {
        let (direct_status, want) =
            get_as(&direct, &format!("{}{path}", real.plane.url), token).await;
        let (status, got) = get_as(&through, &format!("{}{path}", real.gateway.url()), token).await;
        assert_eq!(status, direct_status, "{caller} GET {path}");
        let uid = |headers: &HeaderMap, name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (schema_uid, level_uid) = (uid(&want, FLOW_SCHEMA_UID), uid(&want, PRIORITY_LEVEL_UID));
        let (schema, level) = schemas
            .get(&schema_uid)
            .cloned()
            .unwrap_or_else(|| panic!("{caller} GET {path}: kube-apiserver named {want:?}"));
        assert_eq!(
            levels.get(&level_uid).map(|(name, _)| name),
            Some(&level),
            "{caller} GET {path}: kube-apiserver's level"
        );
        assert_eq!(
            (uid(&got, FLOW_SCHEMA_UID), uid(&got, PRIORITY_LEVEL_UID)),
            (schema_uid, level_uid),
            "{caller} GET {path}: kube-apiserver classified it {schema}/{level}; the gateway's \
             headers: {got:?}"
        );
        eprintln!("real control plane: {caller} GET {path}: {schema} / {level} on both");
        seen.push((schema, level));
    }
    for expected in [("exempt", "exempt"), ("global-default", "global-default")] {
        assert!(
            seen.iter()
                .any(|(s, l)| (s.as_str(), l.as_str()) == expected),
            "kube-apiserver classified differently than expected: {seen:?}"
        );
    }

    let (status, _, body) = send(
        &through,
        real.admin_request(&format!("{}/metrics", real.gateway.url()), "text/plain"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8_lossy(&body);
    for (schema, level) in &seen {
        let counted = metrics.lines().any(|l| {
            l.starts_with("apiserver_flowcontrol_dispatched_requests_total{")
                && l.contains(&format!(r#"flow_schema="{schema}""#))
                && l.contains(&format!(r#"priority_level="{level}""#))
        });
        assert!(
            counted,
            "the gateway's metrics count no dispatch at {schema}/{level}:\n{}",
            metrics
                .lines()
                .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
