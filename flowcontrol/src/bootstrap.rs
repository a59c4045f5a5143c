//! kube's built-in configuration (k8s.io/apiserver `pkg/apis/flowcontrol/bootstrap/default.go`):
//! the *mandatory* objects every server has whatever the API says (`exempt` and `catch-all`), and
//! the *suggested* ones kube-apiserver writes into a new cluster. A core that serves no
//! FlowSchemas (the `file` and `none` APIService sources, servers that are not kube-apiserver)
//! gets both, so a request is classified the same way behind any core.
//!
//! The objects are those of the release the core reports ([`Release`]): kube 1.34 removed the
//! `endpoint-controller` and `workload-leader-election` FlowSchemas, which guarded leader
//! election through Endpoints and ConfigMaps, a mechanism gone since; a core of 1.33 or older
//! gets them back.

use std::collections::BTreeMap;

use k8s_openapi::api::flowcontrol::v1::{
    ExemptPriorityLevelConfiguration, FlowDistinguisherMethod, FlowSchema, FlowSchemaSpec,
    GroupSubject, LimitResponse, LimitedPriorityLevelConfiguration, NonResourcePolicyRule,
    PolicyRulesWithSubjects, PriorityLevelConfiguration, PriorityLevelConfigurationReference,
    PriorityLevelConfigurationSpec, QueuingConfiguration, ResourcePolicyRule,
    ServiceAccountSubject, Subject, UserSubject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use gateway_request::identity::{AUTHENTICATED, UNAUTHENTICATED};

pub const EXEMPT: &str = "exempt";
pub const CATCH_ALL: &str = "catch-all";
/// The annotation kube-apiserver's configuration writer sets on the objects it keeps current.
const AUTO_UPDATE: &str = "apf.kubernetes.io/autoupdate-spec";

const SYSTEM_MASTERS: &str = "system:masters";
const SYSTEM_NODES: &str = "system:nodes";
const ALL_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
const KUBE_CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
const KUBE_SCHEDULER: &str = "system:kube-scheduler";

/// Whose suggested objects the built-in configuration holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Release {
    /// kube-apiserver 1.34 and newer, and cores that report no Kubernetes release.
    #[default]
    Current,
    /// kube-apiserver 1.33 and older: two more FlowSchemas.
    Before1_34,
}

impl Release {
    /// The set for a core of Kubernetes `1.<minor>`.
    pub fn of_minor(minor: u32) -> Self {
        if minor < 34 {
            Release::Before1_34
        } else {
            Release::Current
        }
    }
}

/// The mandatory PriorityLevelConfigurations: `exempt` and `catch-all`.
pub fn mandatory_priority_levels() -> Vec<PriorityLevelConfiguration> {
    vec![
        priority_level(
            EXEMPT,
            PriorityLevelConfigurationSpec {
                type_: "Exempt".into(),
                exempt: Some(ExemptPriorityLevelConfiguration {
                    nominal_concurrency_shares: Some(0),
                    lendable_percent: Some(0),
                }),
                limited: None,
            },
        ),
        priority_level(
            CATCH_ALL,
            PriorityLevelConfigurationSpec {
                type_: "Limited".into(),
                exempt: None,
                limited: Some(LimitedPriorityLevelConfiguration {
                    nominal_concurrency_shares: Some(5),
                    lendable_percent: Some(0),
                    borrowing_limit_percent: None,
                    limit_response: LimitResponse {
                        type_: "Reject".into(),
                        queuing: None,
                    },
                }),
            },
        ),
    ]
}

/// The mandatory FlowSchemas: `exempt` (system:masters) and `catch-all` (everyone).
pub fn mandatory_flow_schemas() -> Vec<FlowSchema> {
    vec![
        flow_schema(
            EXEMPT,
            EXEMPT,
            1,
            None,
            everything(groups(&[SYSTEM_MASTERS])),
        ),
        flow_schema(
            CATCH_ALL,
            CATCH_ALL,
            10_000,
            Some("ByUser"),
            everything(groups(&[UNAUTHENTICATED, AUTHENTICATED])),
        ),
    ]
}

/// The suggested PriorityLevelConfigurations.
pub fn suggested_priority_levels() -> Vec<PriorityLevelConfiguration> {
    [
        ("system", 30, 33, 64, 6),
        ("node-high", 40, 25, 64, 6),
        ("leader-election", 10, 0, 16, 4),
        ("workload-high", 40, 50, 128, 6),
        ("workload-low", 100, 90, 128, 6),
        ("global-default", 20, 50, 128, 6),
    ]
    .into_iter()
    .map(|(name, shares, lendable, queues, hand)| {
        priority_level(
            name,
            PriorityLevelConfigurationSpec {
                type_: "Limited".into(),
                exempt: None,
                limited: Some(LimitedPriorityLevelConfiguration {
                    nominal_concurrency_shares: Some(shares),
                    lendable_percent: Some(lendable),
                    borrowing_limit_percent: None,
                    limit_response: LimitResponse {
                        type_: "Queue".into(),
                        queuing: Some(QueuingConfiguration {
                            queues: Some(queues),
                            hand_size: Some(hand),
                            queue_length_limit: Some(50),
                        }),
                    },
                }),
            },
        )
    })
    .collect()
}

/// The suggested FlowSchemas of `release`.
pub fn suggested_flow_schemas_of(release: Release) -> Vec<FlowSchema> {
    let mut schemas = suggested_flow_schemas();
    if release == Release::Before1_34 {
        schemas.extend(removed_in_1_34());
    }
    schemas
}

/// What 1.33 had beside [`suggested_flow_schemas`]: leader election through Endpoints and
/// ConfigMaps, and the endpoints controller's writes kept ahead of it.
fn removed_in_1_34() -> [FlowSchema; 2] {
    let core_rule = |resources: &[&str]| ResourcePolicyRule {
        verbs: strings(&["get", "create", "update"]),
        api_groups: strings(&[""]),
        resources: strings(resources),
        namespaces: Some(strings(&["*"])),
        cluster_scope: Some(false),
    };
    let kube_system = |name: &str| Subject {
        kind: "ServiceAccount".into(),
        service_account: Some(ServiceAccountSubject {
            namespace: "kube-system".into(),
            name: name.into(),
        }),
        ..Default::default()
    };
    let mut endpoint_writers = users(&[KUBE_CONTROLLER_MANAGER]);
    endpoint_writers
        .extend(["endpoint-controller", "endpointslicemirroring-controller"].map(kube_system));
    [
        flow_schema(
            "endpoint-controller",
            "workload-high",
            150,
            Some("ByUser"),
            PolicyRulesWithSubjects {
                subjects: endpoint_writers,
                resource_rules: Some(vec![core_rule(&["endpoints"])]),
                non_resource_rules: None,
            },
        ),
        flow_schema(
            "workload-leader-election",
            "leader-election",
            200,
            Some("ByUser"),
            PolicyRulesWithSubjects {
                subjects: vec![kube_system("*")],
                resource_rules: Some(vec![
                    core_rule(&["endpoints", "configmaps"]),
                    ResourcePolicyRule {
                        api_groups: strings(&["coordination.k8s.io"]),
                        resources: strings(&["leases"]),
                        ..core_rule(&[])
                    },
                ]),
                non_resource_rules: None,
            },
        ),
    ]
}

/// The suggested FlowSchemas of kube 1.34 and newer.
pub fn suggested_flow_schemas() -> Vec<FlowSchema> {
    let kube_system_service_accounts = || {
        vec![Subject {
            kind: "ServiceAccount".into(),
            service_account: Some(ServiceAccountSubject {
                namespace: "kube-system".into(),
                name: "*".into(),
            }),
            ..Default::default()
        }]
    };
    let leases = |verbs: &[&str]| ResourcePolicyRule {
        verbs: strings(verbs),
        api_groups: strings(&["coordination.k8s.io"]),
        resources: strings(&["leases"]),
        namespaces: Some(strings(&["*"])),
        cluster_scope: Some(false),
    };
    let mut leader_election_subjects = users(&[KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER]);
    leader_election_subjects.extend(kube_system_service_accounts());
    vec![
        flow_schema(
            "system-nodes",
            "system",
            500,
            Some("ByUser"),
            everything(groups(&[SYSTEM_NODES])),
        ),
        flow_schema(
            "system-node-high",
            "node-high",
            400,
            Some("ByUser"),
            PolicyRulesWithSubjects {
                subjects: groups(&[SYSTEM_NODES]),
                resource_rules: Some(vec![
                    ResourcePolicyRule {
                        verbs: strings(&["*"]),
                        api_groups: strings(&[""]),
                        resources: strings(&["nodes", "nodes/status"]),
                        namespaces: Some(strings(&["*"])),
                        cluster_scope: Some(true),
                    },
                    leases(&["*"]),
                ]),
                non_resource_rules: None,
            },
        ),
        flow_schema(
            "probes",
            EXEMPT,
            2,
            None,
            PolicyRulesWithSubjects {
                subjects: groups(&[UNAUTHENTICATED, AUTHENTICATED]),
                resource_rules: None,
                non_resource_rules: Some(vec![NonResourcePolicyRule {
                    verbs: strings(&["get"]),
                    non_resource_urls: strings(&["/healthz", "/readyz", "/livez"]),
                }]),
            },
        ),
        flow_schema(
            "system-leader-election",
            "leader-election",
            100,
            Some("ByUser"),
            PolicyRulesWithSubjects {
                subjects: leader_election_subjects,
                resource_rules: Some(vec![leases(&["get", "create", "update"])]),
                non_resource_rules: None,
            },
        ),
        flow_schema(
            "kube-controller-manager",
            "workload-high",
            800,
            Some("ByNamespace"),
            everything(users(&[KUBE_CONTROLLER_MANAGER])),
        ),
        flow_schema(
            "kube-scheduler",
            "workload-high",
            800,
            Some("ByNamespace"),
            everything(users(&[KUBE_SCHEDULER])),
        ),
        flow_schema(
            "kube-system-service-accounts",
            "workload-high",
            900,
            Some("ByNamespace"),
            everything(kube_system_service_accounts()),
        ),
        flow_schema(
            "service-accounts",
            "workload-low",
            9000,
            Some("ByUser"),
            everything(groups(&[ALL_SERVICE_ACCOUNTS])),
        ),
        flow_schema(
            "global-default",
            "global-default",
            9900,
            Some("ByUser"),
            everything(groups(&[UNAUTHENTICATED, AUTHENTICATED])),
        ),
    ]
}

fn meta(kind: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        uid: Some(built_in_uid(kind, name)),
        annotations: Some(BTreeMap::from([(AUTO_UPDATE.into(), "true".into())])),
        ..Default::default()
    }
}

/// A UID for a built-in object no server stored: derived from its kind and name, so that every
/// gateway replica, before and after a restart, answers with the same
/// `X-Kubernetes-PF-*-UID` headers.
fn built_in_uid(kind: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let sum = Sha256::digest(format!("aggregation-gateway/{kind}/{name}"));
    let mut b: [u8; 16] = sum[..16].try_into().expect("a SHA-256 sum has 32 bytes");
    // Version 5 layout (name-based), RFC 4122 variant.
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(b).to_string()
}

fn priority_level(name: &str, spec: PriorityLevelConfigurationSpec) -> PriorityLevelConfiguration {
    PriorityLevelConfiguration {
        metadata: meta("prioritylevelconfigurations", name),
        spec,
        status: None,
    }
}

fn flow_schema(
    name: &str,
    level: &str,
    matching_precedence: i32,
    distinguisher: Option<&str>,
    rules: PolicyRulesWithSubjects,
) -> FlowSchema {
    FlowSchema {
        metadata: meta("flowschemas", name),
        spec: FlowSchemaSpec {
            priority_level_configuration: PriorityLevelConfigurationReference {
                name: level.into(),
            },
            matching_precedence: Some(matching_precedence),
            distinguisher_method: distinguisher
                .map(|d| FlowDistinguisherMethod { type_: d.into() }),
            rules: Some(vec![rules]),
        },
        status: None,
    }
}

/// Every resource (cluster-wide and in every namespace) and every non-resource URL.
fn everything(subjects: Vec<Subject>) -> PolicyRulesWithSubjects {
    PolicyRulesWithSubjects {
        subjects,
        resource_rules: Some(vec![ResourcePolicyRule {
            verbs: strings(&["*"]),
            api_groups: strings(&["*"]),
            resources: strings(&["*"]),
            namespaces: Some(strings(&["*"])),
            cluster_scope: Some(true),
        }]),
        non_resource_rules: Some(vec![NonResourcePolicyRule {
            verbs: strings(&["*"]),
            non_resource_urls: strings(&["*"]),
        }]),
    }
}

fn groups(names: &[&str]) -> Vec<Subject> {
    names
        .iter()
        .map(|n| Subject {
            kind: "Group".into(),
            group: Some(GroupSubject { name: (*n).into() }),
            ..Default::default()
        })
        .collect()
}

fn users(names: &[&str]) -> Vec<Subject> {
    names
        .iter()
        .map(|n| Subject {
            kind: "User".into(),
            user: Some(UserSubject { name: (*n).into() }),
            ..Default::default()
        })
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}
