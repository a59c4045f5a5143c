//! Well-formed manifests: `helm lint --strict` passes, and every rendered object, for the host
//! cluster or for the core, round-trips through its type ([`super::typed`]), sits in the right
//! namespace and carries the labels that say who manages it.

use std::process::Command;

use serde_json::json;

use e2e::helm::{
    chart_dir, example_file, helm, label, Rendered, EXAMPLES, FULLNAME, NAMESPACE, RELEASE,
};

use super::typed::round_trip_by_kind;
use e2e::table::check_each;

#[test]
fn helm_lint_strict_passes_for_defaults_and_every_example() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let mut cmd = Command::new(helm());
            cmd.args(["lint", "--strict"]).arg(chart_dir());
            if let Some(name) = example {
                cmd.arg("--values").arg(example_file(name));
            }
            let out = cmd.output().expect("run helm lint");
            assert!(
                out.status.success(),
                "helm lint --strict ({}) failed:\n{}{}",
                label(example),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        },
    );
}

#[test]
fn every_rendered_manifest_round_trips_through_its_typed_object() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let rendered = Rendered::of(example);
            assert!(
                rendered.docs.len() >= 5,
                "{}: only {}",
                label(example),
                rendered.names()
            );
            for doc in &rendered.docs {
                if let Err(e) = round_trip_by_kind(doc) {
                    panic!(
                        "{}: {} {}:\n  {e}",
                        label(example),
                        doc["kind"].as_str().unwrap_or("?"),
                        doc["metadata"]["name"].as_str().unwrap_or("?")
                    );
                }
                // Namespaced objects land in the release namespace; cluster-scoped ones have none.
                let cluster_scoped = matches!(
                    doc["kind"].as_str(),
                    Some(
                        "ClusterRole"
                            | "ClusterRoleBinding"
                            | "CustomResourceDefinition"
                            | "APIService"
                            | "FlowSchema"
                            | "PriorityLevelConfiguration"
                    )
                );
                let ns = &doc["metadata"]["namespace"];
                // The one exception: the Role on kube-system/extension-apiserver-authentication
                // (and its binding) lives beside that ConfigMap.
                let authentication_rbac =
                    matches!(doc["kind"].as_str(), Some("Role" | "RoleBinding"))
                        && doc["metadata"]["name"]
                            == format!("{RELEASE}-aggregation-gateway-authentication").as_str();
                if authentication_rbac {
                    assert_eq!(
                        ns,
                        "kube-system",
                        "{}: {} namespace",
                        label(example),
                        doc["kind"]
                    );
                } else if cluster_scoped {
                    assert!(
                        ns.is_null(),
                        "{}: cluster-scoped {} has a namespace",
                        label(example),
                        doc["kind"]
                    );
                } else {
                    assert_eq!(
                        ns,
                        NAMESPACE,
                        "{}: {} namespace",
                        label(example),
                        doc["kind"]
                    );
                }
                let labels = &doc["metadata"]["labels"];
                for key in [
                    "app.kubernetes.io/name",
                    "app.kubernetes.io/instance",
                    "app.kubernetes.io/managed-by",
                    "helm.sh/chart",
                ] {
                    assert!(
                        labels[key].is_string(),
                        "{}: {} lacks label {key}",
                        label(example),
                        doc["kind"]
                    );
                }
            }
        },
    );
}

#[test]
fn the_round_trip_catches_a_misspelled_field() {
    let mut doc = Rendered::of(None)
        .docs
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = json!(5);
    let err = round_trip_by_kind(&doc).unwrap_err();
    assert!(
        err.contains(".spec.template.spec.containers[0].readinessProbe.periodSecond: lost"),
        "{err}"
    );
}
/// Everything in `<fullname>-core` is a valid object of its kind, cluster-scoped (but for the
/// leader-election Lease's Role and RoleBinding, in the Lease's namespace), and not labelled as
/// managed by Helm (Helm never sees the core).
#[test]
fn manifests_for_the_core_round_trip_and_do_not_claim_helm_manages_them() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let manifests = r.core_manifests();
            let want: &[&str] = match example {
                Some("sidecar-core") => &["apiservice-crd.yaml", "apiservices.yaml", "rbac.yaml"],
                Some("external-core") => &["metrics-reader.yaml", "rbac.yaml"],
                // The core's discovery is watched whatever the APIService source.
                Some("file-apiservices") => &["rbac.yaml"],
                _ => &[],
            };
            assert_eq!(
                manifests.keys().collect::<Vec<_>>(),
                want,
                "{}",
                label(example)
            );
            for (key, docs) in &manifests {
                for doc in docs {
                    let ctx = format!("{} {key} {}", label(example), doc["kind"]);
                    round_trip_by_kind(doc).unwrap_or_else(|e| panic!("{ctx}:\n  {e}"));
                    if matches!(doc["kind"].as_str(), Some("Role" | "RoleBinding")) {
                        // The leader-election Lease's, in the release namespace (created on the
                        // core by the same file), and the authentication ConfigMap's.
                        let name = &doc["metadata"]["name"];
                        let namespace = if *name == format!("{FULLNAME}-leader-election") {
                            NAMESPACE
                        } else {
                            assert_eq!(*name, format!("{FULLNAME}-authentication"), "{ctx}");
                            "kube-system"
                        };
                        assert_eq!(doc["metadata"]["namespace"], namespace, "{ctx}");
                    } else {
                        assert!(doc["metadata"]["namespace"].is_null(), "{ctx}");
                    }
                    let labels = doc["metadata"]["labels"].as_object().unwrap();
                    assert_eq!(labels["app.kubernetes.io/instance"], RELEASE, "{ctx}");
                    assert!(
                        !labels.contains_key("app.kubernetes.io/managed-by"),
                        "{ctx}"
                    );
                }
            }
        },
    );
}
