//! The front door (issue 38): the gateway becomes the cluster's API endpoint, what kubeadm calls
//! the control-plane endpoint, with kube-apiserver its sibling behind it on the loopback.
//!
//! [`Cluster::move_behind_gateway`] does on the running node what an operator does on a
//! control-plane host: stop the components, start kube-apiserver again on `127.0.0.1:6444`
//! (`--endpoint-reconciler-type=none`: its own address is no longer the one clients use;
//! `--service-account-jwks-uri` on the gateway's address, or the OIDC discovery document sends
//! relying parties to the loopback port; `--enable-bootstrap-token-auth`), start
//! the gateway as a host process on the node's address `10.200.0.1:6443`, pin the `kubernetes`
//! Service's endpoints to the gateway, and start kube-controller-manager, kube-scheduler and
//! kube-proxy again on their unchanged kubeconfigs, which name `10.200.0.1:6443`.
//!
//! The kubelet comes back as a new node joins a kubeadm cluster: TLS bootstrap through the
//! gateway. A bootstrap token (a `bootstrap.kubernetes.io/token` Secret whose users are in
//! [`BOOTSTRAP_GROUP`]) and kubeadm's three ClusterRoleBindings (that group may create CSRs and
//! have its node-client CSRs approved; `system:nodes` may have its renewals approved), a
//! bootstrap kubeconfig with the token, `rotateCertificates`. The kubelet's CSR, its watch for the
//! signed certificate, and later its renewals signed by kube-controller-manager (whose
//! certificates live [`SIGNING_DURATION`], so a rotation comes within minutes) all pass through
//! the gateway, which reviews the token with a TokenReview and passes it on, and forwards each
//! issued certificate's identity in request headers.
//!
//! The gateway's flags ([`gateway_command`]): kube-apiserver's serving certificate (issued for
//! `10.200.0.1`, `10.96.0.1` and the `kubernetes` names, so every client verifies it as it did),
//! the cluster CA as `--client-ca-file` (the kubelet's `system:node:<name>` certificate and every
//! component's are verified there and forwarded in request headers), the front-proxy client
//! certificate kube-apiserver trusts for those headers, and a client certificate of its own for
//! its own requests (here in `system:masters`, as kube-apiserver's loopback client is; a
//! production gateway gets the chart's ClusterRole instead).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Cluster, KubeletLogin, APISERVER_PORT};
use crate::harness::parse_serving_line;
use crate::real_node::pki::{NODE_IP, NODE_NAME};

/// kube-apiserver's port on the loopback behind the gateway.
pub const CORE_PORT: u16 = 6444;
/// The gateway's process name in [`Cluster::logs`].
pub const GATEWAY: &str = "front-door-gateway";
/// The gateway's own user at the core.
const GATEWAY_USER: &str = "aggregation-gateway";
/// The group kubeadm gives its join tokens' users (`auth-extra-groups`), which its RBAC lets
/// create CSRs and have node-client CSRs approved.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// How long the certificates kube-controller-manager signs live while the bootstrap is checked.
/// It backdates each by 5 minutes and the kubelet renews at 70–90 % of the whole lifetime, so a
/// 3-minute certificate is renewed 0.6–2.2 minutes after it is issued.
pub const SIGNING_DURATION: &str = "3m";

/// A component that talks to the cluster's API endpoint, for [`Cluster::route_components`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Kubelet,
    ControllerManager,
    Scheduler,
    Proxy,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Kubelet,
        Component::ControllerManager,
        Component::Scheduler,
        Component::Proxy,
    ];

    /// Its process name.
    pub fn name(self) -> &'static str {
        match self {
            Component::Kubelet => "kubelet",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Proxy => "kube-proxy",
        }
    }
}

impl Cluster {
    /// Puts the gateway in front of every component; see the module docs. Returns once the
    /// node is Ready again behind it.
    pub async fn move_behind_gateway(&mut self, gateway: &Path) -> Result<(), String> {
        self.stop(&[
            "kube-proxy",
            "kubelet",
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
        ]);
        // The discovery document's `jwks_uri` defaults to kube-apiserver's own address
        // (`https://<advertise address>:<secure port>/openid/v1/jwks`), now a loopback port no
        // relying party reaches: name the gateway's instead.
        let jwks =
            format!("--service-account-jwks-uri=https://{NODE_IP}:{APISERVER_PORT}/openid/v1/jwks");
        let extra = [
            "--endpoint-reconciler-type=none",
            jwks.as_str(),
            "--enable-bootstrap-token-auth",
        ];
        self.start_kube_apiserver("127.0.0.1", CORE_PORT, &extra)
            .await?;
        self.core_url = format!("https://127.0.0.1:{CORE_PORT}");
        let command = self.gateway_command(gateway);
        let process = self.spawn(GATEWAY, command)?;
        if process
            .wait_for_line(|l| parse_serving_line(l).is_some(), Duration::from_secs(60))
            .await
            .is_none()
        {
            return Err(format!("the gateway did not serve:\n{}", process.logs()));
        }
        self.pin_kubernetes_endpoints().await?;
        let url = self.url.clone();
        let signing = format!("--cluster-signing-duration={SIGNING_DURATION}");
        self.start_controller_manager(&url, &[&signing])?;
        self.start_scheduler(&url)?;
        let token = self.create_bootstrap_token().await?;
        self.start_kubelet(&KubeletLogin::Bootstrap {
            server: url.clone(),
            token,
        })?;
        self.start_proxy(&url)?;
        self.wait_node_ready().await?;
        eprintln!(
            "real node: {NODE_NAME} Ready behind the gateway on {} after {:.1?}",
            self.url,
            self.started.elapsed()
        );
        Ok(())
    }

    /// Starts kube-controller-manager again with its usual signing duration (a year), once the
    /// short-lived certificates have shown a rotation.
    pub fn restart_controller_manager(&mut self) -> Result<(), String> {
        self.stop(&[Component::ControllerManager.name()]);
        let url = self.url.clone();
        self.start_controller_manager(&url, &[])
    }

    /// Starts every [`Component`] again, those in `through_gateway` on the gateway's address and
    /// the others on kube-apiserver's own; the kubelet keeps the certificate it last rotated to.
    /// Returns once the node is Ready.
    pub async fn route_components(&mut self, through_gateway: &[Component]) -> Result<(), String> {
        let names: Vec<&str> = Component::ALL.iter().rev().map(|c| c.name()).collect();
        self.stop(&names);
        let server = |c: Component| {
            if through_gateway.contains(&c) {
                self.url.clone()
            } else {
                self.core_url.clone()
            }
        };
        let (kcm, sched, kubelet, proxy) = (
            server(Component::ControllerManager),
            server(Component::Scheduler),
            server(Component::Kubelet),
            server(Component::Proxy),
        );
        self.start_controller_manager(&kcm, &[])?;
        self.start_scheduler(&sched)?;
        let current = self.kubelet_cert_dir().join("kubelet-client-current.pem");
        self.start_kubelet(&KubeletLogin::Certificate {
            server: kubelet,
            cert: current.clone(),
            key: current,
            rotate: true,
        })?;
        self.start_proxy(&proxy)?;
        self.wait_node_ready().await
    }

    /// A bootstrap token and the RBAC kubeadm creates for it (`kubeadm init` phase
    /// `bootstrap-token`); returns the token.
    async fn create_bootstrap_token(&mut self) -> Result<String, String> {
        // Token ids and secrets are `[a-z0-9]{6}` and `[a-z0-9]{16}`; hex of a fresh hash fits.
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        let hash = hex::encode(Sha256::digest(seed.as_bytes()));
        let (id, secret) = (&hash[..6], &hash[6..22]);
        let bind = |name: &str, role: &str, group: &str| {
            format!(
                r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "{name}"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "{role}"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "{group}"}}]
---
"#
            )
        };
        let csr_role = "system:certificates.k8s.io:certificatesigningrequests";
        let manifest = format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: bootstrap-token-{id}, namespace: kube-system}}
type: bootstrap.kubernetes.io/token
stringData:
  description: the front door's kubelet TLS bootstrap
  token-id: "{id}"
  token-secret: "{secret}"
  usage-bootstrap-authentication: "true"
  usage-bootstrap-signing: "true"
  auth-extra-groups: "{BOOTSTRAP_GROUP}"
---
{}{}{}"#,
            bind(
                "kubeadm:kubelet-bootstrap",
                "system:node-bootstrapper",
                BOOTSTRAP_GROUP
            ),
            bind(
                "kubeadm:node-autoapprove-bootstrap",
                &format!("{csr_role}:nodeclient"),
                BOOTSTRAP_GROUP
            ),
            bind(
                "kubeadm:node-autoapprove-certificate-rotation",
                &format!("{csr_role}:selfnodeclient"),
                "system:nodes"
            ),
        );
        let applied = self.admin().apply_yaml(&manifest).await;
        if !applied.success() {
            return Err(format!("creating the bootstrap token:\n{applied}"));
        }
        let token = format!("{id}.{secret}");
        self.bootstrap_token = Some(token.clone());
        Ok(token)
    }

    /// The front door's gateway process id, once it runs.
    pub fn gateway_pid(&self) -> Option<u32> {
        self.processes
            .iter()
            .find(|p| p.name() == GATEWAY)
            .map(|p| p.id())
    }

    /// The gateway on the node's address in front of kube-apiserver on the loopback.
    fn gateway_command(&self, gateway: &Path) -> Command {
        let p = &self.pki;
        let own = p.cluster_ca.issue_client(GATEWAY_USER, &["system:masters"]);
        let (own_cert, own_key) = own
            .write(&self.dir.path().join("pki"), "front-door-gateway")
            .expect("writing the gateway's client certificate");
        let path = |p: &Path| p.display().to_string();
        let mut command = Command::new(gateway);
        command.args([
            "--bind-address",
            NODE_IP,
            "--secure-port",
            &APISERVER_PORT.to_string(),
            "--tls-cert-file",
            &path(&p.apiserver_serving.cert),
            "--tls-private-key-file",
            &path(&p.apiserver_serving.key),
            "--client-ca-file",
            &path(&p.cluster_ca_file),
            "--core-url",
            &self.core_url,
            "--core-ca-file",
            &path(&p.cluster_ca_file),
            "--core-client-cert-file",
            &path(&own_cert),
            "--core-client-key-file",
            &path(&own_key),
            "--proxy-client-cert-file",
            &path(&p.front_proxy_client.cert),
            "--proxy-client-key-file",
            &path(&p.front_proxy_client.key),
            "--logging-format",
            "json",
            // Warnings and errors, and the `serving` line this waits for; no access log.
            "--log-level",
            "warn,aggregation_gateway::app::tls=info",
        ]);
        command
    }

    /// `default/kubernetes` names the gateway: kube-apiserver's reconciler is off, so the
    /// Endpoints and the EndpointSlice kube-proxy routes by are written here.
    async fn pin_kubernetes_endpoints(&self) -> Result<(), String> {
        let manifest = format!(
            r#"apiVersion: v1
kind: Endpoints
metadata: {{name: kubernetes, namespace: default, labels: {{endpointslice.kubernetes.io/skip-mirror: "true"}}}}
subsets:
- addresses: [{{ip: {NODE_IP}}}]
  ports: [{{name: https, port: {APISERVER_PORT}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {{kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: front-door}}
addressType: IPv4
endpoints:
- addresses: [{NODE_IP}]
  conditions: {{ready: true}}
ports: [{{name: https, port: {APISERVER_PORT}, protocol: TCP}}]
"#
        );
        let applied = self.admin().apply_yaml(&manifest).await;
        if applied.success() {
            Ok(())
        } else {
            Err(format!("pinning the kubernetes endpoints:\n{applied}"))
        }
    }

    /// Stops the named components, in the order given.
    fn stop(&mut self, names: &[&str]) {
        for name in names {
            if let Some(i) = self.processes.iter().position(|p| p.name() == *name) {
                drop(self.processes.remove(i));
            }
        }
    }
}
