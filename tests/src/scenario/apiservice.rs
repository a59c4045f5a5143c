//! APIService manifests, built the way a user writes them.

use super::*;

/// An `apiregistration.k8s.io/v1` APIService, see [`Pki::apiservice`].
#[derive(Clone, Debug)]
pub struct ApiService {
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    pub group_priority_minimum: u32,
    pub version_priority: u32,
    /// PEM; base64-encoded into `caBundle`.
    pub ca_bundle: String,
    /// `insecureSkipTLSVerify: true`, and no `caBundle` (validation allows only one of them).
    pub insecure_skip_tls_verify: bool,
    pub annotations: Vec<(String, String)>,
}

impl ApiService {
    /// `<version>.<group>`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }

    /// Backed by Service `name` instead of `api`.
    pub fn service(mut self, name: &str) -> ApiService {
        self.service = name.to_owned();
        self
    }

    pub fn port(mut self, port: u16) -> ApiService {
        self.port = port;
        self
    }

    /// Trusting `pem` instead of the backend CA.
    pub fn ca_bundle(mut self, pem: &str) -> ApiService {
        self.ca_bundle = pem.to_owned();
        self
    }

    /// Not verifying the backend's certificate at all.
    pub fn insecure_skip_tls_verify(mut self) -> ApiService {
        self.insecure_skip_tls_verify = true;
        self
    }

    /// An annotation on the APIService (e.g. `aggregation-gateway.io/long-running-subresources`).
    pub fn annotation(mut self, name: &str, value: &str) -> ApiService {
        self.annotations.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn group_priority_minimum(mut self, priority: u32) -> ApiService {
        self.group_priority_minimum = priority;
        self
    }

    /// Writes [`ApiService::yaml`] to `dir/file` (an `--apiservice-dir` manifest).
    pub fn write_to(&self, dir: &Path, file: &str) {
        std::fs::write(dir.join(file), self.yaml()).unwrap();
    }

    /// The manifest, for `kubectl apply` or a `--apiservice-dir` file.
    pub fn yaml(&self) -> String {
        let trust = if self.insecure_skip_tls_verify {
            "insecureSkipTLSVerify: true".to_owned()
        } else {
            let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_bundle);
            format!("caBundle: {ca}")
        };
        let annotations = if self.annotations.is_empty() {
            String::new()
        } else {
            let lines: String = self
                .annotations
                .iter()
                .map(|(k, v)| format!("    {k}: {}\n", serde_json::Value::from(v.as_str())))
                .collect();
            format!("  annotations:\n{lines}")
        };
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {name}\n{annotations}spec:\n  \
             group: {group}\n  version: {version}\n  groupPriorityMinimum: {gpm}\n  versionPriority: {vp}\n  \
             {trust}\n  service:\n    namespace: {namespace}\n    name: {service}\n    port: {port}\n",
            name = self.name(),
            group = self.group,
            version = self.version,
            gpm = self.group_priority_minimum,
            vp = self.version_priority,
            namespace = self.namespace,
            service = self.service,
            port = self.port,
        )
    }
}
