//! The configuration file is reloaded when it changes: a new audience works without a restart;
//! a broken file is refused with one log line, and the configuration in force stays.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::issuers::{Issuers, AUDIENCE, LATER_AUDIENCE};
use super::table::claims_token;
use super::*;

const REFUSED: &str = "authentication config not reloaded";

/// A file kube refuses: an issuer URL that is not https.
fn broken() -> String {
    json!({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AuthenticationConfiguration",
           "jwt": [{"issuer": {"url": "http://127.0.0.1:9", "audiences": ["x"]},
                    "claimMappings": {"username": {"claim": "sub", "prefix": ""}}}]})
    .to_string()
}

/// Replaces `path`'s contents in one step (a rename), as a ConfigMap volume update does: a
/// watcher never sees a half-written file.
fn replace(path: &std::path::Path, contents: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn metric(metrics: &str, prefix: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_reloaded_and_a_broken_one_refused() {
    let issuers = Issuers::start().await;
    let s = Session::start(&issuers.reloadable(&[])).await;
    let (later, alice) = claims_token(&issuers, "RS256", LATER_AUDIENCE);
    let (now, _) = claims_token(&issuers, "ES256", AUDIENCE);
    assert_eq!(whoami(&s.kubectl(&now)).await, Ok(alice.clone()));
    assert!(
        whoami(&s.kubectl(&later)).await.is_err(),
        "an audience not configured yet"
    );

    let added = issuers.reloadable(&[LATER_AUDIENCE]).to_string();
    replace(&s.config, &added);
    let kubectl = s.kubectl(&later);
    let reloaded = harness::wait_until(Duration::from_secs(20), || async {
        whoami(&kubectl).await.as_ref() == Ok(&alice)
    })
    .await;
    assert!(reloaded, "the added audience never worked:\n{}", s.s.logs());
    let metrics = s.metrics().await;
    let hash = format!("sha256:{}", hex::encode(Sha256::digest(added.as_bytes())));
    let info = metric(
        &metrics,
        "apiserver_authentication_config_controller_last_config_info{",
    );
    assert!(
        info.iter().any(|l| l.contains(&hash)),
        "{info:?}, want hash {hash}"
    );

    let lines_before = s.s.gateway.process.line_count();
    replace(&s.config, &broken());
    let refused =
        s.s.gateway
            .process
            .wait_for_line_from(
                lines_before,
                None,
                |l| l.contains(REFUSED),
                Duration::from_secs(20),
            )
            .await;
    assert!(refused.is_some(), "no {REFUSED:?} line:\n{}", s.s.logs());
    // The last good configuration stays: both audiences work.
    assert_eq!(whoami(&s.kubectl(&later)).await, Ok(alice.clone()));
    assert_eq!(whoami(&s.kubectl(&now)).await, Ok(alice));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let logged = s.s.gateway.process.lines()[lines_before..]
        .iter()
        .filter(|l| l.text.contains(REFUSED))
        .count();
    assert_eq!(
        logged,
        1,
        "{REFUSED:?} lines for one broken file:\n{}",
        s.s.logs()
    );
    let reloads = metric(
        &s.metrics().await,
        "apiserver_authentication_config_controller_automatic_reloads_total{",
    );
    let count = |status: &str| {
        reloads
            .iter()
            .find(|l| l.contains(&format!("status=\"{status}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(
        (count("success"), count("failure")),
        (Some(1.0), Some(1.0)),
        "{reloads:?}"
    );
}
