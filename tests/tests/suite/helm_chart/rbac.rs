//! RBAC: the gateway's rules are exactly the verbs it uses, granted where the identity it presents
//! to the core is authorized (the host cluster for the Pod's ServiceAccount, `<fullname>-core`
//! otherwise), bound to the configured subjects, and the ServiceAccount token is mounted only when
//! the gateway sends it.

use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::{json, Value};

use e2e::helm::{example_file, helm_template, label, Rendered, FULLNAME, NAMESPACE, SA_DIR};

use e2e::table::check_each;

// === the rules the gateway may need ===

fn rule(group: &str, resource: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

/// The core's discovery is kept fresh by watching its CRDs (issue 24: without this rule every
/// replica logged `cannot list resource "customresourcedefinitions"` and polled instead).
fn watch_crds() -> PolicyRule {
    rule(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get", "list", "watch"],
    )
}
fn watch_apiservices() -> PolicyRule {
    rule(
        "apiregistration.k8s.io",
        "apiservices",
        &["get", "list", "watch"],
    )
}
fn write_apiservice_status() -> PolicyRule {
    rule(
        "apiregistration.k8s.io",
        "apiservices/status",
        // get: the condition is read back before it is patched (issue 24: `cannot get resource
        // "apiservices/status"`, 20 errors at start).
        &["get", "update", "patch"],
    )
}
fn watch_services() -> PolicyRule {
    rule("", "services", &["get", "list", "watch"])
}
fn watch_endpointslices() -> PolicyRule {
    rule(
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
    )
}
fn create_tokenreviews() -> PolicyRule {
    rule("authentication.k8s.io", "tokenreviews", &["create"])
}
fn create_subjectaccessreviews() -> PolicyRule {
    rule("authorization.k8s.io", "subjectaccessreviews", &["create"])
}

/// API Priority and Fairness reads the core's configuration, with the kube source.
fn watch_flowcontrol() -> PolicyRule {
    PolicyRule {
        resources: Some(vec![
            "flowschemas".to_owned(),
            "prioritylevelconfigurations".to_owned(),
        ]),
        ..rule(
            "flowcontrol.apiserver.k8s.io",
            "",
            &["get", "list", "watch"],
        )
    }
}

fn every_rule() -> Vec<PolicyRule> {
    vec![
        watch_crds(),
        watch_apiservices(),
        write_apiservice_status(),
        watch_services(),
        watch_endpointslices(),
        create_tokenreviews(),
        create_subjectaccessreviews(),
        watch_flowcontrol(),
    ]
}

/// One way of reaching the core, and where the gateway's rules must be for it.
struct Case {
    /// Named in failures: which identity the gateway presents to which core.
    name: &'static str,
    example: Option<&'static str>,
    sets: &'static [&'static str],
    /// Rules of the ClusterRole in the host cluster (the one Helm installs into).
    host: Vec<PolicyRule>,
    /// Rules of the ClusterRole rendered into `<fullname>-core` for the user to apply.
    core: Vec<PolicyRule>,
}

/// The gateway makes its own requests (APIService watch and status, Service/EndpointSlice
/// lookups, TokenReviews, SubjectAccessReviews) only to the core, so its rules belong where the
/// identity it presents there is authorized: the host cluster when that identity is the Pod's
/// ServiceAccount, the core otherwise (rendered into `<fullname>-core` for the user to apply).
#[test]
fn rbac_grants_exactly_the_verbs_the_gateway_uses_where_its_identity_is_authorized() {
    let none = Vec::new;
    let cases = vec![
        Case {
            name: "the cluster's own API server with the ServiceAccount: everything, in the host cluster",
            example: None,
            sets: &[],
            host: every_rule(),
            core: none(),
        },
        Case {
            name: "cert-manager certificates, the cluster's own API server with the ServiceAccount",
            example: Some("cert-manager"),
            sets: &[],
            host: every_rule(),
            core: none(),
        },
        Case {
            name: "a sidecar reached with a token from a Secret: nothing in the host cluster",
            example: Some("sidecar-core"),
            sets: &[],
            host: none(),
            core: every_rule(),
        },
        Case {
            name: "an external server reached with a client certificate, token webhook off",
            example: Some("external-core"),
            sets: &[],
            host: none(),
            core: vec![
                watch_crds(),
                watch_apiservices(),
                write_apiservice_status(),
                watch_services(),
                watch_endpointslices(),
                create_subjectaccessreviews(),
                watch_flowcontrol(),
            ],
        },
        Case {
            name: "file source, static services, both webhooks off: the core's discovery watches, and reviews for /metrics and the APF dumps",
            example: Some("file-apiservices"),
            sets: &[],
            host: none(),
            core: vec![
                watch_crds(),
                watch_apiservices(),
                create_subjectaccessreviews(),
            ],
        },
        Case {
            name: "file source resolving Services on the core",
            example: Some("file-apiservices"),
            sets: &["serviceResolution.enabled=true"],
            host: none(),
            core: vec![
                watch_crds(),
                watch_apiservices(),
                watch_services(),
                watch_endpointslices(),
                create_subjectaccessreviews(),
            ],
        },
        Case {
            name: "file source resolving Services with the ServiceAccount",
            example: Some("file-apiservices"),
            sets: &[
                "serviceResolution.enabled=true",
                "core.serviceAccountAuth=true",
            ],
            host: vec![
                watch_crds(),
                watch_apiservices(),
                watch_services(),
                watch_endpointslices(),
                create_subjectaccessreviews(),
            ],
            core: none(),
        },
        Case {
            name: "no APIService source: only the webhooks",
            example: None,
            sets: &["apiServices.source=none"],
            host: vec![
                watch_crds(),
                watch_apiservices(),
                create_tokenreviews(),
                create_subjectaccessreviews(),
            ],
            core: none(),
        },
        Case {
            name: "no Service resolution, no authorization webhook",
            example: None,
            sets: &[
                "serviceResolution.enabled=false",
                "authorization.webhook.enabled=false",
            ],
            // /metrics and the APF dumps are still reviewed.
            host: vec![
                watch_crds(),
                watch_apiservices(),
                write_apiservice_status(),
                create_tokenreviews(),
                create_subjectaccessreviews(),
                watch_flowcontrol(),
            ],
            core: none(),
        },
        Case {
            name: "priority and fairness off: the core's FlowSchemas are not read",
            example: None,
            sets: &["limits.enablePriorityAndFairness=false"],
            host: every_rule()
                .into_iter()
                .filter(|r| *r != watch_flowcontrol())
                .collect(),
            core: none(),
        },
        // extraConfig wins over limits in the config file; the rules follow what the gateway runs.
        Case {
            name: "priority and fairness off by extraConfig",
            example: None,
            sets: &["extraConfig.enablePriorityAndFairness=false"],
            host: every_rule()
                .into_iter()
                .filter(|r| *r != watch_flowcontrol())
                .collect(),
            core: none(),
        },
        Case {
            name: "priority and fairness on by extraConfig over limits",
            example: None,
            sets: &[
                "limits.enablePriorityAndFairness=false",
                "extraConfig.enablePriorityAndFairness=true",
            ],
            host: every_rule(),
            core: none(),
        },
        // The ServiceAccount is never presented, so it gets nothing.
        Case {
            name: "the host's API server, but as whoever the token Secret holds",
            example: None,
            sets: &["core.tokenSecret=gateway-token"],
            host: none(),
            core: every_rule(),
        },
        // It delegates authn/authz to the host, as aggregated API servers do: the host's RBAC is
        // what authorizes the gateway.
        Case {
            name: "a sidecar that trusts the host's ServiceAccount tokens",
            example: Some("sidecar-core"),
            sets: &["core.serviceAccountAuth=true", "core.tokenSecret="],
            host: every_rule(),
            core: none(),
        },
        Case {
            name: "nothing reviewed: no remote authorization, no /metrics review, no APF dumps",
            example: None,
            sets: &[
                "authorization.webhook.enabled=false",
                "authorization.authorizeMetrics=false",
                "limits.enablePriorityAndFairness=false",
            ],
            host: every_rule()
                .into_iter()
                .filter(|r| *r != create_subjectaccessreviews() && *r != watch_flowcontrol())
                .collect(),
            core: none(),
        },
        Case {
            name: "rbac.create=false with the defaults",
            example: None,
            sets: &["rbac.create=false"],
            host: none(),
            core: none(),
        },
        Case {
            name: "rbac.create=false with a sidecar",
            example: Some("sidecar-core"),
            sets: &["rbac.create=false"],
            host: none(),
            core: none(),
        },
    ];
    let name = |case: &Case| format!("{} ({} {:?})", case.name, label(case.example), case.sets);
    check_each(cases, name, |case| {
        let Case {
            example,
            sets,
            host,
            core,
            ..
        } = case;
        let r = Rendered::with(example, sets);
        let ctx = format!("{} {sets:?}", label(example));
        assert_eq!(r.cluster_role_rules(), host, "{ctx}: host cluster rules");
        assert_eq!(
            r.core_cluster_role_rules(),
            core,
            "{ctx}: rules for the core"
        );
        let pod = r.deployment().spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some(FULLNAME), "{ctx}");

        // Host-cluster RBAC exists exactly when the ServiceAccount token is mounted and is the
        // token the gateway sends; a grant to a token the gateway never presents is an over-grant.
        let token_in_use = r.config()["coreTokenFile"] == format!("{SA_DIR}/token");
        assert_eq!(
            pod.automount_service_account_token,
            Some(token_in_use),
            "{ctx}"
        );
        // The only namespaced RBAC: the authentication ConfigMap's Role in kube-system, and with
        // the kube source the leader-election Lease's, exactly when the ServiceAccount is the
        // gateway's identity (as the ClusterRole).
        let authentication = format!("{FULLNAME}-authentication");
        let rbac_created = !sets.contains(&"rbac.create=false");
        let kube_source = r.config()["apiserviceSource"] == "kube";
        let roles = usize::from(token_in_use && rbac_created)
            + usize::from(token_in_use && rbac_created && kube_source);
        assert_eq!(
            (r.all("Role").len(), r.all("RoleBinding").len()),
            (roles, roles),
            "{ctx}: the authentication and leader-election Roles and RoleBindings"
        );
        if token_in_use && rbac_created {
            let role: Role = r.get("Role", &authentication);
            assert_eq!(
                role.metadata.namespace.as_deref(),
                Some("kube-system"),
                "{ctx}"
            );
            let rules = role.rules.unwrap();
            let named: Vec<(&[String], &[String])> = rules
                .iter()
                .map(|rule| {
                    (
                        rule.resource_names.as_deref().unwrap_or_default(),
                        rule.verbs.as_slice(),
                    )
                })
                .collect();
            assert_eq!(
                named,
                [
                    (
                        &["extension-apiserver-authentication".to_owned()][..],
                        &[
                            "get".to_owned(),
                            "list".into(),
                            "watch".into(),
                            "update".into()
                        ][..]
                    ),
                    (&[][..], &["create".to_owned()][..]),
                ],
                "{ctx}: that one ConfigMap, and create (which cannot name it)"
            );
            for rule in &rules {
                assert_eq!(
                    rule.resources.as_deref(),
                    Some(&["configmaps".to_owned()][..]),
                    "{ctx}"
                );
            }
            let binding: RoleBinding = r.get("RoleBinding", &authentication);
            assert_eq!(binding.role_ref.name, authentication, "{ctx}");
            let subjects = binding.subjects.unwrap();
            assert_eq!(
                (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
                (FULLNAME, Some(NAMESPACE)),
                "{ctx}"
            );
        }
        if host.is_empty() {
            assert!(
                !r.has("ClusterRole") && !r.has("ClusterRoleBinding"),
                "{ctx}: no RBAC in the host cluster, not even an empty role"
            );
        } else {
            assert!(
                token_in_use,
                "{ctx}: host RBAC for an unused ServiceAccount"
            );
            let binding: ClusterRoleBinding = r.get("ClusterRoleBinding", FULLNAME);
            assert_eq!(
                (
                    binding.role_ref.kind.as_str(),
                    binding.role_ref.name.as_str()
                ),
                ("ClusterRole", FULLNAME),
                "{ctx}"
            );
            let subjects = binding.subjects.unwrap();
            assert_eq!(subjects.len(), 1, "{ctx}");
            assert_eq!(
                (
                    subjects[0].kind.as_str(),
                    subjects[0].name.as_str(),
                    subjects[0].namespace.as_deref()
                ),
                ("ServiceAccount", FULLNAME, Some(NAMESPACE)),
                "{ctx}"
            );
        }
        if core.is_empty() {
            assert!(
                !r.core_manifests().contains_key("rbac.yaml"),
                "{ctx}: no RBAC for the core, not even an empty role"
            );
        }
    });
}

/// On the core the gateway is whoever `rbac.coreSubjects` says (the token's user, the
/// certificate's CN): the binding names them, with the apiGroup RBAC requires for users and groups.
#[test]
fn rbac_for_the_core_binds_the_configured_subjects() {
    let manifests = Rendered::of(Some("sidecar-core")).core_manifests();
    let docs = &manifests["rbac.yaml"];
    let binding: ClusterRoleBinding = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "ClusterRoleBinding")
            .expect("a ClusterRoleBinding for the core")
            .clone(),
    )
    .unwrap();
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("ClusterRole", FULLNAME)
    );
    let subjects = binding.subjects.unwrap();
    assert_eq!(
        subjects
            .iter()
            .map(|s| (
                s.kind.as_str(),
                s.name.as_str(),
                s.api_group.as_deref(),
                s.namespace.as_deref()
            ))
            .collect::<Vec<_>>(),
        [(
            "User",
            "edge-gateway",
            Some("rbac.authorization.k8s.io"),
            None
        )]
    );

    let r = Rendered::with(
        Some("sidecar-core"),
        &[
            "rbac.coreSubjects[0].kind=ServiceAccount",
            "rbac.coreSubjects[0].name=gateway",
            "rbac.coreSubjects[0].namespace=platform",
        ],
    );
    let manifests = r.core_manifests();
    let subject = &manifests["rbac.yaml"]
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .expect("a ClusterRoleBinding")["subjects"][0];
    assert_eq!(
        subject,
        &json!({"kind": "ServiceAccount", "name": "gateway", "namespace": "platform"})
    );
    let err = helm_template(
        &[example_file("sidecar-core")],
        &[
            "rbac.coreSubjects[0].kind=ServiceAccount",
            "rbac.coreSubjects[0].name=gateway",
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("ServiceAccount gateway needs a namespace"),
        "{err}"
    );

    // Without subjects only the roles (and the Lease's namespace) are rendered; binding them is
    // left to the user.
    let manifests = Rendered::of(Some("external-core")).core_manifests();
    let kinds: Vec<&Value> = manifests["rbac.yaml"].iter().map(|d| &d["kind"]).collect();
    assert_eq!(
        kinds,
        [
            &json!("ClusterRole"),
            &json!("Role"),
            &json!("Namespace"),
            &json!("Role")
        ]
    );
}

/// The replicas elect the status writer with one Lease: the gateway may read and renew that
/// Lease by name and create it (create cannot name it), in the Lease's namespace, where its
/// identity is authorized; and the config names the same Lease.
#[test]
fn leader_election_grants_exactly_its_lease_where_the_gateway_is_authorized() {
    let lease_rules = |name: &str| {
        vec![
            PolicyRule {
                resource_names: Some(vec![name.to_owned()]),
                ..rule("coordination.k8s.io", "leases", &["get", "update"])
            },
            rule("coordination.k8s.io", "leases", &["create"]),
        ]
    };
    let role_name = format!("{FULLNAME}-leader-election");

    // The cluster's own API server with the ServiceAccount: a Role in the release namespace.
    let r = Rendered::of(None);
    let role: Role = r.get("Role", &role_name);
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(role.rules.unwrap(), lease_rules(FULLNAME));
    let binding: RoleBinding = r.get("RoleBinding", &role_name);
    assert_eq!(binding.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("Role", role_name.as_str())
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        (FULLNAME, Some(NAMESPACE))
    );
    let config = r.config();
    assert_eq!(config["leaderElect"], true);
    assert_eq!(config["leaderElectResourceName"], FULLNAME);
    assert_eq!(config["leaderElectResourceNamespace"], NAMESPACE);
    assert_eq!(
        (
            &config["leaderElectLeaseDuration"],
            &config["leaderElectRenewDeadline"],
            &config["leaderElectRetryPeriod"]
        ),
        (&json!("15s"), &json!("10s"), &json!("2s"))
    );

    // Named elsewhere: the Role goes where the Lease is.
    let r = Rendered::with(
        None,
        &[
            "leaderElection.namespace=gateways",
            "leaderElection.name=edge-lease",
        ],
    );
    let role: Role = r.get("Role", &role_name);
    assert_eq!(role.metadata.namespace.as_deref(), Some("gateways"));
    assert_eq!(role.rules.unwrap(), lease_rules("edge-lease"));
    assert_eq!(r.config()["leaderElectResourceNamespace"], "gateways");
    assert_eq!(r.config()["leaderElectResourceName"], "edge-lease");

    // Off, or a source that writes no status: no election, no Role.
    for (example, sets, leader_elect) in [
        (None, &["leaderElection.enabled=false"][..], json!(false)),
        (None, &["apiServices.source=none"][..], Value::Null),
        (Some("file-apiservices"), &[][..], Value::Null),
    ] {
        let r = Rendered::with(example, sets);
        let ctx = format!("{} {sets:?}", label(example));
        let roles: Vec<&Value> = r
            .all("Role")
            .into_iter()
            .filter(|role| role["metadata"]["name"] == role_name.as_str())
            .collect();
        assert!(roles.is_empty(), "{ctx}");
        assert_eq!(r.config()["leaderElect"], leader_elect, "{ctx}");
    }

    // A core that authorizes another identity: the Role (and a binding to coreSubjects) is in
    // rbac.yaml of <fullname>-core, in the Lease's namespace there.
    let manifests = Rendered::of(Some("sidecar-core")).core_manifests();
    let docs = &manifests["rbac.yaml"];
    let role: Role = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == role_name.as_str())
            .expect("the leader-election Role for the core")
            .clone(),
    )
    .unwrap();
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(role.rules.unwrap(), lease_rules(FULLNAME));
    let binding: RoleBinding = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["name"] == role_name.as_str())
            .expect("its binding to rbac.coreSubjects")
            .clone(),
    )
    .unwrap();
    assert_eq!(binding.role_ref.name, role_name);
    assert_eq!(binding.subjects.unwrap()[0].name, "edge-gateway");
    assert!(
        Rendered::of(Some("sidecar-core"))
            .all("Role")
            .iter()
            .all(|role| role["metadata"]["name"] != role_name.as_str()),
        "nothing in the host cluster for a core that does not trust its tokens"
    );
}

#[test]
fn the_service_account_token_is_mounted_only_when_the_gateway_uses_it() {
    let cases = [
        (None, true),
        (Some("sidecar-core"), false),
        (Some("external-core"), false),
        (Some("cert-manager"), true),
    ];
    check_each(
        cases,
        |(example, _)| label(*example).to_owned(),
        |(example, want)| {
            let r = Rendered::of(example);
            let pod = r.deployment().spec.template.spec.unwrap();
            assert_eq!(
                pod.automount_service_account_token,
                Some(want),
                "{}",
                label(example)
            );
            let config = r.config();
            let uses_sa = config
                .as_object()
                .unwrap()
                .values()
                .any(|v| v.as_str().is_some_and(|s| s.starts_with(SA_DIR)));
            assert_eq!(uses_sa, want, "{}", label(example));
        },
    );
    // The cluster's own API server, reached with the Pod's ServiceAccount.
    let config = Rendered::of(None).config();
    assert_eq!(config["coreUrl"], "https://kubernetes.default.svc");
    assert_eq!(config["coreTokenFile"], format!("{SA_DIR}/token"));
    assert_eq!(config["coreCaFile"], format!("{SA_DIR}/ca.crt"));
}

/// Turned off in the gateway's config, the authentication ConfigMap gets no Role either.
#[test]
fn no_authentication_role_when_the_gateway_does_not_manage_the_configmap() {
    let authentication = format!("{FULLNAME}-authentication");
    let named = |r: &Rendered, kind: &str| {
        r.all(kind)
            .iter()
            .any(|o| o["metadata"]["name"] == authentication.as_str())
    };
    let on = Rendered::of(None);
    assert!(named(&on, "Role") && named(&on, "RoleBinding"));
    let off = Rendered::with(
        None,
        &["extraConfig.manageExtensionApiserverAuthentication=false"],
    );
    assert!(
        !named(&off, "Role") && !named(&off, "RoleBinding"),
        "{}",
        off.names()
    );
    assert_eq!(
        off.config()["manageExtensionApiserverAuthentication"],
        false,
        "the gateway is told too"
    );
}
