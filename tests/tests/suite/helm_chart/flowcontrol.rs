//! API Priority and Fairness for the gateway's own requests: a FlowSchema matching its
//! ServiceAccount, ahead of kube's `kube-system-service-accounts`, `service-accounts` and
//! `global-default`, with the resource rules of its RBAC and nothing else, sending them to a
//! PriorityLevelConfiguration of its own; rendered exactly where the ServiceAccount is the
//! identity the core (this cluster's API server) sees, and valid by kube-apiserver's validation
//! (`pkg/apis/flowcontrol/validation`) of what it holds.

use k8s_openapi::api::flowcontrol::v1::{
    FlowSchema, PriorityLevelConfiguration, ResourcePolicyRule,
};
use k8s_openapi::api::rbac::v1::PolicyRule;

use e2e::helm::{label, Rendered, FULLNAME, NAMESPACE};
use e2e::table::check_each;

/// kube's suggested FlowSchemas a ServiceAccount would otherwise fall into, by precedence.
const KUBE_SYSTEM_SERVICE_ACCOUNTS: i32 = 900;
const SERVICE_ACCOUNTS: i32 = 9000;
const GLOBAL_DEFAULT: i32 = 9900;

/// kube's `ValidateFlowSchemaSpec` rules for what the chart renders: a precedence in 1..=10000
/// (1 and 10000 belong to the mandatory `exempt` and `catch-all`), a level named, and every
/// resource rule with verbs, groups, resources and a scope.
fn assert_valid_schema(schema: &FlowSchema, ctx: &str) {
    let spec = &schema.spec;
    let precedence = spec.matching_precedence.expect("matchingPrecedence");
    assert!((2..10000).contains(&precedence), "{ctx}: {precedence}");
    assert!(!spec.priority_level_configuration.name.is_empty(), "{ctx}");
    for rule in spec.rules.as_deref().unwrap_or_default() {
        assert!(!rule.subjects.is_empty(), "{ctx}: a rule without subjects");
        for r in rule.resource_rules.as_deref().unwrap_or_default() {
            assert!(
                !r.verbs.is_empty() && !r.api_groups.is_empty() && !r.resources.is_empty(),
                "{ctx}: {r:?}"
            );
            let namespaces = r.namespaces.as_deref().unwrap_or_default();
            assert!(
                r.cluster_scope == Some(true) || !namespaces.is_empty(),
                "{ctx}: a rule matching no scope: {r:?}"
            );
        }
        for r in rule.non_resource_rules.as_deref().unwrap_or_default() {
            for url in &r.non_resource_urls {
                let star = url.find('*');
                assert!(
                    url == "*"
                        || (url.starts_with('/')
                            && star.is_none_or(|at| url.ends_with("/*") && at == url.len() - 1)),
                    "{ctx}: kube refuses nonResourceURL {url:?}"
                );
            }
        }
    }
}

/// kube's `ValidatePriorityLevelConfigurationSpec` for a Limited level that queues: shares and
/// lendable percent in range, and a shuffle-sharding hand that fits its queues (handSize <= queues,
/// and the deck of queues^handSize hands within 60 bits).
fn assert_valid_level(level: &PriorityLevelConfiguration, ctx: &str) {
    let spec = &level.spec;
    assert_eq!(spec.type_, "Limited", "{ctx}");
    let limited = spec.limited.as_ref().expect("limited");
    assert!(
        limited.nominal_concurrency_shares.unwrap_or(0) >= 0,
        "{ctx}"
    );
    assert!(
        (0..=100).contains(&limited.lendable_percent.unwrap_or(0)),
        "{ctx}"
    );
    let response = &limited.limit_response;
    assert_eq!(response.type_, "Queue", "{ctx}");
    let q = response.queuing.as_ref().expect("queuing");
    let (queues, hand, length) = (
        q.queues.unwrap(),
        q.hand_size.unwrap(),
        q.queue_length_limit.unwrap(),
    );
    assert!(queues > 0 && hand > 0 && length > 0, "{ctx}: {q:?}");
    assert!(hand <= queues, "{ctx}: {q:?}");
    assert!(
        f64::from(hand) * f64::from(queues).log2() <= 60.0,
        "{ctx}: {q:?}"
    );
}

fn flowcontrol_rule(
    groups: &[&str],
    resources: &[&str],
    verbs: &[&str],
    namespaces: &[&str],
) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    (own(groups), own(resources), own(verbs), own(namespaces))
}

/// A rule as comparable tuples: groups, resources, verbs, namespaces.
fn key(r: &ResourcePolicyRule) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    (
        r.api_groups.clone(),
        r.resources.clone(),
        r.verbs.clone(),
        r.namespaces.clone().unwrap_or_default(),
    )
}

fn from_rbac(r: &PolicyRule) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    (
        r.api_groups.clone().unwrap_or_default(),
        r.resources.clone().unwrap_or_default(),
        r.verbs.clone(),
        vec!["*".to_owned()],
    )
}

#[test]
fn the_gateways_own_requests_have_a_flowschema_of_their_own_ahead_of_kubes_service_accounts() {
    let r = Rendered::of(None);
    let schema: FlowSchema = r.get("FlowSchema", FULLNAME);
    let level: PriorityLevelConfiguration = r.get("PriorityLevelConfiguration", FULLNAME);
    assert_valid_schema(&schema, "defaults");
    assert_valid_level(&level, "defaults");
    let spec = schema.spec;
    assert_eq!(spec.priority_level_configuration.name, FULLNAME);
    let precedence = spec.matching_precedence.unwrap();
    for (kube, before) in [
        ("kube-system-service-accounts", KUBE_SYSTEM_SERVICE_ACCOUNTS),
        ("service-accounts", SERVICE_ACCOUNTS),
        ("global-default", GLOBAL_DEFAULT),
    ] {
        assert!(
            precedence < before,
            "{precedence}: not before kube's {kube}"
        );
    }
    let rules = spec.rules.unwrap();
    assert_eq!(rules.len(), 1);
    // Exactly the gateway's ServiceAccount, the one its Deployment runs as.
    let subjects = &rules[0].subjects;
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    let sa = subjects[0].service_account.as_ref().unwrap();
    assert_eq!(
        (sa.name.as_str(), sa.namespace.as_str()),
        (FULLNAME, NAMESPACE)
    );
    let pod = r.deployment().spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(FULLNAME));

    // The resource rules are what RBAC lets it do, cluster-wide, plus its Lease and the
    // authentication ConfigMap in their namespaces; the reviews it makes for anonymous traffic
    // among them.
    let mut want: Vec<_> = r.cluster_role_rules().iter().map(from_rbac).collect();
    want.push(flowcontrol_rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "create", "update"],
        &[NAMESPACE],
    ));
    want.push(flowcontrol_rule(
        &[""],
        &["configmaps"],
        &["get", "list", "watch", "create", "update"],
        &["kube-system"],
    ));
    let have: Vec<_> = rules[0]
        .resource_rules
        .as_deref()
        .unwrap()
        .iter()
        .map(key)
        .collect();
    assert_eq!(have, want);
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(
            have.iter()
                .any(|(g, r, v, _)| g == &[group] && r == &[resource] && v == &["create"]),
            "{resource}: {have:?}"
        );
    }
    let non_resource = rules[0].non_resource_rules.as_deref().unwrap();
    assert!(non_resource[0]
        .non_resource_urls
        .iter()
        .any(|u| u == "/apis/*"));
}

#[test]
fn the_flowschema_is_rendered_only_where_the_core_sees_the_service_account() {
    let cases: Vec<(Option<&str>, &[&str], bool)> = vec![
        (None, &[], true),
        (Some("cert-manager"), &[], true),
        (None, &["flowControl.create=false"], false),
        // Another identity on the core, or another core: the ServiceAccount is not who asks.
        (None, &["core.tokenSecret=gateway-token"], false),
        (Some("sidecar-core"), &[], false),
        (Some("external-core"), &[], false),
        (
            None,
            &[
                "flowControl.matchingPrecedence=150",
                "flowControl.nominalConcurrencyShares=10",
            ],
            true,
        ),
    ];
    check_each(
        cases,
        |(example, sets, _)| format!("{} {sets:?}", label(*example)),
        |(example, sets, rendered)| {
            let r = Rendered::with(example, sets);
            let ctx = format!("{} {sets:?}", label(example));
            assert_eq!(r.has("FlowSchema"), rendered, "{ctx}: {}", r.names());
            assert_eq!(r.has("PriorityLevelConfiguration"), rendered, "{ctx}");
            if rendered {
                let schema: FlowSchema = r.get("FlowSchema", FULLNAME);
                assert_valid_schema(&schema, &ctx);
                assert_valid_level(&r.get("PriorityLevelConfiguration", FULLNAME), &ctx);
            }
        },
    );
}
