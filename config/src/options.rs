//! What a user can set: one YAML file (`--config`) plus flags that override it. Every setting is
//! declared once, in [`Options`], and gets both a flag (kube-apiserver's name where the concept is
//! the same) and a camelCase YAML key, so the file and the command line can never drift apart.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;

/// Declares [`Options`] and its field-by-field merge in one place, so adding a setting is one edit.
macro_rules! options {
    ($(#[$smeta:meta])* pub struct $name:ident { $( $(#[$fmeta:meta])* pub $field:ident : Option<$ty:ty>, )* }) => {
        $(#[$smeta])*
        pub struct $name { $( $(#[$fmeta])* pub $field: Option<$ty>, )* }

        impl $name {
            /// Values set here win; unset ones are taken from `lower` (flags over the file).
            pub fn or(self, lower: Self) -> Self {
                Self { $( $field: self.$field.or(lower.$field), )* }
            }
        }
    };
}

options! {
    /// Every setting of the gateway. All optional here; defaults are applied by validation.
    #[derive(clap::Args, Deserialize, Serialize, Debug, Default, Clone, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Options {
        // ---- serving ----
        /// Address to serve HTTPS on [default: 127.0.0.1].
        #[arg(long, value_name = "IP")]
        pub bind_address: Option<IpAddr>,
        /// Port to serve HTTPS on; 0 picks a free port (logged) [default: 8443].
        #[arg(long, value_name = "PORT")]
        pub secure_port: Option<u16>,
        /// Serving certificate (PEM, may include intermediates). Without it a self-signed one is
        /// generated into --cert-dir at start.
        #[arg(long, value_name = "FILE")]
        pub tls_cert_file: Option<PathBuf>,
        /// Private key for --tls-cert-file (PEM).
        #[arg(long, value_name = "FILE")]
        pub tls_private_key_file: Option<PathBuf>,
        /// Where a generated self-signed serving certificate is written (0600 files; the
        /// directory must be this user's, writable by nobody else) and reused from on restart.
        /// Unset: the generated pair is kept in memory only.
        #[arg(long, value_name = "DIR")]
        pub cert_dir: Option<PathBuf>,
        /// How often certificate and CA files are re-read even when no file event arrived
        /// (a replaced directory, a write inside a linked folder) [default: 1m].
        #[arg(long, value_name = "DURATION")]
        pub cert_reload_interval: Option<GoDuration>,
        /// Minimum TLS version: VersionTLS12 or VersionTLS13 [default: VersionTLS12].
        #[arg(long, value_name = "VERSION")]
        pub tls_min_version: Option<String>,
        /// Allowed TLS 1.2 cipher suites (IANA names, comma-separated) [default: rustls' secure set].
        #[arg(long, value_name = "SUITES", value_delimiter = ',')]
        pub tls_cipher_suites: Option<Vec<String>>,
        /// Maximum concurrent HTTP/2 streams per client connection; 0 means kube-apiserver's
        /// default of 100 [default: 0].
        #[arg(long, value_name = "N")]
        pub http2_max_streams_per_connection: Option<u32>,
        /// Maximum open client connections; past it new connections are closed at once. 0 means
        /// half the open-file limit (raised to its hard limit at start) [default: 0].
        #[arg(long, value_name = "N")]
        pub max_client_connections: Option<u32>,
        /// Threads that serve requests and run the gateway's loops. 1: one thread runs them all
        /// (tokio's current-thread scheduler), which costs the least CPU per request where the
        /// gateway shares its cores with kube-apiserver or its clients; N: tokio's multi-thread
        /// scheduler with N workers, for a gateway that must use more than one core; 0: one
        /// worker per CPU the process may use (a Pod's CPU limit counts) [default: 1].
        #[arg(long, value_name = "N")]
        pub worker_threads: Option<u32>,

        // ---- authentication ----
        /// CA bundle that verifies client certificates (user = CN, groups = O).
        #[arg(long, value_name = "FILE")]
        pub client_ca_file: Option<PathBuf>,
        /// CA bundle that verifies a trusted front proxy's client certificate; only then are its
        /// X-Remote-User/Group/Extra headers believed.
        #[arg(long, value_name = "FILE")]
        pub requestheader_client_ca_file: Option<PathBuf>,
        /// Common names allowed for the front proxy's certificate (empty: any CN signed by the CA).
        #[arg(long, value_name = "NAMES", value_delimiter = ',')]
        pub requestheader_allowed_names: Option<Vec<String>>,
        /// kube-apiserver's structured authentication file (AuthenticationConfiguration,
        /// apiserver.config.k8s.io/v1): JWT issuers whose tokens the gateway verifies itself,
        /// and the anonymous authenticator. Reloaded when it changes.
        #[arg(long, value_name = "FILE")]
        pub authentication_config: Option<PathBuf>,
        /// Allow unauthenticated requests as system:anonymous [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub anonymous_auth: Option<bool>,
        /// Check bearer tokens with a TokenReview on the core server [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub authentication_token_webhook: Option<bool>,
        /// How long a successful TokenReview is cached [default: 2m].
        #[arg(long, value_name = "DURATION")]
        pub authentication_token_webhook_cache_ttl: Option<GoDuration>,
        /// How long a failed TokenReview is cached [default: 10s].
        #[arg(long, value_name = "DURATION")]
        pub authentication_token_webhook_cache_unauthorized_ttl: Option<GoDuration>,

        // ---- authorization ----
        /// Authorize requests to remote APIServices with a SubjectAccessReview on the core
        /// (the API Priority and Fairness debug dumps are reviewed whatever this says)
        /// [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub authorization_webhook: Option<bool>,
        /// How long an allowed decision is cached [default: 5m].
        #[arg(long, value_name = "DURATION")]
        pub authorization_webhook_cache_authorized_ttl: Option<GoDuration>,
        /// How long a denied decision is cached [default: 30s].
        #[arg(long, value_name = "DURATION")]
        pub authorization_webhook_cache_unauthorized_ttl: Option<GoDuration>,
        /// Authorize GET /metrics with a SubjectAccessReview (non-resource URL /metrics, verb get),
        /// as kube-apiserver does; false serves metrics to anyone who passes authentication
        /// [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub authorize_metrics: Option<bool>,
        /// Honour constrained impersonation (KEP-5284: verbs `impersonate:<mode>` and
        /// `impersonate-on:<mode>:<verb>`) as the core does with its `ConstrainedImpersonation`
        /// feature gate on; set it to what the core's gate says (alpha and off in 1.35). The
        /// gateway cannot read the core's gates, and a mismatch either refuses what the core
        /// allows or lets the constrained verbs through a core that does not know them
        /// [default: false].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub constrained_impersonation: Option<bool>,

        // ---- identity towards backends ----
        /// Client certificate the gateway presents to remote APIServices (and to the core in
        /// passthrough mode for certificate users), with X-Remote-* identity headers.
        #[arg(long, value_name = "FILE")]
        pub proxy_client_cert_file: Option<PathBuf>,
        /// Private key for --proxy-client-cert-file.
        #[arg(long, value_name = "FILE")]
        pub proxy_client_key_file: Option<PathBuf>,
        /// CA bundle that signed --proxy-client-cert-file, published as the request-header CA
        /// aggregated servers trust [default: the certificates after the first in
        /// --proxy-client-cert-file].
        #[arg(long, value_name = "FILE")]
        pub proxy_client_ca_file: Option<PathBuf>,
        /// Keep kube-system/extension-apiserver-authentication on the core listing the gateway's
        /// client CA, proxy client CA and name and the X-Remote-* headers (added to what is there,
        /// never removing another writer's entries), as kube-apiserver does for itself, so
        /// aggregated servers trust the gateway [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub manage_extension_apiserver_authentication: Option<bool>,

        // ---- core server ----
        /// The core server: http://host:port, https://host:port, or a Unix socket (unix:///path or
        /// an absolute path) [default: http://127.0.0.1:8080].
        #[arg(long, value_name = "URL")]
        pub core_url: Option<String>,
        /// CA bundle that verifies the core's serving certificate (https only).
        #[arg(long, value_name = "FILE")]
        pub core_ca_file: Option<PathBuf>,
        /// Client certificate the gateway presents to the core.
        #[arg(long, value_name = "FILE")]
        pub core_client_cert_file: Option<PathBuf>,
        /// Private key for --core-client-cert-file.
        #[arg(long, value_name = "FILE")]
        pub core_client_key_file: Option<PathBuf>,
        /// File holding a bearer token the gateway uses for its own requests to the core.
        #[arg(long, value_name = "FILE")]
        pub core_token_file: Option<PathBuf>,
        /// A kubeconfig for the core (its current context); --core-url and the other --core-*
        /// flags override what it says.
        #[arg(long, value_name = "FILE")]
        pub core_kubeconfig: Option<PathBuf>,
        /// How callers reach the core: passthrough (their own credentials go on untouched) or
        /// impersonate (the gateway's credentials plus Impersonate-* headers) [default: passthrough].
        #[arg(long, value_name = "MODE")]
        pub core_identity: Option<String>,

        // ---- APIServices ----
        /// Where APIService objects come from: kube (watch the core), file (--apiservice-dir) or
        /// none [default: kube]. Backends outside any cluster are a `services:` list of
        /// {namespace, name, port, urls} in the --config file only (no flag); see README.md and
        /// the commented example in config/example.yaml.
        #[arg(long, value_name = "SOURCE")]
        pub apiservice_source: Option<String>,
        /// Directory of APIService manifests for --apiservice-source=file (reloaded on change).
        #[arg(long, value_name = "DIR")]
        pub apiservice_dir: Option<PathBuf>,
        /// Only APIServices matching this label selector are served (kube source).
        #[arg(long, value_name = "SELECTOR")]
        pub apiservice_label_selector: Option<String>,
        /// Route to a random ready endpoint of the Service instead of its ClusterIP [default: false].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub enable_aggregator_routing: Option<bool>,
        /// Answer 502 instead of passing on a remote backend's redirect (a 3xx with a
        /// Location), as kube-apiserver's flag of the same name does; other 3xx such as 304 Not
        /// Modified always pass [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub aggregator_reject_forwarding_redirect: Option<bool>,
        /// How often each remote APIService is probed [default: 30s].
        #[arg(long, value_name = "DURATION")]
        pub apiservice_availability_interval: Option<GoDuration>,
        /// How often remote discovery documents are revalidated [default: 60s].
        #[arg(long, value_name = "DURATION")]
        pub discovery_refresh_interval: Option<GoDuration>,
        /// Backends outside any cluster: a Service name mapped to fixed URLs (file only).
        #[arg(skip)]
        pub services: Option<Vec<StaticService>>,

        // ---- limits ----
        /// API Priority and Fairness, as kube-apiserver's: requests are classified by the
        /// FlowSchemas and PriorityLevelConfigurations of the core (kube's built-in ones when it
        /// serves none) and share --max-requests-inflight plus --max-mutating-requests-inflight
        /// seats by priority level, fairly between users; false: the two limits apply apart,
        /// first come first served [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub enable_priority_and_fairness: Option<bool>,
        /// Maximum in-flight non-mutating requests; 0 = unlimited. With priority and fairness,
        /// part of the server's seats [default: 400].
        #[arg(long, value_name = "N")]
        pub max_requests_inflight: Option<u32>,
        /// Maximum in-flight mutating requests; 0 = unlimited. With priority and fairness, part
        /// of the server's seats [default: 200].
        #[arg(long, value_name = "N")]
        pub max_mutating_requests_inflight: Option<u32>,
        /// Timeout for ordinary requests; watch, exec, attach, portforward, log and proxy are
        /// exempt [default: 60s].
        #[arg(long, value_name = "DURATION")]
        pub request_timeout: Option<GoDuration>,
        /// Largest request body accepted for non-streaming requests to the core and the gateway
        /// itself; 0 = unlimited [default: 3145728].
        #[arg(long, value_name = "BYTES")]
        pub max_request_body_bytes: Option<u64>,
        /// Largest request body proxied to a remote APIService; 0 leaves it to the backend, as
        /// kube-aggregator does [default: 0].
        #[arg(long, value_name = "BYTES")]
        pub apiservice_max_request_body_bytes: Option<u64>,
        /// How long a client may take to send its request headers [default: 10s].
        #[arg(long, value_name = "DURATION")]
        pub header_read_timeout: Option<GoDuration>,
        /// Largest request header block accepted [default: 1048576].
        #[arg(long, value_name = "BYTES")]
        pub max_header_bytes: Option<u32>,

        // ---- lifecycle ----
        /// After SIGTERM, keep serving (with /readyz failing) this long so load balancers notice
        /// [default: 0s].
        #[arg(long, value_name = "DURATION")]
        pub shutdown_delay_duration: Option<GoDuration>,
        /// After the delay, how long in-flight requests may take before they are cut [default: 60s].
        #[arg(long, value_name = "DURATION")]
        pub shutdown_timeout: Option<GoDuration>,

        // ---- several replicas ----
        /// Elect one replica, with a coordination.k8s.io/v1 Lease on the core, to write APIService
        /// status; the others still probe and route on their own results [default: true with
        /// --apiservice-source=kube, which is the only source that writes status].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub leader_elect: Option<bool>,
        /// How long a replica waits, after it last saw the leader renew the Lease, before it
        /// takes the lead [default: 15s].
        #[arg(long, value_name = "DURATION")]
        pub leader_elect_lease_duration: Option<GoDuration>,
        /// How long the leader keeps trying to renew before it stops writing status; shorter than
        /// the lease duration, so it stops before another replica may take over [default: 10s].
        #[arg(long, value_name = "DURATION")]
        pub leader_elect_renew_deadline: Option<GoDuration>,
        /// How often the Lease is renewed, and tried by the other replicas [default: 2s].
        #[arg(long, value_name = "DURATION")]
        pub leader_elect_retry_period: Option<GoDuration>,
        /// Name of the Lease [default: aggregation-gateway].
        #[arg(long, value_name = "NAME")]
        pub leader_elect_resource_name: Option<String>,
        /// Namespace of the Lease on the core [default: kube-system].
        #[arg(long, value_name = "NAMESPACE")]
        pub leader_elect_resource_namespace: Option<String>,
        /// Add the readiness check aggregated-apiservice-reachable: /readyz fails while this
        /// replica's discovery probe cannot reach a remote APIService it routes to, so a load
        /// balancer sends callers to replicas that can. A backend down for every replica makes
        /// every replica unready, core traffic included: opt in only where that is wanted
        /// [default: false].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        pub readyz_aggregated_apiservice_reachable: Option<bool>,

        // ---- observability ----
        /// Log format: text or json [default: text].
        #[arg(long, value_name = "FORMAT")]
        pub logging_format: Option<String>,
        /// Log level or tracing filter (RUST_LOG wins when set) [default: info].
        #[arg(long, value_name = "FILTER")]
        pub log_level: Option<String>,
        /// Audit log destination: a file path, or - for stdout (unset: no audit log).
        #[arg(long, value_name = "PATH")]
        pub audit_log_path: Option<String>,
        /// Audit level: None or Metadata [default: Metadata].
        #[arg(long, value_name = "LEVEL")]
        pub audit_policy_level: Option<String>,
        /// kube-apiserver's tracing file: a TracingConfiguration (apiserver.config.k8s.io/v1) with
        /// the OTLP/gRPC collector `endpoint` [default: localhost:4317] and
        /// `samplingRatePerMillion` [default: 0]. One span per request is exported and W3C
        /// `traceparent` is passed on to backends and the core. Unset: no tracing.
        #[arg(long, value_name = "FILE")]
        pub tracing_config_file: Option<PathBuf>,
    }
}

/// A Service reached at fixed URLs instead of through the core's Services and EndpointSlices.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticService {
    pub namespace: String,
    pub name: String,
    /// Service port the APIService names; omitted matches any port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// One or more `https://host:port` URLs; one is picked per connection.
    pub urls: Vec<String>,
}

/// The command line: flags that only make sense there, plus every [`Options`] flag.
#[derive(Parser, Debug)]
#[command(
    name = "aggregation-gateway",
    version,
    about = "A front proxy that aggregates Kubernetes-style API servers the way kube-aggregator does.",
    long_about = "A front proxy that aggregates Kubernetes-style API servers the way kube-aggregator \
does: routes /apis/<group>/<version> to the backend each APIService names, merges discovery, and \
passes everything else to the core server untouched.\n\nSettings come from --config (YAML, camelCase \
keys named like the flags: --secure-port is securePort) and from flags, which win."
)]
pub struct Cli {
    /// YAML configuration file; flags override its values.
    #[arg(long, value_name = "FILE", env = "AGGREGATION_GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Validate the configuration (file and flags), print it, and exit: 0 when valid, 64 when not.
    #[arg(long)]
    pub check_config: bool,
    #[command(flatten)]
    pub options: Options,
}

/// One line for a command-line error clap refused, in the shape of every other refusal:
/// `invalid configuration: --flag (yamlKey): what is wrong`. clap's own rendering spans several
/// lines (usage, tips), which log collectors split apart.
pub fn cli_error_line(err: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    // "--secure-port <PORT>", "--anonymous-auth[=<BOOL>]" → "secure-port", "anonymous-auth".
    let arg = text(ContextKind::InvalidArg).unwrap_or_default();
    let flag = arg
        .split([' ', '=', '['])
        .next()
        .unwrap_or_default()
        .strip_prefix("--");
    let value = text(ContextKind::InvalidValue).unwrap_or_default();
    let message = match err.kind() {
        ErrorKind::ValueValidation => {
            let why = std::error::Error::source(err)
                .map(|e| e.to_string())
                .unwrap_or_else(|| "not valid".to_owned());
            if why.contains(value) {
                why
            } else {
                format!("{value:?}: {why}")
            }
        }
        ErrorKind::InvalidValue if value.is_empty() => {
            format!("needs a value ({arg})")
        }
        ErrorKind::InvalidValue => match err.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(valid)) => {
                format!("{value:?} is not one of {}", valid.join(", "))
            }
            _ => format!("{value:?} is not valid"),
        },
        ErrorKind::NoEquals => match flag {
            Some(f) => format!("takes its value after '=', e.g. --{f}=false"),
            None => "takes its value after '='".to_owned(),
        },
        ErrorKind::ArgumentConflict
            if err.get(ContextKind::PriorArg) == err.get(ContextKind::InvalidArg) =>
        {
            "is given more than once; give it once".to_owned()
        }
        ErrorKind::UnknownArgument => {
            let suggestion = match text(ContextKind::SuggestedArg) {
                Some(s) => format!("; did you mean {s}?"),
                None => String::new(),
            };
            if !arg.starts_with('-') {
                return format!(
                    "invalid configuration: unexpected argument {arg:?}: values follow their flag \
                     (--name value), and true/false flags take --name=value"
                );
            }
            return format!(
                "invalid configuration: unknown flag {arg:?}{suggestion} (--help lists every flag)"
            );
        }
        _ => {
            // Anything else: clap's own first line, without its "error: " label.
            let rendered = err.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_owned()
        }
    };
    match flag {
        Some(f) if is_option_flag(f) => crate::ConfigError::new(f, message).to_string(),
        Some(f) => format!("invalid configuration: --{f}: {message}"),
        None => format!("invalid configuration: {message}"),
    }
}

/// Flags that are settings (and so have a YAML key), as opposed to --config and --check-config.
fn is_option_flag(flag: &str) -> bool {
    use clap::Args;
    Options::augment_args(clap::Command::new("options"))
        .get_arguments()
        .any(|a| a.get_long() == Some(flag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_file_and_file_fills_gaps() {
        let file: Options = serde_saphyr::from_str(
            "securePort: 9443\ncoreUrl: http://127.0.0.1:1\nlogLevel: debug\n",
        )
        .unwrap();
        let cli = Cli::try_parse_from(["gw", "--secure-port", "10443", "--anonymous-auth=false"])
            .unwrap();
        let merged = cli.options.or(file);
        assert_eq!(merged.secure_port, Some(10443));
        assert_eq!(merged.core_url.as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(merged.log_level.as_deref(), Some("debug"));
        assert_eq!(merged.anonymous_auth, Some(false));
    }

    #[test]
    fn unknown_yaml_keys_are_refused() {
        let err = serde_saphyr::from_str::<Options>("securPort: 1\n").unwrap_err();
        assert!(err.to_string().contains("securPort"), "{err}");
    }

    fn refusal(args: &[&str]) -> String {
        let err =
            Cli::try_parse_from(std::iter::once("gw").chain(args.iter().copied())).unwrap_err();
        cli_error_line(&err)
    }

    #[test]
    fn clap_errors_are_one_line_naming_flag_and_key() {
        for (args, want) in [
            (
                &["--secure-port", "99999"][..],
                "invalid configuration: --secure-port (securePort): 99999 is not in 0..=65535",
            ),
            (
                &["--bind-address", "1.2.3"][..],
                "invalid configuration: --bind-address (bindAddress): \"1.2.3\": invalid IP address syntax",
            ),
            (
                &["--anonymous-auth=maybe"][..],
                "invalid configuration: --anonymous-auth (anonymousAuth): \"maybe\" is not one of true, false",
            ),
            (
                &["--anonymous-auth", "false"][..],
                "invalid configuration: unexpected argument \"false\": values follow their flag (--name value), and true/false flags take --name=value",
            ),
            (
                &["--secure-port"][..],
                "invalid configuration: --secure-port (securePort): needs a value (--secure-port <PORT>)",
            ),
            (
                &["--secur-port", "1"][..],
                "invalid configuration: unknown flag \"--secur-port\"; did you mean --secure-port? (--help lists every flag)",
            ),
            (
                &["--secure-port", "1", "--secure-port", "2"][..],
                "invalid configuration: --secure-port (securePort): is given more than once; give it once",
            ),
        ] {
            let line = refusal(args);
            assert_eq!(line, want, "{args:?}");
            assert!(!line.contains('\n'), "{line}");
        }
        let line = refusal(&["--request-timeout", "soon"]);
        assert!(
            line.starts_with("invalid configuration: --request-timeout (requestTimeout): invalid duration \"soon\""),
            "{line}"
        );
        let line = refusal(&["--config"]);
        assert!(
            line.starts_with("invalid configuration: --config: needs a value"),
            "{line}"
        );
    }

    #[test]
    fn help_and_version_are_not_errors() {
        for flag in ["--help", "--version"] {
            let err = Cli::try_parse_from(["gw", flag]).unwrap_err();
            assert!(!err.use_stderr(), "{flag}");
        }
    }

    #[test]
    fn help_tells_where_the_yaml_only_services_map_is_documented() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("`services:`"), "{help}");
        assert!(help.contains("config/example.yaml"), "{help}");
    }

    /// The default a flag's help states is the one the gateway applies: each flag given its
    /// documented default validates to the configuration no flag gives. (The example config and
    /// the chart's values are checked against the same defaults: `example_config_is_valid_and_
    /// matches_defaults`, and the chart's `its_defaults_are_the_gateways`.)
    #[test]
    fn every_documented_default_is_the_applied_default() {
        let defaults = format!("{:?}", Options::default().validate().unwrap());
        let mut checked = 0;
        for arg in Cli::command().get_arguments() {
            let (Some(long), Some(help)) = (arg.get_long(), arg.get_help()) else {
                continue;
            };
            let help = help.to_string();
            // The flag's own default closes its help; one inside the text is a file field's.
            let Some(value) = help
                .trim_end()
                .trim_end_matches('.')
                .strip_suffix(']')
                .and_then(|h| h.rsplit_once("[default: "))
                .map(|(_, value)| value)
            else {
                continue;
            };
            // A default described in words ("rustls' secure set") is not a value to pass.
            if value.contains(' ') {
                continue;
            }
            let flag = format!("--{long}={value}");
            let cli = Cli::try_parse_from(["gw", flag.as_str()])
                .unwrap_or_else(|e| panic!("{flag}: the documented default does not parse: {e}"));
            let mut given = cli
                .options
                .validate()
                .unwrap_or_else(|e| panic!("{flag}: the documented default is refused: {e}"));
            // Whether --anonymous-auth was given is not a value: kube's rule beside the
            // authentication file reads it.
            given.authn.anonymous_flag_set = false;
            assert_eq!(
                format!("{given:?}"),
                defaults,
                "{flag}: the help's default is not the one applied"
            );
            checked += 1;
        }
        assert!(checked >= 40, "only {checked} flags state a default");
    }

    #[test]
    fn bool_flags_take_an_optional_value() {
        let cli = Cli::try_parse_from(["gw", "--enable-aggregator-routing"]).unwrap();
        assert_eq!(cli.options.enable_aggregator_routing, Some(true));
    }

    #[test]
    fn forwarding_redirects_are_rejected_unless_switched_off() {
        let validated = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            cli.options
                .validate()
                .unwrap()
                .apiservices
                .aggregator_reject_forwarding_redirect
        };
        assert!(validated(&["gw"]));
        assert!(!validated(&[
            "gw",
            "--aggregator-reject-forwarding-redirect=false"
        ]));
        let from_yaml: Options =
            serde_saphyr::from_str("aggregatorRejectForwardingRedirect: false\n").unwrap();
        assert_eq!(from_yaml.aggregator_reject_forwarding_redirect, Some(false));
    }
}
