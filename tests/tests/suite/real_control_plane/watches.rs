//! Many watches of one client beside its writes, as every controller makes them and as Kubernetes'
//! conformance test "Watchers should receive events on concurrent watches in same order" opens a
//! hundred: kube-apiserver takes 100 streams per HTTP/2 connection, and the gateway must open
//! another connection to it rather than queue every later request of the same credentials
//! behind the watches (issue 38). The same, directly and through the gateway.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{http2_client, send, send_streaming, HttpClient};
use e2e::real::pki::ADMIN_TOKEN;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

use super::session::Real;

/// More than kube-apiserver's 100 streams per connection.
const WATCHES: usize = 120;
/// Watches per client connection: below the 100 streams the server side (kube-apiserver or the
/// gateway) takes, so the test's own client never queues.
const PER_CONNECTION: usize = 40;

/// Opens [`WATCHES`] watches at `base`, writes a ConfigMap beside them, and returns how long
/// the write took and how long until the last watch saw it.
async fn watches_and_a_write(
    real: &Real,
    base: &str,
    ca: &str,
    name: &str,
) -> (Duration, Duration) {
    let clients: Vec<HttpClient> = (0..WATCHES.div_ceil(PER_CONNECTION))
        .map(|_| http2_client(ca, None).unwrap())
        .collect();
    let url = format!("{base}/api/v1/namespaces/default/configmaps?watch=1");
    // Opened together, as a controller's informers start: each within 10 s.
    let opens = (0..WATCHES).map(|i| {
        let client = &clients[i / PER_CONNECTION];
        let url = &url;
        async move {
            let opened = tokio::time::timeout(
                Duration::from_secs(10),
                send_streaming(client, real.admin_request(url, "application/json")),
            )
            .await
            .unwrap_or_else(|_| panic!("{base}: watch {i} did not start within 10 s"))
            .unwrap();
            assert_eq!(opened.status(), StatusCode::OK, "{base}: watch {i}");
            opened.into_body()
        }
    });
    let mut watches = futures::future::join_all(opens).await;
    let started = Instant::now();
    let create = Request::post(format!("{base}/api/v1/namespaces/default/configmaps"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}}}}"#
        ))))
        .unwrap();
    let created = tokio::time::timeout(Duration::from_secs(10), send(&clients[0], create))
        .await
        .unwrap_or_else(|_| panic!("{base}: the write waited more than 10 s behind the watches"))
        .unwrap();
    assert_eq!(created.0, StatusCode::CREATED, "{base}: {created:?}");
    let wrote = started.elapsed();
    for (i, watch) in watches.iter_mut().enumerate() {
        let mut seen = Vec::new();
        let arrived = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(frame)) = watch.frame().await {
                if let Ok(data) = frame.into_data() {
                    seen.extend_from_slice(&data);
                }
                if String::from_utf8_lossy(&seen).contains(name) {
                    return;
                }
            }
        })
        .await;
        assert!(arrived.is_ok(), "{base}: watch {i} never saw {name}");
    }
    (wrote, started.elapsed())
}

pub async fn a_hundred_watches_beside_a_write(real: &Real) {
    let direct = watches_and_a_write(
        real,
        &real.plane.url,
        real.plane.pki.cluster_ca.cert_pem(),
        "beside-watches-direct",
    )
    .await;
    let through = watches_and_a_write(
        real,
        &real.gateway.url(),
        &real.gateway.ca_pem().unwrap(),
        "beside-watches-gateway",
    )
    .await;
    eprintln!(
        "{WATCHES} watches and a write: directly written in {:?}, seen by all in {:?}; through \
         the gateway {:?}, {:?}",
        direct.0, direct.1, through.0, through.1
    );
}

/// The names of the objects a watch-list stream (`sendInitialEvents=true`) sends before the
/// bookmark that ends its initial events, read from `base` within 10 s, and whether that
/// bookmark arrived while the stream stayed open (a proxy that buffered the stream would hold it).
async fn initial_events(real: &Real, base: &str, ca: &str) -> Vec<(String, String)> {
    let client = http2_client(ca, None).unwrap();
    let url = format!(
        "{base}/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true\
         &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&labelSelector=watchlist%3Dyes"
    );
    let opened = send_streaming(&client, real.admin_request(&url, "application/json"))
        .await
        .unwrap();
    if opened.status() != StatusCode::OK {
        // Refused as a request (1.33 turned the WatchList gate off by default: a 422 Invalid
        // naming sendInitialEvents): its code and message, as one event.
        let status = opened.status();
        let body = opened.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let message = body["message"].as_str().unwrap_or_default();
        return vec![(format!("refused {}", status.as_u16()), message.to_owned())];
    }
    let mut body = opened.into_body();
    let mut buffered = Vec::new();
    let mut events = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        'stream: while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffered.extend_from_slice(&data);
            while let Some(end) = buffered.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffered.drain(..=end).collect();
                let event: serde_json::Value = serde_json::from_slice(&line).unwrap();
                let kind = event["type"].as_str().unwrap_or_default().to_owned();
                let object = &event["object"]["metadata"];
                if kind == "BOOKMARK" {
                    if object["annotations"]["k8s.io/initial-events-end"] == "true" {
                        return;
                    }
                    continue;
                }
                let name = match kind.as_str() {
                    // An ERROR event's object is a Status: its message says what was wrong.
                    "ERROR" => event["object"]["message"].as_str().unwrap_or_default(),
                    _ => object["name"].as_str().unwrap_or_default(),
                };
                let error = kind == "ERROR";
                events.push((kind, name.to_owned()));
                if error {
                    // The server ends the stream after an ERROR event.
                    break 'stream;
                }
            }
        }
    })
    .await;
    assert!(
        ended.is_ok() || events.iter().any(|(kind, _)| kind == "ERROR"),
        "{base}: no initial-events-end bookmark within 10 s; events so far: {events:?}"
    );
    events
}

/// Watch-list (KEP-3157, on by default in client-go's informers from 1.32): a watch that starts
/// with the current state sends it as ADDED events, then a BOOKMARK annotated
/// `k8s.io/initial-events-end`, on a stream that stays open. Through the gateway the same events
/// arrive, and the bookmark too while the stream is open: nothing is buffered.
pub async fn watch_list_streams_as_directly(real: &Real) {
    let client = real.direct_client();
    for i in 1..=3 {
        let create = Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            real.plane.url
        ))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"watchlist-{i}","labels":{{"watchlist":"yes"}}}}}}"#
        ))))
        .unwrap();
        let (status, _, body) = send(&client, create).await.unwrap();
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    let direct = initial_events(real, &real.plane.url, real.plane.pki.cluster_ca.cert_pem()).await;
    let through = initial_events(real, &real.gateway.url(), &real.gateway.ca_pem().unwrap()).await;
    assert_eq!(through, direct);
    match direct.as_slice() {
        // kube-apiserver serves watch-list only on an etcd that answers progress requests (3.4.31,
        // 3.5.13 and newer; Debian's 3.4.23 does not): then both say so, as one ERROR event.
        [(kind, message)] if kind == "ERROR" && message.contains("RequestWatchProgress") => {
            eprintln!(
                "real control plane: watch-list is off on this etcd, alike both ways: {message}"
            );
        }
        // kube-apiserver 1.33 refuses watch-list unless its WatchList gate is turned on: then
        // both refuse it alike.
        [(kind, message)] if kind.starts_with("refused ") => {
            eprintln!("real control plane: watch-list refused alike both ways ({kind}): {message}");
        }
        events => assert_eq!(events.len(), 3, "{events:?}"),
    }
}

/// More watch ends on one connection than h2's allowance of 100 empty DATA frames that do not end
/// their stream.
const ENDED_WATCHES: usize = 200;

/// A controller's watches end at their timeout and are opened again, on one HTTP/2 connection for
/// hours. Each ends cleanly through the gateway as directly, however many have ended before on the
/// same connection: the frame that closes each stream is relayed as the frame that closes it, not
/// as an empty DATA frame of its own (which a Rust client counts, and after 100 closes the
/// connection with GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames").
pub async fn ended_watches_leave_the_connection_open(real: &Real) {
    let (direct, through) = real.h2_clients();
    for path in [
        "/api/v1/namespaces/default/configmaps",
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    ] {
        let ended = |client, base: String| {
            let url = format!("{base}{path}?watch=1&timeoutSeconds=1");
            let watch = move || real.admin_request(&url, "application/json");
            e2e::harness::ended_watches(client, watch, ENDED_WATCHES, PER_CONNECTION)
        };
        let directly = ended(&direct, real.plane.url.clone()).await;
        let gateway = ended(&through, real.gateway.url()).await;
        eprintln!("{path}: {ENDED_WATCHES} watches ended on one connection: directly {} clean {:?}, through the gateway {} clean {:?}", directly.0, directly.1, gateway.0, gateway.1);
        assert_eq!(
            (gateway.0, &gateway.1),
            (ENDED_WATCHES, &directly.1),
            "{path}: watches ended through the gateway (directly: {} clean)",
            directly.0
        );
    }
}
