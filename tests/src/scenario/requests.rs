//! Requests as a user: kubectl sessions, HTTP/2 GETs, and waiting for what kubectl shows.

use super::*;

/// A kubectl session of `version` against the gateway as `user`.
pub fn kubectl_as(gateway: &Gateway, version: KubectlVersion, user: &CertifiedPair) -> Kubectl {
    Kubectl::new(&gateway.url(), Some(&gateway.ca_file), version)
        .unwrap()
        .with_client_pair(user)
        .unwrap()
}

/// GET `path` through the gateway over HTTP/2 with `headers`, as `user` or anonymously.
pub async fn try_get(
    gateway: &Gateway,
    user: Option<&CertifiedPair>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let client = harness::http2_client(&gateway.ca_pem()?, user)?;
    let mut req = Request::get(format!("{}{path}", gateway.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    harness::send(&client, req.body(Full::new(Bytes::new())).unwrap()).await
}

/// [`try_get`] as `user`, which must get an answer.
pub async fn get_raw(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    try_get(gateway, Some(user), path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// [`get_raw`] with the body as JSON (`null` if it is not).
pub async fn get_as(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let (status, _, body) = get_raw(gateway, user, path, headers).await;
    (status, json_or_null(&body))
}

/// Whether GET `path` as `user` answers 200 with a `kind` (e.g. `FlunderList`) within `timeout`.
pub async fn serves(
    gateway: &Gateway,
    user: &CertifiedPair,
    path: &str,
    kind: &str,
    timeout: Duration,
) -> bool {
    harness::wait_until(timeout, || async {
        let (status, body) = get_as(gateway, user, path, &[]).await;
        status == StatusCode::OK && body["kind"] == kind
    })
    .await
}

/// `/metrics`, fetched anonymously over HTTP/1.1.
pub async fn metrics(gateway: &Gateway) -> String {
    let client = gateway.http1_client(None);
    let (status, _, body) = harness::get(&client, &format!("{}/metrics", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).into_owned()
}

/// `body` as JSON, or `null` if it is not.
pub fn json_or_null(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Polls `kubectl get apiservices` until the row for APIService `name` contains `wanted`, and
/// returns the table; fails after `timeout`.
pub async fn wait_for_apiservice_row(
    kubectl: &Kubectl,
    name: &str,
    wanted: &str,
    timeout: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let out = kubectl.run(&["get", "apiservices"]).await;
        if out
            .stdout
            .lines()
            .any(|l| l.starts_with(name) && l.contains(wanted))
        {
            return out.stdout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {wanted:?} for {name} in:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
