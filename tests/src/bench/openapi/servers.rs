//! The API servers behind the OpenAPI scenario, in the bench process: one listener per server on
//! 127.0.0.1 port 0 (TLS for the remote APIServices, plain HTTP for the core), answering what
//! the gateway asks a Kubernetes-style server for:
//! - `GET /openapi/v2`: the server's current spec, with an ETag and 304 on `If-None-Match`; the
//!   spec can be replaced while serving ([`SpecServer::replace_spec`]);
//! - `GET /openapi/v3`: 404 (a server that serves v2 only);
//! - aggregated `GET /apis` (ETag, 304) and `GET /apis/<group>/<version>` (the availability probe
//!   and legacy discovery), `/readyz`, `/healthz`, `/livez`; the core also `/api`.
//!
//! They are idle while the gateway serves its cached merge, so sharing the bench process with
//! the load generator costs that measurement nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sha2::{Digest, Sha512};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::super::documents::{core_api_doc, discovery_list, group_entry, resource};
use super::super::{BoxError, Io, AGGREGATED_V2};

/// A body and the ETag it is served with.
#[derive(Clone)]
struct Tagged {
    body: Bytes,
    etag: HeaderValue,
}

impl Tagged {
    fn new(body: Bytes) -> Tagged {
        let hex = hex::encode(&Sha512::digest(&body)[..16]);
        Tagged {
            etag: HeaderValue::from_str(&format!("\"{hex}\""))
                .unwrap_or(HeaderValue::from_static("\"x\"")),
            body,
        }
    }

    /// 200 with the body, or 304 when the request names the current ETag.
    fn answer(&self, req: &Request<Incoming>, content_type: &'static str) -> Response<Full<Bytes>> {
        let matched = req
            .headers()
            .get(header::IF_NONE_MATCH)
            .is_some_and(|v| v == self.etag);
        let builder = Response::builder()
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ETAG, self.etag.clone());
        let resp = if matched {
            builder
                .status(StatusCode::NOT_MODIFIED)
                .body(Full::new(Bytes::new()))
        } else {
            builder.body(Full::new(self.body.clone()))
        };
        resp.unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR))
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(code.as_str().to_owned())));
    *resp.status_mut() = code;
    resp
}

/// What one server answers, shared with its connections.
struct Documents {
    group: String,
    version: String,
    spec: Mutex<Tagged>,
    apis: Tagged,
    resources: Bytes,
    core: bool,
}

fn answer(docs: &Documents, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let aggregated = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("apidiscovery.k8s.io"));
    let path = req.uri().path();
    let group_version = format!("/apis/{}/{}", docs.group, docs.version);
    match path {
        "/readyz" | "/livez" | "/healthz" => Response::new(Full::new(Bytes::from_static(b"ok"))),
        "/openapi/v2" => {
            let spec = match docs.spec.lock() {
                Ok(spec) => spec.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            spec.answer(req, "application/json")
        }
        "/apis" if aggregated => docs.apis.answer(req, AGGREGATED_V2),
        "/api" if docs.core && aggregated => Tagged::new(Bytes::from(
            serde_json::to_vec(&core_api_doc()).unwrap_or_default(),
        ))
        .answer(req, AGGREGATED_V2),
        "/api" if docs.core => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#,
            )))
            .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR)),
        p if p == group_version => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(docs.resources.clone()))
            .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR)),
        _ => status(StatusCode::NOT_FOUND),
    }
}

/// One running server; dropping it stops accepting (open connections end with the bench).
pub struct SpecServer {
    pub addr: SocketAddr,
    docs: Arc<Documents>,
    task: JoinHandle<()>,
}

impl Drop for SpecServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SpecServer {
    /// Serves `spec` and the discovery of `group`/`version` (one kind per `kinds`), over TLS
    /// when `tls` is given; the core (`core`) also answers `/api`.
    pub async fn start(
        group: &str,
        version: &str,
        kinds: usize,
        spec: Vec<u8>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        core: bool,
    ) -> Result<SpecServer, BoxError> {
        let resources: Vec<_> = (0..kinds)
            .map(|i| {
                resource(
                    group,
                    version,
                    &format!("widget{i:03}s"),
                    &format!("Widget{i:03}"),
                    true,
                )
            })
            .collect();
        let legacy: Vec<_> = (0..kinds)
            .map(|i| json!({"name": format!("widget{i:03}s"), "singularName": format!("widget{i:03}"),
                            "namespaced": true, "kind": format!("Widget{i:03}"),
                            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}))
            .collect();
        let docs = Arc::new(Documents {
            group: group.to_owned(),
            version: version.to_owned(),
            spec: Mutex::new(Tagged::new(Bytes::from(spec))),
            apis: Tagged::new(Bytes::from(serde_json::to_vec(&discovery_list(vec![
                group_entry(group, version, resources),
            ]))?)),
            resources: Bytes::from(serde_json::to_vec(&json!({
                "kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": format!("{group}/{version}"), "resources": legacy,
            }))?),
            core,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept_loop(listener, tls, docs.clone()));
        Ok(SpecServer { addr, docs, task })
    }

    /// Serves `spec` from now on, under a new ETag.
    pub fn replace_spec(&self, spec: Vec<u8>) {
        let tagged = Tagged::new(Bytes::from(spec));
        match self.docs.spec.lock() {
            Ok(mut current) => *current = tagged,
            Err(poisoned) => *poisoned.into_inner() = tagged,
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    docs: Arc<Documents>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (docs, tls) = (docs.clone(), tls.clone());
        tokio::spawn(async move {
            let io: Box<dyn Io> = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => Box::new(stream),
                    Err(_) => return,
                },
                None => Box::new(tcp),
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = answer(&docs, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
    }
}
