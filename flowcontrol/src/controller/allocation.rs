//! Dividing the server's seats among the levels (kube's `finishQueueSetReconfigsLocked`) and,
//! every borrowing period, lending the seats idle levels do not use to busy ones (kube's
//! `updateBorrowingLocked`, with `conc_alloc.rs` doing the arithmetic).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Controller, LevelState, State};
use crate::conc_alloc::{self, Item};
use crate::metrics::Adjustment;
use crate::model::LimitResponse;

/// Smoothing of seat demand between periods: a half-life of about 5 minutes.
const DEMAND_SMOOTHING: f64 = 0.977;
/// The share of a level's nominal seats one request may take (`priorityLevelMaxSeatsPercent`).
const LEVEL_MAX_SEATS_FRACTION: f64 = 0.15;

/// The smoothed seat demand of a level.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Demand {
    average: f64,
    stdev: f64,
    high_watermark: u32,
    smoothed: f64,
}

impl Controller {
    /// Divides the server's limit among the levels by their shares (kube's
    /// `finishQueueSetReconfigsLocked`).
    pub(super) fn divide(&self, levels: &mut BTreeMap<Arc<str>, LevelState>) {
        let share_sum: f64 = levels
            .values()
            .map(|l| f64::from(l.spec.nominal_shares))
            .sum();
        let server = f64::from(self.server_limit);
        for l in levels.values_mut() {
            let nominal = if share_sum > 0.0 {
                (server * f64::from(l.spec.nominal_shares) / share_sum).ceil() as u32
            } else {
                0
            };
            let lendable =
                (f64::from(nominal) * f64::from(l.spec.lendable_percent) / 100.0).round() as u32;
            let borrowing = match l.spec.borrowing_limit_percent {
                Some(p) => (f64::from(nominal) * f64::from(p) / 100.0).round() as u32,
                None => self.server_limit,
            };
            l.nominal = nominal;
            l.min = nominal - lendable;
            l.max = nominal.saturating_add(borrowing);
            l.max_seats = match l.spec.limit_response {
                LimitResponse::Queue(q) => {
                    let by_share = (f64::from(nominal) * LEVEL_MAX_SEATS_FRACTION).ceil();
                    let by_hand = f64::from(nominal / q.hand_size);
                    by_share.min(by_hand).max(1.0) as u32
                }
                _ => 0,
            };
            if l.fresh {
                l.fresh = false;
                l.current = nominal - lendable / 2;
            }
            l.level.metrics.limits(l.nominal, l.min, l.max);
            l.level.lock().set_limit_response(l.spec.limit_response);
        }
    }

    /// Lends and borrows: each level's limit for the next period from its seat demand in the
    /// last one (kube's `updateBorrowingLocked`).
    pub(super) fn adjust(&self, state: &mut State, now: Instant) {
        let demands = Demands::take(state, now);
        let allocated = demands.allocate(state);
        self.metrics.seat_fair_frac.set(state.fair_fraction);
        for (name, l) in &mut state.levels {
            let current = match allocated.get(name) {
                Some(a) => *a,
                None => demands.floors[name],
            };
            let target = demands
                .items
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, i)| i.target);
            l.current = current;
            l.level.metrics.adjusted(&Adjustment {
                high_watermark: f64::from(l.demand.high_watermark),
                average: l.demand.average,
                stdev: l.demand.stdev,
                smoothed: l.demand.smoothed,
                target,
                current_limit: current,
            });
            l.level.lock().set_concurrency_limit(current, now);
        }
    }
}

/// The last period's seat demands, as the allocation problem kube's `updateBorrowingLocked`
/// solves: what each level must keep, and what the borrowing levels aim for.
struct Demands {
    /// Seats left for the levels that borrow, once the exempt ones have their floors.
    remaining: i64,
    /// The borrowing levels' minimums, summed.
    min_sum: i64,
    /// The borrowing levels' floors (minimum, or what they used), summed.
    min_current_sum: i64,
    /// The borrowing levels, with their bounds and targets.
    items: Vec<(Arc<str>, Item)>,
    /// Every level's floor.
    floors: BTreeMap<Arc<str>, u32>,
}

impl Demands {
    /// Takes each level's demand for the period just ended and smooths it.
    fn take(state: &mut State, now: Instant) -> Self {
        let mut demands = Demands {
            remaining: i64::from(state.nominal_sum),
            min_sum: 0,
            min_current_sum: 0,
            items: Vec::new(),
            floors: BTreeMap::new(),
        };
        for (name, l) in &mut state.levels {
            let r = l.level.lock().take_demand(now);
            l.demand.high_watermark = r.max.round() as u32;
            if r.duration > 0.0 {
                l.demand.average = r.average;
                l.demand.stdev = r.deviation;
                let envelope = r.average + r.deviation;
                l.demand.smoothed = envelope.max(
                    DEMAND_SMOOTHING * l.demand.smoothed + (1.0 - DEMAND_SMOOTHING) * envelope,
                );
            }
            if l.spec.is_exempt() {
                let floor = l.min.max(l.demand.high_watermark);
                demands.floors.insert(name.clone(), floor);
                demands.remaining -= i64::from(floor);
            } else {
                // At least what it used (up to its nominal limit) or what it may not lend.
                let floor = l.min.max(l.nominal.min(l.demand.high_watermark));
                demands.floors.insert(name.clone(), floor);
                demands.items.push((
                    name.clone(),
                    Item {
                        lower: f64::from(floor),
                        upper: f64::from(l.max),
                        target: f64::from(floor).max(l.demand.smoothed),
                    },
                ));
                demands.min_sum += i64::from(l.min);
                demands.min_current_sum += i64::from(floor);
            }
        }
        demands
    }

    /// The borrowing levels' limits for the next period, in kube's three cases: not even the
    /// minimums fit (each gets its minimum), the floors do not fit (each gets its minimum plus
    /// a share of the rest), or they do (the fair allocation). Sets `state.fair_fraction`.
    fn allocate(&self, state: &mut State) -> BTreeMap<Arc<str>, u32> {
        state.fair_fraction = 0.0;
        if self.remaining <= self.min_sum {
            return self
                .items
                .iter()
                .map(|(name, _)| (name.clone(), state.levels[name].min))
                .collect();
        }
        if self.remaining <= self.min_current_sum {
            let share = (self.remaining - self.min_sum) as f64
                / (self.min_current_sum - self.min_sum) as f64;
            return self
                .items
                .iter()
                .map(|(name, item)| {
                    let min = state.levels[name].min;
                    let extra = ((item.lower - f64::from(min)) * share).round() as u32;
                    (name.clone(), min + extra)
                })
                .collect();
        }
        let problem: Vec<Item> = self.items.iter().map(|(_, i)| *i).collect();
        match conc_alloc::allocate(state.nominal_sum, &problem) {
            Ok((allocs, fair)) => {
                if std::mem::take(&mut state.division_failing) {
                    tracing::info!("API Priority and Fairness divides the seats among the priority levels again");
                }
                state.fair_fraction = fair;
                self.items
                    .iter()
                    .zip(allocs)
                    .map(|((name, _), a)| (name.clone(), a.round() as u32))
                    .collect()
            }
            Err(e) => {
                // The same objects fail the same way every borrowing period: say it once.
                if !std::mem::replace(&mut state.division_failing, true) {
                    tracing::error!(error = %e, "API Priority and Fairness could not divide the seats among the priority levels; keeping the current limits");
                }
                self.items
                    .iter()
                    .map(|(name, _)| (name.clone(), state.levels[name].current))
                    .collect()
            }
        }
    }
}
