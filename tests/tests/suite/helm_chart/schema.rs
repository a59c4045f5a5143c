//! values.schema.json and required values: a typo, a wrong type or a missing value fails `helm
//! template` with a message naming the field and what to set, and `extraConfig` lists exactly the
//! keys the gateway's config accepts.

use serde_json::Value;

use e2e::helm::{chart_dir, helm_template};

use e2e::table::check_each;

#[test]
fn the_schema_rejects_typos_and_wrong_types_naming_the_field() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["replicaCount=abc"],
            "replicaCount: Invalid type. Expected: integer, given: string",
        ),
        (
            &["replicaCont=3"],
            "Additional property replicaCont is not allowed",
        ),
        (
            &["core.sidecar.imag.repository=x"],
            "Additional property imag is not allowed",
        ),
        (
            &["apiServices.source=files"],
            "apiServices.source: apiServices.source must be one of the following",
        ),
        (
            &["extraConfig.securPort=1"],
            "Additional property securPort is not allowed",
        ),
        (
            &["limits.requestTimeout=60"],
            "limits.requestTimeout: Invalid type. Expected: string, given: integer",
        ),
        (
            &["shutdown.delayDuration=10 seconds"],
            "shutdown.delayDuration: Does not match pattern",
        ),
    ];
    check_each(
        cases,
        |(sets, _)| format!("{sets:?}"),
        |(sets, want)| {
            let err = helm_template(&[], sets).expect_err(&format!("{sets:?} must be refused"));
            assert!(
                err.contains("values don't meet the specifications of the schema"),
                "{sets:?}: {err}"
            );
            assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
        },
    );
}

#[test]
fn missing_required_values_fail_with_a_message_saying_what_to_set() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["core.sidecar.enabled=true"],
            "core.sidecar.image.repository is required",
        ),
        (
            &["core.url="],
            "core.url is required when core.sidecar.enabled is false",
        ),
        (
            &["certManager.enabled=true"],
            "certManager.issuerRef.name is required",
        ),
        (
            &["apiServices.source=file"],
            "apiServices.items is empty but apiServices.source is file",
        ),
        (
            &["authentication.requestHeader.allowedNames={a}"],
            "needs authentication.requestHeader.caSecret",
        ),
    ];
    check_each(
        cases,
        |(sets, _)| format!("{sets:?}"),
        |(sets, want)| {
            let err = helm_template(&[], sets).expect_err(&format!("{sets:?} must be refused"));
            assert!(err.contains(want), "{sets:?}: expected {want:?} in:\n{err}");
        },
    );
}

/// `extraConfig` in the schema lists exactly the gateway's config keys, so the chart can neither
/// refuse a real key nor let a misspelled one through to a Pod that would crash on it.
#[test]
fn schema_extra_config_keys_are_exactly_the_gateway_options() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let extra = &schema["properties"]["extraConfig"];
    assert_eq!(extra["additionalProperties"], false);
    let in_schema: Vec<&String> = extra["properties"].as_object().unwrap().keys().collect();
    let options = serde_json::to_value(gateway_config::Options::default()).unwrap();
    let in_options: Vec<&String> = options.as_object().unwrap().keys().collect();
    let mut a = in_schema.clone();
    let mut b = in_options.clone();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "values.schema.json extraConfig vs gateway_config::Options"
    );
}

/// `additionalProperties: false` on every object the schema describes by its properties.
#[test]
fn every_schema_object_with_properties_refuses_unknown_keys() {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if map.contains_key("properties")
                    && map.get("additionalProperties") != Some(&Value::Bool(false))
                {
                    // A Kubernetes Volume is open-ended (many volume sources): name is all we require.
                    if path != ".properties.extraVolumes.items" {
                        out.push(path.to_owned());
                    }
                }
                for (k, v) in map {
                    walk(v, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| walk(v, &format!("{path}[{i}]"), out)),
            _ => {}
        }
    }
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let mut open = Vec::new();
    walk(&schema, "", &mut open);
    assert!(
        open.is_empty(),
        "objects without additionalProperties: false: {open:?}"
    );
}
