//! Fetching one document from the core server or a remote backend, with the gateway's own
//! credentials: the bounded GET every discovery and OpenAPI fetch goes through, the errors it
//! names, and the OpenAPI v3 root's revalidation, which the core and backends share.

use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::{OpenApiRoot, MAX_JSON_DEPTH};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};

use crate::backend::core::CoreBackend;
use crate::backend::remote::RemoteBackend;
use crate::body::{self, BoxError};
use crate::error::GatewayError;

/// kube-aggregator's limit for a backend's discovery (`handler_discovery.go`).
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Limit for an OpenAPI v3 root document.
pub const OPENAPI_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest discovery or OpenAPI root document accepted (a real cluster's `/apis` is ~60 KB).
const MAX_DOCUMENT_BYTES: usize = 32 << 20;

/// What client-go sends for `/api` and `/apis`; also what we ask the core and backends.
pub const ACCEPT_AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// Why fetching a document failed; the message names the path and what to check.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {path}: {source}")]
    Request {
        path: String,
        #[source]
        source: GatewayError,
    },
    #[error("GET {path}: no complete answer within {}s", .timeout.as_secs())]
    Timeout { path: String, timeout: Duration },
    #[error("GET {path}: reading the body: {source}")]
    Body {
        path: String,
        #[source]
        source: BoxError,
    },
    #[error("GET {path}: unexpected status {status}")]
    Status { path: String, status: StatusCode },
    #[error("GET {path}: 304 Not Modified without a cached document")]
    UnexpectedNotModified { path: String },
    #[error("GET {path}: decoding the {what}: {source}")]
    Decode {
        path: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "GET {path}: the {what} nests deeper than {MAX_JSON_DEPTH} levels, which the gateway \
         does not parse; the server must publish a flatter document"
    )]
    TooDeep { path: String, what: &'static str },
    #[error("GET {path}: converting the OpenAPI v2 spec to v3: {message}")]
    Convert { path: String, message: String },
}

/// Whether a response `Content-Type` announces an aggregated discovery list (v2 or v2beta1).
pub fn is_aggregated_content_type(content_type: Option<&HeaderValue>) -> bool {
    aggregated_version(content_type).is_some()
}

/// The apidiscovery version (`v2` or `v2beta1`) a response `Content-Type` announces, if it
/// announces an aggregated discovery list.
///
/// client-go's rule (`ContentTypeIsGVK`): media type `application/json` and the parameters
/// `g=apidiscovery.k8s.io`, `v=v2|v2beta1`, `as=APIGroupDiscoveryList` in any order; other
/// parameters (`charset`) are allowed. Anything else is a legacy document.
pub fn aggregated_version(content_type: Option<&HeaderValue>) -> Option<&'static str> {
    let ct = content_type.and_then(|v| v.to_str().ok())?;
    let mut parts = ct.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return None;
    }
    let (mut g, mut v, mut kind) = (false, None, false);
    for param in parts {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match key.trim().to_ascii_lowercase().as_str() {
            "g" => g = value == "apidiscovery.k8s.io",
            "v" => v = ["v2", "v2beta1"].into_iter().find(|known| *known == value),
            "as" => kind = value == "APIGroupDiscoveryList",
            _ => {}
        }
    }
    v.filter(|_| g && kind)
}

/// One answer, fully read.
pub struct Fetched {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

// === impl Fetched ===

impl Fetched {
    pub fn etag(&self) -> Option<String> {
        self.headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<T, FetchError> {
        serde_json::from_slice(&self.body).map_err(|source| FetchError::decode(path, what, source))
    }
}

impl FetchError {
    /// Whether the server answered with a document the gateway cannot use (as opposed to not
    /// answering, or answering with an error status).
    pub fn is_bad_document(&self) -> bool {
        matches!(
            self,
            Self::Decode { .. } | Self::TooDeep { .. } | Self::Convert { .. }
        )
    }

    /// A document that does not parse as a `what`: too deep, or not one at all.
    pub fn decode(path: &str, what: &'static str, source: serde_json::Error) -> Self {
        let path = path.to_owned();
        if is_too_deep(&source) {
            Self::TooDeep { path, what }
        } else {
            Self::Decode { path, what, source }
        }
    }
}

/// Whether serde_json refused a document for nesting past its recursion limit.
pub fn is_too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// Where a document is fetched from, with the gateway's own credentials.
#[derive(Clone)]
pub enum Source {
    Core(Arc<CoreBackend>),
    Remote(Arc<RemoteBackend>),
}

// === impl Source ===

impl Source {
    pub async fn get(
        &self,
        path: &str,
        accept: &'static str,
        if_none_match: Option<&str>,
        timeout: Duration,
    ) -> Result<Fetched, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
        if let Some(v) = if_none_match.and_then(|e| HeaderValue::from_str(e).ok()) {
            headers.insert(header::IF_NONE_MATCH, v);
        }
        let request = async {
            let resp = match self {
                Source::Core(core) => {
                    let mut req = http::Request::builder()
                        .method(Method::GET)
                        .uri(path)
                        .body(body::empty())
                        .map_err(|e| FetchError::Request {
                            path: path.to_owned(),
                            source: GatewayError::Internal(e.to_string()),
                        })?;
                    *req.headers_mut() = headers;
                    core.send_own(req).await
                }
                // The outer timeout bounds the whole exchange; this one only the headers.
                Source::Remote(remote) => remote.get(path, headers, timeout).await,
            }
            .map_err(|source| FetchError::Request {
                path: path.to_owned(),
                source,
            })?;
            let (parts, incoming) = resp.into_parts();
            let body = Limited::new(incoming, MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map_err(|source| FetchError::Body {
                    path: path.to_owned(),
                    source,
                })?
                .to_bytes();
            Ok(Fetched {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(timeout, request)
            .await
            .map_err(|_| FetchError::Timeout {
                path: path.to_owned(),
                timeout,
            })?
    }
}

// === OpenAPI v3 roots ===

/// An OpenAPI v3 root as last fetched, with what revalidating it needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RootDocument {
    /// Never answered.
    #[default]
    Unknown,
    /// The server has no `/openapi/v3` (404).
    Absent,
    Root {
        root: OpenApiRoot,
        etag: Option<String>,
    },
}

// === impl RootDocument ===

impl RootDocument {
    /// The ETag to revalidate with: only a root we hold can be revalidated.
    pub fn etag(&self) -> Option<&str> {
        match self {
            Self::Root { etag, .. } => etag.as_deref(),
            _ => None,
        }
    }

    pub fn root(&self) -> Option<&OpenApiRoot> {
        match self {
            Self::Root { root, .. } => Some(root),
            _ => None,
        }
    }

    /// Takes in a fetch's outcome; `true` when the root (or its absence) changed.
    pub fn apply(&mut self, fetch: RootFetch) -> bool {
        let next = match fetch {
            RootFetch::NotModified => return false,
            RootFetch::Root(root, etag) => Self::Root { root, etag },
            RootFetch::Absent => Self::Absent,
        };
        let changed = self.root() != next.root() || matches!(self, Self::Unknown);
        *self = next;
        changed
    }
}

/// Outcome of fetching an OpenAPI v3 root.
pub enum RootFetch {
    NotModified,
    Root(OpenApiRoot, Option<String>),
    /// 404: the server has no OpenAPI v3.
    Absent,
}

pub async fn fetch_root(source: &Source, etag: Option<&str>) -> Result<RootFetch, FetchError> {
    const PATH: &str = "/openapi/v3";
    let answer = source
        .get(PATH, "application/json", etag, OPENAPI_TIMEOUT)
        .await?;
    match answer.status {
        StatusCode::NOT_MODIFIED if etag.is_some() => Ok(RootFetch::NotModified),
        StatusCode::OK => Ok(RootFetch::Root(
            answer.decode(PATH, "OpenAPI v3 root")?,
            answer.etag(),
        )),
        StatusCode::NOT_FOUND => Ok(RootFetch::Absent),
        status => Err(FetchError::Status {
            path: PATH.to_owned(),
            status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(v: &'static str) -> HeaderValue {
        HeaderValue::from_static(v)
    }

    #[test]
    fn aggregated_content_type_follows_client_go() {
        for yes in [
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            // any order, spaces, extra parameters, case-insensitive names and media type
            "application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io",
            "Application/JSON;G=apidiscovery.k8s.io;V=v2;AS=APIGroupDiscoveryList;charset=utf-8",
            "application/json;g=\"apidiscovery.k8s.io\";v=v2;as=APIGroupDiscoveryList",
        ] {
            assert!(is_aggregated_content_type(Some(&ct(yes))), "{yes}");
        }
        for no in [
            "application/json",
            "application/json; charset=utf-8",
            "application/json;g=apidiscovery.k8s.io;v=v1;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2",
            "application/json;g=other.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=apigroupdiscoverylist",
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "text/plain",
            "",
        ] {
            assert!(!is_aggregated_content_type(Some(&ct(no))), "{no}");
        }
        assert!(!is_aggregated_content_type(None));
    }

    #[test]
    fn a_root_counts_as_changed_only_when_it_differs() {
        let root: OpenApiRoot = serde_json::from_value(serde_json::json!({"paths": {}})).unwrap();
        let mut doc = RootDocument::default();
        assert!(doc.apply(RootFetch::Root(root.clone(), Some("\"A\"".into()))));
        assert_eq!(doc.etag(), Some("\"A\""));
        assert!(!doc.apply(RootFetch::NotModified));
        assert!(!doc.apply(RootFetch::Root(root, Some("\"B\"".into()))));
        assert_eq!(doc.etag(), Some("\"B\""));
        assert!(doc.apply(RootFetch::Absent));
        assert_eq!(doc.etag(), None);
        assert!(!doc.apply(RootFetch::Absent));
    }

    #[test]
    fn a_document_nested_too_deep_is_named_as_such() {
        let depth = MAX_JSON_DEPTH + 1;
        let deep = format!(r#"{{"x-a":{}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        let answer = Fetched {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from(deep),
        };
        let err = answer
            .decode::<serde_json::Value>("/openapi/v2", "OpenAPI v2 spec")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "GET /openapi/v2: the OpenAPI v2 spec nests deeper than 128 levels, which the \
             gateway does not parse; the server must publish a flatter document"
        );
        assert!(err.is_bad_document());
        // A typed document skips fields it does not know without building them (serde_json
        // skips without recursion), so there depth costs nothing and is no error.
        let root = answer.decode::<OpenApiRoot>("/openapi/v3", "OpenAPI v3 root");
        assert_eq!(root.unwrap(), OpenApiRoot::default());
        let answer = Fetched {
            body: Bytes::from_static(b"{\"paths\": 1}"),
            ..answer
        };
        let err = answer
            .decode::<OpenApiRoot>("/openapi/v3", "OpenAPI v3 root")
            .unwrap_err();
        assert!(matches!(err, FetchError::Decode { .. }), "{err}");
    }
}
