//! sample-apiserver trusting a gateway kube-apiserver never heard of: a proxy client certificate
//! from a CA of the gateway's own. k8s.io/apiserver-based servers believe `X-Remote-*` identity
//! only from a certificate `kube-system/extension-apiserver-authentication` names; with
//! `--manage-extension-apiserver-authentication` the gateway adds its CA there (beside
//! kube-apiserver's own), and sample-apiserver picks it up while running.

use std::time::Duration;

use e2e::certs::TestCa;
use e2e::harness::Gateway;
use e2e::real::pki::GATEWAY_PROXY_CN;
use e2e::real::sample_apiserver::WARDLE_GROUP;
use e2e::scenario::path_arg;
use http::StatusCode;

use super::session::Real;

/// Starts a file-source gateway presenting a proxy client certificate from `ca`, with the trust
/// controller on or off.
async fn gateway_with_own_ca(real: &Real, ca: &TestCa, manage: bool) -> Gateway {
    let dir = real.plane.pki.dir().join(format!("own-ca-{manage}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = ca
        .issue_client(GATEWAY_PROXY_CN, &[])
        .write(&dir, "proxy")
        .unwrap();
    let ca_file = ca.write(&dir, "proxy-ca.crt").unwrap();
    let manifests = dir.join("apiservices");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("wardle.yaml"),
        real.sample.apiservice_yaml(&real.plane),
    )
    .unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "services:\n- namespace: wardle\n  name: api\n  port: {}\n  urls: [\"{}\"]\n",
            real.sample.port,
            real.sample.url()
        ),
    )
    .unwrap();
    // The session's flags without its proxy pair (a flag may be given once), then this gateway's.
    let mut options = real.plane.gateway_options();
    let keep: Vec<String> = options
        .args
        .chunks(2)
        .filter(|pair| !pair[0].starts_with("--proxy-client-"))
        .flatten()
        .cloned()
        .collect();
    options.args = keep;
    Gateway::start(options.config(config).args([
        "--apiservice-source".to_owned(),
        "file".to_owned(),
        "--apiservice-dir".to_owned(),
        path_arg(&manifests),
        "--proxy-client-cert-file".to_owned(),
        path_arg(&cert),
        "--proxy-client-key-file".to_owned(),
        path_arg(&key),
        "--proxy-client-ca-file".to_owned(),
        path_arg(&ca_file),
        format!("--manage-extension-apiserver-authentication={manage}"),
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Status and body of listing flunders through `gateway` as admin.
async fn list_flunders(real: &Real, gateway: &Gateway) -> (StatusCode, String) {
    let client = gateway.http1_client(None);
    let url = format!("{}/apis/{WARDLE_GROUP}/v1alpha1/flunders", gateway.url());
    match e2e::harness::send(&client, real.admin_request(&url, "application/json")).await {
        Ok((status, _, body)) => (status, String::from_utf8_lossy(&body).into_owned()),
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

/// Lists flunders through `gateway` until the answer is `want` or `timeout` passes: whether it
/// came, and the last answer.
async fn answers_within(
    real: &Real,
    gateway: &Gateway,
    want: StatusCode,
    timeout: Duration,
) -> (bool, (StatusCode, String)) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = list_flunders(real, gateway).await;
        if last.0 == want {
            return (true, last);
        }
        if std::time::Instant::now() >= deadline {
            return (false, last);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn sample_apiserver_trusts_a_gateway_kube_never_heard_of(real: &Real) {
    let ca = TestCa::new("gateway-own-proxy-ca");

    // Without the controller sample-apiserver refuses the gateway's certificate: 401 to its
    // availability probes (so the gateway answers 503 naming that 401) and to every request.
    let off = gateway_with_own_ca(real, &ca, false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refused = list_flunders(real, &off).await;
    assert!(
        refused.0 != StatusCode::OK && refused.1.contains("401"),
        "with the trust controller off, sample-apiserver must refuse the gateway's certificate: \
         {refused:?}"
    );
    drop(off);

    let on = gateway_with_own_ca(real, &ca, true).await;
    let (trusted, last) = answers_within(real, &on, StatusCode::OK, Duration::from_secs(60)).await;
    assert!(
        trusted,
        "sample-apiserver never trusted the gateway's own proxy CA (last answer {last:?}):\n{}",
        on.process.logs()
    );
    // kube-apiserver's own entries are still there: its aggregator still reaches sample-apiserver.
    let kube = real
        .plane
        .admin()
        .run(&["get", "flunders", "-n", "default"])
        .await;
    assert!(
        kube.success(),
        "kube-apiserver's aggregator lost its trust:\n{kube}"
    );
}
