//! The issuer's HTTPS server: discovery and JWKS, counted, or one of the ways an issuer fails.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{Misbehaviour, State};

pub(super) type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

pub const WELL_KNOWN: &str = "/.well-known/openid-configuration";
pub const JWKS_PATH: &str = "/openid/v1/jwks";

pub(super) async fn serve(listener: TcpListener, tls: TlsAcceptor, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        if state.misbehaviour() == Misbehaviour::Refuse {
            // Closed before the handshake: a client sees its TLS connection fail.
            drop(tcp);
            continue;
        }
        let (tls, state) = (tls.clone(), state.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&state, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()).boxed())
        .expect("a response")
}

/// `n` bytes of JSON-looking whitespace inside an object that never closes, in 64 KiB chunks.
fn endless(n: usize) -> Response<Body> {
    let chunks = futures::stream::iter((0..n.div_ceil(65_536)).map(|i| {
        let chunk = if i == 0 {
            let mut first = b"{\"keys\": [".to_vec();
            first.resize(65_536, b' ');
            first
        } else {
            vec![b' '; 65_536]
        };
        Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
    }));
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .expect("a response")
}

/// Whether the request's `Accept` (none, `*/*`, `application/*` or the JWK set's own type)
/// takes `application/jwk-set+json`.
fn accepts_jwk_set(req: &Request<Incoming>) -> bool {
    let Some(accept) = req.headers().get(http::header::ACCEPT) else {
        return true;
    };
    let accept = accept.to_str().unwrap_or_default();
    accept.split(',').any(|range| {
        let range = range.split(';').next().unwrap_or_default().trim();
        matches!(range, "*/*" | "application/*" | "application/jwk-set+json")
    })
}

async fn respond(state: &State, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let discovery =
        (path == WELL_KNOWN && state.options.well_known) || state.is_alternate_discovery(&path);
    let jwks = path == JWKS_PATH;
    if discovery {
        state.discovery_fetches.fetch_add(1, Ordering::SeqCst);
    } else if jwks {
        state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    } else {
        return full(StatusCode::NOT_FOUND, "text/plain", "404 page not found\n");
    }
    match state.misbehaviour() {
        Misbehaviour::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            full(StatusCode::GATEWAY_TIMEOUT, "text/plain", "")
        }
        Misbehaviour::Garbage => full(StatusCode::OK, "application/json", "{\"keys\": [{not json"),
        Misbehaviour::Oversized(n) => endless(n),
        Misbehaviour::ServerError => full(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "boom"),
        Misbehaviour::None | Misbehaviour::Refuse if discovery => {
            let doc = json!({
                "issuer": state.issuer_claim(),
                "jwks_uri": format!("{}{JWKS_PATH}", state.base),
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported":
                    ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384"],
            });
            full(StatusCode::OK, "application/json", doc.to_string())
        }
        // kube-apiserver serves its JWKS as `application/jwk-set+json` only, and refuses an
        // `Accept` that excludes it (seen on the real node: 406 for `application/json`).
        Misbehaviour::None | Misbehaviour::Refuse if !accepts_jwk_set(&req) => full(
            StatusCode::NOT_ACCEPTABLE,
            "text/plain",
            "only application/jwk-set+json is served\n",
        ),
        Misbehaviour::None | Misbehaviour::Refuse => {
            let keys = state.published();
            full(
                StatusCode::OK,
                "application/jwk-set+json",
                json!({ "keys": keys }).to_string(),
            )
        }
    }
}
