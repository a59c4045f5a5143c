//! The Helm chart (`charts/aggregation-gateway`) rendered the way a user renders it, `helm
//! template` with a values file and `--set`s, and the rendered objects read back as JSON values or
//! as their `k8s-openapi` types.
//!
//! It lives in the library because two areas of the suite read the chart: `tests/suite/helm_chart/`
//! (the chart itself) and `tests/suite/dockerfile.rs` (the image must agree with the chart's
//! defaults). Like the rest of this test support, helpers panic with a message naming the release
//! and the object rather than return errors: every caller is a test.
//!
//! Needs `helm` (Helm 3) on PATH: run `../shared/tools/install-helm` (CI does it in `.ci/run`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The release name every test renders.
pub const RELEASE: &str = "edge";
/// The namespace every test renders into.
pub const NAMESPACE: &str = "gateway-system";
/// `<release>-<chart>`: the name of the Deployment, its ServiceAccount, ConfigMap and RBAC.
pub const FULLNAME: &str = "edge-aggregation-gateway";
/// Where the gateway container finds its config and the Secrets it mounts.
pub const CONFIG_DIR: &str = "/etc/aggregation-gateway";
/// Where the kubelet mounts the Pod's ServiceAccount token.
pub const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The values files the chart is tested with; `None` is the chart's defaults.
pub const EXAMPLES: [Option<&str>; 5] = [
    None,
    Some("sidecar-core"),
    Some("external-core"),
    Some("cert-manager"),
    Some("file-apiservices"),
];

/// The chart's directory in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aggregation-gateway")
}

/// `examples/<name>.yaml` of the chart.
pub fn example_file(name: &str) -> PathBuf {
    chart_dir().join("examples").join(format!("{name}.yaml"))
}

/// How messages name an example: its file name, or "default values".
pub fn label(example: Option<&str>) -> &str {
    example.unwrap_or("default values")
}

// === running helm ===

/// The `helm` binary on PATH, checked once to be Helm 3.
pub fn helm() -> &'static Path {
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
pub fn helm_template(files: &[PathBuf], sets: &[&str]) -> Result<String, String> {
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

/// The install notes (`templates/NOTES.txt`) `helm install` would print for an example (or the
/// defaults) and `--set`s.
///
/// `helm template` never renders NOTES.txt, and `helm install --dry-run` needs a cluster, so a
/// copy of the chart gets the notes as a named template plus a ConfigMap that includes it, and
/// `helm template --show-only` renders that ConfigMap. The text is the same template with the same
/// values, so what the test reads is what a user reads.
pub fn render_notes(example: Option<&str>, sets: &[&str]) -> String {
    let copy = tempfile::Builder::new()
        .prefix("chart-notes-")
        .tempdir()
        .expect("a directory for the chart's copy");
    let chart = copy.path().join("aggregation-gateway");
    copy_dir(&chart_dir(), &chart);
    let templates = chart.join("templates");
    let notes = std::fs::read_to_string(templates.join("NOTES.txt")).expect("read NOTES.txt");
    std::fs::write(
        templates.join("_rendered_notes.tpl"),
        format!("{{{{- define \"e2e.notes\" -}}}}\n{notes}{{{{- end }}}}\n"),
    )
    .unwrap();
    std::fs::write(
        templates.join("rendered-notes.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rendered-notes}\n\
         data:\n  notes: {{ include \"e2e.notes\" . | toJson }}\n",
    )
    .unwrap();
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE])
        .args(["--show-only", "templates/rendered-notes.yaml"]);
    if let Some(example) = example {
        cmd.arg("--values").arg(example_file(example));
    }
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm template");
    assert!(
        out.status.success(),
        "rendering the notes ({} {sets:?}) failed:\n{}",
        label(example),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = split_documents(&String::from_utf8_lossy(&out.stdout));
    docs[0]["data"]["notes"]
        .as_str()
        .expect("the rendered notes")
        .to_owned()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

// === impl Rendered ===

/// The rendered objects of one release.
pub struct Rendered {
    pub docs: Vec<Value>,
}

impl Rendered {
    /// Renders an example (or the defaults); panics with helm's message if rendering fails.
    pub fn of(example: Option<&str>) -> Self {
        Self::with(example, &[])
    }

    /// Renders an example (or the defaults) with `--set` overrides.
    pub fn with(example: Option<&str>, sets: &[&str]) -> Self {
        let files: Vec<PathBuf> = example.map(example_file).into_iter().collect();
        let text = helm_template(&files, sets)
            .unwrap_or_else(|e| panic!("helm template ({}) failed:\n{e}", label(example)));
        Self {
            docs: split_documents(&text),
        }
    }

    /// Every rendered object of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    /// The object of `kind` called `name`, as its type; panics listing what was rendered if absent.
    pub fn get<T: DeserializeOwned>(&self, kind: &str, name: &str) -> T {
        let doc = self
            .docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered; have: {}", self.names()));
        serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
    }

    pub fn has(&self, kind: &str) -> bool {
        !self.all(kind).is_empty()
    }

    /// `Kind/name, ...` of everything rendered, for messages.
    pub fn names(&self) -> String {
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

    pub fn deployment(&self) -> Deployment {
        self.get("Deployment", FULLNAME)
    }

    pub fn gateway_container(&self) -> Container {
        let pod = self.deployment().spec.template.spec.unwrap();
        pod.containers
            .into_iter()
            .find(|c| c.name == "gateway")
            .expect("a container named gateway")
    }

    /// The `config.yaml` the gateway is started with.
    pub fn config_text(&self) -> String {
        let cm: ConfigMap = self.get("ConfigMap", FULLNAME);
        cm.data
            .unwrap()
            .remove("config.yaml")
            .expect("config.yaml in the gateway ConfigMap")
    }

    /// [`Rendered::config_text`], parsed.
    pub fn config(&self) -> Value {
        serde_saphyr::from_str(&self.config_text()).expect("config.yaml is YAML")
    }

    /// Rules of the ClusterRole installed into the cluster Helm talks to (the "host" cluster).
    pub fn cluster_role_rules(&self) -> Vec<PolicyRule> {
        cluster_role_rules_of(&self.all("ClusterRole"))
    }

    /// The manifests of the `<fullname>-core` ConfigMap, which are meant for the core server, by
    /// key; empty when the chart renders none.
    pub fn core_manifests(&self) -> BTreeMap<String, Vec<Value>> {
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
    pub fn core_cluster_role_rules(&self) -> Vec<PolicyRule> {
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
pub fn split_documents(text: &str) -> Vec<Value> {
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
