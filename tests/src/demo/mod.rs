//! The demo of the README's first section: the gateway doing its job with no cluster. One
//! process starts, on 127.0.0.1, a core server and two aggregated API servers (the fixtures the
//! end-to-end tests use, [`crate::fixture`], run in this process) and the real gateway binary in
//! front of them, registers the aggregated servers the way a cluster would (APIServices and
//! Services stored on the core), writes a kubeconfig, and then takes `stop <server>` and
//! `start <server>` on its standard input until Ctrl-C, which stops everything it started.
//!
//! Why a binary of the tests crate (`cargo run -p e2e --bin demo`): its parts are the test
//! fixtures, which the production binary must not carry, and `tests/tests/suite/demo.rs` runs this
//! same binary and checks the README's commands and their output against it, so the README's first
//! section cannot drift from what a newcomer sees.
//!
//! The servers:
//! * the core (`fixture-core`'s table: namespaces, pods, Services, APIServices, Leases, the
//!   review APIs), on the gateway's default `--core-url`, `http://127.0.0.1:8080`;
//! * `wardle`: `wardle.example.com/v1alpha1`, flunders and fischers, with OpenAPI v3, as
//!   kube's sample-apiserver serves them;
//! * `metrics`: `metrics.k8s.io/v1beta1`, node and pod metrics, serving only OpenAPI v2 (as
//!   servers built before OpenAPI v3 do): the gateway converts its spec for `kubectl explain`.
//!
//! Both aggregated servers believe `X-Remote-*` identity only from the gateway's proxy client
//! certificate, as k8s.io/apiserver-based servers do.

mod servers;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use crate::fixture::BoxError;
use crate::harness;
use crate::scenario::Pki;

pub use servers::{Servers, AGGREGATED};

/// The bearer token in the demo's kubeconfig: user `demo`, in `system:masters` on the core.
pub const TOKEN: &str = "demo-token";
/// The user the token names.
pub const USER: &str = "demo";
/// What the demo prints when everything is up and ready for kubectl.
pub const READY: &str = "The demo is ready";
/// The prompt of the demo's commands (`stop wardle`, `start wardle`).
pub const PROMPT: &str = "demo> ";

/// Where and on which ports the demo runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Kubeconfig, the gateway's serving certificate (`<dir>/gateway`) and the scenario's.
    pub dir: PathBuf,
    /// The gateway's `--secure-port` (0: any free port).
    pub secure_port: u16,
    /// The core's port (0: any free port).
    pub core_port: u16,
    /// The gateway binary; built with cargo when not given.
    pub gateway: Option<PathBuf>,
}

impl Options {
    /// The kubeconfig the demo writes.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
}

/// `target/demo` of the workspace the demo was built in.
pub fn default_dir() -> PathBuf {
    let target = harness::target_profile_dir()
        .ok()
        .and_then(|profile| profile.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| harness::workspace_root().join("target"));
    target.join("demo")
}

/// Runs the demo until Ctrl-C (or SIGTERM), then stops what it started.
pub async fn run(options: Options) -> Result<(), BoxError> {
    crate::certs::install_crypto();
    // Built first: the time the demo reports is its start, not cargo's.
    let binary = match &options.gateway {
        Some(binary) => binary.clone(),
        None => tokio::task::spawn_blocking(harness::ensure_gateway_built).await??,
    };
    let started = Instant::now();
    std::fs::create_dir_all(&options.dir)
        .map_err(|e| format!("creating {}: {e}", options.dir.display()))?;
    let pki = Pki::for_services(&AGGREGATED.map(|server| server.namespace));
    let mut servers = Servers::start(&pki, options.core_port).await?;
    let (mut gateway, serving) = start_gateway(&binary, &options, &pki, &servers)?;
    let serving = tokio::time::timeout(harness::STARTUP_TIMEOUT, serving)
        .await
        .map_err(|_| "the gateway did not say where it serves within 30s")?
        .map_err(|_| "the gateway exited before it served")?;
    let ca = std::fs::read_to_string(&serving.cert_file)
        .map_err(|e| format!("reading {}: {e}", serving.cert_file.display()))?;
    write_kubeconfig(&options.kubeconfig(), serving.address, &ca)?;
    wait_until_ready(&serving, &ca, &servers).await?;
    print_ready(&options, serving.address, started.elapsed());

    let mut input = Some(stdin_lines());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = loop {
        tokio::select! {
            line = next_line(&mut input) => match line {
                Some(line) => {
                    let answer = servers.command(line.trim()).await;
                    println!("{answer}");
                    prompt();
                }
                // No more input (stdin closed): keep serving until a signal.
                None => input = None,
            },
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = term.recv() => break Ok(()),
            exited = gateway.wait() => break Err(format!("the gateway exited: {exited:?}").into()),
        }
    };
    println!("\nStopping the gateway and the servers.");
    stop_gateway(&mut gateway).await;
    servers.stop_all().await;
    outcome
}

/// Standard input, line by line, read by a thread of its own (a blocking read; tokio's stdin
/// would need a feature the gateway's build does not have, and hold up the runtime's end).
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next line of standard input; `None` at its end, and never again after that.
async fn next_line(input: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match input {
        Some(lines) => lines.recv().await,
        None => std::future::pending().await,
    }
}

fn prompt() {
    use std::io::Write;
    print!("{PROMPT}");
    let _ = std::io::stdout().flush();
}

/// What the gateway's `serving` line says.
#[derive(Debug)]
struct Serving {
    address: std::net::SocketAddr,
    cert_file: PathBuf,
}

/// Starts the gateway on its defaults, with what it must be told: where the core is, where to
/// keep its serving certificate, and the proxy client certificate the aggregated servers trust.
/// Its log goes to this terminal line by line; the `serving` line is also parsed for the address
/// and the certificate.
fn start_gateway(
    binary: &Path,
    options: &Options,
    pki: &Pki,
    servers: &Servers,
) -> Result<(Child, oneshot::Receiver<Serving>), BoxError> {
    let cert_dir = options.dir.join("gateway");
    let (proxy_cert, proxy_key) = &pki.proxy_client;
    let mut args: Vec<String> = vec!["--cert-dir".into(), cert_dir.display().to_string()];
    // The access log (a line per request) would bury what this terminal is for.
    args.extend(["--log-level".into(), "info,access=warn".into()]);
    if options.secure_port != 8443 {
        args.extend(["--secure-port".into(), options.secure_port.to_string()]);
    }
    let core_url = format!("http://{}", servers.core_address());
    if core_url != "http://127.0.0.1:8080" {
        args.extend(["--core-url".into(), core_url]);
    }
    args.extend([
        "--proxy-client-cert-file".into(),
        proxy_cert.display().to_string(),
        "--proxy-client-key-file".into(),
        proxy_key.display().to_string(),
        "--proxy-client-ca-file".into(),
        pki.proxy_ca_file.display().to_string(),
    ]);
    println!(
        "Starting the gateway:\n    aggregation-gateway {}\n",
        args.join(" ")
    );
    let mut command = Command::new(binary);
    command
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // The gateway goes with the demo, however the demo ends (a test that kills it included).
    // SAFETY: prctl is async-signal-safe and only sets this child's parent-death signal.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let stderr = child.stderr.take().ok_or("the gateway's stderr")?;
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            if let Some(serving) = parse_serving(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(serving);
                }
            }
        }
    });
    Ok((child, rx))
}

/// The `serving` line of the gateway's text log: `... serving address=127.0.0.1:8443
/// cert_file=/path/aggregation-gateway.crt ...`.
fn parse_serving(line: &str) -> Option<Serving> {
    let fields = &line[line.find(" serving ")? + " serving ".len()..];
    let field = |name: &str| {
        fields
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    Some(Serving {
        address: field("address")?.parse().ok()?,
        cert_file: PathBuf::from(field("cert_file")?),
    })
}

/// SIGTERM, as a Pod's kubelet stops it; a kill after 10 s.
async fn stop_gateway(gateway: &mut Child) {
    if let Some(pid) = gateway.id() {
        // SAFETY: kill with a valid signal number on the pid of our own child.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(Duration::from_secs(10), gateway.wait())
        .await
        .is_err()
    {
        let _ = gateway.kill().await;
    }
}

/// Ready means what a user's first commands need: `/readyz` passes and the core says both
/// APIServices are `Available`.
async fn wait_until_ready(serving: &Serving, ca: &str, servers: &Servers) -> Result<(), BoxError> {
    let client = harness::http1_client(ca, None)?;
    let readyz = format!("https://{}/readyz", serving.address);
    let ready = harness::wait_until(Duration::from_secs(30), || async {
        servers.all_available()
            && harness::get(&client, &readyz)
                .await
                .is_ok_and(|(status, _, _)| status == http::StatusCode::OK)
    })
    .await;
    if ready {
        Ok(())
    } else {
        Err("the gateway did not become ready within 30s (see its log above)".into())
    }
}

/// A kubeconfig for the gateway: its serving certificate as the CA, the demo's token.
fn write_kubeconfig(path: &Path, address: std::net::SocketAddr, ca: &str) -> Result<(), BoxError> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "demo", "cluster": {
            "server": format!("https://{address}"),
            "certificate-authority-data": ca,
        }}],
        "users": [{"name": USER, "user": {"token": TOKEN}}],
        "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": USER}}],
        "current-context": "demo",
    });
    // It holds a token: readable by this user only, as kubectl writes its own.
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(serde_json::to_string_pretty(&config)?.as_bytes()))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}

fn print_ready(options: &Options, address: std::net::SocketAddr, took: Duration) {
    let kubeconfig = options.kubeconfig();
    let servers: Vec<String> = AGGREGATED
        .iter()
        .map(|s| format!("    {:<8} {}", s.name, s.description))
        .collect();
    println!(
        "\n{READY} ({:.1}s): the gateway serves https://{address} in front of a core server and \
         two aggregated API servers:\n{}\n\nIn another terminal:\n    export KUBECONFIG={}\n    \
         kubectl api-resources\n\nHere, `stop wardle` or `start wardle` (or metrics) and Enter; \
         Ctrl-C stops everything.",
        took.as_secs_f64(),
        servers.join("\n"),
        kubeconfig.display()
    );
    prompt();
}
