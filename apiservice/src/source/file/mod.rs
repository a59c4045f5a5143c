//! APIServices from a directory of manifests, for gateways that front a server without the
//! `apiregistration.k8s.io` API (or that should not depend on it).
//!
//! Every `*.yaml`, `*.yml` and `*.json` file in the directory is read the way `kubectl apply -f`
//! reads it: several documents per file (`---`), `kind: List` / `APIServiceList` with `items`,
//! documents of other kinds ignored. Parsing one file is [`manifest`]'s job; this module owns the
//! directory: watching it, scanning it, and remembering each file's last good APIServices.
//!
//! A problem stays where it is: one bad manifest must not take the other APIServices down (nor,
//! at start, keep the gateway from ever becoming ready). So each file, and each APIService in it,
//! stands alone:
//! - an APIService that breaks validation (or has a wrong `apiVersion`) is refused;
//! - a file that cannot be read or parsed (a YAML syntax error, a string where a number belongs)
//!   is refused as a whole, since nothing in it can be trusted.
//!
//! Every refusal is logged at error with the file, line and what to fix, and published in the set
//! (see [`Refusal`]) so the gateway counts it in its metrics. The valid rest is published.
//!
//! What a refusal does to what was routed before: an edit is treated the way the API server treats
//! `kubectl apply` of an invalid object — it is refused, and the previous object stays. Someone
//! editing a ConfigMap expects a typo to leave the API they already had working, not to unregister
//! it; the error line and the metric tell them the edit did not apply. So a refused APIService keeps
//! the last good version that *the same file* held under the same name, and an unparsable file keeps
//! every APIService it last yielded. Without a good version (a new APIService, or a refusal found at
//! start, when nothing earlier is known) the APIService is simply not routed. Removing a file or an
//! APIService from it is never a refusal: it goes away.
//!
//! The directory is usually a mounted ConfigMap, where the kubelet updates files by writing a new
//! timestamped directory and atomically swapping the `..data` symlink; the visible names are
//! symlinks `x.yaml -> ..data/x.yaml`. So we watch the *directory* (a watch on a file would keep
//! following the old inode), follow symlinks when reading, and skip dot-entries (`..data`,
//! `..2024_…`, editor swap files). Events are debounced because one swap produces a burst of them.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tracing::{debug, error, info, warn, Instrument};

use super::{publish, SetSender, SourceError};
use crate::model::APIService;

mod manifest;
mod set;

pub use manifest::{parse_manifests, Found};
use set::SetBuilder;
pub use set::{Loaded, Problem};

/// How long to wait after a change event before reading, so a burst (a ConfigMap swap, an editor
/// writing a temp file then renaming) is read once, complete.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Re-scan interval. A deliberate safety net, not the change mechanism: inotify misses changes
/// made through paths it does not watch (a symlink target edited in place outside the directory,
/// a directory deleted and re-created, network filesystems), and the watch itself can fail to
/// start. The content hash makes a re-scan that finds nothing new cost one directory read.
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// Watches `dir` and publishes its APIServices on `tx`: once after the first successful directory
/// read (even if some manifests in it are refused), then after every change that yields a
/// different set. Runs until every receiver is gone.
///
/// The future runs in an `apiservice_source` span naming the source and the directory, wherever
/// it is spawned, so its log lines need not repeat them.
pub fn run(dir: PathBuf, tx: SetSender) -> impl Future<Output = ()> + Send + 'static {
    let span = tracing::info_span!("apiservice_source", source = "file", dir = %dir.display());
    watch_dir(dir, tx).instrument(span)
}

async fn watch_dir(dir: PathBuf, tx: SetSender) {
    let changed = Arc::new(Notify::new());
    let mut watcher = start_watch(&dir, &changed);
    let mut last_hash = None;
    let mut loader = Loader::default();
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
        reload(&dir, &tx, &mut last_hash, &mut loader).await;
    }
}

/// Watches the directory itself (not its files; see the module comment). `None` when the watch
/// cannot start: the periodic re-scan still notices changes, and retries the watch.
fn start_watch(dir: &Path, changed: &Arc<Notify>) -> Option<RecommendedWatcher> {
    let notify = Arc::clone(changed);
    // The handler runs on the watcher's own thread: give its log line the source's span.
    let span = tracing::Span::current();
    let handler = move |res: notify::Result<notify::Event>| match res {
        Ok(event) if is_change(&event.kind) => notify.notify_one(),
        Ok(_) => {}
        Err(error) => span.in_scope(|| warn!(%error, "manifest directory watch reported an error")),
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

/// Reads the directory and publishes the result if it differs from the current set. Content that
/// did not change since the last attempt is not parsed again, so a broken file is reported once
/// per edit, not every re-scan.
async fn reload(dir: &Path, tx: &SetSender, last_hash: &mut Option<u64>, loader: &mut Loader) {
    let scan_dir = dir.to_owned();
    // A blocking task does not inherit the caller's span; carry it over.
    let span = tracing::Span::current();
    let scanned = match tokio::task::spawn_blocking(move || span.in_scope(|| scan(&scan_dir))).await
    {
        Ok(scanned) => scanned,
        Err(join) => {
            error!(error = %join, "manifest directory scan did not complete");
            return;
        }
    };
    let scanned = match scanned {
        Ok(scanned) => scanned,
        Err(error) => {
            *last_hash = None;
            error!(%error, "cannot read the APIService manifest directory; keeping the last set");
            return;
        }
    };
    let hash = content_hash(&scanned);
    if *last_hash == Some(hash) {
        return;
    }
    *last_hash = Some(hash);

    let loaded = loader.load(scanned);
    for problem in &loaded.problems {
        problem.log();
    }
    let refused = loaded.problems.len();
    let count = loaded.set.apiservices.len();
    if publish(tx, loaded.set) {
        info!(count, refused, "loaded APIService manifests");
    }
}

/// One manifest file's path and content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ManifestFile {
    pub path: PathBuf,
    pub text: String,
}

/// A directory listing: the manifest files that could be read, and the ones that could not.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Sorted by file name.
    pub files: Vec<ManifestFile>,
    /// Files that exist but could not be read (permissions, I/O errors).
    pub unreadable: Vec<(PathBuf, io::Error)>,
}

fn is_manifest_name(name: &str) -> bool {
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// Lists and reads the manifest files of `dir`, sorted by file name. Only a directory that cannot
/// be listed is an error; a file that cannot be read is reported in [`Scanned::unreadable`].
///
/// Symlinks are followed (ConfigMap mounts are all symlinks). A symlink whose target is gone is
/// skipped: during a ConfigMap update the link of a removed key dangles for a moment.
pub fn scan(dir: &Path) -> Result<Scanned, SourceError> {
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

    let mut scanned = Scanned::default();
    for name in names {
        let path = dir.join(&name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                debug!(path = %path.display(), "skipping dangling symlink");
                continue;
            }
            Err(e) => {
                scanned.unreadable.push((path, e));
                continue;
            }
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => scanned.files.push(ManifestFile { path, text }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => scanned.unreadable.push((path, e)),
        }
    }
    Ok(scanned)
}

fn content_hash(scanned: &Scanned) -> u64 {
    let mut h = DefaultHasher::new();
    scanned.files.hash(&mut h);
    for (path, e) in &scanned.unreadable {
        path.hash(&mut h);
        e.to_string().hash(&mut h);
    }
    h.finish()
}

/// Turns directory contents into the set to publish, remembering per file the APIServices it last
/// yielded, so that a refused edit keeps them (see the module comment).
#[derive(Debug, Default)]
pub struct Loader {
    /// File → its APIServices as last published (valid ones only).
    last_good: HashMap<PathBuf, Vec<APIService>>,
    /// APIService name → the file its routed definition came from, to keep routing that one
    /// when another file defines the name too (see `set`).
    routed_from: HashMap<String, PathBuf>,
}

impl Loader {
    /// Every file parsed and every APIService validated, each problem on its own. A name defined
    /// twice keeps the definition routed before (the first in file-name order when none was);
    /// the other is refused with an error naming both places.
    pub fn load(&mut self, scanned: Scanned) -> Loaded {
        let mut outcomes: Vec<(PathBuf, Result<Vec<Found>, SourceError>)> = scanned
            .files
            .into_iter()
            .map(|f| {
                let parsed = parse_manifests(&f.path, &f.text);
                (f.path, parsed)
            })
            .chain(scanned.unreadable.into_iter().map(|(path, source)| {
                let error = SourceError::ReadFile {
                    path: path.clone(),
                    source,
                };
                (path, Err(error))
            }))
            .collect();
        outcomes.sort_by(|a, b| a.0.cmp(&b.0));

        let mut set = SetBuilder::default();
        let mut last_good = HashMap::new();
        for (path, outcome) in outcomes {
            let previous = self.last_good.remove(&path).unwrap_or_default();
            let good = match outcome {
                Err(error) => {
                    for api in &previous {
                        set.add(api.clone(), &path, format!("{} (kept)", path.display()));
                    }
                    set.refuse_file(&path, error, previous.len());
                    previous
                }
                Ok(found) => {
                    let mut good = Vec::new();
                    for Found { name, line, api } in found {
                        let here = origin(&path, line);
                        match (api, name) {
                            (Ok(api), _) => {
                                good.push(api.clone());
                                set.add(api, &path, here);
                            }
                            (Err(error), Some(name)) => {
                                let kept = previous
                                    .iter()
                                    .find(|a| a.metadata.name.as_deref() == Some(name.as_str()))
                                    .cloned();
                                if let Some(kept) = &kept {
                                    good.push(kept.clone());
                                    set.add(kept.clone(), &path, format!("{here} (kept)"));
                                }
                                set.refuse_api_service(name, error, kept.is_some());
                            }
                            // No name to report it under: the file is the unit.
                            (Err(error), None) => set.refuse_file(&path, error, 0),
                        }
                    }
                    good
                }
            };
            last_good.insert(path, good);
        }
        self.last_good = last_good;
        let (loaded, routed_from) = set.finish(&self.routed_from);
        self.routed_from = routed_from;
        loaded
    }
}

/// `path:line`, for messages.
fn origin(path: &Path, line: Option<u64>) -> String {
    match line {
        Some(l) => format!("{}:{l}", path.display()),
        None => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{ApiServiceSet, Refusal, SetReceiver};
    use std::os::unix::fs::symlink;

    /// A valid APIService manifest `name` (`<version>.<group>`), local (no Service).
    pub(super) fn api_service(name: &str) -> String {
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

    fn scanned(files: &[ManifestFile]) -> Scanned {
        Scanned {
            files: files.to_vec(),
            unreadable: Vec::new(),
        }
    }

    fn bad_priority(name: &str) -> String {
        api_service(name).replace("groupPriorityMinimum: 100", "groupPriorityMinimum: 0")
    }

    /// The routed APIServices (plain, or the last good version of a refused one) with their
    /// `versionPriority`, and the refusals (file paths and APIService names), as the gateway
    /// reads them from the set.
    fn routed_and_refused(set: &ApiServiceSet) -> (Vec<(String, i32)>, Vec<String>) {
        let routed: Vec<(String, i32)> = set
            .apiservices
            .iter()
            .map(|api| {
                (
                    api.metadata.name.clone().unwrap(),
                    api.spec.as_ref().unwrap().version_priority,
                )
            })
            .collect();
        let refusals = set
            .refused
            .iter()
            .map(|refusal| match refusal {
                Refusal::File { path, .. } => path.display().to_string(),
                Refusal::ApiService { name, kept, .. } => {
                    // `kept` says whether the set routes a last good version; it must not lie.
                    assert_eq!(*kept, routed.iter().any(|(n, _)| n == name), "{name}");
                    name.clone()
                }
            })
            .collect();
        (routed, refusals)
    }

    #[test]
    fn load_sorts_dedups_and_skips_only_what_is_invalid() {
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
        let loaded = Loader::default().load(scanned(&files));
        assert_eq!(names(&loaded.set.apiservices), ["v1.b.io", "v1.z.io"]);
        // Nothing was routed before: the first definition in file-name order is, and the
        // other is refused naming both places.
        let (_, refused) = routed_and_refused(&loaded.set);
        assert_eq!(refused, ["v1.b.io"]);
        assert_eq!(loaded.problems.len(), 1);
        assert_eq!(
            loaded.problems[0].error.to_string(),
            "/m/b.yaml:1: APIService \"v1.b.io\" is also defined at /m/a.yaml:11, which stays \
             routed; remove one of the two definitions (an APIService name must be unique across \
             the directory)"
        );
        assert_eq!(
            loaded.set.apiservices[0]
                .spec
                .as_ref()
                .unwrap()
                .version_priority,
            10
        );

        // At start (nothing known before): a broken file and an invalid APIService are skipped,
        // everything else is published, and each problem names its file.
        let mixed = [
            files[0].clone(),
            file("c.yaml", "kind: ["),
            file(
                "d.yaml",
                &format!(
                    "{}---\n{}",
                    bad_priority("v1.bad.io"),
                    api_service("v1.d.io")
                ),
            ),
        ];
        let loaded = Loader::default().load(scanned(&mixed));
        let (routed, refused) = routed_and_refused(&loaded.set);
        assert_eq!(
            routed,
            [
                ("v1.b.io".into(), 10),
                ("v1.d.io".into(), 10),
                ("v1.z.io".into(), 10)
            ]
        );
        assert_eq!(refused, ["/m/c.yaml", "v1.bad.io"]);
        let errors: Vec<String> = loaded
            .problems
            .iter()
            .map(|p| p.error.to_string())
            .collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("/m/c.yaml:"), "{errors:?}");
        assert!(
            errors[1].starts_with("/m/d.yaml:1: ")
                && errors[1].contains("spec.groupPriorityMinimum: Invalid value: 0"),
            "{errors:?}"
        );
        assert_eq!(loaded.problems[1].api_service.as_deref(), Some("v1.bad.io"));
    }

    /// A file sorting earlier that defines a routed name again does not take it over: the
    /// routed definition stays, the new one is refused naming both files, and removing either
    /// leaves the other routed without complaint.
    #[test]
    fn a_duplicate_name_keeps_the_definition_that_was_routed() {
        let mut loader = Loader::default();
        let working = file("z.yaml", &api_service("v1.a.io"));
        loader.load(scanned(std::slice::from_ref(&working)));

        let copy = file(
            "a.yaml",
            &api_service("v1.a.io").replace("versionPriority: 10", "versionPriority: 99"),
        );
        let both = [copy.clone(), working.clone()];
        for _ in 0..2 {
            let loaded = loader.load(scanned(&both));
            let (routed, refused) = routed_and_refused(&loaded.set);
            assert_eq!(routed, [("v1.a.io".into(), 10)]);
            assert_eq!(refused, ["v1.a.io"]);
            let error = loaded.problems[0].error.to_string();
            assert!(
                error.starts_with("/m/a.yaml:1: ") && error.contains("also defined at /m/z.yaml:1"),
                "{error}"
            );
        }

        let loaded = loader.load(scanned(&[copy]));
        assert!(loaded.problems.is_empty());
        assert_eq!(
            routed_and_refused(&loaded.set),
            (vec![("v1.a.io".into(), 99)], vec![])
        );
    }

    #[test]
    fn a_refused_edit_keeps_the_last_good_version_from_the_same_file() {
        let mut loader = Loader::default();
        let good = [
            file(
                "a.yaml",
                &format!("{}---\n{}", api_service("v1.a.io"), api_service("v1.b.io")),
            ),
            file("c.yaml", &api_service("v1.c.io")),
        ];
        loader.load(scanned(&good));

        // v1.a.io's edit is invalid; v1.b.io's valid edit applies; c.yaml no longer parses.
        let edited = [
            file(
                "a.yaml",
                &format!(
                    "{}---\n{}",
                    bad_priority("v1.a.io"),
                    api_service("v1.b.io").replace("versionPriority: 10", "versionPriority: 20")
                ),
            ),
            file("c.yaml", "apiVersion: [\n"),
        ];
        let loaded = loader.load(scanned(&edited));
        let (routed, refused) = routed_and_refused(&loaded.set);
        assert_eq!(
            routed,
            [
                ("v1.a.io".into(), 10),
                ("v1.b.io".into(), 20),
                ("v1.c.io".into(), 10)
            ]
        );
        assert_eq!(refused, ["/m/c.yaml", "v1.a.io"]);
        assert_eq!(
            loaded.problems.iter().map(|p| p.kept).collect::<Vec<_>>(),
            [1, 1]
        );

        // A second bad edit still keeps the first good version.
        let loaded = loader.load(scanned(&edited));
        assert_eq!(routed_and_refused(&loaded.set).0.len(), 3);

        // The last good version is per file: a new invalid definition elsewhere keeps nothing, and
        // removing the file removes its APIServices, kept or not.
        let moved = [file("b.yaml", &bad_priority("v1.c.io"))];
        let loaded = loader.load(scanned(&moved));
        let (routed, refused) = routed_and_refused(&loaded.set);
        assert!(routed.is_empty(), "{routed:?}");
        assert_eq!(refused, ["v1.c.io"]);

        // Fixed: published plainly again, nothing reported.
        let fixed = [file("b.yaml", &api_service("v1.c.io"))];
        let loaded = loader.load(scanned(&fixed));
        assert!(loaded.problems.is_empty());
        assert_eq!(
            routed_and_refused(&loaded.set),
            (vec![("v1.c.io".into(), 10)], vec![])
        );
    }

    #[test]
    fn unreadable_and_unnamed_are_refused_per_file() {
        let loaded = Loader::default().load(Scanned {
            files: vec![
                file("a.yaml", &api_service("v1.a.io")),
                file(
                    "b.yaml",
                    "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nspec:\n  group: b.io\n",
                ),
            ],
            unreadable: vec![(
                PathBuf::from("/m/c.yaml"),
                io::Error::from(io::ErrorKind::PermissionDenied),
            )],
        });
        let (routed, refused) = routed_and_refused(&loaded.set);
        assert_eq!(routed, [("v1.a.io".into(), 10)]);
        assert_eq!(refused, ["/m/b.yaml", "/m/c.yaml"]);
        assert!(loaded.problems.iter().all(|p| p.api_service.is_none()));
        assert!(
            loaded.problems[1]
                .error
                .to_string()
                .starts_with("cannot read /m/c.yaml: "),
            "{}",
            loaded.problems[1].error
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
        std::fs::write(d.join("locked.yaml"), "l").unwrap();
        std::fs::set_permissions(
            d.join("locked.yaml"),
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        let scanned = scan(d).unwrap();
        let got: Vec<_> = scanned
            .files
            .iter()
            .map(|f| {
                (
                    f.path.file_name().unwrap().to_str().unwrap(),
                    f.text.as_str(),
                )
            })
            .collect();
        let readable = [
            ("a.json", "a"),
            ("b.yaml", "b"),
            ("c.yml", "c"),
            ("x.yaml", "x"),
        ];
        let got: Vec<_> = got
            .into_iter()
            .filter(|(n, _)| *n != "locked.yaml")
            .collect();
        assert_eq!(got, readable);

        // Root reads anything; elsewhere the locked file is reported, not fatal.
        if std::fs::read(d.join("locked.yaml")).is_err() {
            assert_eq!(scanned.unreadable.len(), 1);
            assert_eq!(scanned.unreadable[0].0, d.join("locked.yaml"));
        }

        let err = scan(&d.join("missing")).unwrap_err();
        assert!(matches!(err, SourceError::ReadDir { .. }), "{err}");
    }

    async fn next_set(rx: &mut SetReceiver) -> Vec<String> {
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("a new set within 5s")
            .unwrap();
        let set = rx.borrow_and_update();
        names(&set.as_ref().expect("a set").apiservices)
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

        // A broken update keeps what the file held before, and reports the file.
        std::fs::create_dir(d.join("..2024_c")).unwrap();
        std::fs::write(d.join("..2024_c/x.yaml"), "kind: APIService\nspec: [\n").unwrap();
        kubelet_swap(&d, "..2024_c");
        next_set(&mut rx).await;
        let (routed, refused) = routed_and_refused(rx.borrow().as_ref().unwrap());
        assert_eq!(routed, [("v1.a.io".into(), 10), ("v1.b.io".into(), 10)]);
        assert_eq!(refused, [d.join("x.yaml").display().to_string()]);

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
    async fn a_broken_file_at_start_does_not_hold_back_the_others() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "kind: APIService\nspec: [\n").unwrap();
        std::fs::write(dir.path().join("b.yaml"), bad_priority("v1.bad.io")).unwrap();
        std::fs::write(dir.path().join("c.yaml"), api_service("v1.c.io")).unwrap();
        let (tx, mut rx) = super::super::channel();
        let task = tokio::spawn(run(dir.path().to_owned(), tx));
        next_set(&mut rx).await;
        let (routed, refused) = routed_and_refused(rx.borrow().as_ref().unwrap());
        assert_eq!(routed, [("v1.c.io".into(), 10)]);
        assert_eq!(
            refused,
            [
                dir.path().join("a.yaml").display().to_string(),
                "v1.bad.io".into()
            ]
        );

        std::fs::write(dir.path().join("a.yaml"), api_service("v1.a.io")).unwrap();
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        assert_eq!(next_set(&mut rx).await, ["v1.a.io", "v1.c.io"]);
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
