//! The front door: accepts TCP, completes the TLS handshake (ALPN h2/http1.1, optional client
//! certificate), and serves HTTP/2 or HTTP/1.1 (with upgrades) on each connection, as ALPN chose.
//! The serving configuration is loaded per connection from an `ArcSwap`, so a rotated certificate
//! is used by new connections while open ones carry on.
//!
//! Every phase before a request is bounded by the header read timeout, so a client that connects
//! and then stalls cannot hold a task and a file descriptor: the TLS handshake by a timeout around
//! it, HTTP/1.1 by hyper's header read timeout (armed from the first read of every request head),
//! and HTTP/2 by [`FirstRequestDeadline`], since hyper's HTTP/2 server has no timer before the
//! client preface and its keep-alive pings only start once the preface is in.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tracing::Instrument;

use arc_swap::ArcSwap;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Sleep;
use tower::Service;

use crate::body::{self, Request, Response};
use crate::request::ConnInfo;

pub struct ListenerSettings {
    pub header_read_timeout: Duration,
    pub max_header_bytes: u32,
    pub http2_max_streams: u32,
}

struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    header_read_timeout: Duration,
}

fn builders(settings: &ListenerSettings) -> Builders {
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192) as usize)
        .keep_alive(true);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    // Pings detect a peer that went away, also between requests (hyper pings idle connections).
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(settings.http2_max_streams)
        .max_header_list_size(settings.max_header_bytes)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    Builders {
        http1: h1,
        http2: h2,
        header_read_timeout: settings.header_read_timeout,
    }
}

/// Accepts until `stop` turns true, then returns the handle that drains open connections.
pub async fn serve<S>(
    listener: TcpListener,
    tls: Arc<ArcSwap<ServerConfig>>,
    service: S,
    settings: ListenerSettings,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown
where
    S: Service<Request, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let builders = Arc::new(builders(&settings));
    let handshake_timeout = settings.header_read_timeout;
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::proxy::drained(&mut stop) => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.load_full());
        let service = service.clone();
        let builders = builders.clone();
        let watcher = graceful.watcher();
        let mut stop = stop.clone();
        tokio::spawn(
            async move {
                let stream =
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("TLS handshake timed out");
                            return;
                        }
                    };
                let tls_conn = stream.get_ref().1;
                let peer_certs = tls_conn.peer_certificates().map(|c| {
                    Arc::new(c.iter().map(|c| c.clone().into_owned()).collect::<Vec<_>>())
                });
                // Over TLS, HTTP/2 is only ever chosen by ALPN (RFC 9113 §3.3, and what Go's net/http
                // and so kube-apiserver do); without it the client speaks HTTP/1.1. Not sniffing for
                // a prior-knowledge preface leaves no read without a deadline before the request.
                let is_h2 = tls_conn.alpn_protocol() == Some(b"h2".as_slice());
                let info = ConnInfo { remote, peer_certs };
                let request_seen = Arc::new(AtomicBool::new(false));
                let seen = request_seen.clone();
                let per_conn =
                    tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        seen.store(true, Ordering::Relaxed);
                        let mut req = req.map(body::boxed);
                        req.extensions_mut().insert(info.clone());
                        service.clone().call(req)
                    });
                let service = TowerToHyperService::new(per_conn);
                let result = if is_h2 {
                    let io = FirstRequestDeadline::new(
                        stream,
                        builders.header_read_timeout,
                        request_seen,
                    );
                    let conn = builders.http2.serve_connection(TokioIo::new(io), service);
                    watcher.watch(conn).await
                } else {
                    // hyper-util's graceful watcher does not take an HTTP/1 connection with upgrades,
                    // so the drain signal is followed here; holding the watcher keeps the drain
                    // waiting for this connection.
                    let _draining_waits_for_us = watcher;
                    let conn = builders
                        .http1
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades();
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        result = conn.as_mut() => result,
                        _ = crate::proxy::drained(&mut stop) => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            }
            .instrument(tracing::debug_span!("connection", client = %remote)),
        );
    }
    graceful
}

/// Fails reads once `timeout` has passed without the connection's first request reaching the
/// service, which bounds the HTTP/2 client preface and the first HEADERS frame like hyper's
/// header read timeout bounds an HTTP/1 request head. The failed read ends the connection.
/// After the first request, hyper's keep-alive pings take over.
struct FirstRequestDeadline<T> {
    inner: T,
    deadline: Option<Pin<Box<Sleep>>>,
    request_seen: Arc<AtomicBool>,
}

impl<T> FirstRequestDeadline<T> {
    fn new(inner: T, timeout: Duration, request_seen: Arc<AtomicBool>) -> Self {
        FirstRequestDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            request_seen,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstRequestDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bytes already here are handed over first: a request that arrives right at the
        // deadline is served rather than cut off.
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_ready() {
            return read;
        }
        if this.request_seen.load(Ordering::Relaxed) {
            this.deadline = None;
        } else if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request arrived within the header read timeout",
                )));
            }
        }
        Poll::Pending
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstRequestDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
