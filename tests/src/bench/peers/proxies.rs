//! nginx and HAProxy in front of the bench's own backends, configured to do what the gateway does
//! for the two shapes of issue 17 and nothing more:
//! - TLS in, with the gateway's serving certificate;
//! - `/apis/bench.example.com/...` to the TLS backend over TLS, verifying its certificate against
//!   the bench CA under the name the gateway uses (`api.bench.svc`);
//! - everything else to the plain HTTP core backend;
//! - keep-alive connections to both backends (nginx `upstream keepalive` with HTTP/1.1, HAProxy
//!   `http-reuse always`), as the gateway pools its own;
//! - one worker / one thread, no access log.
//!
//! Each runs in the foreground as a child of the bench (killed when dropped), with every file it
//! writes under the run's temporary directory, so nothing touches `/etc`, `/var` or `/run`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::super::setup::{Setup, REMOTE_SERVER_NAME};
use super::super::{BoxError, BENCH_GROUP};
use super::callgrind::Callgrind;
use crate::harness::Process;

/// A peer proxy, running.
pub struct Peer {
    pub process: Process,
    pub addr: SocketAddr,
}

impl Peer {
    /// The process that serves requests (nginx runs without a master process, so this is its
    /// only worker; HAProxy is one process with one thread).
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

/// What both configurations are written from.
struct Upstreams<'a> {
    listen: SocketAddr,
    core: SocketAddr,
    remote: SocketAddr,
    cert: &'a Path,
    key: &'a Path,
    ca: &'a Path,
}

impl<'a> Upstreams<'a> {
    fn new(setup: &'a Setup) -> Result<Upstreams<'a>, BoxError> {
        Ok(Upstreams {
            listen: free_port()?,
            core: setup.plain_addr,
            remote: setup.tls_backend.addr,
            cert: &setup.files.gateway_cert,
            key: &setup.files.gateway_key,
            ca: &setup.files.ca_file,
        })
    }
}

/// The remote APIService's path prefix, which both peers route to the TLS backend.
fn remote_prefix() -> String {
    format!("/apis/{BENCH_GROUP}/")
}

/// How a peer is started: as itself, or under callgrind to count its instructions.
fn command(program: &str, callgrind: Option<&Callgrind>) -> (String, Command) {
    match callgrind {
        None => (program.to_owned(), Command::new(program)),
        Some(cg) => {
            let name = format!("{program}-callgrind");
            let cmd = cg.command(&name, program);
            (name, cmd)
        }
    }
}

/// Starts nginx with its configuration and temporary files under `dir`.
pub async fn start_nginx(
    setup: &Setup,
    dir: &Path,
    callgrind: Option<&Callgrind>,
) -> Result<Peer, BoxError> {
    let up = Upstreams::new(setup)?;
    let (name, mut cmd) = command("nginx", callgrind);
    let prefix = dir.join(&name);
    std::fs::create_dir_all(&prefix)?;
    let conf = prefix.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&up, &prefix))?;
    // `-e stderr`: errors found before the configuration's own error_log applies go to our pipe
    // too, instead of Debian's compiled-in log path.
    cmd.arg("-p").arg(&prefix).arg("-c").arg(&conf);
    cmd.args(["-e", "stderr"]);
    let process = Process::spawn(&name, cmd)?;
    wait_listening(process, up.listen, startup_timeout(callgrind)).await
}

/// Under callgrind a program starts many times slower (it translates all the code it runs).
fn startup_timeout(callgrind: Option<&Callgrind>) -> Duration {
    Duration::from_secs(if callgrind.is_some() { 120 } else { 10 })
}

fn nginx_conf(up: &Upstreams, prefix: &Path) -> String {
    let p = |name: &str| prefix.join(name).display().to_string();
    format!(
        r#"# Written by the aggregation-gateway bench (tests/src/bench/peers/proxies.rs).
daemon off;
# One process that is its own worker: the event loop a worker runs, and the pid the bench
# measures is the one that serves. (Started as root, a master would also hand its worker to an
# unprivileged user that cannot read this private directory.)
master_process off;
worker_processes 1;
pid {pid};
error_log stderr warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {client_body};
    proxy_temp_path {proxy};
    fastcgi_temp_path {fastcgi};
    uwsgi_temp_path {uwsgi};
    scgi_temp_path {scgi};
    upstream core {{
        server {core};
        keepalive 64;
    }}
    upstream remote {{
        server {remote};
        keepalive 64;
    }}
    server {{
        listen {listen} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location {remote_prefix} {{
            proxy_pass https://remote;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_name {name};
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
        }}
        location / {{
            proxy_pass http://core;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#,
        pid = p("nginx.pid"),
        client_body = p("client_body_temp"),
        proxy = p("proxy_temp"),
        fastcgi = p("fastcgi_temp"),
        uwsgi = p("uwsgi_temp"),
        scgi = p("scgi_temp"),
        core = up.core,
        remote = up.remote,
        listen = up.listen,
        cert = up.cert.display(),
        key = up.key.display(),
        ca = up.ca.display(),
        name = REMOTE_SERVER_NAME,
        remote_prefix = remote_prefix(),
    )
}

/// Starts HAProxy with its configuration (and the PEM bundle it wants) under `dir`.
pub async fn start_haproxy(
    setup: &Setup,
    dir: &Path,
    callgrind: Option<&Callgrind>,
) -> Result<Peer, BoxError> {
    let up = Upstreams::new(setup)?;
    let (name, mut cmd) = command("haproxy", callgrind);
    let home = dir.join(&name);
    std::fs::create_dir_all(&home)?;
    // HAProxy reads the certificate and its key from one file.
    let bundle = home.join("serving.pem");
    let mut pem = std::fs::read_to_string(up.cert)?;
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(&std::fs::read_to_string(up.key)?);
    std::fs::write(&bundle, pem)?;
    let conf = home.join("haproxy.cfg");
    std::fs::write(&conf, haproxy_cfg(&up, &bundle))?;
    // -db: foreground, no daemon, no master process; the pid is the one serving.
    cmd.arg("-db").arg("-f").arg(&conf);
    let process = Process::spawn(&name, cmd)?;
    wait_listening(process, up.listen, startup_timeout(callgrind)).await
}

fn haproxy_cfg(up: &Upstreams, bundle: &Path) -> String {
    format!(
        r#"# Written by the aggregation-gateway bench (tests/src/bench/peers/proxies.rs).
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    # Any idle server connection serves any request, as the gateway's pools do.
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend gateway_peer
    bind {listen} ssl crt {bundle} alpn http/1.1
    use_backend remote if {{ path_beg {remote_prefix} }}
    default_backend core
backend core
    server core {core}
backend remote
    server remote {remote} ssl verify required ca-file {ca} verifyhost {name} sni str({name}) alpn http/1.1
"#,
        listen = up.listen,
        bundle = bundle.display(),
        remote_prefix = remote_prefix(),
        core = up.core,
        remote = up.remote,
        ca = up.ca.display(),
        name = REMOTE_SERVER_NAME,
    )
}

/// A loopback port nothing listens on now. Another process could take it before the peer binds
/// it; the peer then fails to start with its own "address in use" message, which is reported.
fn free_port() -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Waits up to `timeout` until `addr` accepts connections; if the process exits first, its output
/// (nginx's and HAProxy's configuration errors) is the error.
async fn wait_listening(
    mut process: Process,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Peer, BoxError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.try_wait() {
            // Let the pipes drain so the message is complete.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Err(format!(
                "{} exited while starting ({status}):\n{}",
                process.name(),
                process.logs()
            )
            .into());
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(Peer { process, addr });
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not listen on {addr} within {timeout:?}:\n{}",
                process.name(),
                process.logs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
