//! The request path of discovery: `/api`, `/apis`, `/apis/<group>`, `/openapi/v3` and
//! `/openapi/v3/<path>`.
//!
//! Every answer comes from the snapshot the controller prepared: one `ArcSwap` load, a comparison
//! of `If-None-Match` with the prepared ETag, and the prepared bytes. No JSON is built or parsed
//! here. Whatever the gateway does not own returns `None`, and the router sends the request on
//! (to the core, or to a remote `v1.` APIService for `/api`).
//!
//! Headers follow kube-apiserver (`discovery/aggregated/etag.go`): an aggregated answer carries
//! its `Content-Type` with the `g`/`v`/`as` parameters (clients decide by it alone), `ETag`,
//! `Vary: Accept` and `Cache-Control: public`; an `If-None-Match` equal to the ETag (exact
//! string, no list or weak parsing) gets a 304 with the same headers and no body.

use std::future::Future;
use std::sync::Arc;

use apiservice::discovery::{
    accepts_legacy_json, negotiate, AggregatedDocument, Negotiated, CONTENT_TYPE_JSON,
};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use crate::body::{self, Request, Response};
use crate::conditional::prepared;
use crate::control::discovery::openapi::pass_through;
use crate::control::discovery::{DiscoveryCache, OpenApiOwner};
use crate::request_info::{decided_path, RequestInfo};
use crate::status::status_response;

/// A path the discovery handlers may answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryPath<'a> {
    /// `/api`: aggregated only; legacy `APIVersions` is the core's.
    Api,
    /// `/apis`: aggregated or legacy `APIGroupList`.
    Apis,
    /// `/apis/<group>`: legacy `APIGroup`, for groups that have an APIService.
    Group(&'a str),
    /// `/openapi/v3`: the merged root.
    OpenApiRoot,
    /// `/openapi/v2`: the merged Swagger spec.
    OpenApiV2,
    /// `/openapi/v3/<key>`, `key` as in the root (`apis/<g>/<v>`, `api/v1`).
    OpenApiDocument(&'a str),
}

/// Classifies a request path (no query). One trailing slash is accepted everywhere, as the
/// Python client sends `/apis/` and `/apis/<g>/`.
pub fn classify(path: &str) -> Option<DiscoveryPath<'_>> {
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    match trimmed {
        "/api" => return Some(DiscoveryPath::Api),
        "/apis" => return Some(DiscoveryPath::Apis),
        "/openapi/v3" => return Some(DiscoveryPath::OpenApiRoot),
        "/openapi/v2" => return Some(DiscoveryPath::OpenApiV2),
        _ => {}
    }
    if let Some(group) = trimmed.strip_prefix("/apis/") {
        return (!group.is_empty() && !group.contains('/')).then_some(DiscoveryPath::Group(group));
    }
    if let Some(key) = trimmed.strip_prefix("/openapi/v3/") {
        return (!key.is_empty()).then_some(DiscoveryPath::OpenApiDocument(key));
    }
    None
}

fn aggregated(request: &HeaderMap, doc: &AggregatedDocument, negotiated: Negotiated) -> Response {
    match doc.body(negotiated) {
        Some(body) => prepared(request, negotiated.content_type(), body, &doc.etag, true),
        // `negotiated` is aggregated whenever this is called; a legacy one is a bug upstream,
        // answered as an unacceptable representation rather than a panic.
        None => not_acceptable(),
    }
}

fn legacy_json(body: &Bytes) -> Response {
    let mut resp = Response::new(body::full(body.clone()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_JSON),
    );
    resp
}

fn not_acceptable() -> Response {
    status_response(
        StatusCode::NOT_ACCEPTABLE,
        "only the following media types are accepted: application/json, \
         application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, \
         application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        None,
    )
}

fn openapi_not_found(key: &str) -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        &format!(
            "no OpenAPI v3 document for {key:?}: it is not listed in /openapi/v3 (no API server \
             behind the gateway serves it, or its backend has not published it yet)"
        ),
        None,
    )
}

/// What [`DiscoveryCache::handle`] returns: an answer (or `None`) known at once, or a future for
/// the few requests that wait (a listing still pending, the gzip form of `/openapi/v2` not made
/// yet) or are passed to a remote APIService.
/// Most requests are neither discovery nor OpenAPI; they must not pay for allocating and moving
/// the pass-through future, which holds a whole remote request.
pub type Handling = futures::future::Either<
    std::future::Ready<Option<Response>>,
    std::pin::Pin<Box<dyn Future<Output = Option<Response>> + Send + 'static>>,
>;

fn act(action: Action) -> Handling {
    use futures::future::Either;
    match action {
        Action::FallThrough => Either::Left(std::future::ready(None)),
        Action::Respond(resp) => Either::Left(std::future::ready(Some(resp))),
        Action::PassThrough {
            backend,
            path_and_query,
            headers,
        } => Either::Right(Box::pin(async move {
            Some(pass_through(backend, path_and_query, headers).await)
        })),
        // The gzip form may have to be made first: the one case here that waits.
        Action::OpenApiV2Gzip {
            mut resp,
            doc,
            protobuf,
        } => Either::Right(Box::pin(async move {
            *resp.body_mut() = body::full(doc.representation(protobuf).1.gzip().await);
            resp.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            Some(resp)
        })),
    }
}

/// Whether `Accept-Encoding` allows gzip (`gzip` or `*`, without `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or_default().trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// What to do with a request, decided synchronously so the returned future holds no reference
/// to the request (its body is not `Sync`).
enum Action {
    FallThrough,
    /// `/openapi/v2`'s answer `resp`, whose body becomes the gzip form of `doc`'s JSON or
    /// protobuf representation, made on demand.
    OpenApiV2Gzip {
        resp: Response,
        doc: Arc<crate::control::discovery::openapi_v2::OpenApiV2>,
        protobuf: bool,
    },
    Respond(Response),
    PassThrough {
        backend: Arc<crate::backend::remote::RemoteBackend>,
        path_and_query: String,
        headers: HeaderMap,
    },
}

/// How long `/apis` or `/apis/<group>` waits for the core's discovery to list a
/// CustomResourceDefinition the core has already established (see `core_watch`): `kubectl wait
/// --for=condition=Established` and then `kubectl apply` of a custom resource would otherwise
/// find the group missing for the few milliseconds between the two.
const LISTING_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl DiscoveryCache {
    /// Answers the request if it is a discovery or OpenAPI v3 request the gateway owns; `None`
    /// sends it on to the router's normal lookup.
    pub fn handle(self: &Arc<Self>, req: &Request) -> Handling {
        // The decoded path, as authorization decided on it (kube's mux reads `URL.Path`).
        let lists_groups = req.method() == Method::GET
            && matches!(
                classify(decided_path(req)),
                Some(DiscoveryPath::Apis | DiscoveryPath::Group(_))
            );
        if lists_groups && *self.listing_pending.borrow() {
            let mut head = http::Request::new(crate::body::empty());
            *head.uri_mut() = req.uri().clone();
            *head.headers_mut() = req.headers().clone();
            if let Some(info) = req.extensions().get::<Arc<RequestInfo>>() {
                head.extensions_mut().insert(info.clone());
            }
            let this = self.clone();
            return futures::future::Either::Right(Box::pin(async move {
                let mut pending = this.listing_pending.subscribe();
                let _ = tokio::time::timeout(LISTING_WAIT, pending.wait_for(|p| !*p)).await;
                let action = this.decide(&head);
                act(action).await
            }));
        }
        act(self.decide(req))
    }

    fn decide(&self, req: &Request) -> Action {
        if req.method() != Method::GET {
            return Action::FallThrough;
        }
        let Some(path) = classify(decided_path(req)) else {
            return Action::FallThrough;
        };
        let headers = req.headers();
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        match path {
            DiscoveryPath::Api => self.legacy_api(headers, accept),
            DiscoveryPath::Apis => self.apis(headers, accept),
            DiscoveryPath::Group(group) => self.group(group, accept),
            DiscoveryPath::OpenApiV2 => self.openapi_v2(headers, accept),
            DiscoveryPath::OpenApiRoot => match self.openapi.load_full() {
                None => Action::FallThrough,
                Some(root) => Action::Respond(prepared(
                    headers,
                    CONTENT_TYPE_JSON,
                    &root.body,
                    &root.etag,
                    false,
                )),
            },
            DiscoveryPath::OpenApiDocument(key) => self.openapi_v3_document(key, req),
        }
    }

    /// `/api`: the core's, unless the client asks for aggregated discovery and no remote
    /// APIService serves the legacy group (then all of `/api` is that server's).
    fn legacy_api(&self, headers: &HeaderMap, accept: Option<&str>) -> Action {
        let Some(merged) = self.merged.load_full() else {
            return Action::FallThrough;
        };
        let negotiated = negotiate(accept, self.served_versions());
        if !negotiated.is_aggregated() || self.routing.load().legacy_core().is_some() {
            return Action::FallThrough;
        }
        Action::Respond(aggregated(headers, &merged.api, negotiated))
    }

    /// `/apis`: aggregated when asked for, else the legacy `APIGroupList`.
    fn apis(&self, headers: &HeaderMap, accept: Option<&str>) -> Action {
        let Some(merged) = self.merged.load_full() else {
            return Action::FallThrough;
        };
        let negotiated = negotiate(accept, self.served_versions());
        if negotiated.is_aggregated() {
            Action::Respond(aggregated(headers, &merged.apis, negotiated))
        } else if accepts_legacy_json(accept) {
            Action::Respond(legacy_json(&merged.apis_legacy))
        } else {
            Action::Respond(not_acceptable())
        }
    }

    /// `/apis/<group>`: the merged `APIGroup`, or the core's answer for a group nobody routes.
    fn group(&self, group: &str, accept: Option<&str>) -> Action {
        let Some(merged) = self.merged.load_full() else {
            return Action::FallThrough;
        };
        match merged.group_legacy(group) {
            None => Action::FallThrough,
            Some(_) if !accepts_legacy_json(accept) => Action::Respond(not_acceptable()),
            Some(body) => Action::Respond(legacy_json(body)),
        }
    }

    /// `/openapi/v2`: the merged spec as JSON or protobuf, gzipped on the way out if asked.
    fn openapi_v2(&self, headers: &HeaderMap, accept: Option<&str>) -> Action {
        let Some(doc) = self.openapi_v2.load_full() else {
            return Action::FallThrough;
        };
        let protobuf =
            accept.is_some_and(|a| a.contains("application/com.github.proto-openapi.spec.v2"));
        let (content_type, encoded) = doc.representation(protobuf);
        let mut resp = prepared(headers, content_type, &encoded.bytes, &encoded.etag, true);
        resp.headers_mut().insert(
            header::VARY,
            HeaderValue::from_static("Accept, Accept-Encoding"),
        );
        if accepts_gzip(headers) && resp.status() == StatusCode::OK {
            Action::OpenApiV2Gzip {
                resp,
                doc,
                protobuf,
            }
        } else {
            Action::Respond(resp)
        }
    }

    /// `/openapi/v3/<group-version>`: the core's falls through, a remote backend's is passed
    /// through, a v2-only backend's is served converted.
    fn openapi_v3_document(&self, key: &str, req: &Request) -> Action {
        let Some(root) = self.openapi.load_full() else {
            return Action::FallThrough;
        };
        match root.owners.get(key) {
            Some(OpenApiOwner::Core) => Action::FallThrough,
            Some(OpenApiOwner::Remote(backend)) => Action::PassThrough {
                backend: backend.clone(),
                path_and_query: req
                    .uri()
                    .path_and_query()
                    .map_or_else(|| req.uri().path().to_owned(), |pq| pq.to_string()),
                headers: req.headers().clone(),
            },
            Some(OpenApiOwner::Converted(doc)) => {
                Action::Respond(doc.respond(req.headers(), req.uri().query()))
            }
            None => Action::Respond(openapi_not_found(key)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditional::not_modified;
    use crate::control::apiservices::Routing;
    use apiservice::discovery::{merge, CoreDiscovery, OpenApiRoot};
    use http_body_util::BodyExt;

    const AGG: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    const AGG_129: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    #[test]
    fn gzip_is_accepted_unless_refused() {
        let h = |v: &str| crate::test_util::headers(&[("accept-encoding", v)]);
        assert!(accepts_gzip(&h("gzip")));
        assert!(accepts_gzip(&h("br, GZIP;q=0.5")));
        assert!(accepts_gzip(&h("*")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity, br")));
        assert!(!accepts_gzip(&crate::test_util::headers(&[])));
    }

    #[test]
    fn paths_with_and_without_trailing_slash() {
        use DiscoveryPath::*;
        assert_eq!(classify("/api"), Some(Api));
        assert_eq!(classify("/api/"), Some(Api));
        assert_eq!(classify("/apis"), Some(Apis));
        assert_eq!(classify("/apis/"), Some(Apis));
        assert_eq!(classify("/apis/apps"), Some(Group("apps")));
        assert_eq!(classify("/apis/apps/"), Some(Group("apps")));
        assert_eq!(classify("/openapi/v3"), Some(OpenApiRoot));
        assert_eq!(classify("/openapi/v3/"), Some(OpenApiRoot));
        assert_eq!(
            classify("/openapi/v3/apis/wardle.example.com/v1alpha1"),
            Some(OpenApiDocument("apis/wardle.example.com/v1alpha1"))
        );
        assert_eq!(
            classify("/openapi/v3/api/v1/"),
            Some(OpenApiDocument("api/v1"))
        );
        assert_eq!(classify("/openapi/v2"), Some(OpenApiV2));
        for other in [
            "/api/v1",
            "/apis/apps/v1",
            "/apis/apps/v1/deployments",
            "/apis//",
            "/apisx",
            "/apis//v1",
            "/openapi/v2/x",
            "/openapi/v3x",
            "/version",
            "/",
        ] {
            assert_eq!(classify(other), None, "{other}");
        }
    }

    #[test]
    fn if_none_match_is_an_exact_comparison() {
        let mut h = HeaderMap::new();
        assert!(!not_modified(&h, "\"AB\""));
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"AB\""));
        assert!(not_modified(&h, "\"AB\""));
        assert!(!not_modified(&h, "\"ab\""));
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("W/\"AB\""));
        assert!(!not_modified(&h, "\"AB\""));
    }

    fn cache() -> Arc<DiscoveryCache> {
        let cache = DiscoveryCache::new(Routing::new());
        let merged = merge(&CoreDiscovery::default(), &[]).unwrap();
        cache.store_merged(merged);
        Arc::new(cache)
    }

    /// While an established CRD is not listed yet, `/apis` waits for the next published
    /// documents (briefly), and answers from them.
    #[tokio::test]
    async fn apis_waits_while_an_established_group_is_unlisted() {
        let cache = cache();
        cache.listing_pending.send_replace(true);
        let answer = tokio::spawn({
            let cache = cache.clone();
            async move { cache.handle(&get("/apis", &[])).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!answer.is_finished(), "/apis did not wait");
        cache.listing_pending.send_replace(false);
        let resp = tokio::time::timeout(std::time::Duration::from_millis(150), answer)
            .await
            .expect("answered once the listing arrived")
            .unwrap();
        assert!(resp.is_some());
        // Nothing pending: no wait at all.
        let started = std::time::Instant::now();
        assert!(cache.handle(&get("/apis", &[])).await.is_some());
        assert!(started.elapsed() < std::time::Duration::from_millis(50));
    }

    fn get(path: &str, headers: &[(header::HeaderName, &str)]) -> Request {
        let mut b = http::Request::builder().method(Method::GET).uri(path);
        for (k, v) in headers {
            b = b.header(k, *v);
        }
        b.body(body::empty()).unwrap()
    }

    async fn body_bytes(resp: Response) -> Bytes {
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn aggregated_apis_headers_and_304() {
        let cache = cache();
        let merged = cache.merged().unwrap();
        let resp = cache
            .handle(&get("/apis?timeout=32s", &[(header::ACCEPT, AGG)]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers().clone();
        assert_eq!(
            h[header::CONTENT_TYPE],
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        );
        assert_eq!(h[header::ETAG], merged.apis.etag.as_str());
        assert_eq!(h[header::VARY], "Accept");
        assert_eq!(h[header::CACHE_CONTROL], "public");
        assert_eq!(body_bytes(resp).await, merged.apis.v2);

        let etag = merged.apis.etag.clone();
        let resp = cache
            .handle(&get(
                "/apis/",
                &[(header::ACCEPT, AGG), (header::IF_NONE_MATCH, &etag)],
            ))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(resp.headers()[header::ETAG], etag.as_str());
        assert_eq!(resp.headers()[header::VARY], "Accept");
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "public");
        assert!(body_bytes(resp).await.is_empty());

        // kubectl 1.29 gets v2beta1 with the same ETag.
        let resp = cache
            .handle(&get("/apis", &[(header::ACCEPT, AGG_129)]))
            .await
            .unwrap();
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        );
        assert_eq!(resp.headers()[header::ETAG], etag.as_str());
        assert_eq!(body_bytes(resp).await, merged.apis.v2beta1);
    }

    #[tokio::test]
    async fn legacy_apis_and_fall_through() {
        let cache = cache();
        let merged = cache.merged().unwrap();
        // `kubectl get --raw /apis`
        let resp = cache
            .handle(&get("/apis", &[(header::ACCEPT, "application/json, */*")]))
            .await
            .unwrap();
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        assert!(resp.headers().get(header::ETAG).is_none());
        assert_eq!(body_bytes(resp).await, merged.apis_legacy);
        // No Accept at all is legacy too.
        let resp = cache.handle(&get("/apis", &[])).await.unwrap();
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        // Nothing we can serve.
        let resp = cache
            .handle(&get(
                "/apis",
                &[(header::ACCEPT, "application/vnd.kubernetes.protobuf")],
            ))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);

        // Legacy /api, /api/v1, groups without an APIService, other methods: the core's.
        assert!(cache
            .handle(&get("/api", &[(header::ACCEPT, "application/json, */*")]))
            .await
            .is_none());
        assert!(cache.handle(&get("/api/v1", &[])).await.is_none());
        assert!(cache.handle(&get("/apis/apps", &[])).await.is_none());
        let post = http::Request::builder()
            .method(Method::POST)
            .uri("/apis")
            .body(body::empty())
            .unwrap();
        assert!(cache.handle(&post).await.is_none());

        // Aggregated /api is ours.
        let resp = cache
            .handle(&get("/api?timeout=32s", &[(header::ACCEPT, AGG)]))
            .await
            .unwrap();
        assert_eq!(resp.headers()[header::ETAG], merged.api.etag.as_str());
    }

    #[tokio::test]
    async fn nothing_is_served_before_the_first_merge() {
        let cache = Arc::new(DiscoveryCache::new(Routing::new()));
        assert!(cache
            .handle(&get("/apis", &[(header::ACCEPT, AGG)]))
            .await
            .is_none());
        assert!(cache
            .handle(&get("/api", &[(header::ACCEPT, AGG)]))
            .await
            .is_none());
        assert!(cache.handle(&get("/openapi/v3", &[])).await.is_none());
        assert!(cache
            .handle(&get("/openapi/v3/apis/g/v1", &[]))
            .await
            .is_none());
    }

    #[tokio::test]
    async fn openapi_root_and_documents() {
        let cache = Arc::new(DiscoveryCache::new(Routing::new()));
        let core: OpenApiRoot = serde_json::from_str(
            r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=A"}}}"#,
        )
        .unwrap();
        let root =
            apiservice::discovery::merge_openapi_roots(&[(OpenApiOwner::Core, core)]).unwrap();
        let etag = root.etag.clone();
        let body = root.body.clone();
        cache.store_openapi(root);

        let resp = cache
            .handle(&get("/openapi/v3?timeout=32s", &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(resp.headers()[header::ETAG], etag.as_str());
        assert_eq!(body_bytes(resp).await, body);
        let resp = cache
            .handle(&get("/openapi/v3", &[(header::IF_NONE_MATCH, &etag)]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);

        // Core-owned documents go on to the core, unknown ones are a 404 Status.
        assert!(cache
            .handle(&get("/openapi/v3/api/v1?hash=A", &[]))
            .await
            .is_none());
        let resp = cache
            .handle(&get("/openapi/v3/apis/nope/v1", &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let status: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await).unwrap();
        assert_eq!(status["reason"], "NotFound");
        // /openapi/v2 is the core's.
        assert!(cache.handle(&get("/openapi/v2", &[])).await.is_none());
    }
}
