//! The configuration controller (k8s.io/apiserver `pkg/util/flowcontrol/apf_controller.go`):
//! digests the FlowSchemas and PriorityLevelConfigurations into the configuration requests are
//! classified against, divides the server's concurrency limit among the levels, and every
//! borrowing period lends the seats idle levels do not use to the busy ones.
//!
//! As in kube, all objects are digested together on every change. Levels live on by name across
//! configurations (with their queues and waiting requests); a level that is no longer configured
//! keeps its share until its queues drain ("quiescing"), then goes. The mandatory `exempt` and
//! `catch-all` objects are supplied when the API lacks them. The new configuration is published
//! whole (an `ArcSwap`), so a request never sees half of one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use k8s_openapi::api::flowcontrol::v1 as api;
use tokio::time::Instant;

use super::bootstrap::{self, CATCH_ALL, EXEMPT};
use super::classifier::Classifier;
use super::conc_alloc::{self, Item};
use super::dispatch::PriorityLevel;
use super::metrics::{Adjustment, FlowMetrics, LevelMetrics, Metrics};
use super::model::{Invalid, LevelSpec, Limit, SchemaSpec};

/// kube adjusts the levels' limits this often.
pub const BORROWING_PERIOD: Duration = Duration::from_secs(10);
/// Smoothing of seat demand between periods: a half-life of about 5 minutes.
const DEMAND_SMOOTHING: f64 = 0.977;
/// The share of a level's nominal seats one request may take (`priorityLevelMaxSeatsPercent`).
const LEVEL_MAX_SEATS_FRACTION: f64 = 0.15;

/// A FlowSchema of the configuration in force, with what a request classified into it needs.
pub struct Schema {
    pub spec: SchemaSpec,
    pub level: Arc<PriorityLevel>,
    /// The UIDs of the schema and its level, as the response headers carry them.
    pub schema_uid: HeaderValue,
    pub level_uid: HeaderValue,
    pub flow: Arc<FlowMetrics>,
    /// Flows are told apart (hashed) only at a level with more than one queue.
    pub hashed: bool,
    /// The most seats one request of this level may take (0: no level limit).
    pub max_seats: u32,
}

impl std::borrow::Borrow<SchemaSpec> for Arc<Schema> {
    fn borrow(&self) -> &SchemaSpec {
        &self.spec
    }
}

/// The configuration requests are classified against.
pub struct Configuration {
    pub classifier: Classifier<Arc<Schema>>,
}

/// The smoothed seat demand of a level.
#[derive(Clone, Copy, Debug, Default)]
struct Demand {
    average: f64,
    stdev: f64,
    high_watermark: u32,
    smoothed: f64,
}

struct LevelState {
    spec: LevelSpec,
    level: Arc<PriorityLevel>,
    nominal: u32,
    /// The nominal limit less what it may lend.
    min: u32,
    /// The nominal limit plus what it may borrow.
    max: u32,
    current: u32,
    max_seats: u32,
    demand: Demand,
    quiescing: bool,
    /// Not yet given a limit: it starts at its nominal limit less half what it may lend.
    fresh: bool,
}

/// An object left out of the configuration, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub kind: &'static str,
    pub name: String,
    pub reason: String,
}

/// What the last digest made of the objects, for the log line of a change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub levels: Vec<(String, LevelSpec)>,
    pub schemas: Vec<String>,
    pub ignored: Vec<Ignored>,
}

#[derive(Default)]
struct State {
    levels: BTreeMap<Arc<str>, LevelState>,
    nominal_sum: u32,
    /// The objects last digested, to digest again when a quiescing level drains.
    inputs: (Vec<api::PriorityLevelConfiguration>, Vec<api::FlowSchema>),
    summary: Option<Summary>,
    fair_fraction: f64,
}

pub struct Controller {
    /// `--max-requests-inflight` plus `--max-mutating-requests-inflight`.
    server_limit: u32,
    metrics: Arc<Metrics>,
    current: ArcSwap<Configuration>,
    state: Mutex<State>,
}

impl Controller {
    /// A controller holding the mandatory configuration until the first [`Controller::apply`].
    pub fn new(server_limit: u32, metrics: Arc<Metrics>) -> Self {
        let empty = Configuration {
            classifier: Classifier::new(Vec::new(), 0),
        };
        let c = Self {
            server_limit,
            metrics,
            current: ArcSwap::from_pointee(empty),
            state: Mutex::new(State::default()),
        };
        c.apply(Vec::new(), Vec::new());
        c
    }

    pub fn server_limit(&self) -> u32 {
        self.server_limit
    }

    /// The configuration in force.
    pub fn current(&self) -> arc_swap::Guard<Arc<Configuration>> {
        self.current.load()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Digests a complete set of objects and puts the result in force. Returns the summary when
    /// it differs from the last one (the caller logs it: one line per change).
    pub fn apply(
        &self,
        levels: Vec<api::PriorityLevelConfiguration>,
        schemas: Vec<api::FlowSchema>,
    ) -> Option<Summary> {
        let mut state = self.lock();
        state.inputs = (levels, schemas);
        let summary = self.digest(&mut state);
        if state.summary.as_ref() == Some(&summary) {
            return None;
        }
        state.summary = Some(summary.clone());
        Some(summary)
    }

    fn digest(&self, state: &mut State) -> Summary {
        let now = Instant::now();
        let mut ignored = Vec::new();
        let (api_levels, api_schemas) = state.inputs.clone();
        let mut levels = self.digest_levels(state, &api_levels, &mut ignored);
        let schemas = digest_schemas(&levels, &api_schemas, &mut ignored);
        // Levels of the last configuration that are gone drain first.
        for (name, mut old) in std::mem::take(&mut state.levels) {
            if !old.level.lock().is_idle() {
                old.quiescing = true;
                levels.insert(name, old);
            }
        }
        self.divide(&mut levels);
        state.nominal_sum = levels.values().map(|l| l.nominal).sum();
        state.levels = levels;
        self.adjust(state, now);
        let summary = Summary {
            levels: state
                .levels
                .iter()
                .filter(|(_, l)| !l.quiescing)
                .map(|(n, l)| (n.to_string(), l.spec.clone()))
                .collect(),
            schemas: schemas.iter().map(|s| s.name.to_string()).collect(),
            ignored,
        };
        self.publish(state, schemas);
        summary
    }

    /// The valid PriorityLevelConfigurations (the first of a duplicated name), keeping the live
    /// state of the levels that were there before, and the mandatory ones the API lacks.
    fn digest_levels(
        &self,
        state: &mut State,
        api_levels: &[api::PriorityLevelConfiguration],
        ignored: &mut Vec<Ignored>,
    ) -> BTreeMap<Arc<str>, LevelState> {
        let mut specs: BTreeMap<Arc<str>, LevelSpec> = BTreeMap::new();
        for pl in api_levels {
            match LevelSpec::from_api(pl) {
                Ok(spec) => {
                    specs.entry(spec.name.clone()).or_insert(spec);
                }
                Err(Invalid(reason)) => ignored.push(Ignored {
                    kind: "PriorityLevelConfiguration",
                    name: pl.metadata.name.clone().unwrap_or_default(),
                    reason,
                }),
            }
        }
        for pl in bootstrap::mandatory_priority_levels() {
            let spec = LevelSpec::from_api(&pl).expect("valid built-in");
            specs.entry(spec.name.clone()).or_insert(spec);
        }
        specs
            .into_iter()
            .map(|(name, spec)| {
                let level = match state.levels.remove(&name) {
                    Some(s) => LevelState {
                        spec,
                        quiescing: false,
                        ..s
                    },
                    None => self.new_level(spec),
                };
                (name, level)
            })
            .collect()
    }

    /// Puts a configuration of `schemas` (in matching order) in force.
    fn publish(&self, state: &State, schemas: Vec<SchemaSpec>) {
        let schemas: Vec<Arc<Schema>> = schemas
            .into_iter()
            .map(|spec| {
                let l = &state.levels[spec.level.as_str()];
                Arc::new(Schema {
                    flow: Arc::new(FlowMetrics::new(&self.metrics, &l.spec.name, &spec.name)),
                    level: l.level.clone(),
                    schema_uid: header_value(&spec.uid),
                    level_uid: header_value(&l.spec.uid),
                    hashed: matches!(l.spec.limit, Limit::Queue(q) if q.queues > 1),
                    max_seats: l.max_seats,
                    spec,
                })
            })
            .collect();
        let catch_all = schemas
            .iter()
            .position(|s| &*s.spec.name == CATCH_ALL)
            .expect("catch-all is always there");
        self.current.store(Arc::new(Configuration {
            classifier: Classifier::new(schemas, catch_all),
        }));
    }

    fn new_level(&self, spec: LevelSpec) -> LevelState {
        let metrics = Arc::new(LevelMetrics::new(&self.metrics, &spec.name));
        LevelState {
            level: PriorityLevel::new(spec.name.clone(), spec.limit, metrics),
            spec,
            nominal: 0,
            min: 0,
            max: 0,
            current: 0,
            max_seats: 0,
            demand: Demand::default(),
            quiescing: false,
            fresh: true,
        }
    }

    /// Divides the server's limit among the levels by their shares (kube's
    /// `finishQueueSetReconfigsLocked`).
    fn divide(&self, levels: &mut BTreeMap<Arc<str>, LevelState>) {
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
            l.max_seats = match l.spec.limit {
                Limit::Queue(q) => {
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
            l.level.lock().set_limit(l.spec.limit);
        }
    }

    /// Lends and borrows: each level's limit for the next period from its seat demand in the
    /// last one (kube's `updateBorrowingLocked`).
    fn adjust(&self, state: &mut State, now: Instant) {
        let mut remaining = i64::from(state.nominal_sum);
        let (mut min_sum, mut min_current_sum) = (0i64, 0i64);
        let mut items = Vec::new();
        let mut floors = BTreeMap::new();
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
                floors.insert(name.clone(), floor);
                remaining -= i64::from(floor);
            } else {
                // At least what it used (up to its nominal limit) or what it may not lend.
                let floor = l.min.max(l.nominal.min(l.demand.high_watermark));
                floors.insert(name.clone(), floor);
                items.push((
                    name.clone(),
                    Item {
                        lower: f64::from(floor),
                        upper: f64::from(l.max),
                        target: f64::from(floor).max(l.demand.smoothed),
                    },
                ));
                min_sum += i64::from(l.min);
                min_current_sum += i64::from(floor);
            }
        }
        let mut allocated: BTreeMap<Arc<str>, u32> = BTreeMap::new();
        let problem: Vec<Item> = items.iter().map(|(_, i)| *i).collect();
        state.fair_fraction = 0.0;
        if remaining <= min_sum {
            for (name, _) in &items {
                allocated.insert(name.clone(), state.levels[name].min);
            }
        } else if remaining <= min_current_sum {
            let share = (remaining - min_sum) as f64 / (min_current_sum - min_sum) as f64;
            for (name, item) in &items {
                let min = state.levels[name].min;
                let extra = ((item.lower - f64::from(min)) * share).round() as u32;
                allocated.insert(name.clone(), min + extra);
            }
        } else {
            match conc_alloc::allocate(state.nominal_sum, &problem) {
                Ok((allocs, fair)) => {
                    state.fair_fraction = fair;
                    for ((name, _), a) in items.iter().zip(allocs) {
                        allocated.insert(name.clone(), a.round() as u32);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "API Priority and Fairness could not divide the seats among the priority levels; keeping the current limits");
                    for (name, _) in &items {
                        allocated.insert(name.clone(), state.levels[name].current);
                    }
                }
            }
        }
        self.metrics.seat_fair_frac.set(state.fair_fraction);
        for (name, l) in &mut state.levels {
            let current = match allocated.get(name) {
                Some(a) => *a,
                None => floors[name],
            };
            let target = items
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

    /// One borrowing period's adjustment; a quiescing level that drained goes.
    pub fn adjust_borrowing(&self) {
        let mut state = self.lock();
        let drained = state
            .levels
            .values()
            .any(|l| l.quiescing && l.level.lock().is_idle());
        if drained {
            let summary = self.digest(&mut state);
            state.summary = Some(summary);
        } else {
            self.adjust(&mut state, Instant::now());
        }
    }

    /// Every level's limits, for the dumps and tests: (name, nominal, min, max, current,
    /// quiescing, level).
    pub fn levels(&self) -> Vec<LevelView> {
        self.lock()
            .levels
            .values()
            .map(|l| LevelView {
                name: l.spec.name.clone(),
                nominal: l.nominal,
                min: l.min,
                max: l.max,
                current: l.current,
                max_seats: l.max_seats,
                quiescing: l.quiescing,
                level: l.level.clone(),
            })
            .collect()
    }
}

/// The valid FlowSchemas that name an existing level, in matching order (matchingPrecedence,
/// then name), with the mandatory ones first and last when the API lacks them.
fn digest_schemas(
    levels: &BTreeMap<Arc<str>, LevelState>,
    api_schemas: &[api::FlowSchema],
    ignored: &mut Vec<Ignored>,
) -> Vec<SchemaSpec> {
    let mut schemas: Vec<SchemaSpec> = Vec::new();
    for fs in api_schemas {
        match SchemaSpec::from_api(fs) {
            Ok(spec) if levels.contains_key(spec.level.as_str()) => {
                if !schemas.iter().any(|s| s.name == spec.name) {
                    schemas.push(spec);
                }
            }
            Ok(spec) => ignored.push(Ignored {
                kind: "FlowSchema",
                name: spec.name.to_string(),
                reason: format!(
                    "it references the PriorityLevelConfiguration {:?}, which does not exist or is ignored",
                    spec.level
                ),
            }),
            Err(Invalid(reason)) => ignored.push(Ignored {
                kind: "FlowSchema",
                name: fs.metadata.name.clone().unwrap_or_default(),
                reason,
            }),
        }
    }
    schemas.sort_by(|a, b| (a.matching_precedence, &a.name).cmp(&(b.matching_precedence, &b.name)));
    let mandatory = bootstrap::mandatory_flow_schemas();
    let built_in = |i: usize| SchemaSpec::from_api(&mandatory[i]).expect("valid built-in");
    if !schemas.iter().any(|s| &*s.name == EXEMPT) {
        schemas.insert(0, built_in(0));
    }
    if !schemas.iter().any(|s| &*s.name == CATCH_ALL) {
        schemas.push(built_in(1));
    }
    schemas
}

/// A level as the dumps show it.
pub struct LevelView {
    pub name: Arc<str>,
    pub nominal: u32,
    pub min: u32,
    pub max: u32,
    pub current: u32,
    pub max_seats: u32,
    pub quiescing: bool,
    pub level: Arc<PriorityLevel>,
}

/// A UID as a header value (UIDs the API assigns always are one; anything else is left out).
fn header_value(uid: &str) -> HeaderValue {
    HeaderValue::from_str(uid).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// kube's built-in configuration, mandatory and suggested, as API objects.
pub fn built_in_objects() -> (Vec<api::PriorityLevelConfiguration>, Vec<api::FlowSchema>) {
    let mut levels = bootstrap::mandatory_priority_levels();
    levels.extend(bootstrap::suggested_priority_levels());
    let mut schemas = bootstrap::mandatory_flow_schemas();
    schemas.extend(bootstrap::suggested_flow_schemas());
    (levels, schemas)
}

#[cfg(test)]
mod tests;
