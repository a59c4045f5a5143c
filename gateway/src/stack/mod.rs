//! The tower stack every request goes through, outermost first:
//!
//! 1. `access_log`: one line and the request metrics per request. Outermost so that errors the
//!    layers below answer themselves are logged and counted with their real code.
//! 2. `audit`: the Audit-ID and one audit event per request (it sees every answer, as the access
//!    log does); `audit::AuditCaptureLayer` after authentication tells it who the caller is.
//! 3. `rescue`: any error (and any panic) becomes a `metav1.Status`.
//! 4. `request_info`: parses verb/group/resource once; everything below decides on it.
//! 5. `authn`, then the audit capture.
//! 6. `limits`: in-flight limits (429) and request body size (413); long-running requests are
//!    not counted, so a thousand watches never starve ordinary requests.
//! 7. `timeout`: 504 for ordinary requests; watch/exec/attach/portforward/log/proxy are exempt.
//! 8. `authz`: SubjectAccessReview for requests to remote APIServices and `/metrics`; last, so
//!    only admitted requests cost a review and a hung review is bounded by the timeout.
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

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where the router sent a request; set on the response for the access log and metrics.
#[derive(Clone, Debug)]
pub enum RoutedTo {
    Gateway,
    Core,
    ApiService(std::sync::Arc<str>),
}

impl RoutedTo {
    pub fn label(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Self::Gateway => "gateway".into(),
            Self::Core => "core".into(),
            Self::ApiService(name) => format!("apiservice/{name}").into(),
        }
    }
}

/// Connection facts the listener attaches to every request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub remote: std::net::SocketAddr,
    /// The verified client certificate chain, leaf first, when the client presented one.
    pub peer_certs: Option<std::sync::Arc<Vec<rustls::pki_types::CertificateDer<'static>>>>,
}
