//! Dividing the server's seats among priority levels that lend and borrow (k8s.io/apiserver
//! `pkg/util/flowcontrol/conc_alloc.go`).
//!
//! Each level has a target (its smoothed seat demand) and bounds (what it may lend down to,
//! what it may borrow up to). The answer gives every level the same fraction `fair` of its
//! target, clipped to its bounds, with `fair` chosen so that the allocations add up to the
//! seats there are. The sum is monotonic in `fair`, so walking the bounds in increasing order of
//! `bound / target` finds the segment where it reaches the total, and `fair` within it.

/// One level's problem: `lower <= allocation <= upper`, ideally `fair * target`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Item {
    pub target: f64,
    pub lower: f64,
    pub upper: f64,
}

/// Targets below this count as this, so that no level divides by zero.
const MIN_TARGET: f64 = 0.001;
const EPSILON: f64 = 1e-7;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    #[error("level {0}: bounds or target out of order (0 <= lower <= target, lower <= upper)")]
    Malformed(usize),
    #[error("lower bounds sum to {0}, more than the {1} seats to allocate")]
    TooLow(f64, u32),
    #[error("upper bounds sum to {0}, fewer than the {1} seats to allocate")]
    TooHigh(f64, u32),
}

/// The allocation of `total` seats among `items`, and the fair fraction it gives.
pub fn allocate(total: u32, items: &[Item]) -> Result<(Vec<f64>, f64), AllocError> {
    let total_f = f64::from(total);
    let (mut low_sum, mut high_sum, mut target_sum) = (0.0, 0.0, 0.0);
    let (mut min_rel_lower, mut max_rel_lower) = (f64::MAX, f64::MIN);
    let (mut min_rel_upper, mut max_rel_upper) = (f64::MAX, f64::MIN);
    // (relative lower, relative upper, target) per item.
    let mut relative = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if item.lower < 0.0 || item.target < item.lower || item.upper < item.lower {
            return Err(AllocError::Malformed(i));
        }
        let target = item.target.max(MIN_TARGET);
        low_sum += item.lower;
        high_sum += item.upper;
        target_sum += target;
        let (rl, ru) = (item.lower / target, item.upper / target);
        min_rel_lower = min_rel_lower.min(rl);
        max_rel_lower = max_rel_lower.max(rl);
        min_rel_upper = min_rel_upper.min(ru);
        max_rel_upper = max_rel_upper.max(ru);
        relative.push((rl, ru, target));
    }
    if low_sum - total_f > EPSILON {
        return Err(AllocError::TooLow(low_sum, total));
    }
    if total_f - high_sum > EPSILON {
        return Err(AllocError::TooHigh(high_sum, total));
    }
    if total == 0 {
        return Ok((vec![0.0; items.len()], 0.0));
    }
    if low_sum - total_f > -EPSILON {
        return Ok((items.iter().map(|i| i.lower).collect(), min_rel_lower));
    }
    if total_f - high_sum > -EPSILON {
        return Ok((items.iter().map(|i| i.upper).collect(), max_rel_upper));
    }
    let mut fair = total_f / target_sum;
    if !(max_rel_lower <= fair && fair <= min_rel_upper) {
        fair = constrained_fair(total_f, low_sum, min_rel_lower, &relative);
    }
    let allocs = items
        .iter()
        .zip(&relative)
        .map(|(item, (_, _, target))| (fair * target).clamp(item.lower, item.upper))
        .collect();
    Ok((allocs, fair))
}

/// `fair` when some bounds bind: raise it from the lowest relative bound, one bound at a time.
/// Between two consecutive bounds, exactly the levels whose lower bound is passed and whose
/// upper bound is not yet reached grow with it, at the rate of their targets summed.
fn constrained_fair(total: f64, low_sum: f64, start: f64, relative: &[(f64, f64, f64)]) -> f64 {
    // Every bound, as (relative value, change of the growing targets' sum when passed).
    let mut bounds: Vec<(f64, f64)> = relative
        .iter()
        .flat_map(|&(rl, ru, t)| [(rl, t), (ru, -t)])
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut fair = start;
    let mut sum = low_sum;
    let mut growing = 0.0;
    let mut next = 0;
    while sum < total && next < bounds.len() {
        // Pass every bound at the current value of `fair`.
        while next < bounds.len() && bounds[next].0 <= fair {
            growing += bounds[next].1;
            next += 1;
        }
        let Some(&(bound, _)) = bounds.get(next) else {
            break;
        };
        if growing > 0.0 {
            let reach = fair + (total - sum) / growing;
            if reach <= bound {
                return reach;
            }
            sum += (bound - fair) * growing;
        }
        fair = bound;
    }
    fair
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(target: f64, lower: f64, upper: f64) -> Item {
        Item {
            target,
            lower,
            upper,
        }
    }

    fn check(total: u32, items: &[Item]) -> (Vec<f64>, f64) {
        let (allocs, fair) = allocate(total, items).unwrap();
        let sum: f64 = allocs.iter().sum();
        assert!(
            (sum - f64::from(total)).abs() < 1e-6,
            "{allocs:?} sum {sum}"
        );
        for (a, i) in allocs.iter().zip(items) {
            assert!(
                i.lower - 1e-9 <= *a && *a <= i.upper + 1e-9,
                "{a} outside {i:?}"
            );
            let want = (fair * i.target.max(MIN_TARGET)).clamp(i.lower, i.upper);
            assert!((a - want).abs() < 1e-6, "{a} is not the fair share {want}");
        }
        (allocs, fair)
    }

    #[test]
    fn unconstrained_shares_follow_the_targets() {
        let (allocs, fair) = check(100, &[item(10.0, 0.0, 100.0), item(30.0, 0.0, 100.0)]);
        assert_eq!(fair, 2.5);
        assert_eq!(allocs, vec![25.0, 75.0]);
    }

    #[test]
    fn a_level_pinned_at_a_bound_leaves_the_rest_to_the_others() {
        // The first level wants much but may borrow only up to 30.
        let (allocs, _) = check(100, &[item(90.0, 10.0, 30.0), item(10.0, 5.0, 100.0)]);
        assert!((allocs[0] - 30.0).abs() < 1e-9);
        assert!((allocs[1] - 70.0).abs() < 1e-9);
        // An idle level keeps what it may not lend.
        let (allocs, _) = check(50, &[item(8.0, 8.0, 50.0), item(100.0, 2.0, 60.0)]);
        assert!((allocs[0] - 8.0).abs() < 1e-9, "{allocs:?}");
        assert!((allocs[1] - 42.0).abs() < 1e-9, "{allocs:?}");
    }

    #[test]
    fn random_problems_are_solved_within_their_bounds() {
        for _ in 0..2000 {
            let n = 1 + fastrand::usize(..8);
            let items: Vec<Item> = (0..n)
                .map(|_| {
                    let lower = fastrand::u32(..20) as f64;
                    let target = lower + fastrand::u32(..50) as f64;
                    let upper = lower + fastrand::u32(..80) as f64;
                    item(target, lower, upper)
                })
                .collect();
            let lo: f64 = items.iter().map(|i| i.lower).sum();
            let hi: f64 = items.iter().map(|i| i.upper).sum();
            let total = lo as u32 + fastrand::u32(..=(hi - lo) as u32);
            check(total, &items);
        }
    }

    #[test]
    fn impossible_problems_are_errors() {
        assert!(matches!(
            allocate(5, &[item(10.0, 10.0, 20.0)]),
            Err(AllocError::TooLow(..))
        ));
        assert!(matches!(
            allocate(50, &[item(10.0, 0.0, 20.0)]),
            Err(AllocError::TooHigh(..))
        ));
        assert!(matches!(
            allocate(5, &[item(1.0, 2.0, 20.0)]),
            Err(AllocError::Malformed(0))
        ));
    }
}
