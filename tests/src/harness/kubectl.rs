//! The real kubectl, pinned to a version, with a fresh cache directory and kubeconfig.

use super::*;

/// Which kubectl minor version to run. The preinstalled `kubectl` is a dispatcher that picks a
/// version from the server's `/version`; tests call the versioned binary beside it directly so the
/// client does not depend on what the server reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubectlVersion {
    pub minor: u32,
}

impl KubectlVersion {
    pub const V1_27: KubectlVersion = KubectlVersion { minor: 27 };
    pub const V1_29: KubectlVersion = KubectlVersion { minor: 29 };
    pub const V1_32: KubectlVersion = KubectlVersion { minor: 32 };
    pub const V1_33: KubectlVersion = KubectlVersion { minor: 33 };
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
    /// The name the server's certificate is verified against, when not the URL's host (a
    /// Service reached by its ClusterIP).
    tls_server_name: Option<String>,
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
        Kubectl::with_binary(kubectl_binary(version)?, server_url, ca_file)
    }

    /// [`Kubectl::new`] with the real control plane's own kubectl when its assets have one
    /// (see `real::release_kubectl`), else the dispatcher's `version`.
    pub fn for_release(
        server_url: &str,
        ca_file: Option<&Path>,
        version: KubectlVersion,
    ) -> Result<Kubectl, HarnessError> {
        match crate::real::release_kubectl() {
            Some(binary) => Kubectl::with_binary(binary, server_url, ca_file),
            None => Kubectl::new(server_url, ca_file, version),
        }
    }

    /// A session with `binary` (e.g. the kubectl of the release under test), otherwise as
    /// [`Kubectl::new`].
    pub fn with_binary(
        binary: PathBuf,
        server_url: &str,
        ca_file: Option<&Path>,
    ) -> Result<Kubectl, HarnessError> {
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
            tls_server_name: None,
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

    /// Verifies the server's certificate as `name` (kubeconfig `tls-server-name`).
    pub fn with_tls_server_name(mut self, name: &str) -> Result<Kubectl, HarnessError> {
        self.tls_server_name = Some(name.to_owned());
        self.write_kubeconfig()?;
        Ok(self)
    }

    /// Another session of the same user on the same server, with its own HOME and cache (for a
    /// second task running kubectl at the same time).
    pub fn clone_session(&self) -> Kubectl {
        let mut clone =
            Kubectl::with_binary(self.binary.clone(), &self.server, self.ca_file.as_deref())
                .expect("a kubectl session");
        clone.tls_server_name = self.tls_server_name.clone();
        clone.user = self.user.clone();
        clone.timeout = self.timeout;
        clone.write_kubeconfig().expect("writing a kubeconfig");
        clone
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
        if let Some(name) = &self.tls_server_name {
            cluster["tls-server-name"] = name.as_str().into();
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
