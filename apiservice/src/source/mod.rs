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
//! The file source also puts what it *refused* into the set, so the consumer that owns the metrics
//! and the route table (the gateway's route controller) sees every problem without a second
//! channel: see [`refusal`]. Anything that routes must check it first.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::APIService;

pub mod file;
pub mod kube;

/// A complete, name-sorted list of APIServices as one source currently sees it.
pub type ApiServiceSet = Arc<Vec<APIService>>;

/// The channel both sources publish on: `None` until the first complete sync.
pub fn channel() -> (
    watch::Sender<Option<ApiServiceSet>>,
    watch::Receiver<Option<ApiServiceSet>>,
) {
    watch::channel(None)
}

/// Annotation on a set entry standing for a manifest the source refused; the value says why
/// (file, line, and what to fix). On an entry with a `spec` it marks the last good version of an
/// APIService whose current manifest is invalid: still routed, but reported. Without a `spec` it
/// is a placeholder that must not be routed.
///
/// The kube source never sets it; an APIService in a cluster that carries it by hand is reported
/// the same way, which is harmless.
pub const REFUSED_ANNOTATION: &str = "aggregation-gateway/refused";

/// Annotation naming the manifest file of a placeholder for a file the source could not read or
/// parse at all (so no APIService name is known). Such a placeholder has no `metadata.name`.
pub const MANIFEST_FILE_ANNOTATION: &str = "aggregation-gateway/manifest-file";

/// What a set entry says about a refused manifest, from [`refusal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// APIService `name`'s manifest is invalid. `kept` is true when the entry carries its last
    /// good definition (route it); false when there is none (do not route).
    ApiService {
        name: &'a str,
        kept: bool,
        reason: &'a str,
    },
    /// A manifest file could not be read or parsed; the APIServices last loaded from it (if any)
    /// are separate entries.
    File { path: &'a str, reason: &'a str },
}

/// Whether `api` reports a refused manifest rather than being a plain APIService.
pub fn refusal(api: &APIService) -> Option<Refusal<'_>> {
    let annotations = api.metadata.annotations.as_ref()?;
    let reason = annotations.get(REFUSED_ANNOTATION)?.as_str();
    match (
        &api.metadata.name,
        annotations.get(MANIFEST_FILE_ANNOTATION),
    ) {
        (Some(name), _) => Some(Refusal::ApiService {
            name,
            kept: api.spec.is_some(),
            reason,
        }),
        (None, Some(path)) => Some(Refusal::File { path, reason }),
        (None, None) => None,
    }
}

/// Marks `api` (the last good version of `name`, or `None` for a bare placeholder) as refused.
pub(crate) fn refused_api_service(
    name: &str,
    kept: Option<APIService>,
    reason: String,
) -> APIService {
    let mut api = kept.unwrap_or_default();
    api.metadata.name = Some(name.to_owned());
    api.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(REFUSED_ANNOTATION.to_owned(), reason);
    api
}

/// A placeholder for a manifest file that yielded no APIService names.
pub(crate) fn refused_file(path: &std::path::Path, reason: String) -> APIService {
    let mut api = APIService::default();
    api.metadata.annotations = Some(
        [
            (REFUSED_ANNOTATION.to_owned(), reason),
            (
                MANIFEST_FILE_ANNOTATION.to_owned(),
                path.display().to_string(),
            ),
        ]
        .into(),
    );
    api
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
pub(crate) fn publish(tx: &watch::Sender<Option<ApiServiceSet>>, next: Vec<APIService>) -> bool {
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
        assert!(publish(&tx, vec![named("v1.a.io")]));
        assert!(!publish(&tx, vec![named("v1.a.io")]));
        // An empty set after a sync is a real state (everything deleted), not "not synced".
        assert!(publish(&tx, Vec::new()));
        assert_eq!(rx.borrow().as_ref().map(|s| s.len()), Some(0));
    }

    #[test]
    fn refusals_round_trip_and_plain_objects_are_not_refusals() {
        assert_eq!(refusal(&named("v1.a.io")), None);

        let bare = refused_api_service("v1.a.io", None, "bad".into());
        assert_eq!(
            refusal(&bare),
            Some(Refusal::ApiService {
                name: "v1.a.io",
                kept: false,
                reason: "bad"
            })
        );
        let mut good = named("v1.a.io");
        good.spec = Some(Default::default());
        let kept = refused_api_service("v1.a.io", Some(good), "bad".into());
        assert!(matches!(
            refusal(&kept),
            Some(Refusal::ApiService { kept: true, .. })
        ));

        let file = refused_file(std::path::Path::new("/m/x.yaml"), "broken".into());
        assert_eq!(
            refusal(&file),
            Some(Refusal::File {
                path: "/m/x.yaml",
                reason: "broken"
            })
        );
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
