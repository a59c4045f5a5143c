//! Kubernetes' own apimachinery e2e tests (`test/e2e/apimachinery`, from the same tree as the
//! binaries) as an oracle: the same focus run directly against kube-apiserver and through the
//! gateway's Service in each shape whose core is this cluster. The set that passes directly must
//! pass through the gateway, and the run through the gateway may take at most 1.5× the direct
//! run's time. The per-test table (status and seconds each way) is printed, for BENCHMARKS.md.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::shapes::{Installed, Node};

/// The specs of issue 31: the Aggregator conformance test, discovery, OpenAPI and CRDs.
const FOCUS: &str = r"\[sig-api-machinery\] (Aggregator|Discovery|AggregatedDiscovery|CustomResourcePublishOpenAPI|OpenAPIV3|CustomResourceDefinition resources) ";
/// The through-gateway run may take this much longer than the direct one.
const MAX_SLOWDOWN: f64 = 1.5;

/// Where the tests send their requests.
pub enum Target<'a> {
    Direct,
    Gateway(&'a Installed<'a>),
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
    pub specs: BTreeMap<String, Spec>,
    pub wall: Duration,
}

/// Runs the focus against `target` and reads its JUnit report.
pub async fn run(node: &Node, e2e: &Path, target: Target<'_>) -> Run {
    let cluster = &node.cluster;
    let (label, kubeconfig) = match &target {
        Target::Direct => ("direct", cluster.admin_kubeconfig()),
        Target::Gateway(installed) => {
            let file = cluster
                .dir()
                .join(format!("e2e-{}.kubeconfig", installed.shape.name));
            let config = serde_json::json!({
                "apiVersion": "v1", "kind": "Config",
                // e2e.test verifies the server against the URL's host whatever
                // `tls-server-name` says, and the ClusterIP is only known after the install, so
                // the serving certificate cannot name it: TLS is not verified for these runs
                // (the suite's own kubectl checks verify it as the Service's name).
                "clusters": [{"name": "gateway", "cluster": {
                    "server": format!("https://{}:443", installed.service_ip),
                    "insecure-skip-tls-verify": true}}],
                "users": [{"name": "e2e-admin", "user": {"token": node.admin_token}}],
                "contexts": [{"name": "gateway", "context": {"cluster": "gateway", "user": "e2e-admin"}}],
                "current-context": "gateway",
            });
            std::fs::write(&file, config.to_string()).unwrap();
            ("gateway", file)
        }
    };
    let out = tempfile::Builder::new()
        .prefix(&format!("e2e-{label}-"))
        .tempdir_in(cluster.dir())
        .unwrap();
    let junit = out.path().join("junit.xml");
    let started = Instant::now();
    eprintln!("real node: upstream e2e ({label}) ...");
    let e2e = e2e.to_path_buf();
    let args: Vec<String> = vec![
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--provider".into(),
        "skeleton".into(),
        "--ginkgo.focus".into(),
        FOCUS.into(),
        "--ginkgo.skip".into(),
        r"\[Flaky\]".into(),
        "--ginkgo.no-color".into(),
        "--ginkgo.timeout".into(),
        "60m".into(),
        "--minStartupPods".into(),
        "0".into(),
        "--allowed-not-ready-nodes".into(),
        "0".into(),
        "--num-nodes".into(),
        "1".into(),
        "--node-os-distro".into(),
        "debian".into(),
        "--disable-log-dump".into(),
        "--e2e-output-dir".into(),
        out.path().display().to_string(),
        "--report-dir".into(),
        out.path().display().to_string(),
        "--ginkgo.junit-report".into(),
        junit.display().to_string(),
    ];
    let log = out.path().join("e2e.log");
    let status = tokio::task::spawn_blocking({
        let log = log.clone();
        move || {
            let file = std::fs::File::create(&log).unwrap();
            Command::new(e2e)
                .args(&args)
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .status()
        }
    })
    .await
    .unwrap()
    .expect("running e2e.test");
    let wall = started.elapsed();
    let report = std::fs::read_to_string(&junit).unwrap_or_else(|e| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!(
            "e2e.test ({label}, {status}) wrote no JUnit report ({e}); its output ends:\n{}",
            tail(&log, 60)
        )
    });
    let specs = parse_junit(&report);
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
    Run { specs, wall }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The specs of a Ginkgo JUnit report that ran (skipped ones and suite nodes left out):
/// `<testcase name="[It] <spec> [<labels>]" status="passed" time="12.3">`, by spec text.
pub fn parse_junit(xml: &str) -> BTreeMap<String, Spec> {
    let mut specs = BTreeMap::new();
    for case in xml.split("<testcase ").skip(1) {
        let head = case.split('>').next().unwrap_or_default();
        let attr = |name: &str| -> Option<String> {
            let start = head
                .find(&format!(" {name}=\""))
                .map(|i| i + name.len() + 3)
                .or_else(|| {
                    head.starts_with(&format!("{name}=\""))
                        .then_some(name.len() + 2)
                })?;
            let end = head[start..].find('"')? + start;
            Some(unescape(&head[start..end]))
        };
        let (Some(name), Some(status)) = (attr("name"), attr("status")) else {
            continue;
        };
        // Specs are `[It] <text> [<labels>]`; suite nodes (`[SynchronizedBeforeSuite]`) are not.
        let Some(name) = name.strip_prefix("[It] ") else {
            continue;
        };
        if status == "skipped" {
            continue;
        }
        let name = match name.rfind(" [sig-") {
            Some(labels) if name.ends_with(']') => &name[..labels],
            _ => name,
        }
        .to_owned();
        let seconds = attr("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        specs.insert(name, Spec { status, seconds });
    }
    specs
}

fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Direct and through-gateway runs side by side.
pub struct Table {
    direct: Run,
    gateway: Run,
}

impl Table {
    pub fn new(direct: &Run, gateway: &Run) -> Table {
        Table {
            direct: direct.clone(),
            gateway: gateway.clone(),
        }
    }

    fn passed(run: &Run) -> Vec<&String> {
        run.specs
            .iter()
            .filter(|(_, s)| s.status == "passed")
            .map(|(name, _)| name)
            .collect()
    }

    /// The set passing directly passes through the gateway, in at most 1.5× the time.
    pub fn verdict(&self) -> Result<(), String> {
        let direct = Self::passed(&self.direct);
        let gateway = Self::passed(&self.gateway);
        let lost: Vec<&&String> = direct.iter().filter(|n| !gateway.contains(n)).collect();
        if !lost.is_empty() {
            return Err(format!(
                "{} spec(s) pass directly but not through the gateway: {lost:?}",
                lost.len()
            ));
        }
        let ratio = self.gateway.wall.as_secs_f64() / self.direct.wall.as_secs_f64();
        if ratio > MAX_SLOWDOWN {
            return Err(format!(
                "through the gateway {:.0} s, directly {:.0} s: {ratio:.2}× (at most {MAX_SLOWDOWN}×)",
                self.gateway.wall.as_secs_f64(),
                self.direct.wall.as_secs_f64()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| spec | direct | s | gateway | s |")?;
        writeln!(f, "|---|---|---:|---|---:|")?;
        let names: std::collections::BTreeSet<&String> = self
            .direct
            .specs
            .keys()
            .chain(self.gateway.specs.keys())
            .collect();
        let cell = |run: &Run, name: &str| match run.specs.get(name) {
            Some(s) => (s.status.clone(), format!("{:.1}", s.seconds)),
            None => ("-".into(), "-".into()),
        };
        for name in names {
            let short = name.trim_start_matches("[sig-api-machinery] ");
            let (ds, dt) = cell(&self.direct, name);
            let (gs, gt) = cell(&self.gateway, name);
            writeln!(f, "| {short} | {ds} | {dt} | {gs} | {gt} |")?;
        }
        writeln!(
            f,
            "| **all ({} / {} passed)** | | **{:.0}** | | **{:.0}** ({:.2}×) |",
            Self::passed(&self.direct).len(),
            Self::passed(&self.gateway).len(),
            self.direct.wall.as_secs_f64(),
            self.gateway.wall.as_secs_f64(),
            self.gateway.wall.as_secs_f64() / self.direct.wall.as_secs_f64()
        )
    }
}

#[test]
fn junit_specs_are_read_with_status_and_time() {
    let xml = r#"<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.2"></testcase>
<testcase name="[It] [sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator [Conformance] [sig-api-machinery, Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
<testcase name="[It] [sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD with validation schema &quot;x&quot; [sig-api-machinery]" classname="Kubernetes e2e suite" status="failed" time="60.1"><failure message="x">y</failure></testcase>
<testcase name="[It] [sig-api-machinery] Discovery flaky [Flaky] [sig-api-machinery, Flaky]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>"#;
    let specs = parse_junit(xml);
    assert_eq!(specs.len(), 2, "{specs:?}");
    let failed = &specs["[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD with validation schema \"x\""];
    assert_eq!((failed.status.as_str(), failed.seconds), ("failed", 60.1));
}
