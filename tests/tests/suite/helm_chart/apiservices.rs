//! APIServices in the chart: the APIService CRD for a core without apiregistration.k8s.io, the
//! file source's manifests in a mounted ConfigMap, and the kube source's objects, each rendered
//! where it belongs (the host cluster or `<fullname>-core`) and refused where it makes no sense.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::Value;

use e2e::helm::{
    example_file, helm_template, label, Rendered, CONFIG_DIR, EXAMPLES, FULLNAME, RELEASE,
};

use super::typed::round_trip;
use e2e::table::check_each;

/// The CRD is for a core without apiregistration.k8s.io, which Helm never reaches: it is rendered
/// into `<fullname>-core` for the user to apply there, and never installed into the host cluster,
/// whose kube-apiserver has APIService built in.
#[test]
fn the_apiservice_crd_is_rendered_for_the_core_only_with_status_and_printer_columns() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            assert!(
                !r.has("CustomResourceDefinition"),
                "{}: a CRD in the host cluster",
                label(example)
            );
            let manifests = r.core_manifests();
            if example != Some("sidecar-core") {
                assert!(
                    !manifests.contains_key("apiservice-crd.yaml"),
                    "{}",
                    label(example)
                );
                return;
            }
            let docs = &manifests["apiservice-crd.yaml"];
            assert_eq!(docs.len(), 1);
            let crd: CustomResourceDefinition = serde_json::from_value(docs[0].clone()).unwrap();
            assert_eq!(
                crd.metadata.name.as_deref(),
                Some("apiservices.apiregistration.k8s.io")
            );
            assert_eq!(crd.spec.group, "apiregistration.k8s.io");
            assert_eq!(crd.spec.scope, "Cluster");
            assert_eq!(crd.spec.names.kind, "APIService");
            let annotations = crd.metadata.annotations.unwrap();
            assert!(
                annotations["api-approved.kubernetes.io"].starts_with("unapproved"),
                "*.k8s.io groups need it"
            );
            // Helm does not manage it on the core, so nothing claims it does.
            assert!(!annotations.contains_key("helm.sh/resource-policy"));
            let labels = crd.metadata.labels.unwrap();
            assert!(
                !labels.contains_key("app.kubernetes.io/managed-by")
                    && !labels.contains_key("helm.sh/chart")
            );
            assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
            let v1 = &crd.spec.versions[0];
            assert_eq!(
                (v1.name.as_str(), v1.served, v1.storage),
                ("v1", true, true)
            );
            assert!(
                v1.subresources.as_ref().unwrap().status.is_some(),
                "status subresource"
            );
            let columns: Vec<(&str, &str)> = v1
                .additional_printer_columns
                .as_ref()
                .unwrap()
                .iter()
                .map(|c| (c.name.as_str(), c.json_path.as_str()))
                .collect();
            assert_eq!(
                columns,
                [
                    ("Service", ".spec.service.name"),
                    (
                        "Available",
                        ".status.conditions[?(@.type==\"Available\")].status"
                    ),
                    ("Age", ".metadata.creationTimestamp"),
                    // The parts the gateway joins into kube's SERVICE and AVAILABLE cells
                    // (gateway/src/handlers/apiservice_printing.rs looks for these names).
                    ("Service Namespace", ".spec.service.namespace"),
                    (
                        "Reason",
                        ".status.conditions[?(@.type==\"Available\")].reason"
                    ),
                ]
            );
            let schema = serde_json::to_value(
                v1.schema
                    .as_ref()
                    .unwrap()
                    .open_api_v3_schema
                    .as_ref()
                    .unwrap(),
            )
            .unwrap();
            let spec = &schema["properties"]["spec"]["properties"];
            for field in [
                "group",
                "version",
                "groupPriorityMinimum",
                "versionPriority",
                "caBundle",
                "insecureSkipTLSVerify",
                "service",
            ] {
                assert!(spec[field].is_object(), "CRD schema lacks spec.{field}");
            }
        },
    );

    // Where it makes no sense it is refused, saying why.
    let cases: [(Option<&str>, &[&str], &str); 3] = [
        (
            None,
            &["crd.create=true"],
            "is this cluster's kube-apiserver, which serves APIService itself",
        ),
        (
            Some("external-core"),
            &[
                "crd.create=true",
                "core.url=https://kubernetes.default.svc.cluster.local:443",
            ],
            "is this cluster's kube-apiserver",
        ),
        (
            Some("file-apiservices"),
            &["crd.create=true"],
            "crd.create needs apiServices.source kube",
        ),
    ];
    check_each(
        cases,
        |(example, sets, _)| format!("{} {sets:?}", label(*example)),
        |(example, sets, want)| {
            let files: Vec<PathBuf> = example.map(example_file).into_iter().collect();
            let err = helm_template(&files, sets).expect_err(&format!("{sets:?} must be refused"));
            assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
        },
    );
}

#[test]
fn file_source_apiservices_are_rendered_into_a_mounted_configmap() {
    let r = Rendered::of(Some("file-apiservices"));
    assert!(
        !r.has("APIService"),
        "file source: APIServices are files, not objects"
    );
    let cm: ConfigMap = r.get("ConfigMap", &format!("{FULLNAME}-apiservices"));
    let data = cm.data.unwrap();
    let keys: Vec<&str> = data.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "v1.local.example.com.yaml",
            "v1alpha1.wardle.example.com.yaml",
            "v1beta1.wardle.example.com.yaml"
        ]
    );
    for (key, text) in &data {
        let doc: Value = serde_saphyr::from_str(text).unwrap();
        round_trip::<APIService>(&doc).unwrap_or_else(|e| panic!("{key}: {e}"));
        let api: APIService = serde_json::from_value(doc).unwrap();
        let spec = api.spec.unwrap();
        assert_eq!(format!("{}.yaml", api.metadata.name.unwrap()), *key);
        assert_eq!(
            key,
            &format!("{}.{}.yaml", spec.version.unwrap(), spec.group.unwrap())
        );
    }
    let beta: APIService =
        serde_saphyr::from_str(&data["v1beta1.wardle.example.com.yaml"]).unwrap();
    let spec = beta.spec.unwrap();
    assert_eq!(
        (spec.group_priority_minimum, spec.version_priority),
        (1000, 20)
    );
    let svc = spec.service.unwrap();
    assert_eq!(
        (svc.namespace.as_deref(), svc.name.as_deref(), svc.port),
        (Some("wardle"), Some("api"), Some(443))
    );
    assert!(spec
        .ca_bundle
        .unwrap()
        .0
        .starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert_eq!(
        beta.metadata.labels.unwrap()["gateway.example.com/owner"],
        "edge"
    );
    let local: APIService = serde_saphyr::from_str(&data["v1.local.example.com.yaml"]).unwrap();
    assert!(
        local.spec.unwrap().service.is_none(),
        "a group the core serves itself has no service"
    );

    let config = r.config();
    assert_eq!(config["apiserviceSource"], "file");
    assert_eq!(config["apiserviceDir"], format!("{CONFIG_DIR}/apiservices"));
    assert_eq!(config["services"][0]["urls"][1], "https://10.0.0.8:8443");
    // The gateway reloads the directory; changing an APIService must not roll the Pods.
    let changed = Rendered::with(
        Some("file-apiservices"),
        &["apiServices.items[0].versionPriority=99"],
    );
    let checksum = |r: &Rendered| {
        r.deployment()
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()["checksum/config"]
            .clone()
    };
    assert_eq!(checksum(&r), checksum(&changed));
}

#[test]
fn kube_source_apiservices_can_be_rendered_as_objects() {
    let r = Rendered::of(Some("cert-manager"));
    let api: APIService = r.get("APIService", "v1beta1.metrics.example.com");
    let spec = api.spec.unwrap();
    assert_eq!(
        (spec.group.as_deref(), spec.version.as_deref()),
        (Some("metrics.example.com"), Some("v1beta1"))
    );
    assert_eq!(spec.insecure_skip_tls_verify, Some(true));
    assert!(!r.has("CustomResourceDefinition"));
    assert!(
        r.all("ConfigMap").len() == 1,
        "no APIService ConfigMap with the kube source"
    );
    assert!(
        !Rendered::with(Some("cert-manager"), &["apiServices.createObjects=false"])
            .has("APIService")
    );

    // A core Helm does not reach gets them in `<fullname>-core`; in the host cluster its own
    // kube-aggregator would start routing them.
    let cases = [
        (Some("sidecar-core"), &[][..], "v1alpha1.wardle.example.com"),
        (
            Some("external-core"),
            &[
                "apiServices.createObjects=true",
                "apiServices.items[0].group=metrics.example.com",
                "apiServices.items[0].version=v1beta1",
            ][..],
            "v1beta1.metrics.example.com",
        ),
    ];
    check_each(
        cases,
        |(example, _, _)| label(*example).to_owned(),
        |(example, sets, want)| {
            let r = Rendered::with(example, sets);
            let ctx = label(example);
            assert!(
                !r.has("APIService"),
                "{ctx}: APIService in the host cluster"
            );
            let manifests = r.core_manifests();
            let docs = &manifests["apiservices.yaml"];
            assert_eq!(docs.len(), 1, "{ctx}");
            round_trip::<APIService>(&docs[0]).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(docs[0]["metadata"]["name"], want, "{ctx}");
        },
    );
}
