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

use crate::bootstrap::{self, CATCH_ALL, EXEMPT};
use crate::classifier::Classifier;
use crate::fairqueuing::dispatch::PriorityLevel;
use crate::fairqueuing::shuffle_shard::FlowHashes;
use crate::metrics::{FlowMetrics, LevelMetrics, Metrics};
use crate::model::{Invalid, LevelSpec, LimitResponse, SchemaSpec};

/// kube adjusts the levels' limits this often.
pub const BORROWING_PERIOD: Duration = Duration::from_secs(10);

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
    /// The flow hashes of this schema's distinguishers, kept while the configuration lasts.
    pub flow_hashes: FlowHashes,
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
    /// Unique in the process: the key under which classifications are remembered
    /// (`remembered`), so that none outlives its configuration.
    pub generation: u64,
}

/// The source of [`Configuration::generation`]: process-wide, since threads' memories of
/// classifications are shared by every flow control in the process (tests make several).
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
    /// Whole specs, so that an edit of a schema's rules in place is a change too.
    pub schemas: Vec<SchemaSpec>,
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
    /// The seats could not be divided at the last adjustment (logged once, until they can).
    division_failing: bool,
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
            generation: next_generation(),
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
            schemas: schemas.clone(),
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
                    hashed: matches!(l.spec.limit_response, LimitResponse::Queue(q) if q.queues > 1),
                    max_seats: l.max_seats,
                    flow_hashes: FlowHashes::new(spec.name.clone()),
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
            generation: next_generation(),
        }));
    }

    fn new_level(&self, spec: LevelSpec) -> LevelState {
        let metrics = Arc::new(LevelMetrics::new(&self.metrics, &spec.name));
        LevelState {
            level: PriorityLevel::new(spec.name.clone(), spec.limit_response, metrics),
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

/// kube's current built-in configuration, mandatory and suggested, as API objects.
pub fn built_in_objects() -> (Vec<api::PriorityLevelConfiguration>, Vec<api::FlowSchema>) {
    built_in_objects_of(bootstrap::Release::Current)
}

/// The built-in configuration of `release`.
pub fn built_in_objects_of(
    release: bootstrap::Release,
) -> (Vec<api::PriorityLevelConfiguration>, Vec<api::FlowSchema>) {
    let mut levels = bootstrap::mandatory_priority_levels();
    levels.extend(bootstrap::suggested_priority_levels());
    let mut schemas = bootstrap::mandatory_flow_schemas();
    schemas.extend(bootstrap::suggested_flow_schemas_of(release));
    (levels, schemas)
}

mod allocation;
#[cfg(test)]
mod tests;

use allocation::Demand;
