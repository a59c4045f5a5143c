//! sample-apiserver (`wardle.example.com`: flunders and fischers), set up as its upstream example
//! deploys it: namespace `wardle`, ServiceAccount `apiserver` with upstream's example RBAC
//! (`system:auth-delegator`, `extension-apiserver-authentication-reader` in kube-system, reading
//! namespaces, admission configurations and flow control), a token for it from the TokenRequest
//! API (`kubectl create token`), and delegated authentication and authorization against
//! kube-apiserver: every request is authenticated by the request-header certificate or a
//! TokenReview, and authorized with a SubjectAccessReview, as in a real cluster.
//!
//! There is no kube-proxy: the Service `wardle/api` is an ExternalName Service for `localhost` on
//! sample-apiserver's port, so kube-apiserver's aggregator and the gateway (kube source) both dial
//! `localhost:<port>` and verify the certificate as `api.wardle.svc`.

use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use http::StatusCode;

use super::ports::free_port;
use super::{ControlPlane, RealBinaries};
use crate::harness::{get, http1_client, HarnessError, Process};

/// The group and version sample-apiserver serves (also `v1beta1`, which the APIService leaves out,
/// as upstream's conformance test does).
pub const WARDLE_GROUP: &str = "wardle.example.com";
pub const WARDLE_VERSION: &str = "v1alpha1";
/// The APIService kube-apiserver and the gateway route by.
pub const WARDLE_APISERVICE: &str = "v1alpha1.wardle.example.com";

/// Upstream's `artifacts/example` objects, minus the Deployment (there is no kubelet) and with an
/// ExternalName Service (there is no kube-proxy). `{port}` is sample-apiserver's port.
const EXAMPLE_OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: wardle
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: apiserver
  namespace: wardle
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: wardle:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- kind: ServiceAccount
  name: apiserver
  namespace: wardle
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: wardle-auth-reader
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- kind: ServiceAccount
  name: apiserver
  namespace: wardle
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: aggregated-apiserver-clusterrole
rules:
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "watch", "list"]
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["mutatingwebhookconfigurations", "validatingwebhookconfigurations", "validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"]
  verbs: ["get", "watch", "list"]
- apiGroups: ["flowcontrol.apiserver.k8s.io"]
  resources: ["prioritylevelconfigurations", "flowschemas"]
  verbs: ["get", "watch", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: sample-apiserver-clusterrolebinding
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: aggregated-apiserver-clusterrole
subjects:
- kind: ServiceAccount
  name: apiserver
  namespace: wardle
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: wardle
spec:
  type: ExternalName
  externalName: localhost
  ports:
  - name: https
    port: {port}
    protocol: TCP
"#;

/// A running sample-apiserver, killed when dropped.
#[derive(Debug)]
pub struct SampleApiserver {
    pub process: Process,
    /// Its secure port on 127.0.0.1 (also the port of Service `wardle/api` and the APIService).
    pub port: u16,
    /// Its binary and flags, to start it again as it was ([`Self::restart`]).
    command: (std::path::PathBuf, Vec<std::ffi::OsString>),
}

impl SampleApiserver {
    /// Creates upstream's example objects on `plane`, gets a ServiceAccount token, starts
    /// sample-apiserver against `plane` and waits for its `/readyz`.
    pub async fn start(
        plane: &ControlPlane,
        binaries: &RealBinaries,
    ) -> Result<SampleApiserver, HarnessError> {
        let port = free_port();
        let admin = plane.admin();
        admin
            .apply_yaml(&EXAMPLE_OBJECTS.replace("{port}", &port.to_string()))
            .await;
        let token = admin
            .run_ok(&[
                "create",
                "token",
                "apiserver",
                "--namespace",
                "wardle",
                "--duration",
                "2h",
            ])
            .await
            .stdout
            .trim()
            .to_owned();
        let kubeconfig = plane.pki.write(
            "sample-apiserver.kubeconfig",
            &kubeconfig(&plane.url, plane.pki.cluster_ca.cert_pem(), &token),
        );
        let (cert, key) = &plane.pki.wardle_serving;
        let mut args: Vec<std::ffi::OsString> = [
            "--secure-port",
            &port.to_string(),
            "--bind-address",
            "127.0.0.1",
            "--etcd-servers",
            &plane.etcd_url,
        ]
        .into_iter()
        .map(Into::into)
        .collect();
        args.extend([
            "--tls-cert-file".into(),
            cert.into(),
            "--tls-private-key-file".into(),
            key.into(),
            "--cert-dir".into(),
            plane.pki.dir().join("sample-apiserver").into(),
        ]);
        for flag in [
            "--kubeconfig",
            "--authentication-kubeconfig",
            "--authorization-kubeconfig",
        ] {
            args.extend([flag.into(), kubeconfig.clone().into()]);
        }
        let command = (binaries.sample_apiserver.clone(), args);
        let process = spawn(&command)?;
        let server = SampleApiserver {
            process,
            port,
            command,
        };
        server.wait_ready(plane).await?;
        Ok(server)
    }

    /// Kills sample-apiserver (SIGKILL) and starts it again with the same flags on the same
    /// port; returns once its `/readyz` passes.
    pub async fn restart(&mut self, plane: &ControlPlane) -> Result<(), HarnessError> {
        self.process.kill();
        self.process = spawn(&self.command)?;
        self.wait_ready(plane).await
    }

    async fn wait_ready(&self, plane: &ControlPlane) -> Result<(), HarnessError> {
        let client = http1_client(plane.pki.wardle_ca.cert_pem(), None)?;
        let url = format!("https://127.0.0.1:{}/readyz", self.port);
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            match get(&client, &url).await {
                Ok((StatusCode::OK, _, _)) => return Ok(()),
                Ok((status, _, body)) => {
                    last = format!("{status}: {}", String::from_utf8_lossy(&body))
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(HarnessError::Start {
            name: "sample-apiserver".into(),
            reason: format!("/readyz did not pass within {timeout:?}: {last}"),
            logs: self.process.logs(),
        })
    }

    /// `https://127.0.0.1:<port>`, for the gateway's static `services:` map.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The APIService for `v1alpha1.wardle.example.com`, pointing at Service `wardle/api` on this
    /// server's port and trusting its serving CA, as upstream's example registers it.
    pub fn apiservice_yaml(&self, plane: &ControlPlane) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(plane.pki.wardle_ca.cert_pem());
        format!(
            "apiVersion: apiregistration.k8s.io/v1\n\
             kind: APIService\n\
             metadata:\n  name: {WARDLE_APISERVICE}\n\
             spec:\n  group: {WARDLE_GROUP}\n  version: {WARDLE_VERSION}\n  \
             groupPriorityMinimum: 1000\n  versionPriority: 15\n  caBundle: {ca}\n  \
             service:\n    namespace: wardle\n    name: api\n    port: {}\n",
            self.port
        )
    }
}

fn spawn(
    (binary, args): &(std::path::PathBuf, Vec<std::ffi::OsString>),
) -> Result<Process, HarnessError> {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    Process::spawn("sample-apiserver", cmd)
}

/// A kubeconfig for `server` trusting `ca_pem` and presenting `token`. JSON is YAML.
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "real", "cluster": { "server": server, "certificate-authority-data": ca } }],
        "users": [{ "name": "real", "user": { "token": token } }],
        "contexts": [{ "name": "real", "context": { "cluster": "real", "user": "real" } }],
        "current-context": "real",
    })
    .to_string()
}
