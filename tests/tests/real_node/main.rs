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
//! `REAL_NODE_CHECKS=<text>` runs only the checks whose name contains the text;
//! `REAL_NODE_SHAPES=<names>` (comma-separated: `cluster`, `native-sidecar`, `sidecar`,
//! `crd-core`) only those shapes. Every difference from what a user expects is stated where it is
//! checked.

mod day2;
mod shapes;
mod upstream;
mod usage;
mod wardle;

use std::time::Instant;

use e2e::real_node::{Cluster, NodeBinaries};

use shapes::{Installed, Node, Shape};

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
    let direct = match &binaries.e2e_test {
        Some(e2e) => Some(upstream::run(&node, e2e, upstream::Target::Direct).await),
        None => {
            eprintln!("real node: E2E_TEST is not set; the upstream e2e tests are skipped");
            None
        }
    };

    let mut failures = Vec::new();
    let mut tables = Vec::new();
    for shape in Shape::selected() {
        let label = format!("real node [{}]", shape.name);
        let installed = match Installed::install(&node, shape).await {
            Ok(installed) => installed,
            Err(e) => {
                eprintln!("{label}: install FAILED");
                failures.push(format!("- [{}] install: {e}", shape.name));
                continue;
            }
        };
        if shape.first_answer_is_timed {
            eprintln!(
                "real node: first kubectl answer through the gateway {:.1?} after the start of \
                 the session",
                installed.first_answer.duration_since(started)
            );
        }
        failures.extend(
            usage::run(&label, &installed)
                .await
                .into_iter()
                .map(|f| f.replacen("- ", &format!("- [{}] ", shape.name), 1)),
        );
        if let (Some(direct), Some(e2e)) = (&direct, &binaries.e2e_test) {
            if shape.runs_upstream_e2e {
                let through =
                    upstream::run(&node, e2e, upstream::Target::Gateway(&installed)).await;
                let table = upstream::Table::new(direct, &through);
                eprintln!("{label}: upstream e2e, direct vs through the gateway:\n{table}");
                if let Err(e) = table.verdict() {
                    failures.push(format!("- [{}] upstream e2e: {e}", shape.name));
                }
                tables.push((shape.name, table));
            }
        }
        if let Err(e) = installed.uninstall().await {
            failures.push(format!("- [{}] helm uninstall: {e}", shape.name));
        }
    }
    for (shape, table) in &tables {
        eprintln!("real node: upstream e2e table, shape {shape}:\n{table}");
    }
    eprintln!("real node: session took {:.1?}", started.elapsed());
    if !failures.is_empty() {
        eprintln!("{}", node.cluster.logs());
    }
    assert!(
        failures.is_empty(),
        "{} check(s) of the real node session failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
