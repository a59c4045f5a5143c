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
/// `groupPriorityMinimum`. (Legacy kube-aggregator breaks ties by APIService name; the gateway
/// uses the group name for both documents so they agree.)
pub fn sort_groups<T>(items: &mut [T], key: impl Fn(&T) -> (i32, &str)) {
    items.sort_by(|a, b| {
        let (pa, na) = key(a);
        let (pb, nb) = key(b);
        pb.cmp(&pa).then_with(|| na.cmp(nb))
    });
}

/// Places `placed` (already sorted, first listed first) around `anchored` (kept in the order
/// given), all of which count as `anchored_priority`: placed items with a higher priority come
/// before the anchored ones, the others after them. This is how groups (and versions) an
/// APIService declares are put among the core's, whose order the core decides.
pub fn around_anchored<T>(
    anchored: Vec<T>,
    placed: Vec<T>,
    anchored_priority: i32,
    priority: impl Fn(&T) -> i32,
) -> Vec<T> {
    let mut out = Vec::with_capacity(anchored.len() + placed.len());
    let mut placed = placed.into_iter().peekable();
    while let Some(item) = placed.next_if(|p| priority(p) > anchored_priority) {
        out.push(item);
    }
    out.extend(anchored);
    out.extend(placed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_items_go_around_the_anchored_ones_by_priority() {
        let anchored = vec![(0, "z-core"), (0, "a-core")];
        let placed = vec![(2000, "high"), (1000, "tie"), (10, "low")];
        let out = around_anchored(anchored, placed, 1000, |(p, _)| *p);
        let names: Vec<&str> = out.iter().map(|(_, n)| *n).collect();
        // The anchored keep their order (not sorted by name); a tie goes after them.
        assert_eq!(names, ["high", "z-core", "a-core", "tie", "low"]);
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
}
