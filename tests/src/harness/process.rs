//! Child processes whose output is captured line by line, waited on, and killed on drop.

use super::*;

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
    pub(super) name: String,
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
        cmd.stdin(Stdio::null());
        Process::spawn_with_stdin(name, cmd)
    }

    /// [`Process::spawn`] with a piped stdin, for [`Process::send_line`].
    pub fn spawn_interactive(name: &str, mut cmd: Command) -> Result<Process, HarnessError> {
        cmd.stdin(Stdio::piped());
        Process::spawn_with_stdin(name, cmd)
    }

    /// Writes `line` and a newline to the process's stdin (see [`Process::spawn_interactive`]).
    pub fn send_line(&mut self, line: &str) -> Result<(), HarnessError> {
        use std::io::Write;
        let context = format!("writing to the stdin of {}", self.name);
        let stdin = self.child.stdin.as_mut().ok_or_else(|| HarnessError::Io {
            context: context.clone(),
            source: std::io::Error::other("its stdin is not piped"),
        })?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(io_err(context))
    }

    fn spawn_with_stdin(name: &str, mut cmd: Command) -> Result<Process, HarnessError> {
        let started = Instant::now();
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
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
    /// tests.
    pub fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        signal_pid(signal, self.child.id())
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

/// Sends a signal by name to any process, one the harness started or not (a real server's,
/// a fixture's). Uses the `kill` utility to avoid a libc dependency.
pub fn signal_pid(signal: &str, pid: u32) -> Result<(), HarnessError> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(io_err("running kill"))?;
    if status.success() {
        Ok(())
    } else {
        Err(HarnessError::Io {
            context: format!("kill -{signal} {pid}"),
            source: std::io::Error::other(format!("exited with {status}")),
        })
    }
}

/// A process frozen with SIGSTOP, resumed with SIGCONT when dropped, so a failing test leaves
/// nothing stopped.
pub struct Stopped(u32);

impl Stopped {
    pub fn stop(pid: u32) -> Stopped {
        signal_pid("STOP", pid).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = signal_pid("CONT", self.0);
    }
}
