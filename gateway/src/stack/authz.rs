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
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::{take_inner, BoxFuture};
use crate::auth::forbidden::forbidden;
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
                !matches!(route.backend.target, Target::Local)
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

#[derive(Clone)]
pub struct Authz<S> {
    inner: S,
    /// `None`: authorization is off (`--authorization-webhook=false` and no `--authorize-metrics`).
    authorizer: Option<Arc<Authorizer>>,
}

impl<S> Authz<S> {
    pub fn layer(authorizer: Option<Arc<Authorizer>>) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self {
            inner,
            authorizer: authorizer.clone(),
        })
    }
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
        let mut inner = take_inner(&mut self.inner);
        Box::pin(async move {
            let user: &UserInfo = req
                .extensions()
                .get::<Arc<UserInfo>>()
                .unwrap_or(UserInfo::shared_anonymous());
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
