//! Noticing that certificate files changed: a directory watch plus a periodic re-read, and what
//! to log about a certificate that was picked up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::CertificateDer;

/// How often watched certificate files are re-read even without a file event, as
/// kube-apiserver's dynamic certificate controllers do (`--cert-reload-interval`).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

/// Calls `on_change` whenever the content of `files` changes: on a file event in their
/// directories (debounced), and on a re-read every `resync`.
///
/// Why both: Kubernetes swaps a mounted Secret through a `..data` symlink, which shows up as
/// events on the directory rather than on the file, so the directory is watched. But a watch is
/// tied to the directory it was placed on: when that directory is replaced (renamed away and a
/// new one put in its place), or the files are rewritten inside a folder the watched directory
/// only links to, no event ever arrives and reloads would silently stop. The periodic re-read
/// catches those within one period. `on_change` runs only when some file's bytes differ from the
/// last look, so a quiet period costs a few small reads and logs nothing. Dropping the returned
/// watcher stops both.
pub fn watch_files(
    files: &[PathBuf],
    resync: Duration,
    on_change: impl Fn() + Send + 'static,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if !event.kind.is_access() {
                let _ = tx.send(());
            }
        }
    })?;
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            }
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
    }
    let files = files.to_vec();
    let read_all =
        move || -> Vec<Option<Vec<u8>>> { files.iter().map(|f| std::fs::read(f).ok()).collect() };
    let mut last = read_all();
    std::thread::Builder::new()
        .name("tls-file-watch".into())
        .spawn(move || loop {
            use std::sync::mpsc::RecvTimeoutError;
            match rx.recv_timeout(resync) {
                // Writers often touch a file several times (truncate, write, rename); wait until
                // they have been quiet briefly so we read the final content once.
                Ok(()) => while rx.recv_timeout(Duration::from_millis(200)).is_ok() {},
                Err(RecvTimeoutError::Timeout) => {}
                // The watcher was dropped.
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let now = read_all();
            if now != last {
                last = now;
                on_change();
            }
        })
        .expect("spawning a thread");
    Ok(watcher)
}

/// What identifies a certificate in a log line: its serial number (hex, as `openssl x509
/// -serial` prints it) and when it expires (as `openssl x509 -enddate` prints it).
/// The certificate's notAfter as Unix seconds, for the expiry metrics; `None` if it does not
/// parse.
pub fn not_after_unix(cert: &CertificateDer<'_>) -> Option<i64> {
    x509_parser::parse_x509_certificate(cert)
        .ok()
        .map(|(_, c)| c.validity().not_after.timestamp())
}

pub fn describe(cert: &CertificateDer<'_>) -> (String, String) {
    match x509_parser::parse_x509_certificate(cert) {
        Ok((_, c)) => (
            c.raw_serial_as_string().replace(':', "").to_uppercase(),
            c.validity().not_after.to_string(),
        ),
        Err(_) => ("unknown".into(), "unknown".into()),
    }
}
