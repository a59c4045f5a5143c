//! HTTP/1.1 connections kept per backend address, for the requests that go out on HTTP/1.1:
//! anonymous callers' (to the core and to remote APIServices; see `core::Clients`) and those to
//! backends that do not offer `h2`. Upgrades stay on hyper-util's client (`forward_upgrade`).
//!
//! hyper-util's pooled client does the same job with more per request: a boxed response future,
//! a pool keyed by a SipHash of scheme and authority, a `Host` value formatted each time, the
//! connection's details inserted into the response's extensions, and, for every response with a
//! body, a task spawned to put the connection back once it is ready. Here a connection is taken
//! from a short list by comparing its authority, its `Host` value is built once, and it goes
//! back to the list when the response body is done with (ready or not: the next request waits
//! for it to be ready, and drops it if it closed instead).
//!
//! What hyper-util does for correctness is kept: a request a reused connection closed under
//! before sending it is sent again on another connection (hyper hands it back), a request on a
//! fresh connection is not, and connections unused for [`IDLE_TIMEOUT`] are closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::header::{HeaderValue, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::Uri;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use tokio::time::Instant;
use tower::ServiceExt;

use super::PoolError;
use crate::body::{Body, BoxError, Request};

/// How long an unused connection stays open (hyper-util's client was set to the same).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Unused connections kept per address (as `backend::client_builder`'s `pool_max_idle_per_host`).
const MAX_IDLE_PER_ADDRESS: usize = 256;

type Dial = Arc<
    dyn Fn(Uri) -> Pin<Box<dyn Future<Output = Result<http1::SendRequest<Body>, BoxError>> + Send>>
        + Send
        + Sync,
>;

/// The HTTP/1.1 connections to one backend (any of its addresses), made by one connector.
#[derive(Clone)]
pub struct Http1Connections {
    dial: Dial,
    idle: Arc<Mutex<Vec<Idle>>>,
}

/// A connection nobody sends on now.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// A connection to one address, with the `Host` its requests carry.
struct Conn {
    /// Compared by pointer first: requests to one address usually carry clones of one
    /// `Authority` (the core's, a balancer's endpoint), and comparing the text case-blind on
    /// every take is a measurable cost (BENCHMARKS.md, "Why the code is shaped so").
    authority: Authority,
    host: HeaderValue,
    send: http1::SendRequest<Body>,
}

// === impl Http1Connections ===

impl Http1Connections {
    /// Connections dialed with `connector` (a hyper-util connector: TCP, TLS or a Unix socket).
    pub fn new<C>(connector: C) -> Self
    where
        C: tower::Service<Uri> + Clone + Send + Sync + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        C::Future: Send,
        C::Error: Into<BoxError>,
    {
        let dial: Dial = Arc::new(move |uri| {
            let connector = connector.clone();
            Box::pin(async move {
                let io = connector.oneshot(uri).await.map_err(Into::into)?;
                let (send, connection) = http1::handshake(io).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "HTTP/1.1 connection to a backend ended");
                    }
                });
                Ok(send)
            })
        });
        let idle = Arc::new(Mutex::new(Vec::new()));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_idle(Arc::downgrade(&idle)));
        }
        Self { dial, idle }
    }

    /// Sends `req` (an absolute URI naming the address) on a kept connection to its address,
    /// or a new one. The connection goes back when the returned [`GiveBack`] is dropped: hold it
    /// as long as the response body.
    pub async fn send(
        &self,
        mut req: Request,
    ) -> Result<(http::Response<Incoming>, GiveBack), PoolError> {
        let (Some(scheme), Some(authority)) =
            (req.uri().scheme().cloned(), req.uri().authority().cloned())
        else {
            return Err(PoolError::Connect(
                "the request names no backend address".into(),
            ));
        };
        // HTTP/1.1 origin form: the path and query alone, the address in `Host`.
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(path);
        loop {
            let (mut conn, reused) = match self.take(&authority) {
                Some(conn) => (conn, true),
                None => (self.connect(&scheme, &authority).await?, false),
            };
            if let Err(e) = conn.send.ready().await {
                // It closed while unused: another one (the request is still ours). A new
                // connection that closes before taking a request is a failed connection.
                if reused {
                    continue;
                }
                return Err(PoolError::Connect(e.into()));
            }
            req.headers_mut()
                .entry(HOST)
                .or_insert_with(|| conn.host.clone());
            match conn.send.try_send_request(req).await {
                Ok(resp) => {
                    let back = GiveBack {
                        conn: Some(conn),
                        idle: Arc::downgrade(&self.idle),
                    };
                    return Ok((resp, back));
                }
                Err(mut e) => match e.take_message() {
                    // The connection closed before the request was written: hyper hands it
                    // back. A fresh connection doing that says the backend is broken.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(PoolError::Request(e.into_error())),
                },
            }
        }
    }

    /// The newest unused connection to `authority` that is still open.
    fn take(&self, authority: &Authority) -> Option<Conn> {
        let mut idle = lock(&self.idle);
        while let Some(i) = idle
            .iter()
            .rposition(|c| same_address(&c.conn.authority, authority))
        {
            let Idle { conn, .. } = idle.remove(i);
            if !conn.send.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    async fn connect(&self, scheme: &Scheme, authority: &Authority) -> Result<Conn, PoolError> {
        let uri = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| PoolError::Connect(e.into()))?;
        let host = host_value(scheme, authority).map_err(|e| PoolError::Connect(e.into()))?;
        let send = (self.dial)(uri).await.map_err(PoolError::Connect)?;
        Ok(Conn {
            authority: authority.clone(),
            host,
            send,
        })
    }
}

/// Whether `a` and `b` name the same address: the same text (usually the same clone) or equal.
fn same_address(a: &Authority, b: &Authority) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

/// The `Host` of requests to `authority`: without the port when it is the scheme's default, as
/// hyper-util writes it.
fn host_value(
    scheme: &Scheme,
    authority: &Authority,
) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    let default_port = match scheme.as_str() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    if authority.port_u16().is_some() && authority.port_u16() == default_port {
        HeaderValue::from_str(authority.host())
    } else {
        HeaderValue::from_str(authority.as_str())
    }
}

/// Puts a connection back among the unused ones when the response body it carried is done
/// with (read to its end, or dropped: hyper then closes the connection, and `take` skips it).
pub struct GiveBack {
    conn: Option<Conn>,
    idle: Weak<Mutex<Vec<Idle>>>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        let (Some(conn), Some(idle)) = (self.conn.take(), self.idle.upgrade()) else {
            return;
        };
        if conn.send.is_closed() {
            return;
        }
        let mut idle = lock(&idle);
        let kept = idle
            .iter()
            .filter(|c| same_address(&c.conn.authority, &conn.authority))
            .count();
        if kept < MAX_IDLE_PER_ADDRESS {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

/// Every 30 s, closes connections unused for [`IDLE_TIMEOUT`]; ends with the connections.
async fn close_idle(idle: Weak<Mutex<Vec<Idle>>>) {
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        lock(&idle).retain(|c| !c.conn.send.is_closed() && c.since.elapsed() < IDLE_TIMEOUT);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioIo;

    use super::*;
    use crate::body;

    /// A plain HTTP/1.1 server on 127.0.0.1 that answers every request with its `Host`, closing
    /// the connection after each answer when `close` is set; counts the connections it accepts.
    async fn server(close: bool) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let host = req.headers().get(HOST).cloned();
                    async move {
                        let mut resp = http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(format!("{:?}", host)),
                        ));
                        if close {
                            resp.headers_mut().insert(
                                http::header::CONNECTION,
                                HeaderValue::from_static("close"),
                            );
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service),
                );
            }
        });
        (addr, accepted)
    }

    async fn get(connections: &Http1Connections, addr: std::net::SocketAddr) -> String {
        let req = http::Request::get(format!("http://{addr}/apis"))
            .body(body::empty())
            .unwrap();
        let (resp, back) = connections.send(req).await.expect("an answer");
        let text = resp.into_body().collect().await.unwrap().to_bytes();
        drop(back);
        String::from_utf8(text.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection_and_name_the_host() {
        let (addr, accepted) = server(false).await;
        let connections = Http1Connections::new(HttpConnector::new());
        for _ in 0..3 {
            assert_eq!(
                get(&connections, addr).await,
                format!("Some({:?})", addr.to_string())
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the connection was given back"
        );
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_is_not_used_again() {
        let (addr, accepted) = server(true).await;
        let connections = Http1Connections::new(HttpConnector::new());
        for _ in 0..3 {
            get(&connections, addr).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_host_leaves_out_the_default_port() {
        let host = |scheme: Scheme, authority: &str| {
            host_value(&scheme, &authority.parse().unwrap()).unwrap()
        };
        assert_eq!(host(Scheme::HTTPS, "api.example:443"), "api.example");
        assert_eq!(host(Scheme::HTTP, "127.0.0.1:80"), "127.0.0.1");
        assert_eq!(host(Scheme::HTTPS, "10.0.0.1:8443"), "10.0.0.1:8443");
        assert_eq!(host(Scheme::HTTP, "localhost"), "localhost");
    }
}
