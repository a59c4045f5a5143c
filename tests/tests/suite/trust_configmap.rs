//! `kube-system/extension-apiserver-authentication` on the core, kept by the gateway as
//! kube-apiserver's cluster-authentication-trust controller keeps it: the gateway's client CA,
//! its proxy client certificate's CA and name, and the `X-Remote-*` headers are added to what
//! another writer put there, never replacing it, and follow certificate rotation.
//!
//! Every k8s.io/apiserver-based aggregated server reads that ConfigMap to decide whom to trust;
//! the real-control-plane suite shows sample-apiserver trusting a gateway kube-apiserver never
//! heard of. Here the fixture core stores the ConfigMap, so the rules are checked one by one.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::{certs_from_pem, TestCa};
use e2e::harness::{self, wait_until, FixtureCore, Gateway, GatewayOptions};
use e2e::scenario::{core_client, create_on_core, path_arg};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

const PATH: &str = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";

/// The ConfigMap's data on the core, or `None` while it does not exist.
async fn data(core: &FixtureCore) -> Option<Value> {
    let (status, _, body) = harness::get(&core_client(), &format!("{}{PATH}", core.url()))
        .await
        .unwrap();
    (status == StatusCode::OK)
        .then(|| serde_json::from_slice::<Value>(&body).unwrap()["data"].clone())
}

/// The DER of every certificate in the PEM bundle at `key`.
fn bundle(data: &Value, key: &str) -> Vec<Vec<u8>> {
    data[key]
        .as_str()
        .map(|pem| certs_from_pem(pem).unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.as_ref().to_vec())
        .collect()
}

fn der(ca: &TestCa) -> Vec<u8> {
    ca.cert_der().as_ref().to_vec()
}

fn list(data: &Value, key: &str) -> Vec<String> {
    data[key]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// What kube-apiserver would have written: its own client CA, front-proxy CA and proxy name.
fn kube_apiservers_data(client_ca: &TestCa, front_proxy_ca: &TestCa) -> Value {
    json!({
        "client-ca-file": client_ca.cert_pem(),
        "requestheader-client-ca-file": front_proxy_ca.cert_pem(),
        "requestheader-allowed-names": "[\"front-proxy-client\"]",
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
    })
}

async fn put_data(core: &FixtureCore, data: Value) {
    let (_, _, body) = harness::get(&core_client(), &format!("{}{PATH}", core.url()))
        .await
        .unwrap();
    let mut object: Value = serde_json::from_slice(&body).unwrap();
    object["data"] = data;
    let request = Request::put(format!("{}{PATH}", core.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .unwrap();
    let (status, _, body) = harness::send(&core_client(), request).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

/// The gateway's certificates: users' client CA, and a proxy client certificate (CN
/// `aggregation-gateway`) whose CA is `--proxy-client-ca-file`.
struct GatewayPki {
    dir: tempfile::TempDir,
    users_ca: TestCa,
    proxy_ca: TestCa,
}

impl GatewayPki {
    fn new() -> GatewayPki {
        let dir = tempfile::tempdir().unwrap();
        let pki = GatewayPki {
            users_ca: TestCa::new("gateway-users-ca"),
            proxy_ca: TestCa::new("gateway-proxy-ca"),
            dir,
        };
        pki.write_proxy(&pki.proxy_ca);
        pki.users_ca.write(pki.dir.path(), "users-ca.crt").unwrap();
        pki
    }

    /// Writes a proxy client certificate from `ca` and `ca` itself as the proxy CA file.
    fn write_proxy(&self, ca: &TestCa) {
        ca.issue_client("aggregation-gateway", &[])
            .write(self.dir.path(), "proxy")
            .unwrap();
        ca.write(self.dir.path(), "proxy-ca.crt").unwrap();
    }

    fn args(&self) -> Vec<String> {
        let at = |name: &str| path_arg(&self.dir.path().join(name));
        vec![
            "--apiservice-source".into(),
            "none".into(),
            "--client-ca-file".into(),
            at("users-ca.crt"),
            "--proxy-client-cert-file".into(),
            at("proxy.crt"),
            "--proxy-client-key-file".into(),
            at("proxy.key"),
            "--proxy-client-ca-file".into(),
            at("proxy-ca.crt"),
        ]
    }

    async fn start_gateway(&self, core: &FixtureCore, extra: &[&str]) -> Gateway {
        let args = self
            .args()
            .into_iter()
            .chain(extra.iter().map(|s| s.to_string()));
        Gateway::start(GatewayOptions::new(core.url()).args(args))
            .await
            .expect("gateway starts")
    }
}

/// Waits until the ConfigMap satisfies `check`; panics with its last data and the gateway's logs.
async fn wait_for(
    core: &FixtureCore,
    gateway: &Gateway,
    what: &str,
    check: impl Fn(&Value) -> bool,
) {
    let ok = wait_until(Duration::from_secs(10), || async {
        data(core).await.is_some_and(|d| check(&d))
    })
    .await;
    assert!(
        ok,
        "{what}; the ConfigMap holds {:?}\n{}",
        data(core).await,
        gateway.process.logs()
    );
}

#[tokio::test]
async fn another_writers_entries_stay_and_the_gateways_are_added() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let (kube_client_ca, kube_front_proxy_ca) = (TestCa::new("kube-ca"), TestCa::new("kube-fp"));
    let status = create_on_core(
        &core,
        "/api/v1/namespaces/kube-system/configmaps",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": kube_apiservers_data(&kube_client_ca, &kube_front_proxy_ca),
        }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let pki = GatewayPki::new();
    let gateway = pki.start_gateway(&core, &[]).await;

    let want_client = vec![der(&kube_client_ca), der(&pki.users_ca)];
    let want_proxy = vec![der(&kube_front_proxy_ca), der(&pki.proxy_ca)];
    wait_for(
        &core,
        &gateway,
        "kube-apiserver's entries first, the gateway's after",
        |d| {
            bundle(d, "client-ca-file") == want_client
                && bundle(d, "requestheader-client-ca-file") == want_proxy
                && list(d, "requestheader-allowed-names")
                    == ["front-proxy-client", "aggregation-gateway"]
        },
    )
    .await;
    let d = data(&core).await.unwrap();
    for (key, header) in [
        ("requestheader-username-headers", "X-Remote-User"),
        ("requestheader-group-headers", "X-Remote-Group"),
        ("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
    ] {
        assert_eq!(list(&d, key), [header], "{key} is not duplicated");
    }

    // Another writer puts back only its own entries (kube-apiserver restarting): the gateway's
    // come back, without waiting for the minute's resync.
    put_data(
        &core,
        kube_apiservers_data(&kube_client_ca, &kube_front_proxy_ca),
    )
    .await;
    wait_for(
        &core,
        &gateway,
        "the gateway's entries are back after another writer's update",
        |d| {
            bundle(d, "client-ca-file") == want_client
                && bundle(d, "requestheader-client-ca-file") == want_proxy
        },
    )
    .await;
}

#[tokio::test]
async fn a_core_without_the_configmap_gets_one_from_the_gateway() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let pki = GatewayPki::new();
    let gateway = pki.start_gateway(&core, &[]).await;
    wait_for(
        &core,
        &gateway,
        "a core that publishes nothing gets the gateway's trust",
        |d| {
            bundle(d, "client-ca-file") == vec![der(&pki.users_ca)]
                && bundle(d, "requestheader-client-ca-file") == vec![der(&pki.proxy_ca)]
                && list(d, "requestheader-allowed-names") == ["aggregation-gateway"]
                && list(d, "requestheader-username-headers") == ["X-Remote-User"]
        },
    )
    .await;
}

/// The gateway sends the caller's UID in `X-Remote-Uid`, so it publishes that name under
/// `requestheader-uid-headers`, the key k8s.io/apiserver 1.32+ reads for it (kube-apiserver
/// writes it from `--requestheader-uid-headers`). Without it a backend drops the UID unread.
/// Another writer's names stay, and the gateway's is added once.
#[tokio::test]
async fn the_uid_header_is_published_next_to_the_other_header_names() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let pki = GatewayPki::new();
    let gateway = pki.start_gateway(&core, &[]).await;
    wait_for(
        &core,
        &gateway,
        "requestheader-uid-headers names X-Remote-Uid",
        |d| list(d, "requestheader-uid-headers") == ["X-Remote-Uid"],
    )
    .await;

    let mut theirs = kube_apiservers_data(&TestCa::new("kube-ca"), &TestCa::new("kube-fp"));
    theirs["requestheader-uid-headers"] = json!(r#"["X-Remote-Uid","X-Other-Uid"]"#);
    put_data(&core, theirs).await;
    wait_for(
        &core,
        &gateway,
        "another writer's UID header names kept, ours not duplicated",
        |d| {
            list(d, "requestheader-uid-headers") == ["X-Remote-Uid", "X-Other-Uid"]
                && bundle(d, "requestheader-client-ca-file").contains(&der(&pki.proxy_ca))
        },
    )
    .await;
}

#[tokio::test]
async fn a_rotated_proxy_client_certificate_is_published_and_the_old_ca_kept() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let pki = GatewayPki::new();
    let gateway = pki.start_gateway(&core, &[]).await;
    wait_for(&core, &gateway, "the first proxy CA is published", |d| {
        bundle(d, "requestheader-client-ca-file") == vec![der(&pki.proxy_ca)]
    })
    .await;

    // Rotation to a new CA: connections already open with the old certificate stay valid until
    // they close, so the old CA must stay trusted too (a union, as upstream).
    let next_ca = TestCa::new("gateway-proxy-ca-2");
    pki.write_proxy(&next_ca);
    wait_for(
        &core,
        &gateway,
        "the new proxy CA is added after the old one",
        |d| bundle(d, "requestheader-client-ca-file") == vec![der(&pki.proxy_ca), der(&next_ca)],
    )
    .await;
}

#[tokio::test]
async fn the_flag_turns_it_off() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let pki = GatewayPki::new();
    let gateway = pki
        .start_gateway(
            &core,
            &["--manage-extension-apiserver-authentication=false"],
        )
        .await;
    // Long enough for the controller to have written (it writes within a second when on).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(data(&core).await, None, "{}", gateway.process.logs());
}

/// A core that refuses the gateway the ConfigMap (403 on every request but `/readyz`, as a
/// started core whose RBAC does not grant it would): the gateway retries with a growing delay
/// instead of at once, in a loop that kept a CPU busy and flooded the core with requests.
#[tokio::test]
async fn a_core_that_refuses_the_configmap_is_not_asked_in_a_tight_loop() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let core = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: Request<hyper::body::Incoming>| {
                        if req.uri().path().contains("/configmaps") {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        // Started: the gateway's watches wait for a ready core.
                        if req.uri().path() == "/readyz" {
                            let ok = http::Response::new(Full::new(Bytes::from_static(b"ok")));
                            return std::future::ready(Ok::<_, std::convert::Infallible>(ok));
                        }
                        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "Forbidden", "code": 403, "message": "forbidden"});
                        let resp = http::Response::builder()
                            .status(StatusCode::FORBIDDEN)
                            .header(http::header::CONTENT_TYPE, "application/json")
                            .body(Full::new(Bytes::from(status.to_string())))
                            .unwrap();
                        std::future::ready(Ok::<_, std::convert::Infallible>(resp))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let pki = GatewayPki::new();
    let gateway = Gateway::start(GatewayOptions::new(format!("http://{addr}")).args(pki.args()))
        .await
        .expect("gateway starts");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = asked.load(Ordering::Relaxed);
    core.abort();
    // A list and a watch at start, then retries with backoff: a handful. Without a backoff the
    // gateway asked thousands of times in these seconds.
    assert!(
        (1..=30).contains(&asked),
        "the gateway asked the core for the ConfigMap {asked} times in 3 s\n{}",
        gateway.process.logs()
    );
}
