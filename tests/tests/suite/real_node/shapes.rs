//! The node prepared for the chart (images, Secrets, an admin ServiceAccount, sample-apiserver),
//! and the chart's documented shapes, each installed with helm the way the install notes say.
//!
//! | shape | core | the gateway's identity there | APIServices |
//! |---|---|---|---|
//! | `cluster` | the cluster's kube-apiserver (`https://kubernetes.default.svc`) | the Pod's ServiceAccount | built in |
//! | `native-sidecar` | kube-apiserver as a native sidecar, one more API server of this cluster (its etcd, its keys), on the Pod's loopback | the Pod's ServiceAccount | built in |
//! | `sidecar` | the same as an ordinary container (kept alive through the gateway's drain by a preStop sleep) | the Pod's ServiceAccount | built in |
//! | `crd-core` | our fixture core as a native sidecar: CRDs, no `apiregistration.k8s.io` (`--without-apiservices`) | a token from a Secret | the chart's CRD, applied to the core over port-forward as the notes say |

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::harness::{wait_until, Kubectl, KubectlVersion, Process};
use e2e::helm::{chart_dir, helm};
use e2e::real_node::conformance_images::Kind;
use e2e::real_node::image::ImageSpec;
use e2e::real_node::pki::NODE_IP;
use e2e::real_node::Cluster;

use super::upstream::Focus;
use super::wardle;

pub const RELEASE: &str = "edge";
pub const NAMESPACE: &str = "gateway-system";
pub const FULLNAME: &str = "edge-aggregation-gateway";
/// The name the gateway's serving certificate is issued for, and kubectl verifies.
pub const SERVICE_DNS: &str = "edge-aggregation-gateway.gateway-system.svc";
pub const GATEWAY_IMAGE: &str = "localhost/aggregation-gateway:dev";
pub const KUBE_APISERVER_IMAGE: &str = "localhost/kube-apiserver:v1.33.13";
pub const FIXTURE_CORE_IMAGE: &str = "localhost/fixture-core:dev";
/// The fixture core's token for the gateway, and a user's.
const FIXTURE_GATEWAY_TOKEN: &str = "fixture-gateway-token";
pub const FIXTURE_USER_TOKEN: &str = "fixture-user-token";
/// The sidecar kube-apiserver's port on the Pod's loopback.
const SIDECAR_PORT: u16 = 6444;

/// The node, ready for the chart.
pub struct Node {
    pub cluster: Cluster,
    /// A cluster-admin ServiceAccount's token (`gateway-system/e2e-admin`).
    pub admin_token: String,
    /// The agnhost image `e2e.test` runs, when it is given.
    pub agnhost: Option<String>,
    /// Helm's own files.
    helm_home: tempfile::TempDir,
}

impl Node {
    /// Imports the images, creates the Secrets every shape mounts, an admin ServiceAccount, and
    /// runs sample-apiserver as a Pod.
    pub async fn prepare(cluster: Cluster, fixture_core: &Path) -> Node {
        let gateway = e2e::harness::ensure_release_gateway_built()
            .unwrap_or_else(|e| panic!("building the gateway's release binary: {e}"));
        let b = &cluster.binaries.control_plane;
        for spec in [
            ImageSpec::gateway(&gateway, GATEWAY_IMAGE),
            ImageSpec::binary(&b.kube_apiserver, KUBE_APISERVER_IMAGE, 65532, 65532),
            ImageSpec::binary(&b.sample_apiserver, wardle::IMAGE, 65532, 65532),
            ImageSpec::binary(fixture_core, FIXTURE_CORE_IMAGE, 65532, 65532),
        ] {
            cluster
                .import_image(&spec)
                .unwrap_or_else(|e| panic!("importing {}: {e}", spec.reference));
        }
        // What the upstream specs run (the Aggregator spec's sample-apiserver and etcd among
        // them, as root as upstream's images run; Debian's etcd 3.4 stands in for the tag's
        // 3.5/3.6), under the names the release's manifest gives them.
        let mut agnhost = None;
        if let Some(e2e) = &cluster.binaries.e2e_test {
            let images = cluster
                .import_conformance_images(e2e)
                .unwrap_or_else(|e| panic!("importing the conformance images: {e}"));
            eprintln!(
                "real node: images e2e.test lists but no spec of the focus runs (not built): {}",
                images.missing.join(" ")
            );
            agnhost = images.built(Kind::Agnhost).map(str::to_owned);
        }
        let admin = cluster.admin();
        admin.run_ok(&["create", "namespace", NAMESPACE]).await;
        let pki = &cluster.pki;
        let serving = pki
            .cluster_ca
            .issue_server(&[SERVICE_DNS, &format!("{SERVICE_DNS}.cluster.local")]);
        let dir = cluster.dir().join("secrets");
        std::fs::create_dir_all(&dir).unwrap();
        let (serving_cert, serving_key) = serving.write(&dir, "gateway-serving").unwrap();
        let tls_secret = |name: &str, cert: &Path, key: &Path, ca: &Path| {
            vec![
                "create".to_owned(),
                "secret".into(),
                "generic".into(),
                name.into(),
                "-n".into(),
                NAMESPACE.into(),
                "--type".into(),
                "kubernetes.io/tls".into(),
                format!("--from-file=tls.crt={}", cert.display()),
                format!("--from-file=tls.key={}", key.display()),
                format!("--from-file=ca.crt={}", ca.display()),
            ]
        };
        for args in [
            tls_secret(
                "gateway-serving",
                &serving_cert,
                &serving_key,
                &pki.cluster_ca_file,
            ),
            tls_secret(
                "gateway-proxy-client",
                &pki.front_proxy_client.cert,
                &pki.front_proxy_client.key,
                &pki.front_proxy_ca_file,
            ),
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            admin.run_ok(&args).await;
        }
        // The sidecar kube-apiserver's files: it is one more API server of this cluster.
        let file = |p: &Path| p.display().to_string();
        let from = |key: &str, p: &Path| format!("--from-file={key}={}", file(p));
        admin
            .run_ok(&[
                "create",
                "secret",
                "generic",
                "core-pki",
                "-n",
                NAMESPACE,
                &from("ca.crt", &pki.cluster_ca_file),
                &from("apiserver.crt", &pki.apiserver_serving.cert),
                &from("apiserver.key", &pki.apiserver_serving.key),
                &from("sa.pub", &pki.service_account_pub),
                &from("sa.key", &pki.service_account_key),
                &from("front-proxy-ca.crt", &pki.front_proxy_ca_file),
                &from("front-proxy-client.crt", &pki.front_proxy_client.cert),
                &from("front-proxy-client.key", &pki.front_proxy_client.key),
                &from("kubelet-client.crt", &pki.apiserver_kubelet_client.cert),
                &from("kubelet-client.key", &pki.apiserver_kubelet_client.key),
            ])
            .await;
        admin
            .run_ok(&[
                "create",
                "secret",
                "generic",
                "core-ca",
                "-n",
                NAMESPACE,
                &from("ca.crt", &pki.cluster_ca_file),
            ])
            .await;
        // The fixture core's policy: the gateway's token and a user's, both allowed everything.
        let policy = serde_json::json!({
            "tokens": {
                FIXTURE_GATEWAY_TOKEN: {"username": "edge-gateway", "groups": ["system:masters"]},
                FIXTURE_USER_TOKEN: {"username": "alice", "groups": ["system:masters"]},
            },
            "rules": [
                {"group": "system:masters", "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                {"group": "system:masters", "verbs": ["*"], "nonResourceURLs": ["*"]},
            ],
        });
        std::fs::write(dir.join("policy.json"), policy.to_string()).unwrap();
        admin
            .run_ok(&[
                "create",
                "secret",
                "generic",
                "fixture-core-policy",
                "-n",
                NAMESPACE,
                &from("policy.json", &dir.join("policy.json")),
            ])
            .await;
        admin
            .run_ok(&[
                "create",
                "secret",
                "generic",
                "fixture-core-token",
                "-n",
                NAMESPACE,
                &format!("--from-literal=token={FIXTURE_GATEWAY_TOKEN}"),
            ])
            .await;
        // alice is the user the fixture core authenticates; sample-apiserver asks this cluster.
        admin
            .run_ok(&[
                "create",
                "clusterrolebinding",
                "e2e-alice",
                "--clusterrole=cluster-admin",
                "--user=alice",
            ])
            .await;
        admin
            .run_ok(&["create", "serviceaccount", "e2e-admin", "-n", NAMESPACE])
            .await;
        admin
            .run_ok(&[
                "create",
                "clusterrolebinding",
                "e2e-admin",
                "--clusterrole=cluster-admin",
                &format!("--serviceaccount={NAMESPACE}:e2e-admin"),
            ])
            .await;
        let token = admin
            .run_ok(&[
                "create",
                "token",
                "e2e-admin",
                "-n",
                NAMESPACE,
                "--duration",
                "24h",
            ])
            .await
            .stdout
            .trim()
            .to_owned();
        wardle::deploy(&cluster).await;
        Node {
            cluster,
            admin_token: token,
            agnhost,
            helm_home: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs helm as the cluster's admin; stdout, or everything it said on failure.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        let home = self.helm_home.path();
        let out = Command::new(helm())
            .args(args)
            .arg("--kubeconfig")
            .arg(self.cluster.admin_kubeconfig())
            .env("HOME", home)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("KUBECONFIG")
            .output()
            .expect("run helm");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "$ helm {}\n{stdout}\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// A values file in the cluster's directory.
    pub(super) fn values_file(&self, name: &str, yaml: &str) -> PathBuf {
        let path = self.cluster.dir().join(format!("values-{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

/// Where the core is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    Cluster,
    KubeApiserverSidecar { native: bool },
    CrdFixture,
}

/// One way of installing the chart.
pub struct Shape {
    pub name: &'static str,
    pub core: Core,
    /// Kubernetes' e2e tests need the core to be this cluster (Pods, nodes): all but `crd-core`.
    pub runs_upstream_e2e: bool,
    /// Which of them, unless `REAL_NODE_UPSTREAM` says ([`Focus::chosen`]).
    pub upstream_focus: Focus,
    /// The first shape's first answer is the suite's "from nothing to kubectl" time.
    pub first_answer_is_timed: bool,
}

pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "cluster",
        upstream_focus: Focus::Conformance,
        core: Core::Cluster,
        runs_upstream_e2e: true,
        first_answer_is_timed: true,
    },
    Shape {
        name: "native-sidecar",
        upstream_focus: Focus::Apimachinery,
        core: Core::KubeApiserverSidecar { native: true },
        runs_upstream_e2e: true,
        first_answer_is_timed: false,
    },
    Shape {
        name: "sidecar",
        upstream_focus: Focus::Apimachinery,
        core: Core::KubeApiserverSidecar { native: false },
        runs_upstream_e2e: true,
        first_answer_is_timed: false,
    },
    Shape {
        name: "crd-core",
        upstream_focus: Focus::Apimachinery,
        core: Core::CrdFixture,
        runs_upstream_e2e: false,
        first_answer_is_timed: false,
    },
];

impl Shape {
    /// The shapes `REAL_NODE_SHAPES` selects (all by default).
    pub fn selected() -> Vec<&'static Shape> {
        let only = std::env::var("REAL_NODE_SHAPES").unwrap_or_default();
        let only: Vec<&str> = only.split(',').filter(|s| !s.is_empty()).collect();
        SHAPES
            .iter()
            .filter(|s| only.is_empty() || only.contains(&s.name))
            .collect()
    }

    /// The values a user of this shape writes.
    fn values(&self) -> String {
        // The fixture core keeps its state in memory, per Pod: one replica, one core.
        let replicas = if self.core == Core::CrdFixture { 1 } else { 2 };
        let common = format!(
            r#"replicaCount: {replicas}
image: {{repository: localhost/aggregation-gateway, tag: dev, pullPolicy: Never}}
tls:
  serving: {{secretName: gateway-serving}}
  proxyClient: {{secretName: gateway-proxy-client}}
shutdown: {{delayDuration: 5s, timeout: 20s}}
"#
        );
        let shape = match self.core {
            Core::Cluster => String::new(),
            Core::KubeApiserverSidecar { native } => format!(
                r#"core:
  caSecret: core-ca
  sidecar:
    enabled: true
    native: {native}
    image: {{repository: localhost/kube-apiserver, tag: v1.33.13, pullPolicy: Never}}
    scheme: https
    port: {SIDECAR_PORT}
    args:
      - --etcd-servers=http://{NODE_IP}:23379
      - --bind-address=127.0.0.1
      - --secure-port={SIDECAR_PORT}
      - --endpoint-reconciler-type=none
      - --tls-cert-file=/pki/apiserver.crt
      - --tls-private-key-file=/pki/apiserver.key
      - --client-ca-file=/pki/ca.crt
      - --authorization-mode=Node,RBAC
      - --enable-admission-plugins=NodeRestriction
      - --allow-privileged=true
      - --service-cluster-ip-range=10.96.0.0/16
      - --service-account-issuer=https://kubernetes.default.svc.cluster.local
      - --service-account-key-file=/pki/sa.pub
      - --service-account-signing-key-file=/pki/sa.key
      - --kubelet-client-certificate=/pki/kubelet-client.crt
      - --kubelet-client-key=/pki/kubelet-client.key
      - --kubelet-preferred-address-types=InternalIP,Hostname
      - --requestheader-client-ca-file=/pki/front-proxy-ca.crt
      - --requestheader-allowed-names=front-proxy-client
      - --requestheader-username-headers=X-Remote-User
      - --requestheader-group-headers=X-Remote-Group
      - --requestheader-extra-headers-prefix=X-Remote-Extra-
      - --proxy-client-cert-file=/pki/front-proxy-client.crt
      - --proxy-client-key-file=/pki/front-proxy-client.key
    volumeMounts:
      - {{name: core-pki, mountPath: /pki, readOnly: true}}
extraVolumes:
  - name: core-pki
    secret: {{secretName: core-pki}}
"#
            ),
            Core::CrdFixture => r#"core:
  serviceAccountAuth: false
  tokenSecret: fixture-core-token
  sidecar:
    enabled: true
    image: {repository: localhost/fixture-core, tag: dev, pullPolicy: Never}
    scheme: http
    port: 8080
    args:
      - --listen=127.0.0.1:8080
      - --crds
      - --without-apiservices
      - --policy=/policy/policy.json
    volumeMounts:
      - {name: policy, mountPath: /policy, readOnly: true}
extraVolumes:
  - name: policy
    secret: {secretName: fixture-core-policy}
crd:
  create: true
# The fixture core authorizes by its own policy: it has no RBAC API to apply rules to.
rbac:
  create: false
serviceResolution:
  enabled: false
  staticServices:
    - {namespace: wardle, name: api, port: 443, urls: ["https://api.wardle.svc.cluster.local:443"]}
"#
            .to_owned(),
        };
        format!("{common}{shape}")
    }
}

/// A shape installed and answering through its Service.
pub struct Installed<'a> {
    pub node: &'a Node,
    pub shape: &'static Shape,
    /// A user's kubectl through the gateway's Service (ClusterIP, certificate verified as the
    /// Service's name).
    pub kubectl: Kubectl,
    /// The gateway's Service ClusterIP.
    pub service_ip: String,
    /// When kubectl first got an answer through the gateway.
    pub first_answer: Instant,
    /// The release's manifest, to check that uninstall removes all of it.
    manifest: PathBuf,
}

impl<'a> Installed<'a> {
    /// `helm install`, the notes' steps in their order, and the first answer through the gateway.
    pub async fn install(node: &'a Node, shape: &'static Shape) -> Result<Installed<'a>, String> {
        let values = node.values_file(shape.name, &shape.values());
        let chart = chart_dir().display().to_string();
        let out = node.helm(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "-f",
            &values.display().to_string(),
        ])?;
        let notes = out
            .split_once("NOTES:")
            .map(|(_, n)| n.to_owned())
            .unwrap_or_default();
        let admin = node.cluster.admin();
        if shape.core == Core::CrdFixture {
            bootstrap_fixture_core(node, &notes).await?;
        }
        let rollout = admin
            .run(&[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                &format!("deployment/{FULLNAME}"),
                "--timeout=180s",
            ])
            .await;
        if !rollout.success() {
            return Err(format!(
                "the rollout did not finish:\n{rollout}\n{}",
                pod_report(&admin).await
            ));
        }
        let service_ip = admin
            .run_ok(&[
                "-n",
                NAMESPACE,
                "get",
                "service",
                FULLNAME,
                "-o",
                "jsonpath={.spec.clusterIP}",
            ])
            .await
            .stdout;
        let token = match shape.core {
            Core::CrdFixture => FIXTURE_USER_TOKEN.to_owned(),
            _ => node.admin_token.clone(),
        };
        let kubectl = Kubectl::new(
            &format!("https://{service_ip}:443"),
            Some(&node.cluster.pki.cluster_ca_file),
            KubectlVersion::V1_33,
        )
        .and_then(|k| k.with_tls_server_name(SERVICE_DNS))
        .and_then(|k| k.with_token(&token))
        .map_err(|e| e.to_string())?;
        // kube-proxy may program the new Service a moment after the rollout says done.
        let answered = wait_until(Duration::from_secs(30), || async {
            kubectl.run(&["get", "--raw", "/version"]).await.success()
        })
        .await;
        let first_answer = Instant::now();
        if !answered {
            let out = kubectl.run(&["get", "--raw", "/version"]).await;
            return Err(format!("no answer through the gateway's Service:\n{out}"));
        }
        let manifest = node
            .cluster
            .dir()
            .join(format!("manifest-{}.yaml", shape.name));
        std::fs::write(
            &manifest,
            node.helm(&["get", "manifest", RELEASE, "-n", NAMESPACE])?,
        )
        .unwrap();
        Ok(Installed {
            node,
            shape,
            kubectl,
            service_ip,
            first_answer,
            manifest,
        })
    }

    /// `helm uninstall`, then nothing of the release may be left.
    pub async fn uninstall(&self) -> Result<(), String> {
        self.node.helm(&["uninstall", RELEASE, "-n", NAMESPACE])?;
        let admin = self.node.cluster.admin();
        let _ = admin
            .run(&[
                "-n",
                NAMESPACE,
                "wait",
                "--for=delete",
                "pod",
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
                "--timeout=120s",
            ])
            .await;
        let left = admin
            .run(&[
                "get",
                "-f",
                &self.manifest.display().to_string(),
                "-o",
                "name",
                "--ignore-not-found",
            ])
            .await;
        if !left.stdout.trim().is_empty() {
            return Err(format!("helm uninstall left objects behind:\n{left}"));
        }
        let labelled = admin
            .run_ok(&[
                "get",
                "all,configmaps,secrets,roles,rolebindings,clusterroles,clusterrolebindings,poddisruptionbudgets",
                "-A",
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
                "-o",
                "name",
            ])
            .await;
        if !labelled.stdout.trim().is_empty() {
            return Err(format!(
                "objects labelled with the release remain:\n{labelled}"
            ));
        }
        Ok(())
    }

    /// The gateway's Pods' names.
    pub async fn pods(&self) -> Vec<String> {
        self.pods_jsonpath(
            &["--field-selector=status.phase=Running"],
            "{.items[*].metadata.name}",
        )
        .await
        .split_whitespace()
        .map(str::to_owned)
        .collect()
    }

    /// `jsonpath` over the release's Pods, narrowed by `selectors` (kubectl flags).
    pub async fn pods_jsonpath(&self, selectors: &[&str], jsonpath: &str) -> String {
        let label = format!("app.kubernetes.io/instance={RELEASE}");
        let output = format!("jsonpath={jsonpath}");
        let mut args = vec!["-n", NAMESPACE, "get", "pods", "-l", &label];
        args.extend_from_slice(selectors);
        args.extend(["-o", output.as_str()]);
        self.node.cluster.admin().run_ok(&args).await.stdout
    }

    /// `helm upgrade --reuse-values` of the release with `values` (Helm flags: `--set k=v`,
    /// `-f file`) on top.
    pub fn upgrade(&self, values: &[&str]) {
        let chart = chart_dir().display().to_string();
        let mut args = vec![
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--reuse-values",
        ];
        args.extend_from_slice(values);
        self.node
            .helm(&args)
            .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    }
}

/// Step 1 of the notes for a core Helm cannot reach: port-forward to the core's container and
/// apply the ConfigMap's manifests to it, before the rollout can finish.
async fn bootstrap_fixture_core(node: &Node, notes: &str) -> Result<(), String> {
    let admin = node.cluster.admin();
    let forward = format!("port-forward deployment/{FULLNAME} 18443:8080");
    let crd_step = "get configmap edge-aggregation-gateway-core -o jsonpath='{.data.apiservice-crd\\.yaml}' | kubectl --context core apply -f -";
    for step in [forward.as_str(), crd_step, "kubectl --context core wait --for condition=established crd/apiservices.apiregistration.k8s.io"] {
        if !notes.contains(step) {
            return Err(format!("the notes lack the step {step:?}:\n{notes}"));
        }
    }
    if let Some(rollout) = notes.find("rollout status") {
        if notes.find(&forward).is_some_and(|f| f > rollout) {
            return Err(format!(
                "the notes wait for the rollout before bootstrapping the core:\n{notes}"
            ));
        }
    }
    // The Pod must be Running (not Ready: it cannot be until this is done) for port-forward.
    let running = wait_until(Duration::from_secs(120), || async {
        admin
            .run(&[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
                "-o",
                "jsonpath={.items[*].status.phase}",
            ])
            .await
            .stdout
            .contains("Running")
    })
    .await;
    if !running {
        return Err(format!(
            "no gateway Pod is Running:\n{}",
            pod_report(&admin).await
        ));
    }
    let forward: Process = admin
        .spawn(&[
            "-n",
            NAMESPACE,
            "port-forward",
            &format!("deployment/{FULLNAME}"),
            "18443:8080",
        ])
        .map_err(|e| e.to_string())?;
    if forward
        .wait_for_line(|l| l.contains("Forwarding from"), Duration::from_secs(30))
        .await
        .is_none()
    {
        return Err(format!("port-forward did not start:\n{}", forward.logs()));
    }
    let core = Kubectl::new("http://127.0.0.1:18443", None, KubectlVersion::V1_33)
        .and_then(|k| k.with_token(FIXTURE_USER_TOKEN))
        .map_err(|e| e.to_string())?;
    let crd = admin
        .run_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "configmap",
            &format!("{FULLNAME}-core"),
            "-o",
            "jsonpath={.data.apiservice-crd\\.yaml}",
        ])
        .await
        .stdout;
    let applied = core.run_with_input(&["apply", "-f", "-"], &crd).await;
    if !applied.success() {
        return Err(format!(
            "applying the APIService CRD to the core:\n{applied}"
        ));
    }
    let established = core
        .run(&[
            "wait",
            "--for",
            "condition=established",
            "crd/apiservices.apiregistration.k8s.io",
            "--timeout=60s",
        ])
        .await;
    if !established.success() {
        return Err(format!(
            "the APIService CRD was not established:\n{established}"
        ));
    }
    Ok(())
}

/// Every Pod of the release with its containers' states, and the events, for failure messages.
pub async fn pod_report(admin: &Kubectl) -> String {
    let pods = admin
        .run(&["-n", NAMESPACE, "get", "pods", "-o", "wide"])
        .await;
    let describe = admin
        .run(&[
            "-n",
            NAMESPACE,
            "describe",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
        ])
        .await;
    let logs = admin
        .run(&[
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "--all-containers",
            "--tail=40",
            "--prefix",
        ])
        .await;
    format!("{}\n{}\n{}", pods.stdout, describe.stdout, logs.stdout)
}
