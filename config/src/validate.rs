//! `Options → validate → Config`: defaults applied, every value checked before anything starts, and
//! a refusal that names the flag (and its YAML key) and says what to change.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::options::{Options, StaticService};

/// A refused setting: which one, and why. Printed as one line at start (exit code 64).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid configuration: --{flag} ({key}): {message}")]
pub struct ConfigError {
    pub flag: String,
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(flag: &str, message: impl Into<String>) -> Self {
        Self {
            flag: flag.to_owned(),
            key: yaml_key(flag),
            message: message.into(),
        }
    }
}

/// `core-ca-file` → `coreCaFile`: the YAML key serde derives for the same field.
fn yaml_key(flag: &str) -> String {
    let mut out = String::with_capacity(flag.len());
    let mut upper = false;
    for c in flag.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The validated, complete configuration the gateway runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub serving: ServingConfig,
    pub authn: AuthnConfig,
    pub authz: AuthzConfig,
    pub proxy_client: Option<CertKeyPair>,
    pub core: CoreConfig,
    pub apiservices: ApiServiceConfig,
    pub limits: Limits,
    pub shutdown_delay: Duration,
    pub shutdown_timeout: Duration,
    pub logging: LoggingConfig,
    pub audit: AuditConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKeyPair {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ServingConfig {
    /// Files given by the user; `None` means generate a self-signed pair into `cert_dir`.
    pub cert: Option<CertKeyPair>,
    pub cert_dir: PathBuf,
    pub tls13_only: bool,
    pub cipher_suites: Vec<String>,
    pub http2_max_streams: u32,
}

#[derive(Debug, Clone)]
pub struct AuthnConfig {
    pub client_ca_file: Option<PathBuf>,
    pub requestheader_client_ca_file: Option<PathBuf>,
    pub requestheader_allowed_names: Vec<String>,
    pub anonymous: bool,
    pub token_webhook: bool,
    pub token_cache_ttl: Duration,
    pub token_cache_unauthorized_ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct AuthzConfig {
    pub webhook: bool,
    pub cache_authorized_ttl: Duration,
    pub cache_unauthorized_ttl: Duration,
    pub authorize_metrics: bool,
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
    pub availability_interval: Duration,
    pub discovery_refresh_interval: Duration,
    pub static_services: Vec<StaticService>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// 0 = unlimited.
    pub max_readonly_inflight: u32,
    pub max_mutating_inflight: u32,
    pub request_timeout: Duration,
    pub max_request_body_bytes: u64,
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

fn secs(d: Option<crate::GoDuration>, default: u64) -> Duration {
    d.map(|d| d.0).unwrap_or(Duration::from_secs(default))
}

/// A file the user named must exist and be readable now; better refused at start than at the
/// first request.
fn existing_file(flag: &str, path: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    match path {
        None => Ok(None),
        Some(p) if p.as_os_str().is_empty() => Ok(None),
        Some(p) => match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => Ok(Some(p)),
            Ok(_) => Err(ConfigError::new(
                flag,
                format!("{} is not a file", p.display()),
            )),
            Err(e) => Err(ConfigError::new(
                flag,
                format!("cannot read {}: {e}", p.display()),
            )),
        },
    }
}

fn pair(
    cert_flag: &str,
    key_flag: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<CertKeyPair>, ConfigError> {
    let cert = existing_file(cert_flag, cert)?;
    let key = existing_file(key_flag, key)?;
    match (cert, key) {
        (Some(cert_file), Some(key_file)) => Ok(Some(CertKeyPair {
            cert_file,
            key_file,
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConfigError::new(
            key_flag,
            format!("required when --{cert_flag} is set"),
        )),
        (None, Some(_)) => Err(ConfigError::new(
            cert_flag,
            format!("required when --{key_flag} is set"),
        )),
    }
}

fn parse_core_url(raw: &str) -> Result<CoreEndpoint, ConfigError> {
    let bad = |m: &str| ConfigError::new("core-url", format!("{raw:?}: {m}"));
    if let Some(path) = raw.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(bad(
                "a unix socket URL needs an absolute path (unix:///run/core.sock)",
            ));
        }
        return Ok(CoreEndpoint::Unix(PathBuf::from(path)));
    }
    if raw.starts_with('/') {
        return Ok(CoreEndpoint::Unix(PathBuf::from(raw)));
    }
    let rest = raw
        .strip_prefix("http://")
        .or_else(|| raw.strip_prefix("https://"))
        .ok_or_else(|| {
            bad("must start with http://, https:// or unix:// (or be an absolute socket path)")
        })?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(bad("missing host"));
    }
    if rest.len() > authority.len() && rest[authority.len()..] != *"/" {
        return Err(bad(
            "must not have a path: the gateway forwards request paths unchanged",
        ));
    }
    if authority.contains('@') || rest.contains('?') || rest.contains('#') {
        return Err(bad("must be scheme://host[:port] only"));
    }
    Ok(CoreEndpoint::Url(raw.trim_end_matches('/').to_owned()))
}

fn one_of<'a>(
    flag: &str,
    value: Option<&'a str>,
    default: &'a str,
    allowed: &[&str],
) -> Result<&'a str, ConfigError> {
    let v = value.unwrap_or(default);
    if allowed.contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::new(
            flag,
            format!("{v:?} is not one of {}", allowed.join(", ")),
        ))
    }
}

impl Options {
    /// Applies defaults and checks every value. Files named by the user must exist.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let listen = SocketAddr::new(
            self.bind_address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            self.secure_port.unwrap_or(8443),
        );

        let tls13_only = one_of(
            "tls-min-version",
            self.tls_min_version.as_deref(),
            "VersionTLS12",
            &["VersionTLS12", "VersionTLS13"],
        )? == "VersionTLS13";
        let cipher_suites = self.tls_cipher_suites.unwrap_or_default();
        for suite in &cipher_suites {
            if !crate::tls::cipher_suite_known(suite) {
                return Err(ConfigError::new(
                    "tls-cipher-suites",
                    format!(
                        "unknown or insecure cipher suite {suite:?}; supported: {}",
                        crate::tls::supported_cipher_suite_names().join(", ")
                    ),
                ));
            }
        }
        let http2_max_streams = self.http2_max_streams_per_connection.unwrap_or(1000);
        if http2_max_streams == 0 {
            return Err(ConfigError::new(
                "http2-max-streams-per-connection",
                "must be at least 1",
            ));
        }
        let serving = ServingConfig {
            cert: pair(
                "tls-cert-file",
                "tls-private-key-file",
                self.tls_cert_file,
                self.tls_private_key_file,
            )?,
            cert_dir: self
                .cert_dir
                .unwrap_or_else(|| std::env::temp_dir().join("aggregation-gateway")),
            tls13_only,
            cipher_suites,
            http2_max_streams,
        };

        let authn = AuthnConfig {
            client_ca_file: existing_file("client-ca-file", self.client_ca_file)?,
            requestheader_client_ca_file: existing_file(
                "requestheader-client-ca-file",
                self.requestheader_client_ca_file,
            )?,
            requestheader_allowed_names: self.requestheader_allowed_names.unwrap_or_default(),
            anonymous: self.anonymous_auth.unwrap_or(true),
            token_webhook: self.authentication_token_webhook.unwrap_or(true),
            token_cache_ttl: secs(self.authentication_token_webhook_cache_ttl, 120),
            token_cache_unauthorized_ttl: secs(
                self.authentication_token_webhook_cache_unauthorized_ttl,
                10,
            ),
        };
        if !authn.requestheader_allowed_names.is_empty()
            && authn.requestheader_client_ca_file.is_none()
        {
            return Err(ConfigError::new(
                "requestheader-allowed-names",
                "needs --requestheader-client-ca-file: names are only checked on certificates that CA signed",
            ));
        }

        let authz = AuthzConfig {
            webhook: self.authorization_webhook.unwrap_or(true),
            cache_authorized_ttl: secs(self.authorization_webhook_cache_authorized_ttl, 300),
            cache_unauthorized_ttl: secs(self.authorization_webhook_cache_unauthorized_ttl, 30),
            authorize_metrics: self.authorize_metrics.unwrap_or(false),
        };

        let proxy_client = pair(
            "proxy-client-cert-file",
            "proxy-client-key-file",
            self.proxy_client_cert_file,
            self.proxy_client_key_file,
        )?;

        let kubeconfig = existing_file("core-kubeconfig", self.core_kubeconfig)?;
        let endpoint = match self.core_url.as_deref() {
            Some(raw) => Some(parse_core_url(raw)?),
            None if kubeconfig.is_some() => None,
            None => Some(CoreEndpoint::Url("http://127.0.0.1:8080".to_owned())),
        };
        let ca_file = existing_file("core-ca-file", self.core_ca_file)?;
        if ca_file.is_some()
            && matches!(&endpoint, Some(CoreEndpoint::Url(u)) if u.starts_with("http://"))
        {
            return Err(ConfigError::new(
                "core-ca-file",
                "only applies to an https:// --core-url",
            ));
        }
        let identity = match one_of(
            "core-identity",
            self.core_identity.as_deref(),
            "passthrough",
            &["passthrough", "impersonate"],
        )? {
            "impersonate" => CoreIdentity::Impersonate,
            _ => CoreIdentity::Passthrough,
        };
        let core = CoreConfig {
            endpoint,
            ca_file,
            client_cert: pair(
                "core-client-cert-file",
                "core-client-key-file",
                self.core_client_cert_file,
                self.core_client_key_file,
            )?,
            token_file: existing_file("core-token-file", self.core_token_file)?,
            kubeconfig,
            identity,
        };

        let source = match one_of(
            "apiservice-source",
            self.apiservice_source.as_deref(),
            "kube",
            &["kube", "file", "none"],
        )? {
            "file" => {
                let dir = self.apiservice_dir.ok_or_else(|| {
                    ConfigError::new("apiservice-dir", "required when --apiservice-source=file")
                })?;
                if !dir.is_dir() {
                    return Err(ConfigError::new(
                        "apiservice-dir",
                        format!("{} is not a directory", dir.display()),
                    ));
                }
                ApiServiceSource::File { dir }
            }
            "none" => ApiServiceSource::None,
            _ => ApiServiceSource::Kube {
                label_selector: self.apiservice_label_selector.filter(|s| !s.is_empty()),
            },
        };
        let static_services = self.services.unwrap_or_default();
        for (i, svc) in static_services.iter().enumerate() {
            if svc.namespace.is_empty() || svc.name.is_empty() {
                return Err(ConfigError::new(
                    "services",
                    format!("entry {i}: namespace and name are required"),
                ));
            }
            if svc.urls.is_empty() {
                return Err(ConfigError::new(
                    "services",
                    format!(
                        "{}/{}: at least one URL is required",
                        svc.namespace, svc.name
                    ),
                ));
            }
            for url in &svc.urls {
                if !url.starts_with("https://") {
                    return Err(ConfigError::new(
                        "services",
                        format!(
                            "{}/{}: {url:?} must be an https:// URL (aggregated servers serve TLS)",
                            svc.namespace, svc.name
                        ),
                    ));
                }
            }
        }
        let apiservices = ApiServiceConfig {
            source,
            endpoint_routing: self.enable_aggregator_routing.unwrap_or(false),
            availability_interval: secs(self.apiservice_availability_interval, 30),
            discovery_refresh_interval: secs(self.discovery_refresh_interval, 60),
            static_services,
        };
        if apiservices.availability_interval.is_zero() {
            return Err(ConfigError::new(
                "apiservice-availability-interval",
                "must be greater than 0s",
            ));
        }
        if apiservices.discovery_refresh_interval.is_zero() {
            return Err(ConfigError::new(
                "discovery-refresh-interval",
                "must be greater than 0s",
            ));
        }

        let limits = Limits {
            max_readonly_inflight: self.max_requests_inflight.unwrap_or(400),
            max_mutating_inflight: self.max_mutating_requests_inflight.unwrap_or(200),
            request_timeout: secs(self.request_timeout, 60),
            max_request_body_bytes: self.max_request_body_bytes.unwrap_or(3 * 1024 * 1024),
            header_read_timeout: secs(self.header_read_timeout, 10),
            max_header_bytes: self.max_header_bytes.unwrap_or(1024 * 1024),
        };
        if limits.request_timeout.is_zero() {
            return Err(ConfigError::new(
                "request-timeout",
                "must be greater than 0s",
            ));
        }
        if limits.header_read_timeout.is_zero() {
            return Err(ConfigError::new(
                "header-read-timeout",
                "must be greater than 0s",
            ));
        }
        if limits.max_header_bytes < 8192 {
            return Err(ConfigError::new(
                "max-header-bytes",
                "must be at least 8192",
            ));
        }

        let format = match one_of(
            "logging-format",
            self.logging_format.as_deref(),
            "text",
            &["text", "json"],
        )? {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        let level = self.log_level.unwrap_or_else(|| "info".to_owned());
        if level.trim().is_empty() {
            return Err(ConfigError::new(
                "log-level",
                "must not be empty (e.g. info, debug)",
            ));
        }

        let audit_level = match one_of(
            "audit-policy-level",
            self.audit_policy_level.as_deref(),
            "Metadata",
            &["None", "Metadata"],
        )? {
            "None" => AuditLevel::None,
            _ => AuditLevel::Metadata,
        };

        Ok(Config {
            listen,
            serving,
            authn,
            authz,
            proxy_client,
            core,
            apiservices,
            limits,
            shutdown_delay: secs(self.shutdown_delay_duration, 0),
            shutdown_timeout: secs(self.shutdown_timeout, 60),
            logging: LoggingConfig { format, level },
            audit: AuditConfig {
                path: self.audit_log_path.filter(|p| !p.is_empty()),
                level: audit_level,
            },
        })
    }
}

/// Reads `--config` (if any) and merges the flags over it.
pub fn load(cli: crate::Cli) -> Result<(Options, Config), ConfigError> {
    let file = match &cli.config {
        Some(path) => read_file(path)?,
        None => Options::default(),
    };
    let merged = cli.options.or(file);
    let config = merged.clone().validate()?;
    Ok((merged, config))
}

fn read_file(path: &Path) -> Result<Options, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("config", format!("cannot read {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(Options::default());
    }
    serde_saphyr::from_str(&text).map_err(|e| {
        let msg = e.to_string().replace('\n', " ");
        ConfigError::new("config", format!("{}: {msg}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(yaml: &str) -> Options {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn embedded_defaults_validate() {
        let c = Options::default().validate().unwrap();
        assert_eq!(c.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(
            c.core.endpoint,
            Some(CoreEndpoint::Url("http://127.0.0.1:8080".into()))
        );
        assert_eq!(c.limits.request_timeout, Duration::from_secs(60));
        assert!(c.authn.anonymous);
    }

    #[test]
    fn core_url_forms() {
        assert_eq!(
            parse_core_url("unix:///run/x.sock").unwrap(),
            CoreEndpoint::Unix("/run/x.sock".into())
        );
        assert_eq!(
            parse_core_url("/run/x.sock").unwrap(),
            CoreEndpoint::Unix("/run/x.sock".into())
        );
        assert_eq!(
            parse_core_url("https://10.0.0.1:6443/").unwrap(),
            CoreEndpoint::Url("https://10.0.0.1:6443".into())
        );
        for bad in [
            "ftp://x",
            "http://",
            "http://h/prefix",
            "unix://relative",
            "localhost:8080",
        ] {
            let err = parse_core_url(bad).unwrap_err();
            assert_eq!(err.flag, "core-url", "{bad}");
        }
    }

    #[test]
    fn errors_name_flag_and_yaml_key() {
        let err = opts("apiserviceSource: files\n").validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: --apiservice-source (apiserviceSource): \"files\" is not one of kube, file, none"
        );
    }

    #[test]
    fn missing_files_are_refused_at_start() {
        let err = opts("clientCaFile: /nonexistent/ca.crt\n")
            .validate()
            .unwrap_err();
        assert_eq!(err.flag, "client-ca-file");
        assert!(err.message.contains("/nonexistent/ca.crt"), "{err}");
    }

    #[test]
    fn half_a_key_pair_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "x").unwrap();
        let err = Options {
            tls_cert_file: Some(cert),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.flag, "tls-private-key-file");
    }

    #[test]
    fn file_source_needs_a_directory() {
        let err = opts("apiserviceSource: file\n").validate().unwrap_err();
        assert_eq!(err.flag, "apiservice-dir");
    }

    #[test]
    fn static_services_must_be_https() {
        let err = opts("services:\n- namespace: w\n  name: api\n  urls: [http://127.0.0.1:1]\n")
            .validate()
            .unwrap_err();
        assert_eq!(err.flag, "services");
    }

    #[test]
    fn yaml_key_matches_serde() {
        assert_eq!(yaml_key("core-ca-file"), "coreCaFile");
        assert_eq!(
            yaml_key("http2-max-streams-per-connection"),
            "http2MaxStreamsPerConnection"
        );
    }
}

#[cfg(test)]
mod example_tests {
    /// The example in the repository is what the README starts the gateway with; it must stay valid
    /// and must spell out the embedded defaults.
    #[test]
    fn example_config_is_valid_and_matches_defaults() {
        let text = include_str!("../example.yaml");
        let options: crate::Options = serde_saphyr::from_str(text).unwrap();
        let from_file = options.validate().unwrap();
        let defaults = crate::Options::default().validate().unwrap();
        assert_eq!(
            format!("{:?}", from_file.limits),
            format!("{:?}", defaults.limits)
        );
        assert_eq!(from_file.listen, defaults.listen);
        assert_eq!(from_file.core.endpoint, defaults.core.endpoint);
        assert_eq!(from_file.apiservices.source, defaults.apiservices.source);
        assert_eq!(from_file.shutdown_timeout, defaults.shutdown_timeout);
    }
}
