//! Where APIServices come from: the core server's `apiregistration.k8s.io/v1` API ([`kube`]) or a
//! directory of manifests ([`file`]), behind one output so nothing downstream cares which.
//!
//! Both sources publish the **whole** current set on a `watch` channel: `None` until the first
//! complete sync, then a fresh [`ApiServiceSet`] after every change. Consumers (route table,
//! discovery, availability) rebuild their immutable snapshots from a complete list, so they never
//! see a half-listed state — during a relist or while a file is being rewritten the previous set
//! simply stays current. A `watch` channel fits because only the latest set matters: a slow
//! consumer skips intermediate sets instead of queueing them.
//!
//! What a source *refused* travels in the same value, typed ([`Refusal`]), so the consumer that
//! owns the metrics and the route table (the gateway's route controller) sees every problem
//! without a second channel, and nothing can route a refusal by mistake: only
//! [`ApiServiceSet::apiservices`] is ever routed.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::APIService;

pub mod file;
pub mod kube;

/// Everything one source currently says: the APIServices to route and what it refused.
///
/// Published whole (see the module comment); equal sets are not published twice, so a change in
/// the refusals alone is a new set too (the metrics must follow a fix).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiServiceSet {
    /// Name-sorted, one per name. For an APIService whose current manifest is refused this is its
    /// last good version (see [`Refusal::ApiService`]).
    pub apiservices: Vec<APIService>,
    /// Refused manifest files first (by path), then refused APIServices (by name). Only the file
    /// source refuses anything: the API server validated what the kube source sees.
    pub refused: Vec<Refusal>,
}

impl ApiServiceSet {
    /// A set with nothing refused, e.g. the kube source's.
    pub fn accepted(apiservices: Vec<APIService>) -> Self {
        Self {
            apiservices,
            refused: Vec::new(),
        }
    }
}

/// A manifest the source refused. The source has logged it at error already, naming the file,
/// the line and what to fix; the consumer only counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// APIService `name`'s manifest breaks validation (or has a wrong `apiVersion`, or a field of
    /// the wrong type).
    ApiService {
        name: String,
        /// Whether [`ApiServiceSet::apiservices`] carries the last good version of `name` (the
        /// same file held a valid one before this edit): it stays routed. Without one, `name` is
        /// not routed at all.
        kept: bool,
        /// The error, starting with `file:line`.
        reason: String,
    },
    /// A manifest file could not be read or parsed, so nothing in it can be trusted; the
    /// APIServices it last yielded (if any) stay in [`ApiServiceSet::apiservices`].
    File {
        path: PathBuf,
        /// The error, starting with `file:line:column` where the parser knows them.
        reason: String,
    },
}

/// The side of [`channel`] a source publishes on.
pub type SetSender = watch::Sender<Option<Arc<ApiServiceSet>>>;

/// The side of [`channel`] a consumer reads: `None` until the first complete sync.
pub type SetReceiver = watch::Receiver<Option<Arc<ApiServiceSet>>>;

/// The channel both sources publish on: `None` until the first complete sync.
pub fn channel() -> (SetSender, SetReceiver) {
    watch::channel(None)
}

/// Why a source could not deliver or write APIServices.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A directory (the manifest directory) could not be listed.
    #[error("cannot read directory {}: {source}", .path.display())]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A manifest file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A manifest file is not valid YAML/JSON, or an APIService in it does not have the
    /// APIService shape. `line` and `column` are 1-based where the parser knows them.
    #[error("{}{}: {message}", .path.display(), location_suffix(*.line, *.column))]
    Parse {
        path: PathBuf,
        line: Option<u64>,
        column: Option<u64>,
        message: String,
    },
    /// An APIService in a manifest parses but breaks kube-aggregator's validation rules (the
    /// API server would have refused it on `kubectl apply`).
    #[error("{}{}: {}", .path.display(), location_suffix(*.line, None), .source.summary())]
    Invalid {
        path: PathBuf,
        line: Option<u64>,
        #[source]
        source: crate::validation::ValidationErrors,
    },
    /// Two manifests define APIService `name`: the one at `routed` stays routed, the one at
    /// `refused` is refused (both as `file:line`).
    #[error("{refused}: APIService {name:?} is also defined at {routed}, which stays routed; remove one of the two definitions (an APIService name must be unique across the directory)")]
    Duplicate {
        name: String,
        refused: String,
        routed: String,
    },
    /// The directory watch could not be set up; the periodic re-scan still picks up changes.
    #[error("cannot watch {} for changes: {source}", .path.display())]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
    /// A call to the core server failed (reading or writing an APIService).
    #[error("{action} APIService {name:?}: {source}")]
    Kube {
        action: &'static str,
        name: String,
        #[source]
        source: ::kube::Error,
    },
}

/// `:line:column` as compilers print it, so editors can jump to the spot.
fn location_suffix(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// Sorts by `metadata.name` so a set's order (and so log output and snapshot diffs) does not
/// depend on watch event order or directory listing order.
pub(crate) fn sort_by_name(items: &mut [APIService]) {
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
}

/// Publishes `next` unless it equals what is already published, so a no-op event (a relist that
/// changed nothing, a file touched but not changed) does not make every consumer rebuild.
/// Returns whether a new set was published.
pub(crate) fn publish(tx: &SetSender, next: ApiServiceSet) -> bool {
    tx.send_if_modified(|current| {
        if current.as_ref().is_some_and(|c| **c == next) {
            return false;
        }
        *current = Some(Arc::new(next));
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn named(name: &str) -> APIService {
        APIService {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn publish_skips_identical_sets() {
        let (tx, rx) = channel();
        assert!(rx.borrow().is_none());
        assert!(publish(
            &tx,
            ApiServiceSet::accepted(vec![named("v1.a.io")])
        ));
        assert!(!publish(
            &tx,
            ApiServiceSet::accepted(vec![named("v1.a.io")])
        ));
        // An empty set after a sync is a real state (everything deleted), not "not synced".
        assert!(publish(&tx, ApiServiceSet::default()));
        assert_eq!(rx.borrow().as_ref().map(|s| s.apiservices.len()), Some(0));
    }

    /// The refusals are part of the set: a manifest refused (or fixed) while the routed
    /// APIServices stay the same is still news for the metrics.
    #[test]
    fn publish_sends_a_change_in_refusals_alone() {
        let (tx, rx) = channel();
        let mut set = ApiServiceSet::accepted(vec![named("v1.a.io")]);
        assert!(publish(&tx, set.clone()));
        set.refused.push(Refusal::ApiService {
            name: "v1.a.io".into(),
            kept: true,
            reason: "/m/a.yaml:1: bad".into(),
        });
        assert!(publish(&tx, set.clone()));
        assert!(!publish(&tx, set.clone()));
        set.refused.push(Refusal::File {
            path: "/m/x.yaml".into(),
            reason: "/m/x.yaml:1:1: broken".into(),
        });
        assert!(publish(&tx, set));
        assert_eq!(rx.borrow().as_ref().map(|s| s.refused.len()), Some(2));
    }

    #[test]
    fn parse_error_names_file_and_line() {
        let e = SourceError::Parse {
            path: "/m/x.yaml".into(),
            line: Some(7),
            column: Some(3),
            message: "invalid i32".into(),
        };
        assert_eq!(e.to_string(), "/m/x.yaml:7:3: invalid i32");
    }
}
