//! OpenAPI v3 through the gateway: which backend owns which `/openapi/v3/<path>`, and the
//! pass-through for the group-version documents of remote backends.
//!
//! kube-aggregator proxies OpenAPI v3 instead of merging specs: the root is the union of every
//! backend's root `paths`, and a document is answered by whoever listed it. Two rules keep a
//! backend from answering for someone else:
//! * a remote backend contributes only the paths of its own APIServices (`apis/<g>/<v>`) and of
//!   their groups (`apis/<g>`, the document of the group's own endpoint, which generic API
//!   servers list and kube-apiserver answers through its aggregator), like kube's v2 aggregation
//!   filters remote specs to their paths;
//! * the core's entry for a group-version that a remote APIService claims is dropped, even
//!   while that backend has no root yet: requests for it must never reach the core.
//!
//! Group-version documents of remote backends are passed through with their status (a stale
//! `?hash=` gets a 301 that client-go follows, a revalidation a 304) and their caching headers,
//! which is why this does not use `RemoteBackend::forward`. Redirects are refused as that one
//! refuses them (`--aggregator-reject-forwarding-redirect`, a 502), but for the stale-hash 301:
//! a `Location` naming the same document on the same server, which client-go follows back to
//! the gateway. Anything else would send the client, and the credentials client-go follows
//! redirects with, wherever the backend likes (CVE-2022-3172's class).

use std::cmp::Reverse;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::OpenApiRoot;
use apiservice::model::GroupVersion;
use http::header::{self, HeaderMap, HeaderName};
use http::StatusCode;

use crate::backend::remote::RemoteBackend;
use crate::body::{self, Response};
use crate::error::GatewayError;

/// Limit for one group-version document from a remote backend (headers; the body streams).
const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Request headers of the client that the backend needs to answer a document the same way.
const REQUEST_HEADERS: [HeaderName; 2] = [header::ACCEPT, header::IF_NONE_MATCH];

/// Response headers that carry the document's identity and caching rules; everything else
/// (connection handling, the backend's own server headers) stays behind.
const RESPONSE_HEADERS: [HeaderName; 9] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::ETAG,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
    header::LOCATION,
    header::CONTENT_ENCODING,
];

/// The key a group-version has in an OpenAPI v3 root: `apis/<g>/<v>`, or `api/v1` for core.
pub fn root_key(gv: &GroupVersion) -> String {
    let path = gv.path();
    path.trim_start_matches('/').to_owned()
}

/// One remote APIService's contribution to the merged root.
pub struct RemoteRoot<'a, B> {
    /// Who answers its path (the backend handle).
    pub owner: B,
    /// `apis/<g>/<v>` of the APIService.
    pub key: String,
    /// APIService name, the last tie-breaker of the order.
    pub name: &'a str,
    pub group_priority_minimum: i32,
    pub version_priority: i32,
    /// The backend's last root document, `None` if it has none (404) or never answered.
    pub root: Option<&'a OpenApiRoot>,
}

/// The inputs for [`merge_openapi_roots`](apiservice::discovery::merge_openapi_roots) in
/// ascending precedence: the core (without the paths remote APIServices claim), then each remote
/// APIService's own path, lowest priority first, so the highest-priority one wins a clash.
pub fn openapi_inputs<B: Clone>(
    core: B,
    core_root: Option<&OpenApiRoot>,
    mut remotes: Vec<RemoteRoot<'_, B>>,
) -> Vec<(B, OpenApiRoot)> {
    let claimed: HashSet<&str> = remotes.iter().map(|r| r.key.as_str()).collect();
    let mut inputs = Vec::with_capacity(remotes.len() + 1);
    if let Some(root) = core_root {
        let mut own = root.clone();
        own.paths.retain(|key, _| !claimed.contains(key.as_str()));
        inputs.push((core, own));
    }
    remotes.sort_by_key(|r| {
        (
            r.group_priority_minimum,
            r.version_priority,
            Reverse(r.name),
        )
    });
    for remote in remotes {
        let Some(root) = remote.root else { continue };
        let mut own = OpenApiRoot::default();
        for key in [remote.key.as_str(), group_key(&remote.key)] {
            if let Some((key, path)) = root.paths.get_key_value(key) {
                own.paths.insert(key.clone(), path.clone());
            }
        }
        if !own.paths.is_empty() {
            inputs.push((remote.owner, own));
        }
    }
    inputs
}

/// The root key of a group-version's group: `apis/<g>` for `apis/<g>/<v>`.
fn group_key(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(group, _)| group)
}

/// The headers sent to a remote backend for a client's `/openapi/v3/<path>` request.
pub fn request_headers(client: &HeaderMap) -> HeaderMap {
    only(&REQUEST_HEADERS, client)
}

/// Keeps only the response headers that describe the document (see [`RESPONSE_HEADERS`]).
pub fn response_headers(backend: &HeaderMap) -> HeaderMap {
    only(&RESPONSE_HEADERS, backend)
}

/// Every value of the headers `names` in `from`, and nothing else.
fn only(names: &[HeaderName], from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in names {
        for value in from.get_all(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Fetches a group-version document from a remote backend with the gateway's own credentials
/// and returns the backend's answer as is: status (200, 301, 304, 404, 406), caching headers,
/// streamed body.
pub async fn pass_through(
    backend: Arc<RemoteBackend>,
    path_and_query: String,
    headers: HeaderMap,
) -> Response {
    match backend
        .get(&path_and_query, request_headers(&headers), DOCUMENT_TIMEOUT)
        .await
    {
        Ok(resp) => {
            let (parts, incoming) = resp.into_parts();
            if backend.rejects_forwarding_redirects()
                && is_foreign_redirect(&path_and_query, parts.status, &parts.headers)
            {
                tracing::warn!(apiservice = %backend.name, path = %path_and_query, status = %parts.status,
                    "the backend redirected an OpenAPI v3 document request elsewhere; refused");
                return GatewayError::BackendRedirect {
                    api_service: backend.name.to_string(),
                    status: parts.status.as_u16(),
                }
                .into_response();
            }
            let mut out = Response::new(body::boxed(incoming));
            *out.status_mut() = parts.status;
            *out.headers_mut() = response_headers(&parts.headers);
            out
        }
        Err(e) => {
            tracing::warn!(apiservice = %backend.name, path = %path_and_query, error = %e,
                "OpenAPI v3 document request failed");
            e.into_response()
        }
    }
}

/// Whether a backend's answer to `requested` (path and query) redirects somewhere other than to
/// the same document on the same server: a 3xx with a `Location` that is not
/// `<the requested path>` or `<the requested path>?<query>`.
fn is_foreign_redirect(requested: &str, status: StatusCode, headers: &HeaderMap) -> bool {
    let Some(location) = headers.get(header::LOCATION) else {
        return false;
    };
    if !status.is_redirection() {
        return false;
    }
    let path = requested.split_once('?').map_or(requested, |(p, _)| p);
    let same_document = location.to_str().is_ok_and(|l| {
        l.strip_prefix(path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('?'))
    });
    !same_document
}

#[cfg(test)]
mod tests {
    use super::*;
    use apiservice::discovery::{merge_openapi_roots, OpenApiPath};

    use crate::test_util::headers;

    fn root(keys: &[(&str, &str)]) -> OpenApiRoot {
        let mut r = OpenApiRoot::default();
        for (k, hash) in keys {
            r.paths.insert(
                (*k).to_owned(),
                OpenApiPath {
                    server_relative_url: format!("/openapi/v3/{k}?hash={hash}"),
                },
            );
        }
        r
    }

    #[test]
    fn a_remote_backend_brings_its_groups_entry_too() {
        let core = root(&[("apis/apps", "C1"), ("apis/apps/v1", "C2")]);
        let wardle = root(&[
            ("apis", "NOT-ITS-OWN"),
            ("apis/apps", "EVIL"),
            ("apis/wardle.example.com", "G"),
            ("apis/wardle.example.com/v1alpha1", "W"),
        ]);
        let remotes = vec![RemoteRoot {
            owner: "wardle",
            key: "apis/wardle.example.com/v1alpha1".into(),
            name: "v1alpha1.wardle.example.com",
            group_priority_minimum: 2000,
            version_priority: 100,
            root: Some(&wardle),
        }];
        let merged = merge_openapi_roots(&openapi_inputs("core", Some(&core), remotes)).unwrap();
        let mut owners: Vec<(&str, &str)> = merged
            .owners
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        owners.sort();
        assert_eq!(
            owners,
            [
                ("apis/apps", "core"),
                ("apis/apps/v1", "core"),
                ("apis/wardle.example.com", "wardle"),
                ("apis/wardle.example.com/v1alpha1", "wardle"),
            ]
        );
    }

    #[test]
    fn keys_have_no_leading_slash() {
        assert_eq!(
            root_key(&GroupVersion::new("wardle.example.com", "v1alpha1")),
            "apis/wardle.example.com/v1alpha1"
        );
        assert_eq!(root_key(&GroupVersion::new("", "v1")), "api/v1");
    }

    #[test]
    fn remote_backends_own_only_their_apiservice_paths() {
        let core = root(&[
            ("api/v1", "C1"),
            ("apis/apps/v1", "C2"),
            ("apis/wardle.example.com/v1alpha1", "CORE"),
        ]);
        // The backend also lists a path for a group it has no APIService for, and tries to
        // take over `api/v1`: both are ignored.
        let wardle = root(&[
            ("apis/wardle.example.com/v1alpha1", "W"),
            ("apis/evil.example.com/v1", "X"),
            ("api/v1", "EVIL"),
        ]);
        let remotes = vec![RemoteRoot {
            owner: "wardle",
            key: "apis/wardle.example.com/v1alpha1".into(),
            name: "v1alpha1.wardle.example.com",
            group_priority_minimum: 2000,
            version_priority: 100,
            root: Some(&wardle),
        }];
        let merged = merge_openapi_roots(&openapi_inputs("core", Some(&core), remotes)).unwrap();
        assert_eq!(merged.owners.len(), 3);
        assert_eq!(merged.owners["api/v1"], "core");
        assert_eq!(merged.owners["apis/apps/v1"], "core");
        assert_eq!(merged.owners["apis/wardle.example.com/v1alpha1"], "wardle");
        let body = std::str::from_utf8(&merged.body).unwrap();
        assert!(body.contains("hash=W"), "{body}");
        assert!(!body.contains("CORE") && !body.contains("EVIL") && !body.contains("evil"));
    }

    #[test]
    fn a_claimed_path_never_falls_back_to_the_core() {
        let core = root(&[("apis/wardle.example.com/v1alpha1", "CORE")]);
        let remotes = vec![RemoteRoot {
            owner: "wardle",
            key: "apis/wardle.example.com/v1alpha1".into(),
            name: "v1alpha1.wardle.example.com",
            group_priority_minimum: 2000,
            version_priority: 100,
            root: None, // backend without /openapi/v3, or not fetched yet
        }];
        let merged = merge_openapi_roots(&openapi_inputs("core", Some(&core), remotes)).unwrap();
        assert!(merged.owners.is_empty());
        assert_eq!(&merged.body[..], br#"{"paths":{}}"#);
    }

    #[test]
    fn higher_priority_wins_a_clash_whatever_the_input_order() {
        let a = root(&[("apis/g/v1", "A")]);
        let b = root(&[("apis/g/v1", "B")]);
        let remote = |owner, name, gp, r| RemoteRoot {
            owner,
            key: "apis/g/v1".into(),
            name,
            group_priority_minimum: gp,
            version_priority: 10,
            root: Some(r),
        };
        for swap in [false, true] {
            let mut remotes = vec![
                remote("a", "v1.g-a", 100, &a),
                remote("b", "v1.g-b", 900, &b),
            ];
            if swap {
                remotes.reverse();
            }
            let merged = merge_openapi_roots(&openapi_inputs("core", None, remotes)).unwrap();
            assert_eq!(merged.owners["apis/g/v1"], "b");
        }
    }

    #[test]
    fn only_document_headers_cross() {
        let client = headers(&[
            ("accept", "application/json"),
            ("if-none-match", "\"H\""),
            ("authorization", "Bearer secret"),
            ("cookie", "a=b"),
        ]);
        let sent = request_headers(&client);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[header::IF_NONE_MATCH], "\"H\"");
        assert!(sent.get(header::AUTHORIZATION).is_none());

        let backend = headers(&[
            ("etag", "\"H2\""),
            ("cache-control", "public, immutable"),
            ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            ("vary", "Accept"),
            ("location", "/openapi/v3/apis/g/v1?hash=H2"),
            ("content-type", "application/json"),
            ("connection", "close"),
            ("set-cookie", "x=y"),
        ]);
        let kept = response_headers(&backend);
        assert_eq!(kept.len(), 6);
        assert!(kept.get(header::CONNECTION).is_none());
        assert!(kept.get(header::SET_COOKIE).is_none());
        assert_eq!(kept[header::LOCATION], "/openapi/v3/apis/g/v1?hash=H2");
    }

    #[test]
    fn only_a_redirect_to_the_same_document_is_passed_on() {
        let requested = "/openapi/v3/apis/g/v1?hash=OLD";
        let with = |location: &str| headers(&[("location", location)]);
        let moved = StatusCode::MOVED_PERMANENTLY;
        for same in ["/openapi/v3/apis/g/v1?hash=NEW", "/openapi/v3/apis/g/v1"] {
            assert!(
                !is_foreign_redirect(requested, moved, &with(same)),
                "{same}"
            );
        }
        for foreign in [
            "https://attacker.example/openapi/v3/apis/g/v1?hash=NEW",
            "//attacker.example/openapi/v3/apis/g/v1",
            "/openapi/v3/apis/g/v1/../../../../api/v1/secrets",
            "/openapi/v3/apis/g/v10",
            "/openapi/v3/apis/other/v1?hash=NEW",
            "/api/v1/namespaces",
        ] {
            assert!(
                is_foreign_redirect(requested, moved, &with(foreign)),
                "{foreign}"
            );
            assert!(is_foreign_redirect(
                requested,
                StatusCode::FOUND,
                &with(foreign)
            ));
        }
        // A 304 (or anything) without a Location sends nobody anywhere.
        assert!(!is_foreign_redirect(
            requested,
            StatusCode::NOT_MODIFIED,
            &HeaderMap::new()
        ));
        assert!(!is_foreign_redirect(
            requested,
            StatusCode::OK,
            &with("https://x.example/")
        ));
    }
}
