//! The end-to-end harness: starts real processes (the gateway binary, the fixture servers, kubectl)
//! and drives them like a user would, with real clients.
//!
//! Design choices worth knowing:
//! - Every child process is a [`Process`]: killed on drop, stdout/stderr captured line by line into
//!   a shared buffer by background threads. When a test panics, each `Process` it owned prints its
//!   logs while being dropped, so a failure shows what the servers said without extra code.
//! - Ports are always OS-assigned (port 0); processes announce their address on a log line that the
//!   harness parses (`listening on 127.0.0.1:PORT` for fixtures, a JSON `serving` event for the
//!   gateway).
//! - Binaries are found next to the running test executable (`target/<profile>/deps/<test>` →
//!   `target/<profile>/<name>`), because `CARGO_BIN_EXE_*` exists only at compile time of integration
//!   tests, not in this library. The gateway lives in another package, so cargo does not build it
//!   for our tests; [`ensure_gateway_built`] runs a nested `cargo build` once per test process (this
//!   does not deadlock: `cargo test` releases the build-directory lock before running tests).
//! - kubectl gets a fresh `HOME`, kubeconfig and `--cache-dir` per [`Kubectl`], because kubectl caches
//!   discovery for 6 hours and a stale cache would hide the requests a test means to exercise.
//! - Waiting is always polling with a deadline ([`wait_until`], [`Process::wait_for_line`]), never a
//!   blind sleep.

use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;

use crate::certs::{install_crypto, root_store, CertError, CertifiedPair};

/// How long a server may take to announce its address before the start counts as failed.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit for one kubectl invocation.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit for one raw HTTP exchange.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors from the harness. Process start failures carry the process's logs so the message alone
/// explains what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("binary not found: {0}")]
    Binary(String),
    #[error("{name} did not start: {reason}\n--- logs of {name} ---\n{logs}--- end of logs ---")]
    Start {
        name: String,
        reason: String,
        logs: String,
    },
    #[error("building the gateway failed: {0}")]
    Build(String),
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("HTTP request to {url} failed: {reason}")]
    Http { url: String, reason: String },
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let context = context.into();
    move |source| HarnessError::Io { context, source }
}

// ---- waiting ------------------------------------------------------------------------------------

/// Polls `check` every 100 ms until it returns true (→ `true`) or `timeout` passes (→ `false`).
/// The check runs at least once, and once more at the deadline, so a condition that becomes true
/// just in time is not missed.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep((deadline - now).min(Duration::from_millis(100))).await;
    }
}

// ---- locating binaries --------------------------------------------------------------------------

/// The `target/<profile>` directory of the running test executable.
pub fn target_profile_dir() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(io_err("locating the test executable"))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| HarnessError::Binary(format!("{} has no parent", exe.display())))?
        .to_path_buf();
    // Integration tests and unit tests run from target/<profile>/deps; binaries sit one level up.
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Path of a binary built into the same `target/<profile>` directory as the running test.
pub fn binary_path(name: &str) -> Result<PathBuf, HarnessError> {
    let path = target_profile_dir()?.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Binary(format!(
            "{} does not exist; build it with `cargo build --workspace --bins` \
             (cargo builds a package's own binaries for its integration tests only)",
            path.display()
        )))
    }
}

/// Name of the gateway binary (and of its package).
pub const GATEWAY_BIN: &str = "aggregation-gateway";

/// Builds the gateway binary once per test process and returns its path.
///
/// `cargo test -p e2e` does not build other packages' binaries, and a stale gateway makes failures
/// confusing, so the first caller runs `$CARGO build -p aggregation-gateway` with the same profile
/// and target directory as the running test. A nested cargo is safe: `cargo test` holds the build
/// lock only while compiling, not while tests run (verified with cargo 1.95). If another cargo holds
/// the lock, the nested build waits for it. Set `E2E_SKIP_GATEWAY_BUILD=1` to use the existing binary
/// as is. This blocks; call it from `spawn_blocking` in async code ([`Gateway::start`] does).
pub fn ensure_gateway_built() -> Result<PathBuf, HarnessError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_gateway().map_err(|e| match e {
                HarnessError::Build(message) => message,
                other => other.to_string(),
            })
        })
        .clone()
        .map_err(HarnessError::Build)
}

fn build_gateway() -> Result<PathBuf, HarnessError> {
    if std::env::var_os("E2E_SKIP_GATEWAY_BUILD").is_some_and(|v| v != "0" && !v.is_empty()) {
        return binary_path(GATEWAY_BIN);
    }
    let profile_dir = target_profile_dir()?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| HarnessError::Binary(format!("{} has no parent", profile_dir.display())))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        GATEWAY_BIN,
        "--bin",
        GATEWAY_BIN,
        "--target-dir",
    ])
    .arg(target_dir)
    .current_dir(workspace_root());
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    eprintln!("e2e harness: building {GATEWAY_BIN} (once per test process): {cmd:?}");
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running cargo to build the gateway"))?;
    if !output.status.success() {
        return Err(HarnessError::Build(format!(
            "`{cmd:?}` exited with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    binary_path(GATEWAY_BIN)
}

/// The workspace root (the parent of this package's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

// ---- processes ----------------------------------------------------------------------------------

/// Which output stream a captured line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One captured output line.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub stream: Stream,
    pub text: String,
    /// Time since the process was spawned.
    pub at: Duration,
}

struct Captured {
    lines: Mutex<Vec<LogLine>>,
    /// Bumped after every appended line and when a stream closes; async waiters watch it.
    changes: watch::Sender<u64>,
    /// Number of output streams still open; 0 means the log is complete (the process closed both).
    open: Mutex<usize>,
}

impl Captured {
    fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// A child process killed on drop, with its output captured line by line.
pub struct Process {
    name: String,
    child: Child,
    captured: Arc<Captured>,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// Kept so temporary files the process needs live as long as it does.
    keep: Vec<tempfile::TempDir>,
    /// Taken just before spawning; [`LogLine::at`] counts from here.
    spawned_at: Instant,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

impl Process {
    /// Spawns `cmd` with piped stdout/stderr and null stdin; `name` labels its logs.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<Process, HarnessError> {
        let started = Instant::now();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(io_err(format!("spawning {name} ({cmd:?})")))?;
        let (changes, _) = watch::channel(0);
        let captured = Arc::new(Captured {
            lines: Mutex::new(Vec::new()),
            changes,
            open: Mutex::new(2),
        });
        let mut readers = Vec::new();
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        for (stream, pipe) in [(Stream::Stdout, stdout), (Stream::Stderr, stderr)] {
            let captured = Arc::clone(&captured);
            let Some(pipe) = pipe else {
                *lock(&captured.open) -= 1;
                continue;
            };
            // Threads rather than tasks: capture must continue while a test blocks its runtime
            // (e.g. in a synchronous wait) and must not depend on which runtime spawned the process.
            readers.push(std::thread::spawn(move || {
                let mut reader = BufReader::new(pipe);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match reader.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let text = String::from_utf8_lossy(&buf)
                                .trim_end_matches(['\n', '\r'])
                                .to_owned();
                            lock(&captured.lines).push(LogLine {
                                stream,
                                text,
                                at: started.elapsed(),
                            });
                            captured.bump();
                        }
                    }
                }
                *lock(&captured.open) -= 1;
                captured.bump();
            }));
        }
        Ok(Process {
            name: name.to_owned(),
            child,
            captured,
            readers,
            keep: Vec::new(),
            spawned_at: started,
        })
    }

    /// Ties the lifetime of `dir` to the process (e.g. a kubeconfig or certificate directory).
    pub fn keep_dir(&mut self, dir: tempfile::TempDir) {
        self.keep.push(dir);
    }

    /// The label given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// When the process was spawned: the origin of [`LogLine::at`], for timing start-up.
    pub fn spawned_at(&self) -> Instant {
        self.spawned_at
    }

    /// A copy of every line captured so far.
    pub fn lines(&self) -> Vec<LogLine> {
        lock(&self.captured.lines).clone()
    }

    /// Number of lines captured so far; pass it to [`Process::wait_for_line_from`] to wait only for
    /// output produced after this point.
    pub fn line_count(&self) -> usize {
        lock(&self.captured.lines).len()
    }

    /// Captured stdout, one line per line.
    pub fn stdout(&self) -> String {
        self.joined(Some(Stream::Stdout))
    }

    /// Captured stderr, one line per line.
    pub fn stderr(&self) -> String {
        self.joined(Some(Stream::Stderr))
    }

    /// All captured output, interleaved in arrival order, each line tagged with its stream.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for line in lock(&self.captured.lines).iter() {
            let tag = match line.stream {
                Stream::Stdout => "out",
                Stream::Stderr => "err",
            };
            out.push_str(&format!(
                "[{} {tag} {:>7.3}s] {}\n",
                self.name,
                line.at.as_secs_f64(),
                line.text
            ));
        }
        out
    }

    fn joined(&self, stream: Option<Stream>) -> String {
        let mut out = String::new();
        for line in lock(&self.captured.lines).iter() {
            if stream.is_none_or(|s| s == line.stream) {
                out.push_str(&line.text);
                out.push('\n');
            }
        }
        out
    }

    /// Waits until any captured line (from the start, either stream) satisfies `pred` and returns
    /// it; `None` after `timeout`, or as soon as the process has closed its output without such a
    /// line (so a crashed server fails fast instead of after the timeout).
    pub async fn wait_for_line(
        &self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        self.wait_for_line_from(0, None, pred, timeout)
            .await
            .map(|(_, text)| text)
    }

    /// Like [`Process::wait_for_line`], but considers only lines with index ≥ `start` and, if
    /// given, only one stream. Returns the index of the matching line and its text.
    pub async fn wait_for_line_from(
        &self,
        start: usize,
        stream: Option<Stream>,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<(usize, String)> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.captured.changes.subscribe();
        let mut next = start;
        loop {
            changes.borrow_and_update();
            if let Some(found) = self.scan(&mut next, stream, &pred) {
                return Some(found);
            }
            if *lock(&self.captured.open) == 0 {
                // Output is complete; one more scan covers lines appended before the close.
                return self.scan(&mut next, stream, &pred);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.scan(&mut next, stream, &pred),
            }
        }
    }

    /// Blocking form of [`Process::wait_for_line`] for synchronous tests.
    pub fn wait_for_line_blocking(
        &self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut next = 0;
        loop {
            if let Some((_, text)) = self.scan(&mut next, None, &pred) {
                return Some(text);
            }
            if *lock(&self.captured.open) == 0 || Instant::now() >= deadline {
                return self.scan(&mut next, None, &pred).map(|(_, t)| t);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn scan(
        &self,
        next: &mut usize,
        stream: Option<Stream>,
        pred: &impl Fn(&str) -> bool,
    ) -> Option<(usize, String)> {
        let lines = lock(&self.captured.lines);
        while *next < lines.len() {
            let index = *next;
            *next += 1;
            let line = &lines[index];
            if stream.is_none_or(|s| s == line.stream) && pred(&line.text) {
                return Some((index, line.text.clone()));
            }
        }
        None
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends a signal by name (e.g. `"TERM"`, `"INT"`, `"HUP"`), for graceful-shutdown and reload
    /// tests. Uses the `kill` utility to avoid a libc dependency.
    pub fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .map_err(io_err("running kill"))?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::Io {
                context: format!("kill -{signal} {}", self.child.id()),
                source: std::io::Error::other(format!("exited with {status}")),
            })
        }
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process (if still running) and reaps it.
    pub fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        // Wait briefly for the readers so the log is complete before printing it, but not forever:
        // a grandchild that inherited the pipes keeps them open after the child dies.
        let deadline = Instant::now() + Duration::from_secs(1);
        while *lock(&self.captured.open) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for reader in self.readers.drain(..) {
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- logs of {} (test failed) ---\n{}--- end ---",
                self.name,
                self.logs()
            );
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking test thread must not hide the logs from everyone else.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---- fixture servers ----------------------------------------------------------------------------

/// Parses a fixture's `listening on 127.0.0.1:PORT` line (a scheme prefix such as
/// `https://127.0.0.1:PORT` is accepted too). Returns the scheme if the line names one.
pub fn parse_listening_line(line: &str) -> Option<(Option<&str>, SocketAddr)> {
    let rest = line[line.find("listening on ")? + "listening on ".len()..].trim();
    let token = rest.split_whitespace().next()?;
    let (scheme, addr) = match token.split_once("://") {
        Some((scheme, addr)) => (Some(scheme), addr),
        None => (None, token),
    };
    Some((scheme, addr.trim_end_matches('/').parse().ok()?))
}

/// A running fixture server: its process and the address it announced.
#[derive(Debug)]
pub struct FixtureServer {
    pub process: Process,
    pub addr: SocketAddr,
    /// `http` or `https`: taken from the listening line, otherwise `https` when a `--tls…` flag
    /// was passed, else `http`.
    pub scheme: String,
}

impl FixtureServer {
    /// Starts `binary` with `args` and waits for its listening line.
    pub async fn start_binary(
        name: &str,
        binary: &Path,
        args: &[&str],
    ) -> Result<FixtureServer, HarnessError> {
        let mut cmd = Command::new(binary);
        cmd.args(args);
        let process = Process::spawn(name, cmd)?;
        let line = process
            .wait_for_line_from(
                0,
                Some(Stream::Stdout),
                |l| parse_listening_line(l).is_some(),
                STARTUP_TIMEOUT,
            )
            .await;
        let Some((scheme, addr)) = line.as_ref().and_then(|(_, l)| parse_listening_line(l)) else {
            return Err(start_failure(
                process,
                "no `listening on ADDR` line on stdout",
                STARTUP_TIMEOUT,
            ));
        };
        let scheme = scheme.map(str::to_owned).unwrap_or_else(|| {
            if args.iter().any(|a| a.starts_with("--tls")) {
                "https"
            } else {
                "http"
            }
            .into()
        });
        Ok(FixtureServer {
            process,
            addr,
            scheme,
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }
}

fn start_failure(mut process: Process, reason: &str, timeout: Duration) -> HarnessError {
    let status = process.try_wait();
    let reason = match status {
        Some(status) => format!("{reason} (exited with {status})"),
        None => format!("{reason} within {timeout:?}"),
    };
    process.kill();
    HarnessError::Start {
        name: process.name.clone(),
        reason,
        logs: process.logs(),
    }
}

/// The core API server fixture (`fixture-core`).
#[derive(Debug)]
pub struct FixtureCore(pub FixtureServer);

impl FixtureCore {
    pub async fn start(args: &[&str]) -> Result<FixtureCore, HarnessError> {
        let binary = binary_path("fixture-core")?;
        FixtureServer::start_binary("fixture-core", &binary, args)
            .await
            .map(FixtureCore)
    }
}

/// An aggregated API server fixture (`fixture-aggregated`).
#[derive(Debug)]
pub struct FixtureAggregated(pub FixtureServer);

impl FixtureAggregated {
    pub async fn start(args: &[&str]) -> Result<FixtureAggregated, HarnessError> {
        let binary = binary_path("fixture-aggregated")?;
        FixtureServer::start_binary("fixture-aggregated", &binary, args)
            .await
            .map(FixtureAggregated)
    }
}

impl std::ops::Deref for FixtureCore {
    type Target = FixtureServer;
    fn deref(&self) -> &FixtureServer {
        &self.0
    }
}

impl std::ops::DerefMut for FixtureCore {
    fn deref_mut(&mut self) -> &mut FixtureServer {
        &mut self.0
    }
}

impl std::ops::Deref for FixtureAggregated {
    type Target = FixtureServer;
    fn deref(&self) -> &FixtureServer {
        &self.0
    }
}

impl std::ops::DerefMut for FixtureAggregated {
    fn deref_mut(&mut self) -> &mut FixtureServer {
        &mut self.0
    }
}

// ---- the gateway --------------------------------------------------------------------------------

/// How to start the gateway.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// `--core-url`.
    pub core_url: String,
    /// `--log-level` (default `info`).
    pub log_level: String,
    /// Extra flags appended after the standard ones.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Use this binary instead of building/locating `aggregation-gateway`.
    pub binary: Option<PathBuf>,
    /// How long to wait for the `serving` log line.
    pub startup_timeout: Duration,
    /// `--config`, when set.
    pub config: Option<PathBuf>,
    /// `--secure-port` (default 0: OS-assigned, announced in the `serving` event).
    pub secure_port: u16,
}

impl GatewayOptions {
    pub fn new(core_url: impl Into<String>) -> GatewayOptions {
        GatewayOptions {
            core_url: core_url.into(),
            log_level: "info".into(),
            args: Vec::new(),
            env: Vec::new(),
            binary: None,
            startup_timeout: STARTUP_TIMEOUT,
            config: None,
            secure_port: 0,
        }
    }

    /// Runs this gateway binary instead of building `aggregation-gateway` (e.g. a release build).
    pub fn binary(mut self, binary: impl Into<PathBuf>) -> GatewayOptions {
        self.binary = Some(binary.into());
        self
    }

    /// Passes `--config <file>`.
    pub fn config(mut self, file: impl Into<PathBuf>) -> GatewayOptions {
        self.config = Some(file.into());
        self
    }

    /// Listens on this port instead of an OS-assigned one, for callers that must know the address
    /// before the gateway announces it (timing start-up from the first connection attempt).
    pub fn secure_port(mut self, port: u16) -> GatewayOptions {
        self.secure_port = port;
        self
    }

    /// Appends extra flags.
    pub fn args<I, S>(mut self, args: I) -> GatewayOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn log_level(mut self, level: impl Into<String>) -> GatewayOptions {
        self.log_level = level.into();
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> GatewayOptions {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// What the gateway's `serving` log event says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingInfo {
    pub address: SocketAddr,
    pub cert_file: PathBuf,
}

/// Parses one JSON log line of the gateway; `Some` for the `serving` event. Fields may sit under
/// `"fields"` (tracing-subscriber's default JSON layout) or at the top level (flattened events).
pub fn parse_serving_line(line: &str) -> Option<ServingInfo> {
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let field = |name: &str| {
        value
            .get("fields")
            .and_then(|f| f.get(name))
            .or_else(|| value.get(name))
            .and_then(|v| v.as_str())
    };
    if field("message")? != "serving" {
        return None;
    }
    Some(ServingInfo {
        address: field("address")?.parse().ok()?,
        cert_file: PathBuf::from(field("cert_file")?),
    })
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    pub process: Process,
    pub addr: SocketAddr,
    /// The serving certificate, to be trusted as CA by clients.
    pub ca_file: PathBuf,
    cert_dir: PathBuf,
}

impl Gateway {
    /// Builds (once) and starts the gateway on an OS-assigned port (unless
    /// [`GatewayOptions::secure_port`] names one), and waits for its `serving` event. On failure
    /// the error carries the gateway's logs, so tests of bad configurations can assert on them.
    pub async fn start(options: GatewayOptions) -> Result<Gateway, HarnessError> {
        let binary = match &options.binary {
            Some(binary) => binary.clone(),
            None => tokio::task::spawn_blocking(ensure_gateway_built)
                .await
                .map_err(|e| HarnessError::Build(format!("build task failed: {e}")))??,
        };
        let cert_dir = tempfile::Builder::new()
            .prefix("gateway-certs-")
            .tempdir()
            .map_err(io_err("creating the gateway cert dir"))?;
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &options.secure_port.to_string(),
            "--cert-dir",
        ])
        .arg(cert_dir.path())
        .args(["--core-url", &options.core_url])
        .args([
            "--logging-format",
            "json",
            "--log-level",
            &options.log_level,
        ]);
        if let Some(config) = &options.config {
            cmd.arg("--config").arg(config);
        }
        cmd.args(&options.args)
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        let mut process = Process::spawn(GATEWAY_BIN, cmd)?;
        let cert_dir_path = cert_dir.path().to_path_buf();
        process.keep_dir(cert_dir);
        let line = process
            .wait_for_line(|l| parse_serving_line(l).is_some(), options.startup_timeout)
            .await;
        let Some(info) = line.as_deref().and_then(parse_serving_line) else {
            return Err(start_failure(
                process,
                "no JSON log line with message \"serving\", address and cert_file",
                options.startup_timeout,
            ));
        };
        Ok(Gateway {
            process,
            addr: info.address,
            ca_file: info.cert_file,
            cert_dir: cert_dir_path,
        })
    }

    /// Base URL, e.g. `https://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The directory passed as `--cert-dir` (removed when the gateway is dropped).
    pub fn cert_dir(&self) -> &Path {
        &self.cert_dir
    }

    /// The serving certificate as PEM, for raw HTTP clients.
    pub fn ca_pem(&self) -> Result<String, HarnessError> {
        std::fs::read_to_string(&self.ca_file).map_err(io_err(format!(
            "reading the gateway's serving certificate {}",
            self.ca_file.display()
        )))
    }

    /// A kubectl (default version) pointed at this gateway and trusting its serving certificate,
    /// presenting the bearer token [`DEFAULT_TOKEN`]: over TLS, kubectl refuses to run without some
    /// credential (it prompts for a basic-auth user name and fails with `error: EOF` on a closed
    /// stdin). Replace it with [`Kubectl::with_client_pair`] or [`Kubectl::with_token`] as needed.
    pub fn kubectl(&self) -> Result<Kubectl, HarnessError> {
        Kubectl::new(&self.url(), Some(&self.ca_file), KubectlVersion::default())?
            .with_token(DEFAULT_TOKEN)
    }
}

// ---- kubectl ------------------------------------------------------------------------------------

/// Which kubectl minor version to run. The preinstalled `kubectl` is a dispatcher that picks a
/// version from the server's `/version`; tests call the versioned binary beside it directly so the
/// client does not depend on what the server reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubectlVersion {
    pub minor: u32,
}

impl KubectlVersion {
    pub const V1_29: KubectlVersion = KubectlVersion { minor: 29 };
    pub const V1_32: KubectlVersion = KubectlVersion { minor: 32 };
}

impl Default for KubectlVersion {
    fn default() -> Self {
        KubectlVersion::V1_32
    }
}

/// Resolves `kubectl.1.<minor>` beside the real target of the `kubectl` found on `PATH`
/// (`readlink -f "$(command -v kubectl)"`).
pub fn kubectl_binary(version: KubectlVersion) -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dispatcher = std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| HarnessError::Binary("no `kubectl` on PATH".into()))?;
    let real = std::fs::canonicalize(&dispatcher)
        .map_err(io_err(format!("resolving {}", dispatcher.display())))?;
    let dir = real.parent().unwrap_or(Path::new("/"));
    let binary = dir.join(format!("kubectl.1.{}", version.minor));
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(HarnessError::Binary(format!(
            "{} does not exist (kubectl on PATH resolves to {})",
            binary.display(),
            real.display()
        )))
    }
}

/// The bearer token [`Gateway::kubectl`] sessions present by default.
pub const DEFAULT_TOKEN: &str = "e2e-default-token";

/// Credentials kubectl presents.
#[derive(Clone, Debug)]
pub enum KubectlUser {
    /// No credentials. Works for plain `http` servers only: over `https` kubectl prompts for a
    /// basic-auth user name instead of sending an anonymous request (use raw HTTP clients to test
    /// anonymous requests).
    Anonymous,
    ClientCert {
        cert: PathBuf,
        key: PathBuf,
    },
    Token(String),
}

/// The result of one kubectl run.
#[derive(Debug)]
pub struct Output {
    /// `None` when the run timed out and kubectl was killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for messages.
    pub command: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The exit code (`None` if killed by a signal or timed out).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            Some(status) => status.to_string(),
            None => "timed out (killed)".into(),
        };
        write!(
            f,
            "$ {}\n{status}\n--- stdout ---\n{}--- stderr ---\n{}--- end ---",
            self.command, self.stdout, self.stderr
        )
    }
}

/// A kubectl user session: its own `HOME`, kubeconfig and cache directory.
#[derive(Debug)]
pub struct Kubectl {
    binary: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: PathBuf,
    cache_dir: PathBuf,
    server: String,
    ca_file: Option<PathBuf>,
    user: KubectlUser,
    pub timeout: Duration,
}

impl Kubectl {
    /// A session against `server_url`. For `https` URLs `ca_file` is trusted; without one TLS
    /// verification is skipped (as it must be for plain `http`, where kubectl ignores it).
    pub fn new(
        server_url: &str,
        ca_file: Option<&Path>,
        version: KubectlVersion,
    ) -> Result<Kubectl, HarnessError> {
        let binary = kubectl_binary(version)?;
        let home = tempfile::Builder::new()
            .prefix("kubectl-home-")
            .tempdir()
            .map_err(io_err("creating kubectl HOME"))?;
        let kubeconfig = home.path().join("kubeconfig");
        let cache_dir = home.path().join("cache");
        let kubectl = Kubectl {
            binary,
            kubeconfig,
            cache_dir,
            home,
            server: server_url.to_owned(),
            ca_file: ca_file.map(Path::to_path_buf),
            user: KubectlUser::Anonymous,
            timeout: KUBECTL_TIMEOUT,
        };
        kubectl.write_kubeconfig()?;
        Ok(kubectl)
    }

    /// Authenticates with a client certificate.
    pub fn with_client_cert(mut self, cert: &Path, key: &Path) -> Result<Kubectl, HarnessError> {
        self.user = KubectlUser::ClientCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        };
        self.write_kubeconfig()?;
        Ok(self)
    }

    /// Authenticates with a client certificate held in memory (written into this session's HOME).
    pub fn with_client_pair(self, pair: &CertifiedPair) -> Result<Kubectl, HarnessError> {
        let (cert, key) = pair
            .write(self.home.path(), "client")
            .map_err(io_err("writing the kubectl client certificate"))?;
        self.with_client_cert(&cert, &key)
    }

    /// Authenticates with a bearer token.
    pub fn with_token(mut self, token: &str) -> Result<Kubectl, HarnessError> {
        self.user = KubectlUser::Token(token.to_owned());
        self.write_kubeconfig()?;
        Ok(self)
    }

    /// Changes the per-command timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Kubectl {
        self.timeout = timeout;
        self
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    fn write_kubeconfig(&self) -> Result<(), HarnessError> {
        let mut cluster = serde_json::json!({ "server": self.server });
        match &self.ca_file {
            Some(ca) if self.server.starts_with("https") => {
                cluster["certificate-authority"] = ca.display().to_string().into();
            }
            _ => cluster["insecure-skip-tls-verify"] = true.into(),
        }
        let user = match &self.user {
            KubectlUser::Anonymous => serde_json::json!({}),
            KubectlUser::ClientCert { cert, key } => serde_json::json!({
                "client-certificate": cert.display().to_string(),
                "client-key": key.display().to_string(),
            }),
            KubectlUser::Token(token) => serde_json::json!({ "token": token }),
        };
        // JSON is valid YAML, and serde_json does the quoting.
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "e2e", "cluster": cluster }],
            "users": [{ "name": "e2e", "user": user }],
            "contexts": [{ "name": "e2e", "context": { "cluster": "e2e", "user": "e2e" } }],
            "current-context": "e2e",
        });
        std::fs::write(&self.kubeconfig, config.to_string())
            .map_err(io_err(format!("writing {}", self.kubeconfig.display())))
    }

    /// The prepared command (binary, `--kubeconfig`, `--cache-dir`, clean environment) for `args`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .env_remove("KUBECACHEDIR");
        cmd
    }

    /// Runs kubectl with `args`, killing it after [`Kubectl::timeout`].
    ///
    /// # Panics
    /// If kubectl cannot be executed at all (its path was checked when the session was created).
    pub async fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, None).await
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let command = format!("kubectl {}", args.join(" "));
        let mut cmd = tokio::process::Command::from(self.command(args));
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot execute {}: {e}", self.binary.display()));
        if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use tokio::io::AsyncWriteExt;
            let data = data.to_vec();
            tokio::spawn(async move {
                let _ = pipe.write_all(&data).await;
            });
        }
        // Readers run as tasks so a timeout still leaves the partial output for the message.
        let stdout = tokio::spawn(read_all(child.stdout.take()));
        let stderr = tokio::spawn(read_all(child.stderr.take()));
        let status = match tokio::time::timeout(self.timeout, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = child.kill().await;
                None
            }
        };
        let stdout = stdout.await.unwrap_or_default();
        let mut stderr = stderr.await.unwrap_or_default();
        if stdout.starts_with("Please enter Username") {
            stderr.push_str(
                "\n(harness: kubectl prompted for credentials because the session has none and the \
                 server uses TLS; use with_token or with_client_pair)\n",
            );
        }
        if status.is_none() {
            stderr.push_str(&format!("\n(harness: killed after {:?})\n", self.timeout));
        }
        Output {
            status,
            stdout,
            stderr,
            command,
        }
    }

    /// Runs kubectl and panics with the full output unless it exits 0.
    pub async fn run_ok(&self, args: &[&str]) -> Output {
        let output = self.run(args).await;
        assert!(output.success(), "kubectl failed:\n{output}");
        output
    }

    /// `kubectl apply -f <file>` with `yaml` written to a file in this session's HOME; panics with
    /// the output unless it succeeds.
    pub async fn apply_yaml(&self, yaml: &str) -> Output {
        self.apply_yaml_with(yaml, &[]).await
    }

    /// [`Kubectl::apply_yaml`] with extra flags (e.g. `--server-side`, `--validate=false`).
    pub async fn apply_yaml_with(&self, yaml: &str, extra: &[&str]) -> Output {
        let file = tempfile::Builder::new()
            .prefix("manifest-")
            .suffix(".yaml")
            .tempfile_in(self.home.path())
            .unwrap_or_else(|e| panic!("creating a manifest file: {e}"));
        std::fs::write(file.path(), yaml)
            .unwrap_or_else(|e| panic!("writing a manifest file: {e}"));
        let path = file.path().display().to_string();
        let mut args = vec!["apply", "-f", path.as_str()];
        args.extend_from_slice(extra);
        self.run_ok(&args).await
    }

    /// Runs kubectl reading `stdin` (e.g. `apply -f -`).
    pub async fn run_with_input(&self, args: &[&str], stdin: &str) -> Output {
        self.run_with_stdin(args, Some(stdin.as_bytes())).await
    }

    /// Starts a long-running kubectl (e.g. `get -w`) whose output is captured line by line.
    pub fn spawn(&self, args: &[&str]) -> Result<Process, HarnessError> {
        Process::spawn(&format!("kubectl {}", args.join(" ")), self.command(args))
    }
}

async fn read_all(pipe: Option<impl AsyncRead + Unpin>) -> String {
    let mut buf = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut buf).await;
    }
    String::from_utf8_lossy(&buf).into_owned()
}

// ---- raw HTTP clients ---------------------------------------------------------------------------

/// A pooled HTTP client speaking exactly one HTTP version to `https` (and plain `http`) URLs.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A rustls client config trusting `ca_pem`, presenting `client_cert` if given, offering `alpn`.
pub fn tls_client_config(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, HarnessError> {
    install_crypto();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| CertError::Pem(format!("protocol versions: {e}")))?
    .with_root_certificates(root_store(ca_pem)?);
    let mut config = match client_cert {
        Some(pair) => builder
            .with_client_auth_cert(pair.cert_chain()?, pair.private_key()?)
            .map_err(|e| CertError::Pem(format!("client certificate rejected: {e}")))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn client(config: rustls::ClientConfig, http2: bool) -> HttpClient {
    let mut http = HttpConnector::new();
    // The TLS layer needs https URLs passed through.
    http.enforce_http(false);
    // Built from a config rather than hyper-rustls' builder so the ALPN list is exactly ours (its
    // HTTP/1-only mode sends no ALPN at all).
    let connector = HttpsConnector::from((http, config));
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(http2);
    builder.build(connector)
}

/// An HTTP/1.1-only client (ALPN `http/1.1`).
pub fn http1_client(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
) -> Result<HttpClient, HarnessError> {
    Ok(client(
        tls_client_config(ca_pem, client_cert, &[b"http/1.1"])?,
        false,
    ))
}

/// An HTTP/2-only client (ALPN `h2`; prior knowledge on plain `http`).
pub fn http2_client(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
) -> Result<HttpClient, HarnessError> {
    Ok(client(
        tls_client_config(ca_pem, client_cert, &[b"h2"])?,
        true,
    ))
}

/// `GET url`, collecting the whole body (within [`HTTP_TIMEOUT`]).
pub async fn get(
    client: &HttpClient,
    url: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let request = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| HarnessError::Http {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    send(client, request).await
}

/// Sends `request`, collecting the whole body (within [`HTTP_TIMEOUT`]).
pub async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let url = request.uri().to_string();
    let http_err = |reason: String| HarnessError::Http {
        url: url.clone(),
        reason,
    };
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| http_err(format!("{e:?}")))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| http_err(format!("reading the body: {e}")))?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    };
    tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("request to {url}")))?
}

/// Opens a TLS connection to `addr` trusting `ca_pem`, offering ALPN `http/1.1`, for tests that
/// write raw bytes (upgrades, slow headers, malformed requests).
pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<TlsStream<TcpStream>, HarnessError> {
    let config = tls_client_config(ca_pem, None, &[b"http/1.1"])?;
    tls_connect_with(addr, config).await
}

/// Opens a TLS connection to `addr` with a prepared config (client certificate, other ALPN).
/// The server name is the IP address of `addr`.
pub async fn tls_connect_with(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> Result<TlsStream<TcpStream>, HarnessError> {
    let connect = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(io_err(format!("connecting to {addr}")))?;
        let _ = tcp.set_nodelay(true);
        let server_name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(io_err(format!("TLS handshake with {addr}")))
    };
    tokio::time::timeout(HTTP_TIMEOUT, connect)
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("connecting to {addr}")))?
}

/// Reads an HTTP/1.x response head (through the blank line) byte by byte, so nothing after it is
/// consumed — the rest of the stream may be an upgraded protocol.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Result<String, HarnessError> {
    let read = async {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream
                .read(&mut byte)
                .await
                .map_err(io_err("reading a response head"))?;
            if n == 0 {
                return Err(HarnessError::Io {
                    context: "reading a response head".into(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed after {:?}",
                            String::from_utf8_lossy(&head)
                        ),
                    ),
                });
            }
            head.push(byte[0]);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| HarnessError::Timeout(timeout, "reading a response head".into()))?
}

/// Sends `request` and returns as soon as the response headers arrive, with the body still
/// streaming (for watches and other long-running responses).
pub async fn send_streaming(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, HarnessError> {
    let url = request.uri().to_string();
    tokio::time::timeout(HTTP_TIMEOUT, client.request(request))
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("request to {url}")))?
        .map_err(|e| HarnessError::Http {
            url,
            reason: format!("{e:?}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_line_is_parsed_nested_and_flat() {
        let nested = r#"{"timestamp":"2025-01-01T00:00:00Z","level":"INFO","fields":{"message":"serving","address":"127.0.0.1:41234","cert_file":"/tmp/x/apiserver.crt"},"target":"aggregation_gateway"}"#;
        let flat = r#"{"level":"INFO","message":"serving","address":"127.0.0.1:41234","cert_file":"/tmp/x/apiserver.crt"}"#;
        let want = ServingInfo {
            address: "127.0.0.1:41234".parse().unwrap(),
            cert_file: "/tmp/x/apiserver.crt".into(),
        };
        assert_eq!(parse_serving_line(nested), Some(want.clone()));
        assert_eq!(parse_serving_line(flat), Some(want));
        assert_eq!(
            parse_serving_line(r#"{"fields":{"message":"starting"}}"#),
            None
        );
        assert_eq!(parse_serving_line("not json"), None);
        assert_eq!(
            parse_serving_line(
                r#"{"fields":{"message":"serving","address":"nope","cert_file":"x"}}"#
            ),
            None
        );
    }

    #[test]
    fn listening_line_is_parsed() {
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:1234"),
            Some((None, addr))
        );
        assert_eq!(
            parse_listening_line("fixture-core listening on https://127.0.0.1:1234/"),
            Some((Some("https"), addr))
        );
        assert_eq!(parse_listening_line("listening on nowhere"), None);
        assert_eq!(parse_listening_line("starting"), None);
    }

    #[tokio::test]
    async fn wait_until_polls_until_true_or_deadline() {
        let start = Instant::now();
        let mut calls = 0;
        assert!(
            wait_until(Duration::from_secs(2), || {
                calls += 1;
                let done = calls >= 3;
                async move { done }
            })
            .await
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(!wait_until(Duration::from_millis(250), || async { false }).await);
    }
}
