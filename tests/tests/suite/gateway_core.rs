//! A user's session with the gateway in front of a core server and no APIServices: everything
//! reaches the core untouched (discovery, CRUD, watches, upgrades), the gateway's own health and
//! shutdown behave like kube-apiserver's, and mistakes get clear answers.

use std::time::Duration;

use bytes::Bytes;
use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, RefusingPort};
use e2e::scenario::{core_and_gateway, recorded_header};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn kubectl_discovers_the_core_through_the_gateway() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    let kubectl = gateway.kubectl().unwrap();

    let raw = kubectl.run_ok(&["get", "--raw", "/apis"]).await;
    let groups: Value = serde_json::from_str(&raw.stdout).expect("legacy APIGroupList");
    assert_eq!(groups["kind"], "APIGroupList");
    assert!(raw.stdout.contains("apiregistration.k8s.io"), "{raw}");

    let resources = kubectl.run_ok(&["api-resources"]).await;
    for expected in ["configmaps", "namespaces", "deployments", "apiservices"] {
        assert!(
            resources.stdout.contains(expected),
            "{expected} missing:\n{resources}"
        );
    }
}

#[tokio::test]
async fn kubectl_creates_reads_and_deletes_on_the_core_through_the_gateway() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    let kubectl = gateway.kubectl().unwrap();
    kubectl
        .run_ok(&[
            "create",
            "configmap",
            "settings",
            "-n",
            "default",
            "--from-literal=mode=fast",
        ])
        .await;
    let got = kubectl
        .run_ok(&[
            "get",
            "configmap",
            "settings",
            "-n",
            "default",
            "-o",
            "jsonpath={.data.mode}",
        ])
        .await;
    assert_eq!(got.stdout.trim(), "fast");
    kubectl
        .run_ok(&["delete", "configmap", "settings", "-n", "default"])
        .await;
    let gone = kubectl
        .run(&["get", "configmap", "settings", "-n", "default"])
        .await;
    assert!(!gone.success());
    assert!(
        gone.stderr.contains("NotFound") || gone.stderr.contains("not found"),
        "{gone}"
    );
}

#[tokio::test]
async fn a_watch_streams_events_created_after_it_started() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    let kubectl = gateway.kubectl().unwrap();
    let watch = kubectl
        .spawn(&[
            "get",
            "configmaps",
            "-n",
            "default",
            "--watch",
            "-o",
            "name",
        ])
        .unwrap();
    // Give the watch a moment to be established before the event it must see.
    tokio::time::sleep(Duration::from_millis(800)).await;
    kubectl
        .run_ok(&["create", "configmap", "late-arrival", "-n", "default"])
        .await;
    let line = watch
        .wait_for_line(
            |l| l.contains("configmap/late-arrival"),
            Duration::from_secs(10),
        )
        .await;
    assert!(
        line.is_some(),
        "watch did not see the new configmap:\n{}",
        watch.logs()
    );
}

/// Starts a raw watch on configmaps through the gateway and returns its still-streaming body.
async fn open_configmap_watch(
    gateway: &Gateway,
    client: &harness::HttpClient,
) -> hyper::body::Incoming {
    let req = Request::get(format!(
        "{}/api/v1/namespaces/default/configmaps?watch=true",
        gateway.url()
    ))
    // A token the fixture core's default policy knows: the gateway reviews bearer tokens.
    .header(
        "authorization",
        format!("Bearer {}", harness::DEFAULT_TOKEN),
    )
    .body(Full::new(Bytes::new()))
    .unwrap();
    let resp = harness::send_streaming(client, req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.into_body()
}

#[tokio::test]
async fn raw_watch_events_arrive_without_buffering() {
    let (core, gateway) = core_and_gateway(&[]).await;
    let client = gateway.http2_client(None);
    let mut body = open_configmap_watch(&gateway, &client).await;
    // Create an object directly on the core; the event must come through the open stream.
    let direct = gateway.http1_client(None);
    let created = harness::send(
        &direct,
        Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            core.url()
        ))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"streamed"}}"#,
        )))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(created.0, StatusCode::CREATED);
    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                seen.push_str(&String::from_utf8_lossy(&data));
                if seen.contains("\"streamed\"") {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "event not streamed; got {seen:?}");
}

#[tokio::test]
async fn upgraded_connections_echo_both_ways() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    let mut tls = harness::tls_connect(gateway.addr, &gateway.ca_pem().unwrap())
        .await
        .unwrap();
    let request = format!(
        "POST /api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true HTTP/1.1\r\n\
         Host: {}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
         Content-Length: 0\r\n\r\n",
        gateway.addr
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let head = harness::read_head(&mut tls, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: spdy/3.1"),
        "{head}"
    );
    for payload in [
        &b"hello through the gateway"[..],
        &[0u8, 1, 2, 255, 254][..],
    ] {
        tls.write_all(payload).await.unwrap();
        let mut echoed = vec![0u8; payload.len()];
        tokio::time::timeout(Duration::from_secs(5), tls.read_exact(&mut echoed))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(echoed, payload);
    }
}

#[tokio::test]
async fn headers_path_and_bodies_pass_through_over_http1_and_http2() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    for client in [gateway.http1_client(None), gateway.http2_client(None)] {
        let req = Request::builder()
            .method(Method::PUT)
            .uri(format!("{}/fixture/echo?b=2&a=1&a=%2F", gateway.url()))
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .header("x-custom", "kept")
            .header("audit-id", "1234")
            .header("x-forwarded-for", "198.51.100.9")
            .body(Full::new(Bytes::from_static(b"k8s\x00\x01binary")))
            .unwrap();
        let (status, _, body) = harness::send(&client, req).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let echo: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(echo["method"], "PUT");
        assert_eq!(echo["path"], "/fixture/echo");
        assert_eq!(
            echo["query"], "b=2&a=1&a=%2F",
            "query must be preserved byte for byte"
        );
        let header = |name: &str| recorded_header(&echo, name);
        assert_eq!(header("x-custom"), ["kept"]);
        assert_eq!(header("audit-id"), ["1234"]);
        assert_eq!(
            header("content-type"),
            ["application/vnd.kubernetes.protobuf"]
        );
        assert_eq!(header("x-forwarded-for"), ["198.51.100.9, 127.0.0.1"]);
        assert_eq!(header("x-forwarded-proto"), ["https"]);
        assert_eq!(header("x-forwarded-host").len(), 1);
        use base64::Engine;
        let sent = base64::engine::general_purpose::STANDARD
            .decode(echo["body_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(sent, b"k8s\x00\x01binary");
    }
}

/// A client that sends neither `X-Forwarded-For` nor `Audit-ID` gets its address forwarded and
/// a new ID that the core sees too, on every request of a kept-alive connection (the address
/// is the connection's, the ID each request's own).
#[tokio::test]
async fn forwarded_for_and_a_new_audit_id_on_every_request_of_a_connection() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    for client in [gateway.http1_client(None), gateway.http2_client(None)] {
        let mut ids = Vec::new();
        for _ in 0..3 {
            let req = Request::builder()
                .uri(format!("{}/fixture/echo", gateway.url()))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let (status, headers, body) = harness::send(&client, req).await.unwrap();
            assert_eq!(status, StatusCode::OK);
            let echo: Value = serde_json::from_slice(&body).unwrap();
            let header = |name: &str| recorded_header(&echo, name);
            assert_eq!(header("x-forwarded-for"), ["127.0.0.1"]);
            let id = headers["audit-id"].to_str().unwrap().to_owned();
            assert_eq!(id.len(), 36, "{id}");
            assert_eq!(header("audit-id"), std::slice::from_ref(&id));
            ids.push(id);
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 3, "each request has its own Audit-ID");
    }
}

/// A gateway whose core URL is a port nothing listens on (bound, read, closed), and that URL.
async fn gateway_without_core() -> (String, Gateway, RefusingPort) {
    let core = RefusingPort::bind().unwrap();
    let core_url = core.url();
    let gateway =
        Gateway::start(GatewayOptions::new(core_url.clone()).args(["--apiservice-source", "none"]))
            .await
            .unwrap();
    (core_url, gateway, core)
}

#[tokio::test]
async fn core_down_is_a_503_status_naming_the_core() {
    let (core_url, gateway, _core) = gateway_without_core().await;
    let client = gateway.http1_client(None);
    let (status, headers, body) =
        harness::get(&client, &format!("{}/api/v1/namespaces", gateway.url()))
            .await
            .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["content-type"], "application/json");
    let s: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(s["kind"], "Status");
    assert_eq!(s["reason"], "ServiceUnavailable");
    assert_eq!(s["code"], 503);
    // It names the core server, the flag that says where it is, what went wrong and what to
    // check, but not where the core lives: this answer reaches unauthenticated callers too (the
    // gateway's log has the URL).
    let message = s["message"].as_str().unwrap();
    assert!(
        message.starts_with("the core server (--core-url) is unreachable: ")
            && message.contains("Connection refused")
            && message
                .ends_with("check that the core server is running and that --core-url names it"),
        "{s}"
    );
    assert!(!message.contains("127.0.0.1"), "{s}");
    assert!(
        gateway.process.logs().contains(&core_url),
        "the log should name the core's URL"
    );

    // With a bearer token the first thing that needs the core is the TokenReview: the same
    // answer, after what could not be done.
    let kubectl = gateway.kubectl().unwrap();
    let out = kubectl
        .run(&["get", "--raw", "/api/v1/namespaces/default/configmaps"])
        .await;
    assert!(!out.success());
    assert!(
        out.stderr.contains(
            "authentication webhook unavailable: the core server (--core-url) is unreachable: "
        ) && out.stderr.contains("--core-url names it")
            && !out.stderr.contains("127.0.0.1"),
        "kubectl should print the gateway's message, without the core's address:\n{out}"
    );
}

#[tokio::test]
async fn core_down_fails_the_core_server_readiness_check() {
    let (_, gateway, _core) = gateway_without_core().await;
    let client = gateway.http1_client(None);
    let (ready, _, text) = harness::get(&client, &format!("{}/readyz?verbose", gateway.url()))
        .await
        .unwrap();
    assert_eq!(ready, StatusCode::INTERNAL_SERVER_ERROR);
    let text = String::from_utf8_lossy(&text);
    // The check is named; its reason (which names the core's URL) is withheld, as kube-apiserver
    // withholds it: anyone may read this endpoint.
    assert!(
        text.contains("[-]core-server failed: reason withheld\n"),
        "{text:?}"
    );
    let (status, _, one) = harness::get(&client, &format!("{}/readyz/core-server", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let one = String::from_utf8_lossy(&one);
    // Why, in words a newcomer can act on: the flag, not the address.
    assert!(
        one.starts_with("internal server error: the core server (--core-url) is unreachable: ")
            && one.contains("Connection refused")
            && one.contains("check that the core server is running and that --core-url names it"),
        "{one:?}"
    );
    assert!(!one.contains("127.0.0.1"), "the core's address: {one:?}");
}

#[tokio::test]
async fn readyz_fails_at_once_on_sigterm_while_serving_continues() {
    let (_core, mut gateway) = core_and_gateway(&["--shutdown-delay-duration", "3s"]).await;
    let client = gateway.http1_client(None);
    let readyz = format!("{}/readyz", gateway.url());
    assert!(
        harness::wait_until(Duration::from_secs(10), || async {
            harness::get(&client, &readyz)
                .await
                .map(|r| r.0 == StatusCode::OK)
                .unwrap_or(false)
        })
        .await,
        "gateway never became ready"
    );
    let (_, _, verbose) = harness::get(&client, &format!("{readyz}?verbose"))
        .await
        .unwrap();
    let verbose = String::from_utf8_lossy(&verbose).to_string();
    assert!(
        verbose.contains("[+]core-server ok") && verbose.contains("[+]shutdown ok"),
        "{verbose}"
    );

    gateway.process.signal("TERM").unwrap();
    assert!(
        harness::wait_until(Duration::from_secs(2), || async {
            harness::get(&client, &readyz)
                .await
                .map(|r| r.0 == StatusCode::INTERNAL_SERVER_ERROR)
                .unwrap_or(false)
        })
        .await,
        "readyz did not fail after SIGTERM"
    );
    // Still serving during the delay: liveness and proxied requests work.
    let (live, _, _) = harness::get(&client, &format!("{}/livez", gateway.url()))
        .await
        .unwrap();
    assert_eq!(live, StatusCode::OK);
    let status = gateway
        .process
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("gateway exits");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn a_bad_configuration_exits_64_naming_the_field() {
    let binary = harness::ensure_gateway_built().unwrap();
    for (args, field) in [
        (vec!["--core-url", "ftp://core"], "--core-url"),
        (vec!["--secure-port", "99999"], "--secure-port"),
        (vec!["--request-timeout", "soon"], "--request-timeout"),
        (
            vec!["--client-ca-file", "/nonexistent/ca.crt"],
            "--client-ca-file",
        ),
    ] {
        let out = std::process::Command::new(&binary)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(field), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "securePort: 8443\ncoreURL: http://x\n").unwrap();
    let out = std::process::Command::new(&binary)
        .args(["--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("coreURL"),
        "{out:?}"
    );
}

#[tokio::test]
async fn metrics_count_requests_by_target_and_code() {
    let (_core, gateway) = core_and_gateway(&[]).await;
    let client = gateway.http1_client(None);
    harness::get(&client, &format!("{}/api/v1/namespaces", gateway.url()))
        .await
        .unwrap();
    let (status, headers, body) = harness::get(&client, &format!("{}/metrics", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains(
            r#"aggregation_gateway_requests_total{code="200",target="core",verb="LIST"}"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"aggregation_gateway_request_duration_seconds_count{target="core",verb="LIST"}"#
        ),
        "{text}"
    );
}

/// A core serving HTTPS with a certificate of its own CA (written to `dir/core-ca.crt`, also
/// returned) and on a Unix socket (`dir/core.sock`).
async fn tls_core(dir: &std::path::Path) -> (FixtureCore, std::path::PathBuf) {
    tls_core_with(dir, &[]).await
}

async fn tls_core_with(dir: &std::path::Path, extra: &[&str]) -> (FixtureCore, std::path::PathBuf) {
    let ca = e2e::certs::TestCa::new("core-ca");
    let ca_file = ca.write(dir, "core-ca").unwrap();
    let (cert, key) = ca
        .issue_server(&["localhost", "127.0.0.1"])
        .write(dir, "core")
        .unwrap();
    let socket = dir.join("core.sock");
    let core = FixtureCore::start(
        &[
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
            "--unix-socket",
            socket.to_str().unwrap(),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    (core, ca_file)
}

/// An HTTPS core started with `extra`, and a gateway in front of it verifying it with its CA
/// file (also returned). The gateway's own requests (token reviews, access reviews) carry a
/// token, as in a real deployment; the core would otherwise take them for anonymous ones.
async fn tls_core_and_token_gateway(
    dir: &std::path::Path,
    extra: &[&str],
) -> (FixtureCore, std::path::PathBuf, Gateway) {
    let (core, ca_file) = tls_core_with(dir, extra).await;
    let token_file = dir.join("gateway.token");
    std::fs::write(&token_file, harness::DEFAULT_TOKEN).unwrap();
    let gateway = Gateway::start(GatewayOptions::new(format!("https://{}", core.addr)).args([
        "--apiservice-source",
        "none",
        "--core-ca-file",
        ca_file.to_str().unwrap(),
        "--core-token-file",
        token_file.to_str().unwrap(),
    ]))
    .await
    .unwrap();
    (core, ca_file, gateway)
}

/// kube-apiserver closes an HTTP/2 connection once it has answered an anonymous request
/// (UnauthenticatedHTTP2DOSMitigation). Anonymous callers beside a token user in every round:
/// every request is answered, and the core accepts a few connections from the gateway, not one
/// more per anonymous request (those go over HTTP/1.1 keep-alive, closing nothing shared).
#[tokio::test]
async fn anonymous_callers_do_not_close_the_core_connection_others_share() {
    let dir = tempfile::tempdir().unwrap();
    let (core, ca_file, gateway) =
        tls_core_and_token_gateway(dir.path(), &["--goaway-anonymous-http2"]).await;
    let core_client =
        harness::http1_client(&std::fs::read_to_string(&ca_file).unwrap(), None).unwrap();
    let accepted = || async {
        let url = format!("https://{}/fixture/connections", core.addr);
        let (_, _, body) = harness::get(&core_client, &url).await.unwrap();
        serde_json::from_slice::<Value>(&body).unwrap()["accepted"]
            .as_u64()
            .unwrap()
    };
    let ca = gateway.ca_pem().unwrap();
    let client = harness::http2_client(&ca, None).unwrap();
    let url = format!("{}/api/v1/namespaces", gateway.url());
    let get = |token: Option<&'static str>| {
        let mut req = Request::get(&url);
        if let Some(token) = token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        harness::send(&client, req.body(Full::new(Bytes::new())).unwrap())
    };
    // Warm: the gateway's connections to the core are open.
    assert_eq!(
        get(Some(harness::DEFAULT_TOKEN)).await.unwrap().0,
        StatusCode::OK
    );
    let before = accepted().await;
    const ROUNDS: usize = 30;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let answers = futures::future::join_all(
            std::iter::once(get(None)).chain((0..5).map(|_| get(Some(harness::DEFAULT_TOKEN)))),
        )
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok((StatusCode::OK, _, _)) => {}
                other => failures.push(format!("round {round}, request {i}: {other:?}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{failures:#?}\n{}",
        gateway.process.logs()
    );
    // This question's own connection counts too.
    let opened = accepted().await - before;
    eprintln!("core connections opened for {ROUNDS} rounds with an anonymous caller: {opened}");
    assert!(
        opened <= 6,
        "{opened} core connections for {ROUNDS} anonymous requests beside a token user: each \
         anonymous request closed the connection the others shared\n{}",
        gateway.process.logs()
    );
}

/// The gateway reaches the core over HTTPS verified with --core-ca-file (HTTP/2 when offered),
/// through a kubeconfig, and over a Unix socket; kubectl sees the same API each way. One row
/// per way.
#[tokio::test]
async fn the_core_is_reached_over_https_kubeconfig_and_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (core, ca_file) = tls_core(dir.path()).await;
    let socket = dir.path().join("core.sock");
    let https_url = format!("https://{}", core.addr);

    let kubeconfig = dir.path().join("core.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: core\n  cluster:\n    server: {https_url}\n    certificate-authority: {}\n\
             users:\n- name: gw\n  user:\n    token: {}\ncontexts:\n- name: core\n  context:\n    cluster: core\n    user: gw\ncurrent-context: core\n",
            ca_file.display(),
            harness::DEFAULT_TOKEN
        ),
    )
    .unwrap();

    let variants: Vec<(&str, GatewayOptions)> = vec![
        (
            "https with --core-ca-file",
            GatewayOptions::new(https_url.clone()).args([
                "--apiservice-source",
                "none",
                "--core-ca-file",
                ca_file.to_str().unwrap(),
            ]),
        ),
        (
            "--core-kubeconfig",
            // --core-url names the server; the kubeconfig supplies the CA to trust and the token.
            GatewayOptions::new(https_url.clone()).args([
                "--apiservice-source",
                "none",
                "--core-kubeconfig",
                kubeconfig.to_str().unwrap(),
            ]),
        ),
        (
            "unix socket",
            GatewayOptions::new(socket.display().to_string()).args(["--apiservice-source", "none"]),
        ),
    ];
    for (name, options) in variants {
        let gateway = Gateway::start(options)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let kubectl = gateway.kubectl().unwrap();
        let out = kubectl.run_ok(&["get", "namespaces", "-o", "name"]).await;
        assert!(out.stdout.contains("namespace/default"), "{name}: {out}");
        let client = gateway.http1_client(None);
        let ready = harness::wait_until(Duration::from_secs(5), || async {
            harness::get(&client, &format!("{}/readyz", gateway.url()))
                .await
                .map(|r| r.0 == StatusCode::OK)
                .unwrap_or(false)
        })
        .await;
        assert!(
            ready,
            "{name}: gateway not ready:\n{}",
            gateway.process.logs()
        );
    }
}

/// Without the CA the core's certificate is refused, and the 503 says why.
#[tokio::test]
async fn a_core_certificate_from_an_untrusted_ca_is_refused_with_a_503_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let (core, _) = tls_core(dir.path()).await;
    let gateway = Gateway::start(
        GatewayOptions::new(format!("https://{}", core.addr)).args(["--apiservice-source", "none"]),
    )
    .await
    .unwrap();
    let client = gateway.http1_client(None);
    let (status, _, body) = harness::get(&client, &format!("{}/api/v1/namespaces", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        String::from_utf8_lossy(&body)
            .to_lowercase()
            .contains("certificate"),
        "{body:?}"
    );
}

/// At shutdown an open watch is ended cleanly (the stream finishes, no reset), so the client can
/// re-watch elsewhere, and the gateway still exits 0.
#[tokio::test]
async fn open_watches_end_cleanly_at_shutdown() {
    let (_core, mut gateway) = core_and_gateway(&[
        "--shutdown-delay-duration",
        "1s",
        "--shutdown-timeout",
        "10s",
    ])
    .await;
    let client = gateway.http1_client(None);
    let mut body = open_configmap_watch(&gateway, &client).await;

    gateway.process.signal("TERM").unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(8), async {
        loop {
            match body.frame().await {
                None => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    })
    .await;
    assert_eq!(
        ended,
        Ok(Ok(())),
        "the watch should end cleanly:\n{}",
        gateway.process.logs()
    );
    let status = gateway
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("gateway exits");
    assert_eq!(status.code(), Some(0));
}

/// Issue 38: kube-apiserver takes 100 streams on an HTTP/2 connection. The gateway kept one
/// connection to the core per set of credentials and queued every request past that limit on
/// it, with no deadline: once a hundred watches were open (one controller's, or Kubernetes'
/// conformance test of concurrent watches), every other request of every token user waited for
/// a watch to end, and a watch from a resourceVersion timed out waiting for the writes behind
/// it. Go's client opens another connection instead, and so does the gateway now. With a core
/// taking 10 streams, 25 watches start, a write passes beside them, and every watch sees it.
#[tokio::test]
async fn watches_past_the_cores_stream_limit_take_another_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (_core, _, gateway) =
        tls_core_and_token_gateway(dir.path(), &["--http2-max-streams-per-connection", "10"]).await;
    let client = gateway.http2_client(None);
    let mut watches = Vec::new();
    for i in 0..25 {
        let opened = tokio::time::timeout(
            Duration::from_secs(5),
            open_configmap_watch(&gateway, &client),
        )
        .await;
        match opened {
            Ok(body) => watches.push(body),
            Err(_) => panic!(
                "watch {i} did not start within 5 s beside {i} others\n{}",
                gateway.process.logs()
            ),
        }
    }
    let create = Request::post(format!(
        "{}/api/v1/namespaces/default/configmaps",
        gateway.url()
    ))
    .header(
        "authorization",
        format!("Bearer {}", harness::DEFAULT_TOKEN),
    )
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from_static(
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"beside-the-watches"}}"#,
    )))
    .unwrap();
    let created = tokio::time::timeout(Duration::from_secs(5), harness::send(&client, create))
        .await
        .expect("the write waited behind the watches")
        .unwrap();
    assert_eq!(created.0, StatusCode::CREATED, "{created:?}");
    for (i, watch) in watches.iter_mut().enumerate() {
        let mut seen = Vec::new();
        let arrived = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(frame) = watch.frame().await {
                if let Ok(data) = frame.unwrap().into_data() {
                    seen.extend_from_slice(&data);
                }
                if String::from_utf8_lossy(&seen).contains("beside-the-watches") {
                    return;
                }
            }
        })
        .await;
        assert!(
            arrived.is_ok(),
            "watch {i} never saw the write: {}",
            String::from_utf8_lossy(&seen)
        );
    }
}

/// Issue 41, supervised loops: a control loop that panics (here the discovery controller, made to
/// panic in its first two runs by the debug builds' test hook) is logged once per end, counted in
/// `aggregation_gateway_loop_restarts_total`, fails its own `/readyz` check while it is down, and
/// is started again with a backoff (1 s, then 2 s), after which `/readyz` passes and aggregated
/// discovery is served. Before: a loop that ended stayed gone while `/readyz` said ok.
#[tokio::test]
async fn a_loop_that_panics_fails_readyz_is_logged_counted_and_started_again() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let gateway = Gateway::start(
        GatewayOptions::new(core.url())
            .args(["--apiservice-source", "none"])
            .env("AGGREGATION_GATEWAY_TEST_PANIC", "discovery-controller:2"),
    )
    .await
    .unwrap();
    let client = gateway.http1_client(None);
    let url = |path: &str| format!("{}{path}", gateway.url());
    // Its check fails while it is down (the first run panics as soon as it starts).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let reason = loop {
        let (status, _, one) = harness::get(&client, &url("/readyz/loop/discovery-controller"))
            .await
            .unwrap();
        let reason = String::from_utf8_lossy(&one).into_owned();
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            break reason;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never failed: {reason:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        reason.contains("the discovery-controller loop panicked")
            && reason.contains("started again"),
        "{reason:?}"
    );
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        harness::get(&client, &url("/readyz")).await.unwrap().0 == StatusCode::OK
    })
    .await;
    assert!(ready, "never ready again:\n{}", gateway.process.logs());
    let (status, _, verbose) = harness::get(&client, &url("/readyz?verbose"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        String::from_utf8_lossy(&verbose).contains("[+]loop/discovery-controller ok\n"),
        "{}",
        String::from_utf8_lossy(&verbose)
    );
    let ended: Vec<String> = gateway
        .process
        .lines()
        .into_iter()
        .map(|l| l.text)
        .filter(|l| l.contains("the discovery-controller loop panicked"))
        .collect();
    assert_eq!(ended.len(), 2, "one line per end: {ended:#?}");
    let metrics = e2e::scenario::metrics(&gateway).await;
    assert!(
        metrics
            .contains(r#"aggregation_gateway_loop_restarts_total{loop="discovery-controller"} 2"#),
        "{metrics}"
    );
    let (status, headers, _) = harness::send(
        &client,
        Request::get(url("/apis"))
            .header(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .contains("v=v2;as=APIGroupDiscoveryList"),
        "{headers:?}"
    );
}
