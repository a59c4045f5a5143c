//! What a hostile backend or client can send, and what the gateway does with it (issue 26): it
//! neither crashes nor multiplies the work, a backend's bad document is refused once with the
//! last good one kept, and a client's bad input gets a Status saying what to fix. The fixture's
//! hostile modes are in `e2e::fixture::hostile`.

use std::time::Duration;

use e2e::fixture::hostile::Hostile;
use e2e::harness;
use e2e::scenario::{Scenario, WARDLE_GROUP};
use http::StatusCode;
use serde_json::Value;

const FLUNDER_V1ALPHA1: &str = "com.example.fixture.wardle.example.com.v1alpha1.Flunder";
const FLUNDER_V1BETA1: &str = "com.example.fixture.wardle.example.com.v1beta1.Flunder";

/// GET `path` as `user`, the body as JSON (`Null` if it is not).
async fn get_json(
    s: &Scenario,
    user: &e2e::certs::CertifiedPair,
    path: &str,
) -> (StatusCode, Value) {
    s.get(user, path, &[]).await
}

/// The merged `/openapi/v2`'s definitions, once they list `name` (within `timeout`).
async fn definitions_listing(
    s: &Scenario,
    user: &e2e::certs::CertifiedPair,
    name: &str,
    timeout: Duration,
) -> Option<serde_json::Map<String, Value>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let (status, spec) = get_json(s, user, "/openapi/v2").await;
        if status == StatusCode::OK && spec["definitions"][name].is_object() {
            return spec["definitions"].as_object().cloned();
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 26, finding 1: a backend whose `/openapi/v2` chains 5 000 definitions by `$ref` made
/// the gateway overflow its stack while merging (and converting) the spec, and crash-loop. Now
/// the chain is merged into `/openapi/v2`, converted into the backend's OpenAPI v3 document, and
/// the core's traffic goes on.
#[tokio::test]
async fn a_backend_spec_chaining_5000_definitions_is_merged_and_converted() {
    let s = Scenario::builder()
        .backend(
            "wardle",
            WARDLE_GROUP,
            "v1alpha1",
            &[
                "--openapi-v2-only",
                "--hostile",
                "openapi-v2-ref-chain=5000",
            ],
        )
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let merged = definitions_listing(&s, &alice, "Link5000", Duration::from_secs(20)).await;
    let merged =
        merged.unwrap_or_else(|| panic!("/openapi/v2 never listed the chain\n{}", s.logs()));
    assert!(merged.contains_key("Link0") && merged.contains_key(FLUNDER_V1ALPHA1));

    // The backend has no /openapi/v3: its v2 spec is converted, chain included.
    let converted = harness::wait_until(Duration::from_secs(20), || async {
        let (status, doc) =
            get_json(&s, &alice, "/openapi/v3/apis/wardle.example.com/v1alpha1").await;
        status == StatusCode::OK && doc["components"]["schemas"]["Link5000"].is_object()
    })
    .await;
    assert!(
        converted,
        "the converted v3 document never had the chain\n{}",
        s.logs()
    );

    let (status, _) = get_json(&s, &alice, "/api/v1/namespaces").await;
    assert_eq!(status, StatusCode::OK, "{}", s.logs());
    assert!(!s.logs().contains("overflowed its stack"), "{}", s.logs());
}

/// Issue 26, finding 1 (the parser's bound): a spec nested deeper than serde_json parses used
/// to pass the gateway's check (which did not build the tree, so had no depth limit) and then
/// silently drop the backend from every merge. Now it is refused when it arrives, logged once,
/// and the backend's last good spec stays in the merge; the converted v3 documents keep theirs
/// too.
#[tokio::test]
async fn a_spec_nested_past_the_parsers_limit_is_refused_once_and_the_last_good_one_kept() {
    let s = Scenario::builder()
        .backend(
            "wardle",
            WARDLE_GROUP,
            "v1alpha1,v1beta1",
            &["--openapi-v2-only"],
        )
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .gateway_args(&["--discovery-refresh-interval", "1s"])
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let good = definitions_listing(&s, &alice, FLUNDER_V1ALPHA1, Duration::from_secs(20)).await;
    assert!(good.is_some(), "{}", s.logs());
    let converted = "/openapi/v3/apis/wardle.example.com/v1alpha1";
    let served = harness::wait_until(Duration::from_secs(20), || async {
        get_json(&s, &alice, converted).await.0 == StatusCode::OK
    })
    .await;
    assert!(served, "{}", s.logs());

    s.pki
        .set_backend_hostility(
            s.backend("wardle"),
            "wardle",
            &[Hostile::OpenapiV2Nesting { depth: 300 }],
        )
        .await;
    // A new APIService changes the routes: every spec is fetched again at once, and merged.
    s.register(&s.pki.apiservice(WARDLE_GROUP, "v1beta1", "wardle"));
    let merged = definitions_listing(&s, &alice, FLUNDER_V1BETA1, Duration::from_secs(20)).await;
    let merged = merged.unwrap_or_else(|| {
        panic!(
            "the merge after the refused spec lost the backend's last good one\n{}",
            s.logs()
        )
    });
    assert!(merged.contains_key(FLUNDER_V1ALPHA1));
    assert!(!merged.contains_key("Deep"));
    // A few of the converted documents' 1 s refreshes later, still one line each.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, doc) = get_json(&s, &alice, converted).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["components"]["schemas"][FLUNDER_V1ALPHA1].is_object());
    // Once each, however many refreshes saw the same spec. Only the lines naming the depth are
    // counted: on loaded cores a refresh may also time out, a state change of its own.
    let too_deep = "the OpenAPI v2 spec nests deeper than 128 levels";
    let refusals = |what: &str| {
        s.logs()
            .lines()
            .filter(|l| l.contains(what) && l.contains(too_deep))
            .count()
    };
    assert_eq!(
        refusals("cannot fetch the OpenAPI v2 spec; keeping the last one"),
        1,
        "{}",
        s.logs()
    );
    assert_eq!(
        refusals("OpenAPI document cannot be used; keeping the last documents"),
        1,
        "{}",
        s.logs()
    );
}

// ---- impersonation ------------------------------------------------------------------------------

/// GET `/api/v1/namespaces` over HTTP/2 with `headers` (no client certificate); the status, the
/// Status body, and the SubjectAccessReviews it cost the core.
async fn impersonating(s: &Scenario, headers: &[(String, String)]) -> (StatusCode, Value, usize) {
    e2e::scenario::clear_core_requests(&s.core).await;
    let client = s.gateway.http2_client(None);
    let mut req = http::Request::get(format!("{}/api/v1/namespaces", s.gateway.url()));
    for (name, value) in headers {
        req = req.header(name, value);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = harness::send(&client, req).await.unwrap();
    let reviews = e2e::scenario::core_posts(&s.core, "subjectaccessreviews")
        .await
        .len();
    (status, e2e::scenario::json_or_null(&body), reviews)
}

fn impersonation_headers(
    user: &str,
    groups: impl IntoIterator<Item = String>,
) -> Vec<(String, String)> {
    let mut headers = vec![("impersonate-user".to_owned(), user.to_owned())];
    headers.extend(
        groups
            .into_iter()
            .map(|g| ("impersonate-group".to_owned(), g)),
    );
    headers
}

/// GET `path` as alice (bearer token) impersonating `user` with `groups`: the status and Status.
async fn alice_as(s: &Scenario, path: &str, user: &str, groups: &[&str]) -> (StatusCode, Value) {
    let client = s.gateway.http2_client(None);
    let mut req = http::Request::get(format!("{}{path}", s.gateway.url()))
        .header("authorization", "Bearer alice-token")
        .header("impersonate-user", user);
    for g in groups {
        req = req.header("impersonate-group", *g);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = harness::send(&client, req).await.unwrap();
    (status, e2e::scenario::json_or_null(&body))
}

/// Issue 40, KEP-5284 (`ConstrainedImpersonation`, as a 1.36 core with the gate on): alice holds
/// only the constrained verbs, `impersonate:user-info` on user bob and
/// `impersonate:serviceaccount` on `ci/builder`, each usable only to list namespaces
/// (`impersonate-on:<mode>:list`). Through a gateway told the core's gate is on she may do
/// exactly that, and nothing more: not get one namespace, not be carol, not add
/// `system:masters`. Without the option the gateway checks the legacy verb alone, as a core
/// with the gate off does.
#[tokio::test]
async fn constrained_impersonation_allows_what_the_constrained_verbs_grant_and_nothing_more() {
    let policy = serde_json::json!({
        "tokens": {"alice-token": {"username": "alice", "groups": ["dev"]}},
        "rules": [
            {"group": "system:authenticated", "verbs": ["get", "list"], "apiGroups": ["*"], "resources": ["*"]},
            {"user": "alice", "verbs": ["impersonate:user-info"], "apiGroups": ["authentication.k8s.io"], "resources": ["users", "groups"], "resourceNames": ["bob", "qa"]},
            {"user": "alice", "verbs": ["impersonate:serviceaccount"], "apiGroups": ["authentication.k8s.io"], "resources": ["serviceaccounts"], "resourceNames": ["builder"], "namespaces": ["ci"]},
            {"user": "alice", "verbs": ["impersonate-on:user-info:list", "impersonate-on:serviceaccount:list"], "apiGroups": [""], "resources": ["namespaces"]}
        ]
    });
    let s = Scenario::builder()
        .core_policy(policy.clone())
        .gateway_args(&["--constrained-impersonation"])
        .start()
        .await;
    for (user, groups) in [
        ("bob", &[][..]),
        ("bob", &["qa"][..]),
        ("system:serviceaccount:ci:builder", &[][..]),
    ] {
        let (status, body) = alice_as(&s, "/api/v1/namespaces", user, groups).await;
        assert_eq!(status, StatusCode::OK, "{user} {groups:?}: {body}");
    }
    let refused = [
        (
            "/api/v1/namespaces/default",
            "bob",
            &[][..],
            r#"User "alice" cannot impersonate-on:user-info:get resource "namespaces""#,
        ),
        (
            "/api/v1/namespaces",
            "carol",
            &[][..],
            r#"User "alice" cannot impersonate:user-info resource "users" in API group "authentication.k8s.io""#,
        ),
        (
            "/api/v1/namespaces",
            "bob",
            &["system:masters"][..],
            "impersonating the system:masters group is not allowed",
        ),
        (
            "/api/v1/namespaces",
            "system:serviceaccount:ci:deployer",
            &[][..],
            r#"cannot impersonate:serviceaccount resource "serviceaccounts""#,
        ),
    ];
    for (path, user, groups, message) in refused {
        let (status, body) = alice_as(&s, path, user, groups).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{user} {groups:?} {path}: {body}"
        );
        assert!(
            body["message"].as_str().unwrap_or("").contains(message),
            "{user} {groups:?} {path}: {body}"
        );
    }

    let legacy = Scenario::builder().core_policy(policy).start().await;
    let (status, body) = alice_as(&legacy, "/api/v1/namespaces", "bob", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

/// Issue 26, finding 2: one anonymous HTTP/2 request impersonating a user and a thousand random
/// groups cost the core 1 001 SubjectAccessReviews (all asked at once, none cached). Now the
/// attributes are checked one at a time in kube's order and the first refusal ends it, and a
/// request asking for more than 256 is a 400 that costs the core nothing.
#[tokio::test]
async fn impersonation_is_checked_in_order_stops_at_the_first_refusal_and_is_capped() {
    let s = Scenario::builder()
        .core_policy(serde_json::json!({
            "tokens": {"alice-token": {"username": "alice", "groups": ["dev"]}},
            "rules": [
                {"group": "system:authenticated", "verbs": ["get", "list"], "apiGroups": ["*"], "resources": ["*"]},
                {"group": "system:unauthenticated", "verbs": ["get", "list"], "apiGroups": ["*"], "resources": ["*"]},
                {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["users"], "resourceNames": ["carol"]},
                {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["groups"], "resourceNames": ["qa"]}
            ]
        }))
        .start()
        .await;
    // (The core keeps its last 200 requests: 150 groups stay countable on a gateway that asks
    // about every one.)
    let random =
        |n: usize, tag: &'static str| (0..n).map(move |i| format!("{tag}-{i}-{}", fastrand_name()));

    // Anonymous may not impersonate anybody: the user is checked first, and that is all.
    let (status, body, reviews) =
        impersonating(&s, &impersonation_headers("x", random(150, "g"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with(
            r#"users "x" is forbidden: User "system:anonymous" cannot impersonate resource "users" in API group "" at the cluster scope"#
        ),
        "{body}"
    );
    assert_eq!(reviews, 1, "one review for the user, none for the groups");

    // Allowed attributes are checked in order until the first refused one.
    let mut as_carol = impersonation_headers(
        "carol",
        ["qa".to_owned(), "nope".to_owned()]
            .into_iter()
            .chain(random(60, "after")),
    );
    as_carol.push(("authorization".to_owned(), "Bearer alice-token".to_owned()));
    let (status, body, reviews) = impersonating(&s, &as_carol).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"groups "nope" is forbidden: User "alice""#),
        "{body}"
    );
    assert_eq!(
        reviews, 3,
        "carol, qa and nope; none of the 60 groups after nope"
    );

    // More than 256 attributes: refused before any review, saying what to send instead.
    let mut too_many = impersonation_headers("carol", random(300, "many"));
    too_many.push(("authorization".to_owned(), "Bearer alice-token".to_owned()));
    let (status, body, reviews) = impersonating(&s, &too_many).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "BadRequest");
    assert_eq!(
        body["message"],
        "requested impersonation of 301 attributes (the user, its UID, each Impersonate-Group \
         and each Impersonate-Extra-* value); at most 256 are allowed, send fewer groups or \
         extra values"
    );
    assert_eq!(reviews, 0);
}

/// A name no earlier request used, so no decision is cached for it.
fn fastrand_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:x}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---- redirects ----------------------------------------------------------------------------------

/// Issue 26, finding 3: an aggregated server answering its OpenAPI v3 document with `302
/// Location: https://attacker.example/...` had that 302 passed to the client (client-go follows
/// it with its credentials) although `--aggregator-reject-forwarding-redirect` is on. Now it is
/// the proxy path's 502; the stale-hash 301 to the same document still passes, as client-go
/// needs it.
#[tokio::test]
async fn a_backend_redirecting_its_openapi_v3_document_elsewhere_gets_a_502() {
    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let document = "/openapi/v3/apis/wardle.example.com/v1alpha1";
    let listed = harness::wait_until(Duration::from_secs(20), || async {
        let (_, root) = get_json(&s, &alice, "/openapi/v3").await;
        root["paths"]["apis/wardle.example.com/v1alpha1"].is_object()
    })
    .await;
    assert!(listed, "{}", s.logs());

    let stale = format!("{document}?hash=STALE");
    let (status, headers, _) = e2e::scenario::get_raw(&s.gateway, &alice, &stale, &[]).await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    let location = headers["location"].to_str().unwrap();
    assert!(
        location.starts_with(&format!("{document}?hash=")),
        "{location}"
    );

    s.pki
        .set_backend_hostility(s.backend("wardle"), "wardle", &[Hostile::OpenapiV3Redirect])
        .await;
    for path in [document.to_owned(), stale] {
        let (status, headers, body) = e2e::scenario::get_raw(&s.gateway, &alice, &path, &[]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{path}: {headers:?}");
        assert!(headers.get("location").is_none(), "{path}: {headers:?}");
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("the backend attempted to redirect this request"),
            "{status}"
        );
    }
}

// ---- request bodies -----------------------------------------------------------------------------

/// Issue 26, finding 5: curl sends `Expect: 100-continue` with a large body by itself. A chunked
/// POST over a 1 MiB limit then got `100 Continue` and a reset, not its 413: the gateway closed
/// the connection with the rest of the body unread, and the kernel answered the bytes still
/// arriving with a reset, which fails the client's upload before it reads the answer. Now, as
/// Go's server does, the gateway stops reading, sends the 413, closes its side and drains what
/// still arrives for a moment: the client finishes writing and reads why.
#[tokio::test]
async fn a_chunked_upload_over_the_limit_after_100_continue_gets_its_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (_core, gateway) =
        e2e::scenario::core_and_gateway(&["--max-request-body-bytes=1048576"]).await;
    let ca = gateway.ca_pem().unwrap();
    for attempt in 0..3 {
        let mut tls = harness::tls_connect(gateway.addr, &ca).await.unwrap();
        tls.write_all(
            b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\n\
              Host: gateway\r\n\
              Content-Type: application/json\r\n\
              Transfer-Encoding: chunked\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        let mut head = [0u8; 25];
        tls.read_exact(&mut head).await.unwrap();
        assert_eq!(&head[..], b"HTTP/1.1 100 Continue\r\n\r\n");
        // 16 MiB in 16 KiB chunks, then the answer: a client that reads once it has sent.
        let chunk = [b"4000\r\n".as_slice(), &[b'x'; 16 << 10], b"\r\n"].concat();
        let mut sent = 0;
        let mut failed = None;
        while sent < 16 << 20 {
            if let Err(e) = tls.write_all(&chunk).await {
                failed = Some(e);
                break;
            }
            sent += 16 << 10;
        }
        if failed.is_none() {
            let _ = tls.write_all(b"0\r\n\r\n").await;
        }
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(
            failed.is_none() && text.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: upload failed after {sent} bytes ({failed:?}); read {read:?}: {text:?}"
        );
        assert!(text.contains("RequestEntityTooLarge"), "{text}");
    }
}

/// Issue 26, finding 4: a POST that declares `content-length: 200000` and ends after 32 KiB
/// made the gateway's own HTTP/2 client reset its stream to the backend; that was filed as the
/// backend's failure, so healthy endpoints of the Service were ejected and the caller got 503.
/// A failure the caller's body caused is the caller's: a 400 saying so, no ejection, and
/// everybody else served on. (Over HTTP/2 the gateway's server resets the lying stream itself;
/// an HTTP/1.1 client that closes its side early waits for the answer, so it is the one used.)
#[tokio::test]
async fn a_callers_broken_body_is_a_400_and_ejects_no_endpoint() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let s = Scenario::with_pki(e2e::scenario::Pki::for_services(&["wardle", "wardle2"]))
        .backend("wardle", WARDLE_GROUP, "v1alpha1", &[])
        .backend("wardle2", WARDLE_GROUP, "v1alpha1", &[])
        .without_static_services()
        .service_alias("wardle", "api", "wardle")
        .service_alias("wardle", "api", "wardle2")
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["system:masters"]);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let served = harness::wait_until(Duration::from_secs(20), || async {
        get_json(&s, &alice, flunders).await.0 == StatusCode::OK
    })
    .await;
    assert!(served, "{}", s.logs());

    let config =
        harness::tls_client_config(&s.gateway.ca_pem().unwrap(), Some(&alice), &[b"http/1.1"])
            .unwrap();
    for attempt in 0..3 {
        let mut tls = harness::tls_connect_with(s.gateway.addr, config.clone())
            .await
            .unwrap();
        let head = format!(
            "POST {flunders} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n\
             Content-Length: 200000\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&vec![b' '; 32 << 10]).await.unwrap();
        // Once the gateway is sending it on, the client is done: 167 968 bytes short.
        tokio::time::sleep(Duration::from_millis(500)).await;
        tls.shutdown().await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 400"),
            "attempt {attempt}: {text}\n{}",
            s.logs()
        );
        assert!(
            text.contains("the request body could not be read to its end"),
            "{text}"
        );
    }
    // Both endpoints still take requests, and neither was ejected.
    for _ in 0..4 {
        let (status, body) = get_json(&s, &alice, flunders).await;
        assert_eq!(status, StatusCode::OK, "{body}\n{}", s.logs());
    }
    assert!(
        !s.logs().contains("backend endpoint ejected"),
        "{}",
        s.logs()
    );
}

/// Issue 26, finding 6: proxied `/apis/<g>/<v>` discovery was bounded 5 s on its headers only,
/// so a backend sending its body a byte a second held the client for 40 s (up to the request
/// timeout). kube-aggregator's 5 s covers the whole exchange; so does the gateway's now: the
/// answer is cut off at 5 s.
#[tokio::test]
async fn proxied_group_version_discovery_is_cut_off_after_5s_body_included() {
    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &["dev"]);
    let discovery = "/apis/wardle.example.com/v1alpha1";
    let served = harness::wait_until(Duration::from_secs(20), || async {
        get_json(&s, &alice, discovery).await.0 == StatusCode::OK
    })
    .await;
    assert!(served, "{}", s.logs());
    s.pki
        .set_backend_hostility(s.backend("wardle"), "wardle", &[Hostile::SlowDiscovery])
        .await;

    let started = std::time::Instant::now();
    let answer = e2e::scenario::try_get(&s.gateway, Some(&alice), discovery, &[]).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the trickling discovery answer held the client {took:?}: {answer:?}"
    );
    assert!(
        answer.is_err(),
        "a 40-byte answer sent a byte a second cannot be complete after {took:?}: {answer:?}"
    );
    // Everything else is served meanwhile.
    let (status, _) = get_json(
        &s,
        &alice,
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// Issue 39, row 1: a watch to a remote APIService whose declared body never arrives held its
/// priority-and-fairness seats for as long as the caller liked (the copy kept for sending again
/// waited for the whole body, with no deadline, and a watch has no request timeout), so one
/// viewer's HTTP/2 connection starved a whole priority level. kube-aggregator gives a watch's
/// seats back once it delegates the request, and so does the gateway now; and a watch's body is
/// streamed on, never waited for.
#[tokio::test]
async fn a_watch_withholding_its_body_holds_no_seat_of_its_priority_level() {
    use bytes::Bytes;

    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        // 15 seats: `global-default`, where both users are classified, gets 2; a queued request
        // waits a quarter of the 2 s request timeout.
        .gateway_args(&[
            "--max-requests-inflight=10",
            "--max-mutating-requests-inflight=5",
            "--request-timeout=2s",
        ])
        .start()
        .await;
    let viewer = s.user("viewer", &[]);
    let flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let served = harness::wait_until(Duration::from_secs(20), || async {
        get_json(&s, &viewer, flunders).await.0 == StatusCode::OK
    })
    .await;
    assert!(served, "{}", s.logs());

    // 40 watches on one HTTP/2 connection, each declaring a 10-byte body it never sends.
    let config =
        harness::tls_client_config(&s.gateway.ca_pem().unwrap(), Some(&viewer), &[b"h2"]).unwrap();
    let tls = harness::tls_connect_with(s.gateway.addr, config)
        .await
        .unwrap();
    let (mut sender, conn) = h2::client::handshake(tls).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut withheld = Vec::new();
    for _ in 0..40 {
        sender = sender.ready().await.unwrap();
        let req = http::Request::get(format!("{}{flunders}?watch=1", s.gateway.url()))
            .header("content-length", "10")
            .body(())
            .unwrap();
        let (response, body) = sender.send_request(req, false).unwrap();
        withheld.push((response, body));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another user of the same level is served, now and a while later, while the watches stay
    // open and their bodies withheld.
    let other = s.user("bob", &[]);
    let configmaps = "/api/v1/namespaces/default/configmaps";
    for round in 0..2 {
        for _ in 0..5 {
            let (status, body) = get_json(&s, &other, configmaps).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "round {round}: {body}\n{}",
                s.logs()
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // The watches stayed open, their bodies withheld, all along.
    let withheld: Vec<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> = withheld;
    drop((withheld, sender));
    conn.abort();
}
