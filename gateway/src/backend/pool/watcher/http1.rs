//! The kept connection to an endpoint that speaks no HTTP/2: an idle HTTP/1.1
//! connection, and a probe on it once per PING interval.
//!
//! HTTP/1.1 has no PING. The connection's close is what a killed process gives (its kernel sends
//! FIN or RST at once), and a frozen one, whose kernel still holds the connection open, is told
//! by the probe it leaves unanswered: `GET /healthz` with the gateway's own certificate, where
//! any answer counts (a 401 or 403 is a process that answers). One request per interval per
//! endpoint, jittered so a thousand endpoints do not probe in step.

use std::time::Duration;

use http::uri::Authority;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Limited};
use hyper::client::conn::http1;

use super::super::connect::DialedIo;
use super::{Ended, Pings, State};
use crate::body::{self, Body};

/// The most of a probe's answer read (it is read to the end, so the connection stays usable).
const MAX_PROBE_ANSWER: usize = 64 << 10;
/// The path probed: every k8s.io/apiserver server answers it, anyone may read it.
const PROBE_PATH: &str = "/healthz";

/// Drives the connection and probes on it until it ends.
pub(super) async fn watch(io: DialedIo, pings: Pings, state: &mut State) -> Ended {
    let (mut send, connection) = match http1::handshake::<_, Body>(*io).await {
        Ok(handshake) => handshake,
        Err(e) => return Ended::Failed("kept connection could not be made", e.to_string()),
    };
    let mut connection = std::pin::pin!(connection);
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            ended = &mut connection => return closed(ended),
            () = tokio::time::sleep(wait) => {}
        }
        let probe = tokio::time::timeout(pings.timeout, probe(&mut send, &state.endpoint));
        tokio::select! {
            ended = &mut connection => return closed(ended),
            answered = probe => match answered {
                Ok(Ok(())) => state.up(),
                Ok(Err(e)) => return Ended::Failed("probe on the kept connection failed", e),
                Err(_) => {
                    return Ended::Failed(
                        "probe on the kept connection unanswered",
                        format!("no answer to GET {PROBE_PATH} within {:?}", pings.timeout),
                    )
                }
            },
        }
        wait = jittered(pings.interval);
    }
}

/// How the connection ended on its own: closed with no request on it, which a backend does to
/// idle connections as well as when its process dies. The watcher dials again; a process that
/// is gone fails that dial.
fn closed(ended: Result<(), hyper::Error>) -> Ended {
    match ended {
        Ok(()) => Ended::Closed,
        Err(e) => Ended::Failed("kept connection failed (reset)", e.to_string()),
    }
}

/// One `GET /healthz` on the connection, read to the end.
async fn probe(send: &mut http1::SendRequest<Body>, endpoint: &Authority) -> Result<(), String> {
    send.ready().await.map_err(|e| e.to_string())?;
    let req = Request::builder()
        .method(Method::GET)
        .uri(PROBE_PATH)
        .header(header::HOST, endpoint.as_str())
        .body(body::empty())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    Limited::new(resp.into_body(), MAX_PROBE_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("reading the answer to GET {PROBE_PATH}: {e}"))?;
    Ok(())
}

/// `interval`, give or take a tenth.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + fastrand::f64() * 0.2)
}
