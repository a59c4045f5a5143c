//! What crosses the proxy to and from remote backends, and the connections it holds to them:
//! a backend's 304 reaches the client while a redirect with a `Location` becomes kube's 502
//! (unless `--aggregator-reject-forwarding-redirect=false`); `Access-Control-Allow-*` from a
//! backend never reaches the client; a client's request trailers reach neither a backend nor the
//! core (raw HTTP/1.1 chunked trailers and HTTP/2 trailers); a backend's stream limit never
//! stalls its group; and APIServices on one Service share its connections.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness::{self, Gateway};
use e2e::scenario::{self, get_raw, json_or_null, path_arg, Scenario, WARDLE_GROUP};
use e2e::table::assert_rows_passed;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "v1alpha1.wardle.example.com";
/// The fixture's test endpoints inside the wardle group-version: reached through the route.
const REMOTE_FIXTURE: &str = "/apis/wardle.example.com/v1alpha1/fixture";

/// The wardle backend registered from a manifest at start, its flunders served; `extra`
/// gateway flags.
async fn wardle(gateway_args: &[&str]) -> (Scenario, CertifiedPair) {
    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .gateway_args(gateway_args)
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    assert_served(&s, &alice).await;
    (s, alice)
}

/// The wardle backend started with `backend_args`, registered from a manifest at start, its
/// flunders served.
async fn wardle_backend(backend_args: &[&str]) -> (Scenario, CertifiedPair) {
    let s = Scenario::builder()
        .backend("wardle", WARDLE_GROUP, "v1alpha1", backend_args)
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    assert_served(&s, &alice).await;
    (s, alice)
}

async fn assert_served(s: &Scenario, user: &CertifiedPair) {
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    assert!(
        scenario::serves(
            &s.gateway,
            user,
            flunders,
            "FlunderList",
            Duration::from_secs(10)
        )
        .await,
        "flunders not served:\n{}",
        s.logs()
    );
}

/// `GET /fixture/respond` on the backend through the gateway: it answers `code` with `headers`.
fn respond(code: u16, headers: &[(&str, &str)]) -> String {
    let mut path = format!("{REMOTE_FIXTURE}/respond?code={code}");
    for (name, value) in headers {
        let value: String = url_escape(value);
        path.push_str(&format!("&header={name}:{value}"));
    }
    path
}

fn url_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---- 12.5: conditional requests pass, forwarding redirects do not ----

/// One row per backend answer: what the client gets with the default
/// `--aggregator-reject-forwarding-redirect=true`.
#[tokio::test]
async fn a_backends_304_passes_and_only_a_redirect_with_a_location_becomes_502() {
    let (s, alice) = wardle(&[]).await;
    let rows: Vec<(&str, String, StatusCode)> = vec![
        (
            "304 Not Modified for a conditional GET",
            respond(304, &[("ETag", "\"abc\"")]),
            StatusCode::NOT_MODIFIED,
        ),
        (
            "302 with a Location",
            respond(302, &[("Location", "https://elsewhere.example/steal")]),
            StatusCode::BAD_GATEWAY,
        ),
        (
            "301 with a Location",
            respond(301, &[("Location", "/apis/other")]),
            StatusCode::BAD_GATEWAY,
        ),
        (
            "300 without a Location",
            respond(300, &[]),
            StatusCode::MULTIPLE_CHOICES,
        ),
    ];
    let mut failures = Vec::new();
    for (row, path, want) in &rows {
        let (status, headers, body) = get_raw(&s.gateway, &alice, path, &[]).await;
        let body = json_or_null(&body);
        let ok = status == *want
            && match *want {
                StatusCode::NOT_MODIFIED => headers.get("etag").is_some_and(|v| v == "\"abc\""),
                StatusCode::BAD_GATEWAY => {
                    body["kind"] == "Status"
                        && body["code"] == 502
                        && body["message"].as_str().is_some_and(|m| m.contains(NAME))
                        && headers.get("location").is_none()
                }
                _ => true,
            };
        if !ok {
            failures.push(format!(
                "{row}: got {status} {headers:?} {body}, want {want}"
            ));
        }
    }
    assert_rows_passed("backend answers", rows.len(), &failures);
}

/// `--aggregator-reject-forwarding-redirect=false`: the backend's redirect reaches the client as
/// the backend sent it, as with kube-apiserver's flag.
#[tokio::test]
async fn redirects_pass_when_rejecting_them_is_switched_off() {
    let (s, alice) = wardle(&["--aggregator-reject-forwarding-redirect=false"]).await;
    let path = respond(302, &[("Location", "https://elsewhere.example/next")]);
    let (status, headers, _) = get_raw(&s.gateway, &alice, &path, &[]).await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(headers["location"], "https://elsewhere.example/next");
}

// ---- 12.6: backends cannot widen the gateway's origin ----

#[tokio::test]
async fn access_control_allow_headers_from_a_backend_are_removed() {
    let (s, alice) = wardle(&[]).await;
    let path = respond(
        200,
        &[
            ("Access-Control-Allow-Origin", "*"),
            ("Access-Control-Allow-Credentials", "true"),
            ("Access-Control-Allow-Methods", "DELETE"),
            ("Access-Control-Allow-Headers", "Authorization"),
            ("Access-Control-Allow-Private-Network", "true"),
            ("X-Backend-Header", "kept"),
        ],
    );
    let (status, headers, _) = get_raw(&s.gateway, &alice, &path, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let grants: Vec<&str> = headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("access-control-allow-"))
        .collect();
    assert!(grants.is_empty(), "grants reached the client: {grants:?}");
    assert_eq!(headers["x-backend-header"], "kept", "other headers pass");
}

// ---- 11.6: request trailers from clients never reach a backend or the core ----

/// Trailers a hostile client sends after its body.
const TRAILERS: [(&str, &str); 4] = [
    ("x-remote-user", "system:admin"),
    ("impersonate-user", "system:admin"),
    ("authorization", "Bearer stolen"),
    ("x-innocent", "1"),
];

/// A core serving HTTPS (so the gateway reaches it over HTTP/2, the way trailers could cross)
/// and the wardle backend.
async fn trailers_scenario() -> (Scenario, CertifiedPair) {
    let pki = e2e::scenario::Pki::new();
    let core_ca = TestCa::new("core-ca");
    let core_ca_file = core_ca.write(pki.dir(), "core-ca").unwrap();
    let (cert, key) = core_ca
        .issue_server(&["localhost", "127.0.0.1"])
        .write(pki.dir(), "core-serving")
        .unwrap();
    let (cert, key, core_ca_file) = (path_arg(&cert), path_arg(&key), path_arg(&core_ca_file));
    let s = Scenario::with_pki(pki)
        .backend("wardle", WARDLE_GROUP, "v1alpha1", &[])
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .core_args(&["--tls-cert-file", &cert, "--tls-private-key-file", &key])
        .gateway_args(&["--core-ca-file", &core_ca_file])
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    assert_served(&s, &alice).await;
    (s, alice)
}

/// POSTs `body` chunked over a raw HTTP/1.1 TLS connection, with [`TRAILERS`] after the last
/// chunk, and returns the echo.
async fn post_h1_with_trailers(gateway: &Gateway, user: &CertifiedPair, path: &str) -> Value {
    let config =
        harness::tls_client_config(&gateway.ca_pem().unwrap(), Some(user), &[b"http/1.1"]).unwrap();
    let mut tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    let trailer_names: Vec<&str> = TRAILERS.iter().map(|(n, _)| *n).collect();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nTrailer: {}\r\nConnection: close\r\n\r\n\
         5\r\nhello\r\n0\r\n",
        gateway.addr,
        trailer_names.join(", ")
    );
    for (name, value) in TRAILERS {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response))
        .await
        .expect("the gateway answers")
        .ok();
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200"), "{text}");
    // The echo is small; the body is either plain or one chunk.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// POSTs `hello` over HTTP/2 with [`TRAILERS`] in a trailing HEADERS frame, and returns the echo.
async fn post_h2_with_trailers(gateway: &Gateway, user: &CertifiedPair, path: &str) -> Value {
    let config =
        harness::tls_client_config(&gateway.ca_pem().unwrap(), Some(user), &[b"h2"]).unwrap();
    let tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut trailers = HeaderMap::new();
    for (name, value) in TRAILERS {
        trailers.insert(name, value.parse().unwrap());
    }
    let frames = futures::stream::iter([
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"hello"))),
        Ok(Frame::trailers(trailers)),
    ]);
    let req = Request::post(format!("{}{path}", gateway.url()))
        .header("content-type", "application/json")
        .body(StreamBody::new(frames))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("the gateway answers")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// One row per path (core, remote) and client (HTTP/1.1 chunked, HTTP/2): the body arrives,
/// none of the trailers does.
#[tokio::test]
async fn request_trailers_reach_neither_a_backend_nor_the_core() {
    let (s, alice) = trailers_scenario().await;
    let rows = [
        ("core, HTTP/1.1 chunked trailers", "/fixture/echo", false),
        ("core, HTTP/2 trailers", "/fixture/echo", true),
        (
            "remote, HTTP/1.1 chunked trailers",
            "/apis/wardle.example.com/v1alpha1/fixture/echo",
            false,
        ),
        (
            "remote, HTTP/2 trailers",
            "/apis/wardle.example.com/v1alpha1/fixture/echo",
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (row, path, http2) in rows {
        let echo = if http2 {
            post_h2_with_trailers(&s.gateway, &alice, path).await
        } else {
            post_h1_with_trailers(&s.gateway, &alice, path).await
        };
        let trailers = echo["trailers"].as_array().cloned().unwrap_or_default();
        let body_arrived = echo["body_base64"] == "aGVsbG8=";
        if !(trailers.is_empty() && body_arrived && echo["trailers"].is_array()) {
            failures.push(format!(
                "{row}: the server received trailers {trailers:?} (body {})",
                echo["body_base64"]
            ));
        }
    }
    assert_rows_passed("request trailers", rows.len(), &failures);
}

// ---- 11.10: a backend's stream limit never stalls its group ----

/// With 500 watches open on a backend that allows 50 streams per HTTP/2 connection, a short
/// request is still answered at once, and the APIService stays available.
#[tokio::test]
async fn a_backends_stream_limit_never_stalls_its_group() {
    // One user opening 500 watches at once is more than priority and fairness lets one flow
    // queue (as in kube-apiserver, some would get 429); this is about the backend's stream
    // limit, so the gateway admits them all with kube's older in-flight filter.
    let s = Scenario::builder()
        .backend(
            "wardle",
            WARDLE_GROUP,
            "v1alpha1",
            &["--http2-max-streams-per-connection", "50"],
        )
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .gateway_args(&["--enable-priority-and-fairness=false"])
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    assert_served(&s, &alice).await;
    let ca = s.gateway.ca_pem().unwrap();
    let watch = format!(
        "{}/apis/wardle.example.com/v1alpha1/namespaces/default/flunders?watch=1",
        s.gateway.url()
    );
    // 5 client connections of 100 streams each, all watching.
    let clients: Vec<_> = (0..5)
        .map(|_| harness::http2_client(&ca, Some(&alice)).unwrap())
        .collect();
    let opened = futures::future::join_all((0..500).map(|i| {
        let client = clients[i % clients.len()].clone();
        let req = Request::get(&watch).body(Full::new(Bytes::new())).unwrap();
        async move { harness::send_streaming(&client, req).await }
    }))
    .await;
    let mut watches = Vec::new();
    for (i, resp) in opened.into_iter().enumerate() {
        let resp = resp.unwrap_or_else(|e| panic!("watch {i}: {e}\n{}", s.logs()));
        assert_eq!(resp.status(), StatusCode::OK, "watch {i}");
        watches.push(resp);
    }
    let list = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let started = std::time::Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(3),
        scenario::get_as(&s.gateway, &alice, list, &[]),
    )
    .await;
    let Ok((status, body)) = answered else {
        panic!("a short request waited behind 500 watches for more than 3 s");
    };
    assert_eq!(status, StatusCode::OK, "{body}");
    eprintln!(
        "short request beside 500 watches: {:?}; backend connections accepted: {}",
        started.elapsed(),
        accepted_connections(&s).await
    );
    // Three availability checks later (interval 1 s), the APIService is still available: its
    // routes answer instead of the 503 an unavailable APIService gets.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = scenario::get_as(&s.gateway, &alice, list, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    drop(watches);
}

// ---- 11.14: connections to backends are pooled per backend Service ----

/// What the backend of Service `wardle/api` counted.
async fn accepted_connections(s: &Scenario) -> u64 {
    let url = format!("{}/fixture/connections", s.backend("wardle").url());
    let (status, _, body) = harness::get(&s.pki.backend_client("wardle"), &url)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    json_or_null(&body)["accepted"].as_u64().unwrap()
}

/// 50 APIServices on one Service, each used: the backend accepts a handful of connections,
/// not several per APIService.
#[tokio::test]
async fn apiservices_on_one_service_share_its_connections() {
    let versions: Vec<String> = (1..=50).map(|n| format!("v{n}")).collect();
    let mut builder = Scenario::builder().backend("wardle", WARDLE_GROUP, &versions.join(","), &[]);
    for version in &versions {
        builder = builder.apiservice(WARDLE_GROUP, version, "wardle");
    }
    let s = builder.start().await;
    let alice = s.user("alice", &["dev"]);
    let client = s.gateway.http2_client(Some(&alice));
    let mut failures = Vec::new();
    for version in &versions {
        let url = format!(
            "{}/apis/wardle.example.com/{version}/namespaces/default/flunders",
            s.gateway.url()
        );
        let served = harness::wait_until(Duration::from_secs(10), || async {
            harness::get(&client, &url)
                .await
                .is_ok_and(|(status, _, _)| status == StatusCode::OK)
        })
        .await;
        if !served {
            failures.push(format!("{version}: GET {url} never answered 200"));
        }
    }
    assert_rows_passed("APIServices served", versions.len(), &failures);
    // Every APIService once more, all at the same time.
    futures::future::join_all(versions.iter().map(|version| {
        let url = format!(
            "{}/apis/wardle.example.com/{version}/namespaces/default/flunders",
            s.gateway.url()
        );
        let client = client.clone();
        async move { harness::get(&client, &url).await.unwrap() }
    }))
    .await;
    // Requests, availability checks and discovery of all 50 share the Service's connections
    // (one, plus one more when a burst passes 32 streams, plus this question's own).
    let accepted = accepted_connections(&s).await;
    eprintln!("backend connections accepted for 50 APIServices: {accepted}");
    assert!(
        accepted <= 10,
        "{accepted} connections for 50 APIServices on one Service\n{}",
        s.logs()
    );
}

// ---- anonymous callers cost nobody else their backend connection ----

/// A k8s.io/apiserver backend closes an HTTP/2 connection once it has answered an anonymous
/// request (kube's UnauthenticatedHTTP2DOSMitigation, on by default). With an anonymous caller
/// beside authenticated ones in every round, every request is answered and the backend accepts a
/// few connections, not one more per anonymous request: anonymous requests go over HTTP/1.1
/// keep-alive, and close nothing the others share.
#[tokio::test]
async fn anonymous_callers_do_not_close_the_connection_others_share() {
    let (s, alice) = wardle_backend(&["--goaway-anonymous-http2"]).await;
    let ca = s.gateway.ca_pem().unwrap();
    let url = format!(
        "{}/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
        s.gateway.url()
    );
    let as_alice = harness::http2_client(&ca, Some(&alice)).unwrap();
    let anonymous = harness::http2_client(&ca, None).unwrap();
    let before = accepted_connections(&s).await;
    const ROUNDS: usize = 30;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let answers = futures::future::join_all((0..6).map(|i| {
            let (who, client) = match i {
                0 => ("anonymous", anonymous.clone()),
                _ => ("alice", as_alice.clone()),
            };
            let url = url.clone();
            async move { (who, harness::get(&client, &url).await) }
        }))
        .await;
        for (who, answer) in answers {
            match answer {
                Ok((StatusCode::OK, _, _)) => {}
                Ok((status, _, body)) => failures.push(format!(
                    "round {round}, {who}: {status} {}",
                    String::from_utf8_lossy(&body)
                )),
                Err(e) => failures.push(format!("round {round}, {who}: {e}")),
            }
        }
    }
    assert_rows_passed("requests answered", ROUNDS * 6, &failures);
    let opened = accepted_connections(&s).await - before;
    eprintln!("backend connections opened for {ROUNDS} rounds with an anonymous caller: {opened}");
    assert!(
        opened <= 6,
        "{opened} backend connections for {ROUNDS} anonymous requests beside authenticated ones: \
         each anonymous request closed the connection the others shared\n{}",
        s.logs()
    );
}

// ---- a long-lived client connection ----

/// A controller's watches end at their timeout and are opened again on one HTTP/2 connection,
/// for hours. A watch's stream ends with the frame that closes it upstream; relayed as an empty
/// DATA frame of its own, it counts against the client's allowance of such frames: h2 (in hyper
/// and kube-rs) sends GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames" after 100 on a connection,
/// failing every request on it. 200 watches on one connection, of the core and of a remote
/// APIService, all end cleanly.
#[tokio::test]
async fn watches_ended_on_one_connection_never_exhaust_the_clients_frame_allowance() {
    let (s, alice) = wardle(&[]).await;
    for path in [
        "/api/v1/namespaces/default/configmaps",
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    ] {
        let client = s.gateway.http2_client(Some(&alice));
        let url = format!("{}{path}?watch=1&timeoutSeconds=1", s.gateway.url());
        let get = || Request::get(&url).body(Full::new(Bytes::new())).unwrap();
        let (clean, failures) = harness::ended_watches(&client, get, 200, 40).await;
        assert_eq!(clean, 200, "{path}: {failures:#?}");
    }
}
