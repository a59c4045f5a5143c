//! The `front-door` shape (issue 38): the gateway as the cluster's API endpoint, every component
//! behind it ([`e2e::real_node::Cluster::move_behind_gateway`]), run last in the session because
//! it rebuilds the node's control plane.
//!
//! What must hold, checked as a user and as the node would see it: the node Ready again and its
//! heartbeat Lease renewed through the gateway; the kubelet's TLS bootstrap (its CSR made with a
//! bootstrap token, approved and signed, the node on the issued certificate) and a rotation of
//! that certificate through the gateway; the kubelet reaching the core as
//! `system:node:<name>` in `system:nodes`, and the Node authorizer still refusing it a Secret no
//! Pod of its node uses; Pods started; `kubectl exec -i`, `logs -f` and `port-forward`; a
//! namespace with a Pod and a ConfigMap deleted to the end. Then the conformance focus with the
//! whole cluster behind the gateway beside the direct run, Pod start latency (create → Running,
//! median of 10) beside the same node without the gateway, and the gateway's CPU and memory
//! (per component with `REAL_NODE_USAGE_WINDOW`: [`super::component_load`]).

use std::path::Path;
use std::time::Duration;

use e2e::checks;
use e2e::harness::{wait_until, Kubectl, KubectlVersion};
use e2e::real_node::cluster::BOOTSTRAP_GROUP;
use e2e::real_node::pki::NODE_NAME;
use e2e::real_node::pod_start;
use e2e::table::run_checks;
use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::component_load::{self, Usage};
use super::shapes::Node;
use super::upstream::{self, Run, Table, Target};

/// The shape's name in `REAL_NODE_SHAPES`.
pub const NAME: &str = "front-door";
/// Pods per latency figure.
const PODS: usize = 10;

/// Whether `REAL_NODE_SHAPES` selects the front door (it does by default).
pub fn selected() -> bool {
    let only = std::env::var("REAL_NODE_SHAPES").unwrap_or_default();
    only.is_empty() || only.split(',').any(|s| s == NAME)
}

/// Moves the node behind the gateway, checks it, and runs `direct`'s focus through it. The
/// latency without the gateway is measured first, on the same node.
pub async fn run(
    node: &mut Node,
    e2e: Option<&Path>,
    direct: Option<&Run>,
) -> (Vec<String>, Option<Table>) {
    let label = format!("real node [{NAME}]");
    let mut failures = Vec::new();
    let direct_start = start_latency(node, "front-door-direct", &mut failures).await;
    let gateway = e2e::harness::ensure_release_gateway_built()
        .unwrap_or_else(|e| panic!("building the gateway's release binary: {e}"));
    if let Err(e) = node.cluster.move_behind_gateway(&gateway).await {
        failures.push(format!(
            "- [{NAME}] moving the node behind the gateway: {e}"
        ));
        return (failures, None);
    }
    let before = Usage::of(node);
    failures.extend(
        run_checks(
            &label,
            "REAL_NODE_CHECKS",
            &*node,
            checks![
                "the node Ready behind the gateway, its heartbeat Lease renewed" => node_ready,
                "kubelet TLS bootstrap and a client certificate rotation through the gateway" =>
                    tls_bootstrap,
                "the kubelet is system:node:<name> at the core; the Node authorizer still refuses it" =>
                    node_identity,
                "kubectl exec -i, logs -f and port-forward through the gateway" => streaming,
                "a namespace with a Pod and a ConfigMap is deleted to the end" => namespace_deletion,
            ],
        )
        .await
        .into_iter()
        .map(|f| f.replacen("- ", &format!("- [{NAME}] "), 1)),
    );
    // The rest of the session on certificates that live a year again: a renewal every two
    // minutes would have the kubelet drop its connections in the middle of the e2e run.
    if let Err(e) = node.cluster.restart_controller_manager() {
        failures.push(format!(
            "- [{NAME}] restarting kube-controller-manager: {e}"
        ));
    }
    let gateway_start = start_latency(node, "front-door-gateway", &mut failures).await;
    eprintln!(
        "{label}: Pod start (create → Running, median of {PODS}): {:.2} s directly, {:.2} s \
         behind the gateway",
        direct_start.as_secs_f64(),
        gateway_start.as_secs_f64()
    );
    let table = match (e2e, direct) {
        (Some(e2e), Some(direct)) => {
            let target = Target::Through {
                label: NAME.into(),
                kubeconfig: node.cluster.admin_kubeconfig(),
            };
            let through = upstream::run(node, e2e, direct.focus, target).await;
            let table = Table::new(direct, &through);
            eprintln!(
                "{label}: upstream e2e, direct vs the whole cluster behind the gateway:\n{table}"
            );
            if let Err(e) = table.verdict() {
                failures.push(format!("- [{NAME}] upstream e2e: {e}"));
            }
            Some(table)
        }
        _ => None,
    };
    let after = Usage::of(node);
    eprintln!("{label}: the gateway's {}", after.since(&before));
    if let Some(window) = component_load::window() {
        match component_load::run(node, window).await {
            Ok(usage) => eprintln!("{label}: the gateway's CPU and memory per component:\n{usage}"),
            Err(e) => failures.push(format!("- [{NAME}] usage per component: {e}")),
        }
    }
    (failures, table)
}

async fn start_latency(node: &Node, namespace: &str, failures: &mut Vec<String>) -> Duration {
    match pod_start::latencies(&node.cluster, namespace, PODS).await {
        Ok(took) => {
            let all: Vec<String> = took
                .iter()
                .map(|d| format!("{:.2}", d.as_secs_f64()))
                .collect();
            eprintln!(
                "real node [{NAME}]: Pod start in {namespace}: {} s",
                all.join(" ")
            );
            pod_start::median(&took)
        }
        Err(e) => {
            failures.push(format!("- [{NAME}] Pods started in {namespace}: {e}"));
            Duration::ZERO
        }
    }
}

async fn node_ready(node: &Node) {
    let admin = node.cluster.admin();
    let ready = admin
        .run_ok(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
        ])
        .await;
    assert_eq!(ready.stdout.trim(), "True", "the node is not Ready");
    let renewed = || async {
        admin
            .run_ok(&[
                "-n",
                "kube-node-lease",
                "get",
                "lease",
                NODE_NAME,
                "-o",
                "jsonpath={.spec.renewTime}",
            ])
            .await
            .stdout
    };
    let first = renewed().await;
    let moved = wait_until(Duration::from_secs(30), || async {
        renewed().await != first
    })
    .await;
    assert!(
        moved,
        "the node's Lease was not renewed in 30 s (still {first})"
    );
}

/// The cluster's CertificateSigningRequests.
async fn csrs(admin: &Kubectl) -> Vec<serde_json::Value> {
    let listed = admin.run_ok(&["get", "csr", "-o", "json"]).await;
    let list: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// When `csr`'s `Approved` condition was set by kube-controller-manager's csrapproving
/// controller (`AutoApproved`), if it was.
fn auto_approved_at(csr: &serde_json::Value) -> Option<Timestamp> {
    csr["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Approved" && c["reason"] == "AutoApproved")
        .and_then(|c| timestamp(&c["lastUpdateTime"]))
}

fn timestamp(value: &serde_json::Value) -> Option<Timestamp> {
    value.as_str()?.parse().ok()
}

/// Seconds from `from` to `to`, as the API's one-second timestamps allow.
fn seconds(from: Timestamp, to: Timestamp) -> i64 {
    to.as_second() - from.as_second()
}

/// The certificates (their base64 DER, without line breaks) of a PEM text.
fn certificates(pem: &str) -> Vec<String> {
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .filter_map(|rest| rest.split_once("-----END CERTIFICATE-----"))
        .map(|(body, _)| body.split_whitespace().collect())
        .collect()
}

/// The certificate `csr` was issued, as PEM, once kube-controller-manager signed it.
fn issued_pem(csr: &serde_json::Value) -> Option<String> {
    use base64::Engine as _;
    let encoded = csr["status"]["certificate"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(pem).ok().filter(|p| !p.is_empty())
}

/// Whether `csr` is approved by kube-controller-manager's csrapproving controller and signed.
fn approved_and_issued(csr: &serde_json::Value) -> bool {
    auto_approved_at(csr).is_some() && issued_pem(csr).is_some()
}

/// Whether `csr` issued the (first) certificate of `pem`, the kubelet's current file.
fn issued_this(csr: &serde_json::Value, pem: &str) -> bool {
    let (Some(issued), Some(current)) = (issued_pem(csr), certificates(pem).into_iter().next())
    else {
        return false;
    };
    certificates(&issued).contains(&current)
}

/// kubectl through the gateway with the kubelet's current issued certificate.
fn issued_kubectl(node: &Node) -> Kubectl {
    let c = &node.cluster;
    let current = c.kubelet_cert_dir().join("kubelet-client-current.pem");
    Kubectl::new(&c.url, Some(&c.pki.cluster_ca_file), KubectlVersion::V1_33)
        .and_then(|k| k.with_client_cert(&current, &current))
        .expect("a kubectl session with the kubelet's issued certificate")
}

async fn assert_node_identity(kubectl: &Kubectl) {
    let whoami = kubectl.run_ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&whoami.stdout).unwrap();
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"],
        format!("system:node:{NODE_NAME}"),
        "{whoami}"
    );
    let groups = user["groups"].as_array().cloned().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:nodes"), "{whoami}");
}

/// What the kubelet logs each time its client certificate changes (`pkg/kubelet/certificate/
/// transport.go`): once when the bootstrap's certificate first appears, then at every rotation.
const CERTIFICATE_SWITCH: &str =
    "Certificate rotation detected, shutting down client connections to start using new credentials";

async fn tls_bootstrap(node: &Node) {
    let c = &node.cluster;
    let token = c
        .bootstrap_token
        .as_deref()
        .expect("the kubelet started with a bootstrap token");
    let bootstrapper = format!("system:bootstrap:{}", &token[..6]);
    let node_user = format!("system:node:{NODE_NAME}");
    let admin = c.admin();
    // The bootstrap CSR: created with the token, which the gateway reviewed and passed on, so
    // kube-apiserver recorded the token's user and groups as the requester.
    let all = csrs(&admin).await;
    let first = all
        .iter()
        .find(|r| r["spec"]["username"] == bootstrapper.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no CSR by {bootstrapper}: {all:#?}"));
    assert_eq!(
        first["spec"]["signerName"], "kubernetes.io/kube-apiserver-client-kubelet",
        "{first:#}"
    );
    let groups = first["spec"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for group in ["system:bootstrappers", BOOTSTRAP_GROUP] {
        assert!(
            groups.iter().any(|g| g == group),
            "{group} missing: {first:#}"
        );
    }
    assert!(
        approved_and_issued(&first),
        "not approved and signed: {first:#}"
    );
    let first_created = timestamp(&first["metadata"]["creationTimestamp"]).expect("created");
    let first_approved = auto_approved_at(&first).expect("approved");
    let name = |csr: &serde_json::Value| csr["metadata"]["name"].as_str().unwrap_or("?").to_owned();
    let current = c.kubelet_cert_dir().join("kubelet-client-current.pem");
    let read_current = || {
        std::fs::read_to_string(&current)
            .unwrap_or_else(|e| panic!("the kubelet wrote no {}: {e}", current.display()))
    };
    let issued = read_current();
    assert_node_identity(&issued_kubectl(node)).await;

    // The renewal: a CSR made with the issued certificate, so the core records the identity the
    // gateway forwarded for it; approved as selfnodeclient; its certificate the kubelet's
    // current one. The kubelet logged the switch once already, when the bootstrap's certificate
    // appeared: a rotation is one more.
    let switches = || {
        c.component_logs("kubelet")
            .matches(CERTIFICATE_SWITCH)
            .count()
    };
    let switched_before = switches();
    let started = std::time::Instant::now();
    let deadline = started + Duration::from_secs(240);
    let (renewal, replaced, rotated_after) = loop {
        let pem = read_current();
        if pem != issued {
            let all = csrs(&admin).await;
            let of = |pem: &str| all.iter().find(|r| issued_this(r, pem)).cloned();
            let renewal = of(&pem)
                .unwrap_or_else(|| panic!("no CSR issued the kubelet's new certificate: {all:#?}"));
            let replaced = of(&issued)
                .unwrap_or_else(|| panic!("no CSR issued the kubelet's certificate: {all:#?}"));
            break (renewal, replaced, started.elapsed());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no rotation of the kubelet's certificate within 240 s (certificates live {}): {:#?}\n{}",
            e2e::real_node::cluster::SIGNING_DURATION,
            csrs(&admin).await,
            c.component_logs("kubelet")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(
        renewal["spec"]["username"],
        node_user.as_str(),
        "{renewal:#}"
    );
    assert_eq!(
        renewal["spec"]["signerName"], "kubernetes.io/kube-apiserver-client-kubelet",
        "{renewal:#}"
    );
    let renewal_groups = renewal["spec"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        renewal_groups.iter().any(|g| g == "system:nodes"),
        "{renewal:#}"
    );
    assert!(approved_and_issued(&renewal), "{renewal:#}");
    let renewal_created = timestamp(&renewal["metadata"]["creationTimestamp"]).expect("created");
    let renewal_approved = auto_approved_at(&renewal).expect("approved");
    let replaced_approved = auto_approved_at(&replaced).expect("approved");
    // The kubelet drops its connections once it uses the rotated certificate (it looks every
    // 10 s); its Lease renewed after that comes through the gateway on the new certificate.
    let dropped = wait_until(Duration::from_secs(30), || async {
        switches() > switched_before
    })
    .await;
    assert!(
        dropped,
        "the kubelet did not switch to the rotated certificate ({switched_before} switches \
         logged before the rotation, {} now)",
        switches()
    );
    let switched_after = started.elapsed();
    assert_node_identity(&issued_kubectl(node)).await;
    node_ready(node).await;
    eprintln!(
        "real node [{NAME}]: kubelet TLS bootstrap through the gateway: CSR {} of {bootstrapper} \
         approved {} s after it was made; renewal CSR {} of {node_user} made {} s after the \
         approval of {} (the certificate it replaced{}), approved {} s after it was made; the \
         rotated certificate seen on disk {:.0?} and the kubelet's switch to it {:.0?} into the \
         check",
        name(&first),
        seconds(first_created, first_approved),
        name(&renewal),
        seconds(replaced_approved, renewal_created),
        name(&replaced),
        if name(&replaced) == name(&first) {
            ": the bootstrap's"
        } else {
            ", an earlier renewal"
        },
        seconds(renewal_created, renewal_approved),
        rotated_after,
        switched_after,
    );
}

/// kubectl as the kubelet: its kubeconfig's certificate, the cluster's API endpoint.
fn kubelet_kubectl(node: &Node) -> Kubectl {
    let c = &node.cluster;
    Kubectl::new(&c.url, Some(&c.pki.cluster_ca_file), KubectlVersion::V1_33)
        .and_then(|k| k.with_client_cert(&c.pki.kubelet_client.cert, &c.pki.kubelet_client.key))
        .expect("a kubectl session as the kubelet")
}

async fn node_identity(node: &Node) {
    let kubelet = kubelet_kubectl(node);
    let whoami = kubelet.run_ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&whoami.stdout).unwrap();
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"],
        format!("system:node:{NODE_NAME}"),
        "{whoami}"
    );
    let groups = user["groups"].as_array().cloned().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:nodes"), "{whoami}");
    // A Secret no Pod of this node mounts: the Node authorizer decides, by the node's name.
    let refused = kubelet
        .run(&["-n", "gateway-system", "get", "secret", "gateway-serving"])
        .await;
    assert!(
        !refused.success(),
        "the kubelet read a Secret it has no Pod for:\n{refused}"
    );
    let expected = format!("no relationship found between node '{NODE_NAME}' and this object");
    assert!(
        refused.stderr.contains(&expected),
        "not the Node authorizer's refusal:\n{refused}"
    );
}

/// An agnhost Pod that logs a line every 200 ms and serves HTTP on 8080.
async fn streaming_pod(node: &Node, admin: &Kubectl) -> String {
    let image = node
        .agnhost
        .clone()
        .expect("E2E_TEST names an e2e.test whose agnhost is imported");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: front-door-stream, namespace: default}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: agnhost
    image: {image}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "(i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done) & exec /agnhost netexec --http-port=8080"]
"#
    );
    admin.apply_yaml(&pod).await;
    admin
        .run_ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/front-door-stream",
            "--timeout=60s",
        ])
        .await;
    "front-door-stream".into()
}

async fn streaming(node: &Node) {
    let admin = node.cluster.admin();
    let pod = streaming_pod(node, &admin).await;
    let echoed = admin
        .run_with_input(
            &["exec", "-i", &pod, "--", "cat"],
            "through the front door\n",
        )
        .await;
    assert_eq!(echoed.stdout, "through the front door\n", "{echoed}");
    let follow = admin.spawn(&["logs", "-f", &pod]).unwrap();
    let seen = follow
        .wait_for_line(|l| l.contains("line "), Duration::from_secs(10))
        .await;
    assert!(
        seen.is_some(),
        "logs -f printed nothing:\n{}",
        follow.logs()
    );
    let first = follow.line_count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        follow.line_count() > first + 3,
        "logs -f stopped following:\n{}",
        follow.logs()
    );
    drop(follow);
    let forward = admin
        .spawn(&["port-forward", &format!("pod/{pod}"), "18080:8080"])
        .unwrap();
    let listening = forward
        .wait_for_line(|l| l.contains("Forwarding from"), Duration::from_secs(30))
        .await;
    assert!(
        listening.is_some(),
        "port-forward did not start:\n{}",
        forward.logs()
    );
    let mut stream = tokio::net::TcpStream::connect("127.0.0.1:18080")
        .await
        .unwrap();
    stream
        .write_all(b"GET /hostname HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.ends_with(&pod), "port-forward answered:\n{answer}");
    drop(forward);
    admin.run_ok(&["delete", "pod", &pod, "--wait=false"]).await;
}

async fn namespace_deletion(node: &Node) {
    let admin = node.cluster.admin();
    let ns = "front-door-delete";
    admin.run_ok(&["create", "namespace", ns]).await;
    admin
        .run_ok(&[
            "-n",
            ns,
            "create",
            "configmap",
            "doomed",
            "--from-literal=a=b",
        ])
        .await;
    admin
        .run_ok(&[
            "-n",
            ns,
            "run",
            "doomed",
            "--image",
            e2e::real_node::cluster::PAUSE_IMAGE,
            "--image-pull-policy=Never",
        ])
        .await;
    let started = std::time::Instant::now();
    let deleted = admin
        .run(&["delete", "namespace", ns, "--timeout=120s"])
        .await;
    assert!(deleted.success(), "deleting {ns}:\n{deleted}");
    let gone = admin
        .run(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])
        .await;
    assert!(
        gone.stdout.trim().is_empty(),
        "{ns} is still there:\n{gone}"
    );
    eprintln!(
        "real node [{NAME}]: namespace {ns} deleted in {:.1?}",
        started.elapsed()
    );
}
