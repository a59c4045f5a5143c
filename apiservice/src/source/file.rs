//! APIServices from a directory of manifests, for gateways that front a server without the
//! `apiregistration.k8s.io` API (or that should not depend on it).
//!
//! Every `*.yaml`, `*.yml` and `*.json` file in the directory is read the way `kubectl apply -f`
//! reads it: several documents per file (`---`), `kind: List` / `APIServiceList` with `items`,
//! documents of other kinds ignored. The whole directory is one unit: if any file is unreadable,
//! malformed or holds an invalid APIService, nothing new is published (the last good set stays in
//! force) and the error names the file, line and problem. A half-applied edit would route some
//! groups by the old manifests and some by the new, which is harder to notice than "my change did
//! not apply" plus an error line.
//!
//! The directory is usually a mounted ConfigMap, where the kubelet updates files by writing a new
//! timestamped directory and atomically swapping the `..data` symlink; the visible names are
//! symlinks `x.yaml -> ..data/x.yaml`. So we watch the *directory* (a watch on a file would keep
//! following the old inode), follow symlinks when reading, and skip dot-entries (`..data`,
//! `..2024_…`, editor swap files). Events are debounced because one swap produces a burst of them.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use tokio::sync::{watch, Notify};
use tracing::{debug, error, info, warn};

use super::{publish, sort_by_name, ApiServiceSet, SourceError};
use crate::model::{APIService, APIServiceSpec, APIServiceStatus};
use crate::validation::validate;

/// How long to wait after a change event before reading, so a burst (a ConfigMap swap, an editor
/// writing a temp file then renaming) is read once, complete.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Re-scan interval. A deliberate safety net, not the change mechanism: inotify misses changes
/// made through paths it does not watch (a symlink target edited in place outside the directory,
/// a directory deleted and re-created, network filesystems), and the watch itself can fail to
/// start. The content hash makes a re-scan that finds nothing new cost one directory read.
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// `apiVersion`s an APIService manifest may have; v1beta1 has the same shape.
const API_VERSIONS: [&str; 2] = [
    "apiregistration.k8s.io/v1",
    "apiregistration.k8s.io/v1beta1",
];

/// Watches `dir` and publishes its APIServices on `tx`: once after the first successful read, then
/// after every change that yields a different valid set. Runs until every receiver is gone.
pub async fn run(dir: PathBuf, tx: watch::Sender<Option<ApiServiceSet>>) {
    let changed = Arc::new(Notify::new());
    let mut watcher = start_watch(&dir, &changed);
    let mut last_hash = None;
    let mut rescan = tokio::time::interval(RESCAN_INTERVAL);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        // The first tick fires at once: that is the initial load.
        tokio::select! {
            () = changed.notified() => {
                tokio::time::sleep(DEBOUNCE).await;
                // Events that arrived while we slept are covered by the read below.
                let _ = changed.notified().now_or_never();
            }
            _ = rescan.tick() => {
                if watcher.is_none() {
                    watcher = start_watch(&dir, &changed);
                }
            }
            () = tx.closed() => return,
        }
        reload(&dir, &tx, &mut last_hash).await;
    }
}

/// Watches the directory itself (not its files; see the module comment). `None` when the watch
/// cannot start: the periodic re-scan still notices changes, and retries the watch.
fn start_watch(dir: &Path, changed: &Arc<Notify>) -> Option<RecommendedWatcher> {
    let notify = Arc::clone(changed);
    let handler = move |res: notify::Result<notify::Event>| match res {
        Ok(event) if is_change(&event.kind) => notify.notify_one(),
        Ok(_) => {}
        Err(error) => warn!(%error, "manifest directory watch reported an error"),
    };
    let started = notify::recommended_watcher(handler).and_then(|mut w| {
        w.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match started {
        Ok(w) => Some(w),
        Err(source) => {
            let error = SourceError::Watch {
                path: dir.to_owned(),
                source,
            };
            warn!(%error, "falling back to re-scanning every {}s", RESCAN_INTERVAL.as_secs());
            None
        }
    }
}

/// Whether an event can mean new content. Our own reads produce open/close-read events on plain
/// files in the directory; reacting to those would make every read trigger the next one.
fn is_change(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Reads the directory and publishes the result if it is valid and different. Content that did
/// not change since the last attempt (good or bad) is not parsed again, so a broken file is
/// reported once per edit, not every re-scan.
async fn reload(
    dir: &Path,
    tx: &watch::Sender<Option<ApiServiceSet>>,
    last_hash: &mut Option<u64>,
) {
    let scan_dir = dir.to_owned();
    let scanned = match tokio::task::spawn_blocking(move || scan(&scan_dir)).await {
        Ok(scanned) => scanned,
        Err(join) => {
            error!(error = %join, "manifest directory scan did not complete");
            return;
        }
    };
    let files = match scanned {
        Ok(files) => files,
        Err(error) => {
            *last_hash = None;
            error!(%error, "cannot read APIService manifests; keeping the last good set");
            return;
        }
    };
    let hash = content_hash(&files);
    if *last_hash == Some(hash) {
        return;
    }
    *last_hash = Some(hash);

    match load(&files) {
        Ok(items) => {
            let count = items.len();
            if publish(tx, items) {
                info!(dir = %dir.display(), count, "loaded APIService manifests");
            }
        }
        Err(errors) => {
            for error in &errors {
                error!(%error, "bad APIService manifest; keeping the last good set");
            }
        }
    }
}

/// One manifest file's path and content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestFile {
    pub path: PathBuf,
    pub text: String,
}

fn is_manifest_name(name: &str) -> bool {
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// Lists and reads the manifest files of `dir`, sorted by file name.
///
/// Symlinks are followed (ConfigMap mounts are all symlinks). A symlink whose target is gone is
/// skipped: during a ConfigMap update the link of a removed key dangles for a moment.
pub fn scan(dir: &Path) -> Result<Vec<ManifestFile>, SourceError> {
    let read_dir = |source| SourceError::ReadDir {
        path: dir.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            debug!(name = ?name, "skipping non-UTF-8 file name");
            continue;
        };
        if is_manifest_name(name) {
            names.push(name.to_owned());
        }
    }
    names.sort();

    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                debug!(path = %path.display(), "skipping dangling symlink");
                continue;
            }
            Err(source) => return Err(SourceError::ReadFile { path, source }),
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => files.push(ManifestFile { path, text }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(SourceError::ReadFile { path, source }),
        }
    }
    Ok(files)
}

fn content_hash(files: &[ManifestFile]) -> u64 {
    let mut h = DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

impl Hash for ManifestFile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.path.hash(state);
        self.text.hash(state);
    }
}

/// Turns the files of one directory into the APIService set: every file parsed and every
/// APIService validated; the set sorted by name. Any error fails the whole set (all errors are
/// returned, so one log shows every broken file). A name defined twice keeps its first definition
/// in file-name order; the other is reported at warn.
pub fn load(files: &[ManifestFile]) -> Result<Vec<APIService>, Vec<SourceError>> {
    let mut errors = Vec::new();
    // name → where its kept definition is.
    let mut first_at: HashMap<String, String> = HashMap::new();
    let mut items = Vec::new();
    for file in files {
        let found = match parse_manifests(&file.path, &file.text) {
            Ok(found) => found,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for Found { api, line } in found {
            let name = api.metadata.name.clone().unwrap_or_default();
            let here = origin(&file.path, line);
            if let Some(kept) = first_at.get(&name) {
                warn!(
                    apiservice = %name,
                    ignored = %here,
                    kept = %kept,
                    "APIService defined twice; the first definition (in file-name order) wins"
                );
                continue;
            }
            first_at.insert(name, here);
            items.push(api);
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    sort_by_name(&mut items);
    Ok(items)
}

/// `path:line`, for messages.
fn origin(path: &Path, line: Option<u64>) -> String {
    match line {
        Some(l) => format!("{}:{l}", path.display()),
        None => path.display().to_string(),
    }
}

/// An APIService found in a file, with the line its document (or List item) starts on.
#[derive(Debug)]
pub struct Found {
    pub api: APIService,
    pub line: Option<u64>,
}

/// Parses one manifest file: YAML (one or more documents) or JSON. APIServices are checked for
/// `apiVersion` and validated; other kinds are skipped. Errors carry the file and line.
pub fn parse_manifests(path: &Path, text: &str) -> Result<Vec<Found>, SourceError> {
    let options = serde_saphyr::options! { with_snippet: false };
    let docs: Vec<Spanned<Doc>> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| saphyr_error(path, &e))?;
    let mut found = Vec::new();
    for doc in docs {
        collect(path, doc, &mut found)?;
    }
    Ok(found)
}

fn collect(path: &Path, doc: Spanned<Doc>, out: &mut Vec<Found>) -> Result<(), SourceError> {
    let line = Some(doc.referenced.line()).filter(|l| *l > 0);
    let parse_err = |message: String| SourceError::Parse {
        path: path.to_owned(),
        line,
        column: None,
        message,
    };
    match doc.value {
        Doc::Other { kind } => {
            debug!(
                file = %path.display(),
                line,
                kind = kind.as_deref().unwrap_or("<none>"),
                "ignoring a document that is not an APIService"
            );
        }
        Doc::List(items) => {
            for item in items {
                collect(path, item, out)?;
            }
        }
        Doc::ApiService(doc) => {
            let ApiServiceDoc {
                api_version,
                metadata,
                spec,
                status,
                deferred,
            } = *doc;
            match api_version.as_deref() {
                Some(v) if API_VERSIONS.contains(&v) => {}
                Some(v) => {
                    return Err(parse_err(format!(
                        "kind APIService with apiVersion {v:?}: expected {:?}",
                        API_VERSIONS[0]
                    )))
                }
                None => {
                    return Err(parse_err(format!(
                        "kind APIService without apiVersion: expected {:?}",
                        API_VERSIONS[0]
                    )))
                }
            }
            let mut api = APIService {
                metadata: metadata.unwrap_or_default(),
                spec,
                status,
            };
            // Fields that came before `kind` in the document were kept as generic values; decode
            // them now. serde_json knows no lines, so point at where the field's value starts.
            for (field, value) in deferred {
                let at = Some(value.referenced.line()).filter(|l| *l > 0);
                let err = |e: serde_json::Error| SourceError::Parse {
                    path: path.to_owned(),
                    line: at,
                    column: Some(value.referenced.column()).filter(|_| at.is_some()),
                    message: format!("{field}: {e}"),
                };
                match field {
                    Deferred::Metadata => {
                        api.metadata = serde_json::from_value(value.value.clone()).map_err(err)?
                    }
                    Deferred::Spec => {
                        api.spec = serde_json::from_value(value.value.clone()).map_err(err)?
                    }
                    Deferred::Status => {
                        api.status = serde_json::from_value(value.value.clone()).map_err(err)?
                    }
                }
            }
            validate(&api).map_err(|source| SourceError::Invalid {
                path: path.to_owned(),
                line,
                source,
            })?;
            out.push(Found { api, line });
        }
    }
    Ok(())
}

fn saphyr_error(path: &Path, e: &serde_saphyr::Error) -> SourceError {
    let location = e.location().filter(|l| l.line() > 0);
    let mut message = e.to_string();
    if let Some(l) = &location {
        // The location goes in front, compiler style; drop the parser's own suffix.
        let suffix = format!(" at line {}, column {}", l.line(), l.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
    }
    SourceError::Parse {
        path: path.to_owned(),
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        message,
    }
}

/// A top-level field of an APIService that appeared before `kind` and so could not be decoded
/// with its type on the spot.
#[derive(Clone, Copy, Debug)]
enum Deferred {
    Metadata,
    Spec,
    Status,
}

impl fmt::Display for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Metadata => "metadata",
            Self::Spec => "spec",
            Self::Status => "status",
        })
    }
}

/// One document (or List item), decoded just enough to know what it is.
///
/// Decoding is typed as early as possible so serde-saphyr's errors point at the offending line:
/// once `kind` is known, an APIService's `metadata`, `spec` and `status` are decoded straight into
/// their k8s-openapi types, and other kinds' fields are skipped unread. Only fields that come
/// before `kind` are buffered (as JSON values) and decoded at the end.
#[derive(Debug)]
enum Doc {
    ApiService(Box<ApiServiceDoc>),
    List(Vec<Spanned<Doc>>),
    Other { kind: Option<String> },
}

#[derive(Debug)]
struct ApiServiceDoc {
    api_version: Option<String>,
    metadata: Option<ObjectMeta>,
    spec: Option<APIServiceSpec>,
    status: Option<APIServiceStatus>,
    deferred: Vec<(Deferred, Spanned<serde_json::Value>)>,
}

fn is_list_kind(kind: &str) -> bool {
    kind == "List" || kind == "APIServiceList"
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl DocVisitor {
    fn other<E>(self) -> Result<Doc, E> {
        Ok(Doc::Other { kind: None })
    }
}

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut kind: Option<String> = None;
        let mut api_version: Option<String> = None;
        let mut metadata = None;
        let mut spec = None;
        let mut status = None;
        let mut items: Option<Vec<Spanned<Doc>>> = None;
        let mut deferred = Vec::new();

        while let Some(key) = map.next_key::<KeyName>()? {
            let field = match key.0.as_deref() {
                Some("kind") => {
                    kind = Some(map.next_value()?);
                    continue;
                }
                Some("apiVersion") => {
                    api_version = Some(map.next_value()?);
                    continue;
                }
                Some("items") if kind.as_deref().is_none_or(is_list_kind) => {
                    items = map.next_value::<Items>()?.0;
                    continue;
                }
                Some("metadata") => Deferred::Metadata,
                Some("spec") => Deferred::Spec,
                Some("status") => Deferred::Status,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            match kind.as_deref() {
                Some("APIService") => match field {
                    Deferred::Metadata => metadata = Some(map.next_value()?),
                    Deferred::Spec => spec = Some(map.next_value()?),
                    Deferred::Status => status = Some(map.next_value()?),
                },
                Some(_) => {
                    map.next_value::<IgnoredAny>()?;
                }
                None => deferred.push((field, map.next_value()?)),
            }
        }

        Ok(match kind.as_deref() {
            Some("APIService") => Doc::ApiService(Box::new(ApiServiceDoc {
                api_version,
                metadata,
                spec,
                status,
                deferred,
            })),
            Some(k) if is_list_kind(k) => Doc::List(items.unwrap_or_default()),
            _ => Doc::Other { kind },
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.other()
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Doc, E> {
        self.other()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Doc, E> {
        self.other()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Doc, E> {
        self.other()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Doc, E> {
        self.other()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Doc, E> {
        self.other()
    }
    fn visit_unit<E: de::Error>(self) -> Result<Doc, E> {
        self.other()
    }
    fn visit_none<E: de::Error>(self) -> Result<Doc, E> {
        self.other()
    }
}

/// A mapping key; non-string keys (legal YAML, never in a Kubernetes object) become `None` and
/// their values are skipped.
struct KeyName(Option<String>);

impl<'de> Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyName, E> {
                Ok(KeyName(Some(v.to_owned())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyName, E> {
                Ok(KeyName(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyName, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(KeyName(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyName, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyName(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A List's `items`: a sequence of objects. Read before `kind` is known (kubectl prints
/// `apiVersion, items, kind`), so anything that is not a sequence is skipped, not an error.
struct Items(Option<Vec<Spanned<Doc>>>);

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Items;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of objects")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<Doc>>()? {
                    items.push(item);
                }
                Ok(Items(Some(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Items, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Items(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Items, E> {
                Ok(Items(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Items, E> {
                Ok(Items(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::os::unix::fs::symlink;

    const A: &str = "\
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1alpha1.wardle.example.com
spec:
  group: wardle.example.com
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service:
    namespace: wardle
    name: api
  caBundle: UEVN
";

    fn api_service(name: &str) -> String {
        let (version, group) = name.split_once('.').unwrap();
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {name}\n\
             spec:\n  group: {group}\n  version: {version}\n  groupPriorityMinimum: 100\n  \
             versionPriority: 10\n"
        )
    }

    fn names(items: &[APIService]) -> Vec<String> {
        items
            .iter()
            .map(|a| a.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn file(name: &str, text: &str) -> ManifestFile {
        ManifestFile {
            path: PathBuf::from("/m").join(name),
            text: text.to_owned(),
        }
    }

    #[test]
    fn multi_document_list_and_other_kinds() {
        let text = format!(
            "# leading comment\n---\n{A}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n\
             data:\n  items: nope\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {}\n- apiVersion: v1\n  kind: Secret\n",
            api_service("v1.b.io").replace('\n', "\n  ").trim_end()
        );
        let found = parse_manifests(Path::new("/m/a.yaml"), &text).unwrap();
        assert_eq!(found.len(), 2);
        let a = &found[0].api;
        let spec = a.spec.as_ref().unwrap();
        assert_eq!(spec.group.as_deref(), Some("wardle.example.com"));
        assert_eq!(spec.service.as_ref().unwrap().port, None);
        assert_eq!(spec.ca_bundle.as_ref().unwrap().0, b"PEM");
        assert_eq!(found[0].line, Some(3));
        assert_eq!(found[1].api.metadata.name.as_deref(), Some("v1.b.io"));
        // The List item's line, not the List's.
        assert!(found[1].line.unwrap() > 20, "{:?}", found[1].line);
    }

    /// `kubectl get apiservices -o yaml` prints keys sorted: `items` before `kind`, and each
    /// item's `apiVersion, kind, metadata, spec, status`; `APIServiceList` is accepted too.
    #[test]
    fn kubectl_style_list_with_status() {
        let text = "\
apiVersion: v1
items:
- apiVersion: apiregistration.k8s.io/v1
  kind: APIService
  metadata:
    name: v1.a.io
    resourceVersion: \"12\"
  spec:
    group: a.io
    version: v1
    groupPriorityMinimum: 100
    versionPriority: 10
  status:
    conditions:
    - type: Available
      status: \"True\"
      reason: Local
      lastTransitionTime: \"2024-01-01T00:00:00Z\"
kind: List
metadata:
  resourceVersion: \"\"
";
        let found = parse_manifests(Path::new("/m/l.yaml"), text).unwrap();
        assert_eq!(found.len(), 1);
        assert!(crate::model::is_available(&found[0].api));

        let typed = text.replace("kind: List", "kind: APIServiceList");
        assert_eq!(
            parse_manifests(Path::new("/m/l.yaml"), &typed)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn json_and_fields_before_kind() {
        let json = r#"{"metadata": {"name": "v1.j.io"}, "spec": {"group": "j.io", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10},
            "kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1"}"#;
        let found = parse_manifests(Path::new("/m/j.json"), json).unwrap();
        assert_eq!(found[0].api.metadata.name.as_deref(), Some("v1.j.io"));

        // A bad field before `kind` still names a line: where the field's value starts.
        let bad = "spec:\n  group: j.io\n  groupPriorityMinimum: lots\nkind: APIService\n\
                   apiVersion: apiregistration.k8s.io/v1\nmetadata:\n  name: v1.j.io\n";
        let err = parse_manifests(Path::new("/m/j.yaml"), bad).unwrap_err();
        let SourceError::Parse { line, message, .. } = &err else {
            panic!("{err}")
        };
        assert!(line.is_some_and(|l| l <= 2), "{err}");
        assert!(message.starts_with("spec: "), "{err}");
    }

    #[test]
    fn syntax_and_type_errors_name_file_line_and_problem() {
        let text = format!("{A}---\n{}", api_service("v1.b.io"))
            .replace("versionPriority: 10", "versionPriority: ten");
        let err = parse_manifests(Path::new("/m/b.yaml"), &text).unwrap_err();
        let SourceError::Parse {
            path,
            line,
            column,
            message,
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(path, Path::new("/m/b.yaml"));
        assert_eq!(*line, Some(23));
        assert_eq!(*column, Some(20));
        assert!(message.contains("i32"), "{message}");
        assert!(err.to_string().starts_with("/m/b.yaml:23:20: "), "{err}");

        let err = parse_manifests(
            Path::new("/m/c.yaml"),
            "kind: APIService\nspec: [a, b\nx: y\n",
        )
        .unwrap_err();
        assert!(
            matches!(err, SourceError::Parse { line: Some(_), .. }),
            "{err}"
        );
    }

    #[test]
    fn invalid_api_service_and_wrong_api_version_are_errors() {
        let text =
            api_service("v1.b.io").replace("groupPriorityMinimum: 100", "groupPriorityMinimum: 0");
        let err = parse_manifests(Path::new("/m/b.yaml"), &text).unwrap_err();
        assert!(
            matches!(err, SourceError::Invalid { line: Some(1), .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains(
                "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000"
            ),
            "{err}"
        );

        let text = api_service("v1.b.io").replace("apiregistration.k8s.io/v1", "v1");
        let err = parse_manifests(Path::new("/m/b.yaml"), &text).unwrap_err();
        assert!(err.to_string().contains(r#"apiVersion "v1""#), "{err}");
    }

    #[test]
    fn load_sorts_dedups_and_fails_whole() {
        let files = [
            file(
                "a.yaml",
                &format!("{}---\n{}", api_service("v1.z.io"), api_service("v1.b.io")),
            ),
            file(
                "b.yaml",
                &api_service("v1.b.io").replace("versionPriority: 10", "versionPriority: 99"),
            ),
        ];
        let items = load(&files).unwrap();
        assert_eq!(names(&items), ["v1.b.io", "v1.z.io"]);
        // First definition in file-name order wins.
        assert_eq!(items[0].spec.as_ref().unwrap().version_priority, 10);

        let broken = [files[0].clone(), file("c.yaml", "kind: [")];
        let errors = load(&broken).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().starts_with("/m/c.yaml:"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn scan_reads_manifests_follows_symlinks_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("b.yaml"), "b").unwrap();
        std::fs::write(d.join("a.json"), "a").unwrap();
        std::fs::write(d.join("c.yml"), "c").unwrap();
        std::fs::write(d.join(".hidden.yaml"), "h").unwrap();
        std::fs::write(d.join("notes.txt"), "n").unwrap();
        std::fs::create_dir(d.join("sub.yaml")).unwrap();
        std::fs::create_dir(d.join("..2024_a")).unwrap();
        std::fs::write(d.join("..2024_a/x.yaml"), "x").unwrap();
        symlink("..2024_a", d.join("..data")).unwrap();
        symlink("..data/x.yaml", d.join("x.yaml")).unwrap();
        symlink("..data/gone.yaml", d.join("gone.yaml")).unwrap();
        let files = scan(d).unwrap();
        let got: Vec<_> = files
            .iter()
            .map(|f| {
                (
                    f.path.file_name().unwrap().to_str().unwrap(),
                    f.text.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a.json", "a"),
                ("b.yaml", "b"),
                ("c.yml", "c"),
                ("x.yaml", "x")
            ]
        );

        let err = scan(&d.join("missing")).unwrap_err();
        assert!(matches!(err, SourceError::ReadDir { .. }), "{err}");
    }

    async fn next_set(rx: &mut watch::Receiver<Option<ApiServiceSet>>) -> Vec<String> {
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("a new set within 5s")
            .unwrap();
        let set = rx.borrow_and_update();
        names(set.as_ref().expect("a set"))
    }

    /// Swaps `..data` to a new timestamped directory the way the kubelet does: build the new
    /// directory, point a temporary symlink at it, rename the symlink over `..data`.
    fn kubelet_swap(d: &Path, new_dir: &str) {
        symlink(new_dir, d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    }

    #[tokio::test]
    async fn configmap_symlink_swap_bad_file_and_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_owned();
        std::fs::create_dir(d.join("..2024_a")).unwrap();
        std::fs::write(d.join("..2024_a/x.yaml"), api_service("v1.a.io")).unwrap();
        symlink("..2024_a", d.join("..data")).unwrap();
        symlink("..data/x.yaml", d.join("x.yaml")).unwrap();

        let (tx, mut rx) = super::super::channel();
        let task = tokio::spawn(run(d.clone(), tx));
        assert_eq!(next_set(&mut rx).await, ["v1.a.io"]);

        // ConfigMap update: new content appears through the swapped ..data link.
        std::fs::create_dir(d.join("..2024_b")).unwrap();
        std::fs::write(
            d.join("..2024_b/x.yaml"),
            format!("{}---\n{}", api_service("v1.a.io"), api_service("v1.b.io")),
        )
        .unwrap();
        kubelet_swap(&d, "..2024_b");
        assert_eq!(next_set(&mut rx).await, ["v1.a.io", "v1.b.io"]);

        // A broken update keeps the last good set.
        std::fs::create_dir(d.join("..2024_c")).unwrap();
        std::fs::write(d.join("..2024_c/x.yaml"), "kind: APIService\nspec: [\n").unwrap();
        kubelet_swap(&d, "..2024_c");
        let unchanged = tokio::time::timeout(Duration::from_millis(800), rx.changed()).await;
        assert!(unchanged.is_err(), "a broken file must not publish");
        assert_eq!(names(rx.borrow().as_ref().unwrap()), ["v1.a.io", "v1.b.io"]);

        // Fixing it publishes again; so does adding a plain file next to the symlinks.
        std::fs::create_dir(d.join("..2024_d")).unwrap();
        std::fs::write(d.join("..2024_d/x.yaml"), api_service("v1.d.io")).unwrap();
        kubelet_swap(&d, "..2024_d");
        assert_eq!(next_set(&mut rx).await, ["v1.d.io"]);
        std::fs::write(d.join("y.json"), api_service("v1.e.io")).unwrap();
        assert_eq!(next_set(&mut rx).await, ["v1.d.io", "v1.e.io"]);

        drop(rx);
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("stops when nobody listens")
            .unwrap();
    }

    #[tokio::test]
    async fn broken_directory_at_start_publishes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "kind: APIService\nspec: [\n").unwrap();
        let (tx, mut rx) = super::super::channel();
        let task = tokio::spawn(run(dir.path().to_owned(), tx));
        let r = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        assert!(r.is_err());
        assert!(
            rx.borrow().is_none(),
            "no set until the manifests are valid"
        );
        std::fs::write(dir.path().join("a.yaml"), api_service("v1.a.io")).unwrap();
        assert_eq!(next_set(&mut rx).await, ["v1.a.io"]);
        task.abort();
    }

    #[test]
    fn run_is_a_spawnable_future() {
        fn assert_spawnable<T: Future + Send + 'static>(_: T) {}
        let (tx, _rx) = super::super::channel();
        assert_spawnable(run(PathBuf::from("/nonexistent"), tx));
    }

    #[tokio::test]
    async fn empty_directory_is_an_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = super::super::channel();
        let task = tokio::spawn(run(dir.path().to_owned(), tx));
        assert_eq!(next_set(&mut rx).await, Vec::<String>::new());
        task.abort();
    }
}
