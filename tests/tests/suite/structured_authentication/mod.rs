//! Structured authentication (`--authentication-config`, kube's `AuthenticationConfiguration`):
//! JWTs of configured issuers verified by the gateway itself, with kube's claim mappings and
//! rules, and the identity forwarded to the core; everything else on to TokenReview. A fixture
//! OIDC issuer (`e2e::oidc`) serves discovery and keys; a fixture core behind the gateway
//! answers `kubectl auth whoami` with whomever the gateway's `X-Remote-*` (over its proxy
//! certificate) names. The same table runs against kube-apiserver as the oracle in
//! `real_control_plane::structured_authentication`.

pub mod issuers;
mod reload;
mod rotation;
mod session;
pub mod table;

use std::time::{Duration, Instant};

use e2e::harness::{self, Kubectl};
use http::StatusCode;
use serde_json::{json, Value};

use issuers::Issuers;
use session::Session;

const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// `kubectl auth whoami -o json`'s `status.userInfo`, or kubectl's error output.
pub async fn whoami(kubectl: &Kubectl) -> Result<Value, String> {
    let out = kubectl.run(&["auth", "whoami", "-o", "json"]).await;
    if !out.success() {
        return Err(format!("{}{}", out.stdout, out.stderr));
    }
    let review: Value = serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {out}"))?;
    Ok(review["status"]["userInfo"].clone())
}

/// A raw `POST` of a SelfSubjectReview to `url` with `token` (none: anonymous): status, body.
pub async fn raw_review(
    client: &harness::HttpClient,
    url: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let mut req = http::Request::post(format!("{url}{REVIEW_PATH}"))
        .header("content-type", "application/json");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req
        .body(http_body_util::Full::new(body.to_string().into()))
        .unwrap();
    let (status, _, body) = harness::send(client, req).await.expect("an answer");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Polls until each issuer's first token authenticates through `kubectl_for(token)` (kube
/// fetches discovery asynchronously), or panics naming the ones that never did.
pub async fn wait_for_issuers<F: Fn(&str) -> Kubectl>(issuers: &Issuers, kubectl_for: F) {
    for (name, token) in table::first_tokens(issuers) {
        let kubectl = kubectl_for(&token);
        let ready = harness::wait_until(Duration::from_secs(45), || async {
            whoami(&kubectl).await.is_ok()
        })
        .await;
        assert!(ready, "tokens of issuer {name} never authenticated");
    }
}

/// Every row through the gateway: kubectl's identity and the raw status, and no TokenReview on
/// the core for a JWT the gateway verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_table_through_the_gateway() {
    let issuers = Issuers::start().await;
    let s = Session::start(&issuers.config(&[])).await;
    wait_for_issuers(&issuers, |t| s.kubectl(t)).await;
    let client = s.s.gateway.http2_client(None);
    let mut failed = Vec::new();
    for row in table::rows(&issuers) {
        s.clear_core_requests().await;
        let started = Instant::now();
        let got = whoami(&s.kubectl(&row.token)).await;
        let took = started.elapsed();
        let (status, body) = raw_review(&client, &s.s.gateway.url(), Some(&row.token)).await;
        let reviews = s.token_reviews().await;
        let verdict = match (&row.expect, &got) {
            (Some(want), Ok(got)) if want == got && status == StatusCode::CREATED => (reviews == 0)
                .then_some(())
                .ok_or(format!("{reviews} TokenReviews for a JWT")),
            (None, Err(_)) if status == 401 && body["message"] == "Unauthorized" => Ok(()),
            _ => Err(format!("got {got:?}, raw {status} {body}")),
        };
        if row.name.starts_with("issuer not configured") && reviews == 0 {
            failed.push(format!("{}: no TokenReview on the core", row.name));
        }
        if took > Duration::from_secs(10) {
            failed.push(format!("{}: kubectl took {took:?}", row.name));
        }
        match verdict {
            Ok(()) => eprintln!("ok   {} ({took:.1?})", row.name),
            Err(why) => failed.push(format!("{}: want {:?}; {why}", row.name, row.expect)),
        }
    }
    assert!(
        failed.is_empty(),
        "rows failed:\n{}\n{}",
        failed.join("\n"),
        s.s.logs()
    );
}

/// A token the core's TokenReview knows still authenticates (the chain goes on past the JWT
/// authenticators), and anonymous requests are allowed on the configured paths only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tokens_go_to_token_review_and_anonymous_is_by_path() {
    let issuers = Issuers::start().await;
    let s = Session::start(&issuers.config(&[])).await;
    let got = whoami(&s.kubectl(harness::DEFAULT_TOKEN)).await;
    let e2e = json!({"username": "e2e", "groups": ["system:masters", "system:authenticated"]});
    assert_eq!(got, Ok(e2e));
    assert!(
        s.token_reviews().await >= 1,
        "the opaque token got no TokenReview"
    );
    let client = s.s.gateway.http1_client(None);
    let url = s.s.gateway.url();
    for path in issuers::ANONYMOUS_PATHS {
        let (status, _, _) = harness::get(&client, &format!("{url}{path}"))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "anonymous GET {path}");
    }
    for path in ["/api", "/apis", "/api/v1/namespaces"] {
        let (status, _, body) = harness::get(&client, &format!("{url}{path}"))
            .await
            .unwrap();
        assert_eq!(
            status,
            401,
            "anonymous GET {path}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, body) = raw_review(&client, &url, None).await;
    assert_eq!(
        (status.as_u16(), &body["reason"]),
        (401, &json!("Unauthorized"))
    );
}
