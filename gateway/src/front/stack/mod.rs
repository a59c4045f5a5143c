//! The tower stack every request goes through, outermost first:
//!
//! 1. `access_log`: one line and the request metrics per request. Outermost so that errors the
//!    layers below answer themselves are logged and counted with their real code.
//! 2. `audit`: the Audit-ID and one audit event per request (it sees every answer, as the access
//!    log does); `audit::AuditCapture` after authentication tells it who the caller is.
//! 3. `trace`: one OpenTelemetry span per request (with `--tracing-config-file`) and the trace
//!    context the backends receive. Below `audit`, so the span carries the Audit-ID as kube's
//!    does; above `rescue`, so it records the status the client gets for every answer, errors
//!    included, and is the parent of everything the layers below do.
//! 4. `rescue`: any error (and any panic) becomes a `metav1.Status`.
//! 5. `request_info` (kube's `WithRequestInfo` filter): parses verb/group/resource once; everything below decides on it.
//! 6. `authn`, then the audit capture.
//! 7. `limits`: in-flight limits (429) and request body size (413); long-running requests are
//!    not counted, so a thousand watches never starve ordinary requests.
//! 8. `timeout`: 504 for ordinary requests; watch/exec/attach/portforward/log/proxy are exempt.
//! 9. `authz`: SubjectAccessReview for requests to remote APIServices, the discovery and
//!    OpenAPI documents the gateway serves, and `/metrics`; it pins the routing snapshot it
//!    decided on for the router. Last, so only admitted requests cost a review and a hung
//!    review is bounded by the timeout.
//! 10. the router (`crate::handlers::router`).
//!
//! Every layer forwards `poll_ready` to the one below it, and the router at the bottom is always
//! ready: back-pressure is an answer (429 from `limits`), not a stalled `poll_ready`, because a
//! stalled connection is worse for an API server than a fast refusal.

pub mod access_log;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod limits;
pub mod request_info;
pub mod rescue;
pub mod timeout;
pub mod trace;

/// For a service that calls its inner service later, from its future: takes the inner service
/// (the one that was polled ready) and leaves a clone in its place.
pub(crate) fn take_inner<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}
