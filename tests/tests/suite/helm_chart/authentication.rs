//! Structured authentication (`authentication.config`, `authentication.configMap`): the file is
//! rendered into its own ConfigMap, mounted as a directory (a subPath mount never sees the
//! ConfigMap's updates, and the gateway's reload depends on them), named by `authenticationConfig`
//! in config.yaml, accepted by the gateway's own decoding and validation and by `--check-config`;
//! the file's `anonymous` replaces `anonymousAuth` (the gateway refuses to start with both), and
//! no checksum rolls the Pods when only the file changes.

use std::process::Command;

use k8s_openapi::api::core::v1::{ConfigMap, Volume};
use serde_json::Value;

use e2e::helm::{
    chart_dir, helm, helm_template, render_notes, split_documents, Rendered, FULLNAME,
};
use gateway_config::authentication::{
    self as authn, CompiledExpression, ExpressionCompiler, ExpressionKind,
};

use super::config::{check_config, FakePodFs};
use super::typed::round_trip_by_kind;

/// One JWT issuer and an anonymous authenticator limited to two paths, as a user writes them
/// (no apiVersion or kind: the chart adds them).
const VALUES: &str = r#"
authentication:
  config:
    jwt:
      - issuer:
          url: https://issuer.example.com
          audiences: [aggregation-gateway]
        claimMappings:
          username: {claim: sub, prefix: "oidc:"}
          groups: {claim: groups, prefix: "oidc:"}
    anonymous:
      enabled: true
      conditions:
        - path: /livez
        - path: /readyz
"#;

const AUTHN_DIR: &str = "/etc/aggregation-gateway/authentication";
const AUTHN_KEY: &str = "authentication-config.yaml";

fn values_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .prefix("authn-values-")
        .suffix(".yaml")
        .tempfile()
        .unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

/// `helm template` with `values` and `--set`s: the rendered objects, or helm's error.
fn render(values: &str, sets: &[&str]) -> Result<Rendered, String> {
    let file = values_file(values);
    helm_template(&[file.path().to_owned()], sets).map(|text| Rendered {
        docs: split_documents(&text),
    })
}

fn rendered(values: &str, sets: &[&str]) -> Rendered {
    render(values, sets).unwrap_or_else(|e| panic!("helm template {sets:?} failed:\n{e}"))
}

/// The file the chart rendered into `<fullname>-authentication`.
fn authentication_file(r: &Rendered) -> String {
    let cm: ConfigMap = r.get("ConfigMap", &format!("{FULLNAME}-authentication"));
    let data = cm.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        [AUTHN_KEY],
        "one key, the file"
    );
    data[AUTHN_KEY].clone()
}

/// The gateway container's mount of the authentication file's directory, and its volume.
fn authentication_mount(r: &Rendered) -> Option<(String, Volume)> {
    let mounts = r.gateway_container().volume_mounts.unwrap_or_default();
    let mount = mounts.iter().find(|m| m.name == "authentication-config")?;
    assert_eq!(mount.mount_path, AUTHN_DIR);
    assert_eq!(mount.read_only, Some(true));
    assert!(
        mount.sub_path.is_none() && mount.sub_path_expr.is_none(),
        "a subPath mount never sees the ConfigMap's updates: {mount:?}"
    );
    let pod = r.deployment().spec.template.spec.unwrap();
    let volume = (pod.volumes.unwrap().into_iter())
        .find(|v| v.name == mount.name)
        .expect("the mount's volume");
    Some((mount.mount_path.clone(), volume))
}

/// No CEL in these files: validation is asked to compile nothing.
struct NoCel;

impl ExpressionCompiler for NoCel {
    fn compile(&self, _: ExpressionKind, expression: &str) -> Result<CompiledExpression, String> {
        Err(format!("unexpected expression {expression:?}"))
    }
}

#[test]
fn authentication_config_is_a_configmap_mounted_as_a_directory_and_named_by_the_config() {
    let r = rendered(VALUES, &[]);
    for doc in &r.docs {
        round_trip_by_kind(doc).unwrap_or_else(|e| panic!("{}: {e}", doc["kind"]));
    }
    let file_path = format!("{AUTHN_DIR}/{AUTHN_KEY}");

    // The Deployment mounts the chart's ConfigMap as a directory, its one key at the path the
    // config names.
    let (dir, volume) = authentication_mount(&r).expect("the authentication file is mounted");
    let cm = volume.config_map.expect("a ConfigMap volume");
    assert_eq!(cm.name, format!("{FULLNAME}-authentication"));
    let items = cm.items.unwrap_or_default();
    assert!(
        items.is_empty()
            || items
                .iter()
                .any(|i| i.key == AUTHN_KEY && i.path == AUTHN_KEY),
        "{items:?}"
    );
    assert_eq!(format!("{dir}/{AUTHN_KEY}"), file_path);

    // config.yaml names the file and leaves anonymousAuth out (the file's anonymous decides).
    let config = r.config();
    assert_eq!(
        config["authenticationConfig"],
        file_path.as_str(),
        "{config}"
    );
    assert!(config.get("anonymousAuth").is_none(), "{config}");
    let options: gateway_config::Options = serde_saphyr::from_str(&r.config_text()).unwrap();
    assert_eq!(options.anonymous_auth, None);
    assert_eq!(
        options.authentication_config.as_deref(),
        Some(std::path::Path::new(&file_path))
    );

    // The file is the user's body with apiVersion and kind added, accepted as the gateway
    // decodes and validates it.
    let text = authentication_file(&r);
    assert!(
        text.starts_with(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n"
        ),
        "{text}"
    );
    let file = authn::decode(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let errors = authn::validate(&file, &NoCel, &[]);
    assert!(errors.is_empty(), "{}\n{text}", authn::aggregate(&errors));
    assert_eq!(file.jwt.len(), 1);
    assert_eq!(file.jwt[0].issuer.url, "https://issuer.example.com");
    assert_eq!(file.jwt[0].issuer.audiences, ["aggregation-gateway"]);
    assert_eq!(file.jwt[0].claim_mappings.username.claim, "sub");
    assert_eq!(
        file.jwt[0].claim_mappings.username.prefix.as_deref(),
        Some("oidc:")
    );
    let anonymous = file.anonymous.expect("anonymous in the file");
    assert!(anonymous.enabled);
    let paths: Vec<&str> = anonymous
        .conditions
        .iter()
        .map(|c| c.path.as_str())
        .collect();
    assert_eq!(paths, ["/livez", "/readyz"]);

    // The real binary accepts the rendered config, with the file where the path points.
    let fs = FakePodFs::new(&r);
    let config_path = fs.write_config(&r.config_text());
    let placed = fs.rewrite(&file_path);
    assert_eq!(std::fs::read_to_string(&placed).unwrap(), text);
    let out = check_config(&config_path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "aggregation-gateway --check-config refused the rendered config:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        fs.rewrite(&r.config_text())
    );

    // An apiVersion the user gives is kept.
    let r = rendered(
        VALUES,
        &["authentication.config.apiVersion=apiserver.config.k8s.io/v1beta1"],
    );
    let text = authentication_file(&r);
    assert!(
        text.starts_with("apiVersion: apiserver.config.k8s.io/v1beta1\n"),
        "{text}"
    );
    authn::decode(&text).unwrap();

    helm_lint_strict(VALUES);
}

/// `authentication.anonymous` is rendered as anonymousAuth unless the file has `anonymous`, even
/// when set explicitly; `null` renders nothing (for a file of the user's own ConfigMap).
#[test]
fn the_files_anonymous_replaces_anonymous_auth() {
    let without_anonymous = VALUES.split("    anonymous:").next().unwrap();
    let cases: [(&str, &[&str], Option<bool>); 5] = [
        (VALUES, &[], None),
        (VALUES, &["authentication.anonymous=false"], None),
        (without_anonymous, &[], Some(true)),
        (
            without_anonymous,
            &["authentication.anonymous=false"],
            Some(false),
        ),
        ("{}", &["authentication.anonymous=null"], None),
    ];
    for (values, sets, want) in cases {
        let config = rendered(values, sets).config();
        assert_eq!(
            config.get("anonymousAuth").and_then(Value::as_bool),
            want,
            "{sets:?}\n{values}\n{config}"
        );
        if want.is_none() {
            assert!(config.get("anonymousAuth").is_none(), "{sets:?}: {config}");
        }
    }
    // The install notes tell what an unverified client certificate is by the same rule.
    let notes = render_notes(
        None,
        &[
            "authentication.anonymous=true",
            "authentication.config.anonymous.enabled=false",
        ],
    );
    assert!(
        notes.contains("authenticates with one is refused (401) through the gateway"),
        "{notes}"
    );
    let notes = render_notes(None, &["authentication.config.anonymous.enabled=true"]);
    assert!(
        notes.contains("is system:anonymous (where authentication.config.anonymous allows it)"),
        "{notes}"
    );
    // Forcing it through extraConfig beside the file's anonymous would stop the gateway: refused
    // at render time, with the gateway's reason.
    let err = render(VALUES, &["extraConfig.anonymousAuth=true"])
        .err()
        .expect("extraConfig.anonymousAuth with the file's anonymous must be refused");
    assert!(
        err.contains("--anonymous-auth flag cannot be set when anonymous field is configured"),
        "{err}"
    );
}

/// The gateway reloads the file in place: changing it must not roll the Pods (the Pod template's
/// only checksum stays config.yaml's), while config.yaml's changes still do.
#[test]
fn changing_the_file_does_not_roll_the_pods() {
    let annotations = |r: &Rendered| {
        r.deployment()
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap_or_default()
    };
    let base = rendered(VALUES, &[]);
    let changed = rendered(
        VALUES,
        &["authentication.config.jwt[0].issuer.audiences[0]=another-audience"],
    );
    assert_ne!(authentication_file(&base), authentication_file(&changed));
    assert!(authentication_file(&changed).contains("another-audience"));
    assert_eq!(annotations(&base), annotations(&changed));
    let keys: Vec<String> = annotations(&base).into_keys().collect();
    assert_eq!(keys, ["checksum/config"], "no checksum of the file");
    // config.yaml's checksum still follows config.yaml.
    let other = rendered(VALUES, &["logging.level=debug"]);
    assert_ne!(
        annotations(&base)["checksum/config"],
        annotations(&other)["checksum/config"]
    );
}

/// `authentication.configMap` mounts the user's ConfigMap the same way, and the chart renders
/// none of its own; with both, helm refuses.
#[test]
fn an_existing_configmap_is_mounted_instead() {
    let r = rendered("{}", &["authentication.configMap=my-authentication"]);
    let (_, volume) = authentication_mount(&r).expect("the user's ConfigMap is mounted");
    assert_eq!(volume.config_map.unwrap().name, "my-authentication");
    assert_eq!(
        r.config()["authenticationConfig"],
        format!("{AUTHN_DIR}/{AUTHN_KEY}").as_str()
    );
    assert!(
        !r.docs.iter().any(|d| d["metadata"]["name"]
            == format!("{FULLNAME}-authentication").as_str()
            && d["kind"] == "ConfigMap"),
        "{}",
        r.names()
    );

    // Without either, nothing of it.
    let r = rendered("{}", &[]);
    assert!(authentication_mount(&r).is_none());
    assert!(r.config().get("authenticationConfig").is_none());

    let err = render(VALUES, &["authentication.configMap=my-authentication"])
        .err()
        .expect("both must be refused");
    assert!(
        err.contains("authentication.config and authentication.configMap are both set"),
        "{err}"
    );
}

/// The schema describes the file strictly: a misspelled field or a plain-http issuer fails
/// `helm template` naming it.
#[test]
fn the_schema_refuses_a_misspelled_or_insecure_issuer() {
    let cases: [(&str, &str); 3] = [
        (
            "authentication.config.jwt[0].issuer.audience[0]=x",
            "Additional property audience is not allowed",
        ),
        (
            "authentication.config.jwt[0].issuer.url=http://issuer.example.com",
            "authentication.config.jwt.0.issuer.url: Does not match pattern",
        ),
        (
            "authentication.config.anonymous.enabeld=true",
            "Additional property enabeld is not allowed",
        ),
    ];
    for (set, want) in cases {
        let err = render(VALUES, &[set])
            .err()
            .unwrap_or_else(|| panic!("{set} must be refused"));
        assert!(err.contains(want), "{set}: expected {want:?} in:\n{err}");
    }
}

fn helm_lint_strict(values: &str) {
    let file = values_file(values);
    let out = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(chart_dir())
        .arg("--values")
        .arg(file.path())
        .output()
        .expect("run helm lint");
    assert!(
        out.status.success(),
        "helm lint --strict failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
