//! Key rotation at the issuer: a token with a new kid costs one JWKS fetch and works; a known
//! kid costs none; a key no longer published is refused. And an issuer that is down or serves
//! garbage never holds up another issuer's tokens.

use std::time::{Duration, Instant};

use e2e::oidc::{Misbehaviour, Rotation};
use sha2::{Digest, Sha256};

use super::issuers::{Issuers, AUDIENCE};
use super::table::claims_token;
use super::*;

/// The gateway refetches an issuer's keys at most about once a second (kube refetches on every
/// unknown kid); rows that need a refetch wait this long after the previous one.
const REFETCH_INTERVAL: Duration = Duration::from_millis(1500);

fn issuer_hash(url: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(url.as_bytes())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_kid_after_rotation_costs_one_jwks_fetch() {
    let issuers = Issuers::start().await;
    let s = Session::start(&issuers.config(&[])).await;
    let (old, alice) = claims_token(&issuers, "RS256", AUDIENCE);
    // Minted with the old key, first presented after the rotation (never cached).
    let (unseen_old, _) = claims_token(&issuers, "ES256", AUDIENCE);
    assert_eq!(whoami(&s.kubectl(&old)).await, Ok(alice.clone()));
    let fetched = issuers.claims.jwks_fetches();
    assert_eq!(whoami(&s.kubectl(&old)).await, Ok(alice.clone()));
    assert_eq!(
        issuers.claims.jwks_fetches(),
        fetched,
        "a known kid refetched the keys"
    );

    tokio::time::sleep(REFETCH_INTERVAL).await;
    issuers.claims.rotate(Rotation::Replace);
    let (new, _) = claims_token(&issuers, "RS256", AUDIENCE);
    assert_eq!(
        whoami(&s.kubectl(&new)).await,
        Ok(alice.clone()),
        "{}",
        s.s.logs()
    );
    assert_eq!(
        issuers.claims.jwks_fetches(),
        fetched + 1,
        "JWKS fetches for one new kid"
    );

    tokio::time::sleep(REFETCH_INTERVAL).await;
    let refused = whoami(&s.kubectl(&unseen_old)).await;
    assert!(refused.is_err(), "a key no longer published: {refused:?}");

    let metrics = s.metrics().await;
    let hash = issuer_hash(&issuers.claims.url());
    for series in [
        "apiserver_authentication_jwt_authenticator_latency_seconds_count{",
        "apiserver_authentication_jwt_authenticator_jwks_fetch_last_timestamp_seconds{",
        "apiserver_authentication_jwt_authenticator_jwks_fetch_last_key_set_info{",
    ] {
        let found = metrics
            .lines()
            .any(|l| l.starts_with(series) && l.contains(&hash));
        assert!(
            found,
            "no {series}..jwt_issuer_hash=\"{hash}\"..}} in\n{metrics}"
        );
    }
}

/// While the `down` issuer hangs from the start, and after the `cel` issuer starts serving
/// garbage or refusing, the `claims` issuer's tokens still authenticate promptly, and the
/// broken issuers' tokens get a 401 in bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_issuer_never_holds_up_another() {
    let issuers = Issuers::start().await;
    let s = Session::start(&issuers.config(&[])).await;
    let client = s.s.gateway.http2_client(None);
    for how in [
        Misbehaviour::Hang,
        Misbehaviour::Garbage,
        Misbehaviour::Refuse,
    ] {
        issuers.cel.misbehave(how);
        // A kid the cel issuer never published: the gateway must go back to it for keys.
        let cel = issuers.cel.sign_with_header(
            json!({"alg": "RS256", "kid": format!("unpublished-{how:?}")}),
            issuers.cel.claims(AUDIENCE, "bob"),
        );
        let down = issuers
            .down
            .sign("RS256", issuers.down.claims(AUDIENCE, "erin"));
        for token in [&cel, &down] {
            let started = Instant::now();
            let (status, _) = raw_review(&client, &s.s.gateway.url(), Some(token)).await;
            assert_eq!(status, 401, "{how:?}");
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{how:?}: {:?}",
                started.elapsed()
            );
        }
        let (token, alice) = claims_token(&issuers, "RS256", AUDIENCE);
        let started = Instant::now();
        assert_eq!(whoami(&s.kubectl(&token)).await, Ok(alice), "{how:?}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{how:?}: a good issuer's token took {took:?}"
        );
    }
}
