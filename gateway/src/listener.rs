//! The front door: accepts TCP, completes the TLS handshake (ALPN h2/http1.1, optional client
//! certificate), and serves HTTP/1.1 and HTTP/2 with upgrades on each connection. The serving
//! configuration is loaded per connection from an `ArcSwap`, so a rotated certificate is used by
//! new connections while open ones carry on.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::Service;

use crate::body::{self, Request, Response};
use crate::stack::ConnInfo;

pub struct ListenerSettings {
    pub header_read_timeout: Duration,
    pub max_header_bytes: u32,
    pub http2_max_streams: u32,
}

fn builder(settings: &ListenerSettings) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192) as usize)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.http2_max_streams)
        .max_header_list_size(settings.max_header_bytes)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    b
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
    let builder = Arc::new(builder(&settings));
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
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(client = %remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(client = %remote, "TLS handshake timed out");
                    return;
                }
            };
            let peer_certs =
                stream.get_ref().1.peer_certificates().map(|c| {
                    Arc::new(c.iter().map(|c| c.clone().into_owned()).collect::<Vec<_>>())
                });
            let info = ConnInfo { remote, peer_certs };
            let per_conn = tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req = req.map(body::boxed);
                req.extensions_mut().insert(info.clone());
                service.clone().call(req)
            });
            let conn = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    TowerToHyperService::new(per_conn),
                )
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(client = %remote, error = %e, "connection ended with an error");
            }
        });
    }
    graceful
}
