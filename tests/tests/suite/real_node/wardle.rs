//! sample-apiserver (`wardle.example.com`) as a Pod, deployed as upstream's `artifacts/example`
//! deploys it: namespace `wardle`, ServiceAccount `apiserver` with its RBAC, a Deployment and the
//! Service `wardle/api`; etcd is the node's, under its own prefix. Its serving certificate is for
//! `api.wardle.svc`, signed by the cluster CA, which the APIService names as `caBundle`.

use std::time::Duration;

use base64::Engine;
use e2e::real_node::pki::NODE_IP;
use e2e::real_node::Cluster;

pub const IMAGE: &str = "localhost/sample-apiserver:dev";
pub const GROUP: &str = "wardle.example.com";
pub const APISERVICE: &str = "v1alpha1.wardle.example.com";

/// Upstream's example objects; `{cert}`, `{key}` are the serving certificate and key (base64).
const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: wardle}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: apiserver, namespace: wardle}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "wardle:system:auth-delegator"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:auth-delegator"}
subjects: [{kind: ServiceAccount, name: apiserver, namespace: wardle}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: wardle-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: apiserver, namespace: wardle}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: aggregated-apiserver-clusterrole}
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
metadata: {name: sample-apiserver-clusterrolebinding}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: aggregated-apiserver-clusterrole}
subjects: [{kind: ServiceAccount, name: apiserver, namespace: wardle}]
---
apiVersion: v1
kind: Secret
metadata: {name: serving, namespace: wardle}
type: kubernetes.io/tls
data: {"tls.crt": "{cert}", "tls.key": "{key}"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: wardle-server, namespace: wardle}
spec:
  replicas: 1
  selector: {matchLabels: {apiserver: "true"}}
  template:
    metadata: {labels: {apiserver: "true"}}
    spec:
      serviceAccountName: apiserver
      containers:
      - name: wardle-server
        image: localhost/sample-apiserver:dev
        imagePullPolicy: Never
        args:
        - --etcd-servers=http://{node_ip}:23379
        - --etcd-prefix=/wardle
        - --secure-port=8443
        - --tls-cert-file=/serving/tls.crt
        - --tls-private-key-file=/serving/tls.key
        ports: [{containerPort: 8443}]
        volumeMounts: [{name: serving, mountPath: /serving, readOnly: true}]
        readinessProbe:
          httpGet: {path: /readyz, port: 8443, scheme: HTTPS}
      volumes: [{name: serving, secret: {secretName: serving}}]
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: wardle}
spec:
  selector: {apiserver: "true"}
  ports: [{name: https, port: 443, targetPort: 8443}]
"#;

/// Deploys sample-apiserver and waits until it is Ready.
pub async fn deploy(cluster: &Cluster) {
    let serving = cluster
        .pki
        .cluster_ca
        .issue_server(&["api.wardle.svc", "api.wardle.svc.cluster.local"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let objects = OBJECTS
        .replace("{cert}", &b64(&serving.cert_pem))
        .replace("{key}", &b64(&serving.key_pem))
        .replace("{node_ip}", NODE_IP);
    let admin = cluster.admin();
    admin.apply_yaml(&objects).await;
    let admin = admin.with_timeout(Duration::from_secs(200));
    admin
        .run_ok(&[
            "-n",
            "wardle",
            "rollout",
            "status",
            "deployment/wardle-server",
            "--timeout=180s",
        ])
        .await;
}

/// The APIService for `v1alpha1.wardle.example.com`, as a user registers it.
pub fn apiservice(cluster: &Cluster) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(cluster.pki.cluster_ca.cert_pem());
    format!(
        r#"apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {APISERVICE}}}
spec:
  group: {GROUP}
  version: v1alpha1
  service: {{namespace: wardle, name: api, port: 443}}
  caBundle: {ca}
  groupPriorityMinimum: 2000
  versionPriority: 200
"#
    )
}
