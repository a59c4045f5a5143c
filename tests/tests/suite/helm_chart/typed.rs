//! Typed objects for the round trip: each rendered manifest is parsed into its type and
//! serialized back, and every field that did not survive is reported with its path. `k8s-openapi`
//! types for Kubernetes kinds; for cert-manager's and prometheus-operator's kinds, small
//! `deny_unknown_fields` structs of ours holding only the fields the chart may render.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

// === cert-manager and prometheus-operator kinds ===

/// cert-manager's `Certificate`, only the fields the chart may render.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Certificate {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CertificateSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateSpec {
    pub secret_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_addresses: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<CertificatePrivateKey>,
    pub usages: Vec<String>,
    pub issuer_ref: IssuerRef,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificatePrivateKey {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuerRef {
    pub name: String,
    pub kind: String,
    pub group: String,
}

/// prometheus-operator's `PrometheusRule`, only the fields the chart may render (alerting rules).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PrometheusRuleSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusRuleSpec {
    pub groups: Vec<RuleGroup>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    pub rules: Vec<AlertingRule>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertingRule {
    pub alert: String,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// prometheus-operator's `ServiceMonitor`, only the fields the chart may render.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    pub endpoints: Vec<MonitorEndpoint>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<bool>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitorEndpoint {
    pub port: String,
    pub path: String,
    pub scheme: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<MonitorTlsConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<MonitorAuthorization>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitorTlsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MonitorAuthorization {
    pub r#type: String,
    pub credentials: SecretKeySelector,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    pub name: String,
    pub key: String,
}

// === the round trip ===

/// Deserializes `doc` into `T`, serializes it back, and reports every field that did not survive.
pub fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T =
        serde_json::from_value(doc.clone()).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("does not serialize: {e}"))?;
    let mut diffs = Vec::new();
    diff(&normalize(doc), &normalize(&back), "", &mut diffs);
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n  "))
    }
}

/// k8s-openapi omits `None`, so explicit nulls are dropped; numbers compare by value.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Number(n) => json!(n.as_f64().expect("finite number")),
        other => other.clone(),
    }
}

fn diff(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => diff(va, vb, &p, out),
                    None => out.push(format!(
                        "{p}: lost (not a field of the typed object, misspelled or misplaced?)"
                    )),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: appeared in the round trip"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!(
            "{path}: rendered {a} but the typed object holds {b}"
        )),
    }
}

/// [`round_trip`] through the type of `doc`'s kind; an unknown kind is an error, so a new kind
/// in the chart gets its type here.
pub fn round_trip_by_kind(doc: &Value) -> Result<(), String> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    match kind {
        "Deployment" => round_trip::<Deployment>(doc),
        "Service" => round_trip::<Service>(doc),
        "ServiceAccount" => round_trip::<ServiceAccount>(doc),
        "ConfigMap" => round_trip::<ConfigMap>(doc),
        "Namespace" => round_trip::<Namespace>(doc),
        "ClusterRole" => round_trip::<ClusterRole>(doc),
        "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(doc),
        "Role" => round_trip::<Role>(doc),
        "RoleBinding" => round_trip::<RoleBinding>(doc),
        "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(doc),
        "FlowSchema" => round_trip::<FlowSchema>(doc),
        "PriorityLevelConfiguration" => round_trip::<PriorityLevelConfiguration>(doc),
        "Ingress" => round_trip::<Ingress>(doc),
        "CustomResourceDefinition" => round_trip::<CustomResourceDefinition>(doc),
        "APIService" => round_trip::<APIService>(doc),
        "Certificate" if doc["apiVersion"] == "cert-manager.io/v1" => {
            round_trip::<Certificate>(doc)
        }
        "ServiceMonitor" if doc["apiVersion"] == "monitoring.coreos.com/v1" => {
            round_trip::<ServiceMonitor>(doc)
        }
        "PrometheusRule" if doc["apiVersion"] == "monitoring.coreos.com/v1" => {
            round_trip::<PrometheusRule>(doc)
        }
        other => Err(format!(
            "kind {other:?} ({}) is not known to this test; add its type",
            doc["apiVersion"]
        )),
    }
}
