//! The front door (issue 38): the gateway becomes the cluster's API endpoint, what kubeadm calls
//! the control-plane endpoint, with kube-apiserver its sibling behind it on the loopback.
//!
//! [`Cluster::move_behind_gateway`] does on the running node what an operator does on a
//! control-plane host: stop the components, start kube-apiserver again on `127.0.0.1:6444`
//! (`--endpoint-reconciler-type=none`: its own address is no longer the one clients use;
//! `--service-account-jwks-uri` on the gateway's address, or the OIDC discovery document sends
//! relying parties to the loopback port), start
//! the gateway as a host process on the node's address `10.200.0.1:6443`, pin the `kubernetes`
//! Service's endpoints to the gateway, and start kube-controller-manager, kube-scheduler, the
//! kubelet and kube-proxy again on their unchanged kubeconfigs, which name `10.200.0.1:6443`.
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

use super::{Cluster, APISERVER_PORT};
use crate::harness::parse_serving_line;
use crate::real_node::pki::{NODE_IP, NODE_NAME};

/// kube-apiserver's port on the loopback behind the gateway.
pub const CORE_PORT: u16 = 6444;
/// The gateway's process name in [`Cluster::logs`].
pub const GATEWAY: &str = "front-door-gateway";
/// The gateway's own user at the core.
const GATEWAY_USER: &str = "aggregation-gateway";

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
        let extra = ["--endpoint-reconciler-type=none", jwks.as_str()];
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
        self.start_controllers()?;
        self.start_kubelet_and_proxy()?;
        self.wait_node_ready().await?;
        eprintln!(
            "real node: {NODE_NAME} Ready behind the gateway on {} after {:.1?}",
            self.url,
            self.started.elapsed()
        );
        Ok(())
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
