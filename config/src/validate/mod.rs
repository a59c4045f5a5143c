//! `Options → validate → Config`: defaults applied, every value checked before anything starts, and
//! a refusal that names the flag (and its YAML key) and says what to change. The types it produces
//! live in `config.rs`, the label-selector grammar it checks against in `selector.rs`, and reading
//! the `--config` file into [`Options`] in `file.rs`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::config::{
    ApiServiceConfig, ApiServiceSource, AuditConfig, AuditLevel, AuthnConfig, AuthzConfig, Config,
    CoreConfig, CoreEndpoint, CoreIdentity, Limits, LogFormat, LoggingConfig, RuntimeShape,
    ServingConfig, TrustConfig,
};
use crate::error::ConfigError;
use crate::options::Options;
use crate::selector::check_label_selector;

mod checks;

/// More worker threads than this is a typo, not a machine: tokio would start them all.
const MAX_WORKER_THREADS: u32 = 1024;
#[cfg(test)]
mod tests;

use checks::*;

impl Options {
    /// Applies defaults and checks every value. Files named by the user must exist.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let listen = SocketAddr::new(
            self.bind_address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            self.secure_port.unwrap_or(8443),
        );

        let runtime = match self.worker_threads.unwrap_or(1) {
            0 => RuntimeShape::PerCpu,
            1 => RuntimeShape::CurrentThread,
            n if n <= MAX_WORKER_THREADS => RuntimeShape::MultiThread(n),
            n => {
                return Err(ConfigError::new(
                    "worker-threads",
                    format!("{n} is more than {MAX_WORKER_THREADS} threads; use 0 for one per CPU"),
                ))
            }
        };

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
            anonymous_flag_set: self.anonymous_auth.is_some(),
            authentication_config: self.authentication_config,
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
        check_request_header_ca_overlap(&authn)?;

        let authz = AuthzConfig {
            webhook: self.authorization_webhook.unwrap_or(true),
            cache_authorized_ttl: secs(self.authorization_webhook_cache_authorized_ttl, 300),
            cache_unauthorized_ttl: secs(self.authorization_webhook_cache_unauthorized_ttl, 30),
            authorize_metrics: self.authorize_metrics.unwrap_or(true),
            constrained_impersonation: self.constrained_impersonation.unwrap_or(false),
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
            aggregator_reject_forwarding_redirect: self
                .aggregator_reject_forwarding_redirect
                .unwrap_or(true),
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
            priority_and_fairness: self.enable_priority_and_fairness.unwrap_or(true),
            max_requests_inflight: self.max_requests_inflight.unwrap_or(400),
            max_mutating_requests_inflight: self.max_mutating_requests_inflight.unwrap_or(200),
            request_timeout: secs(self.request_timeout, 60),
            max_request_body_bytes: self.max_request_body_bytes.unwrap_or(3 * 1024 * 1024),
            apiservice_max_request_body_bytes: self.apiservice_max_request_body_bytes.unwrap_or(0),
            header_read_timeout: secs(self.header_read_timeout, 10),
            max_header_bytes: self.max_header_bytes.unwrap_or(1024 * 1024),
        };
        if limits.priority_and_fairness
            && limits.max_requests_inflight == 0
            && limits.max_mutating_requests_inflight == 0
        {
            // kube-apiserver refuses this too: priority and fairness shares out their sum.
            return Err(ConfigError::new(
                "max-requests-inflight",
                "with --enable-priority-and-fairness, --max-requests-inflight and --max-mutating-requests-inflight must add up to more than 0",
            ));
        }
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
            runtime,
            serving,
            authn,
            authz,
            proxy_client,
            trust,
            core,
            apiservices,
            limits,
            shutdown_delay_duration: secs(self.shutdown_delay_duration, 0),
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
