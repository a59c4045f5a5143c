//! The gateway under test: its flags, its start, and what it announces.

use super::*;

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

    /// An HTTP/1.1 client trusting this gateway's serving certificate, presenting `user`'s
    /// client certificate when one is given.
    pub fn http1_client(&self, user: Option<&CertifiedPair>) -> HttpClient {
        http1_client(&self.ca_pem().unwrap(), user).unwrap()
    }

    /// The same over HTTP/2.
    pub fn http2_client(&self, user: Option<&CertifiedPair>) -> HttpClient {
        http2_client(&self.ca_pem().unwrap(), user).unwrap()
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
