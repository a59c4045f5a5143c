//! `fixture-aggregated`: an aggregated API server (flunders and fischers) that end-to-end tests
//! register behind the gateway with an APIService. Always HTTPS. Prints `listening on ADDR` once
//! bound, then serves until killed.

use std::path::PathBuf;

use clap::Parser;
use e2e::fixture::{aggregated_server, RequestHeaderAuth, Server, TlsFiles};

#[derive(Parser, Debug)]
#[command(about = "In-memory aggregated API server fixture for end-to-end tests")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    #[arg(long)]
    tls_cert_file: PathBuf,
    #[arg(long)]
    tls_private_key_file: PathBuf,
    /// Require a client certificate chained to this CA before trusting X-Remote-* headers;
    /// requests without one are answered 401.
    #[arg(long)]
    requestheader_client_ca_file: Option<PathBuf>,
    /// Client certificate CNs allowed to assert identity (comma list; empty = any).
    #[arg(long, value_delimiter = ',', default_value = "")]
    requestheader_allowed_names: Vec<String>,
    #[arg(long, default_value = "wardle.example.com")]
    group: String,
    /// Served versions, first preferred; repeat the flag or give a comma list.
    #[arg(long, value_delimiter = ',', default_value = "v1alpha1")]
    version: Vec<String>,
    /// No aggregated discovery: /apis is always the legacy APIGroupList.
    #[arg(long)]
    legacy_only: bool,
    /// Answer 404 on /openapi/v3 and /openapi/v2.
    #[arg(long)]
    no_openapi: bool,
    /// Answer 404 on /openapi/v3 but serve /openapi/v2, like servers from before OpenAPI v3.
    #[arg(long)]
    openapi_v2_only: bool,
    /// Answer every Nth GET /apis/<group>/<version> (the availability probe) with a 500.
    #[arg(long)]
    fail_every_nth_group_version: Option<u64>,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection (unset: hyper's default).
    #[arg(long)]
    http2_max_streams_per_connection: Option<u32>,
    /// Close an HTTP/2 connection (GOAWAY) after answering a request from `system:anonymous`,
    /// as k8s.io/apiserver servers do (UnauthenticatedHTTP2DOSMitigation, on by default).
    #[arg(long)]
    goaway_anonymous_http2: bool,
    /// Answer `/api` and `/apis` (the discovery roots) only after this many milliseconds, like
    /// a backend still warming up.
    #[arg(long, default_value_t = 0)]
    discovery_delay_ms: u64,
    /// Close each HTTP/2 connection gracefully (GOAWAY) after it has taken this many requests,
    /// as kube-apiserver's --goaway-chance does at random.
    #[arg(long)]
    goaway_after_requests: Option<u64>,
    /// Subresources answered with a stream of JSON lines on every resource
    /// (`?events=N&interval_ms=M`), like a VM's console (comma list).
    #[arg(long, value_delimiter = ',')]
    streaming_subresources: Vec<String>,
    /// Speak HTTP/1.1 only (no `h2` in ALPN), as a Python or Java aggregated server, or one
    /// behind an HTTP/1.1 proxy.
    #[arg(long)]
    http1_only: bool,
    /// Misbehave as a hostile server would (repeatable): `openapi-v2-ref-chain=N`,
    /// `openapi-v2-nesting=N`, `openapi-v3-redirect`, `openapi-v2-hangs`, `slow-discovery` (see
    /// `e2e::fixture::hostile`).
    #[arg(long)]
    hostile: Vec<e2e::fixture::hostile::Hostile>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let versions: Vec<String> = args
        .version
        .iter()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if versions.is_empty() {
        return Err("at least one --version is required".into());
    }
    let request_header = args
        .requestheader_client_ca_file
        .as_ref()
        .map(|_| RequestHeaderAuth {
            allowed_names: args
                .requestheader_allowed_names
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
        });
    let mut config = aggregated_server::config(
        &args.group,
        &versions,
        args.legacy_only,
        !args.no_openapi,
        request_header,
    );
    config.openapi_v3 = !args.openapi_v2_only;
    config.fail_every_nth_group_version = args.fail_every_nth_group_version;
    config.http2_max_concurrent_streams = args.http2_max_streams_per_connection;
    config.discovery_delay = std::time::Duration::from_millis(args.discovery_delay_ms);
    config.goaway_anonymous_http2 = args.goaway_anonymous_http2;
    config.goaway_after_requests = args.goaway_after_requests;
    config.streaming_subresources = args.streaming_subresources;
    config.hostile = args.hostile;
    config.http1_only = args.http1_only;
    let tls = TlsFiles {
        cert: args.tls_cert_file,
        key: args.tls_private_key_file,
        client_ca: args.requestheader_client_ca_file,
    };
    Server::bind(config, &args.listen, Some(&tls))
        .await?
        .announce_and_serve()
        .await
}
