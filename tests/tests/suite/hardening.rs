//! Hardening, as an attacker and an unlucky operator see it: clients that stop reading, open
//! too many connections, or send odd sizes cannot take the gateway from anyone else, and get the
//! code kube-apiserver would give them. Raw HTTP/1.1 and HTTP/2 clients misbehave where kubectl
//! and curl cannot: an HTTP/2 client that announces a zero flow-control window, an HTTP/1.1
//! client that reads nothing.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{self, Gateway, HttpClient};
use e2e::scenario::{core_and_gateway, Quiet, Scenario, QUIET_GROUPS, QUIET_SERVICE_ACCOUNT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const PROBES: [&str; 4] = ["/livez", "/readyz", "/healthz", "/readyz/ping"];

async fn status_of(client: &HttpClient, gateway: &Gateway, path: &str) -> StatusCode {
    harness::get(client, &format!("{}{path}", gateway.url()))
        .await
        .map(|(status, _, _)| status)
        .unwrap_or(StatusCode::BAD_GATEWAY)
}

/// Waits until the gateway is ready, so probes answer 200 when they are not refused.
async fn ready(gateway: &Gateway) {
    let client = gateway.http1_client(None);
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        status_of(&client, gateway, "/readyz").await == StatusCode::OK
    })
    .await;
    assert!(ready, "never ready:\n{}", gateway.process.logs());
}

/// Every probe, answered 200, one row each.
async fn assert_probes_answer(client: &HttpClient, gateway: &Gateway, when: &str) {
    let mut failed = Vec::new();
    for probe in PROBES {
        let status = status_of(client, gateway, probe).await;
        if status != StatusCode::OK {
            failed.push((probe, status));
        }
    }
    assert!(failed.is_empty(), "{when}: probes refused: {failed:?}");
}

async fn h2_connection(
    gateway: &Gateway,
    builder: &h2::client::Builder,
) -> (
    h2::client::SendRequest<Bytes>,
    h2::client::Connection<TlsStream<TcpStream>, Bytes>,
) {
    let config = harness::tls_client_config(&gateway.ca_pem().unwrap(), None, &[b"h2"]).unwrap();
    let tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    builder.handshake(tls).await.unwrap()
}

fn h2_get(gateway: &Gateway, path: &str) -> Request<()> {
    Request::get(format!("{}{path}", gateway.url()))
        .body(())
        .unwrap()
}

// ---- 11.2: a client that stops reading cannot hold the gateway ---------------------------------

/// An HTTP/2 client that announces a zero window holds every read-only slot with responses it
/// never takes: the probes still answer meanwhile (they are exempt, as kube-apiserver's are),
/// and once the request timeout has passed the streams are reset and the slots come back. (With
/// kube's older in-flight filter, one pool for everyone; priority and fairness below.)
#[tokio::test]
async fn a_zero_window_http2_client_holds_slots_only_until_the_request_timeout() {
    let (_core, gateway) = core_and_gateway(&[
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=3",
        "--request-timeout=3s",
    ])
    .await;
    ready(&gateway).await;
    let mut zero_window = h2::client::Builder::new();
    zero_window.initial_window_size(0);
    let (mut sender, conn) = h2_connection(&gateway, &zero_window).await;
    tokio::spawn(conn);

    let started = Instant::now();
    let mut held = Vec::new();
    for _ in 0..3 {
        sender = sender.ready().await.unwrap();
        let (response, _) = sender
            .send_request(h2_get(&gateway, "/version"), true)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response.into_body());
    }

    let client = gateway.http1_client(None);
    assert_eq!(
        status_of(&client, &gateway, "/api/v1/namespaces").await,
        StatusCode::TOO_MANY_REQUESTS,
        "the three unread responses should hold every read-only slot"
    );
    assert_probes_answer(&client, &gateway, "with every slot held").await;

    let served_again = harness::wait_until(Duration::from_secs(10), || async {
        status_of(&client, &gateway, "/version").await == StatusCode::OK
    })
    .await;
    let took = started.elapsed();
    assert!(
        served_again,
        "the slots never came back:\n{}",
        gateway.process.logs()
    );
    assert!(took >= Duration::from_millis(2500), "freed early: {took:?}");
    for mut body in held {
        let end = tokio::time::timeout(Duration::from_secs(5), body.data()).await;
        assert!(
            matches!(end, Ok(Some(Err(_))) | Ok(None)),
            "an unread response stream was not reset: {end:?}"
        );
    }
}

/// HTTP/1.1 clients that request a large body and read nothing hold their slots until the
/// request timeout, then their connections are closed; probes answer throughout. (Kube's older
/// in-flight filter, as above.)
#[tokio::test]
async fn slow_http1_readers_hold_slots_only_until_the_request_timeout() {
    let (_core, gateway) = core_and_gateway(&[
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=2",
        "--request-timeout=3s",
    ])
    .await;
    ready(&gateway).await;
    let ca = gateway.ca_pem().unwrap();
    let started = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let mut tls = harness::tls_connect(gateway.addr, &ca).await.unwrap();
        tls.write_all(b"GET /fixture/bytes?n=1073741824 HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        tls.flush().await.unwrap();
        readers.push(tls);
    }

    let client = gateway.http1_client(None);
    let refused = harness::wait_until(Duration::from_secs(2), || async {
        status_of(&client, &gateway, "/api/v1/namespaces").await == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
    assert!(refused, "the two slow readers should hold both slots");
    assert_probes_answer(&client, &gateway, "with both slots held").await;

    let served_again = harness::wait_until(Duration::from_secs(10), || async {
        status_of(&client, &gateway, "/version").await == StatusCode::OK
    })
    .await;
    assert!(
        served_again,
        "the slots never came back:\n{}",
        gateway.process.logs()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "freed early: {:?}",
        started.elapsed()
    );
    // Their connections were closed: what the socket buffers hold drains, then the end.
    for mut reader in readers {
        let mut sink = vec![0u8; 1 << 16];
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match reader.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a slow reader's connection stayed open");
    }
}

/// With priority and fairness (the default), the same attacks from anonymous clients (one HTTP/2
/// connection holding as many zero-window streams as it is answered, and slow HTTP/1.1 readers,
/// each holding a seat until the request timeout) take the seats of anonymous callers' priority
/// level and no others: a ServiceAccount keeps being served, and so do the probes. (Users who
/// share `global-default` with anonymous callers, as kube's built-in FlowSchema puts them, share
/// those seats with the attacker, as in kube-apiserver.)
#[tokio::test]
async fn anonymous_attackers_keep_no_service_account_at_429() {
    // 60 seats, so that 100 slow readers and a connection's streams outnumber what anonymous
    // callers' level may hold with everything the others lend it.
    let s = Scenario::builder()
        .gateway_args(&[
            "--max-requests-inflight=40",
            "--max-mutating-requests-inflight=20",
        ])
        .start()
        .await;
    let endpoint = e2e::bench::load::Endpoint {
        addr: s.gateway.addr,
        ca_pem: Some(s.gateway.ca_pem().unwrap().into()),
        client_cert: None,
    };
    let started = Instant::now();
    let attack = e2e::bench::overload::attack(&endpoint, 100, "/fixture/bytes?n=1073741824")
        .await
        .unwrap();
    eprintln!(
        "the attack: {} zero-window streams answered, 100 slow readers, in {:?}",
        attack.held_by_zero_window,
        started.elapsed()
    );
    assert!(
        attack.held_by_zero_window > 0,
        "no zero-window stream was answered"
    );
    let ca = s.gateway.ca_pem().unwrap();
    let anonymous = harness::http1_client(&ca, None).unwrap();
    // Its own 4 s timeout: refused after waiting a quarter of that in its queue.
    let refused = status_of(&anonymous, &s.gateway, "/api/v1/namespaces?timeout=4s").await;
    assert_eq!(
        refused,
        StatusCode::TOO_MANY_REQUESTS,
        "the attack should hold every seat anonymous callers get"
    );
    assert_probes_answer(&anonymous, &s.gateway, "while attacked").await;

    let user = s.user(QUIET_SERVICE_ACCOUNT, &QUIET_GROUPS);
    let service_account = harness::http1_client(&ca, Some(&user)).unwrap();
    let url = format!("{}/api/v1/namespaces/default/configmaps", s.gateway.url());
    let quiet = Quiet::run(&service_account, &url, 40).await;
    assert!(
        quiet.ok_share() >= 0.95,
        "the ServiceAccount while attacked: {}\n{}",
        quiet.summary(),
        s.logs()
    );
    eprintln!("the ServiceAccount while attacked: {}", quiet.summary());
    drop(attack);
}

// ---- 11.3: connections are bounded --------------------------------------------------------------

/// Past `--max-client-connections` a new connection is closed before its TLS handshake; once
/// another closes, a well-behaved client is served again.
#[tokio::test]
async fn past_the_connection_cap_new_connections_are_refused_until_others_close() {
    let (_core, gateway) = core_and_gateway(&["--max-client-connections=3"]).await;
    let ca = gateway.ca_pem().unwrap();
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(harness::tls_connect(gateway.addr, &ca).await.unwrap());
    }
    let refused = harness::tls_connect(gateway.addr, &ca).await;
    assert!(
        refused.is_err(),
        "a fourth connection was accepted past --max-client-connections=3"
    );
    // The log line is read from the gateway's stderr by another task: wait for it.
    assert!(
        gateway
            .process
            .wait_for_line(
                |l| l.contains("open client connections at --max-client-connections"),
                Duration::from_secs(5),
            )
            .await
            .is_some(),
        "no log line says the cap was reached:\n{}",
        gateway.process.logs()
    );

    drop(open.pop());
    let client = gateway.http1_client(None);
    let served = harness::wait_until(Duration::from_secs(5), || async {
        status_of(&client, &gateway, "/version").await == StatusCode::OK
    })
    .await;
    assert!(
        served,
        "not served after a connection closed:\n{}",
        gateway.process.logs()
    );
}

/// The stream limit a client reads in the gateway's SETTINGS: kube-apiserver's default of 100
/// (`--http2-max-streams-per-connection=0`), or the flag's value. One row per setting.
#[tokio::test]
async fn the_http2_stream_limit_is_announced_in_settings() {
    for (args, want) in [
        (&[][..], 100),
        (&["--http2-max-streams-per-connection=7"][..], 7),
    ] {
        let (_core, gateway) = core_and_gateway(args).await;
        let (sender, conn) = h2_connection(&gateway, &h2::client::Builder::new()).await;
        let mut conn = std::pin::pin!(conn);
        let mut sender = sender.ready().await.unwrap();
        let (response, _) = sender
            .send_request(h2_get(&gateway, "/livez"), true)
            .unwrap();
        let response = tokio::select! {
            r = response => r.unwrap(),
            _ = conn.as_mut() => panic!("connection ended"),
        };
        assert_eq!(response.status(), StatusCode::OK, "{args:?}");
        assert_eq!(conn.max_concurrent_send_streams(), want, "{args:?}");
    }
}

/// The soft open-file limit the gateway runs with is its hard limit, whatever it started with.
#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer. Lowering
    // the soft limit of this test process (the gateway inherits it) is harmless to other tests.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let lowered = libc::rlimit {
            rlim_cur: (lim.rlim_max / 2).min(lim.rlim_cur),
            rlim_max: lim.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
    }
    let (_core, gateway) = core_and_gateway(&[]).await;
    ready(&gateway).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", gateway.process.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "soft and hard differ: {line}");
    assert_eq!(fields[4], lim.rlim_max.to_string(), "{line}");
}

// ---- 11.5: bad sizes get the right code ----------------------------------------------------------

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

fn big_configmap(name: &str, bytes: usize) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"k": "x".repeat(bytes)}})
        .to_string(),
    )
}

/// A chunked HTTP/1.1 body over the limit gets 413 (RequestEntityTooLarge), not 503.
#[tokio::test]
async fn an_oversized_chunked_http1_body_gets_413() {
    let (_core, gateway) = core_and_gateway(&["--max-request-body-bytes=1024"]).await;
    let mut tls = harness::tls_connect(gateway.addr, &gateway.ca_pem().unwrap())
        .await
        .unwrap();
    let body = big_configmap("chunked", 8192);
    let mut request = format!(
        "POST {CONFIGMAPS} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(1000) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    tls.write_all(&request).await.unwrap();
    let head = harness::read_head(&mut tls, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
}

/// An HTTP/2 body without a length over the limit gets 413 as well.
#[tokio::test]
async fn an_oversized_http2_body_without_a_length_gets_413() {
    let (_core, gateway) = core_and_gateway(&["--max-request-body-bytes=1024"]).await;
    let (sender, conn) = h2_connection(&gateway, &h2::client::Builder::new()).await;
    tokio::spawn(conn);
    let mut sender = sender.ready().await.unwrap();
    let request = Request::post(format!("{}{CONFIGMAPS}", gateway.url()))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut stream) = sender.send_request(request, false).unwrap();
    let body = big_configmap("streamed", 8192);
    for (i, chunk) in body.chunks(1000).enumerate() {
        let last = (i + 1) * 1000 >= body.len();
        // The gateway may answer and reset the stream before it has read everything.
        if stream
            .send_data(Bytes::copy_from_slice(chunk), last)
            .is_err()
        {
            break;
        }
    }
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// Header limits follow kube-apiserver: the head's total bytes, not a count of lines. 150 short
/// header lines (hyper's default allowed 100) are served; a head over `--max-header-bytes` gets
/// 431 on HTTP/2 as on HTTP/1.1.
#[tokio::test]
async fn header_limits_count_bytes_not_lines() {
    let (_core, gateway) = core_and_gateway(&["--max-header-bytes=16384"]).await;
    ready(&gateway).await;
    let mut tls = harness::tls_connect(gateway.addr, &gateway.ca_pem().unwrap())
        .await
        .unwrap();
    // Answered by the gateway itself: the fixture core, a hyper server, keeps hyper's 100 lines.
    let mut request = String::from("GET /livez HTTP/1.1\r\nHost: gw\r\n");
    for i in 0..150 {
        request.push_str(&format!("X-Trace-{i}: v\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let head = harness::read_head(&mut tls, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "150 header lines: {head}");

    let (sender, conn) = h2_connection(&gateway, &h2::client::Builder::new()).await;
    tokio::spawn(conn);
    let mut sender = sender.ready().await.unwrap();
    let mut request = h2_get(&gateway, "/version");
    request
        .headers_mut()
        .insert("x-big", "a".repeat(32 * 1024).parse().unwrap());
    let (response, _) = sender.send_request(request, true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
}

// ---- 11.14: idle HTTP/1.1 connections live on kube's timing ---------------------------------------

/// An HTTP/1.1 connection that made a request may idle well past the header read timeout and
/// be used again (kube-apiserver keeps idle connections 90 s); a request head started after the
/// idle period must still be complete within the header read timeout.
#[tokio::test]
async fn an_idle_http1_connection_outlives_the_header_read_timeout() {
    let (_core, gateway) = core_and_gateway(&["--header-read-timeout=1s"]).await;
    let config =
        harness::tls_client_config(&gateway.ca_pem().unwrap(), None, &[b"http/1.1"]).unwrap();
    let tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn.without_shutdown());
    let version = || {
        Request::get(format!("{}/version", gateway.url()))
            .header("host", "gw")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = sender.send_request(version()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.into_body().collect().await.unwrap();

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = tokio::time::timeout(Duration::from_secs(5), sender.send_request(version()))
        .await
        .expect("no answer on the idle connection")
        .expect("the idle HTTP/1.1 connection was closed before 90 s");
    assert_eq!(second.status(), StatusCode::OK);
    second.into_body().collect().await.unwrap();

    // Half a head after idling: cut off after the header read timeout.
    drop(sender);
    let mut io = conn.await.unwrap().unwrap().io.into_inner();
    io.write_all(b"GET /version HT").await.unwrap();
    io.flush().await.unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "a half-sent head was not cut off");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

// ---- 12.12: bodies to remote APIServices are the backend's business -------------------------------

const WARDLE: &str = "wardle.example.com";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

fn big_flunder(name: &str, bytes: usize) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "wardle.example.com/v1alpha1", "kind": "Flunder",
            "metadata": {"name": name, "annotations": {"padding": "x".repeat(bytes)}}})
        .to_string(),
    )
}

async fn post(client: &HttpClient, url: String, body: Bytes) -> (StatusCode, Value) {
    let (status, _, body) = harness::send(
        client,
        Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap(),
    )
    .await
    .unwrap();
    (
        status,
        serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body))),
    )
}

/// With `--max-request-body-bytes=4096`, a 16 KiB flunder reaches the remote APIService while
/// a 16 KiB ConfigMap to the core gets 413; `--apiservice-max-request-body-bytes` caps the
/// remote too. One row per setting.
#[tokio::test]
async fn bodies_to_remote_apiservices_are_capped_only_when_asked() {
    for (extra, remote_want) in [
        (None, StatusCode::CREATED),
        (
            Some("--apiservice-max-request-body-bytes=4096"),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ] {
        let mut args = vec!["--max-request-body-bytes=4096"];
        args.extend(extra);
        let s = Scenario::wardle()
            .apiservice(WARDLE, "v1alpha1", "wardle")
            .gateway_args(&args)
            .start()
            .await;
        let alice = s.user("alice", &[]);
        assert!(
            e2e::scenario::serves(
                &s.gateway,
                &alice,
                FLUNDERS,
                "FlunderList",
                Duration::from_secs(5)
            )
            .await,
            "{}",
            s.logs()
        );
        let client = s.gateway.http1_client(Some(&alice));
        let (status, body) = post(
            &client,
            format!("{}{FLUNDERS}", s.gateway.url()),
            big_flunder("big", 16 * 1024),
        )
        .await;
        assert_eq!(status, remote_want, "{extra:?}: {body}");
        let (status, body) = post(
            &client,
            format!("{}{CONFIGMAPS}", s.gateway.url()),
            big_configmap("big", 16 * 1024),
        )
        .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{extra:?}: {body}");
        assert_eq!(body["reason"], "RequestEntityTooLarge", "{body}");
    }
}
