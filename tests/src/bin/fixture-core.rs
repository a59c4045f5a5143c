//! `fixture-core`: a stand-in for kube-apiserver that end-to-end tests put behind the gateway.
//! Prints `listening on ADDR` once bound, then serves until killed.

use std::path::PathBuf;

use clap::Parser;
use e2e::fixture::{core_server, Policy, Server, TlsFiles};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "In-memory core API server fixture for end-to-end tests")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Serve HTTPS with this certificate (PEM; requires --tls-private-key-file).
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Verify client certificates against this CA when presented (they stay optional).
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// Minor version reported by /version (kubectl's dispatcher picks its binary from it).
    #[arg(long, default_value = "32")]
    minor: String,
    /// Answer /api and /apis with legacy discovery only, whatever Accept says.
    #[arg(long)]
    no_aggregated_discovery: bool,
    /// Believe `X-Remote-*` identity headers from client certificates (verified against
    /// --client-ca-file) with these CNs, as kube-apiserver's flag of that name; comma list.
    #[arg(long, requires = "client_ca_file", value_delimiter = ',')]
    requestheader_allowed_names: Vec<String>,
    /// JSON policy for TokenReview and SubjectAccessReview.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Also serve plain HTTP on this Unix domain socket.
    #[arg(long)]
    unix_socket: Option<PathBuf>,
    /// Store these objects at start (JSON: one object, an array, or a `List`), e.g. what a
    /// restarted core finds in etcd.
    #[arg(long)]
    seed: Option<PathBuf>,
    /// Serve CustomResourceDefinitions (apiextensions.k8s.io/v1), established a moment after
    /// creation like kube-apiserver's, and the resources of established ones.
    #[arg(long)]
    crds: bool,
    /// Leave `apiregistration.k8s.io` out, for a core that stores APIServices as the Helm chart's
    /// CRD (with --crds; the real-node suite's third chart shape).
    #[arg(long, requires = "crds")]
    without_apiservices: bool,
    /// Leave `coordination.k8s.io` (Leases) out, as a Kubernetes-style server that is not
    /// kube-apiserver may.
    #[arg(long)]
    without_leases: bool,
    /// Refuse list and watch of this resource (`<plural>.<group>`) with a 403, as RBAC that
    /// does not grant them would; repeated.
    #[arg(long = "forbid-list", value_name = "RESOURCE")]
    forbid_list: Vec<String>,
    /// Refuse every request on this resource (`<plural>.<group>`) with a 403, as RBAC that
    /// grants the gateway nothing on it would; repeated.
    #[arg(long = "forbid", value_name = "RESOURCE")]
    forbid: Vec<String>,
    /// Also serve this built-in group, `GROUP=VERSION[,VERSION...]` (preferred version first);
    /// repeated, in the order given, after the fixture's own groups.
    #[arg(long = "group", value_name = "GROUP=VERSIONS")]
    groups: Vec<String>,
    /// Close an HTTP/2 connection (GOAWAY) after answering an anonymous request, as
    /// kube-apiserver does (UnauthenticatedHTTP2DOSMitigation, on by default).
    #[arg(long)]
    goaway_anonymous_http2: bool,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` of its HTTP/2 connections (kube-apiserver's
    /// `--http2-max-streams-per-connection`; kube-apiserver announces 100 unless told).
    #[arg(long)]
    http2_max_streams_per_connection: Option<u32>,
    /// Start as a kube-apiserver still starting: every request (/readyz too) 403 until
    /// `POST /fixture/ready`.
    #[arg(long)]
    starting: bool,
    /// Answer /readyz with 403 for good, as a core whose RBAC does not let anyone read it.
    #[arg(long)]
    forbid_readyz: bool,
}

fn load_seed(path: Option<&PathBuf>) -> Result<Vec<Value>, String> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let value: Value =
        serde_json::from_slice(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    Ok(match value {
        Value::Array(items) => items,
        Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => o
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        object => vec![object],
    })
}

fn load_policy(path: Option<&PathBuf>) -> Result<Policy, String> {
    let Some(path) = path else {
        return Ok(Policy::default());
    };
    let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let policy = load_policy(args.policy.as_ref())?;
    let seed = load_seed(args.seed.as_ref())?;
    let mut config = core_server::config(&args.minor, !args.no_aggregated_discovery, policy);
    config.seed.extend(seed);
    config.goaway_anonymous_http2 = args.goaway_anonymous_http2;
    config.http2_max_concurrent_streams = args.http2_max_streams_per_connection;
    config.forbid_list = args.forbid_list;
    config.forbid = args.forbid;
    config.starting = args.starting;
    config.forbid_readyz = args.forbid_readyz;
    if !args.requestheader_allowed_names.is_empty() {
        config.request_header_authenticator = Some(e2e::fixture::RequestHeaderAuth {
            allowed_names: args.requestheader_allowed_names,
        });
    }
    for group in &args.groups {
        let (name, versions) = group
            .split_once('=')
            .ok_or_else(|| format!("--group {group}: expected GROUP=VERSION[,VERSION...]"))?;
        let versions: Vec<&str> = versions.split(',').filter(|v| !v.is_empty()).collect();
        if versions.is_empty() {
            return Err(format!("--group {group}: no version").into());
        }
        core_server::with_group(&mut config, name, &versions);
    }
    if args.crds {
        core_server::with_crds(&mut config);
    }
    if args.without_apiservices {
        core_server::without_apiservices(&mut config);
    }
    if args.without_leases {
        core_server::without_leases(&mut config);
    }
    let tls = match (args.tls_cert_file, args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert,
            key,
            client_ca: args.client_ca_file,
        }),
        _ => None,
    };
    let server = Server::bind(config, &args.listen, tls.as_ref()).await?;
    if let Some(path) = &args.unix_socket {
        server.serve_unix(path)?;
    }
    server.announce_and_serve().await
}
