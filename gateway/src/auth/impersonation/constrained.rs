//! Constrained impersonation (KEP-5284): the modes kube-apiserver tries, with its
//! `ConstrainedImpersonation` gate on, before the legacy `impersonate` verb, and the reviews each
//! mode asks for (`--constrained-impersonation`).

use super::*;

/// How an impersonation may be allowed, in the order kube-apiserver's constrained
/// impersonation filter (`k8s.io/apiserver/pkg/endpoints/filters/impersonation`, `mode.go`)
/// tries them with its `ConstrainedImpersonation` gate on: the first mode that allows it wins;
/// when none does, the refusal is the first mode's that applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A service account impersonating the node its token is bound to (`impersonate:associated-node`).
    AssociatedNode,
    /// Any node, `system:node:<name>` alone (`impersonate:arbitrary-node`).
    ArbitraryNode,
    /// A service account, its user name alone (`impersonate:serviceaccount`).
    ServiceAccount,
    /// Anyone else, with groups, UID and extras (`impersonate:user-info`).
    UserInfo,
    /// The verb `impersonate` on each attribute, as before the gate.
    Legacy,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::AssociatedNode,
        Mode::ArbitraryNode,
        Mode::ServiceAccount,
        Mode::UserInfo,
        Mode::Legacy,
    ];

    /// The mode's name in `impersonate:<name>` and `impersonate-on:<name>:<verb>`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::AssociatedNode => "associated-node",
            Mode::ArbitraryNode => "arbitrary-node",
            Mode::ServiceAccount => "serviceaccount",
            Mode::UserInfo => "user-info",
            Mode::Legacy => "impersonate",
        }
    }
}

/// One question about an impersonated attribute, owned (a plan outlives the headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub verb: String,
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Ask {
    pub fn action(&self) -> Action<'_> {
        Action::Resource {
            verb: &self.verb,
            group: self.group,
            version: self.version,
            resource: self.resource,
            subresource: &self.subresource,
            namespace: &self.namespace,
            name: &self.name,
        }
    }
}

/// A step of a mode's checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Must be allowed.
    Ask(Ask),
    /// Many groups or extras: if `any` (name `*`) is allowed the rest is not asked, otherwise
    /// each of `each` must be.
    AnyOrEach { any: Ask, each: Vec<Ask> },
    /// Refused without asking (the empty group, `system:masters`, a malformed extra), with why.
    Refuse { ask: Ask, why: String },
}

/// What a mode asks and whom the request continues as if all is allowed.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: Mode,
    /// The requestor as the reviews name it: associated-node replaces its extras by their
    /// keys, so that one decision holds for the service account on every node.
    pub requestor: UserInfo,
    /// Constrained modes first ask `impersonate-on:<mode>:<verb>` on the request itself.
    pub impersonate_on: bool,
    /// Associated-node asks about every node (`*`): its decision cannot depend on which.
    pub steps: Vec<Step>,
    pub user: UserInfo,
}

/// The Kubernetes user name of node `name`: `system:node:<name>`, the name a DNS-1123
/// subdomain (kube's `ValidateNodeName`).
fn node_name(user: &str) -> Option<&str> {
    let name = user.strip_prefix("system:node:")?;
    dns1123_subdomain_errors(name).is_empty().then_some(name)
}

const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const ASSOCIATED_NODE_KEYS: &str = "authentication.kubernetes.io/associated-node-keys";
/// From this many groups or extra values on, a constrained mode first asks about all (`*`).
const MANY: usize = 4;

fn only_user(req: &Request) -> bool {
    req.uid.is_empty() && req.groups.is_empty() && req.extra.is_empty()
}

/// kube's `IsDomainPrefixedPath`: `<DNS-1123 subdomain>/<path>`, the path non-empty and of
/// URL path characters.
fn domain_prefixed_path(key: &str) -> bool {
    let Some((host, path)) = key.split_once('/') else {
        return false;
    };
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    dns1123_subdomain_errors(host).is_empty() && !path.is_empty() && path.chars().all(path_char)
}

/// Why a constrained mode refuses these extras outright, if it does.
fn extra_refusal(extra: &BTreeMap<String, Vec<String>>) -> Option<String> {
    for (key, values) in extra {
        let why = if key.is_empty() {
            "impersonating the empty string key in extra is not allowed".to_owned()
        } else if !domain_prefixed_path(key) {
            format!("impersonating an invalid key in extra is not allowed: {key:?} must be a domain-prefixed path such as \"example.com/scopes\"")
        } else if *key != key.to_lowercase() {
            format!("impersonating a non-lowercase key in extra is not allowed: {key:?}")
        } else if values.is_empty() {
            "impersonating empty values in extra is not allowed".to_owned()
        } else if values.iter().any(String::is_empty) {
            "impersonating the empty string value in extra is not allowed".to_owned()
        } else {
            continue;
        };
        return Some(why);
    }
    None
}

/// Adds `system:authenticated`, or `system:unauthenticated` for `system:anonymous`, as kube
/// does after every mode.
fn with_auth_group(mut user: UserInfo) -> UserInfo {
    if user.name == ANONYMOUS {
        if !user.groups.iter().any(|g| g == UNAUTHENTICATED) {
            user.groups.push(UNAUTHENTICATED.to_owned());
        }
    } else if !user
        .groups
        .iter()
        .any(|g| g == UNAUTHENTICATED || g == AUTHENTICATED)
    {
        user.groups.push(AUTHENTICATED.to_owned());
    }
    user
}

/// The plans of every mode that applies to `req` from `requestor`, in kube's order. Legacy is
/// always last; its checks are asked in the order of the gated filter (user, UID, groups,
/// extras), which differs from the ungated one only in which refusal is reported first.
pub fn constrained_plans(req: &Request, requestor: &UserInfo) -> Vec<Plan> {
    let mut plans = Vec::with_capacity(2);
    let node = node_name(&req.user);
    let account = service_account(&req.user);
    for mode in Mode::ALL {
        let applies = match mode {
            Mode::AssociatedNode => {
                only_user(req)
                    && node.is_some()
                    && service_account(&requestor.name).is_some()
                    && requestor
                        .extra
                        .get(NODE_NAME_EXTRA)
                        .is_some_and(|v| v.len() == 1 && node == Some(v[0].as_str()))
            }
            Mode::ArbitraryNode => only_user(req) && node.is_some(),
            Mode::ServiceAccount => only_user(req) && account.is_some(),
            Mode::UserInfo => node.is_none() && account.is_none(),
            Mode::Legacy => true,
        };
        if applies {
            plans.push(plan(mode, req, requestor, node, account));
        }
    }
    plans
}

fn plan(
    mode: Mode,
    req: &Request,
    requestor: &UserInfo,
    node: Option<&str>,
    account: Option<(&str, &str)>,
) -> Plan {
    let constrained = mode != Mode::Legacy;
    let verb = if constrained {
        format!("impersonate:{}", mode.name())
    } else {
        "impersonate".to_owned()
    };
    // Constrained modes ask about users and groups in authentication.k8s.io, legacy in the
    // core group, as kube does.
    let (user_group, user_version) = if constrained {
        (AUTHENTICATION_GROUP, "v1")
    } else {
        ("", "")
    };
    let ask = |group, version, resource, subresource: &str, namespace: &str, name: &str| Ask {
        verb: verb.clone(),
        group,
        version,
        resource,
        subresource: subresource.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    let mut steps = Vec::new();
    let mut user = UserInfo {
        name: req.user.clone(),
        uid: req.uid.clone(),
        groups: req.groups.clone(),
        extra: req.extra.clone(),
    };
    let mut reviewer = requestor.clone();
    match (mode, node, account) {
        (Mode::AssociatedNode, Some(_), _) => {
            steps.push(Step::Ask(ask(
                user_group,
                user_version,
                "nodes",
                "",
                "",
                "*",
            )));
            user.groups = vec!["system:nodes".to_owned()];
            let keys: Vec<String> = requestor.extra.keys().cloned().collect();
            reviewer.extra = BTreeMap::from([(ASSOCIATED_NODE_KEYS.to_owned(), keys)]);
        }
        (Mode::ArbitraryNode, Some(name), _) => {
            steps.push(Step::Ask(ask(
                user_group,
                user_version,
                "nodes",
                "",
                "",
                name,
            )));
            user.groups = vec!["system:nodes".to_owned()];
        }
        (_, _, Some((namespace, name))) => {
            steps.push(Step::Ask(ask(
                user_group,
                user_version,
                "serviceaccounts",
                "",
                namespace,
                name,
            )));
            if req.groups.is_empty() {
                user.groups = vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                ];
            }
        }
        _ => steps.push(Step::Ask(ask(
            user_group,
            user_version,
            "users",
            "",
            "",
            &req.user,
        ))),
    }
    if !req.uid.is_empty() {
        steps.push(Step::Ask(ask(
            AUTHENTICATION_GROUP,
            user_version,
            "uids",
            "",
            "",
            &req.uid,
        )));
    }
    if !req.groups.is_empty() {
        let group = |name: &str| ask(user_group, user_version, "groups", "", "", name);
        if constrained && req.groups.iter().any(String::is_empty) {
            steps.push(Step::Refuse {
                ask: group(""),
                why: "impersonating the empty string group is not allowed".to_owned(),
            });
        } else if constrained && req.groups.iter().any(|g| g == "system:masters") {
            steps.push(Step::Refuse {
                ask: group("system:masters"),
                why: "impersonating the system:masters group is not allowed".to_owned(),
            });
        } else {
            let each: Vec<Ask> = req.groups.iter().map(|g| group(g)).collect();
            if constrained && req.groups.len() >= MANY {
                steps.push(Step::AnyOrEach {
                    any: group("*"),
                    each,
                });
            } else {
                steps.extend(each.into_iter().map(Step::Ask));
            }
        }
    }
    if !req.extra.is_empty() {
        let extra = |key: &str, value: &str| {
            ask(
                AUTHENTICATION_GROUP,
                user_version,
                "userextras",
                key,
                "",
                value,
            )
        };
        let refusal = constrained.then(|| extra_refusal(&req.extra)).flatten();
        let values = req.extra.values().map(Vec::len).sum::<usize>();
        let each: Vec<Ask> = req
            .extra
            .iter()
            .flat_map(|(k, vs)| vs.iter().map(move |v| (k, v)))
            .map(|(k, v)| extra(k, v))
            .collect();
        if let Some(why) = refusal {
            steps.push(Step::Refuse {
                ask: extra("", ""),
                why,
            });
        } else if constrained && (req.extra.len() >= MANY || values >= MANY) {
            steps.push(Step::AnyOrEach {
                any: extra("*", "*"),
                each,
            });
        } else {
            steps.extend(each.into_iter().map(Step::Ask));
        }
    }
    Plan {
        mode,
        requestor: reviewer,
        impersonate_on: constrained,
        steps,
        user: with_auth_group(user),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube's order of modes, which apply to whom, and whom each makes the request continue as.
    #[test]
    fn constrained_modes_apply_in_kubes_order() {
        let mut extra = BTreeMap::new();
        extra.insert(NODE_NAME_EXTRA.to_owned(), vec!["n1".to_owned()]);
        extra.insert(
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec!["p".to_owned()],
        );
        let agent = UserInfo {
            name: "system:serviceaccount:kube-system:agent".into(),
            extra,
            ..Default::default()
        };
        let node = Request {
            user: "system:node:n1".into(),
            ..Default::default()
        };
        let plans = constrained_plans(&node, &agent);
        let modes: Vec<Mode> = plans.iter().map(|p| p.mode).collect();
        assert_eq!(
            modes,
            [Mode::AssociatedNode, Mode::ArbitraryNode, Mode::Legacy]
        );
        assert_eq!(plans[0].user.groups, ["system:nodes", AUTHENTICATED]);
        assert_eq!(
            plans[0].requestor.extra[ASSOCIATED_NODE_KEYS],
            [NODE_NAME_EXTRA, "authentication.kubernetes.io/pod-name"]
                .map(str::to_owned)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        );
        let Step::Ask(ask) = &plans[0].steps[0] else {
            panic!()
        };
        assert_eq!(
            (ask.verb.as_str(), ask.resource, ask.name.as_str()),
            ("impersonate:associated-node", "nodes", "*")
        );
        // Another node: not associated; legacy sees a plain user.
        let other = Request {
            user: "system:node:n2".into(),
            ..Default::default()
        };
        let modes: Vec<Mode> = constrained_plans(&other, &agent)
            .iter()
            .map(|p| p.mode)
            .collect();
        assert_eq!(modes, [Mode::ArbitraryNode, Mode::Legacy]);

        // Groups: four or more ask about all first; system:masters is refused outright.
        let bob = Request {
            user: "bob".into(),
            groups: (0..4).map(|i| format!("g{i}")).collect(),
            ..Default::default()
        };
        let plans = constrained_plans(&bob, &agent);
        assert_eq!(plans[0].mode, Mode::UserInfo);
        assert!(
            matches!(&plans[0].steps[1], Step::AnyOrEach { any, each } if any.name == "*" && each.len() == 4)
        );
        assert!(
            matches!(&plans[1].steps[1], Step::Ask(a) if a.name == "g0" && a.verb == "impersonate")
        );
        let masters = Request {
            user: "bob".into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        };
        assert!(matches!(
            &constrained_plans(&masters, &agent)[0].steps[1],
            Step::Refuse { .. }
        ));
    }
}
