//! kube-aggregator's APIService validation, with the messages users know from `kubectl apply`.
//!
//! APIServices reach the gateway from a kube watch (already validated by the API server) or from
//! a directory of manifests (validated by nobody). Both go through the same rules so a manifest
//! that kube-apiserver would reject is rejected here too, with the same field paths and wording
//! (`spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000`).
//!
//! Mirrors `ValidateAPIService` (kube-aggregator `pkg/apis/apiregistration/validation`) plus the
//! parts of `ValidateObjectMeta` that concern APIServices: a name is required and must be a valid
//! path segment, and the object is cluster-scoped. Label, annotation, finalizer and owner checks
//! are left to the API server: they never affect routing.

use crate::model::{
    APIService, APIServiceSpec, APIServiceStatus, Backend, RegisteredAPIService, RemoteBackendSpec,
    ServiceRef, DEFAULT_SERVICE_PORT,
};
use crate::traffic::TrafficPolicy;

mod field_error;
#[cfg(test)]
mod tests;

use field_error::GoQuoted;
pub use field_error::{FieldError, FieldErrorKind, FieldValue, ValidationErrors};
use gateway_request::names::path_segment_errors;
pub use gateway_request::names::{dns1035_label_errors, dns1123_subdomain_errors};

/// The APIService API's own group: always the core server's.
pub const APIREGISTRATION_GROUP: &str = "apiregistration.k8s.io";

// === impl RegisteredAPIService ===

/// The validated form of an APIService: [`validate`], then defaults applied.
impl TryFrom<&APIService> for RegisteredAPIService {
    type Error = ValidationErrors;

    fn try_from(api: &APIService) -> Result<Self, Self::Error> {
        validate(api)?;
        // Validation guarantees a spec exists (a missing one fails on the version) and that every
        // field used below is present and in range; the fallbacks are never taken.
        let spec = api.spec.as_ref().cloned().unwrap_or_default();
        let backend = match spec.service {
            None => Backend::Local,
            Some(svc) => Backend::Remote(RemoteBackendSpec {
                service: ServiceRef {
                    namespace: svc.namespace.unwrap_or_default(),
                    name: svc.name.unwrap_or_default(),
                    port: svc
                        .port
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(DEFAULT_SERVICE_PORT),
                },
                ca_bundle: spec.ca_bundle.map(|b| b.0).filter(|b| !b.is_empty()),
                insecure_skip_tls_verify: spec.insecure_skip_tls_verify.unwrap_or(false),
            }),
        };
        Ok(Self {
            name: api.metadata.name.clone().unwrap_or_default(),
            group: spec.group.unwrap_or_default(),
            version: spec.version.unwrap_or_default(),
            group_priority_minimum: spec.group_priority_minimum,
            version_priority: spec.version_priority,
            backend,
            traffic: api
                .metadata
                .annotations
                .as_ref()
                .map(TrafficPolicy::from_annotations)
                .unwrap_or_default(),
        })
    }
}

/// Validates an APIService as kube-aggregator does on create and update.
///
/// A missing `spec` is validated as an empty one (as Go sees a zero-valued struct), which fails
/// on the version, the priorities and the name.
pub fn validate(api: &APIService) -> Result<(), ValidationErrors> {
    let default_spec;
    let spec = match &api.spec {
        Some(s) => s,
        None => {
            default_spec = APIServiceSpec::default();
            &default_spec
        }
    };
    let name = api.metadata.name.as_deref().unwrap_or("");
    let mut errs = Vec::new();

    metadata_errors(api, spec, &mut errs);
    group_version_errors(spec, &mut errs);
    priority_errors(spec, &mut errs);
    backend_errors(spec, &mut errs);

    if errs.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors {
            name: name.to_owned(),
            errors: errs,
        })
    }
}

/// `metadata.name` (a path segment, and `<version>.<group>`) and the cluster scope.
fn metadata_errors(api: &APIService, spec: &APIServiceSpec, errs: &mut Vec<FieldError>) {
    let name = api.metadata.name.as_deref().unwrap_or("");
    let group = spec.group.as_deref().unwrap_or("");
    let version = spec.version.as_deref().unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        let path_errs = path_segment_errors(name);
        if !path_errs.is_empty() {
            for msg in path_errs {
                errs.push(FieldError::invalid(
                    "metadata.name",
                    FieldValue::Str(name.to_owned()),
                    msg,
                ));
            }
        } else {
            let required_name = format!("{version}.{group}");
            if name != required_name {
                errs.push(FieldError::invalid(
                    "metadata.name",
                    FieldValue::Str(name.to_owned()),
                    format!(
                        "must be `spec.version+\".\"+spec.group`: {}",
                        GoQuoted(&required_name)
                    ),
                ));
            }
        }
    }
    if api
        .metadata
        .namespace
        .as_deref()
        .is_some_and(|ns| !ns.is_empty())
    {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
}

/// `spec.group` and `spec.version`: DNS names, and only the legacy `v1` without a group.
fn group_version_errors(spec: &APIServiceSpec, errs: &mut Vec<FieldError>) {
    let group = spec.group.as_deref().unwrap_or("");
    let version = spec.version.as_deref().unwrap_or("");
    if group.is_empty() && version != "v1" {
        errs.push(FieldError::required(
            "spec.group",
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for msg in dns1123_subdomain_errors(group) {
            errs.push(FieldError::invalid(
                "spec.group",
                FieldValue::Str(group.to_owned()),
                msg,
            ));
        }
    }
    for msg in dns1035_label_errors(version) {
        errs.push(FieldError::invalid(
            "spec.version",
            FieldValue::Str(version.to_owned()),
            msg,
        ));
    }
}

/// `spec.groupPriorityMinimum` and `spec.versionPriority`, each in kube-aggregator's range.
fn priority_errors(spec: &APIServiceSpec, errs: &mut Vec<FieldError>) {
    if spec.group_priority_minimum <= 0 || spec.group_priority_minimum > 20000 {
        errs.push(FieldError::invalid(
            "spec.groupPriorityMinimum",
            FieldValue::Int(spec.group_priority_minimum.into()),
            "must be positive and less than 20000",
        ));
    }
    if spec.version_priority <= 0 || spec.version_priority > 1000 {
        errs.push(FieldError::invalid(
            "spec.versionPriority",
            FieldValue::Int(spec.version_priority.into()),
            "must be positive and less than 1000",
        ));
    }
}

/// The backend: a local APIService has no TLS settings; a remote one names a whole Service
/// and may not both pin a CA and skip verification.
fn backend_errors(spec: &APIServiceSpec, errs: &mut Vec<FieldError>) {
    let group = spec.group.as_deref().unwrap_or("");
    let ca_len = spec.ca_bundle.as_ref().map_or(0, |b| b.0.len());
    let insecure = spec.insecure_skip_tls_verify.unwrap_or(false);
    match &spec.service {
        None => {
            if ca_len != 0 {
                errs.push(FieldError::invalid(
                    "spec.caBundle",
                    FieldValue::Str(format!("{ca_len} bytes")),
                    "local APIServices may not have a caBundle",
                ));
            }
            if insecure {
                errs.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    FieldValue::Bool(true),
                    "local APIServices may not have insecureSkipTLSVerify",
                ));
            }
        }
        Some(service) => {
            // kube-aggregator serves this group itself, before any proxying, so a remote
            // APIService for it would never be reached there; here it would hand the APIService
            // API (and with it every route) to someone else's server.
            if group == APIREGISTRATION_GROUP {
                errs.push(FieldError::forbidden(
                    "spec.service",
                    "apiregistration.k8s.io is served by the core server and cannot be delegated to a Service; remove spec.service (a local APIService) or use another group",
                ));
            }
            if service.namespace.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required("spec.service.namespace", ""));
            }
            if service.name.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required("spec.service.name", ""));
            }
            // An absent port is defaulted to 443 by the API server before validation.
            let port = service.port.unwrap_or(443);
            if !(1..=65535).contains(&port) {
                errs.push(FieldError::invalid(
                    "spec.service.port",
                    FieldValue::Int(port.into()),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
            if insecure && ca_len > 0 {
                errs.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    FieldValue::Bool(true),
                    "may not be true if caBundle is present",
                ));
            }
        }
    }
}

/// Validates the `/status` part: every condition status is `True`, `False` or `Unknown`.
/// Used when the gateway reads status written by others (files, other controllers).
pub fn validate_status(name: &str, status: &APIServiceStatus) -> Result<(), ValidationErrors> {
    let errors: Vec<FieldError> = status
        .conditions
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| !matches!(c.status.as_str(), "True" | "False" | "Unknown"))
        .map(|(i, c)| FieldError {
            field: format!("status.conditions[{i}].status"),
            kind: FieldErrorKind::NotSupported,
            value: FieldValue::Str(c.status.clone()),
            message: "supported values: \"True\", \"False\", \"Unknown\"".to_owned(),
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors {
            name: name.to_owned(),
            errors,
        })
    }
}
