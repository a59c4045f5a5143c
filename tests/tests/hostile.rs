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

fn lines_containing(s: &Scenario, text: &str) -> usize {
    s.logs().lines().filter(|l| l.contains(text)).count()
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
    let too_deep = "the OpenAPI v2 spec nests deeper than 128 levels";
    assert_eq!(
        lines_containing(&s, "cannot fetch the OpenAPI v2 spec; keeping the last one"),
        1,
        "{}",
        s.logs()
    );
    assert_eq!(
        lines_containing(
            &s,
            "OpenAPI document cannot be used; keeping the last documents"
        ),
        1,
        "{}",
        s.logs()
    );
    assert_eq!(lines_containing(&s, too_deep), 2, "{}", s.logs());
}
