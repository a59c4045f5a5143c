//! The tower stack every request goes through, outermost first:
//!
//! 1. `access_log`: one line and the request metrics per request. Outermost so that errors the
//!    layers below answer themselves are logged and counted with their real code.
//! 2. `audit`: the Audit-ID and one audit event per request (it sees every answer, as the access
//!    log does); `audit::AuditCapture` after authentication tells it who the caller is.
//! 3. `rescue`: any error (and any panic) becomes a `metav1.Status`.
//! 4. `request_info`: parses verb/group/resource once; everything below decides on it.
//! 5. `authn`, then the audit capture.
//! 6. `limits`: in-flight limits (429) and request body size (413); long-running requests are
//!    not counted, so a thousand watches never starve ordinary requests.
//! 7. `timeout`: 504 for ordinary requests; watch/exec/attach/portforward/log/proxy are exempt.
//! 8. `authz`: SubjectAccessReview for requests to remote APIServices, the discovery and
//!    OpenAPI documents the gateway serves, and `/metrics`; it pins the routing snapshot it
//!    decided on for the router. Last, so only admitted requests cost a review and a hung
//!    review is bounded by the timeout.
//! 9. the router (`crate::router`).
//!
//! Every service here is always ready: back-pressure is an answer (429), not a stalled
//! `poll_ready`, because a stalled accept loop is worse for an API server than a fast refusal.

pub mod access_log;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod limits;
pub mod request_info;
pub mod rescue;
pub mod timeout;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// For a service that calls its inner service later, from its future: takes the inner service
/// (the one that was polled ready) and leaves a clone in its place.
pub(crate) fn take_inner<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// Where the router sent a request; set on the response for the access log, metrics and audit.
#[derive(Clone, Debug)]
pub enum RoutedTo {
    Gateway,
    Core,
    /// An APIService's route, carrying its label `apiservice/<name>`. The label is built once
    /// per route (see `routing::RouteTarget`), so tagging a response only clones an `Arc`.
    ApiService(Arc<str>),
}

impl RoutedTo {
    pub fn api_service(name: &str) -> Self {
        Self::ApiService(format!("apiservice/{name}").into())
    }

    /// The `routed` field of the access log and the metrics label.
    pub fn label(&self) -> &str {
        match self {
            Self::Gateway => "gateway",
            Self::Core => "core",
            Self::ApiService(label) => label,
        }
    }
}

/// Connection facts the listener attaches to every request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub remote: std::net::SocketAddr,
    /// The verified client certificate chain, leaf first, when the client presented one.
    pub peer_certs: Option<Arc<Vec<rustls::pki_types::CertificateDer<'static>>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_route() {
        assert_eq!(RoutedTo::Gateway.label(), "gateway");
        assert_eq!(RoutedTo::Core.label(), "core");
        assert_eq!(
            RoutedTo::api_service("v1alpha1.wardle.example.com").label(),
            "apiservice/v1alpha1.wardle.example.com"
        );
    }
}
