//! Everything a user can set for aggregation-gateway: the YAML file, the flags (named as
//! kube-apiserver names them), their validation into a [`Config`] before anything starts, and the
//! TLS material (loading, self-signed generation, reloading). No networking lives here.

pub mod authentication;
pub mod config;
pub mod duration;
mod error;
mod file;
mod leader_election;
pub mod options;
mod selector;
pub mod tls;
pub mod tracing_config;
pub mod validate;

pub use config::{
    ApiServiceConfig, ApiServiceSource, AuditConfig, AuditLevel, AuthnConfig, AuthzConfig,
    CertKeyPair, Config, CoreConfig, CoreEndpoint, CoreIdentity, LeaderElection, Limits, LogFormat,
    LoggingConfig, RuntimeShape, ServingConfig, TrustConfig,
};
pub use duration::GoDuration;
pub use error::ConfigError;
pub use file::load;
pub use options::{Cli, Options, StaticService};
pub use tracing_config::TracingConfig;
