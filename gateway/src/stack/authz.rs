//! Authorization of requests the gateway answers for, by a `SubjectAccessReview` on the core.
//!
//! kube-aggregator runs inside kube-apiserver, whose filter chain authorizes every request before
//! the aggregator sees it. The gateway sits in front of a core that authorizes its own requests,
//! so authorizing those again would only double the SubjectAccessReviews. What nobody else
//! authorizes is:
//! - requests routed to a **remote** APIService (the aggregated server trusts our `X-Remote-*`
//!   headers and typically delegates authorization back to the core itself, but kube's contract
//!   is that the aggregator has already authorized the request; we keep that contract);
//! - `/metrics` (non-resource URL, verb `get`) with `--authorize-metrics`.
//!
//! Health endpoints, discovery documents the gateway merges itself, and everything routed to the
//! core pass through untouched. The layer sits last before the router (after the timeout, so a
//! hung SubjectAccessReview is bounded by the request timeout) and decides from one load of the
//! routing snapshot, the same lookup the router makes.
//!
//! Errors reaching the core's SubjectAccessReview API answer **503** with `Retry-After: 1`, not
//! kube-apiserver's 500: the authorizer is a remote dependency that is temporarily unreachable,
//! not a bug in the gateway, and 503 + Retry-After is what clients retry. Errors are not cached.

use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route::Lookup;
use http::{Method, StatusCode};
use tower::{Layer, Service};

use super::BoxFuture;
use crate::auth::sar::{self, Action, Attributes, DecisionCache};
use crate::body::{BoxError, Request, Response};
use crate::identity::UserInfo;
use crate::request_info::RequestInfo;
use crate::routing::{Routing, Target};
use crate::status::{status_response, StatusDetails};

/// What authorization decided for a request, carried on the response for the audit log
/// (`authorization.k8s.io/decision` and `authorization.k8s.io/reason`).
#[derive(Clone, Debug)]
pub struct AuthzOutcome {
    /// `allow` or `forbid`; `None` when no decision could be made (the review failed).
    pub decision: Option<&'static str>,
    pub reason: Arc<str>,
}

pub struct Authorizer {
    client: kube::Client,
    cache: DecisionCache,
    routing: Arc<Routing>,
    /// Authorize requests to remote APIServices (`--authorization-webhook`).
    remote: bool,
    /// Authorize `/metrics` (`--authorize-metrics`).
    metrics: bool,
}

impl Authorizer {
    pub fn new(
        client: kube::Client,
        routing: Arc<Routing>,
        config: &gateway_config::AuthzConfig,
    ) -> Self {
        Self {
            client,
            cache: DecisionCache::new(config.cache_authorized_ttl, config.cache_unauthorized_ttl),
            routing,
            remote: config.webhook,
            metrics: config.authorize_metrics,
        }
    }

    /// Whether the gateway must authorize this request itself.
    fn applies(&self, req: &Request) -> bool {
        let path = req.uri().path();
        if path == "/metrics" {
            return self.metrics && matches!(*req.method(), Method::GET | Method::HEAD);
        }
        if !self.remote {
            return false;
        }
        let table = self.routing.load();
        match table.lookup(path) {
            Lookup::GroupVersion(route) | Lookup::LegacyCore(route) => {
                !matches!(route.backend, Target::Local)
            }
            Lookup::Group(_) | Lookup::None => false,
        }
    }
}

/// The attributes kube-apiserver's authorization filter derives from a request.
fn action<'a>(info: &'a RequestInfo, path: &'a str) -> Action<'a> {
    if info.is_resource_request {
        Action::Resource {
            verb: &info.verb,
            group: &info.api_group,
            version: &info.api_version,
            resource: &info.resource,
            subresource: &info.subresource,
            namespace: &info.namespace,
            name: &info.name,
        }
    } else {
        Action::NonResource {
            path,
            verb: &info.verb,
        }
    }
}

/// Go's `%q` for the strings that appear in these messages.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// kube-apiserver's Forbidden answer (`responsewriters.Forbidden` + `apierrors.NewForbidden`):
/// the message and the Status details.
pub fn forbidden(user: &str, action: &Action<'_>, reason: &str) -> (String, StatusDetails) {
    let (what, group, resource, name) = match *action {
        Action::NonResource { path, verb } => (
            format!(
                "User {} cannot {verb} path {}",
                go_quote(user),
                go_quote(path)
            ),
            "",
            "",
            "",
        ),
        Action::Resource {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name,
            ..
        } => {
            let full = if subresource.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}/{subresource}")
            };
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace {}", go_quote(namespace))
            };
            (
                format!(
                    "User {} cannot {verb} resource {} in API group {} {scope}",
                    go_quote(user),
                    go_quote(&full),
                    go_quote(group)
                ),
                group,
                resource,
                name,
            )
        }
    };
    // kube's sanitizer: nothing in an error may look like HTML.
    let mut err = what
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    if !reason.is_empty() {
        err.push_str(": ");
        err.push_str(reason);
    }
    let qualified = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    let message = if qualified.is_empty() && group.is_empty() {
        format!("forbidden: {err}")
    } else if name.is_empty() {
        format!("{qualified} is forbidden: {err}")
    } else {
        format!("{qualified} {} is forbidden: {err}", go_quote(name))
    };
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let details = StatusDetails {
        name: some(name),
        group: some(group),
        kind: some(resource),
        ..Default::default()
    };
    (message, details)
}

#[derive(Clone)]
pub struct AuthzLayer {
    /// `None`: authorization is off (`--authorization-webhook=false` and no `--authorize-metrics`).
    pub authorizer: Option<Arc<Authorizer>>,
}

impl<S> Layer<S> for AuthzLayer {
    type Service = Authz<S>;
    fn layer(&self, inner: S) -> Authz<S> {
        Authz {
            inner,
            authorizer: self.authorizer.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authz<S> {
    inner: S,
    authorizer: Option<Arc<Authorizer>>,
}

fn with_outcome(mut resp: Response, outcome: AuthzOutcome) -> Response {
    resp.extensions_mut().insert(outcome);
    resp
}

impl<S> Service<Request> for Authz<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let Some(authorizer) = self.authorizer.as_ref().filter(|a| a.applies(&req)) else {
            return Box::pin(self.inner.call(req));
        };
        let authorizer = authorizer.clone();
        // The inner service is called later, from the future: take the ready clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let anonymous;
            let user = match req.extensions().get::<UserInfo>() {
                Some(u) => u,
                None => {
                    anonymous = UserInfo::anonymous();
                    &anonymous
                }
            };
            let fallback;
            let info = match req.extensions().get::<RequestInfo>() {
                Some(i) => i,
                None => {
                    fallback = RequestInfo {
                        path: req.uri().path().to_owned(),
                        verb: req.method().as_str().to_ascii_lowercase(),
                        ..Default::default()
                    };
                    &fallback
                }
            };
            let attrs = Attributes {
                user,
                action: action(info, req.uri().path()),
            };
            let decision = match sar::cached_review(&authorizer.client, &authorizer.cache, &attrs)
                .await
            {
                Ok((decision, _cached)) => decision,
                Err(e) => {
                    tracing::warn!(error = %e, user = %user.name, path = %req.uri().path(), "authorization failed");
                    let resp = status_response(
                            StatusCode::SERVICE_UNAVAILABLE,
                            &format!(
                                "authorization error: {e}; the request was not forwarded, retry shortly"
                            ),
                            Some(StatusDetails {
                                retry_after_seconds: Some(1),
                                ..Default::default()
                            }),
                        );
                    return Ok(with_outcome(
                        resp,
                        AuthzOutcome {
                            decision: None,
                            reason: "internal error".into(),
                        },
                    ));
                }
            };
            if !decision.allowed {
                let (message, details) = forbidden(&user.name, &attrs.action, &decision.reason);
                tracing::debug!(user = %user.name, %message, "forbidden");
                let resp = status_response(StatusCode::FORBIDDEN, &message, Some(details));
                return Ok(with_outcome(
                    resp,
                    AuthzOutcome {
                        decision: Some("forbid"),
                        reason: decision.reason,
                    },
                ));
            }
            let resp = inner.call(req).await?;
            Ok(with_outcome(
                resp,
                AuthzOutcome {
                    decision: Some("allow"),
                    reason: decision.reason,
                },
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource<'a>(verb: &'a str, ns: &'a str, name: &'a str, sub: &'a str) -> Action<'a> {
        Action::Resource {
            verb,
            group: "wardle.example.com",
            version: "v1alpha1",
            resource: "flunders",
            subresource: sub,
            namespace: ns,
            name,
        }
    }

    #[test]
    fn namespaced_list_reads_like_kube() {
        let (message, details) = forbidden("alice", &resource("list", "default", "", ""), "");
        assert_eq!(
            message,
            "flunders.wardle.example.com is forbidden: User \"alice\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"default\""
        );
        assert_eq!(details.group.as_deref(), Some("wardle.example.com"));
        assert_eq!(details.kind.as_deref(), Some("flunders"));
        assert_eq!(details.name, None);
    }

    #[test]
    fn named_subresource_cluster_scope_and_reason() {
        let (message, details) =
            forbidden("bob", &resource("update", "", "f1", "status"), "no rule");
        assert_eq!(
            message,
            "flunders.wardle.example.com \"f1\" is forbidden: User \"bob\" cannot update resource \"flunders/status\" in API group \"wardle.example.com\" at the cluster scope: no rule"
        );
        assert_eq!(details.name.as_deref(), Some("f1"));
    }

    #[test]
    fn core_group_and_non_resource() {
        let pods = Action::Resource {
            verb: "get",
            group: "",
            version: "v1",
            resource: "pods",
            subresource: "",
            namespace: "kube-system",
            name: "p",
        };
        assert_eq!(
            forbidden("u", &pods, "").0,
            "pods \"p\" is forbidden: User \"u\" cannot get resource \"pods\" in API group \"\" in the namespace \"kube-system\""
        );
        let metrics = Action::NonResource {
            path: "/metrics",
            verb: "get",
        };
        let (message, details) = forbidden("system:anonymous", &metrics, "");
        assert_eq!(
            message,
            "forbidden: User \"system:anonymous\" cannot get path \"/metrics\""
        );
        assert!(details.kind.is_none() && details.group.is_none());
    }

    #[test]
    fn html_and_quotes_are_escaped() {
        let path = Action::NonResource {
            path: "/x<script>\"",
            verb: "get",
        };
        assert_eq!(
            forbidden("a&b", &path, "").0,
            "forbidden: User \"a&amp;b\" cannot get path \"/x&lt;script&gt;\\\"\""
        );
    }
}
