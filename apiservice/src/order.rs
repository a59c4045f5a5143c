//! kube-aggregator's discovery order: which group comes first in `/apis`, and which version of a
//! group is preferred.
//!
//! Clients take the first version of a group as its preferred version and resolve short names
//! (`kubectl get pods`) by walking groups in order, so the order is behaviour, not cosmetics.
//! The rules (kube-aggregator `apiregistration/v1/helper` and aggregated discovery):
//! - versions: higher `versionPriority` first; ties by [`compare_versions`];
//! - groups: higher group priority first, where a group's priority is the highest
//!   `groupPriorityMinimum` of its APIServices; ties by name ascending.
//!
//! Pinning `apiregistration.k8s.io` (the aggregator's own group) to the front is not done here:
//! it has no APIService, so the discovery layer prepends it (see
//! [`APIREGISTRATION_GROUP_PRIORITY`](crate::priority::APIREGISTRATION_GROUP_PRIORITY)).

use std::collections::HashMap;

use crate::model::RegisteredAPIService;
use crate::version::compare_versions;

/// Sorts versions of one group, preferred first: `versionPriority` descending, ties broken by
/// the Kubernetes-aware version order. `key` returns `(versionPriority, version)`.
pub fn sort_versions<T>(items: &mut [T], key: impl Fn(&T) -> (i32, &str)) {
    items.sort_by(|a, b| {
        let (pa, va) = key(a);
        let (pb, vb) = key(b);
        pb.cmp(&pa).then_with(|| compare_versions(va, vb))
    });
}

/// Sorts groups, first listed first: priority descending, ties by name ascending (byte order).
/// `key` returns `(priority, name)`, where priority is the group's highest
/// `groupPriorityMinimum`. Aggregated discovery breaks ties by group name; to reproduce legacy
/// `/apis` exactly pass the name of the group's top-ranked APIService instead (see
/// [`ordered_groups_legacy`]).
pub fn sort_groups<T>(items: &mut [T], key: impl Fn(&T) -> (i32, &str)) {
    items.sort_by(|a, b| {
        let (pa, na) = key(a);
        let (pb, nb) = key(b);
        pb.cmp(&pa).then_with(|| na.cmp(nb))
    });
}

/// One group of `/apis`, its versions in preference order (the first is the preferred version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry<'a> {
    pub group: &'a str,
    /// The highest `groupPriorityMinimum` among the group's APIServices.
    pub priority: i32,
    pub versions: Vec<&'a RegisteredAPIService>,
}

impl<'a> GroupEntry<'a> {
    /// The preferred version: the first after sorting.
    pub fn preferred(&self) -> &'a RegisteredAPIService {
        self.versions[0]
    }
}

/// Groups APIServices and orders them as aggregated discovery (`/apis` with
/// `apidiscovery.k8s.io/v2`) does: groups by highest `groupPriorityMinimum` descending, ties by
/// group name; versions by [`sort_versions`].
///
/// The legacy core APIService (`v1.`, empty group) is left out: it belongs to `/api`. The
/// aggregator's own `apiregistration.k8s.io` group is not added: the discovery layer puts it
/// first.
pub fn ordered_groups(services: &[RegisteredAPIService]) -> Vec<GroupEntry<'_>> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut groups: Vec<GroupEntry<'_>> = Vec::new();
    for svc in services.iter().filter(|s| !s.is_legacy_core()) {
        let i = *index.entry(svc.group.as_str()).or_insert_with(|| {
            groups.push(GroupEntry {
                group: &svc.group,
                priority: svc.group_priority_minimum,
                versions: Vec::new(),
            });
            groups.len() - 1
        });
        let entry = &mut groups[i];
        entry.priority = entry.priority.max(svc.group_priority_minimum);
        entry.versions.push(svc);
    }
    for g in &mut groups {
        sort_versions(&mut g.versions, |s| (s.version_priority, &s.version));
    }
    sort_groups(&mut groups, |g| (g.priority, g.group));
    groups
}

/// Like [`ordered_groups`], but with the tie-break of kube-aggregator's legacy `/apis`
/// (`APIGroupList`, `SortedByGroupAndVersion`): APIServices are sorted by
/// `groupPriorityMinimum` descending then APIService *name* (`<version>.<group>`) ascending, and
/// each group takes the position of its first APIService. Groups with equal priority can thus
/// come out in a different order than in aggregated discovery (`v1.zeta` sorts before
/// `v2.alpha`).
pub fn ordered_groups_legacy(services: &[RegisteredAPIService]) -> Vec<GroupEntry<'_>> {
    let mut by_priority: Vec<&RegisteredAPIService> =
        services.iter().filter(|s| !s.is_legacy_core()).collect();
    sort_groups(&mut by_priority, |s| (s.group_priority_minimum, &s.name));

    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut groups: Vec<GroupEntry<'_>> = Vec::new();
    for svc in by_priority {
        // The first APIService seen for a group has its highest priority: sorted above.
        let i = *index.entry(svc.group.as_str()).or_insert_with(|| {
            groups.push(GroupEntry {
                group: &svc.group,
                priority: svc.group_priority_minimum,
                versions: Vec::new(),
            });
            groups.len() - 1
        });
        groups[i].versions.push(svc);
    }
    for g in &mut groups {
        sort_versions(&mut g.versions, |s| (s.version_priority, &s.version));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Backend;

    fn svc(group: &str, version: &str, gp: i32, vp: i32) -> RegisteredAPIService {
        RegisteredAPIService {
            name: format!("{version}.{group}"),
            group: group.into(),
            version: version.into(),
            group_priority_minimum: gp,
            version_priority: vp,
            backend: Backend::Local,
        }
    }

    fn names(groups: &[GroupEntry<'_>]) -> Vec<String> {
        groups
            .iter()
            .map(|g| {
                let vs: Vec<&str> = g.versions.iter().map(|s| s.version.as_str()).collect();
                format!("{}[{}]", g.group, vs.join(","))
            })
            .collect()
    }

    #[test]
    fn versions_priority_beats_version_order() {
        let mut v = vec![(15, "v1"), (20, "v1beta1"), (15, "v2"), (1, "v3")];
        sort_versions(&mut v, |&(p, s)| (p, s));
        assert_eq!(v, [(20, "v1beta1"), (15, "v2"), (15, "v1"), (1, "v3")]);
    }

    #[test]
    fn versions_tie_uses_kube_aware_order() {
        let mut v: Vec<(i32, &str)> = [
            "foo10",
            "v1",
            "v11alpha2",
            "v10beta3",
            "v2",
            "foo1",
            "v12alpha1",
            "v3beta1",
            "v10",
            "v11beta2",
        ]
        .iter()
        .map(|s| (100, *s))
        .collect();
        sort_versions(&mut v, |&(p, s)| (p, s));
        let got: Vec<&str> = v.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            got,
            [
                "v10",
                "v2",
                "v1",
                "v11beta2",
                "v10beta3",
                "v3beta1",
                "v12alpha1",
                "v11alpha2",
                "foo1",
                "foo10"
            ]
        );
    }

    #[test]
    fn groups_priority_desc_then_name_asc() {
        let mut g = vec![(100, "b.io"), (200, "z.io"), (100, "a.io"), (100, "A.io")];
        sort_groups(&mut g, |&(p, n)| (p, n));
        assert_eq!(
            g,
            [(200, "z.io"), (100, "A.io"), (100, "a.io"), (100, "b.io")]
        );
    }

    #[test]
    fn ordered_groups_uses_max_group_priority_and_skips_core() {
        let services = vec![
            svc("", "v1", 18000, 1),
            svc("a.io", "v1", 100, 15),
            svc("a.io", "v2", 500, 15),
            svc("b.io", "v1", 300, 15),
            svc("c.io", "v1beta1", 300, 9),
            svc("c.io", "v1", 300, 15),
        ];
        let groups = ordered_groups(&services);
        assert_eq!(
            names(&groups),
            ["a.io[v2,v1]", "b.io[v1]", "c.io[v1,v1beta1]"]
        );
        assert_eq!(groups[0].priority, 500);
        assert_eq!(groups[0].preferred().name, "v2.a.io");
        assert_eq!(groups[2].preferred().version, "v1");
    }

    #[test]
    fn ordered_groups_is_independent_of_input_order() {
        let mut services = vec![
            svc("metrics.k8s.io", "v1beta1", 100, 100),
            svc("wardle.example.com", "v1alpha1", 1000, 15),
            svc("wardle.example.com", "v1beta1", 1000, 15),
            svc("apps", "v1", 17800, 15),
            svc("custom.metrics.k8s.io", "v1beta2", 100, 200),
            svc("custom.metrics.k8s.io", "v1beta1", 100, 100),
        ];
        let expected = [
            "apps[v1]",
            "wardle.example.com[v1beta1,v1alpha1]",
            "custom.metrics.k8s.io[v1beta2,v1beta1]",
            "metrics.k8s.io[v1beta1]",
        ];
        for _ in 0..services.len() {
            services.rotate_left(1);
            assert_eq!(names(&ordered_groups(&services)), expected);
            services.reverse();
            assert_eq!(names(&ordered_groups(&services)), expected);
        }
    }

    #[test]
    fn legacy_ties_follow_api_service_name_not_group_name() {
        let services = vec![
            svc("alpha.io", "v2", 1000, 100),
            svc("zeta.io", "v1", 1000, 100),
        ];
        // Aggregated discovery: group names alpha.io < zeta.io.
        assert_eq!(
            names(&ordered_groups(&services)),
            ["alpha.io[v2]", "zeta.io[v1]"]
        );
        // Legacy /apis: APIService names v1.zeta.io < v2.alpha.io.
        assert_eq!(
            names(&ordered_groups_legacy(&services)),
            ["zeta.io[v1]", "alpha.io[v2]"]
        );
    }

    #[test]
    fn legacy_group_takes_position_of_its_highest_priority_service() {
        let services = vec![
            svc("", "v1", 18000, 1),
            svc("a.io", "v1", 100, 15),
            svc("b.io", "v1", 300, 15),
            svc("a.io", "v2", 500, 9),
        ];
        let groups = ordered_groups_legacy(&services);
        assert_eq!(names(&groups), ["a.io[v1,v2]", "b.io[v1]"]);
        assert_eq!(groups[0].priority, 500);
    }

    #[test]
    fn empty_input() {
        assert!(ordered_groups(&[]).is_empty());
        assert!(ordered_groups_legacy(&[svc("", "v1", 18000, 1)]).is_empty());
    }
}
