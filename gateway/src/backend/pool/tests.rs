//! The pool against real HTTP/2 servers over TLS: more connections when streams run out, a
//! deadline instead of a queue, and refused streams sent again.

use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_rustls::FixedServerNameResolver;
use rustls::pki_types::ServerName;

use super::*;

type TlsStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// A TLS server (ALPN `h2`) on 127.0.0.1 handing each accepted connection, with its index from
/// 0, to `serve`. Returns its address, a count of the connections it accepted, and the roots
/// that trust it.
async fn tls_server<F, Fut>(
    serve: F,
) -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    rustls::RootCertStore,
)
where
    F: Fn(usize, TlsStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (acceptor, roots) = tls_acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let index = counted.fetch_add(1, Ordering::SeqCst);
            let (acceptor, serve) = (acceptor.clone(), serve.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve(index, tls).await;
                }
            });
        }
    });
    (addr, accepted, roots)
}

/// An HTTP/2 server allowing one stream per connection: `/hang` answers only when `release` is
/// notified, anything else at once.
async fn one_stream_server(
    release: Arc<Notify>,
) -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    rustls::RootCertStore,
) {
    tls_server(move |_, tls| {
        let release = release.clone();
        async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let release = release.clone();
                async move {
                    if req.uri().path() == "/hang" {
                        release.notified().await;
                    }
                    Ok::<_, std::convert::Infallible>(http::Response::new(body::full("ok")))
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(1)
                .serve_connection(TokioIo::new(tls), service)
                .await;
        }
    })
    .await
}

/// An HTTP/2 server whose first connection refuses every stream but `/hang` (REFUSED_STREAM),
/// as a server closing that connection would; later connections answer everything. Returns
/// its address, accepted connections, the streams it answered and the roots that trust it.
async fn refusing_server() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    rustls::RootCertStore,
) {
    let answered = Arc::new(AtomicUsize::new(0));
    let answers = answered.clone();
    let (addr, accepted, roots) = tls_server(move |index, tls| {
        let answers = answers.clone();
        async move {
            let Ok(mut conn) = h2::server::handshake(tls).await else {
                return;
            };
            let mut held = Vec::new();
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                if req.uri().path() == "/hang" {
                    held.push(respond);
                } else if index == 0 {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                } else {
                    answers.fetch_add(1, Ordering::SeqCst);
                    let _ = respond.send_response(http::Response::new(()), true);
                }
            }
        }
    })
    .await;
    (addr, accepted, answered, roots)
}

fn tls_acceptor() -> (tokio_rustls::TlsAcceptor, rustls::RootCertStore) {
    let (tls, roots) = crate::test_util::self_signed_server("api.wardle.svc", &[b"h2"]);
    (tokio_rustls::TlsAcceptor::from(Arc::new(tls)), roots)
}

fn pool(roots: rustls::RootCertStore, max_connections: usize) -> ServiceConnections {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let builder = || {
        hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(
                ServerName::try_from("api.wardle.svc").unwrap(),
            ))
            .enable_http1()
            .enable_http2()
    };
    let failures = FailureSignal::new();
    let kept = builder().wrap_connector(Watched::new(http.clone(), None));
    let connector = builder().wrap_connector(Watched::new(http, Some(failures.clone())));
    let probe = Probe::new(tls, ServerName::try_from("api.wardle.svc").unwrap());
    ServiceConnections::new(
        connector.clone(),
        kept,
        connector,
        probe,
        failures,
        PoolSettings {
            max_connections,
            stream_wait: Duration::from_millis(300),
            ..PoolSettings::default()
        },
    )
}

fn get(addr: std::net::SocketAddr, path: &str) -> Request {
    http::Request::get(format!("https://{addr}{path}"))
        .body(body::empty())
        .unwrap()
}

/// Sends `GET /hang` in the background and gives it time to take its stream.
async fn hold_a_stream(
    pool: &Arc<ServiceConnections>,
    addr: std::net::SocketAddr,
) -> tokio::task::JoinHandle<Result<http::StatusCode, PoolError>> {
    let hanging = tokio::spawn({
        let pool = pool.clone();
        async move { pool.send(get(addr, "/hang")).await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    hanging
}

#[tokio::test]
async fn a_full_connection_gets_another_beside_it() {
    let release = Arc::new(Notify::new());
    let (addr, accepted, roots) = one_stream_server(release.clone()).await;
    let pool = Arc::new(pool(roots, 4));
    let hanging = hold_a_stream(&pool, addr).await;
    let resp = tokio::time::timeout(Duration::from_secs(2), pool.send(get(addr, "/")))
        .await
        .expect("answered beside the hanging request")
        .unwrap();
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    release.notify_waiters();
    assert_eq!(hanging.await.unwrap().unwrap(), http::StatusCode::OK);
}

#[tokio::test]
async fn no_free_stream_within_the_wait_is_an_error_not_a_hang() {
    let release = Arc::new(Notify::new());
    let (addr, accepted, roots) = one_stream_server(release.clone()).await;
    let pool = Arc::new(pool(roots, 1));
    let hanging = hold_a_stream(&pool, addr).await;
    let started = Instant::now();
    let Err(err) = pool.send(get(addr, "/")).await else {
        panic!("a request beside a full connection that may not grow was answered");
    };
    assert!(
        matches!(
            err,
            PoolError::Exhausted {
                connections: 1,
                streams: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // Once the stream is free again, it is used.
    release.notify_waiters();
    assert_eq!(hanging.await.unwrap().unwrap(), http::StatusCode::OK);
    let resp = pool.send(get(addr, "/")).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
}

#[tokio::test]
async fn a_refused_stream_retires_its_connection() {
    let (addr, accepted, answered, roots) = refusing_server().await;
    let pool = Arc::new(pool(roots, 4));
    // A long request keeps the first connection open beside the refusal.
    let _hanging = hold_a_stream(&pool, addr).await;
    let sent = tokio::time::timeout(Duration::from_secs(5), pool.send(get(addr, "/")))
        .await
        .expect("answered");
    let Err(err) = sent else {
        panic!("the backend refused the stream, yet it was answered");
    };
    assert_eq!(
        err.failure(),
        crate::backend::retry::Failure::Refused,
        "{err}"
    );
    // The refusing connection takes no more streams: the next request opens another.
    let resp = pool.send(get(addr, "/")).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection");
}

/// A pool whose failures call a listener: the number of reports of failures (not of plain
/// closes) so far.
fn counting_reports(pool: &ServiceConnections) -> Arc<AtomicUsize> {
    let queue: crate::workqueue::WorkQueue<String, ()> =
        crate::workqueue::WorkQueue::new(|_| crate::workqueue::Backoff {
            min: Duration::from_millis(5),
            max: Duration::from_secs(1),
        });
    pool.failures().report_to(queue.queue().clone());
    pool.failures()
        .add_api_service(&Arc::from("v1alpha1.wardle.example.com"));
    let reports = Arc::new(AtomicUsize::new(0));
    let counted = reports.clone();
    pool.failures().listen(
        "test",
        Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }),
    );
    reports
}

#[tokio::test]
async fn a_backend_that_goaways_the_kept_connection_gets_quiet_redials() {
    // Every connection gets a GOAWAY as soon as it is up, as from a server closing idle ones.
    let (addr, accepted, roots) = tls_server(|_, tls| async move {
        let Ok(mut conn) = h2::server::handshake(tls).await else {
            return;
        };
        conn.graceful_shutdown();
        while let Some(Ok(_)) = conn.accept().await {}
    })
    .await;
    let pool = pool(roots, 4);
    let reports = counting_reports(&pool);
    let endpoint: Authority = addr.to_string().parse().unwrap();
    pool.keep(std::slice::from_ref(&endpoint));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dials = accepted.load(Ordering::SeqCst);
    // 100 ms doubling: about six dials in 3 s, not one per round trip.
    assert!((3..=8).contains(&dials), "{dials} dials in 3 s");
    assert_eq!(reports.load(Ordering::SeqCst), 0, "a GOAWAY is no failure");
    assert!(!pool.unresponsive(&endpoint));
}

#[tokio::test]
async fn a_kept_connection_closed_without_goaway_is_reported_once_however_many_dials_fail() {
    // Every connection is closed right after TLS, without a word of HTTP/2.
    let (addr, accepted, roots) = tls_server(|_, tls| async move { drop(tls) }).await;
    let pool = pool(roots, 4);
    let reports = counting_reports(&pool);
    let endpoint: Authority = addr.to_string().parse().unwrap();
    pool.keep(std::slice::from_ref(&endpoint));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dials = accepted.load(Ordering::SeqCst);
    assert!(dials >= 3, "{dials} dials in 3 s");
    assert_eq!(
        reports.load(Ordering::SeqCst),
        1,
        "one report per change of state"
    );
    assert!(pool.unresponsive(&endpoint));
}
