use gateway_request::names::{DNS1035_LABEL_MSG, DNS1123_SUBDOMAIN_MSG};

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
