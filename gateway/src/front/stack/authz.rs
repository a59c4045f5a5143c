//! Authorization of requests the gateway answers for, by a `SubjectAccessReview` on the core.
//!
//! kube-aggregator runs inside kube-apiserver, whose filter chain authorizes every request before
//! the aggregator sees it. The gateway sits in front of a core that authorizes its own requests,
//! so authorizing those again would only double the SubjectAccessReviews. What nobody else
//! authorizes is:
//! - requests routed to a **remote** APIService (the aggregated server trusts our `X-Remote-*`
//!   headers and typically delegates authorization back to the core itself, but kube's contract
//!   is that the aggregator has already authorized the request; we keep that contract);
//! - the discovery and OpenAPI v3 documents the gateway serves itself (`GET /api`, `/apis`,
//!   `/apis/<group>`, `/openapi/v3[/...]`): kube-apiserver requires the non-resource permission
//!   for them (role `system:discovery`, bound to `system:authenticated`), so an anonymous caller
//!   must not read through the gateway what the core would refuse. Such a path may still fall
//!   through to the core (legacy `/api`, the core's own OpenAPI documents); it is then reviewed
//!   twice, which the decision cache makes cheap;
//! - `/metrics` (non-resource URL, verb `get`) with `--authorize-metrics`;
//! - the debug dumps of API Priority and Fairness (`/debug/api_priority_and_fairness/dump_*`,
//!   non-resource URLs, verb `get`) whenever the gateway serves them, even with
//!   `--authorization-webhook=false --authorize-metrics=false`: kube-apiserver authorizes them as
//!   any other path, and they name users and what they ask (see `app::stack`).
//!
//! Health endpoints and everything else routed to the core pass through untouched. The layer
//! sits last before the router (after the timeout, so a hung SubjectAccessReview is bounded by
//! the request timeout). It decides from one load of the routing snapshot and pins that snapshot
//! on the request ([`PinnedRoutes`]), so the router sends the request where it was authorized
//! for: an APIService turning from local to remote in between cannot make a request reach a
//! remote backend unreviewed.
//!
//! Errors reaching the core's SubjectAccessReview API answer **503** with `Retry-After: 1`, not
//! kube-apiserver's 500: the authorizer is a remote dependency that is temporarily unreachable,
//! not a bug in the gateway, and 503 + Retry-After is what clients retry. Errors are not cached.

use std::sync::Arc;
use std::task::{Context, Poll};

use apiservice::route_table::Lookup;
use futures::future::Either;
use http::{Method, StatusCode};
use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::take_inner;
use crate::auth::forbidden::forbidden;
use crate::auth::sar::{self, Action, Attributes, DecisionCache};
use crate::auth::selector::Selectors;
use crate::body::BoxFuture;
use crate::body::{BoxError, Request, Response};
use crate::control::apiservices::{Routing, Target};
use crate::error::without_addresses;
use crate::handlers::discovery::classify;
use crate::handlers::priority_and_fairness;
use crate::handlers::router::PinnedRoutes;
use crate::identity::UserInfo;
use crate::request_info::RequestInfo;
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
    /// Authorize the debug dumps of API Priority and Fairness (the gateway serves them).
    flow_control_dumps: bool,
}

// === impl Authorizer ===

impl Authorizer {
    /// `flow_control_dumps`: the gateway serves the debug dumps of API Priority and Fairness.
    pub fn new(
        client: kube::Client,
        routing: Arc<Routing>,
        config: &gateway_config::AuthzConfig,
        flow_control_dumps: bool,
    ) -> Self {
        Self {
            client,
            cache: DecisionCache::new(
                "SubjectAccessReview",
                config.cache_authorized_ttl,
                config.cache_unauthorized_ttl,
            ),
            routing,
            remote: config.webhook,
            metrics: config.authorize_metrics,
            flow_control_dumps,
        }
    }

    /// Whether the gateway must authorize this request itself. With the webhook on, also pins
    /// the routing snapshot the decision was made on, for the router.
    fn applies(&self, req: &mut Request) -> bool {
        // The decoded path, as the router matches routes and answers on it (see `router`).
        let path = crate::request_info::decided_path(req);
        if path == "/metrics" {
            return self.metrics && matches!(*req.method(), Method::GET | Method::HEAD);
        }
        let dump = self.flow_control_dumps
            && priority_and_fairness::is_dump(path)
            && matches!(*req.method(), Method::GET | Method::HEAD);
        if !self.remote {
            return dump;
        }
        let table = self.routing.load_full();
        let applies = dump
            || match table.lookup(path) {
                Lookup::GroupVersion(route) | Lookup::LegacyCore(route) => {
                    !matches!(route.backend.target, Target::Local)
                }
                Lookup::Group(_) | Lookup::None => is_discovery_document(req.method(), path),
            };
        req.extensions_mut().insert(PinnedRoutes(table));
        applies
    }
}

/// A discovery or OpenAPI v3 document the gateway may answer from its own cache (the discovery
/// handler answers `GET` only; anything else reaches the core, which authorizes it).
fn is_discovery_document(method: &Method, path: &str) -> bool {
    method == Method::GET && classify(path).is_some()
}

#[derive(Clone)]
pub struct Authz<S> {
    inner: S,
    /// `None`: authorization is off (`--authorization-webhook=false`, `--authorize-metrics=false`
    /// and `--enable-priority-and-fairness=false`: nothing the gateway serves needs a review).
    authorizer: Option<Arc<Authorizer>>,
}

// === impl Authz ===

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
    /// A request no review applies to (most: everything that falls through to the core) is
    /// the inner call itself, with no future of this layer's own.
    type Future = Either<S::Future, BoxFuture<Result<Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let Some(authorizer) = self.authorizer.as_ref().filter(|a| a.applies(&mut req)) else {
            return Either::Left(self.inner.call(req));
        };
        let authorizer = authorizer.clone();
        let mut inner = take_inner(&mut self.inner);
        Either::Right(Box::pin(async move {
            let user: &UserInfo =
                crate::auth::request_user(req.extensions()).unwrap_or(UserInfo::shared_anonymous());
            let fallback;
            let info = match req.extensions().get::<Arc<RequestInfo>>() {
                Some(i) => i,
                None => {
                    fallback = RequestInfo::non_resource(req.method(), req.uri().path());
                    &fallback
                }
            };
            let attrs = Attributes {
                user,
                action: Action::of_request(info, info.verb()),
                selectors: Selectors {
                    label: info.label_selector(),
                    field: info.field_selector(),
                },
            };
            let decision = match sar::cached_review(&authorizer.client, &authorizer.cache, &attrs)
                .await
            {
                Ok((decision, _cached)) => decision,
                Err(e) => {
                    // The decision cache logs the outage once; this request's 503 says why.
                    tracing::debug!(error = %e, user = %user.name, path = %req.uri().path(), "authorization failed");
                    let resp = status_response(
                            StatusCode::SERVICE_UNAVAILABLE,
                            &without_addresses(&format!(
                                "authorization error: {e}; the request was not forwarded, retry shortly"
                            )),
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
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};

    use super::*;
    use crate::body;

    /// A core whose SubjectAccessReviews allow non-resource requests of authenticated users
    /// only (kube's `system:discovery`), recording every review it answers.
    fn core(reviews: Arc<Mutex<Vec<Value>>>) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let reviews = reviews.clone();
            async move {
                let bytes = req.into_body().collect().await?.to_bytes();
                let mut review: Value = serde_json::from_slice(&bytes)?;
                let spec = &review["spec"];
                let allowed = spec["nonResourceAttributes"].is_object()
                    && spec["groups"]
                        .as_array()
                        .is_some_and(|g| g.iter().any(|g| g == "system:authenticated"));
                reviews.lock().unwrap().push(spec.clone());
                review["status"] = json!({"allowed": allowed});
                let resp = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(Bytes::from(review.to_string())))?;
                Ok::<_, BoxError>(resp)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The router's stand-in: answers 200 and counts the requests that reached it, checking
    /// that each carries the routing snapshot authorization used.
    #[derive(Clone)]
    struct Inner {
        reached: Arc<AtomicUsize>,
        routing: Arc<Routing>,
    }

    impl Service<Request> for Inner {
        type Response = Response;
        type Error = BoxError;
        type Future = BoxFuture<Result<Response, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request) -> Self::Future {
            let pinned = req.extensions().get::<PinnedRoutes>().cloned();
            assert!(
                pinned.is_some_and(|p| Arc::ptr_eq(&p.0, &self.routing.load_full())),
                "{} reached the router without the snapshot it was authorized on",
                req.uri()
            );
            self.reached.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Response::new(body::empty())) })
        }
    }

    fn get(path: &str, user: Option<UserInfo>) -> Request {
        let mut req = http::Request::get(path).body(body::empty()).unwrap();
        if let Some(user) = user {
            req.extensions_mut().insert(Arc::new(user));
        }
        req
    }

    #[tokio::test]
    async fn discovery_the_gateway_serves_needs_the_discovery_permission() {
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let routing = Routing::new();
        let authorizer = Authorizer {
            client: core(reviews.clone()),
            cache: DecisionCache::new(
                "SubjectAccessReview",
                Duration::from_secs(60),
                Duration::from_secs(60),
            ),
            routing: routing.clone(),
            remote: true,
            metrics: false,
            flow_control_dumps: true,
        };
        let reached = Arc::new(AtomicUsize::new(0));
        let mut authz = Authz::layer(Some(Arc::new(authorizer))).layer(Inner {
            reached: reached.clone(),
            routing,
        });
        let alice = || {
            Some(UserInfo::authenticated(
                "alice".into(),
                String::new(),
                vec!["dev".into()],
                Default::default(),
            ))
        };

        for path in [
            "/apis",
            "/api",
            "/apis/wardle.example.com",
            "/openapi/v3",
            "/debug/api_priority_and_fairness/dump_requests",
            "/openapi/v3/apis/wardle.example.com/v1alpha1",
        ] {
            let resp = authz.call(get(path, None)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "anonymous {path}");
            let status: Value =
                serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes())
                    .unwrap();
            assert!(
                status["message"].as_str().unwrap().starts_with(&format!(
                    "forbidden: User \"system:anonymous\" cannot get path \"{path}\""
                )),
                "{status}"
            );
            let resp = authz.call(get(path, alice())).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "alice {path}");
        }
        assert_eq!(reached.load(Ordering::SeqCst), 6, "only alice got through");
        let last = reviews.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            last["nonResourceAttributes"],
            json!({"path": "/openapi/v3/apis/wardle.example.com/v1alpha1", "verb": "get"})
        );

        // What the core serves, it authorizes itself: no review, and the request goes on.
        let before = reviews.lock().unwrap().len();
        for path in [
            "/api/v1/namespaces",
            "/apis/apps/v1/deployments",
            "/version",
        ] {
            let resp = authz.call(get(path, None)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
        }
        let mut post = get("/apis", None);
        *post.method_mut() = Method::POST;
        assert_eq!(authz.call(post).await.unwrap().status(), StatusCode::OK);
        assert_eq!(reviews.lock().unwrap().len(), before);
    }
}
