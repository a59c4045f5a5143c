//! The chart on a real API server: installed, upgraded and uninstalled with the real Helm through
//! the gateway into kube-apiserver (every object accepted, RBAC included; no Pod runs, there is
//! no kubelet), and the APIService CRD the chart renders for cores without
//! `apiregistration.k8s.io`, whose CEL rules only a real API server evaluates.

use std::path::Path;
use std::process::Command;

use e2e::harness::Kubectl;
use e2e::helm::{chart_dir, helm, split_documents, Rendered};
use serde_json::Value;

use super::session::Real;

const RELEASE: &str = "edge";
const NAMESPACE: &str = "gateway-system";

/// Runs helm with the kubectl session's kubeconfig and its HOME for Helm's own files.
fn run_helm(kubectl: &Kubectl, args: &[&str]) -> Result<String, String> {
    let home = kubectl.home();
    let out = Command::new(helm())
        .args(args)
        .arg("--kubeconfig")
        .arg(kubectl.kubeconfig())
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("helm-cache"))
        .env("HELM_CONFIG_HOME", home.join("helm-config"))
        .env("HELM_DATA_HOME", home.join("helm-data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("run helm");
    let text = format!(
        "$ helm {}\n{}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(text)
    }
}

pub async fn install_upgrade_uninstall(real: &Real) {
    let (direct, through) = real.admins();
    let chart = chart_dir().display().to_string();
    run_helm(
        &through,
        &[
            "install",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--create-namespace",
        ],
    )
    .unwrap_or_else(|e| panic!("helm install through the gateway failed:\n{e}"));

    let manifest = run_helm(&through, &["get", "manifest", RELEASE, "-n", NAMESPACE]).unwrap();
    let objects = split_documents(&manifest);
    let kinds: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect();
    for kind in [
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
    ] {
        assert!(
            kinds.iter().any(|k| k.starts_with(&format!("{kind}/"))),
            "the default release has a {kind}: {kinds:?}"
        );
    }
    let file = direct.home().join("release.yaml");
    std::fs::write(&file, &manifest).unwrap();
    let file = file.display().to_string();
    let present = direct.run_ok(&["get", "-f", &file, "-o", "name"]).await;
    assert_eq!(
        present.stdout.lines().count(),
        objects.len(),
        "every object of the release exists on kube-apiserver:\n{present}"
    );

    run_helm(
        &through,
        &[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--set",
            "replicaCount=3",
        ],
    )
    .unwrap_or_else(|e| panic!("helm upgrade through the gateway failed:\n{e}"));
    let replicas = direct
        .run_ok(&[
            "get",
            "deployment",
            "edge-aggregation-gateway",
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await;
    assert_eq!(replicas.stdout, "3", "helm upgrade --set replicaCount=3");

    run_helm(&through, &["uninstall", RELEASE, "-n", NAMESPACE])
        .unwrap_or_else(|e| panic!("helm uninstall through the gateway failed:\n{e}"));
    let left = direct
        .run_ok(&["get", "-f", &file, "-o", "name", "--ignore-not-found"])
        .await;
    assert_eq!(
        left.stdout, "",
        "helm uninstall left objects behind:\n{left}"
    );
    let releases = direct
        .run_ok(&[
            "get",
            "secrets",
            "-n",
            NAMESPACE,
            "-l",
            "owner=helm",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        releases.stdout, "",
        "helm uninstall left its release records"
    );
}

/// The group the chart's APIService CRD is installed under: kube-apiserver serves
/// `apiregistration.k8s.io` itself, and a CRD of that group would collide with it.
const TEST_GROUP: &str = "apiregistration.e2e.example.com";

/// The chart's APIService CRD (rendered for a core without `apiregistration.k8s.io`), renamed to
/// [`TEST_GROUP`].
fn renamed_crd() -> Value {
    let rendered = Rendered::of(Some("sidecar-core"));
    let mut manifests = rendered.core_manifests();
    let mut crd = manifests
        .remove("apiservice-crd.yaml")
        .and_then(|docs| docs.into_iter().next())
        .expect("the sidecar-core example renders the APIService CRD");
    crd["metadata"]["name"] = format!("apiservices.{TEST_GROUP}").into();
    crd["spec"]["group"] = TEST_GROUP.into();
    if let Some(annotations) = crd["metadata"]["annotations"].as_object_mut() {
        annotations.remove("api-approved.kubernetes.io");
    }
    crd
}

/// One APIService of the table: its name, spec (JSON), and for a bad one the field and the words
/// kube-aggregator's validation refuses it with.
struct Case {
    name: &'static str,
    spec: Value,
    refused: Option<(&'static str, &'static str)>,
}

fn cases(ca: &str) -> Vec<Case> {
    use serde_json::json;
    let remote = |extra: Value| {
        let mut spec = json!({
            "group": "remote.e2e.example.com", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10,
            "service": {"namespace": "wardle", "name": "api"},
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let local = |extra: Value| {
        let mut spec = json!({
            "group": "local.e2e.example.com", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10,
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let v1_remote = "v1.remote.e2e.example.com";
    let v1_local = "v1.local.e2e.example.com";
    let priority = "must be positive and less than 20000";
    let version_priority = "must be positive and less than 1000";
    let port = "port is not valid: must be between 1 and 65535, inclusive";
    vec![
        Case {
            name: v1_local,
            spec: local(json!({})),
            refused: None,
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"caBundle": ca})),
            refused: None,
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"insecureSkipTLSVerify": true})),
            refused: None,
        },
        Case {
            name: "v1.other.e2e.example.com",
            spec: remote(json!({})),
            refused: Some((
                "metadata.name",
                "must be `spec.version+\".\"+spec.group`: \"v1.remote.e2e.example.com\"",
            )),
        },
        Case {
            name: "v2.",
            spec: local(json!({"group": "", "version": "v2"})),
            refused: Some((
                "spec.group",
                "only v1 may have an empty group and it better be legacy kube",
            )),
        },
        Case {
            name: "v1.Bad_Group",
            spec: local(json!({"group": "Bad_Group"})),
            refused: Some((
                "spec.group",
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters",
            )),
        },
        Case {
            name: "V1.local.e2e.example.com",
            spec: local(json!({"version": "V1"})),
            refused: Some((
                "spec.version",
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-'",
            )),
        },
        Case {
            name: v1_local,
            spec: local(json!({"groupPriorityMinimum": 0})),
            refused: Some(("spec.groupPriorityMinimum", priority)),
        },
        Case {
            name: v1_local,
            spec: local(json!({"groupPriorityMinimum": 20001})),
            refused: Some(("spec.groupPriorityMinimum", priority)),
        },
        Case {
            name: v1_local,
            spec: local(json!({"versionPriority": 0})),
            refused: Some(("spec.versionPriority", version_priority)),
        },
        Case {
            name: v1_local,
            spec: local(json!({"versionPriority": 1001})),
            refused: Some(("spec.versionPriority", version_priority)),
        },
        Case {
            name: v1_local,
            spec: local(json!({"caBundle": ca})),
            refused: Some(("spec.caBundle", "local APIServices may not have a caBundle")),
        },
        Case {
            name: v1_local,
            spec: local(json!({"insecureSkipTLSVerify": true})),
            refused: Some((
                "spec.insecureSkipTLSVerify",
                "local APIServices may not have insecureSkipTLSVerify",
            )),
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"service": {"name": "api"}})),
            refused: Some(("spec.service.namespace", "Required value")),
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"service": {"namespace": "wardle"}})),
            refused: Some(("spec.service.name", "Required value")),
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"service": {"namespace": "wardle", "name": "api", "port": 0}})),
            refused: Some(("spec.service.port", port)),
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"service": {"namespace": "wardle", "name": "api", "port": 70000}})),
            refused: Some(("spec.service.port", port)),
        },
        Case {
            name: v1_remote,
            spec: remote(json!({"caBundle": ca, "insecureSkipTLSVerify": true})),
            refused: Some((
                "spec.insecureSkipTLSVerify",
                "may not be true if caBundle is present",
            )),
        },
    ]
}

/// `kubectl apply --dry-run=server` of an APIService of `api_version`: Ok, or kubectl's error.
async fn dry_run(
    kubectl: &Kubectl,
    dir: &Path,
    api_version: &str,
    case: &Case,
) -> Result<(), String> {
    let object = serde_json::json!({
        "apiVersion": api_version,
        "kind": "APIService",
        "metadata": {"name": case.name},
        "spec": case.spec,
    });
    let file = dir.join("apiservice.json");
    std::fs::write(&file, object.to_string()).unwrap();
    let out = kubectl
        .run(&[
            "apply",
            "--dry-run=server",
            "-f",
            &file.display().to_string(),
        ])
        .await;
    if out.success() {
        Ok(())
    } else {
        Err(out.stderr)
    }
}

pub async fn apiservice_crd(real: &Real) {
    let admin = real.plane.admin();
    let crd = renamed_crd();
    let file = admin.home().join("apiservice-crd.json");
    std::fs::write(&file, crd.to_string()).unwrap();
    admin
        .run_ok(&["apply", "-f", &file.display().to_string()])
        .await;
    admin
        .run_ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/apiservices.{TEST_GROUP}"),
            "--timeout=30s",
        ])
        .await;

    let ca = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        real.plane.pki.wardle_ca.cert_pem(),
    );
    let mut failures = Vec::new();
    let cases = cases(&ca);
    for (row, case) in cases.iter().enumerate() {
        let label = format!("row {row} ({} {})", case.name, case.spec);
        // kube-aggregator's own validation on the real API is the oracle for every row.
        let real_api = dry_run(&admin, admin.home(), "apiregistration.k8s.io/v1", case).await;
        let crd = dry_run(&admin, admin.home(), &format!("{TEST_GROUP}/v1"), case).await;
        match (&case.refused, real_api, crd) {
            (None, Ok(()), Ok(())) => {}
            (Some((field, words)), Err(kube), Err(ours)) => {
                for (who, text) in [("kube-aggregator", &kube), ("the CRD", &ours)] {
                    if !(text.contains(field) && text.contains(words)) {
                        failures.push(format!(
                            "{label}: {who} must refuse it naming {field} with {words:?}; said: {text}"
                        ));
                    }
                }
                if !ours.contains("is invalid") {
                    failures.push(format!("{label}: the CRD's refusal is not a 422: {ours}"));
                }
            }
            (want, kube, ours) => failures.push(format!(
                "{label}: expected {}, kube-aggregator said {kube:?}, the CRD said {ours:?}",
                if want.is_some() {
                    "a refusal"
                } else {
                    "acceptance"
                }
            )),
        }
    }

    // `port` defaults to 443, as the built-in type's does.
    let defaulted = dry_run_output(&admin, &format!("{TEST_GROUP}/v1"), &cases[1]).await;
    if defaulted["spec"]["service"]["port"] != 443 {
        failures.push(format!(
            "an APIService without a port gets 443: {defaulted}"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows differ from kube-aggregator:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    printed_as_the_built_in_api(real, &admin).await;
}

/// `kubectl get apiservices` of the CRD through the gateway prints the built-in API's columns:
/// SERVICE `namespace/name` or `Local`, AVAILABLE `True`, `False (Reason)` or `Unknown`. Directly
/// against the core the CRD prints the parts (the name, the bare status).
async fn printed_as_the_built_in_api(real: &Real, admin: &Kubectl) {
    use serde_json::json;
    let (_, through) = real.admins();
    let resource = format!("apiservices.{TEST_GROUP}");
    let objects = [
        (
            "v1.remote.e2e.example.com",
            json!({"group": "remote.e2e.example.com", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10,
            "service": {"namespace": "wardle", "name": "api"}}),
            Some(("False", "FailedDiscoveryCheck")),
        ),
        (
            "v1.local.e2e.example.com",
            json!({"group": "local.e2e.example.com", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10}),
            Some(("True", "Local")),
        ),
        (
            "v2.remote.e2e.example.com",
            json!({"group": "remote.e2e.example.com", "version": "v2",
            "groupPriorityMinimum": 100, "versionPriority": 10,
            "service": {"namespace": "other", "name": "svc"}}),
            None,
        ),
    ];
    for (name, spec, status) in &objects {
        let object = json!({"apiVersion": format!("{TEST_GROUP}/v1"), "kind": "APIService",
            "metadata": {"name": name}, "spec": spec});
        let file = admin.home().join(format!("{name}.json"));
        std::fs::write(&file, object.to_string()).unwrap();
        admin
            .run_ok(&["apply", "-f", &file.display().to_string()])
            .await;
        if let Some((status, reason)) = status {
            let patch = json!({"status": {"conditions": [{"type": "Available", "status": status,
                "reason": reason, "message": "set by the test",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
            admin
                .run_ok(&[
                    "patch",
                    &resource,
                    name,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &patch.to_string(),
                ])
                .await;
        }
    }
    let words = |out: &str| -> Vec<String> {
        out.lines()
            .map(|l| {
                // AGE is the last column and changes with time.
                let mut w: Vec<&str> = l.split_whitespace().collect();
                w.pop();
                w.join(" ")
            })
            .collect()
    };
    // The layout is the built-in API's, as kube-apiserver prints it for its own APIServices.
    let builtin = admin
        .run_ok(&["get", "apiservices.apiregistration.k8s.io"])
        .await;
    let through_gateway = through.run_ok(&["get", &resource]).await;
    let got = words(&through_gateway.stdout);
    assert_eq!(
        got.first(),
        words(&builtin.stdout).first(),
        "the header through the gateway is not kube-apiserver's:\n{through_gateway}\n{builtin}"
    );
    assert_eq!(
        got[1..],
        [
            "v1.local.e2e.example.com Local True",
            "v1.remote.e2e.example.com wardle/api False (FailedDiscoveryCheck)",
            "v2.remote.e2e.example.com other/svc Unknown",
        ],
        "kubectl get {resource} through the gateway:\n{through_gateway}"
    );
    // Directly, the CRD's own columns: the parts, which only the gateway joins.
    let direct = admin.run_ok(&["get", &resource]).await;
    assert!(
        words(&direct.stdout).contains(&"v1.remote.e2e.example.com api False".to_owned()),
        "directly the CRD prints the Service's name and the bare status:\n{direct}"
    );
    for (name, ..) in &objects {
        admin.run_ok(&["delete", &resource, name]).await;
    }
}

async fn dry_run_output(kubectl: &Kubectl, api_version: &str, case: &Case) -> Value {
    let object = serde_json::json!({
        "apiVersion": api_version,
        "kind": "APIService",
        "metadata": {"name": case.name},
        "spec": case.spec,
    });
    let file = kubectl.home().join("defaulted.json");
    std::fs::write(&file, object.to_string()).unwrap();
    let out = kubectl
        .run_ok(&[
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            &file.display().to_string(),
        ])
        .await;
    serde_json::from_str(&out.stdout).unwrap_or(Value::Null)
}
