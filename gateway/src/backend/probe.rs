//! The availability probe of a remote APIService: kube-aggregator's discovery check
//! (`remote_available_controller.go`), `GET /apis/<group>/<version>` as `system:kube-aggregator`.
//!
//! Three things keep it honest about the backend, as upstream's does:
//! * **Connections of its own.** The probe never shares the traffic pool: a pool whose
//!   connections are full of long-running streams (watches) would queue the probe behind them,
//!   and a healthy backend would go unavailable for being busy.
//! * **Several attempts at once, any success counts** ([`ATTEMPTS`]): one lost request, one
//!   handshake that hit a restarting endpoint, one 403 while the backend still loads its
//!   trust settings never turns an APIService unavailable.
//! * **A failed check drops the probe's connections**, so the next one dials afresh (perhaps to
//!   another endpoint) instead of asking again on a connection that may be what is broken.
//!
//! One probe serves every APIService on a Service (it lives with the Service's connections), so
//! its connections do not grow with the number of APIServices. For that the first dial of a
//! fresh client goes alone: checks that start together wait for it (at most [`TIMEOUT`]) and
//! then share its connection, instead of each opening their own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use http::uri::Authority;
use http::Method;
use http_body_util::{BodyExt, Limited};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rustls::pki_types::ServerName;

use crate::body::{self, Body};
use crate::error::GatewayError;
use crate::identity::{set_identity_headers, UnencodableIdentity, UserInfo};

/// kube-aggregator's number of parallel attempts per check.
pub const ATTEMPTS: usize = 5;

/// kube-aggregator's limit for one attempt.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// How much of a discovery document is read (and thrown away) per attempt, and for how long.
const BODY_LIMIT: usize = 1 << 20;
const BODY_WAIT: Duration = Duration::from_secs(1);

/// Why a check failed, in upstream's words: the text becomes the `FailedDiscoveryCheck`
/// message of the APIService's `Available` condition.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The check's time ran out before any attempt could be made (waiting for another check's
    /// dial).
    #[error("no attempt was made")]
    NoAttempt,
    #[error("failing or missing response: timed out after {}s", .after.as_secs())]
    TimedOut { after: Duration },
    /// No endpoint to check (the Service does not resolve, or to an invalid address).
    #[error(transparent)]
    Unresolved(Box<GatewayError>),
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error(transparent)]
    Identity(#[from] UnencodableIdentity),
    #[error("failing or missing response from {authority}: timed out after {}s", .after.as_secs())]
    AttemptTimedOut {
        authority: Authority,
        after: Duration,
    },
    /// The connection or the exchange failed. `error` is written out with its causes in the
    /// message (the condition has no room for a chain), so it is not also a `source`.
    #[error("failing or missing response from {authority}: {}", crate::error::chain(.error))]
    Failed {
        authority: Authority,
        error: hyper_util::client::legacy::Error,
    },
    #[error("bad status from {authority}: {}", .status.as_u16())]
    BadStatus {
        authority: Authority,
        status: http::StatusCode,
    },
}

type ProbeClient = Client<HttpsConnector<HttpConnector>, Body>;

/// The probe's transport: the backend's TLS settings, a client of its own (see the module docs).
pub struct Probe {
    tls: rustls::ClientConfig,
    server_name: ServerName<'static>,
    /// Replaced after a failed check: dropping the old client closes its connections once the
    /// attempts still using them are gone.
    client: Mutex<Arc<Connections>>,
    /// Held by the attempt making a fresh client's first connection.
    dialing: tokio::sync::Mutex<()>,
}

/// One generation of the probe's connections.
struct Connections {
    client: ProbeClient,
    /// An attempt on this client got an answer: its connection is there to share.
    answered: AtomicBool,
}

// === impl Connections ===

impl Connections {
    fn new(tls: rustls::ClientConfig, server_name: ServerName<'static>) -> Arc<Self> {
        Arc::new(Self {
            client: build(tls, server_name),
            answered: AtomicBool::new(false),
        })
    }
}

// === impl Probe ===

impl Probe {
    pub fn new(tls: rustls::ClientConfig, server_name: ServerName<'static>) -> Self {
        let client = Mutex::new(Connections::new(tls.clone(), server_name.clone()));
        Self {
            tls,
            server_name,
            client,
            dialing: tokio::sync::Mutex::new(()),
        }
    }

    /// One check of `path` on the endpoints `resolve` picks (asked once per attempt, so the
    /// attempts can spread over a Service's endpoints): [`ATTEMPTS`] GETs at once as `user`,
    /// passed at the first 2xx; otherwise the last attempt's error, and the connections dropped.
    pub async fn check(
        &self,
        resolve: impl Fn() -> Result<Authority, ProbeError>,
        path: &str,
        user: &UserInfo,
    ) -> Result<(), ProbeError> {
        let client = self.client();
        // The whole check, waiting for another check's dial included, takes at most one
        // attempt's time: a hung backend is reported as soon as upstream's would be.
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let timed_out = || ProbeError::TimedOut { after: TIMEOUT };
        let mut last = ProbeError::NoAttempt;
        let mut parallel = ATTEMPTS;
        if !client.answered.load(Ordering::Acquire) {
            // Another check may be dialing: wait for it rather than dial beside it.
            if let Ok(_dialing) = tokio::time::timeout_at(deadline, self.dialing.lock()).await {
                if !client.answered.load(Ordering::Acquire) {
                    match tokio::time::timeout_at(deadline, attempt(&client, resolve(), path, user))
                        .await
                    {
                        Ok(Ok(())) => return Ok(()),
                        Ok(Err(e)) => last = e,
                        Err(_) => last = timed_out(),
                    }
                    parallel -= 1;
                }
            }
        }
        let mut attempts: FuturesUnordered<_> = (0..parallel)
            .map(|_| attempt(&client, resolve(), path, user))
            .collect();
        loop {
            match tokio::time::timeout_at(deadline, attempts.next()).await {
                // The other attempts are dropped (cancelled) with `attempts`.
                Ok(Some(Ok(()))) => return Ok(()),
                Ok(Some(Err(e))) => last = e,
                Ok(None) => break,
                Err(_) => {
                    if matches!(last, ProbeError::NoAttempt) {
                        last = timed_out();
                    }
                    break;
                }
            }
        }
        drop(attempts);
        self.reconnect(&client);
        Err(last)
    }

    fn client(&self) -> Arc<Connections> {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Swaps in a fresh client unless another check did already.
    fn reconnect(&self, failed: &Arc<Connections>) {
        let mut current = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&current, failed) {
            *current = Connections::new(self.tls.clone(), self.server_name.clone());
        }
    }
}

/// One GET with upstream's messages for what went wrong.
async fn attempt(
    connections: &Connections,
    authority: Result<Authority, ProbeError>,
    path: &str,
    user: &UserInfo,
) -> Result<(), ProbeError> {
    let authority = authority?;
    let mut req = http::Request::builder()
        .method(Method::GET)
        .uri(format!("https://{authority}{path}"))
        .header(http::header::ACCEPT, "application/json")
        .body(body::empty())?;
    set_identity_headers(req.headers_mut(), user)?;
    let resp = match tokio::time::timeout(TIMEOUT, connections.client.request(req)).await {
        Err(_) => {
            return Err(ProbeError::AttemptTimedOut {
                authority,
                after: TIMEOUT,
            })
        }
        Ok(Err(error)) => return Err(ProbeError::Failed { authority, error }),
        Ok(Ok(resp)) => resp,
    };
    connections.answered.store(true, Ordering::Release);
    let status = resp.status();
    // Read the (small) document so an HTTP/1.1 connection can serve the next check. What it
    // says does not matter (upstream only looks at the status), so neither does a body that
    // fails or will not end.
    let _ = tokio::time::timeout(
        BODY_WAIT,
        Limited::new(resp.into_body(), BODY_LIMIT).collect(),
    )
    .await;
    if status.is_success() {
        Ok(())
    } else {
        Err(ProbeError::BadStatus { authority, status })
    }
}

/// HTTP/2 where the backend offers it (the attempts then share one connection, as Go's client
/// shares one in kube-aggregator), HTTP/1.1 otherwise; a connect timeout below [`TIMEOUT`].
fn build(tls: rustls::ClientConfig, server_name: ServerName<'static>) -> ProbeClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .with_server_name_resolver(FixedServerNameResolver::new(server_name))
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    super::client_builder().build(connector)
}
