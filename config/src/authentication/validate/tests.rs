//! kube's cases (k8s.io/apiserver/pkg/apis/apiserver/validation/validation_test.go) with kube's
//! messages, through a fake compiler.

use std::cell::RefCell;

use super::super::{AnonymousAuthCondition, AnonymousAuthConfig, ClaimOrExpression, ExtraMapping};
use super::*;

/// Fails on `BAD`; a rule (bool kinds) must compare or test presence; finds `claims.email` and
/// `claims.email_verified` (or `claims.?...`) in the text.
struct Fake;

const COMPILE_FAILED: &str =
    "compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container '')";

impl ExpressionCompiler for Fake {
    fn compile(&self, kind: ExpressionKind, expr: &str) -> Result<CompiledExpression, String> {
        if expr.contains("BAD") {
            return Err(COMPILE_FAILED.into());
        }
        let rule = matches!(
            kind,
            ExpressionKind::ClaimValidation | ExpressionKind::UserValidation
        );
        let boolean = expr.contains("==") || expr.starts_with("has(");
        if rule && !boolean {
            return Err("must evaluate to bool".into());
        }
        let text = expr.replace("claims.?", "claims.");
        let uses_email_verified = text.contains("claims.email_verified");
        let uses_email = text
            .replace("claims.email_verified", "")
            .contains("claims.email");
        Ok(CompiledExpression {
            uses_email,
            uses_email_verified,
        })
    }
}

type Case = (
    &'static str,
    fn() -> AuthenticationConfiguration,
    &'static str,
);

fn check(cases: &[Case]) {
    for (name, config, want) in cases {
        let got = aggregate(&validate(&config(), &Fake, &[]));
        assert_eq!(got, *want, "{name}");
    }
}

fn authenticator(url: &str) -> JwtAuthenticator {
    let mut a = JwtAuthenticator::default();
    a.issuer.url = url.into();
    a.issuer.audiences = vec!["audience".into()];
    a.claim_mappings.username = claim("sub", Some("prefix"));
    a
}

fn config(jwt: Vec<JwtAuthenticator>) -> AuthenticationConfiguration {
    AuthenticationConfiguration {
        jwt,
        ..Default::default()
    }
}

/// One authenticator, valid but for `edit`.
fn one(edit: impl FnOnce(&mut JwtAuthenticator)) -> AuthenticationConfiguration {
    let mut a = authenticator("https://issuer-url");
    edit(&mut a);
    config(vec![a])
}

fn claim(claim: &str, prefix: Option<&str>) -> PrefixedClaimOrExpression {
    let prefix = prefix.map(str::to_owned);
    PrefixedClaimOrExpression {
        claim: claim.into(),
        prefix,
        ..Default::default()
    }
}

fn expression(expression: &str) -> PrefixedClaimOrExpression {
    PrefixedClaimOrExpression {
        expression: expression.into(),
        ..Default::default()
    }
}

fn rule(claim: &str, expression: &str) -> ClaimValidationRule {
    ClaimValidationRule {
        claim: claim.into(),
        expression: expression.into(),
        ..Default::default()
    }
}

fn extra(key: &str, value_expression: &str) -> ExtraMapping {
    ExtraMapping {
        key: key.into(),
        value_expression: value_expression.into(),
    }
}

fn user_rule(expression: &str) -> UserValidationRule {
    UserValidationRule {
        expression: expression.into(),
        ..Default::default()
    }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

fn test_ca() -> String {
    rcgen::generate_simple_self_signed(strings(&["issuer-url"]))
        .unwrap()
        .cert
        .pem()
}

#[test]
fn duplicates_and_the_authenticator_cap() {
    check(&[
        ("valid", || one(|_| {}), ""),
        ("no authenticator", || config(Vec::new()), ""),
        (
            "duplicate issuer",
            || {
                config(vec![
                    authenticator("https://issuer-url"),
                    authenticator("https://issuer-url"),
                ])
            },
            r#"jwt[1].issuer.url: Duplicate value: "https://issuer-url""#,
        ),
        (
            "duplicate discovery URL",
            || {
                let mut jwt = vec![authenticator("https://a"), authenticator("https://b")];
                for a in &mut jwt {
                    a.issuer.discovery_url =
                        Some("https://d/.well-known/openid-configuration".into());
                }
                config(jwt)
            },
            r#"jwt[1].issuer.discoveryURL: Duplicate value: "https://d/.well-known/openid-configuration""#,
        ),
        ("64 authenticators", || authenticators(64), ""),
        (
            "65 authenticators",
            || authenticators(65),
            "jwt: Too many: 65: must have at most 64 items",
        ),
    ]);
}

fn authenticators(n: usize) -> AuthenticationConfiguration {
    config(
        (0..n)
            .map(|i| authenticator(&format!("https://issuer-{i}")))
            .collect(),
    )
}

#[test]
fn several_errors_print_as_kube_aggregates_them() {
    let config = config(vec![authenticator("http://a"), authenticator("http://a")]);
    let want = r#"[jwt[0].issuer.url: Invalid value: "http://a": URL scheme must be https, jwt[1].issuer.url: Invalid value: "http://a": URL scheme must be https, jwt[1].issuer.url: Duplicate value: "http://a"]"#;
    assert_eq!(aggregate(&validate(&config, &Fake, &[])), want);
}

#[test]
fn aggregate_prints_each_message_once() {
    let e = |s: &str| FieldError(s.into());
    assert_eq!(aggregate(&[]), "");
    assert_eq!(aggregate(&[e("a: Required value")]), "a: Required value");
    assert_eq!(aggregate(&[e("a"), e("b"), e("a")]), "[a, b]");
    assert_eq!(aggregate(&[e("a"), e("a")]), "a");
}

#[test]
fn issuer_url_must_be_https_without_user_query_or_fragment() {
    check(&[
        (
            "empty",
            || one(|a| a.issuer.url.clear()),
            "jwt[0].issuer.url: Required value",
        ),
        (
            "port",
            || one(|a| a.issuer.url = "https://issuer-url:invalid-port".into()),
            r#"jwt[0].issuer.url: Invalid value: "https://issuer-url:invalid-port": parse "https://issuer-url:invalid-port": invalid port ":invalid-port" after host"#,
        ),
        (
            "scheme",
            || one(|a| a.issuer.url = "http://issuer-url".into()),
            r#"jwt[0].issuer.url: Invalid value: "http://issuer-url": URL scheme must be https"#,
        ),
        (
            "no scheme",
            || one(|a| a.issuer.url = "invalid-url".into()),
            r#"jwt[0].issuer.url: Invalid value: "invalid-url": URL scheme must be https"#,
        ),
        (
            "user",
            || one(|a| a.issuer.url = "https://user:pass@issuer-url".into()),
            r#"jwt[0].issuer.url: Invalid value: "https://user:pass@issuer-url": URL must not contain a username or password"#,
        ),
        (
            "query",
            || one(|a| a.issuer.url = "https://issuer-url?query".into()),
            r#"jwt[0].issuer.url: Invalid value: "https://issuer-url?query": URL must not contain a query"#,
        ),
        (
            "fragment",
            || one(|a| a.issuer.url = "https://issuer-url#fragment".into()),
            r#"jwt[0].issuer.url: Invalid value: "https://issuer-url#fragment": URL must not contain a fragment"#,
        ),
        (
            "all at once",
            || one(|a| a.issuer.url = "http://u@x?q#f".into()),
            r#"[jwt[0].issuer.url: Invalid value: "http://u@x?q#f": URL scheme must be https, jwt[0].issuer.url: Invalid value: "http://u@x?q#f": URL must not contain a username or password, jwt[0].issuer.url: Invalid value: "http://u@x?q#f": URL must not contain a query, jwt[0].issuer.url: Invalid value: "http://u@x?q#f": URL must not contain a fragment]"#,
        ),
    ]);
}

#[test]
fn disallowed_issuers_are_listed_sorted() {
    let disallowed = strings(&["c", "https://issuer-url", "a", "b"]);
    let got = aggregate(&validate(&one(|_| {}), &Fake, &disallowed));
    let want = r#"jwt[0].issuer.url: Invalid value: "https://issuer-url": URL must not overlap with disallowed issuers: [a b c https://issuer-url]"#;
    assert_eq!(got, want);
    // The discovery URL is not an issuer.
    let config = one(|a| a.issuer.discovery_url = Some("https://c".into()));
    assert_eq!(
        aggregate(&validate(&config, &Fake, &strings(&["https://c"]))),
        ""
    );
}

fn discovery(url: &'static str, discovery: &'static str) -> AuthenticationConfiguration {
    one(|a| {
        a.issuer.url = url.into();
        a.issuer.discovery_url = Some(discovery.into());
    })
}

#[test]
fn discovery_url_follows_the_url_rules_and_differs_from_url() {
    check(&[
        (
            "valid",
            || discovery("https://issuer-url", "https://oidc.svc/.well-known"),
            "",
        ),
        ("empty", || discovery("https://issuer-url", ""), ""),
        (
            "port",
            || discovery("https://issuer-url", "https://oidc.svc:invalid-port"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "https://oidc.svc:invalid-port": parse "https://oidc.svc:invalid-port": invalid port ":invalid-port" after host"#,
        ),
        (
            "scheme",
            || discovery("https://issuer-url", "http://oidc.svc"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "http://oidc.svc": URL scheme must be https"#,
        ),
        (
            "same as url",
            || discovery("https://issuer-url", "https://issuer-url"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "https://issuer-url": discoveryURL must be different from URL"#,
        ),
        (
            "same but for slashes",
            || discovery("https://issuer-url", "https://issuer-url///"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "https://issuer-url///": discoveryURL must be different from URL"#,
        ),
        (
            "same, url with slash",
            || discovery("https://issuer-url/", "https://issuer-url"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "https://issuer-url": discoveryURL must be different from URL"#,
        ),
        (
            "user",
            || discovery("https://issuer-url", "https://user:pass@oidc.svc"),
            r#"jwt[0].issuer.discoveryURL: Invalid value: "https://user:pass@oidc.svc": URL must not contain a username or password"#,
        ),
    ]);
}

fn audiences(audiences: &[&str], policy: &str) -> AuthenticationConfiguration {
    one(|a| {
        a.issuer.audiences = strings(audiences);
        a.issuer.audience_match_policy = policy.into();
    })
}

#[test]
fn audiences_and_their_match_policy() {
    check(&[
        (
            "none",
            || audiences(&[], ""),
            "jwt[0].issuer.audiences: Required value: at least one jwt[0].issuer.audiences is required",
        ),
        ("empty", || audiences(&[""], ""), "jwt[0].issuer.audiences[0]: Required value"),
        (
            "single, MatchExact",
            || audiences(&["audience"], "MatchExact"),
            r#"jwt[0].issuer.audienceMatchPolicy: Invalid value: "MatchExact": audienceMatchPolicy must be empty or MatchAny for single audience"#,
        ),
        ("single, MatchAny", || audiences(&["audience"], "MatchAny"), ""),
        (
            "duplicate",
            || audiences(&["audience", "audience"], "MatchAny"),
            r#"jwt[0].issuer.audiences[1]: Duplicate value: "audience""#,
        ),
        (
            "several, no policy",
            || audiences(&["a", "b"], ""),
            r#"jwt[0].issuer.audienceMatchPolicy: Invalid value: "": audienceMatchPolicy must be MatchAny for multiple audiences"#,
        ),
        (
            "policy printed as JSON",
            || audiences(&["a"], "<x>"),
            r#"jwt[0].issuer.audienceMatchPolicy: Invalid value: "\u003cx\u003e": audienceMatchPolicy must be empty or MatchAny for single audience"#,
        ),
        ("several, MatchAny", || audiences(&["a", "b"], "MatchAny"), ""),
    ]);
}

#[test]
fn certificate_authority_holds_certificates_and_egress_is_known() {
    check(&[
        (
            "valid CA",
            || one(|a| a.issuer.certificate_authority = test_ca()),
            "",
        ),
        (
            "not PEM",
            || one(|a| a.issuer.certificate_authority = "invalid".into()),
            r#"jwt[0].issuer.certificateAuthority: Invalid value: "<omitted>": data does not contain any valid RSA or ECDSA certificates"#,
        ),
        (
            "not a certificate",
            || {
                let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
                one(|a| a.issuer.certificate_authority = pem.into())
            },
            r#"jwt[0].issuer.certificateAuthority: Invalid value: "<omitted>": x509: malformed certificate"#,
        ),
        (
            "controlplane",
            || one(|a| a.issuer.egress_selector_type = "controlplane".into()),
            "",
        ),
        (
            "cluster",
            || one(|a| a.issuer.egress_selector_type = "cluster".into()),
            "",
        ),
        (
            "panda",
            || one(|a| a.issuer.egress_selector_type = "panda".into()),
            r#"jwt[0].issuer.egressSelectorType: Invalid value: "panda": egress selector must be either controlplane or cluster"#,
        ),
    ]);
}

fn rules(rules: Vec<ClaimValidationRule>) -> AuthenticationConfiguration {
    one(|a| a.claim_validation_rules = rules)
}

#[test]
fn claim_validation_rules_take_a_claim_or_an_expression() {
    check(&[
        (
            "neither",
            || rules(vec![rule("", "")]),
            "jwt[0].claimValidationRules[0]: Required value: claim or expression is required",
        ),
        (
            "both",
            || rules(vec![rule("claim", "claims.foo == 'bar'")]),
            r#"jwt[0].claimValidationRules[0]: Invalid value: "claim": claim and expression can't both be set"#,
        ),
        (
            "message with claim",
            || {
                rules(vec![ClaimValidationRule {
                    message: "message".into(),
                    ..rule("claim", "")
                }])
            },
            r#"jwt[0].claimValidationRules[0].message: Invalid value: "message": may not be specified when claim is set"#,
        ),
        (
            "required value with expression",
            || {
                rules(vec![ClaimValidationRule {
                    required_value: "value".into(),
                    ..rule("", "claims.foo == 'bar'")
                }])
            },
            r#"jwt[0].claimValidationRules[0].requiredValue: Invalid value: "value": may not be specified when expression is set"#,
        ),
        (
            "duplicate claim",
            || rules(vec![rule("claim", ""), rule("claim", "")]),
            r#"jwt[0].claimValidationRules[1].claim: Duplicate value: "claim""#,
        ),
        (
            "duplicate expression, compiled once",
            || {
                rules(vec![
                    rule("", "claims.BAD == 'bar'"),
                    rule("", "claims.BAD == 'bar'"),
                ])
            },
            r#"[jwt[0].claimValidationRules[0].expression: Invalid value: "claims.BAD == 'bar'": compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container ''), jwt[0].claimValidationRules[1].expression: Duplicate value: "claims.BAD == 'bar'"]"#,
        ),
        (
            "not a bool",
            || rules(vec![rule("", "claims.foo")]),
            r#"jwt[0].claimValidationRules[0].expression: Invalid value: "claims.foo": must evaluate to bool"#,
        ),
        (
            "valid",
            || rules(vec![rule("claim", ""), rule("", "claims.foo == 'bar'")]),
            "",
        ),
    ]);
}

fn mappings(edit: fn(&mut ClaimMappings)) -> AuthenticationConfiguration {
    one(|a| edit(&mut a.claim_mappings))
}

#[test]
fn username_and_groups_take_a_prefixed_claim_or_an_expression() {
    check(&[
        (
            "username both",
            || mappings(|m| m.username.expression = "claims.sub".into()),
            r#"jwt[0].claimMappings.username: Invalid value: "": claim and expression can't both be set"#,
        ),
        (
            "username neither",
            || mappings(|m| m.username = PrefixedClaimOrExpression::default()),
            "jwt[0].claimMappings.username: Required value: claim or expression is required",
        ),
        (
            "username prefix with expression",
            || mappings(|m| m.username = PrefixedClaimOrExpression { prefix: Some("prefix".into()), ..expression("claims.sub") }),
            r#"jwt[0].claimMappings.username.prefix: Invalid value: "prefix": may not be specified when expression is set"#,
        ),
        (
            "username claim without prefix",
            || mappings(|m| m.username = claim("sub", None)),
            "jwt[0].claimMappings.username.prefix: Required value: prefix is required when claim is set. It can be set to an empty string to disable prefixing",
        ),
        ("username empty prefix", || mappings(|m| m.username = claim("sub", Some(""))), ""),
        (
            "username does not compile",
            || mappings(|m| m.username = expression("BAD.bar")),
            r#"jwt[0].claimMappings.username.expression: Invalid value: "BAD.bar": compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container '')"#,
        ),
        ("groups may be unset", || mappings(|m| m.groups = PrefixedClaimOrExpression::default()), ""),
        (
            "groups both",
            || mappings(|m| m.groups = PrefixedClaimOrExpression { expression: "claims.groups".into(), ..claim("groups", Some("")) }),
            r#"jwt[0].claimMappings.groups: Invalid value: "": claim and expression can't both be set"#,
        ),
        (
            "groups claim without prefix",
            || mappings(|m| m.groups = claim("groups", None)),
            "jwt[0].claimMappings.groups.prefix: Required value: prefix is required when claim is set. It can be set to an empty string to disable prefixing",
        ),
        (
            "groups does not compile",
            || mappings(|m| m.groups = expression("BAD.bar")),
            r#"jwt[0].claimMappings.groups.expression: Invalid value: "BAD.bar": compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container '')"#,
        ),
    ]);
}

#[test]
fn uid_and_extra_mappings_are_refused_as_kube_refuses_them() {
    check(&[
        (
            "uid both",
            || {
                mappings(|m| {
                    m.uid = ClaimOrExpression {
                        claim: "uid".into(),
                        expression: "claims.uid".into(),
                    }
                })
            },
            r#"jwt[0].claimMappings.uid: Invalid value: "": claim and expression can't both be set"#,
        ),
        ("uid claim", || mappings(|m| m.uid.claim = "uid".into()), ""),
        (
            "uid does not compile",
            || mappings(|m| m.uid.expression = "BAD.bar".into()),
            r#"jwt[0].claimMappings.uid.expression: Invalid value: "BAD.bar": compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container '')"#,
        ),
        (
            "extra key empty",
            || mappings(|m| m.extra = vec![extra("", "claims.x")]),
            "jwt[0].claimMappings.extra[0].key: Required value",
        ),
        (
            "extra value empty",
            || mappings(|m| m.extra = vec![extra("example.org/foo", "")]),
            "jwt[0].claimMappings.extra[0].valueExpression: Required value",
        ),
        (
            "extra does not compile",
            || mappings(|m| m.extra = vec![extra("example.org/foo", "BAD.bar")]),
            r#"jwt[0].claimMappings.extra[0].valueExpression: Invalid value: "BAD.bar": compilation failed: ERROR: <input>:1:1: undeclared reference to 'BAD' (in container '')"#,
        ),
        (
            "extra duplicate key",
            || {
                mappings(|m| {
                    m.extra = vec![
                        extra("example.org/foo", "claims.a"),
                        extra("example.org/foo", "claims.b"),
                    ]
                })
            },
            r#"jwt[0].claimMappings.extra[1].key: Duplicate value: "example.org/foo""#,
        ),
    ]);
}

fn extra_key(key: &'static str) -> AuthenticationConfiguration {
    one(|a| a.claim_mappings.extra = vec![extra(key, "claims.extra")])
}

const RESERVED: &str = "k8s.io, kubernetes.io and their subdomains are reserved for Kubernetes use";

#[test]
fn extra_keys_are_lowercase_domain_prefixed_paths_outside_kubernetes() {
    let reserved = |key: &str| {
        format!(r#"jwt[0].claimMappings.extra[0].key: Invalid value: "{key}": {RESERVED}"#)
    };
    for key in [
        "k8s.io/foo",
        "example.k8s.io/foo",
        "kubernetes.io/foo",
        "example.kubernetes.io/foo",
    ] {
        let got = aggregate(&validate(&extra_key(key), &Fake, &[]));
        assert_eq!(got, reserved(key));
    }
    check(&[
        ("almost reserved", || extra_key("ak8s.io/foo"), ""),
        (
            "almost reserved too",
            || extra_key("example.bkubernetes.io/foo"),
            "",
        ),
        (
            "not prefixed",
            || extra_key("foo"),
            r#"jwt[0].claimMappings.extra[0].key: Invalid value: "foo": must be a domain-prefixed path (such as "acme.io/foo")"#,
        ),
        (
            "uppercase",
            || extra_key("example.org/Foo"),
            r#"jwt[0].claimMappings.extra[0].key: Invalid value: "example.org/Foo": must be lowercase"#,
        ),
        (
            "uppercase domain",
            || extra_key("Example.org/foo"),
            r#"[jwt[0].claimMappings.extra[0].key: Invalid value: "Example.org": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'), jwt[0].claimMappings.extra[0].key: Invalid value: "Example.org/foo": must be lowercase]"#,
        ),
        (
            "bad path",
            || extra_key("example.org/a b"),
            r#"jwt[0].claimMappings.extra[0].key: Invalid value: "a b": Invalid path (regex used for validation is '[A-Za-z0-9/\-._~%!$&'()*+,;=:]+')"#,
        ),
    ]);
}

const EMAIL: &str = "claims.email_verified must be used in claimMappings.username.expression or claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when claims.email is used in claimMappings.username.expression";

fn email(username: &str) -> String {
    format!(r#"jwt[0].claimMappings.username.expression: Invalid value: "{username}": {EMAIL}"#)
}

fn username(a: &mut JwtAuthenticator, e: &str) {
    a.claim_mappings.username = expression(e);
}

#[test]
fn email_needs_email_verified() {
    for e in [
        "claims.email",
        "has(claims.email) ? claims.email : claims.sub",
        "claims.email.trim()",
    ] {
        let got = aggregate(&validate(&one(|a| username(a, e)), &Fake, &[]));
        assert_eq!(got, email(e));
    }
    check(&[
        (
            "verified in extra",
            || {
                one(|a| {
                    username(a, "claims.email");
                    a.claim_mappings.extra = vec![extra("example.org/v", "claims.email_verified")];
                })
            },
            "",
        ),
        (
            "verified in a rule",
            || {
                one(|a| {
                    username(a, "claims.email");
                    a.claim_validation_rules = vec![rule("", "claims.email_verified == true")];
                })
            },
            "",
        ),
        (
            "verified in the username",
            || one(|a| username(a, "claims.email_verified ? claims.email : ''")),
            "",
        ),
        // kube skips the rule when the username mapping has an error.
        (
            "username in error",
            || {
                one(|a| {
                    a.claim_mappings.username = PrefixedClaimOrExpression {
                        prefix: Some("p".into()),
                        ..expression("claims.email")
                    };
                })
            },
            r#"jwt[0].claimMappings.username.prefix: Invalid value: "p": may not be specified when expression is set"#,
        ),
    ]);
}

#[test]
fn a_rule_that_does_not_compile_does_not_verify_email() {
    let config = one(|a| {
        a.claim_validation_rules = vec![rule("", "claims.?email_verified.orValue(true)")];
        a.claim_mappings.username = expression(r#"{claims.?email: "panda"}"#);
    });
    let want = format!(
        r#"[jwt[0].claimValidationRules[0].expression: Invalid value: "claims.?email_verified.orValue(true)": must evaluate to bool, {}]"#,
        email(r#"{claims.?email: \"panda\"}"#)
    );
    assert_eq!(aggregate(&validate(&config, &Fake, &[])), want);
}

#[test]
fn user_validation_rules_need_distinct_expressions() {
    check(&[
        (
            "empty",
            || one(|a| a.user_validation_rules = vec![user_rule("")]),
            "jwt[0].userValidationRules[0].expression: Required value",
        ),
        (
            "duplicate",
            || {
                one(|a| {
                    a.user_validation_rules = vec![
                        user_rule("user.username == 'foo'"),
                        user_rule("user.username == 'foo'"),
                    ]
                })
            },
            r#"jwt[0].userValidationRules[1].expression: Duplicate value: "user.username == 'foo'""#,
        ),
        (
            "not a bool",
            || one(|a| a.user_validation_rules = vec![user_rule("user.username")]),
            r#"jwt[0].userValidationRules[0].expression: Invalid value: "user.username": must evaluate to bool"#,
        ),
        (
            "valid",
            || one(|a| a.user_validation_rules = vec![user_rule("user.username == 'foo'")]),
            "",
        ),
    ]);
}

fn anonymous(enabled: bool, paths: &[&str]) -> AuthenticationConfiguration {
    let conditions = paths
        .iter()
        .map(|p| AnonymousAuthCondition { path: (*p).into() })
        .collect();
    let anonymous = Some(AnonymousAuthConfig {
        enabled,
        conditions,
    });
    AuthenticationConfiguration {
        anonymous,
        ..Default::default()
    }
}

#[test]
fn anonymous_conditions_need_enabled() {
    check(&[
        (
            "enabled with conditions",
            || anonymous(true, &["/livez"]),
            "",
        ),
        ("disabled", || anonymous(false, &[]), ""),
        (
            "conditions but disabled",
            || anonymous(false, &["/livez", "/readyz"]),
            r#"anonymous.conditions: Invalid value: [{"Path":"/livez"},{"Path":"/readyz"}]: enabled should be set to true when conditions are defined"#,
        ),
    ]);
}

/// Records the kind each expression is compiled as.
#[derive(Default)]
struct Recorder(RefCell<Vec<(ExpressionKind, String)>>);

impl ExpressionCompiler for Recorder {
    fn compile(&self, kind: ExpressionKind, expr: &str) -> Result<CompiledExpression, String> {
        self.0.borrow_mut().push((kind, expr.to_owned()));
        Ok(CompiledExpression::default())
    }
}

#[test]
fn each_expression_is_compiled_as_its_kind() {
    let config = one(|a| {
        a.claim_validation_rules = vec![rule("", "rule")];
        a.claim_mappings = ClaimMappings {
            username: expression("username"),
            groups: expression("groups"),
            uid: ClaimOrExpression {
                expression: "uid".into(),
                ..Default::default()
            },
            extra: vec![extra("example.org/x", "extra")],
        };
        a.user_validation_rules = vec![user_rule("user")];
    });
    let recorder = Recorder::default();
    assert_eq!(validate(&config, &recorder, &[]), Vec::new());
    use ExpressionKind::*;
    let want = [
        (ClaimValidation, "rule"),
        (ClaimMapping, "username"),
        (ClaimMappingList, "groups"),
        (ClaimMapping, "uid"),
        (ClaimMappingList, "extra"),
        (UserValidation, "user"),
    ];
    let want: Vec<_> = want.iter().map(|(k, e)| (*k, (*e).to_owned())).collect();
    assert_eq!(recorder.0.into_inner(), want);
}
