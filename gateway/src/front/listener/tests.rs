//! The listener against real TLS clients: what ends a connection that is not ending by itself.

use std::convert::Infallible;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{timeout, Instant};

use super::*;

/// A listener on 127.0.0.1 answering every request `200 ok`, the roots that trust it, and the
/// sender that drains it.
async fn listening() -> (
    std::net::SocketAddr,
    rustls::RootCertStore,
    watch::Sender<bool>,
) {
    let (tls, roots) = crate::test_util::self_signed_server("gateway.test", &[b"h2", b"http/1.1"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ok = tower::service_fn(|_req: Request| async {
        Ok::<_, Infallible>(Response::new(crate::body::full("ok")))
    });
    let settings = ListenerSettings {
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 1 << 20,
        http2_max_streams: 100,
        max_connections: 16,
    };
    let (stop, stopped) = watch::channel(false);
    let tls = Arc::new(ArcSwap::from_pointee(tls));
    tokio::spawn(serve(listener, tls, ok, settings, stopped));
    (addr, roots, stop)
}

/// A TLS connection to `addr` offering `alpn`.
async fn connect(
    addr: std::net::SocketAddr,
    roots: rustls::RootCertStore,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("gateway.test").unwrap(), tcp)
        .await
        .unwrap()
}

/// How long before [`IDLE_TIMEOUT`] a connection is checked to be still open.
const MARGIN: Duration = Duration::from_secs(5);

// The clock is paused once the connection has served its request, so that 90 s pass at once;
// the sockets are real, on this host, and ready as soon as written.

#[tokio::test]
async fn an_idle_http1_connection_is_closed_after_the_idle_timeout() {
    let (addr, roots, _stop) = listening().await;
    let mut tls = connect(addr, roots, b"http/1.1").await;
    tls.write_all(b"GET /api HTTP/1.1\r\nhost: gateway.test\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\nok") {
        let mut buf = [0u8; 1024];
        let n = tls.read(&mut buf).await.unwrap();
        assert_ne!(n, 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }

    tokio::time::pause();
    let idle_since = Instant::now();
    let mut buf = [0u8; 1024];
    let early = timeout(IDLE_TIMEOUT - MARGIN, tls.read(&mut buf)).await;
    assert!(early.is_err(), "closed before the idle timeout: {early:?}");
    let closed = timeout(MARGIN * 2, tls.read(&mut buf))
        .await
        .expect("the idle HTTP/1.1 connection was still open after the idle timeout");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    assert!(idle_since.elapsed() >= IDLE_TIMEOUT - MARGIN);
}

#[tokio::test]
async fn an_idle_http2_connection_is_sent_goaway_after_the_idle_timeout() {
    let (addr, roots, _stop) = listening().await;
    let tls = connect(addr, roots, b"h2").await;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    let mut conn = std::pin::pin!(conn);
    let req = http::Request::get("https://gateway.test/api")
        .body(crate::body::empty())
        .unwrap();
    let resp = tokio::select! {
        resp = send.send_request(req) => resp.unwrap(),
        ended = conn.as_mut() => panic!("the connection ended before answering: {ended:?}"),
    };
    assert_eq!(resp.status(), http::StatusCode::OK);
    drop(resp);

    tokio::time::pause();
    let idle_since = Instant::now();
    let early = timeout(IDLE_TIMEOUT - MARGIN, conn.as_mut()).await;
    assert!(early.is_err(), "closed before the idle timeout: {early:?}");
    timeout(MARGIN * 2, conn)
        .await
        .expect("the idle HTTP/2 connection was still open after the idle timeout")
        .expect("the connection did not end cleanly with a GOAWAY");
    assert!(idle_since.elapsed() >= IDLE_TIMEOUT - MARGIN);
    drop(send);
}

#[tokio::test]
async fn a_drain_ends_idle_connections_of_both_protocols() {
    let (addr, roots, stop) = listening().await;
    let mut h1 = connect(addr, roots.clone(), b"http/1.1").await;
    let h2 = connect(addr, roots, b"h2").await;
    let (send, conn) = hyper::client::conn::http2::handshake::<_, _, crate::body::Body>(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(h2),
    )
    .await
    .unwrap();
    let mut conn = std::pin::pin!(conn);
    // Both connections are being served (past the handshake, waiting for a request).
    assert!(timeout(Duration::from_millis(200), conn.as_mut())
        .await
        .is_err());

    stop.send(true).unwrap();
    timeout(Duration::from_secs(10), conn)
        .await
        .expect("the HTTP/2 connection was not ended by the drain")
        .expect("the connection did not end cleanly with a GOAWAY");
    let mut buf = [0u8; 16];
    let closed = timeout(Duration::from_secs(10), h1.read(&mut buf))
        .await
        .expect("the HTTP/1.1 connection was not ended by the drain");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    drop(send);
}
