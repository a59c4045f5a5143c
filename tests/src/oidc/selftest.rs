//! The issuer fixture checked on its own: what it serves verifies what it signs (with ring, as a
//! relying party would), rotation changes the JWKS, and each failure mode fails.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{json, Value};

use super::*;
use crate::harness::{self, HttpClient};

fn client(issuer: &Issuer) -> HttpClient {
    harness::http1_client(issuer.ca_pem(), None).unwrap()
}

async fn get_json(client: &HttpClient, url: &str) -> (u16, Option<Value>) {
    let (status, _, body) = harness::get(client, url).await.unwrap();
    (status.as_u16(), serde_json::from_slice(&body).ok())
}

fn unb64(s: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(s).expect("base64url")
}

/// Verifies `token` with the key of its `kid` in `jwks`, as a relying party does.
fn verifies(token: &str, jwks: &Value) -> bool {
    let (input, sig) = token.rsplit_once('.').unwrap();
    let header: Value = serde_json::from_slice(&unb64(input.split('.').next().unwrap())).unwrap();
    let keys = jwks["keys"].as_array().unwrap();
    let Some(jwk) = keys.iter().find(|k| k["kid"] == header["kid"]) else {
        return false;
    };
    let field = |name: &str| unb64(jwk[name].as_str().unwrap());
    let (input, sig) = (input.as_bytes(), unb64(sig));
    let rsa = |alg| {
        let key = RsaPublicKeyComponents {
            n: field("n"),
            e: field("e"),
        };
        key.verify(alg, input, &sig).is_ok()
    };
    let ec = |alg| {
        let point = [vec![4], field("x"), field("y")].concat();
        UnparsedPublicKey::new(alg, point)
            .verify(input, &sig)
            .is_ok()
    };
    match header["alg"].as_str().unwrap() {
        "RS256" => rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
        "RS384" => rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
        "RS512" => rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
        "PS256" => rsa(&signature::RSA_PSS_2048_8192_SHA256),
        "PS384" => rsa(&signature::RSA_PSS_2048_8192_SHA384),
        "PS512" => rsa(&signature::RSA_PSS_2048_8192_SHA512),
        "ES256" => ec(&signature::ECDSA_P256_SHA256_FIXED),
        "ES384" => ec(&signature::ECDSA_P384_SHA384_FIXED),
        _ => false,
    }
}

const ALGS: [&str; 8] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
];

#[tokio::test]
async fn tokens_verify_against_the_jwks_discovery_names() {
    let issuer = Issuer::start().await;
    let client = client(&issuer);
    let (status, doc) = get_json(&client, &format!("{}{WELL_KNOWN}", issuer.url())).await;
    let doc = doc.expect("discovery is JSON");
    assert_eq!((status, &doc["issuer"]), (200, &json!(issuer.url())));
    let (status, jwks) = get_json(&client, doc["jwks_uri"].as_str().unwrap()).await;
    let jwks = jwks.expect("the JWKS is JSON");
    assert_eq!(status, 200);
    assert_eq!((issuer.discovery_fetches(), issuer.jwks_fetches()), (1, 1));
    for alg in ALGS {
        let token = issuer.sign(alg, issuer.claims("aud", "alice"));
        assert!(verifies(&token, &jwks), "{alg}: {token}");
        // The same signature over other claims does not verify: the check can fail.
        let (head, rest) = token.split_once('.').unwrap();
        let sig = rest.rsplit_once('.').unwrap().1;
        let forged = format!("{head}.{}.{sig}", b64(br#"{"sub":"admin"}"#));
        assert!(
            !verifies(&forged, &jwks),
            "{alg}: a forged payload verified"
        );
    }
    for alg in ["none", "HS256"] {
        assert!(!verifies(&issuer.sign(alg, json!({})), &jwks), "{alg}");
    }
}

#[tokio::test]
async fn rotation_replaces_or_overlaps_the_published_keys() {
    let issuer = Issuer::start().await;
    let old = issuer.sign("RS256", issuer.claims("aud", "alice"));
    assert_eq!(issuer.rotate(Rotation::Replace), 1);
    let new = issuer.sign("RS256", issuer.claims("aud", "alice"));
    let (_, jwks) = get_json(&client(&issuer), &format!("{}{JWKS_PATH}", issuer.url())).await;
    let jwks = jwks.unwrap();
    assert!(verifies(&new, &jwks) && !verifies(&old, &jwks), "{jwks}");
    issuer.rotate(Rotation::Overlap);
    let newest = issuer.sign("ES256", issuer.claims("aud", "alice"));
    let (_, jwks) = get_json(&client(&issuer), &format!("{}{JWKS_PATH}", issuer.url())).await;
    let jwks = jwks.unwrap();
    assert!(verifies(&new, &jwks) && verifies(&newest, &jwks), "{jwks}");
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 6, "{jwks}");
}

#[tokio::test]
async fn an_alternate_discovery_path_and_each_failure_mode() {
    let issuer = Issuer::start_with(IssuerOptions {
        well_known: false,
        discovery_path: Some("/tenant/discovery".into()),
        ..IssuerOptions::default()
    })
    .await;
    let client = client(&issuer);
    let well_known = format!("{}{WELL_KNOWN}", issuer.url());
    assert_eq!(get_json(&client, &well_known).await.0, 404);
    let alternate = issuer.discovery_url().unwrap();
    let (status, doc) = get_json(&client, &alternate).await;
    assert_eq!(
        (status, doc.unwrap()["issuer"].clone()),
        (200, json!(issuer.url()))
    );

    issuer.misbehave(Misbehaviour::Garbage);
    assert_eq!(get_json(&client, &alternate).await, (200, None));
    issuer.misbehave(Misbehaviour::ServerError);
    assert_eq!(get_json(&client, &alternate).await.0, 500);
    issuer.misbehave(Misbehaviour::Hang);
    let hung = tokio::time::timeout(
        Duration::from_millis(500),
        harness::get(&client, &alternate),
    );
    assert!(hung.await.is_err(), "a hanging issuer answered");
    issuer.misbehave(Misbehaviour::Refuse);
    let fresh = super::selftest::client(&issuer);
    assert!(
        harness::get(&fresh, &alternate).await.is_err(),
        "a refusing issuer answered"
    );
    issuer.misbehave(Misbehaviour::None);
    assert_eq!(get_json(&fresh, &alternate).await.0, 200);
}
