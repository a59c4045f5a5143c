//! Limits, as an operator and users see them: in-flight and body limits answer 429/413, hung
//! requests time out while watches do not, and clients that are slow to send their headers or
//! stall before their first request are cut off without holding up anyone else.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{self, Gateway};
use e2e::scenario::{core_and_gateway, create_configmap, expect_event, watch_configmaps};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Kube's older in-flight filter (`--enable-priority-and-fairness=false`): read-only and mutating
/// requests counted apart, first come first served (priority and fairness has its own suite,
/// `priority_and_fairness.rs`).
#[tokio::test]
async fn in_flight_limit_answers_429_while_watches_keep_streaming() {
    let (core, gateway) = core_and_gateway(&[
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=2",
    ])
    .await;
    let ca = gateway.ca_pem().unwrap();
    let client = harness::http1_client(&ca, None).unwrap();
    let mut watch = watch_configmaps(&client, &gateway).await;
    let mut watch2 = watch_configmaps(&client, &gateway).await;

    let slow = format!("{}/fixture/sleep?ms=5000", gateway.url());
    let slow_requests: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            let url = slow.clone();
            tokio::spawn(async move { harness::get(&client, &url).await.unwrap().0 })
        })
        .collect();
    // Both slots taken (the two watches hold none). Probing before both slow requests are in
    // would race them for the slots, so give them a head start.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut refused = false;
    while !refused && Instant::now() < deadline {
        let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
            .await
            .unwrap();
        seen.push(status);
        refused = status == StatusCode::TOO_MANY_REQUESTS;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        refused,
        "a third read-only request was not refused: {seen:?}\n{}",
        gateway.process.logs()
    );
    let (status, headers, body) =
        harness::get(&client, &format!("{}/api/v1/namespaces", gateway.url()))
            .await
            .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "TooManyRequests");

    // kube counts only get, list and watch as read-only: a HEAD or OPTIONS outside the resource
    // paths (verbs `head`, `options`) takes a mutating slot, so it is served now.
    for method in [http::Method::HEAD, http::Method::OPTIONS] {
        let request = Request::builder()
            .method(method.clone())
            .uri(format!("{}/version", gateway.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let status = client.request(request).await.unwrap().status();
        assert_ne!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{method} /version was counted as read-only"
        );
    }

    // Mutating requests are counted apart, and the watches keep flowing.
    assert_eq!(
        create_configmap(&client, &gateway, "during-load").await,
        StatusCode::CREATED
    );
    expect_event(&mut watch, "during-load").await;
    expect_event(&mut watch2, "during-load").await;

    for r in slow_requests {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    // Slots are free again.
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    drop(core);
}

/// A hung request gets kube's 504 Status after `--request-timeout`, sooner when the client's
/// `?timeout=` asks for less.
#[tokio::test]
async fn a_hung_request_times_out_and_the_clients_timeout_shortens_the_limit() {
    let (_core, gateway) = core_and_gateway(&["--request-timeout=2s"]).await;
    let client = gateway.http1_client(None);
    let started = Instant::now();
    let (status, _, body) =
        harness::get(&client, &format!("{}/fixture/sleep?ms=5000", gateway.url()))
            .await
            .unwrap();
    let took = started.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "Timeout", "{body}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );

    let started = Instant::now();
    let (status, _, _) = harness::get(
        &client,
        &format!("{}/fixture/sleep?ms=5000&timeout=500ms", gateway.url()),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "{:?}",
        started.elapsed()
    );
}

/// A watch is long-running: it keeps streaming well past `--request-timeout`, across a request
/// that timed out meanwhile.
#[tokio::test]
async fn a_watch_keeps_streaming_past_the_request_timeout() {
    let (_core, gateway) = core_and_gateway(&["--request-timeout=2s"]).await;
    let client = gateway.http1_client(None);
    let mut watch = watch_configmaps(&client, &gateway).await;
    let (status, _, _) = harness::get(&client, &format!("{}/fixture/sleep?ms=5000", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        create_configmap(&client, &gateway, "after-timeouts").await,
        StatusCode::CREATED
    );
    expect_event(&mut watch, "after-timeouts").await;
}

/// A body over the limit is refused before it reaches the core.
#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413() {
    let (_core, gateway) = core_and_gateway(&["--max-request-body-bytes=1024"]).await;
    let client = gateway.http1_client(None);
    let big = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
        "data": {"k": "x".repeat(4096)}});
    let (status, _, body) = harness::send(
        &client,
        Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            gateway.url()
        ))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(big.to_string())))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["reason"], "RequestEntityTooLarge");
}

/// A client that sends half a request line, and one that never starts the TLS handshake, are
/// cut off after `--header-read-timeout`; everyone else is served meanwhile.
#[tokio::test]
async fn slow_header_clients_are_cut_off_while_others_are_served() {
    let (_core, gateway) = core_and_gateway(&["--header-read-timeout=1s"]).await;
    let ca = gateway.ca_pem().unwrap();

    let mut slow = harness::tls_connect(gateway.addr, &ca).await.unwrap();
    slow.write_all(b"GET /version HT").await.unwrap();
    slow.flush().await.unwrap();
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();

    let client = harness::http1_client(&ca, None).unwrap();
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);

    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "the slow client was not cut off within 5s");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "unexpected answer to a slow client: {text:?}"
    );
    let mut byte = [0u8; 1];
    let silent_closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut byte)).await;
    assert!(
        matches!(silent_closed, Ok(Ok(0)) | Ok(Err(_))),
        "a client that never completes the TLS handshake must be disconnected"
    );
}

/// A header block over `--max-header-bytes` gets 431, and the gateway serves on.
#[tokio::test]
async fn a_header_block_over_the_limit_is_refused_with_431() {
    let (_core, gateway) =
        core_and_gateway(&["--header-read-timeout=1s", "--max-header-bytes=16384"]).await;
    let ca = gateway.ca_pem().unwrap();
    let mut big = harness::tls_connect(gateway.addr, &ca).await.unwrap();
    let request = format!(
        "GET /version HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(32 * 1024)
    );
    let _ = big.write_all(request.as_bytes()).await;
    let head = harness::read_head(&mut big, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    // The gateway serves on.
    let client = harness::http1_client(&ca, None).unwrap();
    let (status, _, _) = harness::get(&client, &format!("{}/version", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: what a client sends right after the preface.
const H2_EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// Reads whatever the gateway sends until it closes the connection; false if it is still open at
/// `deadline`. A close without TLS close_notify shows up as an error, which counts as closed.
async fn closed_by<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, deadline: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await;
        match read {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// How a client can stall after the TLS handshake, short of a request.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// h2 negotiated, then nothing.
    H2Silent,
    /// Half the HTTP/2 preface.
    H2HalfPreface,
    /// The preface and SETTINGS but no request: past the preface hyper's keep-alive pings would
    /// only notice after 40s, and never if the client answers them.
    H2PrefaceOnly,
    /// http/1.1 negotiated, then nothing.
    Http1Silent,
    /// No ALPN offered, then nothing.
    NoAlpnSilent,
}

impl Stall {
    const ALL: [Stall; 5] = [
        Stall::H2Silent,
        Stall::H2HalfPreface,
        Stall::H2PrefaceOnly,
        Stall::Http1Silent,
        Stall::NoAlpnSilent,
    ];

    /// Opens a connection to `gateway` and stalls it this way.
    async fn open(
        self,
        gateway: &Gateway,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let ca = gateway.ca_pem().unwrap();
        let alpn: &[&[u8]] = match self {
            Stall::H2Silent | Stall::H2HalfPreface | Stall::H2PrefaceOnly => &[b"h2"],
            Stall::Http1Silent => &[b"http/1.1"],
            Stall::NoAlpnSilent => &[],
        };
        let config = harness::tls_client_config(&ca, None, alpn).unwrap();
        let mut tls = harness::tls_connect_with(gateway.addr, config)
            .await
            .unwrap();
        match self {
            Stall::H2Silent => {
                assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            }
            Stall::H2HalfPreface => {
                tls.write_all(&H2_PREFACE[..12]).await.unwrap();
            }
            Stall::H2PrefaceOnly => {
                tls.write_all(H2_PREFACE).await.unwrap();
                tls.write_all(H2_EMPTY_SETTINGS).await.unwrap();
            }
            Stall::Http1Silent | Stall::NoAlpnSilent => {}
        }
        tls.flush().await.unwrap();
        tls
    }
}

/// Each stall, one row: all are cut off within 5 s but not before `--header-read-timeout`,
/// while everyone else is served on both protocols. A failure lists the rows still open.
#[tokio::test]
async fn clients_that_stall_before_their_first_request_are_cut_off_on_http2_and_http1() {
    let (_core, gateway) = core_and_gateway(&["--header-read-timeout=1s"]).await;
    let ca = gateway.ca_pem().unwrap();
    let started = Instant::now();
    let mut stalled = Vec::new();
    for stall in Stall::ALL {
        stalled.push((stall, stall.open(&gateway).await));
    }

    let h1 = harness::http1_client(&ca, None).unwrap();
    let h2 = harness::http2_client(&ca, None).unwrap();
    for client in [&h1, &h2] {
        let (status, _, _) = harness::get(client, &format!("{}/version", gateway.url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
    }

    let deadline = started + Duration::from_secs(5);
    let mut still_open = Vec::new();
    for (stall, mut stream) in stalled {
        if !closed_by(&mut stream, deadline).await {
            still_open.push(stall);
        }
    }
    assert!(
        still_open.is_empty(),
        "not cut off within 5s: {still_open:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "cut off early: {took:?}"
    );
}

/// An HTTP/2 connection that has made a request may then idle past the header read timeout.
#[tokio::test]
async fn an_http2_connection_that_made_a_request_may_idle_past_the_header_timeout() {
    let (_core, gateway) = core_and_gateway(&["--header-read-timeout=1s"]).await;
    let ca = gateway.ca_pem().unwrap();
    let h2_tls = harness::tls_client_config(&ca, None, &[b"h2"]).unwrap();
    let tls = harness::tls_connect_with(gateway.addr, h2_tls)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let version = || {
        Request::get(format!("{}/version", gateway.url()))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = sender.send_request(version()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.into_body().collect().await.unwrap();
    let idle_since = Instant::now();

    // Idling is the point here: the second request goes out well past the timeout.
    tokio::time::sleep_until((idle_since + Duration::from_millis(1500)).into()).await;
    let second = tokio::time::timeout(Duration::from_secs(5), sender.send_request(version()))
        .await
        .expect("no answer on the idle HTTP/2 connection")
        .expect("the HTTP/2 connection that had made a request was closed");
    assert_eq!(second.status(), StatusCode::OK);
}

/// `apiserver_current_inflight_requests` is kube's: the most requests executing at once in the
/// last second, under either filter. A burst that is over by the time of the scrape still shows
/// (an instantaneous count would read 1, the scrape itself), and a quiet second brings it down.
#[tokio::test]
async fn the_inflight_gauge_is_the_last_seconds_high_watermark() {
    let filters: [&[&str]; 2] = [
        &[
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=100",
        ],
        &[],
    ];
    for args in filters {
        let (core, gateway) = core_and_gateway(args).await;
        let ca = gateway.ca_pem().unwrap();
        let client = harness::http1_client(&ca, None).unwrap();
        let slow = format!("{}/fixture/sleep?ms=300", gateway.url());
        let burst: Vec<_> = (0..10)
            .map(|_| {
                let (client, url) = (client.clone(), slow.clone());
                tokio::spawn(async move { harness::get(&client, &url).await.unwrap().0 })
            })
            .collect();
        for r in burst {
            assert_eq!(r.await.unwrap(), StatusCode::OK);
        }

        let mut seen = Vec::new();
        for _ in 0..12 {
            seen.push(read_only_inflight(&gateway).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            seen.iter().any(|&n| n >= 5),
            "{args:?}: the burst of 10 does not show in the next second's scrapes: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let quiet = read_only_inflight(&gateway).await;
        assert!(
            quiet <= 1,
            "{args:?}: still {quiet} after a quiet second (the scrapes: {seen:?})"
        );
        drop(core);
    }
}

/// `apiserver_current_inflight_requests{request_kind="readOnly"}` on the gateway's `/metrics`.
async fn read_only_inflight(gateway: &Gateway) -> i64 {
    let metrics = e2e::scenario::metrics(gateway).await;
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("apiserver_current_inflight_requests{request_kind=\"readOnly\"} ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no read-only in-flight gauge in:\n{metrics}"))
}
