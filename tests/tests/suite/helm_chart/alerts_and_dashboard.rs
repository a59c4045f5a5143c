//! The optional PrometheusRule and Grafana dashboard: they follow their switches, the rules pass
//! `promtool check rules` and fire as `alerts.promtool.yaml` says they do (`promtool test rules`),
//! and every series the rules and the dashboard query is one the gateway exports.
//!
//! `promtool` comes with Debian's `prometheus` package, which `.ci/run` installs; without it the
//! promtool test says so and passes, except in CI (`CI=true`), where it fails.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use e2e::helm::{chart_dir, helm_template, label, Rendered, EXAMPLES, FULLNAME, NAMESPACE};
use e2e::table::check_each;

const ON: [&str; 2] = [
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
];

fn dashboard_name() -> String {
    format!("{FULLNAME}-dashboard")
}

/// The rendered dashboard ConfigMap, if any.
fn dashboard_config_map(r: &Rendered) -> Option<&Value> {
    r.all("ConfigMap")
        .into_iter()
        .find(|d| d["metadata"]["name"] == dashboard_name().as_str())
}

/// The dashboard JSON inside the ConfigMap.
fn dashboard(r: &Rendered) -> Value {
    let cm = dashboard_config_map(r).expect("the dashboard ConfigMap is rendered");
    let text = cm["data"]["aggregation-gateway.json"]
        .as_str()
        .expect("the ConfigMap holds aggregation-gateway.json");
    serde_json::from_str(text).expect("the dashboard is JSON")
}

/// Every PromQL expression of the rendered rules.
fn rule_exprs(r: &Rendered) -> Vec<String> {
    let rule = r.all("PrometheusRule")[0];
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|rule| rule["expr"].as_str().unwrap().to_owned())
        .collect()
}

/// Every PromQL expression of the dashboard's panels and variables.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let mut out: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            out.push(query.to_owned());
        }
    }
    out
}

/// The metric names `expr` reads: identifiers of the families the gateway could export (kube's
/// `apiserver_`/`aggregator_` and its own `aggregation_gateway_`), without a histogram's
/// `_bucket`/`_sum`/`_count` suffix.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            ["apiserver_", "aggregator_", "aggregation_gateway_"]
                .iter()
                .any(|p| w.starts_with(p))
        })
        .map(|w| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w)
                .to_owned()
        })
        .collect()
}

#[test]
fn prometheus_rule_and_dashboard_follow_their_switches() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let shown = example == Some("external-core");
            assert_eq!(r.has("PrometheusRule"), shown, "{}", r.names());
            assert_eq!(dashboard_config_map(&r).is_some(), shown, "{}", r.names());
        },
    );
    let r = Rendered::with(
        None,
        &[
            ON[0],
            ON[1],
            "monitoring.prometheusRule.labels.release=prometheus",
            "monitoring.prometheusRule.alertLabels.team=platform",
            "monitoring.grafanaDashboard.annotations.grafana_folder=Kubernetes",
        ],
    );
    let rule = r.all("PrometheusRule")[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let alerts: BTreeSet<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|rule| {
            assert_eq!(rule["labels"]["team"], "platform", "{rule}");
            rule["alert"].as_str().unwrap()
        })
        .collect();
    for alert in [
        "KubeAggregatedAPIErrors",
        "KubeAggregatedAPIDown",
        "AggregationGatewayAPIServiceUnavailable",
        "AggregationGatewayServerErrors",
        "AggregationGatewayInflightSaturation",
        "AggregationGatewayCertificateExpiring",
    ] {
        assert!(alerts.contains(alert), "{alert} missing from {alerts:?}");
    }
    // The rules select this release's series as the ServiceMonitor scrapes them.
    for expr in rule_exprs(&r) {
        assert!(
            expr.contains(&format!("job=\"{FULLNAME}\",namespace=\"{NAMESPACE}\"")),
            "{expr}"
        );
    }
    let cm = dashboard_config_map(&r).unwrap();
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        cm["metadata"]["annotations"]["grafana_folder"],
        "Kubernetes"
    );
    assert_eq!(dashboard(&r)["uid"], "aggregation-gateway");

    // The sidecar's label is the operator's to choose, and so is the ConfigMap's namespace.
    let r = Rendered::with(
        None,
        &[
            ON[1],
            "monitoring.grafanaDashboard.label=dashboards.example.com/load",
            "monitoring.grafanaDashboard.labelValue=yes",
            "monitoring.grafanaDashboard.namespace=monitoring",
        ],
    );
    let cm = dashboard_config_map(&r).unwrap();
    assert_eq!(
        cm["metadata"]["labels"]["dashboards.example.com/load"],
        "yes"
    );
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
}

#[test]
fn monitoring_values_are_schema_checked() {
    check_each(
        [
            (
                "monitoring.prometheusRule.serverErrorRatio=2",
                "monitoring.prometheusRule.serverErrorRatio: Must be less than or equal to 1",
            ),
            (
                "monitoring.prometheusRule.inflightRatio=0",
                "monitoring.prometheusRule.inflightRatio: Must be greater than 0",
            ),
            (
                "monitoring.prometheusRule.certificateExpiryWarningDays=soon",
                "monitoring.prometheusRule.certificateExpiryWarningDays: Invalid type",
            ),
            (
                "monitoring.prometheusRule.enable=true",
                "Additional property enable is not allowed",
            ),
            (
                "monitoring.grafanaDashboard.label=not a label",
                "monitoring.grafanaDashboard.label: Does not match pattern",
            ),
        ],
        |(set, _)| (*set).to_owned(),
        |(set, want)| {
            let err = helm_template(&[], &[set]).expect_err(set);
            assert!(err.contains(want), "{set}: expected {want:?} in:\n{err}");
        },
    );
}

#[test]
fn the_rules_and_the_dashboard_query_only_metrics_the_gateway_exports() {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src/metrics/mod.rs"),
    )
    .unwrap();
    let r = Rendered::with(None, &ON);
    let mut exprs = rule_exprs(&r);
    exprs.extend(dashboard_exprs(&dashboard(&r)));
    assert!(exprs.len() > 15, "{exprs:?}");
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no gateway metric in {expr}");
        queried.extend(names);
    }
    let unknown: Vec<&String> = queried
        .iter()
        .filter(|name| !source.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "queried but not registered in gateway/src/metrics/mod.rs: {unknown:?}"
    );
    // The dashboard's panels are where an operator looks first.
    let dashboard = dashboard(&r);
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for wanted in [
        "Request rate by route",
        "Latency by route (time to response headers)",
        "Errors by route (5xx per second)",
        "Availability per APIService",
    ] {
        assert!(titles.contains(&wanted), "{wanted} missing from {titles:?}");
    }
}

/// `promtool`, or `None` (with the reason printed) when it is not installed outside CI.
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool");
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "promtool is not installed; .ci/run installs Debian's prometheus package, which has it"
    );
    eprintln!(
        "SKIPPED: promtool is not on PATH (apt-get install prometheus); the PrometheusRule was not checked"
    );
    None
}

#[test]
fn the_alert_rules_pass_promtool_and_fire_as_their_unit_tests_say() {
    let Some(promtool) = promtool() else {
        return;
    };
    let r = Rendered::with(None, &[ON[0]]);
    let spec = &r.all("PrometheusRule")[0]["spec"];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.json"), spec.to_string()).unwrap();
    let tests =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/helm_chart/alerts.promtool.yaml");
    std::fs::copy(&tests, dir.path().join("alerts.promtool.yaml")).unwrap();
    for args in [
        ["check", "rules", "rules.json"],
        ["test", "rules", "alerts.promtool.yaml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}\nrules:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            serde_json::to_string_pretty(spec).unwrap()
        );
    }
    assert!(chart_dir()
        .join("dashboards/aggregation-gateway.json")
        .is_file());
}
