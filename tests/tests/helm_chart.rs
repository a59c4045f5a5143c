//! The Helm chart (`charts/aggregation-gateway`), checked the way a user meets it: `helm lint
//! --strict` and `helm template` on the default values and on every example values file, then
//! assertions on the rendered objects.
//!
//! - Every manifest parses into its `k8s-openapi` type (or, for cert-manager and prometheus-operator
//!   kinds, a small `deny_unknown_fields` struct of ours) and serializes back to the same JSON, so a
//!   misspelled or misplaced field fails with the path of the lost field.
//! - The gateway container, ports, probes, mounts, security context and RBAC rules are the ones the
//!   gateway needs, and nothing more.
//! - The config rendered into the ConfigMap is accepted by the gateway's own parser and validation,
//!   and by the real binary's `--check-config`.
//! - values.schema.json rejects typos and wrong types with a message naming the field.
//!
//! Needs `helm` on PATH: run `../shared/tools/install-helm` (CI does it in `.ci/run`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

const RELEASE: &str = "edge";
const NAMESPACE: &str = "gateway-system";
const FULLNAME: &str = "edge-aggregation-gateway";
const CONFIG_DIR: &str = "/etc/aggregation-gateway";
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The values files the chart is tested with; `None` is the chart's defaults.
const EXAMPLES: [Option<&str>; 5] = [
    None,
    Some("sidecar-core"),
    Some("external-core"),
    Some("cert-manager"),
    Some("file-apiservices"),
];

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aggregation-gateway")
}

fn example_file(name: &str) -> PathBuf {
    chart_dir().join("examples").join(format!("{name}.yaml"))
}

fn label(example: Option<&str>) -> &str {
    example.unwrap_or("default values")
}

// ---------------------------------------------------------------------------------------------
// Running helm
// ---------------------------------------------------------------------------------------------

fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let found = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("helm"))
                .find(|candidate| candidate.is_file())
        });
        let helm = found.unwrap_or_else(|| {
            panic!("helm is not on PATH: run ../shared/tools/install-helm (it installs Helm 3 into /usr/local/bin)")
        });
        let version = Command::new(&helm).args(["version", "--short"]).output().expect("run helm version");
        let version = String::from_utf8_lossy(&version.stdout);
        assert!(version.starts_with("v3."), "the chart needs Helm 3, found {version:?} at {}", helm.display());
        helm
    })
}

/// `helm template` with the given values files and `--set` overrides: stdout, or stderr on failure.
fn helm_template(files: &[PathBuf], sets: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE]);
    for f in files {
        cmd.arg("--values").arg(f);
    }
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm template");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm output is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The rendered objects of one release.
struct Rendered {
    docs: Vec<Value>,
}

impl Rendered {
    fn of(example: Option<&str>) -> Self {
        Self::with(example, &[])
    }

    fn with(example: Option<&str>, sets: &[&str]) -> Self {
        let files: Vec<PathBuf> = example.map(example_file).into_iter().collect();
        let text = helm_template(&files, sets)
            .unwrap_or_else(|e| panic!("helm template ({}) failed:\n{e}", label(example)));
        Self {
            docs: split_documents(&text),
        }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn get<T: DeserializeOwned>(&self, kind: &str, name: &str) -> T {
        let doc = self
            .docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered; have: {}", self.names()));
        serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
    }

    fn has(&self, kind: &str) -> bool {
        !self.all(kind).is_empty()
    }

    fn names(&self) -> String {
        self.docs
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap_or("?"),
                    d["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn deployment(&self) -> Deployment {
        self.get("Deployment", FULLNAME)
    }

    fn gateway_container(&self) -> Container {
        let pod = self.deployment().spec.template.spec.unwrap();
        pod.containers
            .into_iter()
            .find(|c| c.name == "gateway")
            .expect("a container named gateway")
    }

    /// The `config.yaml` the gateway is started with.
    fn config_text(&self) -> String {
        let cm: ConfigMap = self.get("ConfigMap", FULLNAME);
        cm.data
            .unwrap()
            .remove("config.yaml")
            .expect("config.yaml in the gateway ConfigMap")
    }

    fn config(&self) -> Value {
        serde_saphyr::from_str(&self.config_text()).expect("config.yaml is YAML")
    }

    /// Rules of the ClusterRole installed into the cluster Helm talks to (the "host" cluster).
    fn cluster_role_rules(&self) -> Vec<PolicyRule> {
        cluster_role_rules_of(&self.all("ClusterRole"))
    }

    /// The manifests of the `<fullname>-core` ConfigMap, which are meant for the core server, by
    /// key; empty when the chart renders none.
    fn core_manifests(&self) -> BTreeMap<String, Vec<Value>> {
        let name = format!("{FULLNAME}-core");
        let Some(cm) = self
            .docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name.as_str())
        else {
            return BTreeMap::new();
        };
        cm["data"]
            .as_object()
            .expect("the core ConfigMap has data")
            .iter()
            .map(|(key, text)| (key.clone(), split_documents(text.as_str().unwrap())))
            .collect()
    }

    /// Rules of the ClusterRole meant for the core (`rbac.yaml` of `<fullname>-core`).
    fn core_cluster_role_rules(&self) -> Vec<PolicyRule> {
        let manifests = self.core_manifests();
        let docs = manifests
            .get("rbac.yaml")
            .map(Vec::as_slice)
            .unwrap_or_default();
        cluster_role_rules_of(
            &docs
                .iter()
                .filter(|d| d["kind"] == "ClusterRole")
                .collect::<Vec<_>>(),
        )
    }
}

fn cluster_role_rules_of(roles: &[&Value]) -> Vec<PolicyRule> {
    match roles {
        [] => Vec::new(),
        [one] => serde_json::from_value::<ClusterRole>((*one).clone())
            .unwrap()
            .rules
            .unwrap_or_default(),
        more => panic!("expected one ClusterRole, got {}", more.len()),
    }
}

/// Splits `helm template` output into its YAML documents, parsed into JSON values.
fn split_documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        let has_content = current
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if has_content {
            let value: Value = serde_saphyr::from_str(current)
                .unwrap_or_else(|e| panic!("rendered document is not valid YAML: {e}\n{current}"));
            docs.push(value);
        }
        current.clear();
    };
    for line in text.lines() {
        if line == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

// ---------------------------------------------------------------------------------------------
// Round trip through typed objects
// ---------------------------------------------------------------------------------------------

/// cert-manager's `Certificate`, only the fields the chart may render.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Certificate {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: CertificateSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CertificateSpec {
    secret_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    common_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dns_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip_addresses: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    renew_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    private_key: Option<CertificatePrivateKey>,
    usages: Vec<String>,
    issuer_ref: IssuerRef,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CertificatePrivateKey {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rotation_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encoding: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IssuerRef {
    name: String,
    kind: String,
    group: String,
}

/// prometheus-operator's `ServiceMonitor`, only the fields the chart may render.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace_selector: Option<NamespaceSelector>,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    match_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    any: Option<bool>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MonitorEndpoint {
    port: String,
    path: String,
    scheme: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scrape_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls_config: Option<MonitorTlsConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    authorization: Option<MonitorAuthorization>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MonitorTlsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    insecure_skip_verify: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cert: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_secret: Option<Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MonitorAuthorization {
    r#type: String,
    credentials: SecretKeySelector,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SecretKeySelector {
    name: String,
    key: String,
}

/// Deserializes `doc` into `T`, serializes it back, and reports every field that did not survive.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T =
        serde_json::from_value(doc.clone()).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("does not serialize: {e}"))?;
    let mut diffs = Vec::new();
    diff(&normalize(doc), &normalize(&back), "", &mut diffs);
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n  "))
    }
}

/// k8s-openapi omits `None`, so explicit nulls are dropped; numbers compare by value.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Number(n) => json!(n.as_f64().expect("finite number")),
        other => other.clone(),
    }
}

fn diff(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => diff(va, vb, &p, out),
                    None => out.push(format!(
                        "{p}: lost (not a field of the typed object, misspelled or misplaced?)"
                    )),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: appeared in the round trip"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!(
            "{path}: rendered {a} but the typed object holds {b}"
        )),
    }
}

fn round_trip_by_kind(doc: &Value) -> Result<(), String> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    match kind {
        "Deployment" => round_trip::<Deployment>(doc),
        "Service" => round_trip::<Service>(doc),
        "ServiceAccount" => round_trip::<ServiceAccount>(doc),
        "ConfigMap" => round_trip::<ConfigMap>(doc),
        "ClusterRole" => round_trip::<ClusterRole>(doc),
        "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(doc),
        "Role" => round_trip::<Role>(doc),
        "RoleBinding" => round_trip::<RoleBinding>(doc),
        "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(doc),
        "Ingress" => round_trip::<Ingress>(doc),
        "CustomResourceDefinition" => round_trip::<CustomResourceDefinition>(doc),
        "APIService" => round_trip::<APIService>(doc),
        "Certificate" if doc["apiVersion"] == "cert-manager.io/v1" => {
            round_trip::<Certificate>(doc)
        }
        "ServiceMonitor" if doc["apiVersion"] == "monitoring.coreos.com/v1" => {
            round_trip::<ServiceMonitor>(doc)
        }
        other => Err(format!(
            "kind {other:?} ({}) is not known to this test; add its type",
            doc["apiVersion"]
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Lint and round trip
// ---------------------------------------------------------------------------------------------

#[test]
fn helm_lint_strict_passes_for_defaults_and_every_example() {
    for example in EXAMPLES {
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
    }
}

#[test]
fn every_rendered_manifest_round_trips_through_its_typed_object() {
    for example in EXAMPLES {
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
                )
            );
            let ns = &doc["metadata"]["namespace"];
            if cluster_scoped {
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
    }
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

// ---------------------------------------------------------------------------------------------
// The gateway's Pod
// ---------------------------------------------------------------------------------------------

#[test]
fn gateway_container_serves_https_with_health_probes_and_a_locked_down_context() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let c = r.gateway_container();
        let ctx = label(example);
        let config = r.config();
        let port = config["securePort"].as_i64().unwrap() as i32;

        let image = c.image.as_deref().unwrap();
        assert!(
            image.starts_with("ghcr.io/aggregation-gateway/aggregation-gateway:"),
            "{ctx}: {image}"
        );
        assert_eq!(
            c.args.as_deref(),
            Some(&[format!("--config={CONFIG_DIR}/config.yaml")][..]),
            "{ctx}"
        );
        assert_eq!(
            config["bindAddress"], "0.0.0.0",
            "{ctx}: the gateway must listen beyond loopback in a Pod"
        );

        let ports = c.ports.as_deref().unwrap();
        assert_eq!(ports.len(), 1, "{ctx}");
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].container_port),
            (Some("https"), port),
            "{ctx}"
        );

        for (probe, path) in [
            (&c.startup_probe, "/livez"),
            (&c.liveness_probe, "/livez"),
            (&c.readiness_probe, "/readyz"),
        ] {
            let get = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .unwrap_or_else(|| panic!("{ctx}: {path} probe"));
            assert_eq!(get.path.as_deref(), Some(path), "{ctx}");
            assert_eq!(
                get.scheme.as_deref(),
                Some("HTTPS"),
                "{ctx}: {path} probe scheme"
            );
            assert_eq!(serde_json::to_value(&get.port).unwrap(), "https", "{ctx}");
        }

        // No preStop hook: the gateway keeps serving for shutdownDelayDuration after SIGTERM by
        // itself, so a preStop sleep would only postpone SIGTERM and stack on top of that delay.
        assert!(
            c.lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .is_none(),
            "{ctx}: preStop on the gateway"
        );
        assert_ne!(
            config["shutdownDelayDuration"], "0s",
            "{ctx}: without a preStop the gateway's own delay must be on"
        );

        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{ctx}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{ctx}");
        assert_eq!(sc.run_as_non_root, Some(true), "{ctx}");
        assert_eq!(sc.privileged, Some(false), "{ctx}");
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..]),
            "{ctx}"
        );
        assert_eq!(
            sc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault",
            "{ctx}"
        );
        let pod = r.deployment().spec.template.spec.unwrap();
        let psc = pod.security_context.unwrap();
        assert_eq!(
            (psc.run_as_non_root, psc.run_as_user, psc.run_as_group),
            (Some(true), Some(65532), Some(65532)),
            "{ctx}"
        );
        assert_eq!(
            psc.seccomp_profile.unwrap().type_,
            "RuntimeDefault",
            "{ctx}"
        );

        // A read-only root filesystem needs a writable /tmp (self-signed certs go to certDir there).
        let mounts = c.volume_mounts.clone().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == "/tmp" && m.read_only != Some(true)),
            "{ctx}"
        );
        assert!(
            config["certDir"].as_str().unwrap().starts_with("/tmp/"),
            "{ctx}"
        );

        // The Service exposes that port by name.
        let svc: Service = r.get("Service", FULLNAME);
        let sp = &svc.spec.unwrap().ports.unwrap()[0];
        assert_eq!(
            serde_json::to_value(sp.target_port.as_ref().unwrap()).unwrap(),
            "https",
            "{ctx}"
        );
    }
}

/// Every file the config names is inside a mount of the gateway container, from the volume that
/// should hold it: `<dir>/<name>/<key>` comes from a Secret (or ConfigMap) mounted whole at
/// `<dir>/<name>` (so the kubelet's atomic updates reach the gateway), never through subPath.
#[test]
fn every_path_in_the_config_is_mounted_as_a_directory() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let ctx = label(example);
        let c = r.gateway_container();
        let pod = r.deployment().spec.template.spec.unwrap();
        let volumes: BTreeMap<String, Value> = pod
            .volumes
            .unwrap()
            .into_iter()
            .map(|v| (v.name.clone(), serde_json::to_value(v).unwrap()))
            .collect();
        let mounts = c.volume_mounts.unwrap();
        let config = r.config();
        let config_mount = mounts
            .iter()
            .find(|m| m.mount_path == format!("{CONFIG_DIR}/config.yaml"))
            .unwrap();
        assert_eq!(
            config_mount.sub_path.as_deref(),
            Some("config.yaml"),
            "{ctx}"
        );
        assert_eq!(
            volumes[&config_mount.name]["configMap"]["name"], FULLNAME,
            "{ctx}"
        );

        for (key, value) in config.as_object().unwrap() {
            let Some(path) = value
                .as_str()
                .filter(|p| p.starts_with(CONFIG_DIR) || p.starts_with(SA_DIR))
            else {
                continue;
            };
            if path.starts_with(SA_DIR) {
                assert_eq!(
                    pod.automount_service_account_token,
                    Some(true),
                    "{ctx}: {key} needs the token mounted"
                );
                continue;
            }
            let rel = &path[CONFIG_DIR.len() + 1..];
            let (dir, file) = rel.split_once('/').map_or((rel, ""), |(d, f)| (d, f));
            let mount = mounts
                .iter()
                .find(|m| m.mount_path == format!("{CONFIG_DIR}/{dir}"))
                .unwrap_or_else(|| panic!("{ctx}: {key}={path} is not mounted"));
            assert_eq!(mount.read_only, Some(true), "{ctx}: {key}");
            assert!(
                mount.sub_path.is_none(),
                "{ctx}: {key} mounted with subPath would never see updates"
            );
            let volume = &volumes[&mount.name];
            match (key.as_str(), file) {
                ("apiserviceDir", "") => {
                    assert_eq!(
                        volume["configMap"]["name"],
                        format!("{FULLNAME}-apiservices"),
                        "{ctx}"
                    )
                }
                (_, "tls.crt" | "tls.key" | "ca.crt" | "token") => {
                    assert!(
                        volume["secret"]["secretName"].is_string(),
                        "{ctx}: {key} from {volume}"
                    )
                }
                _ => panic!("{ctx}: {key}={path}: unexpected file name"),
            }
        }
        // And nothing is mounted that the config does not use.
        for m in &mounts {
            let used = m.mount_path == "/tmp"
                || m.mount_path.ends_with("/config.yaml")
                || config
                    .as_object()
                    .unwrap()
                    .values()
                    .any(|v| v.as_str().is_some_and(|p| p.starts_with(&m.mount_path)));
            assert!(used, "{ctx}: {} is mounted but unused", m.mount_path);
        }
    }
}

#[test]
fn the_core_sidecar_is_in_the_pod_only_in_the_sidecar_example() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let pod = r.deployment().spec.template.spec.unwrap();
        let names: Vec<String> = pod.containers.iter().map(|c| c.name.clone()).collect();
        assert_eq!(names, ["gateway"], "{}", label(example));
        let init = pod.init_containers.unwrap_or_default();
        let core_url = r.config()["coreUrl"].as_str().unwrap().to_owned();
        if example == Some("sidecar-core") {
            assert_eq!(init.len(), 1);
            let core = &init[0];
            assert_eq!(core.name, "core");
            // A native sidecar: started before the gateway, stopped after it has drained.
            assert_eq!(core.restart_policy.as_deref(), Some("Always"));
            assert_eq!(
                core.image.as_deref(),
                Some("registry.example.com/my-api-server:1.4.2")
            );
            let port = core.ports.as_ref().unwrap()[0].container_port;
            assert_eq!(core_url, format!("http://127.0.0.1:{port}"));
            assert!(core.startup_probe.is_some() && core.liveness_probe.is_some());
            assert_eq!(core.args.as_ref().unwrap().len(), 3);
        } else {
            assert!(init.is_empty(), "{}", label(example));
            assert!(
                !core_url.contains("127.0.0.1"),
                "{}: {core_url}",
                label(example)
            );
        }
    }

    // As an ordinary container the core is kept alive through the gateway's drain by a preStop sleep.
    let r = Rendered::with(Some("sidecar-core"), &["core.sidecar.native=false"]);
    let pod = r.deployment().spec.template.spec.unwrap();
    assert!(pod.init_containers.unwrap_or_default().is_empty());
    let core = pod
        .containers
        .iter()
        .find(|c| c.name == "core")
        .expect("core container");
    let sleep = core
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .sleep
        .as_ref()
        .unwrap();
    assert_eq!(sleep.seconds, 60, "shutdown delay 15s + timeout 45s");
}

#[test]
fn termination_grace_period_covers_the_shutdown_delay_and_timeout() {
    let cases: [(Option<&str>, &[&str], i64); 4] = [
        (None, &[], 10 + 60 + 5),
        (Some("sidecar-core"), &[], 15 + 45 + 5),
        (
            None,
            &["shutdown.delayDuration=1m30s", "shutdown.timeout=500ms"],
            90 + 1 + 5,
        ),
        (None, &["shutdown.terminationGracePeriodSeconds=300"], 300),
    ];
    for (example, sets, want) in cases {
        let r = Rendered::with(example, sets);
        let pod = r.deployment().spec.template.spec.unwrap();
        assert_eq!(
            pod.termination_grace_period_seconds,
            Some(want),
            "{} {sets:?}",
            label(example)
        );
        let config = r.config();
        let delay: gateway_config::GoDuration = config["shutdownDelayDuration"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let timeout: gateway_config::GoDuration =
            config["shutdownTimeout"].as_str().unwrap().parse().unwrap();
        assert!(
            (delay.0 + timeout.0).as_secs_f64() <= want as f64,
            "{sets:?}"
        );
    }
}

#[test]
fn checksum_annotation_changes_exactly_when_the_config_changes() {
    let checksum = |sets: &[&str]| {
        let d = Rendered::with(None, sets).deployment();
        d.spec.template.metadata.unwrap().annotations.unwrap()["checksum/config"].clone()
    };
    let base = checksum(&[]);
    assert_eq!(base.len(), 64);
    assert_eq!(base, checksum(&[]), "rendering is deterministic");
    assert_ne!(base, checksum(&["limits.maxRequestsInflight=10"]));
    assert_ne!(base, checksum(&["logging.level=debug"]));
    assert_ne!(base, checksum(&["extraConfig.authorizeMetrics=true"]));
    assert_eq!(
        base,
        checksum(&["replicaCount=5"]),
        "a non-config value must not roll the Pods"
    );
}

#[test]
fn pod_scheduling_values_and_disruption_budget() {
    let r = Rendered::of(Some("sidecar-core"));
    let d = r.deployment();
    let spec = d.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let tsc = &pod.topology_spread_constraints.unwrap()[0];
    assert_eq!(tsc.topology_key, "topology.kubernetes.io/zone");
    let selector = tsc
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(
        selector["app.kubernetes.io/instance"], RELEASE,
        "selector labels are filled in"
    );
    assert!(pod.affinity.unwrap().pod_anti_affinity.is_some());

    // nodeSelector, tolerations and the gateway's resources from values reach the Pod spec, and
    // the gateway's resources are not confused with the core sidecar's.
    assert_eq!(
        serde_json::to_value(&pod.node_selector).unwrap(),
        json!({"kubernetes.io/os": "linux", "node-role.example.com/edge": "true"})
    );
    assert_eq!(
        serde_json::to_value(&pod.tolerations).unwrap(),
        json!([{"key": "node-role.example.com/edge", "operator": "Exists", "effect": "NoSchedule"}])
    );
    let gateway = pod.containers.iter().find(|c| c.name == "gateway").unwrap();
    assert_eq!(
        serde_json::to_value(&gateway.resources).unwrap(),
        json!({"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
    );
    let core = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        serde_json::to_value(&core.resources).unwrap(),
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}})
    );
    let defaults = Rendered::of(None).deployment().spec.template.spec.unwrap();
    assert!(defaults.node_selector.is_none() && defaults.tolerations.is_none());

    let pdb: PodDisruptionBudget = r.get("PodDisruptionBudget", FULLNAME);
    let pdb = pdb.spec.unwrap();
    assert_eq!(serde_json::to_value(pdb.max_unavailable).unwrap(), 1);
    assert_eq!(
        pdb.selector.unwrap().match_labels,
        spec.selector.match_labels
    );
    let pdb: PodDisruptionBudget =
        Rendered::of(Some("cert-manager")).get("PodDisruptionBudget", FULLNAME);
    let pdb = pdb.spec.unwrap();
    assert_eq!(
        (
            serde_json::to_value(pdb.min_available).unwrap(),
            pdb.max_unavailable
        ),
        (json!(1), None)
    );
    assert!(
        !Rendered::with(None, &["podDisruptionBudget.enabled=false"]).has("PodDisruptionBudget")
    );

    let svc: Service = r.get("Service", FULLNAME);
    let svc_spec = svc.spec.unwrap();
    assert_eq!(svc_spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        svc.metadata.annotations.unwrap()["service.beta.kubernetes.io/aws-load-balancer-type"],
        "nlb"
    );
}

// ---------------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------------

fn rule(group: &str, resource: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

fn watch_apiservices() -> PolicyRule {
    rule(
        "apiregistration.k8s.io",
        "apiservices",
        &["get", "list", "watch"],
    )
}
fn write_apiservice_status() -> PolicyRule {
    rule(
        "apiregistration.k8s.io",
        "apiservices/status",
        &["update", "patch"],
    )
}
fn watch_services() -> PolicyRule {
    rule("", "services", &["get", "list", "watch"])
}
fn watch_endpointslices() -> PolicyRule {
    rule(
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
    )
}
fn create_tokenreviews() -> PolicyRule {
    rule("authentication.k8s.io", "tokenreviews", &["create"])
}
fn create_subjectaccessreviews() -> PolicyRule {
    rule("authorization.k8s.io", "subjectaccessreviews", &["create"])
}

fn every_rule() -> Vec<PolicyRule> {
    vec![
        watch_apiservices(),
        write_apiservice_status(),
        watch_services(),
        watch_endpointslices(),
        create_tokenreviews(),
        create_subjectaccessreviews(),
    ]
}

/// The gateway makes its own requests (APIService watch and status, Service/EndpointSlice
/// lookups, TokenReviews, SubjectAccessReviews) only to the core, so its rules belong where the
/// identity it presents there is authorized: the host cluster when that identity is the Pod's
/// ServiceAccount, the core otherwise (rendered into `<fullname>-core` for the user to apply).
#[test]
fn rbac_grants_exactly_the_verbs_the_gateway_uses_where_its_identity_is_authorized() {
    /// Example, `--set`s, rules in the host cluster, rules for the core.
    type Case = (
        Option<&'static str>,
        &'static [&'static str],
        Vec<PolicyRule>,
        Vec<PolicyRule>,
    );
    let none = Vec::new;
    let cases: Vec<Case> = vec![
        // The cluster's own API server with the ServiceAccount: everything, in the host cluster.
        (None, &[], every_rule(), none()),
        (Some("cert-manager"), &[], every_rule(), none()),
        // A sidecar reached with a token from a Secret: nothing in the host cluster.
        (Some("sidecar-core"), &[], none(), every_rule()),
        // An external server reached with a client certificate, token webhook off.
        (
            Some("external-core"),
            &[],
            none(),
            vec![
                watch_apiservices(),
                write_apiservice_status(),
                watch_services(),
                watch_endpointslices(),
                create_subjectaccessreviews(),
            ],
        ),
        // File source, static services, both webhooks off: the gateway calls nothing on the core.
        (Some("file-apiservices"), &[], none(), none()),
        (
            Some("file-apiservices"),
            &["serviceResolution.enabled=true"],
            none(),
            vec![watch_services(), watch_endpointslices()],
        ),
        (
            Some("file-apiservices"),
            &[
                "serviceResolution.enabled=true",
                "core.serviceAccountAuth=true",
            ],
            vec![watch_services(), watch_endpointslices()],
            none(),
        ),
        (
            None,
            &["apiServices.source=none"],
            vec![create_tokenreviews(), create_subjectaccessreviews()],
            none(),
        ),
        (
            None,
            &[
                "serviceResolution.enabled=false",
                "authorization.webhook.enabled=false",
            ],
            vec![
                watch_apiservices(),
                write_apiservice_status(),
                create_tokenreviews(),
            ],
            none(),
        ),
        // The host's API server, but as whoever the token Secret holds: the ServiceAccount is
        // never presented, so it gets nothing.
        (
            None,
            &["core.tokenSecret=gateway-token"],
            none(),
            every_rule(),
        ),
        // A sidecar that trusts the host's ServiceAccount tokens (it delegates authn/authz to the
        // host, as aggregated API servers do): the host's RBAC is what authorizes the gateway.
        (
            Some("sidecar-core"),
            &["core.serviceAccountAuth=true", "core.tokenSecret="],
            every_rule(),
            none(),
        ),
        (None, &["rbac.create=false"], none(), none()),
        (Some("sidecar-core"), &["rbac.create=false"], none(), none()),
    ];
    for (example, sets, host, core) in cases {
        let r = Rendered::with(example, sets);
        let ctx = format!("{} {sets:?}", label(example));
        assert_eq!(r.cluster_role_rules(), host, "{ctx}: host cluster rules");
        assert_eq!(
            r.core_cluster_role_rules(),
            core,
            "{ctx}: rules for the core"
        );
        assert!(
            !r.has("Role") && !r.has("RoleBinding"),
            "{ctx}: only cluster-scoped RBAC is needed"
        );
        let pod = r.deployment().spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some(FULLNAME), "{ctx}");

        // Host-cluster RBAC exists exactly when the ServiceAccount token is mounted and is the
        // token the gateway sends; a grant to a token the gateway never presents is an over-grant.
        let token_in_use = r.config()["coreTokenFile"] == format!("{SA_DIR}/token");
        assert_eq!(
            pod.automount_service_account_token,
            Some(token_in_use),
            "{ctx}"
        );
        if host.is_empty() {
            assert!(
                !r.has("ClusterRole") && !r.has("ClusterRoleBinding"),
                "{ctx}: no RBAC in the host cluster, not even an empty role"
            );
        } else {
            assert!(
                token_in_use,
                "{ctx}: host RBAC for an unused ServiceAccount"
            );
            let binding: ClusterRoleBinding = r.get("ClusterRoleBinding", FULLNAME);
            assert_eq!(
                (
                    binding.role_ref.kind.as_str(),
                    binding.role_ref.name.as_str()
                ),
                ("ClusterRole", FULLNAME),
                "{ctx}"
            );
            let subjects = binding.subjects.unwrap();
            assert_eq!(subjects.len(), 1, "{ctx}");
            assert_eq!(
                (
                    subjects[0].kind.as_str(),
                    subjects[0].name.as_str(),
                    subjects[0].namespace.as_deref()
                ),
                ("ServiceAccount", FULLNAME, Some(NAMESPACE)),
                "{ctx}"
            );
        }
        if core.is_empty() {
            assert!(
                !r.core_manifests().contains_key("rbac.yaml"),
                "{ctx}: no RBAC for the core, not even an empty role"
            );
        }
    }
}

/// On the core the gateway is whoever `rbac.coreSubjects` says (the token's user, the
/// certificate's CN): the binding names them, with the apiGroup RBAC requires for users and groups.
#[test]
fn rbac_for_the_core_binds_the_configured_subjects() {
    let manifests = Rendered::of(Some("sidecar-core")).core_manifests();
    let docs = &manifests["rbac.yaml"];
    let binding: ClusterRoleBinding = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "ClusterRoleBinding")
            .expect("a ClusterRoleBinding for the core")
            .clone(),
    )
    .unwrap();
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("ClusterRole", FULLNAME)
    );
    let subjects = binding.subjects.unwrap();
    assert_eq!(
        subjects
            .iter()
            .map(|s| (
                s.kind.as_str(),
                s.name.as_str(),
                s.api_group.as_deref(),
                s.namespace.as_deref()
            ))
            .collect::<Vec<_>>(),
        [(
            "User",
            "edge-gateway",
            Some("rbac.authorization.k8s.io"),
            None
        )]
    );

    let r = Rendered::with(
        Some("sidecar-core"),
        &[
            "rbac.coreSubjects[0].kind=ServiceAccount",
            "rbac.coreSubjects[0].name=gateway",
            "rbac.coreSubjects[0].namespace=platform",
        ],
    );
    let manifests = r.core_manifests();
    let subject = &manifests["rbac.yaml"][1]["subjects"][0];
    assert_eq!(
        subject,
        &json!({"kind": "ServiceAccount", "name": "gateway", "namespace": "platform"})
    );
    let err = helm_template(
        &[example_file("sidecar-core")],
        &[
            "rbac.coreSubjects[0].kind=ServiceAccount",
            "rbac.coreSubjects[0].name=gateway",
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("ServiceAccount gateway needs a namespace"),
        "{err}"
    );

    // Without subjects only the role is rendered; binding it is left to the user.
    let manifests = Rendered::of(Some("external-core")).core_manifests();
    let kinds: Vec<&Value> = manifests["rbac.yaml"].iter().map(|d| &d["kind"]).collect();
    assert_eq!(kinds, [&json!("ClusterRole")]);
}

#[test]
fn the_service_account_token_is_mounted_only_when_the_gateway_uses_it() {
    for (example, want) in [
        (None, true),
        (Some("sidecar-core"), false),
        (Some("external-core"), false),
        (Some("cert-manager"), true),
    ] {
        let r = Rendered::of(example);
        let pod = r.deployment().spec.template.spec.unwrap();
        assert_eq!(
            pod.automount_service_account_token,
            Some(want),
            "{}",
            label(example)
        );
        let config = r.config();
        let uses_sa = config
            .as_object()
            .unwrap()
            .values()
            .any(|v| v.as_str().is_some_and(|s| s.starts_with(SA_DIR)));
        assert_eq!(uses_sa, want, "{}", label(example));
    }
    // The cluster's own API server, reached with the Pod's ServiceAccount.
    let config = Rendered::of(None).config();
    assert_eq!(config["coreUrl"], "https://kubernetes.default.svc");
    assert_eq!(config["coreTokenFile"], format!("{SA_DIR}/token"));
    assert_eq!(config["coreCaFile"], format!("{SA_DIR}/ca.crt"));
}

// ---------------------------------------------------------------------------------------------
// Certificates, CRD, APIServices, monitoring, ingress
// ---------------------------------------------------------------------------------------------

#[test]
fn cert_manager_certificates_are_rendered_only_when_enabled_and_are_the_ones_mounted() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let certs = r.all("Certificate");
        if example != Some("cert-manager") {
            assert!(certs.is_empty(), "{}", label(example));
            continue;
        }
        assert_eq!(certs.len(), 2);
        let serving: Certificate = r.get("Certificate", &format!("{FULLNAME}-serving"));
        let dns = serving.spec.dns_names.clone().unwrap();
        for name in [
            FULLNAME.to_owned(),
            format!("{FULLNAME}.{NAMESPACE}"),
            format!("{FULLNAME}.{NAMESPACE}.svc"),
            "api.example.com".to_owned(),
        ] {
            assert!(
                dns.contains(&name),
                "serving certificate lacks {name}: {dns:?}"
            );
        }
        assert!(serving.spec.usages.contains(&"server auth".to_owned()));
        assert_eq!(
            (
                serving.spec.issuer_ref.name.as_str(),
                serving.spec.issuer_ref.kind.as_str()
            ),
            ("cluster-ca", "ClusterIssuer")
        );
        let proxy: Certificate = r.get("Certificate", &format!("{FULLNAME}-proxy-client"));
        assert!(proxy.spec.usages.contains(&"client auth".to_owned()));
        assert!(!proxy.spec.usages.contains(&"server auth".to_owned()));
        assert_eq!(proxy.spec.common_name.as_deref(), Some("aggregator"));

        // The Secrets cert-manager writes are the ones the gateway mounts and its config names.
        let pod = r.deployment().spec.template.spec.unwrap();
        let secret_of = |volume: &str| {
            pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .find(|v| v.name == volume)
                .and_then(|v| v.secret.clone())
                .and_then(|s| s.secret_name)
        };
        assert_eq!(secret_of("serving"), Some(serving.spec.secret_name.clone()));
        assert_eq!(
            secret_of("proxy-client"),
            Some(proxy.spec.secret_name.clone())
        );
        let config = r.config();
        assert_eq!(
            config["tlsCertFile"],
            format!("{CONFIG_DIR}/serving/tls.crt")
        );
        assert_eq!(
            config["tlsPrivateKeyFile"],
            format!("{CONFIG_DIR}/serving/tls.key")
        );
        assert_eq!(
            config["proxyClientCertFile"],
            format!("{CONFIG_DIR}/proxy-client/tls.crt")
        );
        assert_eq!(
            config["proxyClientKeyFile"],
            format!("{CONFIG_DIR}/proxy-client/tls.key")
        );
    }
    // Default values: no serving certificate, so the gateway generates one; no proxy identity.
    let config = Rendered::of(None).config();
    assert!(config.get("tlsCertFile").is_none() && config.get("proxyClientCertFile").is_none());
}

/// The CRD is for a core without apiregistration.k8s.io, which Helm never reaches: it is rendered
/// into `<fullname>-core` for the user to apply there, and never installed into the host cluster,
/// whose kube-apiserver has APIService built in.
#[test]
fn the_apiservice_crd_is_rendered_for_the_core_only_with_status_and_printer_columns() {
    for example in EXAMPLES {
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
            continue;
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
                ("Age", ".metadata.creationTimestamp")
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
    }

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
    for (example, sets, want) in cases {
        let files: Vec<PathBuf> = example.map(example_file).into_iter().collect();
        let err = helm_template(&files, sets).expect_err(&format!("{sets:?} must be refused"));
        assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
    }
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
    for (example, sets, want) in [
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
    ] {
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
    }
}

/// Everything in `<fullname>-core` is a valid object of its kind, cluster-scoped, and not labelled
/// as managed by Helm (Helm never sees the core).
#[test]
fn manifests_for_the_core_round_trip_and_do_not_claim_helm_manages_them() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let manifests = r.core_manifests();
        let want: &[&str] = match example {
            Some("sidecar-core") => &["apiservice-crd.yaml", "apiservices.yaml", "rbac.yaml"],
            Some("external-core") => &["rbac.yaml"],
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
                assert!(doc["metadata"]["namespace"].is_null(), "{ctx}");
                let labels = doc["metadata"]["labels"].as_object().unwrap();
                assert_eq!(labels["app.kubernetes.io/instance"], RELEASE, "{ctx}");
                assert!(
                    !labels.contains_key("app.kubernetes.io/managed-by"),
                    "{ctx}"
                );
            }
        }
    }
}

#[test]
fn service_monitor_and_ingress_follow_their_switches() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        assert_eq!(
            r.has("ServiceMonitor"),
            example == Some("external-core"),
            "{}",
            label(example)
        );
        assert_eq!(
            r.has("Ingress"),
            example == Some("external-core"),
            "{}",
            label(example)
        );
    }
    let r = Rendered::of(Some("external-core"));
    let sm: ServiceMonitor = r.get("ServiceMonitor", FULLNAME);
    let ep = &sm.spec.endpoints[0];
    assert_eq!(
        (ep.port.as_str(), ep.path.as_str(), ep.scheme.as_str()),
        ("https", "/metrics", "https")
    );
    assert_eq!(sm.metadata.labels.unwrap()["release"], "prometheus");
    let ing: Ingress = r.get("Ingress", FULLNAME);
    let spec = ing.spec.unwrap();
    assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
    let backend = spec.rules.unwrap()[0].http.as_ref().unwrap().paths[0]
        .backend
        .service
        .clone()
        .unwrap();
    assert_eq!(
        (backend.name.as_str(), backend.port.unwrap().name.as_deref()),
        (FULLNAME, Some("https"))
    );
}

// ---------------------------------------------------------------------------------------------
// values.schema.json and required values
// ---------------------------------------------------------------------------------------------

#[test]
fn the_schema_rejects_typos_and_wrong_types_naming_the_field() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["replicaCount=abc"],
            "replicaCount: Invalid type. Expected: integer, given: string",
        ),
        (
            &["replicaCont=3"],
            "Additional property replicaCont is not allowed",
        ),
        (
            &["core.sidecar.imag.repository=x"],
            "Additional property imag is not allowed",
        ),
        (
            &["apiServices.source=files"],
            "apiServices.source: apiServices.source must be one of the following",
        ),
        (
            &["extraConfig.securPort=1"],
            "Additional property securPort is not allowed",
        ),
        (
            &["limits.requestTimeout=60"],
            "limits.requestTimeout: Invalid type. Expected: string, given: integer",
        ),
        (
            &["shutdown.delayDuration=10 seconds"],
            "shutdown.delayDuration: Does not match pattern",
        ),
    ];
    for (sets, want) in cases {
        let err = helm_template(&[], sets).expect_err(&format!("{sets:?} must be refused"));
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{sets:?}: {err}"
        );
        assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
    }
}

#[test]
fn missing_required_values_fail_with_a_message_saying_what_to_set() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["core.sidecar.enabled=true"],
            "core.sidecar.image.repository is required",
        ),
        (
            &["core.url="],
            "core.url is required when core.sidecar.enabled is false",
        ),
        (
            &["certManager.enabled=true"],
            "certManager.issuerRef.name is required",
        ),
        (
            &["apiServices.source=file"],
            "apiServices.items is empty but apiServices.source is file",
        ),
        (
            &["authentication.requestHeader.allowedNames={a}"],
            "needs authentication.requestHeader.caSecret",
        ),
    ];
    for (sets, want) in cases {
        let err = helm_template(&[], sets).expect_err(&format!("{sets:?} must be refused"));
        assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
    }
}

/// `extraConfig` in the schema lists exactly the gateway's config keys, so the chart can neither
/// refuse a real key nor let a misspelled one through to a Pod that would crash on it.
#[test]
fn schema_extra_config_keys_are_exactly_the_gateway_options() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let extra = &schema["properties"]["extraConfig"];
    assert_eq!(extra["additionalProperties"], false);
    let in_schema: Vec<&String> = extra["properties"].as_object().unwrap().keys().collect();
    let options = serde_json::to_value(gateway_config::Options::default()).unwrap();
    let in_options: Vec<&String> = options.as_object().unwrap().keys().collect();
    let mut a = in_schema.clone();
    let mut b = in_options.clone();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "values.schema.json extraConfig vs gateway_config::Options"
    );
}

/// `additionalProperties: false` on every object the schema describes by its properties.
#[test]
fn every_schema_object_with_properties_refuses_unknown_keys() {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if map.contains_key("properties")
                    && map.get("additionalProperties") != Some(&Value::Bool(false))
                {
                    // A Kubernetes Volume is open-ended (many volume sources): name is all we require.
                    if path != ".properties.extraVolumes.items" {
                        out.push(path.to_owned());
                    }
                }
                for (k, v) in map {
                    walk(v, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| walk(v, &format!("{path}[{i}]"), out)),
            _ => {}
        }
    }
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let mut open = Vec::new();
    walk(&schema, "", &mut open);
    assert!(
        open.is_empty(),
        "objects without additionalProperties: false: {open:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The rendered config against the gateway's own parser and binary
// ---------------------------------------------------------------------------------------------

/// A stand-in for the Pod's filesystem: the files the config names, with real PEM contents, under a
/// temporary root; the config's absolute paths are rewritten to point there.
struct FakePodFs {
    root: tempfile::TempDir,
}

impl FakePodFs {
    fn new(rendered: &Rendered) -> Self {
        let root = tempfile::tempdir().unwrap();
        let (ca_pem, cert_pem, key_pem) = test_pki();
        let etc = root.path().join("etc");
        for dir in ["serving", "proxy-client", "core-client"] {
            std::fs::create_dir_all(etc.join(dir)).unwrap();
            std::fs::write(etc.join(dir).join("tls.crt"), &cert_pem).unwrap();
            std::fs::write(etc.join(dir).join("tls.key"), &key_pem).unwrap();
            std::fs::write(etc.join(dir).join("ca.crt"), &ca_pem).unwrap();
        }
        for dir in ["client-ca", "requestheader-ca", "core-ca"] {
            std::fs::create_dir_all(etc.join(dir)).unwrap();
            std::fs::write(etc.join(dir).join("ca.crt"), &ca_pem).unwrap();
        }
        std::fs::create_dir_all(etc.join("core-token")).unwrap();
        std::fs::write(etc.join("core-token/token"), "gateway-token\n").unwrap();
        let sa = root.path().join("sa");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), "service-account-token\n").unwrap();
        std::fs::write(sa.join("ca.crt"), &ca_pem).unwrap();
        // The file source's directory holds what the APIService ConfigMap renders.
        let apiservices = etc.join("apiservices");
        std::fs::create_dir_all(&apiservices).unwrap();
        for cm in rendered.all("ConfigMap") {
            if cm["metadata"]["name"] == format!("{FULLNAME}-apiservices") {
                for (key, text) in cm["data"].as_object().unwrap() {
                    std::fs::write(apiservices.join(key), text.as_str().unwrap()).unwrap();
                }
            }
        }
        Self { root }
    }

    fn rewrite(&self, config: &str) -> String {
        let etc = self.root.path().join("etc");
        let sa = self.root.path().join("sa");
        let tmp = self.root.path().join("tmp");
        config
            .replace(CONFIG_DIR, etc.to_str().unwrap())
            .replace(SA_DIR, sa.to_str().unwrap())
            .replace("/tmp/aggregation-gateway", tmp.to_str().unwrap())
    }

    fn write_config(&self, config: &str) -> PathBuf {
        let path = self.root.path().join("config.yaml");
        std::fs::write(&path, self.rewrite(config)).unwrap();
        path
    }
}

/// A CA and a leaf certificate it signed (server and client use), as PEM.
fn test_pki() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "helm-chart-test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![
        format!("{FULLNAME}.{NAMESPACE}.svc"),
        "localhost".to_owned(),
    ])
    .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "front-proxy-client");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[test]
fn rendered_config_is_accepted_by_the_gateway_options_parser_and_validation() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let ctx = label(example);
        let text = r.config_text();
        // As rendered: every key is one `Options` knows (it denies unknown fields).
        let options: gateway_config::Options = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{ctx}: config.yaml is refused by Options: {e}\n{text}"));
        // The chart never leaves a modeled setting to a default that differs from what it says.
        assert_eq!(options.secure_port, Some(8443), "{ctx}");
        // With the Pod's files in place, validation accepts it.
        let fs = FakePodFs::new(&r);
        let options: gateway_config::Options = serde_saphyr::from_str(&fs.rewrite(&text)).unwrap();
        let config = options
            .validate()
            .unwrap_or_else(|e| panic!("{ctx}: {e}\n{text}"));
        assert_eq!(config.listen.port(), 8443, "{ctx}");
        let want_source = match example {
            Some("file-apiservices") => "File",
            _ => "Kube",
        };
        assert!(
            format!("{:?}", config.apiservices.source).starts_with(want_source),
            "{ctx}: {:?}",
            config.apiservices.source
        );
    }
}

/// The gateway binary, built if needed, from the target directory this test runs in.
fn gateway_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/deps/helm_chart-<hash> → target/<profile>/aggregation-gateway
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(Path::parent).expect("test binary under target/<profile>/deps").to_owned();
        let bin = profile_dir.join(format!("aggregation-gateway{}", std::env::consts::EXE_SUFFIX));
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "aggregation-gateway", "--bin", "aggregation-gateway"])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        // Up to date is quick; another build holding the lock just makes this wait.
        let out = cmd.output().expect("run cargo build -p aggregation-gateway");
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if bin.is_file() {
                eprintln!("warning: cargo build -p aggregation-gateway failed; checking with the existing binary:\n{stderr}");
            } else {
                panic!("cargo build -p aggregation-gateway failed:\n{stderr}");
            }
        }
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

fn check_config(config: &Path) -> std::process::Output {
    Command::new(gateway_binary())
        .arg("--check-config")
        .arg("--config")
        .arg(config)
        .env_remove("AGGREGATION_GATEWAY_CONFIG")
        .output()
        .expect("run aggregation-gateway --check-config")
}

#[test]
fn rendered_config_passes_the_gateway_binarys_check_config() {
    for example in EXAMPLES {
        let r = Rendered::of(example);
        let fs = FakePodFs::new(&r);
        let path = fs.write_config(&r.config_text());
        let out = check_config(&path);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: aggregation-gateway --check-config refused the rendered config:\n{}{}\n{}",
            label(example),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            fs.rewrite(&r.config_text())
        );
    }

    // And the check is real: a config the gateway cannot run with exits 64 with one line naming it.
    let r = Rendered::of(None);
    let fs = FakePodFs::new(&r);
    let path = fs.write_config(&format!("{}securPort: 1\n", r.config_text()));
    let out = check_config(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a misspelled key must be refused: {stderr}"
    );
    assert!(stderr.contains("securPort"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// values.yaml documentation
// ---------------------------------------------------------------------------------------------

/// Keys at the top level and one level down (`core:`, `core.sidecar:`, `probes.liveness:`) whose
/// comment block directly above has no `# --` doc line, as `line N: key`.
fn undocumented_values_keys(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    let mut parent = "";
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let rest = line.trim_start();
        if indent > 2 || rest.starts_with('#') || rest.starts_with('-') {
            continue;
        }
        let Some((key, _)) = rest.split_once(':') else {
            continue;
        };
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            continue;
        }
        let path = if indent == 0 {
            parent = key;
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        };
        let documented = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .any(|l| l.trim_start().starts_with("# -- "));
        if !documented {
            missing.push(format!("line {}: {path}", i + 1));
        }
    }
    missing
}

#[test]
fn every_top_and_second_level_values_key_has_a_doc_comment() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let missing = undocumented_values_keys(&text);
    assert!(
        missing.is_empty(),
        "values.yaml keys without a `# -- ` doc comment directly above:\n  {}",
        missing.join("\n  ")
    );

    // The check sees through a plain comment, a blank line and nesting, and skips commented-out
    // examples and list items.
    let sample = "\
# -- Documented.
replicaCount: 2

# A section comment, but not a doc comment.
probes:
  # -- Documented.
  liveness:
    periodSeconds: 10
  readiness:
    periodSeconds: 5
# -- Documented.

items:
  # - group: x
  - name: y
";
    assert_eq!(
        undocumented_values_keys(sample),
        [
            "line 5: probes",
            "line 9: probes.readiness",
            "line 13: items"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile behind the chart's default image
// ---------------------------------------------------------------------------------------------

/// Every instruction keyword BuildKit's Dockerfile frontend knows.
const DOCKERFILE_INSTRUCTIONS: [&str; 18] = [
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
];

/// One instruction with its continuation lines joined, and the line it starts on.
#[derive(Debug)]
struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

/// Splits a Dockerfile into instructions the way the frontend does: comment and blank lines are
/// dropped (also inside a continuation), a line ending in the escape character continues onto the
/// next, heredoc bodies (`<<EOF` ... `EOF`) belong to their instruction. Any other line must start
/// with an instruction keyword: a line that does not is what a forgotten trailing backslash leaves.
fn parse_dockerfile(text: &str) -> Result<Vec<Instruction>, String> {
    let mut escape = '\\';
    // Parser directives (`# syntax=`, `# escape=`) are only recognized before anything else.
    for line in text.lines() {
        let Some(directive) = line.trim().strip_prefix('#') else {
            break;
        };
        match directive.trim().split_once('=') {
            Some((name, value)) if name.trim().eq_ignore_ascii_case("escape") => {
                escape = value.trim().chars().next().unwrap_or('\\');
            }
            Some((name, _)) if !name.trim().contains(' ') => {}
            _ => break,
        }
    }

    let mut out: Vec<Instruction> = Vec::new();
    let mut open: Option<Instruction> = None;
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if let Some((end, strip_tabs)) = heredocs.first() {
            let body = if *strip_tabs {
                raw.trim_start_matches('\t')
            } else {
                raw
            };
            if body == end {
                heredocs.remove(0);
            }
            continue;
        }
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (content, continues) = match trimmed.strip_suffix(escape) {
            Some(head) => (head, true),
            None => (trimmed, false),
        };
        let mut current = match open.take() {
            Some(mut current) => {
                current.args.push(' ');
                current.args.push_str(content.trim());
                current
            }
            None => {
                let (word, args) = content
                    .split_once(char::is_whitespace)
                    .unwrap_or((content, ""));
                let keyword = word.to_ascii_uppercase();
                if !DOCKERFILE_INSTRUCTIONS.contains(&keyword.as_str()) {
                    let after = out
                        .last()
                        .map(|p| format!(" (line {} ends without {escape:?})", p.line))
                        .unwrap_or_default();
                    return Err(format!(
                        "line {n}: {word:?} is not a Dockerfile instruction nor a continuation{after}: {trimmed}"
                    ));
                }
                Instruction {
                    line: n,
                    keyword,
                    args: args.trim().to_owned(),
                }
            }
        };
        if continues {
            open = Some(current);
            continue;
        }
        if matches!(current.keyword.as_str(), "RUN" | "COPY" | "ADD") {
            heredocs = heredoc_terminators(&current.args);
        }
        current.args = current.args.trim().to_owned();
        out.push(current);
    }
    if let Some(current) = open {
        return Err(format!(
            "line {}: {} continues past the end of the file",
            current.line, current.keyword
        ));
    }
    if let Some((end, _)) = heredocs.first() {
        return Err(format!("heredoc {end:?} is never closed"));
    }
    Ok(out)
}

/// The terminators of the heredocs an instruction opens (`<<EOF`, `<<-EOF`, `<<"EOF"`), in order,
/// with whether leading tabs are stripped before comparing.
fn heredoc_terminators(args: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut rest = args;
    while let Some(at) = rest.find("<<") {
        rest = &rest[at + 2..];
        let strip_tabs = rest.starts_with('-');
        let word = rest.trim_start_matches('-').trim_start_matches(['"', '\'']);
        let end: String = word
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !end.is_empty() {
            out.push((end, strip_tabs));
        }
    }
    out
}

fn read_dockerfile() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"))
        .expect("read the Dockerfile at the repository root")
}

/// The final stage (what the image runs) must agree with the chart's defaults: the USER is the
/// numeric uid/gid the Pod's securityContext runs as (numeric, or the kubelet cannot check
/// runAsNonRoot against it), EXPOSE is the gateway's container port, and the exec-form ENTRYPOINT
/// runs the binary the stage copies in (distroless has no shell for a shell-form one).
#[test]
fn dockerfile_parses_and_its_final_stage_matches_the_charts_defaults() {
    let instructions =
        parse_dockerfile(&read_dockerfile()).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
    let last_from = instructions
        .iter()
        .rposition(|i| i.keyword == "FROM")
        .expect("a FROM");
    assert!(
        instructions[..last_from].iter().any(|i| i.keyword == "RUN"),
        "a multi-stage build: the binary is built in an earlier stage"
    );
    let stage = &instructions[last_from..];
    let only = |keyword: &str| -> &Instruction {
        let found: Vec<&Instruction> = stage.iter().filter(|i| i.keyword == keyword).collect();
        assert_eq!(
            found.len(),
            1,
            "the final stage needs exactly one {keyword}: {found:?}"
        );
        found[0]
    };

    let pod = Rendered::of(None).deployment().spec.template.spec.unwrap();
    let gateway = pod.containers.iter().find(|c| c.name == "gateway").unwrap();
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    let container_sc = gateway.security_context.clone().unwrap_or_default();
    let run_as_user = container_sc
        .run_as_user
        .or(pod_sc.run_as_user)
        .expect("runAsUser");
    let run_as_group = container_sc.run_as_group.or(pod_sc.run_as_group);

    let user = &only("USER").args;
    let (uid, gid) = user
        .split_once(':')
        .map_or((user.as_str(), None), |(u, g)| (u, Some(g)));
    let uid: i64 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user}: the uid must be numeric"));
    assert_eq!(
        uid, run_as_user,
        "the image's USER vs the chart's runAsUser"
    );
    if let (Some(gid), Some(group)) = (gid, run_as_group) {
        assert_eq!(
            gid.parse::<i64>().ok(),
            Some(group),
            "the image's group vs the chart's runAsGroup"
        );
    }

    let port = gateway.ports.as_ref().unwrap()[0].container_port;
    let exposed: Vec<&str> = only("EXPOSE").args.split_whitespace().collect();
    assert_eq!(
        exposed
            .iter()
            .map(|p| p.trim_end_matches("/tcp").parse::<i32>().ok())
            .collect::<Vec<_>>(),
        [Some(port)],
        "the image's EXPOSE vs the chart's container port"
    );

    let entrypoint: Vec<String> = serde_json::from_str(&only("ENTRYPOINT").args)
        .expect("ENTRYPOINT in exec (JSON array) form");
    let copied: Vec<&str> = stage
        .iter()
        .filter(|i| i.keyword == "COPY")
        .filter_map(|i| i.args.split_whitespace().last())
        .collect();
    assert!(
        copied.contains(&entrypoint[0].as_str()),
        "ENTRYPOINT {} is not copied into the final stage ({copied:?})",
        entrypoint[0]
    );
}

#[test]
fn dockerfile_parser_catches_a_missing_continuation_backslash() {
    // The runtime LABEL as it once was: its second and third lines lost their backslash.
    let broken = "\
# syntax=docker/dockerfile:1.7
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title=\"aggregation-gateway\"
      org.opencontainers.image.description=\"A front proxy.\"
      org.opencontainers.image.licenses=\"Apache-2.0\"
USER 65532:65532
";
    let err = parse_dockerfile(broken).unwrap_err();
    assert!(
        err.starts_with("line 4: \"org.opencontainers.image.description=\\\"A\" is not a Dockerfile instruction")
            && err.contains("(line 3 ends without '\\\\')"),
        "{err}"
    );

    let fixed = broken
        .replace("\"aggregation-gateway\"\n", "\"aggregation-gateway\" \\\n")
        .replace("proxy.\"\n", "proxy.\" \\\n");
    let instructions = parse_dockerfile(&fixed).unwrap();
    let keywords: Vec<&str> = instructions.iter().map(|i| i.keyword.as_str()).collect();
    assert_eq!(keywords, ["FROM", "LABEL", "USER"]);
    assert!(instructions[1]
        .args
        .ends_with("org.opencontainers.image.licenses=\"Apache-2.0\""));

    // A continuation into the end of the file, and heredoc bodies, are handled too.
    assert!(parse_dockerfile("FROM x\nRUN true \\\n")
        .unwrap_err()
        .contains("past the end"));
    let heredoc = "FROM x\nRUN <<EOF\nset -e\necho hi\nEOF\nUSER 1\n";
    assert_eq!(parse_dockerfile(heredoc).unwrap().len(), 3);
}
