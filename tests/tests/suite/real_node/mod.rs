//! The gateway deployed the way users deploy it: its image in Pods on a real one-node cluster,
//! installed by its Helm chart in every documented shape, used with kubectl, operated on day 2,
//! and Kubernetes' own apimachinery e2e tests run through it.
//!
//! Runs when the real binaries are named by the environment (`e2e::real_node`:
//! `KUBEBUILDER_ASSETS`, `SAMPLE_APISERVER`, `REAL_NODE_BIN`, optionally `E2E_TEST`) and the host
//! has containerd, runc, the CNI plugins and dnsmasq, as root; otherwise it prints `SKIPPED ...`
//! and passes, so CI runs the fixture suite only.
//!
//! One session: the node comes up ([`e2e::real_node::Cluster`]), the images are built offline
//! and imported (the gateway's from the release binary and the Dockerfile's final stage;
//! kube-apiserver, sample-apiserver and the fixture core from their binaries), sample-apiserver
//! runs as a Pod with upstream's RBAC ([`wardle`]), and then each chart shape ([`shapes`]) is
//! installed with helm and checked as a user would ([`usage`]), operated on day 2 ([`day2`]),
//! run through by the upstream e2e focus ([`upstream`]), and uninstalled.
//!
//! Last, the `front-door` shape ([`front_door`]) moves the node's own components behind a gateway
//! on the node's address and runs the checks and the conformance focus again.
//!
//! `REAL_NODE_CHECKS=<text>` runs only the checks whose name contains the text;
//! `REAL_NODE_SHAPES=<names>` (comma-separated: `cluster`, `native-sidecar`, `sidecar`,
//! `crd-core`, `front-door`) only those shapes; `REAL_NODE_UPSTREAM=apimachinery|conformance`
//! the upstream focus of every shape ([`upstream`]); `GINKGO` ginkgo's CLI when it is not beside
//! `e2e.test`; `REAL_NODE_USAGE_WINDOW=<seconds>` the front door's per-component measurement of
//! the gateway's CPU and memory ([`component_load`]). Every difference from what a user expects is stated where it is checked.

mod authentication;
mod component_load;
mod day2;
mod front_door;
mod shapes;
mod upstream;
mod usage;
mod wardle;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use e2e::real_node::{Cluster, NodeBinaries};

use shapes::{Installed, Node, Shape};
use upstream::{Focus, Run, Table, Target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_on_a_real_node() {
    let Some(binaries) = NodeBinaries::or_skip("session_on_a_real_node") else {
        return;
    };
    let started = Instant::now();
    let cluster = Cluster::start(&binaries, env!("CARGO_BIN_EXE_node-runc").as_ref())
        .await
        .unwrap_or_else(|e| panic!("the node did not come up: {e}"));
    let node = Node::prepare(cluster, env!("CARGO_BIN_EXE_fixture-core").as_ref()).await;
    eprintln!(
        "real node: node Ready, images imported and sample-apiserver running after {:.1?}",
        started.elapsed()
    );
    if binaries.e2e_test.is_none() {
        eprintln!("real node: E2E_TEST is not set; the upstream e2e tests are skipped");
    }
    let mut session = Session {
        node,
        e2e: binaries.e2e_test.clone(),
        direct: BTreeMap::new(),
        failures: Vec::new(),
        tables: Vec::new(),
    };
    for shape in Shape::selected() {
        session.shape(shape).await;
    }
    if front_door::selected() {
        session.front_door().await;
    }
    for (shape, table) in &session.tables {
        eprintln!("real node: upstream e2e table, shape {shape}:\n{table}");
    }
    eprintln!("real node: session took {:.1?}", started.elapsed());
    let failures = &session.failures;
    if !failures.is_empty() {
        eprintln!("{}", session.node.cluster.logs());
    }
    assert!(
        failures.is_empty(),
        "{} check(s) of the real node session failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What the shapes share: the node, the direct runs and what was found.
struct Session {
    node: Node,
    e2e: Option<PathBuf>,
    /// The direct runs, one per focus, each made before the first shape that needs it is
    /// installed (so no gateway adds load to it).
    direct: BTreeMap<Focus, Run>,
    failures: Vec<String>,
    tables: Vec<(&'static str, Table)>,
}

impl Session {
    /// The direct run of `focus`, made now if it was not yet.
    async fn direct(&mut self, focus: Focus) -> Option<&Run> {
        let e2e = self.e2e.as_ref()?;
        if !self.direct.contains_key(&focus) {
            let run = upstream::run(&self.node, e2e, focus, Target::Direct).await;
            self.direct.insert(focus, run);
        }
        self.direct.get(&focus)
    }

    /// Installs `shape`, checks it, runs its upstream focus through it, uninstalls it.
    async fn shape(&mut self, shape: &'static Shape) {
        let label = format!("real node [{}]", shape.name);
        let focus = Focus::chosen(shape.upstream_focus);
        if shape.runs_upstream_e2e {
            self.direct(focus).await;
        }
        let node = &self.node;
        let installed = match Installed::install(node, shape).await {
            Ok(installed) => installed,
            Err(e) => {
                eprintln!("{label}: install FAILED");
                self.failures
                    .push(format!("- [{}] install: {e}", shape.name));
                return;
            }
        };
        if shape.first_answer_is_timed {
            eprintln!(
                "real node: first kubectl answer through the gateway {:.1?} after the start of \
                 the session",
                installed.first_answer.duration_since(node.cluster.started)
            );
        }
        self.failures.extend(
            usage::run(&label, &installed)
                .await
                .into_iter()
                .map(|f| f.replacen("- ", &format!("- [{}] ", shape.name), 1)),
        );
        if let (Some(direct), Some(e2e)) = (self.direct.get(&focus), &self.e2e) {
            if shape.runs_upstream_e2e {
                let target = Target::gateway(node, &installed);
                let through = upstream::run(node, e2e, focus, target).await;
                let table = Table::new(direct, &through);
                eprintln!("{label}: upstream e2e, direct vs through the gateway:\n{table}");
                if let Err(e) = table.verdict() {
                    self.failures
                        .push(format!("- [{}] upstream e2e: {e}", shape.name));
                }
                self.tables.push((shape.name, table));
            }
        }
        if let Err(e) = installed.uninstall().await {
            self.failures
                .push(format!("- [{}] helm uninstall: {e}", shape.name));
        }
    }

    /// The front door, last: it moves the node's components behind a gateway for good.
    async fn front_door(&mut self) {
        let focus = Focus::chosen(Focus::Conformance);
        self.direct(focus).await;
        let direct = self.direct.get(&focus);
        let (failures, table) = front_door::run(&mut self.node, self.e2e.as_deref(), direct).await;
        self.failures.extend(failures);
        if let Some(table) = table {
            self.tables.push((front_door::NAME, table));
        }
    }
}
