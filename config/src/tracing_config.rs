//! `--tracing-config-file`: the file kube-apiserver reads for its own request tracing, a
//! `TracingConfiguration` of `apiserver.config.k8s.io` (v1, v1beta1 or v1alpha1) with the OTLP
//! collector's `endpoint` and `samplingRatePerMillion`. The same file works for both, so an
//! operator who traces kube-apiserver traces the gateway with what they already have.
//!
//! The rules follow kube's `ValidateTracingConfiguration` (component-base/tracing/api/v1): the
//! rate lies in 0..=1000000, and the endpoint is a gRPC target (`host:port` or `dns:///host:port`);
//! kube's `unix://` targets are refused, since the gateway's exporter dials TCP only. Unlike kube,
//! an unknown key is refused too: a misspelled `samplingRatePerMillion` would otherwise silently
//! mean "sample nothing".

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ConfigError;

/// The flag every refusal here names.
const FLAG: &str = "tracing-config-file";

/// The API versions of `TracingConfiguration` kube-apiserver reads.
pub const API_VERSIONS: [&str; 3] = [
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];

/// kube's default collector: the OTLP/gRPC port on the same host.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";

/// A validated tracing configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// The file it came from, for the start-up log.
    pub file: PathBuf,
    /// The collector as `host:port` (OTLP over gRPC, plain TCP as kube dials it).
    pub endpoint: String,
    /// Requests sampled per million when no sampled parent says otherwise; 0 samples only the
    /// requests whose incoming `traceparent` is sampled.
    pub sampling_rate_per_million: u32,
}

/// The file as written. Numbers are read wide so that an out-of-range rate is refused by the
/// range check with its value, not by the YAML parser with a type error.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TracingConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    endpoint: Option<String>,
    sampling_rate_per_million: Option<i64>,
}

/// Reads and validates the file at `path`.
pub fn load(path: &Path) -> Result<TracingConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(FLAG, format!("cannot read {}: {e}", path.display())))?;
    parse(path, &text)
}

fn refuse(path: &Path, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::new(FLAG, format!("{}: {message}", path.display()))
}

/// Validates the text of the file at `path` (named in every refusal, with the field).
pub fn parse(path: &Path, text: &str) -> Result<TracingConfig, ConfigError> {
    let file: TracingConfiguration = serde_saphyr::from_str(text).map_err(|e| {
        let first = e.to_string();
        let first = first.lines().next().unwrap_or_default().to_owned();
        refuse(path, first)
    })?;
    match file.api_version.as_deref() {
        Some(v) if API_VERSIONS.contains(&v) => {}
        Some(v) => {
            return Err(refuse(
                path,
                format!(
                    "apiVersion: {v:?} is not one of {}",
                    API_VERSIONS.join(", ")
                ),
            ))
        }
        None => {
            return Err(refuse(
                path,
                format!("apiVersion: required, one of {}", API_VERSIONS.join(", ")),
            ))
        }
    }
    match file.kind.as_deref() {
        Some("TracingConfiguration") => {}
        Some(k) => {
            return Err(refuse(
                path,
                format!("kind: {k:?} must be TracingConfiguration"),
            ))
        }
        None => return Err(refuse(path, "kind: required, TracingConfiguration")),
    }
    let rate = file.sampling_rate_per_million.unwrap_or(0);
    if !(0..=1_000_000).contains(&rate) {
        return Err(refuse(
            path,
            format!("samplingRatePerMillion: {rate} must be between 0 and 1000000 (one million)"),
        ));
    }
    let endpoint = match file.endpoint {
        None => DEFAULT_ENDPOINT.to_owned(),
        Some(raw) => {
            grpc_target(&raw).map_err(|m| refuse(path, format!("endpoint: {raw:?}: {m}")))?
        }
    };
    Ok(TracingConfig {
        file: path.to_owned(),
        endpoint,
        sampling_rate_per_million: rate as u32,
    })
}

/// A gRPC target as kube accepts it (`host:port`, `dns:///host:port`, `dns:host:port`), as the
/// `host:port` the exporter dials.
fn grpc_target(raw: &str) -> Result<String, String> {
    let address = if let Some(rest) = raw.strip_prefix("dns:") {
        // `dns:///host:port`, or `dns://resolver/host:port` whose resolver is not ours to pick.
        match rest.strip_prefix("//") {
            Some(rest) => match rest.split_once('/') {
                Some(("", address)) => address,
                Some(_) => return Err("a DNS resolver authority is not supported; write dns:///host:port or host:port".into()),
                None => return Err("write dns:///host:port or host:port".into()),
            },
            None => rest,
        }
    } else if let Some((scheme, _)) = raw.split_once("://") {
        return Err(format!(
            "unsupported scheme {scheme:?}: write host:port (or dns:///host:port) of an OTLP/gRPC collector"
        ));
    } else {
        raw
    };
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("needs a port: host:port, e.g. localhost:4317".into());
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() || host.contains('/') || address.contains(char::is_whitespace) {
        return Err("needs a host: host:port, e.g. localhost:4317".into());
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("port {port:?} is not a port number (1-65535)"));
    }
    Ok(address.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<TracingConfig, String> {
        parse(Path::new("/etc/tracing.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn kube_apiservers_files_are_read_with_kubes_defaults() {
        for version in API_VERSIONS {
            let c = parsed(&format!(
                "apiVersion: {version}\nkind: TracingConfiguration\nendpoint: otel.monitoring:4317\nsamplingRatePerMillion: 100\n"
            ))
            .unwrap();
            assert_eq!(c.endpoint, "otel.monitoring:4317");
            assert_eq!(c.sampling_rate_per_million, 100);
        }
        let c =
            parsed("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n").unwrap();
        assert_eq!(c.endpoint, "localhost:4317");
        assert_eq!(c.sampling_rate_per_million, 0);
        // JSON is YAML too, as kube reads either.
        let c = parsed(r#"{"apiVersion":"apiserver.config.k8s.io/v1beta1","kind":"TracingConfiguration","endpoint":"dns:///127.0.0.1:4317"}"#).unwrap();
        assert_eq!(c.endpoint, "127.0.0.1:4317");
    }

    /// One row per mistake: the part of the refusal that names the field and what to change.
    #[test]
    fn mistakes_are_refused_naming_the_field() {
        let head = "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n";
        for (text, want) in [
            (
                "kind: TracingConfiguration\n".to_owned(),
                "apiVersion: required",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v2\nkind: TracingConfiguration\n".into(),
                "apiVersion: \"apiserver.config.k8s.io/v2\" is not one of",
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EgressSelectorConfiguration\n"
                    .into(),
                "kind: \"EgressSelectorConfiguration\" must be TracingConfiguration",
            ),
            (
                format!("{head}samplingRatePerMillion: 1000001\n"),
                "samplingRatePerMillion: 1000001 must be between 0 and 1000000",
            ),
            (
                format!("{head}samplingRatePerMillion: -1\n"),
                "samplingRatePerMillion: -1 must be between",
            ),
            (
                format!("{head}samplingRatePerMilion: 5\n"),
                "samplingRatePerMilion",
            ),
            (
                format!("{head}endpoint: unix:///var/run/otel.sock\n"),
                "endpoint: \"unix:///var/run/otel.sock\": unsupported scheme \"unix\"",
            ),
            (
                format!("{head}endpoint: http://otel:4318\n"),
                "unsupported scheme \"http\"",
            ),
            (
                format!("{head}endpoint: otel\n"),
                "endpoint: \"otel\": needs a port",
            ),
            (
                format!("{head}endpoint: otel:http\n"),
                "is not a port number",
            ),
            (format!("{head}endpoint: \":4317\"\n"), "needs a host"),
        ] {
            let err = parsed(&text).expect_err(&text);
            assert!(
                err.starts_with("invalid configuration: --tracing-config-file (tracingConfigFile): /etc/tracing.yaml: "),
                "{err}"
            );
            assert!(err.contains(want), "{text}: expected {want:?} in {err}");
        }
    }

    #[test]
    fn the_flag_and_the_yaml_key_reach_the_config() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tracing.yaml");
        std::fs::write(
            &file,
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: 1000000\n",
        )
        .unwrap();
        let cli = crate::Cli::try_parse_from([
            "gw".as_ref(),
            "--tracing-config-file".as_ref(),
            file.as_os_str(),
        ])
        .unwrap();
        let tracing = cli.options.validate().unwrap().tracing.unwrap();
        assert_eq!(tracing.sampling_rate_per_million, 1_000_000);
        assert_eq!(tracing.file, file);
        let yaml = format!("tracingConfigFile: {}\n", file.display());
        let from_yaml: crate::Options = serde_saphyr::from_str(&yaml).unwrap();
        assert!(from_yaml.validate().unwrap().tracing.is_some());
        assert!(crate::Options::default()
            .validate()
            .unwrap()
            .tracing
            .is_none());
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = load(Path::new("/nonexistent/tracing.yaml")).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot read /nonexistent/tracing.yaml"),
            "{err}"
        );
    }
}
