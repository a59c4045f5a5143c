//! How the Service an APIService names becomes an address to dial.
//!
//! Mirrors kube-aggregator's resolvers (`pkg/apiserver/resolvers.go`, apiserver
//! `pkg/util/proxy/proxy.go`) and the Service/EndpointSlice checks of its remote availability
//! controller, with the same error texts, so what `kubectl get apiservices` shows reads as it does
//! on a real cluster:
//! - ClusterIP routing (default): the Service's `clusterIP` and the APIService's port;
//!   `ExternalName` Services resolve to their DNS name.
//! - Endpoint routing (`--enable-aggregator-routing`): a ready endpoint of the Service, picked
//!   per call, so load spreads over pods instead of riding one connection to the ClusterIP.
//! - Static services from the config file: fixed URLs for backends outside any cluster.
//!
//! Resolution sits on the request path, so it is synchronous and reads in-memory state only: the
//! kube resolver's caches are kept current by watchers running beside it. Whoever must react to
//! that state changing (the availability controller re-checks APIServices when their Service or
//! endpoints change, and waits for the caches before its first check) subscribes with
//! [`ServiceResolver::changes`].
//!
//! One file per resolver: [`static_services`] (fixed URLs), [`kube`] (Services and
//! EndpointSlices from the core, with [`slice_index`] holding the EndpointSlices by Service) and
//! [`chain`] (the first of several that knows the Service). This module holds what they share:
//! the answer ([`Endpoint`] or [`ResolveError`]), the [`ServiceResolver`] trait, and [`Changes`].

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{ConditionStatus, ServiceRef};

mod chain;
mod kube;
mod slice_index;
mod static_services;

#[cfg(test)]
mod fixtures;

pub use chain::ChainResolver;
pub use kube::KubeResolver;
pub use static_services::{StaticResolver, StaticServiceError};

// === impl Endpoint ===

/// The addresses a Service can be reached at, shared rather than copied per request.
pub type Endpoints = Arc<[Endpoint]>;

/// A resolved address. `host` is a DNS name or an IP literal, IPv6 without brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }

    /// `host:port`, with an IPv6 host in brackets (`[fd00::1]:443`), as URLs and `Host` need it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `https://<authority>`: aggregated servers always speak TLS.
    pub fn url(&self) -> String {
        format!("https://{}", self.authority())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.authority())
    }
}

// === impl ResolveReason ===

/// Why a Service did not resolve, as kube-aggregator's availability condition names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResolveReason {
    /// The Service does not exist (condition `False`).
    ServiceNotFound,
    /// The Service could not be looked up, e.g. its cache has not synced (`Unknown`).
    ServiceAccessError,
    /// The Service has no port with the APIService's port number (`False`).
    ServicePortError,
    /// The EndpointSlices could not be looked up (`Unknown`).
    EndpointsAccessError,
    /// The Service has no EndpointSlices at all (`False`).
    EndpointsNotFound,
    /// No ready endpoint serves the Service port (`False`).
    MissingEndpoints,
    /// The Service exists but cannot be routed to: headless in ClusterIP mode, an unsupported
    /// type, no address. kube reports these from its discovery probe, as `FailedDiscoveryCheck`.
    Unroutable,
}

impl ResolveReason {
    /// The `reason` kube-aggregator writes on the `Available` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceNotFound => "ServiceNotFound",
            Self::ServiceAccessError => "ServiceAccessError",
            Self::ServicePortError => "ServicePortError",
            Self::EndpointsAccessError => "EndpointsAccessError",
            Self::EndpointsNotFound => "EndpointsNotFound",
            Self::MissingEndpoints => "MissingEndpoints",
            Self::Unroutable => "FailedDiscoveryCheck",
        }
    }

    /// The condition status kube uses with this reason: `Unknown` when we could not look, `False`
    /// when we looked and it is wrong.
    pub fn condition_status(self) -> ConditionStatus {
        match self {
            Self::ServiceAccessError | Self::EndpointsAccessError => ConditionStatus::Unknown,
            _ => ConditionStatus::False,
        }
    }
}

impl fmt::Display for ResolveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl ResolveError ===

/// A Service that did not resolve. `message` is kube's wording and goes into the condition as is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ResolveError {
    pub reason: ResolveReason,
    pub message: String,
}

impl ResolveError {
    pub fn new(reason: ResolveReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// `service/<name> in "<ns>" is not present`
    pub fn not_present(svc: &ServiceRef) -> Self {
        Self::new(
            ResolveReason::ServiceNotFound,
            format!("service/{} in {:?} is not present", svc.name, svc.namespace),
        )
    }

    fn cannot_check(reason: ResolveReason, svc: &ServiceRef, why: &str) -> Self {
        Self::new(
            reason,
            format!(
                "service/{} in {:?} cannot be checked due to: {why}",
                svc.name, svc.namespace
            ),
        )
    }

    fn not_listening(svc: &ServiceRef) -> Self {
        Self::new(
            ResolveReason::ServicePortError,
            format!(
                "service/{} in {:?} is not listening on port {}",
                svc.name, svc.namespace, svc.port
            ),
        )
    }

    fn unroutable(message: impl Into<String>) -> Self {
        Self::new(ResolveReason::Unroutable, message)
    }
}

// === ServiceResolver ===

/// Turns a Service reference into an address. Implementations read in-memory state only.
pub trait ServiceResolver: Send + Sync + 'static {
    /// The address to dial for one request or connection. Successive calls may return different
    /// addresses (round-robin over static URLs, endpoint routing).
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError>;

    /// Every address the Service can be reached at now, for the gateway's balancer to choose
    /// among: the ready endpoints with endpoint routing, a static service's URLs, otherwise the
    /// one address [`ServiceResolver::resolve`] gives.
    fn endpoints(&self, svc: &ServiceRef) -> Result<Endpoints, ResolveError> {
        self.resolve(svc).map(|e| Arc::from([e]))
    }

    /// kube-aggregator's availability pre-checks, before any discovery probe: the Service exists,
    /// and for a ClusterIP Service it listens on the port and has a ready endpoint for it. Routing
    /// does not depend on this (ClusterIP routing never looks at endpoints); availability does.
    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.resolve(svc).map(drop)
    }

    /// Whether the state this resolver reads is loaded. Before that, lookups answer
    /// `ServiceAccessError` rather than a misleading `ServiceNotFound`.
    fn synced(&self) -> bool {
        true
    }

    /// Fires after the state this resolver reads changed (including becoming synced). A
    /// resolver whose state never changes returns [`Changes::none`].
    fn changes(&self) -> Changes {
        Changes::none()
    }
}

// === impl Changes ===

/// A subscription to one or more resolvers' state changes. Changes are coalesced: one wake-up
/// after several changes, never a queue to work through.
#[derive(Debug, Default)]
pub struct Changes(Vec<watch::Receiver<()>>);

/// A subscription to a resolver that bumps `watch::Sender<()>` after each change.
impl From<watch::Receiver<()>> for Changes {
    fn from(rx: watch::Receiver<()>) -> Self {
        Self(vec![rx])
    }
}

impl Changes {
    /// Never fires.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Both subscriptions in one.
    pub fn merge(mut self, other: Changes) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Waits for a change not seen yet, and marks every pending change seen. Pends forever when
    /// nothing can change any more (no resolver with changing state, or all of them gone).
    pub async fn changed(&mut self) {
        loop {
            if self.0.is_empty() {
                return std::future::pending().await;
            }
            let waits = self.0.iter_mut().map(|rx| Box::pin(rx.changed()));
            let (result, index, _) = futures::future::select_all(waits).await;
            if result.is_ok() {
                self.mark_seen();
                return;
            }
            // That resolver's watchers are gone; its state is final.
            self.0.swap_remove(index);
        }
    }

    /// Forgets changes that happened so far (e.g. the rest of a burst after a debounce).
    pub fn mark_seen(&mut self) {
        for rx in &mut self.0 {
            rx.mark_unchanged();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_authority_brackets_ipv6() {
        assert_eq!(Endpoint::new("10.0.0.1", 443).authority(), "10.0.0.1:443");
        assert_eq!(Endpoint::new("fd00::1", 443).authority(), "[fd00::1]:443");
        assert_eq!(
            Endpoint::new("fd00::1", 8443).url(),
            "https://[fd00::1]:8443"
        );
        assert_eq!(
            Endpoint::new("api.example.com", 1).to_string(),
            "api.example.com:1"
        );
    }

    #[test]
    fn reasons_map_to_kube_condition_reasons() {
        assert_eq!(ResolveReason::ServiceNotFound.as_str(), "ServiceNotFound");
        assert_eq!(ResolveReason::MissingEndpoints.as_str(), "MissingEndpoints");
        assert_eq!(ResolveReason::Unroutable.as_str(), "FailedDiscoveryCheck");
        assert_eq!(
            ResolveReason::ServiceAccessError.condition_status(),
            ConditionStatus::Unknown
        );
        assert_eq!(
            ResolveReason::ServicePortError.condition_status(),
            ConditionStatus::False
        );
    }
}
