//! Kubernetes-aware ordering of API version strings (`v2` before `v1` before `v1beta1`).
//!
//! Discovery lists versions in the order clients should prefer them, and when two APIServices of
//! a group share a `versionPriority` kube-aggregator breaks the tie with apimachinery's
//! `CompareKubeAwareVersionStrings`. This module reproduces that order so our `/apis` output
//! and preferred versions match what kube-apiserver would publish.

use std::cmp::Ordering;

/// Stability level of a kube-like version; the derive order is the preference order
/// (GA is preferred over beta, beta over alpha).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stability {
    Alpha,
    Beta,
    Ga,
}

/// A parsed kube-like version: `v<major>` or `v<major>(alpha|beta)<minor>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KubeVersion {
    major: i64,
    stability: Stability,
    /// Always 0 for GA versions.
    minor: i64,
}

impl KubeVersion {
    /// Parses `^v(\d+)(?:(alpha|beta)(\d+))?$` with ASCII digits only, as apimachinery does.
    /// Numbers that do not fit an `i64` make the string non-kube-like, mirroring Go's
    /// `strconv.Atoi` failing on overflow.
    fn parse(v: &str) -> Option<Self> {
        let rest = v.strip_prefix('v')?;
        let major_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        if major_len == 0 {
            return None;
        }
        let major: i64 = rest[..major_len].parse().ok()?;
        let rest = &rest[major_len..];
        if rest.is_empty() {
            return Some(Self {
                major,
                stability: Stability::Ga,
                minor: 0,
            });
        }
        let (stability, digits) = if let Some(d) = rest.strip_prefix("alpha") {
            (Stability::Alpha, d)
        } else if let Some(d) = rest.strip_prefix("beta") {
            (Stability::Beta, d)
        } else {
            return None;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let minor: i64 = digits.parse().ok()?;
        Some(Self {
            major,
            stability,
            minor,
        })
    }
}

/// Compares two API version strings so that sorting ascending puts the *preferred* version first:
/// `Ordering::Less` means `a` is preferred over `b`.
///
/// The order is kube-aggregator's: kube-like versions (`v1`, `v2beta1`, `v3alpha2`) come before
/// anything else; among them GA before beta before alpha, then higher major first, then higher
/// minor first. Strings that are not kube-like sort lexicographically ascending after them.
/// Sorting `v10, v2, v1, v11beta2, v10beta3, v3beta1, v12alpha1, v11alpha2, foo1, foo10` leaves
/// it in exactly that order.
///
/// Unlike apimachinery (which reports `v01` and `v1` as equal and leaves them in whatever order
/// Go's unstable sort produces), distinct strings never compare equal here: such ties fall back to
/// byte order, so the result of a sort never depends on the input order.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    match (KubeVersion::parse(a), KubeVersion::parse(b)) {
        (None, None) => a.cmp(b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (Some(va), Some(vb)) => vb
            .stability
            .cmp(&va.stability)
            .then(vb.major.cmp(&va.major))
            .then(vb.minor.cmp(&va.minor))
            .then_with(|| a.cmp(b)),
    }
}

/// Whether `v` has the kube-like shape `v<N>`, `v<N>alpha<M>` or `v<N>beta<M>`.
pub fn is_kube_like(v: &str) -> bool {
    KubeVersion::parse(v).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANONICAL: [&str; 10] = [
        "v10",
        "v2",
        "v1",
        "v11beta2",
        "v10beta3",
        "v3beta1",
        "v12alpha1",
        "v11alpha2",
        "foo1",
        "foo10",
    ];

    fn sorted(mut v: Vec<&str>) -> Vec<&str> {
        v.sort_by(|a, b| compare_versions(a, b));
        v
    }

    #[test]
    fn canonical_vector_is_already_sorted() {
        assert_eq!(sorted(CANONICAL.to_vec()), CANONICAL.to_vec());
    }

    #[test]
    fn canonical_vector_reversed_and_rotated_sorts_back() {
        let mut rev = CANONICAL.to_vec();
        rev.reverse();
        assert_eq!(sorted(rev), CANONICAL.to_vec());
        for k in 1..CANONICAL.len() {
            let mut rot = CANONICAL.to_vec();
            rot.rotate_left(k);
            assert_eq!(sorted(rot), CANONICAL.to_vec(), "rotation by {k}");
        }
    }

    #[test]
    fn canonical_vector_deterministic_shuffles_sort_back() {
        // A small linear congruential generator: deterministic shuffles without a rand crate.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..200 {
            let mut v = CANONICAL.to_vec();
            for i in (1..v.len()).rev() {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let j = (state >> 33) as usize % (i + 1);
                v.swap(i, j);
            }
            assert_eq!(sorted(v), CANONICAL.to_vec(), "shuffle round {round}");
        }
    }

    /// Heap's algorithm, so every permutation of a small set is checked.
    fn for_each_permutation<'a>(
        items: &mut Vec<&'a str>,
        k: usize,
        f: &mut impl FnMut(&[&'a str]),
    ) {
        if k <= 1 {
            f(items);
            return;
        }
        for i in 0..k {
            for_each_permutation(items, k - 1, f);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            items.swap(j, k - 1);
        }
    }

    #[test]
    fn every_permutation_sorts_to_the_same_result() {
        // Mixes GA, beta, alpha, non-kube strings and an equal-rank pair (v01 / v1).
        let set = vec!["v1", "v01", "v2beta1", "v1alpha1", "foo", "v1beta2", "bar2"];
        let expected = vec!["v01", "v1", "v2beta1", "v1beta2", "v1alpha1", "bar2", "foo"];
        let mut count = 0;
        let mut items = set.clone();
        let n = items.len();
        for_each_permutation(&mut items, n, &mut |p| {
            count += 1;
            assert_eq!(sorted(p.to_vec()), expected, "permutation {p:?}");
        });
        assert_eq!(count, 5040);
    }

    #[test]
    fn order_is_antisymmetric_and_transitive_on_a_sample() {
        let sample = [
            "v1",
            "v2",
            "v10",
            "v1beta1",
            "v1beta10",
            "v2alpha1",
            "v1alpha",
            "vbeta1",
            "v",
            "V1",
            "v1gamma1",
            "x",
            "",
            "v99999999999999999999",
        ];
        for a in sample {
            assert_eq!(compare_versions(a, a), Ordering::Equal);
            for b in sample {
                assert_eq!(
                    compare_versions(a, b),
                    compare_versions(b, a).reverse(),
                    "{a} vs {b}"
                );
                for c in sample {
                    if compare_versions(a, b) == Ordering::Less
                        && compare_versions(b, c) == Ordering::Less
                    {
                        assert_eq!(compare_versions(a, c), Ordering::Less, "{a} < {b} < {c}");
                    }
                }
            }
        }
    }

    #[test]
    fn pairwise_rules() {
        use Ordering::*;
        // GA beats beta beats alpha regardless of the numbers.
        assert_eq!(compare_versions("v1", "v9beta9"), Less);
        assert_eq!(compare_versions("v1beta1", "v9alpha9"), Less);
        // Higher major first, then higher minor first.
        assert_eq!(compare_versions("v2", "v1"), Less);
        assert_eq!(compare_versions("v2beta1", "v1beta2"), Less);
        assert_eq!(compare_versions("v1beta2", "v1beta1"), Less);
        // Numbers compare numerically, not as text.
        assert_eq!(compare_versions("v10", "v9"), Less);
        // Kube-like before anything else; the rest lexicographically ascending.
        assert_eq!(compare_versions("v1alpha1", "a"), Less);
        assert_eq!(compare_versions("foo1", "foo10"), Less);
        assert_eq!(compare_versions("foo10", "foo2"), Less);
    }

    #[test]
    fn kube_like_shapes() {
        for ok in ["v1", "v0", "v12", "v1beta1", "v3alpha10", "v007"] {
            assert!(is_kube_like(ok), "{ok}");
        }
        for bad in [
            "",
            "v",
            "1",
            "V1",
            "v1beta",
            "v1alpha",
            "vbeta1",
            "v1gamma1",
            "v1beta1x",
            "v1 ",
            "v１",
            "v-1",
            "v1beta-1",
            "v99999999999999999999",
        ] {
            assert!(!is_kube_like(bad), "{bad}");
        }
    }
}
