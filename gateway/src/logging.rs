//! Logs through `tracing` to stderr, as text or JSON (--logging-format), at --log-level unless
//! RUST_LOG says otherwise.

use gateway_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

pub fn init(cfg: &LoggingConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::try_new(&cfg.level).unwrap_or_else(|e| {
            eprintln!(
                "--log-level {:?} is not a valid filter ({e}); using info",
                cfg.level
            );
            EnvFilter::new("info")
        })
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cfg.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
}
