//! Logs through `tracing` to stderr, as text or JSON (--logging-format), at --log-level unless
//! RUST_LOG says otherwise. Text is coloured only when stderr is a terminal: a log collector, a
//! file or `kubectl logs` would otherwise show the escape codes as text.

use std::io::IsTerminal;

use gateway_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

/// The filter --log-level asks for, or why it is not one. Called before anything starts, so a bad
/// value is refused like every other setting rather than silently replaced.
pub fn filter(level: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(level).map_err(|e| {
        format!(
            "{level:?} is not a valid tracing filter ({e}); use a level (error, warn, info, debug, \
             trace, off) or target=level directives, comma-separated, e.g. \
             info,aggregation_gateway=debug"
        )
    })
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
    fn a_malformed_filter_is_refused_with_the_accepted_forms() {
        let err = filter("info,=debug").unwrap_err();
        assert!(err.contains("\"info,=debug\""), "{err}");
        assert!(err.contains("aggregation_gateway=debug"), "{err}");
        assert!(filter("gateway=verbose").is_err());
    }
}
