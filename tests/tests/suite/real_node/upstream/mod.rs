//! Kubernetes' own e2e tests (`test/e2e`, from the same tree as the binaries) as an oracle: the
//! same focus run directly against kube-apiserver and through the gateway in each shape whose
//! core is this cluster. The set that passes directly must pass through the gateway, and the run
//! through the gateway may take at most 1.2× the direct run's time (issue 38). The per-spec table
//! (status and seconds each way) is printed, for BENCHMARKS.md.
//!
//! Two focuses ([`Focus`]): issue 31's 26 apimachinery specs, and issue 38's every `[Conformance]`
//! spec of sig-api-machinery, sig-cli, sig-auth, sig-instrumentation and sig-architecture that
//! one node can run. `REAL_NODE_UPSTREAM=apimachinery|conformance` picks one for every shape;
//! by default the `cluster` shape runs the conformance focus and the others the 26 specs, to keep
//! the session's time sane. With ginkgo's CLI beside `e2e.test` (or named by `GINKGO`) the specs
//! run in 4 parallel processes, `[Serial]` ones last, as upstream's CI runs them; otherwise in
//! `e2e.test`'s one process.

mod junit;
mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use table::Table;

use super::shapes::{Installed, Node};

/// The specs of issue 31: the Aggregator conformance test, discovery, OpenAPI and CRDs.
const APIMACHINERY: &str = r"\[sig-api-machinery\] (Aggregator|Discovery|AggregatedDiscovery|CustomResourcePublishOpenAPI|OpenAPIV3|CustomResourceDefinition resources) ";
/// The specs of issue 38.
const CONFORMANCE: &str =
    r"\[sig-(api-machinery|cli|auth|instrumentation|architecture)\].*\[Conformance\]";
/// Conformance specs of that focus that cannot pass on one node, with the reason.
pub const NEEDS_MORE_THAN_ONE_NODE: &[(&str, &str)] = &[(
    "[sig-architecture] Conformance Tests should have at least two untainted nodes",
    "it counts the cluster's schedulable nodes and wants two; this cluster has one",
)];
/// The variable choosing the focus for every shape.
const FOCUS_ENV: &str = "REAL_NODE_UPSTREAM";
/// ginkgo's parallel processes.
const PROCS: &str = "4";

/// Which specs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Focus {
    Apimachinery,
    Conformance,
}

impl Focus {
    /// `REAL_NODE_UPSTREAM` if set, else the shape's own default.
    pub fn chosen(shape_default: Focus) -> Focus {
        match std::env::var(FOCUS_ENV).as_deref() {
            Ok("apimachinery") => Focus::Apimachinery,
            Ok("conformance") => Focus::Conformance,
            Ok("") | Err(_) => shape_default,
            Ok(other) => panic!("{FOCUS_ENV}={other}: use apimachinery or conformance"),
        }
    }

    fn pattern(self) -> &'static str {
        match self {
            Focus::Apimachinery => APIMACHINERY,
            Focus::Conformance => CONFORMANCE,
        }
    }

    fn skip(self) -> String {
        let mut skip = vec![r"\[Flaky\]".to_owned(), r"\[Disruptive\]".to_owned()];
        if self == Focus::Conformance {
            skip.extend(NEEDS_MORE_THAN_ONE_NODE.iter().map(|(s, _)| regex_quote(s)));
        }
        skip.join("|")
    }
}

fn regex_quote(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = r"\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// Where the tests send their requests.
pub enum Target {
    Direct,
    /// Through a gateway: a label for the output and a kubeconfig naming it.
    Through {
        label: String,
        kubeconfig: PathBuf,
    },
}

impl Target {
    /// The gateway of an installed shape, through its Service with the admin ServiceAccount's
    /// token.
    pub fn gateway(node: &Node, installed: &Installed<'_>) -> Target {
        let name = installed.shape.name;
        let file = node.cluster.dir().join(format!("e2e-{name}.kubeconfig"));
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            // e2e.test verifies the server against the URL's host whatever `tls-server-name`
            // says, and the ClusterIP is only known after the install, so the serving
            // certificate cannot name it: TLS is not verified for these runs (the suite's own
            // kubectl checks verify it as the Service's name).
            "clusters": [{"name": "gateway", "cluster": {
                "server": format!("https://{}:443", installed.service_ip),
                "insecure-skip-tls-verify": true}}],
            "users": [{"name": "e2e-admin", "user": {"token": node.admin_token}}],
            "contexts": [{"name": "gateway", "context": {"cluster": "gateway", "user": "e2e-admin"}}],
            "current-context": "gateway",
        });
        std::fs::write(&file, config.to_string()).unwrap();
        Target::Through {
            label: format!("gateway, {name}"),
            kubeconfig: file,
        }
    }
}

/// One spec's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub status: String,
    pub seconds: f64,
}

/// One run of the focus.
#[derive(Clone, Debug)]
pub struct Run {
    pub focus: Focus,
    pub specs: BTreeMap<String, Spec>,
    pub wall: Duration,
}

/// Runs `focus` against `target` and reads its JUnit report.
pub async fn run(node: &Node, e2e: &Path, focus: Focus, target: Target) -> Run {
    let cluster = &node.cluster;
    let (label, kubeconfig) = match target {
        Target::Direct => ("direct".to_owned(), cluster.admin_kubeconfig()),
        Target::Through { label, kubeconfig } => (label, kubeconfig),
    };
    let slug: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    // Not in the cluster's directory: a run that failed something is kept past the session.
    let out = tempfile::Builder::new()
        .prefix(&format!("real-node-e2e-{slug}-"))
        .tempdir()
        .unwrap();
    let started = Instant::now();
    let ginkgo = ginkgo_beside(e2e);
    eprintln!(
        "real node: upstream e2e ({label}, {focus:?}, {}) ...",
        if ginkgo.is_some() {
            "ginkgo -p --procs 4"
        } else {
            "one process"
        }
    );
    let command = command(e2e, ginkgo.as_deref(), focus, &kubeconfig, out.path());
    let log = out.path().join("e2e.log");
    let status = tokio::task::spawn_blocking({
        let log = log.clone();
        move || {
            let mut command = command;
            let file = std::fs::File::create(&log).unwrap();
            command
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .status()
        }
    })
    .await
    .unwrap()
    .expect("running e2e.test");
    let wall = started.elapsed();
    let report = std::fs::read_to_string(out.path().join("junit.xml")).unwrap_or_else(|e| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!(
            "e2e.test ({label}, {status}) wrote no JUnit report ({e}); its output ends:\n{}",
            tail(&log, 60)
        )
    });
    let specs = junit::parse_junit(&report);
    let passed = specs.values().filter(|s| s.status == "passed").count();
    eprintln!(
        "real node: upstream e2e ({label}): {passed} of {} passed in {:.0} s",
        specs.len(),
        wall.as_secs_f64()
    );
    if passed < specs.len() {
        // Keep the output of a run that failed something: the table names the specs.
        let kept = out.keep();
        eprintln!("real node: e2e output kept in {}", kept.display());
    }
    Run { focus, specs, wall }
}

/// `GINKGO`, else `ginkgo` beside `e2e.test`, if it is there.
fn ginkgo_beside(e2e: &Path) -> Option<PathBuf> {
    let named = std::env::var_os("GINKGO").filter(|v| !v.is_empty());
    let path = named.map_or_else(|| e2e.with_file_name("ginkgo"), PathBuf::from);
    path.is_file().then_some(path)
}

/// The command line: ginkgo's CLI around `e2e.test`, or `e2e.test` alone.
fn command(
    e2e: &Path,
    ginkgo: Option<&Path>,
    focus: Focus,
    kubeconfig: &Path,
    out: &Path,
) -> Command {
    let dir = out.display().to_string();
    let mut suite: Vec<String> = [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--provider",
        "skeleton",
        "--minStartupPods",
        "0",
        "--allowed-not-ready-nodes",
        "0",
        "--num-nodes",
        "1",
        "--node-os-distro",
        "debian",
        "--disable-log-dump",
        "--e2e-output-dir",
        &dir,
        "--report-dir",
        &dir,
    ]
    .map(str::to_owned)
    .to_vec();
    // The release's kubectl (the sig-cli specs run it), not the host's dispatcher.
    if let Some(kubectl) = e2e::real::release_kubectl() {
        suite.extend(["--kubectl-path".into(), kubectl.display().to_string()]);
    }
    let (pattern, skip) = (focus.pattern(), focus.skip());
    match ginkgo {
        Some(ginkgo) => {
            let mut command = Command::new(ginkgo);
            command
                .args(["-p", "--procs", PROCS, "--no-color", "--timeout", "60m"])
                .arg(format!("--focus={pattern}"))
                .arg(format!("--skip={skip}"))
                .args(["--output-dir", &dir, "--junit-report", "junit.xml"])
                .arg(e2e)
                .arg("--")
                .args(&suite);
            command
        }
        None => {
            let mut command = Command::new(e2e);
            command
                .arg(format!("--ginkgo.focus={pattern}"))
                .arg(format!("--ginkgo.skip={skip}"))
                .args(["--ginkgo.no-color", "--ginkgo.timeout", "60m"])
                .arg(format!("--ginkgo.junit-report={dir}/junit.xml"))
                .args(&suite);
            command
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn spec_names_are_quoted_for_the_skip_pattern() {
    assert_eq!(
        regex_quote("[sig-cli] Kubectl client Update Demo should scale (rc)"),
        r"\[sig-cli\] Kubectl client Update Demo should scale \(rc\)"
    );
}
