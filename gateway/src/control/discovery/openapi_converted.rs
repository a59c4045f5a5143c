//! OpenAPI v3 for remote backends that serve only v2.
//!
//! A backend answering 404 on `/openapi/v3` contributes nothing to the v3 root, so `kubectl
//! explain` (v3 since kubectl 1.27) and client-side validation know nothing of its types.
//! kube-aggregator then downloads the backend's `/openapi/v2`, converts it, and serves the result
//! itself under each APIService's `apis/<group>/<version>`. The gateway does the same:
//! - [`fetch_converted`] runs in the discovery controller's fetch of the Service's v3 root, right
//!   after its 404: it revalidates the v2 spec with its ETag and, only when it changed, converts
//!   it for each of the Service's group-versions on a blocking thread
//!   (`apiservice::discovery::openapi_v2_to_v3`);
//! - the controller lists each [`ConvertedDocument`] in the merged root with `?hash=<etag>`;
//! - [`ConvertedDocument::respond`] answers `/openapi/v3/apis/<g>/<v>` from prepared bytes the
//!   way kube-openapi's handler3 does: 301 to the current hash for a stale `?hash=`, immutable
//!   caching for the current one, ETag and 304.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use apiservice::discovery::{
    accepts_legacy_json, etag_for, openapi_v2_to_v3, OpenApiPath, OpenApiRoot,
};
use apiservice::model::GroupVersion;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;
use serde_json::Value;

use super::fetch::{FetchError, Source, OPENAPI_TIMEOUT};
use super::openapi::root_key;
use crate::body::{self, Response};
use crate::conditional::prepared;
use crate::status::status_response;

const V2_PATH: &str = "/openapi/v2";
const CONTENT_TYPE_JSON: &str = "application/json";
/// How long a client may keep a document fetched with its current hash (kube: one year).
const IMMUTABLE_FOR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// One group-version's converted document, ready to serve.
#[derive(Debug, PartialEq)]
pub struct ConvertedDocument {
    /// `apis/<g>/<v>`, its key in the root.
    pub key: String,
    pub json: Bytes,
    /// Quoted uppercase hex SHA-512 of `json`, as handler3 computes it.
    pub etag: String,
    /// A root with the one entry that lists this document.
    pub root: OpenApiRoot,
}

// === impl ConvertedDocument ===

impl ConvertedDocument {
    fn new(key: String, document: &Value) -> Self {
        let json = Bytes::from(serde_json::to_vec(document).unwrap_or_default());
        let etag = etag_for(&json);
        let mut root = OpenApiRoot::default();
        root.paths.insert(
            key.clone(),
            OpenApiPath {
                server_relative_url: format!("/openapi/v3/{key}?hash={}", etag.trim_matches('"')),
            },
        );
        Self {
            key,
            json,
            etag,
            root,
        }
    }

    /// The answer to `GET /openapi/v3/<key>[?hash=...]`.
    pub fn respond(&self, headers: &HeaderMap, query: Option<&str>) -> Response {
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        if !accepts_legacy_json(accept) {
            return status_response(
                StatusCode::NOT_ACCEPTABLE,
                &format!(
                    "the OpenAPI v3 document for {:?} is converted from the backend's OpenAPI v2 \
                     and served as application/json only",
                    self.key
                ),
                None,
            );
        }
        let current = self.etag.trim_matches('"');
        let hash = query.and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("hash="))
                .filter(|h| !h.is_empty())
        });
        if let Some(hash) = hash {
            if hash != current {
                let mut resp = Response::new(body::empty());
                *resp.status_mut() = StatusCode::MOVED_PERMANENTLY;
                let location = format!("/openapi/v3/{}?hash={current}", self.key);
                if let Ok(v) = HeaderValue::from_str(&location) {
                    resp.headers_mut().insert(header::LOCATION, v);
                }
                return resp;
            }
        }
        let mut resp = prepared(headers, CONTENT_TYPE_JSON, &self.json, &self.etag, false);
        let out = resp.headers_mut();
        out.insert(header::VARY, HeaderValue::from_static("Accept"));
        if hash.is_some() {
            out.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, immutable"),
            );
            let expires = httpdate::fmt_http_date(SystemTime::now() + IMMUTABLE_FOR);
            if let Ok(v) = HeaderValue::from_str(&expires) {
                out.insert(header::EXPIRES, v);
            }
        }
        resp
    }
}

/// What a v2-only Service's group-versions are served as, after its last successful fetch.
#[derive(Debug, Default, PartialEq)]
pub struct ConvertedSpecs {
    /// The ETag of the v2 spec they were converted from.
    pub v2_etag: Option<String>,
    /// By root key.
    pub documents: BTreeMap<String, Arc<ConvertedDocument>>,
}

// === impl ConvertedSpecs ===

impl ConvertedSpecs {
    /// Whether these documents cover exactly `group_versions`: only then may the v2 spec be
    /// revalidated with its ETag (a 304 would keep a document set that misses an APIService).
    pub fn covers(&self, group_versions: &[GroupVersion]) -> bool {
        self.documents.len() == group_versions.len()
            && group_versions
                .iter()
                .all(|gv| self.documents.contains_key(&root_key(gv)))
    }
}

/// The outcome of a v2 fetch for a Service without `/openapi/v3`.
#[derive(Debug)]
pub enum V2Fetch {
    /// 304: the converted documents are current.
    NotModified,
    Converted(ConvertedSpecs),
    /// The backend has no `/openapi/v2` either.
    Absent,
}

/// Fetches the backend's `/openapi/v2` (revalidating `etag`) and converts it for each of
/// `group_versions`, off the async threads.
pub async fn fetch_converted(
    source: &Source,
    etag: Option<&str>,
    group_versions: Vec<GroupVersion>,
) -> Result<V2Fetch, FetchError> {
    let answer = source
        .get(V2_PATH, CONTENT_TYPE_JSON, etag, OPENAPI_TIMEOUT)
        .await?;
    match answer.status {
        StatusCode::NOT_MODIFIED if etag.is_some() => Ok(V2Fetch::NotModified),
        StatusCode::NOT_FOUND => Ok(V2Fetch::Absent),
        StatusCode::OK => {
            let v2_etag = answer.etag();
            // Parsed and converted off the async threads: the spec may be megabytes.
            let documents = tokio::task::spawn_blocking(move || {
                let spec: Value = answer.decode(V2_PATH, "OpenAPI v2 spec")?;
                convert_all(&spec, &group_versions)
            })
            .await
            .map_err(|e| FetchError::Convert {
                path: V2_PATH.to_owned(),
                message: e.to_string(),
            })??;
            Ok(V2Fetch::Converted(ConvertedSpecs { v2_etag, documents }))
        }
        status => Err(FetchError::Status {
            path: V2_PATH.to_owned(),
            status,
        }),
    }
}

/// One document per group-version, or the first conversion refused (a spec built to multiply
/// itself, see `openapi_v2_to_v3::MAX_COPIED_BYTES`): then none, and the last good ones stay.
fn convert_all(
    spec: &Value,
    group_versions: &[GroupVersion],
) -> Result<BTreeMap<String, Arc<ConvertedDocument>>, FetchError> {
    let mut documents = BTreeMap::new();
    for gv in group_versions {
        let document = openapi_v2_to_v3::group_version_document(spec, &gv.group, &gv.version)
            .map_err(|e| FetchError::Convert {
                path: V2_PATH.to_owned(),
                message: format!("{}: {e}", gv.path()),
            })?;
        let key = root_key(gv);
        documents.insert(
            key.clone(),
            Arc::new(ConvertedDocument::new(key, &document)),
        );
    }
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    fn document() -> ConvertedDocument {
        let spec = serde_json::json!({
            "swagger": "2.0",
            "paths": {"/apis/g.example.com/v1/things": {"get": {"responses": {"200": {"description": "OK"}}}}},
        });
        let gv = GroupVersion::new("g.example.com", "v1");
        let mut all = convert_all(&spec, std::slice::from_ref(&gv)).unwrap();
        Arc::into_inner(all.remove("apis/g.example.com/v1").unwrap()).unwrap()
    }

    #[test]
    fn the_root_entry_carries_the_documents_hash() {
        let doc = document();
        let hash = doc.etag.trim_matches('"');
        assert_eq!(hash.len(), 128);
        assert_eq!(
            doc.root.paths["apis/g.example.com/v1"].server_relative_url,
            format!("/openapi/v3/apis/g.example.com/v1?hash={hash}")
        );
        let body: Value = serde_json::from_slice(&doc.json).unwrap();
        assert_eq!(body["openapi"], "3.0.0");
    }

    #[test]
    fn answers_like_kube_openapis_handler3() {
        let doc = document();
        let hash = doc.etag.trim_matches('"').to_owned();
        // The current hash: immutable caching.
        let resp = doc.respond(&headers(&[]), Some(&format!("hash={hash}")));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "public, immutable");
        assert!(resp.headers().contains_key(header::EXPIRES));
        assert_eq!(resp.headers()[header::ETAG], doc.etag.as_str());
        // A stale hash: 301 to the current one.
        let resp = doc.respond(&headers(&[]), Some("hash=OLD"));
        assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(
            resp.headers()[header::LOCATION],
            format!("/openapi/v3/apis/g.example.com/v1?hash={hash}").as_str()
        );
        // No hash: no long-lived caching; revalidation gets a 304.
        let resp = doc.respond(&headers(&[("if-none-match", &doc.etag)]), None);
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert!(!resp.headers().contains_key(header::CACHE_CONTROL));
        // Protobuf only: 406.
        let resp = doc.respond(
            &headers(&[(
                "accept",
                "application/com.github.proto-openapi.spec.v3.v1.0+protobuf",
            )]),
            None,
        );
        assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
        let resp = doc.respond(
            &headers(&[(
                "accept",
                "application/com.github.proto-openapi.spec.v3.v1.0+protobuf, application/json;q=0.9",
            )]),
            None,
        );
        assert_eq!(resp.status(), StatusCode::OK);
    }

    #[test]
    fn only_a_full_set_is_revalidated() {
        let a = GroupVersion::new("g.example.com", "v1");
        let b = GroupVersion::new("g.example.com", "v2");
        let specs = ConvertedSpecs {
            v2_etag: Some("\"E\"".into()),
            documents: [(root_key(&a), Arc::new(document()))].into(),
        };
        assert!(specs.covers(std::slice::from_ref(&a)));
        assert!(!specs.covers(&[a, b]));
    }
}
