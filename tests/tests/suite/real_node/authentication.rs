//! Structured authentication installed by the chart (`authentication.config`), on the real node:
//! the gateway's Pods read the mounted file, verify the cluster's own ServiceAccount tokens as
//! JWTs of the service-account issuer (discovery and JWKS from kube-apiserver, over TLS verified
//! with the cluster CA, reached through cluster DNS and the `kubernetes` Service), and take a
//! changed ConfigMap without a Pod roll.
//!
//! The issuer here is the cluster's service-account issuer because it is the one OIDC issuer a
//! one-node cluster has; kube-apiserver itself refuses that overlap in its own file, the gateway
//! cannot see the core's issuers (the closing note of issue 44 says so).

use std::time::Duration;

use e2e::harness::wait_until;
use serde_json::Value;

use super::day2::rollout_status;
use super::shapes::{pod_report, Installed, NAMESPACE, RELEASE};

/// The node's `--service-account-issuer`.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const AUDIENCE: &str = "gateway-e2e";

fn values(ca_pem: &str, prefix: &str) -> String {
    let ca: String = ca_pem
        .lines()
        .map(|l| format!("            {l}\n"))
        .collect();
    format!(
        "authentication:\n  config:\n    jwt:\n      - issuer:\n          url: {ISSUER}\n          \
         audiences: [{AUDIENCE}]\n          certificateAuthority: |\n{ca}        claimMappings:\n          \
         username: {{claim: sub, prefix: \"{prefix}\"}}\n"
    )
}

/// The gateway Pods' UIDs, to tell a roll from a reload.
async fn pod_uids(installed: &Installed<'_>) -> String {
    installed
        .pods_jsonpath(&[], "{.items[*].metadata.uid}")
        .await
}

/// The username `kubectl auth whoami` shows through the gateway, or what kubectl said instead.
async fn whoami(installed: &Installed<'_>, token: &str) -> Result<String, String> {
    let kubectl =
        (installed.kubectl.clone_session().with_token(token)).map_err(|e| e.to_string())?;
    let out = kubectl.run(&["auth", "whoami", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&out.stdout).map_err(|_| out.to_string())?;
    v["status"]["userInfo"]["username"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| out.stdout.clone())
}

/// What the gateway Pods logged about the authentication file and its issuers.
async fn authentication_lines(admin: &e2e::harness::Kubectl) -> String {
    let logs = admin
        .run(&[
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "--tail=-1",
            "--prefix",
        ])
        .await;
    logs.stdout
        .lines()
        .filter(|l| l.contains("JWT") || l.contains("authentication config"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn service_account_tokens_verified_as_jwts_and_reloaded(installed: &Installed<'_>) {
    let node = installed.node;
    let admin = node.cluster.admin();
    // The issuer's discovery and keys are for anyone, as kube's docs suggest for OIDC peers.
    admin
        .run_ok(&[
            "create",
            "clusterrolebinding",
            "e2e-issuer-discovery",
            "--clusterrole=system:service-account-issuer-discovery",
            "--group=system:unauthenticated",
        ])
        .await;
    let ca = std::fs::read_to_string(&node.cluster.pki.cluster_ca_file).expect("cluster CA");
    let first = node.values_file("authentication-jwt", &values(&ca, "jwt:"));
    installed.upgrade(&["-f", &first.display().to_string()]);
    rollout_status(&admin).await;
    let token = admin
        .run_ok(&[
            "create",
            "token",
            "e2e-admin",
            "-n",
            NAMESPACE,
            "--audience",
            AUDIENCE,
        ])
        .await
        .stdout
        .trim()
        .to_owned();
    let want = format!("jwt:system:serviceaccount:{NAMESPACE}:e2e-admin");
    let seen = std::sync::Mutex::new(Err::<String, String>(String::new()));
    let verified = wait_until(Duration::from_secs(60), || async {
        let got = whoami(installed, &token).await;
        let done = got.as_deref() == Ok(want.as_str());
        *seen.lock().unwrap() = got;
        done
    })
    .await;
    if !verified {
        let said = seen.lock().unwrap().clone();
        panic!(
            "a ServiceAccount token of audience {AUDIENCE} is verified by the gateway as a JWT of \
             {ISSUER} and mapped to {want:?}; whoami said {said:?}\nthe gateway's \
             authentication lines:\n{}\n{}",
            authentication_lines(&admin).await,
            pod_report(&admin).await
        );
    }

    // A changed ConfigMap: the file is reloaded in the running Pods.
    let before = pod_uids(installed).await;
    let second = node.values_file("authentication-jwt2", &values(&ca, "jwt2:"));
    installed.upgrade(&["-f", &second.display().to_string()]);
    let want = format!("jwt2:system:serviceaccount:{NAMESPACE}:e2e-admin");
    // The kubelet refreshes a ConfigMap volume within about a minute; the gateway then reloads.
    let reloaded = wait_until(Duration::from_secs(150), || async {
        let got = whoami(installed, &token).await;
        let done = got.as_deref() == Ok(want.as_str());
        *seen.lock().unwrap() = got;
        done
    })
    .await;
    let after = pod_uids(installed).await;
    if !reloaded {
        let said = seen.lock().unwrap().clone();
        panic!(
            "the changed mapping ({want:?}) is in force; whoami said {said:?}\n{}",
            pod_report(&admin).await
        );
    }
    assert_eq!(before, after, "the reload rolled no Pod");

    // Back to the shape's values for the checks that follow.
    installed.upgrade(&["--set", "authentication.config=null"]);
    rollout_status(&admin).await;
    let _ = admin
        .run(&["delete", "clusterrolebinding", "e2e-issuer-discovery"])
        .await;
    eprintln!("real node: a ServiceAccount token verified as a JWT through the chart's file, and the file reloaded without a roll");
}
