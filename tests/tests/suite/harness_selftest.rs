//! Self-test of the e2e harness: certificates work for a real TLS handshake, kubectl resolves and
//! runs, and process output capture works. Needs no gateway or fixture binaries.

use std::process::Command;
use std::time::Duration;

use e2e::certs::{install_crypto, TestCa};
use e2e::harness::{
    get, http1_client, http2_client, read_head, tls_connect, wait_until, Kubectl, KubectlVersion,
    Process, RefusingPort, Stream,
};

/// A tiny TLS server answering every request with "ok" over h1 or h2, to exercise the clients.
async fn tls_server(pair: &e2e::certs::CertifiedPair) -> std::net::SocketAddr {
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    install_crypto();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(pair.cert_chain().unwrap(), pair.private_key().unwrap())
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let body = format!("ok {:?}", req.version());
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from(body)),
                    ))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn http_clients_speak_the_forced_version() {
    let ca = TestCa::new("selftest-ca");
    let addr = tls_server(&ca.issue_server(&["localhost", "127.0.0.1"])).await;
    let url = format!("https://{addr}/apis");

    let (status, _, body) = get(&http1_client(ca.cert_pem(), None).unwrap(), &url)
        .await
        .unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok HTTP/1.1"[..]));
    let (status, _, body) = get(&http2_client(ca.cert_pem(), None).unwrap(), &url)
        .await
        .unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok HTTP/2.0"[..]));

    // A client trusting another CA must fail the handshake.
    let other = TestCa::new("other");
    assert!(get(&http1_client(other.cert_pem(), None).unwrap(), &url)
        .await
        .is_err());

    // Raw TLS: write a request by hand, read the head back.
    use tokio::io::AsyncWriteExt;
    let mut tls = tls_connect(addr, ca.cert_pem()).await.unwrap();
    tls.write_all(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut tls, Duration::from_secs(5)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn kubectl_runner_resolves_the_versioned_binary() {
    let kubectl = Kubectl::new("http://127.0.0.1:1", None, KubectlVersion::default()).unwrap();
    assert!(
        kubectl.binary().ends_with("kubectl.1.32"),
        "{}",
        kubectl.binary().display()
    );
    let out = kubectl.run_ok(&["version", "--client"]).await;
    println!("{}", out.stdout);
    assert!(out.stdout.contains("Client Version: v1.32"), "{out}");

    let old = Kubectl::new("http://127.0.0.1:1", None, KubectlVersion::V1_29).unwrap();
    let out = old.run_ok(&["version", "--client"]).await;
    assert!(out.stdout.contains("Client Version: v1.29"), "{out}");

    // The kubeconfig is the one we wrote (not ~/.kube/config): `config view` shows our server.
    let out = kubectl
        .run_ok(&[
            "config",
            "view",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .await;
    assert_eq!(out.stdout, "http://127.0.0.1:1");

    // A server that refuses connections is a normal failure with a message, not a hang.
    let out = kubectl
        .with_timeout(Duration::from_secs(30))
        .run(&["get", "--raw", "/apis"])
        .await;
    assert!(!out.success() && out.status.is_some(), "{out}");
    assert!(out.stderr.contains("refused"), "{out}");
}

#[tokio::test]
async fn process_captures_both_streams_and_waits_for_lines() {
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "echo listening on 127.0.0.1:1234; echo x >&2; exec sleep 30",
    ]);
    let process = Process::spawn("sh", cmd).unwrap();
    let line = process
        .wait_for_line(|l| l.starts_with("listening on"), Duration::from_secs(5))
        .await
        .expect("listening line");
    let (_, addr) = e2e::harness::parse_listening_line(&line).unwrap();
    assert_eq!(addr.port(), 1234);
    let err = process
        .wait_for_line_from(
            0,
            Some(Stream::Stderr),
            |l| l == "x",
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(err.map(|(_, l)| l).as_deref(), Some("x"));
    assert!(process.logs().contains("listening on 127.0.0.1:1234"));
    assert_eq!(process.stderr(), "x\n");

    // A line that never comes: the wait ends at the timeout, not before.
    let start = std::time::Instant::now();
    assert!(process
        .wait_for_line(|l| l == "never", Duration::from_millis(300))
        .await
        .is_none());
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn waiting_on_an_exited_process_returns_early() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo bye; exit 3"]);
    let mut process = Process::spawn("short", cmd).unwrap();
    let start = std::time::Instant::now();
    assert!(process
        .wait_for_line(|l| l == "never", Duration::from_secs(20))
        .await
        .is_none());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "should stop when output closes"
    );
    let status = process
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("exited");
    assert_eq!(status.code(), Some(3));
    assert!(wait_until(Duration::from_secs(1), || async { true }).await);
}

#[tokio::test]
async fn process_is_killed_on_drop() {
    let mut cmd = Command::new("sleep");
    cmd.arg("300");
    let process = Process::spawn("sleeper", cmd).unwrap();
    let start = std::time::Instant::now();
    let pid = process.id();
    drop(process);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "drop must not wait for a full run"
    );
    // The pid is reaped on drop, so /proc no longer has it (or it belongs to a new process).
    let alive = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .map(|c| c.contains("sleep"))
        .unwrap_or(false);
    assert!(!alive, "sleep {pid} survived the drop");
}

#[tokio::test]
async fn a_refusing_port_refuses_connections_and_cannot_be_taken_while_held() {
    let port = RefusingPort::bind().unwrap();
    let addr = port.url().trim_start_matches("http://").to_string();
    let refused = tokio::net::TcpStream::connect(&addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // A listener (std's sets SO_REUSEADDR, as servers do) cannot take the port while it is held,
    // so no server started meanwhile answers in its place; once it is dropped, one can.
    let taken = std::net::TcpListener::bind(&addr).unwrap_err();
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
    drop(port);
    std::net::TcpListener::bind(&addr).unwrap();
}
