//! Each shape used as a user would: every Pod Ready with no `Forbidden` and no restart, then
//! kubectl through the gateway's Service: api-resources, sample-apiserver registered with
//! `kubectl apply` through the gateway, flunders created and listed, merged discovery equal to
//! the core's plus wardle's; then day 2 ([`super::day2`]).

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::checks;
use e2e::harness::wait_until;
use e2e::table::run_checks;
use serde_json::Value;

use super::shapes::{pod_report, Core, Installed, NAMESPACE, RELEASE};
use super::wardle;
use super::{authentication, day2};

const ONLY: &str = "REAL_NODE_CHECKS";

/// Runs the checks that apply to the installed shape; one line per failure.
pub async fn run(label: &str, installed: &Installed<'_>) -> Vec<String> {
    let mut failures = run_checks(
        label,
        ONLY,
        installed,
        checks![
            "every Pod Ready, no restart, no Forbidden in any container's log" => pods_ready_clean,
            "kubectl api-resources through the gateway" => api_resources,
            "sample-apiserver registered through the gateway; flunders created and listed" =>
                register_wardle_and_use_flunders,
            "merged discovery is the core's plus wardle's" => merged_discovery,
        ],
    )
    .await;
    match installed.shape.core {
        Core::Cluster => {
            failures.extend(
                run_checks(
                    label,
                    ONLY,
                    installed,
                    checks![
                        "priority and fairness on in the gateway, by the core's configuration" =>
                            priority_and_fairness_follows_the_core,
                        "rollout restart, helm upgrade and drain (PDB) under kubectl and watch load lose no request" =>
                            day2::restart_upgrade_drain_under_load,
                        "the chart's authentication config: ServiceAccount tokens verified as JWTs, the file reloaded without a roll" =>
                            authentication::service_account_tokens_verified_as_jwts_and_reloaded,
                    ],
                )
                .await,
            );
        }
        Core::KubeApiserverSidecar { .. } => {
            failures.extend(
                run_checks(
                    label,
                    ONLY,
                    installed,
                    checks![
                        "priority and fairness on in the gateway, by the core's configuration" =>
                            priority_and_fairness_follows_the_core,
                        "rollout restart, helm upgrade and drain (PDB) under kubectl and watch load lose no request" =>
                            day2::restart_upgrade_drain_under_load,
                        "the core outlives the gateway's drain" => day2::core_outlives_the_drain,
                        "readiness fails and liveness does not while the core is down" =>
                            day2::readiness_follows_the_core,
                    ],
                )
                .await,
            );
        }
        Core::CrdFixture => {}
    }
    // The e2e Aggregator test registers this APIService itself.
    let _ = installed
        .kubectl
        .run(&[
            "delete",
            "apiservice",
            wardle::APISERVICE,
            "--ignore-not-found",
        ])
        .await;
    failures
}

async fn pods_ready_clean(installed: &Installed<'_>) {
    let admin = installed.node.cluster.admin();
    let pods = admin
        .run_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "-o",
            "json",
        ])
        .await;
    let pods: Value = serde_json::from_str(&pods.stdout).unwrap();
    let items = pods["items"].as_array().unwrap();
    assert!(!items.is_empty(), "no Pods");
    for pod in items {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let ready = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{name} is not Ready:\n{}", pod_report(&admin).await);
        for status in ["containerStatuses", "initContainerStatuses"] {
            for c in pod["status"][status].as_array().into_iter().flatten() {
                assert_eq!(
                    c["restartCount"],
                    0,
                    "{name}/{} restarted:\n{}",
                    c["name"],
                    pod_report(&admin).await
                );
            }
        }
        let logs = admin
            .run_ok(&["-n", NAMESPACE, "logs", name, "--all-containers"])
            .await;
        let forbidden: Vec<&str> = logs
            .stdout
            .lines()
            .filter(|l| l.contains("orbidden"))
            .collect();
        assert!(
            forbidden.is_empty(),
            "{name}: Forbidden in the logs:\n{}",
            forbidden.join("\n")
        );
    }
}

/// The groups (and resources) a kubectl session lists.
async fn resources(kubectl: &e2e::harness::Kubectl) -> BTreeSet<String> {
    kubectl
        .run_ok(&["api-resources", "--no-headers", "-o", "name"])
        .await
        .stdout
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn api_resources(installed: &Installed<'_>) {
    let through = resources(&installed.kubectl).await;
    match installed.shape.core {
        Core::CrdFixture => {
            for want in [
                "apiservices.apiregistration.k8s.io",
                "customresourcedefinitions.apiextensions.k8s.io",
            ] {
                assert!(through.contains(want), "{want} missing: {through:?}");
            }
        }
        _ => {
            let direct = resources(&installed.node.cluster.admin()).await;
            assert_eq!(
                through, direct,
                "api-resources through the gateway vs directly"
            );
        }
    }
}

async fn register_wardle_and_use_flunders(installed: &Installed<'_>) {
    let k = &installed.kubectl;
    k.apply_yaml(&wardle::apiservice(&installed.node.cluster))
        .await;
    let served = wait_until(Duration::from_secs(60), || async {
        k.run(&["get", "flunders", "-A"]).await.success()
    })
    .await;
    assert!(
        served,
        "flunders not served through the gateway within 60 s:\n{}",
        k.run(&["get", "flunders", "-A"]).await
    );
    k.apply_yaml(
        "apiVersion: wardle.example.com/v1alpha1\nkind: Flunder\nmetadata: {name: through-the-gateway, namespace: default}\n",
    )
    .await;
    let listed = k
        .run_ok(&["get", "flunders", "-n", "default", "-o", "name"])
        .await;
    assert!(
        listed
            .stdout
            .contains("flunder.wardle.example.com/through-the-gateway"),
        "{listed}"
    );
    k.run_ok(&["delete", "flunder", "through-the-gateway", "-n", "default"])
        .await;
}

/// The group names of a `/apis` document (legacy discovery).
async fn groups(kubectl: &e2e::harness::Kubectl) -> Vec<String> {
    let apis = kubectl.run_ok(&["get", "--raw", "/apis"]).await;
    let apis: Value = serde_json::from_str(&apis.stdout).unwrap();
    apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn merged_discovery(installed: &Installed<'_>) {
    let through = groups(&installed.kubectl).await;
    assert!(through.contains(&wardle::GROUP.to_owned()), "{through:?}");
    match installed.shape.core {
        // The core is this cluster, whose own aggregator serves wardle too: the same document.
        Core::Cluster | Core::KubeApiserverSidecar { .. } => {
            let direct = groups(&installed.node.cluster.admin()).await;
            assert_eq!(
                through, direct,
                "/apis through the gateway vs kube-apiserver's"
            );
        }
        Core::CrdFixture => {
            let without: Vec<&String> = through.iter().filter(|g| *g != wardle::GROUP).collect();
            for want in ["apiextensions.k8s.io", "apiregistration.k8s.io"] {
                assert!(without.iter().any(|g| *g == want), "{want}: {through:?}");
            }
        }
    }
}

/// The chart turns API Priority and Fairness on (`limits.enablePriorityAndFairness`) and lets the
/// gateway read the core's FlowSchemas and PriorityLevelConfigurations: a priority level created
/// on the core shows up in every replica's own `apiserver_flowcontrol_*` metrics (told from the
/// core's by the gateway's `aggregation_gateway_*` families in the same document). With the
/// watch refused, the gateway would keep kube's built-in levels and never list this one.
async fn priority_and_fairness_follows_the_core(installed: &Installed<'_>) {
    const LEVEL: &str = "real-node-apf-check";
    let k = &installed.kubectl;
    k.apply_yaml(&format!(
        "apiVersion: flowcontrol.apiserver.k8s.io/v1\nkind: PriorityLevelConfiguration\n\
         metadata: {{name: {LEVEL}}}\n\
         spec: {{type: Limited, limited: {{nominalConcurrencyShares: 1, \
         limitResponse: {{type: Reject}}}}}}\n"
    ))
    .await;
    let series = format!("apiserver_flowcontrol_nominal_limit_seats{{priority_level=\"{LEVEL}\"}}");
    let has_level = |metrics: &str| {
        metrics.contains("aggregation_gateway_") && metrics.lines().any(|l| l.starts_with(&series))
    };
    // The Service spreads the requests over the replicas: every answer in a row must have it.
    let in_a_row = std::cell::Cell::new(0);
    let seen = wait_until(Duration::from_secs(20), || async {
        let out = k.run(&["get", "--raw", "/metrics"]).await;
        let listed = out.success() && has_level(&out.stdout);
        in_a_row.set(if listed { in_a_row.get() + 1 } else { 0 });
        in_a_row.get() >= 8
    })
    .await;
    let last = k.run(&["get", "--raw", "/metrics"]).await;
    let _ = k
        .run(&[
            "delete",
            "prioritylevelconfiguration",
            LEVEL,
            "--ignore-not-found",
        ])
        .await;
    let flowcontrol: Vec<&str> = last
        .stdout
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_nominal_limit_seats"))
        .collect();
    assert!(
        seen,
        "the gateway's metrics never listed the core's new priority level {LEVEL} in 8 answers \
         in a row (APF off, or the FlowSchema/PLC watch refused); last answer's levels:\n{}",
        flowcontrol.join("\n")
    );
}
