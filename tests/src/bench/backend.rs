//! The static backend (`bench serve-backend`): a hyper server answering from prepared bytes, as
//! cheap as a server can be, so that what the bench measures is the gateway's overhead and not the
//! backend's work. One runs as plain HTTP (the gateway's core), one with TLS (the direct target and
//! the remote APIService); each is its own process so its RSS and CPU are its own.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use sha2::{Digest, Sha512};
use tokio::net::TcpListener;

use super::documents::{core_api_doc, core_apis_doc};
use super::{BoxError, Io, AGGREGATED_V2, ONE_MIB};
use crate::certs::CertifiedPair;

/// Prepared answers of the static backend.
struct Documents {
    /// `--static-file`s, served at `/bench/static/<file name>` (the OpenAPI scenario's copy of
    /// the gateway's merged document).
    files: Vec<StaticFile>,
    small: Bytes,
    big: Bytes,
    apis: Bytes,
    apis_etag: HeaderValue,
    api: Bytes,
    api_etag: HeaderValue,
    event: Bytes,
}

/// A file served as it is, with an ETag, like a static web server would.
struct StaticFile {
    path: String,
    body: Bytes,
    etag: HeaderValue,
}

impl StaticFile {
    fn read(path: &Path) -> Result<StaticFile, BoxError> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("--static-file {}: no file name", path.display()))?;
        let body = Bytes::from(
            std::fs::read(path).map_err(|e| format!("--static-file {}: {e}", path.display()))?,
        );
        Ok(StaticFile {
            path: format!("/bench/static/{name}"),
            etag: etag(&body),
            body,
        })
    }
}

impl Documents {
    fn new(files: Vec<StaticFile>) -> Documents {
        let small = Bytes::from(
            serde_json::to_vec(&json!({
                "kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": "bench", "namespace": "default", "resourceVersion": "1",
                             "uid": "6b1f2c3e-0000-4000-8000-000000000001",
                             "creationTimestamp": "2025-01-01T00:00:00Z"},
                "data": {"key": "value", "other": "a somewhat longer value to make a realistic small object"}
            }))
            .expect("static JSON"),
        );
        let apis = Bytes::from(serde_json::to_vec(&core_apis_doc()).expect("static JSON"));
        let api = Bytes::from(serde_json::to_vec(&core_api_doc()).expect("static JSON"));
        let mut event = serde_json::to_vec(&json!({"type": "ADDED", "object": serde_json::from_slice::<Value>(&small).expect("json")})).expect("json");
        event.push(b'\n');
        Documents {
            files,
            apis_etag: etag(&apis),
            api_etag: etag(&api),
            small,
            big: Bytes::from(vec![b'x'; ONE_MIB]),
            apis,
            api,
            event: Bytes::from(event),
        }
    }
}

fn etag(body: &[u8]) -> HeaderValue {
    let hex = hex::encode_upper(Sha512::digest(body));
    HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header value")
}

type BackendBody = BoxBody<Bytes, Infallible>;

fn full(bytes: Bytes) -> BackendBody {
    Full::new(bytes).boxed()
}

fn answer(docs: &Documents, req: &Request<Incoming>) -> Response<BackendBody> {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let aggregated = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("apidiscovery.k8s.io"));
    let json_response = |body: Bytes| {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(body))
            .expect("static response")
    };
    if query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
    {
        let first = futures::stream::once(std::future::ready(Ok::<_, Infallible>(Frame::data(
            docs.event.clone(),
        ))));
        let stream = futures::StreamExt::chain(first, futures::stream::pending());
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .expect("static response");
    }
    if let Some(file) = docs.files.iter().find(|f| f.path == path) {
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(header::ETAG, file.etag.clone())
            .body(full(file.body.clone()))
            .expect("static response");
    }
    match path {
        "/readyz" | "/livez" | "/healthz" => Response::new(full(Bytes::from_static(b"ok"))),
        "/apis" | "/api" if aggregated => {
            let (body, tag) = if path == "/apis" {
                (&docs.apis, &docs.apis_etag)
            } else {
                (&docs.api, &docs.api_etag)
            };
            let matched = req
                .headers()
                .get(header::IF_NONE_MATCH)
                .is_some_and(|v| v == tag);
            let builder = Response::builder()
                .header(header::CONTENT_TYPE, AGGREGATED_V2)
                .header(header::ETAG, tag.clone())
                .header(header::VARY, "Accept");
            if matched {
                builder
                    .status(StatusCode::NOT_MODIFIED)
                    .body(full(Bytes::new()))
                    .expect("static response")
            } else {
                builder.body(full(body.clone())).expect("static response")
            }
        }
        "/api" => json_response(Bytes::from_static(
            br#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#,
        )),
        "/openapi/v3" | "/openapi/v2" | "/apis" => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(full(Bytes::from_static(b"not found")))
            .expect("static response"),
        "/bench/1mib" => Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(full(docs.big.clone()))
            .expect("static response"),
        _ => json_response(docs.small.clone()),
    }
}

fn tls_server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, BoxError> {
    server_tls(&CertifiedPair {
        cert_pem: std::fs::read_to_string(cert)?,
        key_pem: std::fs::read_to_string(key)?,
    })
}

/// The TLS of every bench server: `pair`, HTTP/2 and HTTP/1.1 offered.
pub fn server_tls(pair: &CertifiedPair) -> Result<rustls::ServerConfig, BoxError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(pair.cert_chain()?, pair.private_key()?)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

pub async fn serve(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    static_files: Vec<PathBuf>,
) -> Result<(), BoxError> {
    let tls = match (cert, key) {
        (Some(c), Some(k)) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            tls_server_config(&c, &k)?,
        ))),
        _ => None,
    };
    let files = static_files
        .iter()
        .map(|p| StaticFile::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let docs = Arc::new(Documents::new(files));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("listening on {scheme}://{}", listener.local_addr()?);
    // The bench owns this process and kills it when done (harness `Process`, killed on drop).
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE under the watch scenario: back off instead of spinning.
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let docs = docs.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = answer(&docs, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(20_000);
            let io: Box<dyn Io> = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => Box::new(stream),
                    Err(_) => return,
                },
                None => Box::new(tcp),
            };
            let _ = builder.serve_connection(TokioIo::new(io), service).await;
        });
    }
}
