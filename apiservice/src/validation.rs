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

use std::fmt;

use crate::model::{
    APIService, APIServiceSpec, APIServiceStatus, Backend, RegisteredAPIService, RemoteBackendSpec,
    ServiceRef, DEFAULT_SERVICE_PORT,
};
use crate::traffic::TrafficPolicy;

/// The APIService API's own group: always the core server's.
pub const APIREGISTRATION_GROUP: &str = "apiregistration.k8s.io";

/// Why a field is rejected; renders as kube's `field.ErrorType` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`: the field is missing or empty. The value is not shown.
    Required,
    /// `Invalid value: <value>`: the value is malformed or out of range.
    Invalid,
    /// `Forbidden`: the field may not be set here. The value is not shown.
    Forbidden,
    /// `Unsupported value: <value>`: not one of an enumerated set.
    NotSupported,
}

// === impl FieldErrorKind ===

impl FieldErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
        }
    }
}

/// The offending value, kept typed so it prints as kube prints it: strings quoted, numbers and
/// booleans bare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    /// No value is reported (Required and Forbidden errors).
    None,
    Str(String),
    Int(i64),
    Bool(bool),
}

// === impl FieldValue ===

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Str(s) => write_go_quoted(f, s),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One rejected field: `field: <kind>[: value][: message]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted field path as kube writes it, e.g. `spec.service.namespace`.
    pub field: String,
    pub kind: FieldErrorKind,
    pub value: FieldValue,
    /// Detail after the value; may be empty (e.g. a bare `Required value`).
    pub message: String,
}

// === impl FieldError ===

impl FieldError {
    fn required(field: &str, message: &str) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Required,
            value: FieldValue::None,
            message: message.to_owned(),
        }
    }

    fn forbidden(field: &str, message: &str) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Forbidden,
            value: FieldValue::None,
            message: message.to_owned(),
        }
    }

    fn invalid(field: &str, value: FieldValue, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            kind: FieldErrorKind::Invalid,
            value,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.kind.as_str())?;
        // kube never prints the value of Required/Forbidden errors.
        if !matches!(
            self.kind,
            FieldErrorKind::Required | FieldErrorKind::Forbidden
        ) && self.value != FieldValue::None
        {
            write!(f, ": {}", self.value)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Every rule an APIService broke, in the order kube-aggregator checks them.
///
/// `Display` matches kube's aggregate: one error prints alone, several print as
/// `[a, b]` with exact duplicates dropped. [`ValidationErrors::summary`] adds the object name for
/// logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_like_kube(.errors))]
pub struct ValidationErrors {
    /// `metadata.name` of the rejected APIService (may be empty when the name is missing).
    pub name: String,
    pub errors: Vec<FieldError>,
}

// === impl ValidationErrors ===

impl ValidationErrors {
    /// One line for logs and Status messages: `APIService "<name>" is invalid: <errors>`.
    pub fn summary(&self) -> String {
        format!("APIService {:?} is invalid: {}", self.name, self)
    }

    /// Whether some error concerns exactly this field path.
    pub fn has_field(&self, field: &str) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }
}

/// kube's `utilerrors.Aggregate` text: a single error alone, several as `[a, b]`, exact
/// duplicates dropped.
fn join_like_kube(errors: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::with_capacity(errors.len());
    for e in errors {
        let msg = e.to_string();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    match seen.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

const DNS1123_SUBDOMAIN_MAX: usize = 253;
const DNS1035_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
    alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
    (e.g. 'example.com', regex used for validation is \
    '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric \
    characters or '-', start with an alphabetic character, and end with an alphanumeric \
    character (e.g. 'my-name',  or 'abc-123', regex used for validation is \
    '[a-z]([-a-z0-9]*[a-z0-9])?')";

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
    let group = spec.group.as_deref().unwrap_or("");
    let version = spec.version.as_deref().unwrap_or("");
    let mut errs = Vec::new();

    // metadata
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

    // group and version
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

    // priorities
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

    // backend
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

    if errs.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors {
            name: name.to_owned(),
            errors: errs,
        })
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

/// apimachinery's `IsValidPathSegmentName`: the name ends up as a URL path segment.
fn path_segment_errors(name: &str) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| name.contains(*bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, without the length limit.
fn is_dns1123_label_shape(label: &str) -> bool {
    let b = label.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// apimachinery's `IsDNS1123Subdomain`.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if !value.split('.').all(is_dns1123_label_shape) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_owned());
    }
    errs
}

/// apimachinery's `IsDNS1035Label`.
pub fn dns1035_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX {
        errs.push(format!(
            "must be no more than {DNS1035_LABEL_MAX} characters"
        ));
    }
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if !ok {
        errs.push(DNS1035_LABEL_MSG.to_owned());
    }
    errs
}

/// Displays a string the way Go's `%q` does for the characters that matter in API names:
/// double quotes, backslash escapes, `\x` for other control bytes.
struct GoQuoted<'a>(&'a str);

// === impl GoQuoted ===

impl fmt::Display for GoQuoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_go_quoted(f, self.0)
    }
}

fn write_go_quoted(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    use fmt::Write;
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\u{7}' => f.write_str("\\a")?,
            '\u{8}' => f.write_str("\\b")?,
            '\u{c}' => f.write_str("\\f")?,
            '\u{b}' => f.write_str("\\v")?,
            c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\x{:02x}", c as u32)?,
            c if c.is_control() => write!(f, "\\u{:04x}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{APIServiceCondition, ServiceReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    fn remote(name: &str, group: &str, version: &str) -> APIService {
        APIService {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: Some(APIServiceSpec {
                group: Some(group.to_owned()),
                version: Some(version.to_owned()),
                group_priority_minimum: 100,
                version_priority: 100,
                service: Some(ServiceReference {
                    namespace: Some("kube-system".to_owned()),
                    name: Some("metrics-server".to_owned()),
                    port: Some(443),
                }),
                ca_bundle: None,
                insecure_skip_tls_verify: Some(true),
            }),
            status: None,
        }
    }

    fn local(name: &str, group: &str, version: &str) -> APIService {
        let mut api = remote(name, group, version);
        let spec = api.spec.as_mut().unwrap();
        spec.service = None;
        spec.insecure_skip_tls_verify = None;
        api
    }

    fn spec(api: &mut APIService) -> &mut APIServiceSpec {
        api.spec.as_mut().unwrap()
    }

    /// The single error message, asserting there is exactly one.
    fn only_error(api: &APIService) -> String {
        let errs = validate(api).expect_err("expected invalid");
        assert_eq!(errs.errors.len(), 1, "{errs}");
        errs.errors[0].to_string()
    }

    #[test]
    fn valid_remote_local_and_legacy() {
        validate(&remote(
            "v1beta1.metrics.k8s.io",
            "metrics.k8s.io",
            "v1beta1",
        ))
        .unwrap();
        validate(&local("v1.apps", "apps", "v1")).unwrap();
        validate(&local("v1.", "", "v1")).unwrap();
        validate(&remote("v1.", "", "v1")).unwrap();
        // Port omitted: defaulted to 443, valid.
        let mut api = remote("v1.a.io", "a.io", "v1");
        spec(&mut api).service.as_mut().unwrap().port = None;
        validate(&api).unwrap();
        // A caBundle without insecureSkipTLSVerify is the normal remote case.
        let mut api = remote("v1.a.io", "a.io", "v1");
        spec(&mut api).insecure_skip_tls_verify = Some(false);
        spec(&mut api).ca_bundle = Some(ByteString(b"-----BEGIN CERTIFICATE-----".to_vec()));
        validate(&api).unwrap();
    }

    #[test]
    fn name_must_be_version_dot_group() {
        let api = remote("bad", "metrics.k8s.io", "v1beta1");
        assert_eq!(
            only_error(&api),
            "metadata.name: Invalid value: \"bad\": must be `spec.version+\".\"+spec.group`: \
             \"v1beta1.metrics.k8s.io\""
        );
    }

    #[test]
    fn name_required() {
        let mut api = remote("x", "a.io", "v1");
        api.metadata.name = None;
        assert_eq!(
            only_error(&api),
            "metadata.name: Required value: name or generateName is required"
        );
        let errs = validate(&api).unwrap_err();
        assert_eq!(errs.name, "");
    }

    #[test]
    fn name_must_be_a_path_segment() {
        let api = remote("v1.a/b", "a/b", "v1");
        let errs = validate(&api).unwrap_err();
        // The path-segment failure replaces the version.group check.
        assert_eq!(
            errs.errors[0].to_string(),
            "metadata.name: Invalid value: \"v1.a/b\": may not contain '/'"
        );
        assert_eq!(
            errs.errors
                .iter()
                .filter(|e| e.field == "metadata.name")
                .count(),
            1
        );

        let api = remote("..", "a.io", "v1");
        assert_eq!(
            validate(&api).unwrap_err().errors[0].to_string(),
            "metadata.name: Invalid value: \"..\": may not be '..'"
        );

        let api = remote("v1.a%/", "a.io", "v1");
        let msgs: Vec<String> = validate(&api)
            .unwrap_err()
            .errors
            .iter()
            .map(|e| e.message.clone())
            .collect();
        assert_eq!(msgs, ["may not contain '/'", "may not contain '%'"]);
    }

    #[test]
    fn namespace_is_forbidden() {
        let mut api = remote("v1.a.io", "a.io", "v1");
        api.metadata.namespace = Some("default".to_owned());
        assert_eq!(
            only_error(&api),
            "metadata.namespace: Forbidden: not allowed on this type"
        );
    }

    #[test]
    fn empty_group_only_for_v1() {
        let api = local("v2.", "", "v2");
        assert_eq!(
            only_error(&api),
            "spec.group: Required value: only v1 may have an empty group and it better be legacy kube"
        );
    }

    #[test]
    fn group_must_be_dns1123_subdomain() {
        let api = remote("v1.Bad_Group", "Bad_Group", "v1");
        assert_eq!(
            only_error(&api),
            format!("spec.group: Invalid value: \"Bad_Group\": {DNS1123_SUBDOMAIN_MSG}")
        );
        for bad in ["a..b", ".a", "a.", "-a.io", "a-.io", "a.io "] {
            let api = remote(&format!("v1.{bad}"), bad, "v1");
            assert!(validate(&api).unwrap_err().has_field("spec.group"), "{bad}");
        }
        let long = format!("{}.io", "a".repeat(251));
        let api = remote(&format!("v1.{long}"), &long, "v1");
        let errs = validate(&api).unwrap_err();
        assert_eq!(errs.errors.len(), 1);
        assert_eq!(
            errs.errors[0].message,
            "must be no more than 253 characters"
        );
    }

    #[test]
    fn version_must_be_dns1035_label() {
        let api = remote("1v.a.io", "a.io", "1v");
        assert_eq!(
            only_error(&api),
            format!("spec.version: Invalid value: \"1v\": {DNS1035_LABEL_MSG}")
        );
        for bad in ["", "V1", "v1-", "v1.2", "v_1"] {
            let api = remote(&format!("{bad}.a.io"), "a.io", bad);
            assert!(
                validate(&api).unwrap_err().has_field("spec.version"),
                "{bad:?}"
            );
        }
        let long = format!("v{}", "1".repeat(63));
        let api = remote(&format!("{long}.a.io"), "a.io", &long);
        assert_eq!(
            only_error(&api),
            format!("spec.version: Invalid value: \"{long}\": must be no more than 63 characters")
        );
    }

    #[test]
    fn group_priority_minimum_range() {
        for bad in [0, -1, 20001] {
            let mut api = remote("v1.a.io", "a.io", "v1");
            spec(&mut api).group_priority_minimum = bad;
            assert_eq!(
                only_error(&api),
                format!(
                    "spec.groupPriorityMinimum: Invalid value: {bad}: must be positive and less than 20000"
                )
            );
        }
        for good in [1, 20000] {
            let mut api = remote("v1.a.io", "a.io", "v1");
            spec(&mut api).group_priority_minimum = good;
            validate(&api).unwrap();
        }
    }

    #[test]
    fn version_priority_range() {
        for bad in [0, -5, 1001] {
            let mut api = remote("v1.a.io", "a.io", "v1");
            spec(&mut api).version_priority = bad;
            assert_eq!(
                only_error(&api),
                format!(
                    "spec.versionPriority: Invalid value: {bad}: must be positive and less than 1000"
                )
            );
        }
        for good in [1, 1000] {
            let mut api = remote("v1.a.io", "a.io", "v1");
            spec(&mut api).version_priority = good;
            validate(&api).unwrap();
        }
    }

    #[test]
    fn local_may_not_have_ca_bundle_or_insecure() {
        let mut api = local("v1.a.io", "a.io", "v1");
        spec(&mut api).ca_bundle = Some(ByteString(vec![b'x'; 12]));
        assert_eq!(
            only_error(&api),
            "spec.caBundle: Invalid value: \"12 bytes\": local APIServices may not have a caBundle"
        );
        let mut api = local("v1.a.io", "a.io", "v1");
        spec(&mut api).insecure_skip_tls_verify = Some(true);
        assert_eq!(
            only_error(&api),
            "spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify"
        );
        // An empty caBundle counts as absent.
        let mut api = local("v1.a.io", "a.io", "v1");
        spec(&mut api).ca_bundle = Some(ByteString(Vec::new()));
        validate(&api).unwrap();
    }

    #[test]
    fn apiregistration_stays_with_the_core() {
        let remote_api = remote("v1.apiregistration.k8s.io", APIREGISTRATION_GROUP, "v1");
        let err = only_error(&remote_api);
        assert!(
            err.starts_with(
                "spec.service: Forbidden: apiregistration.k8s.io is served by the core server"
            ),
            "{err}"
        );
        assert!(validate(&local(
            "v1.apiregistration.k8s.io",
            APIREGISTRATION_GROUP,
            "v1"
        ))
        .is_ok());
    }

    #[test]
    fn remote_needs_namespace_and_name() {
        let mut api = remote("v1.a.io", "a.io", "v1");
        let svc = spec(&mut api).service.as_mut().unwrap();
        svc.namespace = None;
        svc.name = Some(String::new());
        let errs = validate(&api).unwrap_err();
        let msgs: Vec<String> = errs.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "spec.service.namespace: Required value",
                "spec.service.name: Required value"
            ]
        );
    }

    #[test]
    fn remote_port_range() {
        for bad in [0, -1, 65536] {
            let mut api = remote("v1.a.io", "a.io", "v1");
            spec(&mut api).service.as_mut().unwrap().port = Some(bad);
            assert_eq!(
                only_error(&api),
                format!(
                    "spec.service.port: Invalid value: {bad}: port is not valid: must be between 1 and 65535, inclusive"
                )
            );
        }
        let mut api = remote("v1.a.io", "a.io", "v1");
        spec(&mut api).service.as_mut().unwrap().port = Some(65535);
        validate(&api).unwrap();
    }

    #[test]
    fn insecure_with_ca_bundle_is_invalid() {
        let mut api = remote("v1.a.io", "a.io", "v1");
        spec(&mut api).ca_bundle = Some(ByteString(b"pem".to_vec()));
        assert_eq!(
            only_error(&api),
            "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present"
        );
    }

    #[test]
    fn missing_spec_is_validated_as_empty() {
        let mut api = remote("v1.a.io", "a.io", "v1");
        api.spec = None;
        let errs = validate(&api).unwrap_err();
        let fields: Vec<&str> = errs.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.group",
                "spec.version",
                "spec.groupPriorityMinimum",
                "spec.versionPriority"
            ]
        );
        assert_eq!(
            errs.errors[0].message,
            "must be `spec.version+\".\"+spec.group`: \".\""
        );
    }

    #[test]
    fn display_joins_like_kube_and_summary_names_the_object() {
        let mut api = remote("bad", "a.io", "v1");
        spec(&mut api).group_priority_minimum = 0;
        spec(&mut api).version_priority = 0;
        let errs = validate(&api).unwrap_err();
        let expected = "[metadata.name: Invalid value: \"bad\": must be `spec.version+\".\"+spec.group`: \"v1.a.io\", \
             spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000, \
             spec.versionPriority: Invalid value: 0: must be positive and less than 1000]";
        assert_eq!(errs.to_string(), expected);
        assert_eq!(
            errs.summary(),
            format!("APIService \"bad\" is invalid: {expected}")
        );
    }

    #[test]
    fn display_drops_exact_duplicates() {
        let e = FieldError::required("spec.service.name", "");
        let errs = ValidationErrors {
            name: "n".into(),
            errors: vec![e.clone(), e.clone()],
        };
        assert_eq!(errs.to_string(), "spec.service.name: Required value");
    }

    #[test]
    fn values_are_quoted_like_go() {
        let api = remote("v1.a\"b\n", "a.io", "v1");
        let errs = validate(&api).unwrap_err();
        assert!(
            errs.errors[0]
                .to_string()
                .starts_with("metadata.name: Invalid value: \"v1.a\\\"b\\n\": "),
            "{}",
            errs.errors[0]
        );
        assert_eq!(FieldValue::Str("\u{1b}é".into()).to_string(), "\"\\x1bé\"");
    }

    #[test]
    fn status_conditions_must_use_known_statuses() {
        let cond = |status: &str| APIServiceCondition {
            type_: "Available".into(),
            status: status.into(),
            ..Default::default()
        };
        let ok = APIServiceStatus {
            conditions: Some(vec![cond("True"), cond("False"), cond("Unknown")]),
        };
        validate_status("v1.a.io", &ok).unwrap();
        let bad = APIServiceStatus {
            conditions: Some(vec![cond("True"), cond("Maybe")]),
        };
        assert_eq!(
            validate_status("v1.a.io", &bad).unwrap_err().to_string(),
            "status.conditions[1].status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""
        );
    }
}
