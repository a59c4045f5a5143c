//! The set-up every end-to-end session with aggregated API servers shares: the certificates of one
//! scenario ([`Pki`]), a core, aggregated backends and the gateway started with them
//! ([`Scenario`], built by [`ScenarioBuilder`]), APIService manifests ([`ApiService`]), requests
//! as a user, and the fixtures' recorded requests. Test files describe their session with the
//! builder's few knobs instead of a set-up struct of their own, so each test starts exactly the
//! session its one behaviour needs.
//!
//! A scenario reads like this:
//!
//! ```no_run
//! # async fn session() {
//! use e2e::scenario::{Scenario, WARDLE_GROUP};
//!
//! let s = Scenario::wardle().start().await;
//! let alice = s.user("alice", &["dev"]);
//! s.kubectl(&alice)
//!     .apply_yaml(&s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle").yaml())
//!     .await;
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::certs::{CertifiedPair, TestCa};
use crate::harness::{
    self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, HarnessError, HttpClient,
    Kubectl, KubectlVersion,
};

/// The group served by the usual aggregated backend (the fixture's default).
pub const WARDLE_GROUP: &str = "wardle.example.com";

/// A path as a command-line argument.
pub fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

mod apiservice;
mod configmaps;
mod fairness;
mod on_core;
mod pki;
mod requests;
mod session;

pub use apiservice::*;
pub use configmaps::*;
pub use fairness::*;
pub use on_core::*;
pub use pki::*;
pub use requests::*;
pub use session::*;
