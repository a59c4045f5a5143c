//! The fixture API servers (core and aggregated), started as processes of their own.

use super::*;

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

pub(super) fn start_failure(mut process: Process, reason: &str, timeout: Duration) -> HarnessError {
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
