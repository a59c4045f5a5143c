//! The oracle of structured authentication: kube-apiserver started with the same
//! `--authentication-config` as the gateway in front of it (passthrough: JWT users reach it as
//! `X-Remote-*` over the gateway's front-proxy certificate, with `--requestheader-uid-headers`
//! so UIDs come along). For every row of the token table (`structured_authentication::table`),
//! `kubectl auth whoami -o json` (the release's kubectl) and a raw SelfSubjectReview's status
//! must be the same straight to kube-apiserver and through the gateway; kube's own answer is
//! also checked against the identity the table spells, so a wrong expectation shows as such.
//!
//! Its own test, not a check of the session (it needs kube-apiserver started with other flags):
//! `cargo test -p e2e --test suite structured_authentication_matches_kube_apiserver`.

use std::time::Duration;

use e2e::harness::{self, Gateway, HttpClient, Kubectl, KubectlVersion};
use e2e::oidc::Rotation;
use e2e::real::pki::ALICE_TOKEN;
use e2e::real::{ControlPlane, RealBinaries};
use serde_json::Value;

use crate::structured_authentication::issuers::{Issuers, AUDIENCE};
use crate::structured_authentication::table::{claims_token, rows, Row};
use crate::structured_authentication::{raw_review, wait_for_issuers, whoami};

/// What one server answered for a token: kubectl's identity (or error) and the raw status.
#[derive(Debug)]
struct Answer {
    identity: Result<Value, String>,
    status: u16,
}

struct Target {
    url: String,
    ca_file: std::path::PathBuf,
    client: HttpClient,
}

impl Target {
    fn kubectl(&self, token: &str) -> Kubectl {
        Kubectl::for_release(&self.url, Some(&self.ca_file), KubectlVersion::default())
            .and_then(|k| k.with_token(token))
            .expect("a kubectl session")
    }

    async fn answer(&self, token: &str) -> Answer {
        let identity = whoami(&self.kubectl(token)).await;
        let (status, _) = raw_review(&self.client, &self.url, Some(token)).await;
        Answer {
            identity,
            status: status.as_u16(),
        }
    }
}

/// Compares one row: kube against the table, the gateway against kube.
async fn compare(kube: &Target, gateway: &Target, row: &Row) -> Result<(), String> {
    let k = kube.answer(&row.token).await;
    let g = gateway.answer(&row.token).await;
    let mut problems = Vec::new();
    match (&row.expect, &k.identity) {
        (Some(want), Ok(got)) if want == got => {}
        (None, Err(_)) if k.status == 401 => {}
        _ => problems.push(format!("kube-apiserver disagrees with the table: {k:?}")),
    }
    if k.status != g.status {
        problems.push(format!("status: kube {} gateway {}", k.status, g.status));
    }
    match (&k.identity, &g.identity) {
        (Ok(a), Ok(b)) if a == b => {}
        (Err(_), Err(_)) => {}
        (a, b) => problems.push(format!("identity: kube {a:?} gateway {b:?}")),
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("; ")),
    }
}

async fn start(
    binaries: &RealBinaries,
    dir: &std::path::Path,
    issuers: &Issuers,
) -> (ControlPlane, Gateway) {
    let file = dir.join("authentication-config.json");
    std::fs::write(&file, issuers.config(&[]).to_string()).unwrap();
    let file = file.display().to_string();
    let flags = [
        "--authentication-config",
        &file,
        "--requestheader-uid-headers",
        "X-Remote-Uid",
    ];
    let plane = ControlPlane::start_with(binaries, &flags.map(String::from))
        .await
        .expect("kube-apiserver starts with the authentication config");
    let options = plane.gateway_options().args([
        "--authentication-config",
        &file,
        "--apiservice-source",
        "none",
    ]);
    let gateway = Gateway::start(options).await.expect("the gateway starts");
    (plane, gateway)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_authentication_matches_kube_apiserver() {
    let test = "structured_authentication_matches_kube_apiserver";
    let Some(binaries) = RealBinaries::or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // kube fetches discovery at start (then every 10 s until it works): issuers first.
    let issuers = Issuers::start().await;
    let (plane, gateway) = start(&binaries, dir.path(), &issuers).await;
    let kube = Target {
        url: plane.url.clone(),
        ca_file: plane.pki.cluster_ca_file.clone(),
        client: harness::http1_client(plane.pki.cluster_ca.cert_pem(), None).unwrap(),
    };
    let through = Target {
        url: gateway.url(),
        ca_file: gateway.ca_file.clone(),
        client: gateway.http2_client(None),
    };
    wait_for_issuers(&issuers, |t| kube.kubectl(t)).await;
    wait_for_issuers(&issuers, |t| through.kubectl(t)).await;

    let mut table = rows(&issuers);
    table.push(Row {
        name: "a token-file token (not a JWT)".into(),
        token: ALICE_TOKEN.into(),
        expect: Some(serde_json::json!({"username": "alice", "uid": "alice-uid",
                                         "groups": ["system:authenticated"]})),
    });
    let mut failed = Vec::new();
    for row in &table {
        match compare(&kube, &through, row).await {
            Ok(()) => eprintln!("same {}", row.name),
            Err(why) => failed.push(format!("{}: {why}", row.name)),
        }
    }
    failed.extend(rotation(&issuers, &kube, &through).await);
    failed.extend(anonymous(&kube, &through).await);
    assert!(
        failed.is_empty(),
        "{} of {} rows differ:\n{}\n--- gateway ---\n{}",
        failed.len(),
        table.len() + 3,
        failed.join("\n"),
        gateway.process.logs()
    );
}

/// After a rotation (replacing the keys), a new kid works on both; a token of the old key, never
/// presented before, is refused by both.
async fn rotation(issuers: &Issuers, kube: &Target, gateway: &Target) -> Vec<String> {
    let (unseen_old, alice) = claims_token(issuers, "RS256", AUDIENCE);
    // Past the gateway's refetch interval since the table's unknown-kid row.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    issuers.claims.rotate(Rotation::Replace);
    let (new, _) = claims_token(issuers, "ES256", AUDIENCE);
    let mut failed = Vec::new();
    for (name, token, expect) in [
        ("new kid after rotation", new, Some(alice)),
        ("old key after rotation", unseen_old, None),
    ] {
        let row = Row {
            name: name.into(),
            token,
            expect,
        };
        if let Err(why) = compare(kube, gateway, &row).await {
            failed.push(format!("{name}: {why}"));
        } else {
            eprintln!("same {name}");
        }
    }
    failed
}

/// Anonymous requests: allowed on the configured paths only, by both.
async fn anonymous(kube: &Target, gateway: &Target) -> Vec<String> {
    let mut failed = Vec::new();
    for path in [
        "/version",
        "/livez",
        "/api",
        "/apis/authentication.k8s.io/v1",
    ] {
        let status = |t: &Target| {
            let url = format!("{}{path}", t.url);
            let client = t.client.clone();
            async move { harness::get(&client, &url).await.map(|a| a.0.as_u16()) }
        };
        let (k, g) = (status(kube).await, status(gateway).await);
        match (&k, &g) {
            (Ok(k), Ok(g)) if k == g => eprintln!("same anonymous GET {path} ({k})"),
            _ => failed.push(format!("anonymous GET {path}: kube {k:?} gateway {g:?}")),
        }
    }
    failed
}
