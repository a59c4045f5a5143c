//! The request metrics mean what kube-apiserver's mean: after real kubectl traffic, `/metrics`
//! holds the series kube-apiserver's dashboards and alert rules select (`apiserver_request_total`
//! with kube's verb, group, version, resource, scope and component labels; terminations;
//! `aggregator_unavailable_apiservice` for `KubeAggregatedAPIDown`), and no request, however
//! made up, adds a label value of its own.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use e2e::scenario::{self, Scenario};
use http::{Method, Request, StatusCode};
use http_body_util::Full;

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";

/// The `apiserver_request_total` series of `metrics` (label sets, values dropped).
fn request_series(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series.to_owned()))
        .collect()
}

/// Whether some `apiserver_request_total` series carries every one of `labels`.
fn has_series(series: &BTreeSet<String>, labels: &[(&str, &str)]) -> bool {
    series.iter().any(|s| {
        labels
            .iter()
            .all(|(k, v)| s.contains(&format!("{k}=\"{v}\"")))
    })
}

const FLUNDER: &str = r#"apiVersion: wardle.example.com/v1alpha1
kind: Flunder
metadata:
  name: metered
  namespace: default
"#;

#[tokio::test]
async fn kubectl_traffic_is_counted_under_kube_apiservers_labels() {
    let s = Scenario::wardle().start().await;
    let alice = s.user("alice", &["dev"]);
    let kubectl = s.kubectl(&alice);
    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    scenario::wait_for_apiservice_row(&kubectl, NAME, "True", Duration::from_secs(10)).await;

    kubectl
        .run_with_input(&["apply", "--server-side", "-f", "-"], FLUNDER)
        .await;
    kubectl.run_ok(&["get", "flunders", "-n", "default"]).await;
    kubectl
        .run_ok(&["get", "flunder", "metered", "-n", "default"])
        .await;
    kubectl
        .run_ok(&["get", "configmaps", "-n", "default"])
        .await;
    kubectl
        .run(&[
            "get",
            "flunders",
            "-n",
            "default",
            "--watch",
            "--request-timeout=1s",
        ])
        .await;

    let series = request_series(&scenario::metrics(&s.gateway).await);
    let wardle = |verb: &'static str, scope: &'static str| {
        vec![
            ("verb", verb),
            ("group", GROUP),
            ("version", "v1alpha1"),
            ("resource", "flunders"),
            ("scope", scope),
            ("component", "aggregator"),
        ]
    };
    for (what, labels) in [
        ("kubectl apply --server-side", wardle("APPLY", "resource")),
        ("kubectl get flunders", wardle("LIST", "namespace")),
        ("kubectl get flunder metered", wardle("GET", "resource")),
        ("kubectl get flunders --watch", wardle("WATCH", "namespace")),
        (
            "kubectl get configmaps",
            vec![
                ("verb", "LIST"),
                ("group", ""),
                ("version", "v1"),
                ("resource", "configmaps"),
                ("scope", "namespace"),
                ("component", "apiserver"),
                ("code", "200"),
            ],
        ),
    ] {
        assert!(
            has_series(&series, &labels),
            "{what}: no series with {labels:?} in\n{}",
            series.iter().cloned().collect::<Vec<_>>().join("\n")
        );
    }
    // The labels kube-apiserver's series carry, no more and no fewer (KubeAPIErrorBudgetBurn
    // and the apiserver dashboards group by them).
    let first = series.iter().next().unwrap();
    for label in [
        "verb=",
        "dry_run=",
        "group=",
        "version=",
        "resource=",
        "subresource=",
        "scope=",
        "component=",
        "code=",
        "system_client=",
    ] {
        assert!(first.contains(label), "{label} missing from {first}");
    }
    assert!(!first.contains("target="), "{first}");
}

/// A stopped backend: the 503s are the aggregator's terminations, and the series
/// `KubeAggregatedAPIDown` and `KubeAggregatedAPIErrors` select are there.
#[tokio::test]
async fn an_unreachable_apiservice_shows_in_the_series_kubes_alerts_select() {
    let mut s = Scenario::wardle().start().await;
    let alice = s.user("alice", &["dev"]);
    let kubectl = s.kubectl(&alice);
    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    scenario::wait_for_apiservice_row(&kubectl, NAME, "True", Duration::from_secs(10)).await;
    s.backend_mut("wardle").process.kill();
    scenario::wait_for_apiservice_row(&kubectl, NAME, "False", Duration::from_secs(15)).await;
    // kubectl finds no flunders in discovery any more (the group is Stale); a client that
    // kept the path still asks.
    let (status, _) = s
        .get(
            &alice,
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let metrics = scenario::metrics(&s.gateway).await;
    let terminated = metrics.lines().any(|l| {
        l.starts_with("apiserver_request_terminations_total{")
            && l.contains(r#"code="503""#)
            && l.contains(r#"component="aggregator""#)
            && l.contains(r#"resource="flunders""#)
            && l.contains(r#"verb="LIST""#)
    });
    assert!(terminated, "no aggregator termination in\n{metrics}");
    assert!(
        metrics.contains(&format!(
            "aggregator_unavailable_apiservice{{name=\"{NAME}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "aggregator_unavailable_apiservice_total{{name=\"{NAME}\",reason=\"FailedDiscoveryCheck\"}}"
        )),
        "{metrics}"
    );
}

/// Made-up methods, groups, resources and paths from an anonymous client: the number of
/// series stays where it was after the first of each kind, and the made-up names show up as
/// `other`, never as themselves.
#[tokio::test]
async fn made_up_requests_add_no_label_values() {
    let s = Scenario::wardle().start().await;
    let client = s.gateway.http1_client(None);
    let send = |method: String, path: String| {
        let client = client.clone();
        let url = format!("{}{path}", s.gateway.url());
        async move {
            let req = Request::builder()
                .method(Method::from_bytes(method.as_bytes()).unwrap())
                .uri(url)
                .body(Full::new(Bytes::new()))
                .unwrap();
            e2e::harness::send(&client, req).await.unwrap().0
        }
    };
    let round = |n: usize| {
        let send = &send;
        async move {
            for i in 0..n {
                send(format!("MADEUP{i}"), "/api/v1/namespaces".into()).await;
                send(
                    "GET".into(),
                    format!("/apis/made-up-{i}.example.com/v1/things{i}"),
                )
                .await;
                send(
                    "GET".into(),
                    format!("/api/v1/namespaces/default/things{i}"),
                )
                .await;
                send("GET".into(), format!("/made/up/{i}")).await;
            }
        }
    };
    // The first of each kind, twice: once to meet the discovery the gateway starts with, once
    // more with `/metrics` itself counted.
    round(1).await;
    scenario::metrics(&s.gateway).await;
    round(1).await;
    let before = request_series(&scenario::metrics(&s.gateway).await);
    round(200).await;
    let metrics = scenario::metrics(&s.gateway).await;
    let after = request_series(&metrics);
    let added: Vec<_> = after.difference(&before).collect();
    assert!(added.is_empty(), "new series: {added:?}");
    assert!(
        !metrics.contains("MADEUP"),
        "a made-up method became a label"
    );
    assert!(
        !metrics.contains("made-up-"),
        "a made-up group became a label"
    );
    assert!(
        !metrics.contains("things"),
        "a made-up resource became a label"
    );
    assert!(
        !metrics.contains("/made/up"),
        "a made-up path became a label"
    );
    assert!(has_series(&after, &[("verb", "other")]), "{after:?}");
    assert_eq!(send("GET".into(), "/healthz".into()).await, StatusCode::OK);
}
