//! `Options → validate → Config`: defaults applied, every value checked before anything starts, and
//! a refusal that names the flag (and its YAML key) and says what to change. The types it produces
//! live in `config.rs`, the label-selector grammar it checks against in `selector.rs`, and reading
//! the `--config` file into [`Options`] in `file.rs`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{
    ApiServiceConfig, ApiServiceSource, AuditConfig, AuditLevel, AuthnConfig, AuthzConfig,
    CertKeyPair, Config, CoreConfig, CoreEndpoint, CoreIdentity, Limits, LogFormat, LoggingConfig,
    ServingConfig, TrustConfig,
};
use crate::options::Options;
use crate::selector::check_label_selector;

/// A refused setting: which one, and why. Printed as one line at start (exit code 64):
/// `invalid configuration: --flag (yamlKey): message`.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub flag: String,
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (flag, key, message) = (&self.flag, &self.key, &self.message);
        match flag.as_str() {
            // The file itself has no key, and the static services map has no flag.
            "config" => write!(f, "invalid configuration: --config: {message}"),
            "services" => write!(f, "invalid configuration: {key} (file only): {message}"),
            _ => write!(f, "invalid configuration: --{flag} ({key}): {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

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
pub(crate) fn yaml_key(flag: &str) -> String {
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

/// Reads a file named by `flag` and parses it; a refusal names the file and says what is wrong.
fn read_pem<T>(
    flag: &str,
    path: &Path,
    parse: impl Fn(&[u8]) -> Result<T, String>,
) -> Result<T, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::new(flag, format!("cannot read {}: {e}", path.display())))?;
    parse(&bytes).map_err(|m| ConfigError::new(flag, format!("{} {m}", path.display())))
}

/// A CA bundle must hold certificates usable as trust anchors now. Later rotations are the
/// reloader's business (a bad rotated file keeps the previous one); a bad file at start has no
/// previous one, so it is refused here.
fn ca_bundle(flag: &str, path: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    let path = existing_file(flag, path)?;
    if let Some(p) = &path {
        read_pem(flag, p, crate::tls::check_ca_pem)?;
    }
    Ok(path)
}

/// A certificate and its key: both or neither, both PEM, and the key must be the certificate's.
fn pair(
    cert_flag: &str,
    key_flag: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<CertKeyPair>, ConfigError> {
    let cert = existing_file(cert_flag, cert)?;
    let key = existing_file(key_flag, key)?;
    match (cert, key) {
        (Some(cert_file), Some(key_file)) => {
            let certs = read_pem(cert_flag, &cert_file, crate::tls::certs_from_pem)?;
            let key = read_pem(key_flag, &key_file, crate::tls::key_from_pem)?;
            crate::tls::check_pair(&certs, &key).map_err(|e| {
                ConfigError::new(
                    key_flag,
                    format!(
                        "the key in {} does not belong to the certificate in {} ({e}); give the \
                         key --{cert_flag} was issued for",
                        key_file.display(),
                        cert_file.display()
                    ),
                )
            })?;
            Ok(Some(CertKeyPair {
                cert_file,
                key_file,
            }))
        }
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
    core_endpoint(raw).map_err(|m| ConfigError::new("core-url", format!("{raw:?}: {m}")))
}

fn core_endpoint(raw: &str) -> Result<CoreEndpoint, String> {
    let bad = |m: &str| m.to_owned();
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

const LOG_LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// `--log-level` takes a level or a tracing filter (`info,aggregation_gateway=debug`). A bare word
/// that is not a level would be read by the filter as a target name and switch every other log
/// line off, so it is refused: a typo like "debgu" or "warning" must not silence the gateway.
/// The full filter syntax is checked again by the logger itself before start.
fn check_log_filter(filter: &str) -> Result<(), String> {
    let is_level = |s: &str| {
        LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s))
            || matches!(s, "0" | "1" | "2" | "3" | "4" | "5")
    };
    let accepted = format!(
        "use one of {}, or a filter like info,aggregation_gateway=debug (target=level, \
         comma-separated)",
        LOG_LEVELS.join(", ")
    );
    if filter.trim().is_empty() {
        return Err(format!("must not be empty; {accepted}"));
    }
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('[') {
            continue;
        }
        match directive.split_once('=') {
            None if !is_level(directive) => {
                return Err(format!("{directive:?} is not a log level; {accepted}"))
            }
            Some((_, level)) if !level.is_empty() && !is_level(level) => {
                return Err(format!(
                    "{level:?} in {directive:?} is not a log level; {accepted}"
                ))
            }
            _ => {}
        }
    }
    Ok(())
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
        // kube-apiserver's default since the HTTP/2 rapid-reset fixes: 0 means 100 streams.
        let http2_max_streams = match self.http2_max_streams_per_connection.unwrap_or(0) {
            0 => 100,
            n => n,
        };
        let serving = ServingConfig {
            cert: pair(
                "tls-cert-file",
                "tls-private-key-file",
                self.tls_cert_file,
                self.tls_private_key_file,
            )?,
            cert_dir: self.cert_dir.filter(|d| !d.as_os_str().is_empty()),
            cert_reload_interval: self
                .cert_reload_interval
                .map_or(crate::tls::DEFAULT_RESYNC, |d| d.0),
            tls13_only,
            cipher_suites,
            http2_max_streams,
            max_client_connections: self.max_client_connections.unwrap_or(0),
        };

        if serving.cert_reload_interval.is_zero() {
            return Err(ConfigError::new(
                "cert-reload-interval",
                "must be greater than 0s",
            ));
        }

        let authn = AuthnConfig {
            client_ca_file: ca_bundle("client-ca-file", self.client_ca_file)?,
            requestheader_client_ca_file: ca_bundle(
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
            authorize_metrics: self.authorize_metrics.unwrap_or(true),
        };

        let proxy_client = pair(
            "proxy-client-cert-file",
            "proxy-client-key-file",
            self.proxy_client_cert_file,
            self.proxy_client_key_file,
        )?;

        let trust = TrustConfig {
            manage: self
                .manage_extension_apiserver_authentication
                .unwrap_or(true),
            proxy_client_ca_file: ca_bundle("proxy-client-ca-file", self.proxy_client_ca_file)?,
        };
        if trust.proxy_client_ca_file.is_some() && proxy_client.is_none() {
            return Err(ConfigError::new(
                "proxy-client-ca-file",
                "needs --proxy-client-cert-file: it names the CA of that certificate",
            ));
        }

        // Its contents are checked by the gateway with kube-rs's own loader (the one it starts
        // with), before --check-config answers.
        let kubeconfig = existing_file("core-kubeconfig", self.core_kubeconfig)?;
        let endpoint = match self.core_url.as_deref() {
            Some(raw) => Some(parse_core_url(raw)?),
            None if kubeconfig.is_some() => None,
            None => Some(CoreEndpoint::Url("http://127.0.0.1:8080".to_owned())),
        };
        let ca_file = ca_bundle("core-ca-file", self.core_ca_file)?;
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
                label_selector: self
                    .apiservice_label_selector
                    .clone()
                    .filter(|s| !s.is_empty()),
            },
        };
        if let Some(selector) = &self.apiservice_label_selector {
            check_label_selector(selector).map_err(|m| {
                ConfigError::new(
                    "apiservice-label-selector",
                    format!(
                        "{selector:?}: {m}; selectors look like env=prod,tier in (a,b),!legacy"
                    ),
                )
            })?;
        }
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
            reject_forwarding_redirect: self.aggregator_reject_forwarding_redirect.unwrap_or(true),
            availability_interval: secs(self.apiservice_availability_interval, 30),
            discovery_refresh_interval: secs(self.discovery_refresh_interval, 60),
            static_services,
            readyz_reachable: self.readyz_aggregated_apiservice_reachable.unwrap_or(false),
        };
        let leader_election = crate::leader_election::leader_election(
            crate::leader_election::LeaderElectOptions {
                leader_elect: self.leader_elect,
                lease_duration: self.leader_elect_lease_duration,
                renew_deadline: self.leader_elect_renew_deadline,
                retry_period: self.leader_elect_retry_period,
                name: self.leader_elect_resource_name,
                namespace: self.leader_elect_resource_namespace,
            },
            &apiservices.source,
        )?;
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
            max_remote_request_body_bytes: self.apiservice_max_request_body_bytes.unwrap_or(0),
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
        check_log_filter(&level).map_err(|m| ConfigError::new("log-level", m))?;

        let audit_level = match one_of(
            "audit-policy-level",
            self.audit_policy_level.as_deref(),
            "Metadata",
            &["None", "Metadata"],
        )? {
            "None" => AuditLevel::None,
            _ => AuditLevel::Metadata,
        };

        let tracing = match &self.tracing_config_file {
            Some(path) => Some(crate::tracing_config::load(path)?),
            None => None,
        };

        Ok(Config {
            listen,
            serving,
            authn,
            authz,
            proxy_client,
            trust,
            core,
            apiservices,
            limits,
            shutdown_delay: secs(self.shutdown_delay_duration, 0),
            shutdown_timeout: secs(self.shutdown_timeout, 60),
            leader_election,
            logging: LoggingConfig { format, level },
            audit: AuditConfig {
                path: self.audit_log_path.filter(|p| !p.is_empty()),
                level: audit_level,
            },
            tracing,
        })
    }
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
        // kube-apiserver's: --http2-max-streams-per-connection=0 means 100.
        assert_eq!(c.serving.http2_max_streams, 100);
        // Bodies to remote APIServices are the backend's business unless asked.
        assert_eq!(c.limits.max_remote_request_body_bytes, 0);
        assert_eq!(c.limits.max_request_body_bytes, 3 * 1024 * 1024);
    }

    /// One row per `--core-url`: the endpoint it means, or a part of the refusal naming the flag.
    #[test]
    fn core_url_forms() {
        for (raw, want) in [
            (
                "unix:///run/x.sock",
                Ok(CoreEndpoint::Unix("/run/x.sock".into())),
            ),
            ("/run/x.sock", Ok(CoreEndpoint::Unix("/run/x.sock".into()))),
            (
                "https://10.0.0.1:6443/",
                Ok(CoreEndpoint::Url("https://10.0.0.1:6443".into())),
            ),
            (
                "ftp://x",
                Err("must start with http://, https:// or unix://"),
            ),
            ("http://", Err("missing host")),
            ("http://h/prefix", Err("must not have a path")),
            ("unix://relative", Err("needs an absolute path")),
            (
                "localhost:8080",
                Err("must start with http://, https:// or unix://"),
            ),
        ] {
            match (parse_core_url(raw), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{raw}"),
                (Err(err), Err(want)) => {
                    assert_eq!(err.flag, "core-url", "{raw}");
                    assert!(err.message.contains(want), "{raw}: {err}");
                }
                (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// One row per refused setting: the whole line printed at start, naming the flag and its YAML
    /// key (or, for the file-only `services`, where it is set).
    #[test]
    fn refusals_are_one_line_naming_flag_and_key() {
        for (case, yaml, flag, want) in [
            (
                "a value outside its choices",
                "apiserviceSource: files\n",
                "apiservice-source",
                "invalid configuration: --apiservice-source (apiserviceSource): \"files\" is not \
                 one of kube, file, none",
            ),
            (
                "a missing file is refused at start",
                "clientCaFile: /nonexistent/ca.crt\n",
                "client-ca-file",
                "invalid configuration: --client-ca-file (clientCaFile): cannot read \
                 /nonexistent/ca.crt: No such file or directory (os error 2)",
            ),
            (
                "the file source needs a directory",
                "apiserviceSource: file\n",
                "apiservice-dir",
                "invalid configuration: --apiservice-dir (apiserviceDir): required when \
                 --apiservice-source=file",
            ),
            (
                "static services must be https",
                "services:\n- namespace: w\n  name: api\n  urls: [http://127.0.0.1:1]\n",
                "services",
                "invalid configuration: services (file only): w/api: \"http://127.0.0.1:1\" must \
                 be an https:// URL (aggregated servers serve TLS)",
            ),
            (
                "a bad label selector is refused at validation",
                "apiserviceLabelSelector: \"owner in edge\"\n",
                "apiservice-label-selector",
                "invalid configuration: --apiservice-label-selector (apiserviceLabelSelector): \
                 \"owner in edge\": owner in needs a parenthesized list: owner in (a,b); \
                 selectors look like env=prod,tier in (a,b),!legacy",
            ),
            (
                "a timeout of zero",
                "requestTimeout: 0s\n",
                "request-timeout",
                "invalid configuration: --request-timeout (requestTimeout): must be greater than 0s",
            ),
            (
                "headers too small for a Kubernetes request",
                "maxHeaderBytes: 100\n",
                "max-header-bytes",
                "invalid configuration: --max-header-bytes (maxHeaderBytes): must be at least 8192",
            ),
            (
                "allowed names without the CA that signs them",
                "requestheaderAllowedNames: [front-proxy]\n",
                "requestheader-allowed-names",
                "invalid configuration: --requestheader-allowed-names \
                 (requestheaderAllowedNames): needs --requestheader-client-ca-file: names are \
                 only checked on certificates that CA signed",
            ),
        ] {
            let err = opts(yaml).validate().unwrap_err();
            assert_eq!(err.flag, flag, "{case}");
            assert_eq!(err.to_string(), want, "{case}");
        }
    }

    #[test]
    fn a_label_selector_reaches_the_kube_source() {
        let c = opts("apiserviceLabelSelector: \"owner in (edge),!legacy\"\n")
            .validate()
            .unwrap();
        assert_eq!(
            c.apiservices.source,
            ApiServiceSource::Kube {
                label_selector: Some("owner in (edge),!legacy".into())
            }
        );
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

    /// A CA and a leaf it signed, as PEM: (ca, leaf cert, leaf key).
    fn pki() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (ca_cert.pem(), leaf.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Every file flag, each given the files that make it valid, so a case can spoil one.
    fn all_files(dir: &Path, ca: &str, cert: &str, key: &str) -> Vec<(&'static str, String)> {
        let ca = write(dir, "ca.crt", ca);
        let cert = write(dir, "tls.crt", cert);
        let key = write(dir, "tls.key", key);
        vec![
            ("tlsCertFile", cert.clone()),
            ("tlsPrivateKeyFile", key.clone()),
            ("clientCaFile", ca.clone()),
            ("requestheaderClientCaFile", ca.clone()),
            ("proxyClientCertFile", cert.clone()),
            ("proxyClientKeyFile", key.clone()),
            ("coreUrl", "https://127.0.0.1:6443".to_owned()),
            ("coreCaFile", ca),
            ("coreClientCertFile", cert),
            ("coreClientKeyFile", key),
        ]
    }

    fn yaml(pairs: &[(&str, String)]) -> String {
        pairs.iter().map(|(k, v)| format!("{k}: {v:?}\n")).collect()
    }

    #[test]
    fn usable_pem_files_validate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let c = opts(&yaml(&all_files(dir.path(), &ca, &cert, &key)))
            .validate()
            .unwrap();
        assert!(c.serving.cert.is_some() && c.proxy_client.is_some());
        assert!(c.core.client_cert.is_some() && c.core.ca_file.is_some());
    }

    #[test]
    fn unusable_pem_files_are_refused_naming_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let good = all_files(dir.path(), &ca, &cert, &key);
        let not_pem = write(dir.path(), "not-pem", "hello\n");
        let der = write(dir.path(), "der", "0\u{1}\u{2}binary");
        let truncated = write(
            dir.path(),
            "truncated",
            &cert[..cert.find("-----END").unwrap()],
        );
        for (i, (key_name, _)) in good.iter().enumerate() {
            if *key_name == "coreUrl" {
                continue;
            }
            let is_key = key_name.ends_with("KeyFile");
            // A key where a certificate belongs (and the other way round) is the common mix-up.
            let swapped = if is_key { &good[0].1 } else { &good[1].1 };
            for (bad, want) in [
                (&not_pem, "is not PEM"),
                (&der, "is not PEM"),
                (
                    swapped,
                    if is_key {
                        "no unencrypted private key"
                    } else {
                        "no \"BEGIN CERTIFICATE\""
                    },
                ),
                (
                    &truncated,
                    "is truncated: a \"BEGIN CERTIFICATE\" block has no \"END CERTIFICATE\" line",
                ),
            ] {
                let mut pairs = good.clone();
                pairs[i].1 = bad.clone();
                let err = opts(&yaml(&pairs)).validate().unwrap_err();
                assert_eq!(err.key, *key_name, "{bad}: {err}");
                assert!(err.message.contains(bad.as_str()), "{err}");
                assert!(err.message.contains(want), "{key_name} {bad}: {err}");
            }
        }
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let (_, _, other_key) = pki();
        let other = write(dir.path(), "other.key", &other_key);
        for (cert_key, key_key) in [
            ("tlsCertFile", "tlsPrivateKeyFile"),
            ("proxyClientCertFile", "proxyClientKeyFile"),
            ("coreClientCertFile", "coreClientKeyFile"),
        ] {
            let mut pairs = all_files(dir.path(), &ca, &cert, &key);
            pairs.iter_mut().find(|(k, _)| *k == key_key).unwrap().1 = other.clone();
            let err = opts(&yaml(&pairs)).validate().unwrap_err();
            assert_eq!(err.key, key_key, "{err}");
            assert!(err.message.contains("does not belong"), "{err}");
            assert!(err.message.contains(&cert_key_flag(cert_key)), "{err}");
        }
    }

    fn cert_key_flag(key: &str) -> String {
        let mut flag = String::new();
        for c in key.chars() {
            if c.is_ascii_uppercase() {
                flag.push('-');
            }
            flag.push(c.to_ascii_lowercase());
        }
        format!("--{flag}")
    }

    #[test]
    fn log_level_takes_levels_and_filters_but_not_stray_words() {
        for ok in [
            "info",
            "DEBUG",
            "warn",
            "3",
            "info,aggregation_gateway=debug",
            "hyper=off,info,",
            "aggregation_gateway=",
            "[request]=trace",
        ] {
            opts(&format!("logLevel: {ok:?}\n")).validate().unwrap();
        }
        for bad in ["verbose", "warning", "debgu", "info,hyper=loud", " ", "6"] {
            let err = opts(&format!("logLevel: {bad:?}\n"))
                .validate()
                .unwrap_err();
            assert_eq!(err.flag, "log-level", "{bad:?}");
            assert!(
                err.message.contains("error, warn, info, debug, trace, off"),
                "{err}"
            );
        }
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
        assert_eq!(from_file.leader_election, defaults.leader_election);
        assert_eq!(
            from_file.apiservices.readyz_reachable,
            defaults.apiservices.readyz_reachable
        );
    }
}
