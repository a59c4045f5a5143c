//! The configuration the gateway runs with, as [`Options::validate`](crate::Options::validate)
//! produces it: every default applied, every file checked to exist, every enum decided. Plain data
//! and no logic, so that what reads it (`tls.rs`, the gateway) depends on these types alone and not
//! on the validation, which itself uses `tls.rs` to check PEM material.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::options::StaticService;

/// The validated, complete configuration the gateway runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// How the process's threads are laid out (`--worker-threads`).
    pub runtime: RuntimeShape,
    pub serving: ServingConfig,
    pub authn: AuthnConfig,
    pub authz: AuthzConfig,
    pub proxy_client: Option<CertKeyPair>,
    pub trust: TrustConfig,
    pub core: CoreConfig,
    pub apiservices: ApiServiceConfig,
    pub limits: Limits,
    pub shutdown_delay_duration: Duration,
    pub shutdown_timeout: Duration,
    /// `None`: every replica writes APIService status (one replica, or no kube source).
    pub leader_election: Option<LeaderElection>,
    pub logging: LoggingConfig,
    pub audit: AuditConfig,
    /// `--tracing-config-file`; `None`: requests are not traced.
    pub tracing: Option<crate::tracing_config::TracingConfig>,
}

/// The async runtime the gateway runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeShape {
    /// One thread runs every connection and loop (`--worker-threads=1`).
    CurrentThread,
    /// A work-stealing pool of this many worker threads (`--worker-threads=N`, N > 1).
    MultiThread(u32),
    /// A pool with one worker per CPU the process may use (`--worker-threads=0`).
    PerCpu,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKeyPair {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ServingConfig {
    /// Files given by the user; `None` means generate a self-signed pair: into `cert_dir` when
    /// set, kept in memory otherwise.
    pub cert: Option<CertKeyPair>,
    pub cert_dir: Option<PathBuf>,
    /// How often certificate files are re-read besides file events (`--cert-reload-interval`).
    pub cert_reload_interval: Duration,
    pub tls13_only: bool,
    pub cipher_suites: Vec<String>,
    pub http2_max_streams: u32,
    /// Open client connections allowed; 0: half the open-file limit at start.
    pub max_client_connections: u32,
}

#[derive(Debug, Clone)]
pub struct AuthnConfig {
    pub client_ca_file: Option<PathBuf>,
    pub requestheader_client_ca_file: Option<PathBuf>,
    pub requestheader_allowed_names: Vec<String>,
    pub anonymous: bool,
    /// `--anonymous-auth` was given (kube refuses it beside the file's `anonymous`).
    pub anonymous_flag_set: bool,
    /// `--authentication-config`.
    pub authentication_config: Option<PathBuf>,
    pub token_webhook: bool,
    pub token_cache_ttl: Duration,
    pub token_cache_unauthorized_ttl: Duration,
}

/// What the gateway publishes in `kube-system/extension-apiserver-authentication` on the core.
#[derive(Debug, Clone)]
pub struct TrustConfig {
    /// Keep the ConfigMap listing the gateway's trust material.
    pub manage: bool,
    /// The proxy client certificate's CA; `None`: the chain after the leaf.
    pub proxy_client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct AuthzConfig {
    pub webhook: bool,
    pub cache_authorized_ttl: Duration,
    pub cache_unauthorized_ttl: Duration,
    pub authorize_metrics: bool,
    /// Impersonation also by the constrained verbs of KEP-5284 (the core's
    /// `ConstrainedImpersonation` gate).
    pub constrained_impersonation: bool,
}

/// How the core server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreEndpoint {
    /// `http://` or `https://` base URL, without a trailing slash.
    Url(String),
    /// A Unix domain socket; requests are plain HTTP over it.
    Unix(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreIdentity {
    Passthrough,
    Impersonate,
}

#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// `None` only when --core-kubeconfig supplies the server.
    pub endpoint: Option<CoreEndpoint>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<CertKeyPair>,
    pub token_file: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub identity: CoreIdentity,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServiceSource {
    Kube { label_selector: Option<String> },
    File { dir: PathBuf },
    None,
}

#[derive(Debug, Clone)]
pub struct ApiServiceConfig {
    pub source: ApiServiceSource,
    pub endpoint_routing: bool,
    /// `--aggregator-reject-forwarding-redirect`: a remote backend's 3xx with a `Location`
    /// becomes a 502 instead of reaching the client.
    pub aggregator_reject_forwarding_redirect: bool,
    pub availability_interval: Duration,
    pub discovery_refresh_interval: Duration,
    pub static_services: Vec<StaticService>,
    /// `--readyz-aggregated-apiservice-reachable`: /readyz fails while a remote APIService's
    /// probe fails from this replica.
    pub readyz_reachable: bool,
}

/// The Lease that elects the one replica writing APIService status, with client-go's timing
/// (`--leader-elect-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElection {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// `--enable-priority-and-fairness`: the two in-flight limits add up to the seats API
    /// Priority and Fairness shares out; otherwise each applies on its own.
    pub priority_and_fairness: bool,
    /// 0 = unlimited (without priority and fairness).
    pub max_requests_inflight: u32,
    pub max_mutating_requests_inflight: u32,
    pub request_timeout: Duration,
    /// 0 = unlimited.
    pub max_request_body_bytes: u64,
    /// For requests proxied to remote APIServices; 0 = unlimited (the backend decides).
    pub apiservice_max_request_body_bytes: u64,
    pub header_read_timeout: Duration,
    pub max_header_bytes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct LoggingConfig {
    pub format: LogFormat,
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditLevel {
    None,
    Metadata,
}

#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// `None`: no audit log; `Some("-")`: stdout.
    pub path: Option<String>,
    pub level: AuditLevel,
}
