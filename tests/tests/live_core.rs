//! A user installing CustomResourceDefinitions through the gateway, as Helm charts with `crds/`
//! and operator install scripts do: `kubectl apply` of a CRD, `kubectl wait
//! --for=condition=Established`, then `kubectl apply` of a resource of it at once. The core
//! fixture establishes CRDs a moment after creation and lists them in discovery a moment after
//! that, as kube-apiserver does; the gateway must follow the core's discovery closely enough that
//! the last step never meets "no matches for kind", and a CRD created on the core directly must
//! reach the gateway's merged `/apis` within a second of the core listing it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, DEFAULT_TOKEN};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

/// What kubectl 1.32 sends for `/apis`.
const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// Sequences of the kubectl test; `LIVE_CORE_CRD_ROUNDS=50` runs the fifty.
const DEFAULT_ROUNDS: usize = 15;

/// A core serving CRDs, and the gateway in front of it with no APIServices of its own.
async fn crd_core_and_gateway() -> (FixtureCore, Gateway) {
    let core = FixtureCore::start(&["--crds"])
        .await
        .expect("fixture core starts");
    let gateway =
        Gateway::start(GatewayOptions::new(core.url()).args(["--apiservice-source", "none"]))
            .await
            .expect("gateway starts");
    (core, gateway)
}

/// A namespaced `Widget` CRD in `group` (JSON, which `kubectl apply` takes as YAML too).
fn crd(group: &str) -> Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                           "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

fn widget_yaml(group: &str, name: &str) -> String {
    format!(
        "apiVersion: {group}/v1
kind: Widget
metadata:
  name: {name}
  namespace: default
spec:
  size: 3
"
    )
}

#[tokio::test]
async fn a_custom_resource_applies_right_after_its_crd_is_established() {
    let rounds: usize = std::env::var("LIVE_CORE_CRD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let (_core, gateway) = crd_core_and_gateway().await;
    let kubectl = gateway.kubectl().unwrap();
    // Discovery is cached from here on, as in a user's shell.
    kubectl.run_ok(&["api-resources"]).await;

    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        let group = format!("r{round}.live.example.com");
        let sequence = Instant::now();
        kubectl.apply_yaml(&crd(&group).to_string()).await;
        kubectl
            .run_ok(&[
                "wait",
                "--for=condition=Established",
                &format!("crd/widgets.{group}"),
                "--timeout=10s",
            ])
            .await;
        let applied = kubectl.apply_yaml(&widget_yaml(&group, "first")).await;
        assert!(
            applied.stdout.contains("created"),
            "round {round}: {applied}"
        );
        slowest = slowest.max(sequence.elapsed());
    }
    let total = started.elapsed();
    eprintln!(
        "{rounds} sequences of CRD apply → wait Established → resource apply through the gateway: \
         all succeeded in {total:?} ({:?} each on average, slowest {slowest:?})",
        total / rounds as u32
    );
    // Reading back through the gateway: the resources are where the core stored them.
    let listed = kubectl
        .run_ok(&[
            "get",
            &format!("widgets.r{}.live.example.com", rounds - 1),
            "-n",
            "default",
            "-o",
            "name",
        ])
        .await;
    assert!(listed.stdout.contains("first"), "{listed}");
}

/// GET `path` with `accept`, returning the body as JSON.
async fn get_json(client: &harness::HttpClient, url: &str, accept: &str, token: bool) -> Value {
    let mut req = Request::get(url).header("accept", accept);
    if token {
        req = req.header("authorization", format!("Bearer {DEFAULT_TOKEN}"));
    }
    let (status, _, body) = harness::send(client, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(status, StatusCode::OK, "GET {url}");
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

/// Whether an aggregated (`items[].metadata.name`) or legacy (`groups[].name`) `/apis` lists
/// `group`.
fn lists(doc: &Value, group: &str) -> bool {
    let aggregated = doc["items"].as_array().into_iter().flatten();
    let legacy = doc["groups"].as_array().into_iter().flatten();
    aggregated
        .map(|g| &g["metadata"]["name"])
        .chain(legacy.map(|g| &g["name"]))
        .any(|name| name == group)
}

#[tokio::test]
async fn a_crd_created_on_the_core_reaches_merged_discovery_within_a_second() {
    let (core, gateway) = crd_core_and_gateway().await;
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let apis = format!("{}/apis", gateway.url());
    let core_apis = format!("{}/apis", core.url());
    // The gateway serves its merged document (the core is known) before the clock starts.
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        lists(&get_json(&client, &apis, AGG, true).await, "apps")
    })
    .await;
    assert!(ready, "the gateway never listed the core's groups");

    // Created on the core directly: no write passes the gateway, only its watch can tell it.
    let mut lags = Vec::new();
    for round in 0..3 {
        let group = format!("direct{round}.live.example.com");
        let created = harness::send(
            &client,
            Request::post(format!(
                "{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                core.url()
            ))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(crd(&group).to_string())))
            .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(created.0, StatusCode::CREATED, "{created:?}");

        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut on_core, mut aggregated, mut legacy) = (None, None, None);
        while (on_core.is_none() || aggregated.is_none() || legacy.is_none())
            && Instant::now() < deadline
        {
            let (c, a, l) = tokio::join!(
                get_json(&client, &core_apis, AGG, false),
                get_json(&client, &apis, AGG, true),
                get_json(&client, &apis, "application/json", true),
            );
            let now = Instant::now();
            for (doc, seen) in [(c, &mut on_core), (a, &mut aggregated), (l, &mut legacy)] {
                if seen.is_none() && lists(&doc, &group) {
                    *seen = Some(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let on_core = on_core.unwrap_or_else(|| panic!("the core never listed {group}"));
        for (what, seen) in [("aggregated", aggregated), ("legacy", legacy)] {
            let seen = seen.unwrap_or_else(|| {
                panic!(
                    "the gateway's {what} /apis never listed {group}:\n{}",
                    gateway.process.logs()
                )
            });
            lags.push((what, seen.saturating_duration_since(on_core)));
        }
    }
    eprintln!("a new CRD group in the gateway's /apis after the core listed it: {lags:?}");
    for (what, lag) in &lags {
        assert!(
            *lag < Duration::from_secs(1),
            "{what} /apis listed a new CRD group {lag:?} after the core: {lags:?}"
        );
    }
}
