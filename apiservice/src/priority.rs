//! The priorities kube-apiserver gives the group-versions it registers itself.
//!
//! kube-apiserver auto-registers a *local* APIService for every built-in group-version it serves,
//! with priorities from a hard-coded table, and one per CRD group-version with a fixed default.
//! The gateway fronts such a server (or one that does not publish APIServices at all), so when it
//! has to place core groups in `/apis` it needs the same numbers to produce the same order.
//!
//! Source: `DefaultGenericAPIServicePriorities` in `pkg/controlplane/apiserver/aggregator.go`
//! merged with `apiVersionPriorities` in `cmd/kube-apiserver/app/aggregator.go` (the kube table
//! wins where both list a group-version).

/// `(groupPriorityMinimum, versionPriority)` of the legacy core group `v1` (APIService `v1.`).
pub const LEGACY_CORE_PRIORITY: (i32, i32) = (18000, 1);

/// `(groupPriorityMinimum, versionPriority)` kube-apiserver gives the APIService of every
/// CRD-served group-version; also our default for core groups missing from the built-in table.
pub const CRD_PRIORITY: (i32, i32) = (1000, 100);

/// The group priority aggregated discovery pins `apiregistration.k8s.io` to, one above the
/// maximum an APIService may declare (20000), so the aggregator's own group always comes first.
pub const APIREGISTRATION_GROUP_PRIORITY: i32 = 20001;

/// Name of the aggregator's own API group.
pub const APIREGISTRATION_GROUP: &str = "apiregistration.k8s.io";

/// `(group, version, groupPriorityMinimum, versionPriority)`, in the upstream table's order.
const BUILTIN: &[(&str, &str, i32, i32)] = &[
    ("", "v1", 18000, 1),
    ("apps", "v1", 17800, 15),
    ("events.k8s.io", "v1", 17750, 15),
    ("events.k8s.io", "v1beta1", 17750, 5),
    ("authentication.k8s.io", "v1", 17700, 15),
    ("authentication.k8s.io", "v1beta1", 17700, 9),
    ("authentication.k8s.io", "v1alpha1", 17700, 1),
    ("authorization.k8s.io", "v1", 17600, 15),
    ("autoscaling", "v2", 17500, 30),
    ("autoscaling", "v1", 17500, 15),
    ("autoscaling", "v2beta1", 17500, 9),
    ("autoscaling", "v2beta2", 17500, 1),
    ("batch", "v1", 17400, 15),
    ("batch", "v1beta1", 17400, 9),
    ("batch", "v2alpha1", 17400, 9),
    ("certificates.k8s.io", "v1", 17300, 15),
    ("certificates.k8s.io", "v1beta1", 17300, 9),
    ("certificates.k8s.io", "v1alpha1", 17300, 1),
    ("networking.k8s.io", "v1", 17200, 15),
    ("networking.k8s.io", "v1beta1", 17200, 9),
    ("policy", "v1", 17100, 15),
    ("policy", "v1beta1", 17100, 9),
    ("rbac.authorization.k8s.io", "v1", 17000, 15),
    ("storage.k8s.io", "v1", 16800, 15),
    ("storage.k8s.io", "v1beta1", 16800, 9),
    ("storage.k8s.io", "v1alpha1", 16800, 1),
    ("apiextensions.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1beta1", 16700, 12),
    ("admissionregistration.k8s.io", "v1alpha1", 16700, 9),
    ("scheduling.k8s.io", "v1", 16600, 15),
    ("coordination.k8s.io", "v1", 16500, 15),
    ("coordination.k8s.io", "v1beta1", 16500, 13),
    ("coordination.k8s.io", "v1alpha2", 16500, 12),
    ("node.k8s.io", "v1", 16300, 15),
    ("node.k8s.io", "v1beta1", 16300, 9),
    ("node.k8s.io", "v1alpha1", 16300, 1),
    ("discovery.k8s.io", "v1", 16200, 15),
    ("discovery.k8s.io", "v1beta1", 16200, 12),
    ("resource.k8s.io", "v1beta2", 16200, 15),
    ("resource.k8s.io", "v1beta1", 16200, 9),
    ("resource.k8s.io", "v1alpha3", 16200, 1),
    ("flowcontrol.apiserver.k8s.io", "v1", 16100, 21),
    ("flowcontrol.apiserver.k8s.io", "v1beta3", 16100, 18),
    ("flowcontrol.apiserver.k8s.io", "v1beta2", 16100, 15),
    ("flowcontrol.apiserver.k8s.io", "v1beta1", 16100, 12),
    ("flowcontrol.apiserver.k8s.io", "v1alpha1", 16100, 9),
    ("internal.apiserver.k8s.io", "v1alpha1", 16000, 9),
    ("storagemigration.k8s.io", "v1beta1", 15800, 9),
];

/// The `(groupPriorityMinimum, versionPriority)` kube-apiserver registers for a built-in
/// group-version, or `None` when the group-version is not in its table (CRDs, aggregated APIs,
/// or built-ins newer than this table). The legacy core group is `("", "v1")`.
///
/// A linear scan over ~50 entries: this runs when discovery is rebuilt, never per request.
pub fn builtin_priority(group: &str, version: &str) -> Option<(i32, i32)> {
    BUILTIN
        .iter()
        .find(|(g, v, _, _)| *g == group && *v == version)
        .map(|&(_, _, gp, vp)| (gp, vp))
}

/// The priority to use for a group-version served by the core server that has no APIService of
/// its own: the built-in table's entry, else [`CRD_PRIORITY`] (what kube-apiserver gives CRDs).
pub fn core_priority(group: &str, version: &str) -> (i32, i32) {
    builtin_priority(group, version).unwrap_or(CRD_PRIORITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_core_and_well_known_groups() {
        assert_eq!(builtin_priority("", "v1"), Some(LEGACY_CORE_PRIORITY));
        assert_eq!(builtin_priority("apps", "v1"), Some((17800, 15)));
        assert_eq!(builtin_priority("autoscaling", "v2"), Some((17500, 30)));
        assert_eq!(builtin_priority("autoscaling", "v1"), Some((17500, 15)));
        assert_eq!(
            builtin_priority("flowcontrol.apiserver.k8s.io", "v1"),
            Some((16100, 21))
        );
        // The kube table's resource.k8s.io entries override the generic 15900 one.
        assert_eq!(
            builtin_priority("resource.k8s.io", "v1alpha3"),
            Some((16200, 1))
        );
        assert_eq!(
            builtin_priority("storagemigration.k8s.io", "v1beta1"),
            Some((15800, 9))
        );
    }

    #[test]
    fn unknown_group_versions_are_not_built_in() {
        assert_eq!(builtin_priority("apps", "v1beta1"), None);
        assert_eq!(builtin_priority("", "v2"), None);
        assert_eq!(builtin_priority("metrics.k8s.io", "v1beta1"), None);
        assert_eq!(builtin_priority("stable.example.com", "v1"), None);
        assert_eq!(builtin_priority(APIREGISTRATION_GROUP, "v1"), None);
    }

    #[test]
    fn core_priority_falls_back_to_the_crd_default() {
        assert_eq!(core_priority("stable.example.com", "v1"), (1000, 100));
        assert_eq!(core_priority("", "v1"), (18000, 1));
        assert_eq!(core_priority("batch", "v1"), (17400, 15));
    }

    #[test]
    fn table_has_no_duplicates_and_valid_values() {
        for (i, (g, v, gp, vp)) in BUILTIN.iter().enumerate() {
            assert!(*gp > 0 && *gp <= 20000, "{g}/{v}");
            assert!(*vp > 0 && *vp <= 1000, "{g}/{v}");
            assert!(
                !BUILTIN[..i].iter().any(|(g2, v2, _, _)| g2 == g && v2 == v),
                "duplicate {g}/{v}"
            );
            // Every version of a group shares one group priority.
            for (g2, _, gp2, _) in BUILTIN {
                if g2 == g {
                    assert_eq!(gp, gp2, "group {g}");
                }
            }
        }
    }
}
