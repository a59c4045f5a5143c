//! Logs through `tracing` to stderr, as text or JSON (--logging-format), at --log-level unless
//! RUST_LOG says otherwise. Text is coloured only when stderr is a terminal: a log collector, a
//! file or `kubectl logs` would otherwise show the escape codes as text.

use std::io::IsTerminal;

use gateway_config::{LogFormat, LoggingConfig};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// kube-client's own warnings when a watch connection ends (`eof in poll`, `timeout in poll`,
/// the whole error in its Debug form, one per watch): the loop behind each watch logs the loss
/// of the core once (`apiservice::outage`), so these show only when the filter reaches debug or
/// names `kube_client` itself.
const KUBE_CLIENT_AT_DEBUG: &str = "kube_client::client=error";

/// The filter --log-level asks for, or why it is not one. Called before anything starts, so a bad
/// value is refused like every other setting rather than silently replaced.
pub fn filter(level: &str) -> Result<EnvFilter, String> {
    let filter = EnvFilter::try_new(level).map_err(|e| {
        format!(
            "{level:?} is not a valid tracing filter ({e}); use a level (error, warn, info, debug, \
             trace, off) or target=level directives, comma-separated, e.g. \
             info,aggregation_gateway=debug"
        )
    })?;
    let verbose = filter
        .max_level_hint()
        .is_some_and(|max| max >= LevelFilter::DEBUG);
    if verbose || level.contains("kube_client") {
        return Ok(filter);
    }
    Ok(filter.add_directive(KUBE_CLIENT_AT_DEBUG.parse().expect("a valid directive")))
}

/// Installs the subscriber. RUST_LOG, when set and valid, wins over `level` (the --log-level
/// filter); an invalid RUST_LOG is reported and ignored, since the environment is not
/// configuration we can refuse.
pub fn init(cfg: &LoggingConfig, level: EnvFilter) {
    let from_env =
        std::env::var_os(EnvFilter::DEFAULT_ENV).map(|_| EnvFilter::try_from_default_env());
    let (filter, env_error) = match from_env {
        Some(Ok(env)) => (env, None),
        Some(Err(e)) => (level, Some(e)),
        None => (level, None),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cfg.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
    if let Some(error) = env_error {
        tracing::warn!(%error, level = %cfg.level, "RUST_LOG is not a valid filter; using --log-level");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives_are_filters() {
        for ok in [
            "info",
            "DEBUG",
            "warn,aggregation_gateway=trace",
            "hyper=off,info",
        ] {
            assert!(filter(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn kube_clients_own_warnings_show_from_debug_on() {
        let shown = |level: &str| filter(level).unwrap().to_string().contains("kube_client");
        assert!(shown("info"), "quietened at info");
        assert!(shown("warn"));
        // At debug the directive is left out, and a filter naming kube_client is the user's.
        assert!(!shown("debug"));
        assert!(!shown("info,aggregation_gateway=trace"));
        let own = filter("info,kube_client=warn").unwrap().to_string();
        assert!(!own.contains("kube_client::client=error"), "{own}");
    }

    #[test]
    fn a_malformed_filter_is_refused_with_the_accepted_forms() {
        let err = filter("info,=debug").unwrap_err();
        assert!(err.contains("\"info,=debug\""), "{err}");
        assert!(err.contains("aggregation_gateway=debug"), "{err}");
        assert!(filter("gateway=verbose").is_err());
    }
}
