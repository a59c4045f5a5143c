//! The small checks `Options::validate` applies to single values: files that must exist, PEM
//! material, certificate/key pairs, the core URL, one-of choices and the log filter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{AuthnConfig, CertKeyPair, CoreEndpoint};

use crate::error::ConfigError;

pub(super) fn secs(d: Option<crate::GoDuration>, default: u64) -> Duration {
    d.map(|d| d.0).unwrap_or(Duration::from_secs(default))
}

/// A file the user named must exist and be readable now; better refused at start than at the
/// first request.
pub(super) fn existing_file(
    flag: &str,
    path: Option<PathBuf>,
) -> Result<Option<PathBuf>, ConfigError> {
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
pub(super) fn read_pem<T>(
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
pub(super) fn ca_bundle(flag: &str, path: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    let path = existing_file(flag, path)?;
    if let Some(p) = &path {
        read_pem(flag, p, crate::tls::check_ca_pem)?;
    }
    Ok(path)
}

/// kube-apiserver's rule since 1.35 (`pkg/kubeapiserver/options/authentication.go`): when the
/// user CA bundle and the front-proxy CA bundle share a certificate and no front-proxy names are
/// listed, every user certificate from that CA would also pass as a front proxy and could name
/// anyone in `X-Remote-User`. kube refuses to start then; so do we, with the way out in the
/// message. Certificates are compared by their DER bytes, as Go's `x509.Certificate.Equal` does,
/// so one CA in two files (or in a larger bundle) counts.
pub(super) fn check_request_header_ca_overlap(authn: &AuthnConfig) -> Result<(), ConfigError> {
    let (Some(client_ca), Some(front_proxy_ca)) =
        (&authn.client_ca_file, &authn.requestheader_client_ca_file)
    else {
        return Ok(());
    };
    if !authn.requestheader_allowed_names.is_empty() {
        return Ok(());
    }
    let users = read_pem("client-ca-file", client_ca, crate::tls::certs_from_pem)?;
    let proxies = read_pem(
        "requestheader-client-ca-file",
        front_proxy_ca,
        crate::tls::certs_from_pem,
    )?;
    if users.iter().any(|u| proxies.iter().any(|p| p == u)) {
        return Err(ConfigError::new(
            "requestheader-allowed-names",
            format!(
                "required because --client-ca-file and --requestheader-client-ca-file share a CA \
                 certificate ({} and {}): without it any user certificate of that CA could set \
                 X-Remote-* headers and act as any user; list the front proxy's certificate \
                 common names, or give the front proxy a CA of its own",
                client_ca.display(),
                front_proxy_ca.display()
            ),
        ));
    }
    Ok(())
}

/// A certificate and its key: both or neither, both PEM, and the key must be the certificate's.
pub(super) fn pair(
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

pub(super) fn parse_core_url(raw: &str) -> Result<CoreEndpoint, ConfigError> {
    core_endpoint(raw).map_err(|m| ConfigError::new("core-url", format!("{raw:?}: {m}")))
}

pub(super) fn core_endpoint(raw: &str) -> Result<CoreEndpoint, String> {
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

pub(super) fn one_of<'a>(
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
pub(super) fn check_log_filter(filter: &str) -> Result<(), String> {
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
