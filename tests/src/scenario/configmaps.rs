//! ConfigMaps through the gateway: creating them and watching them.

use super::*;

/// A ConfigMap `name` with one key, as a request body.
fn configmap(name: &str) -> Full<Bytes> {
    Full::new(Bytes::from(
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
            .to_string(),
    ))
}

/// Creates ConfigMap `name` in `default` through the gateway; the status it got.
pub async fn create_configmap(client: &HttpClient, gateway: &Gateway, name: &str) -> StatusCode {
    harness::send(
        client,
        Request::post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            gateway.url()
        ))
        .header("content-type", "application/json")
        .body(configmap(name))
        .unwrap(),
    )
    .await
    .unwrap()
    .0
}

/// Opens a watch on the ConfigMaps of `default` through the gateway and returns a channel of the
/// raw chunks it streams.
pub async fn watch_configmaps(
    client: &HttpClient,
    gateway: &Gateway,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let resp = harness::send_streaming(
        client,
        Request::get(format!(
            "{}/api/v1/namespaces/default/configmaps?watch=1",
            gateway.url()
        ))
        .body(Full::new(Bytes::new()))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut body = resp.into_body();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx
                    .send(String::from_utf8_lossy(&data).into_owned())
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    rx
}

/// Waits up to 5 s for an event about object `name` on a [`watch_configmaps`] channel.
pub async fn expect_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = String::new();
    while std::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            Ok(Some(chunk)) => {
                seen.push_str(&chunk);
                if seen.contains(&format!("\"name\":\"{name}\"")) {
                    return;
                }
            }
            Ok(None) => panic!("the watch ended; saw {seen:?}"),
            Err(_) => {}
        }
    }
    panic!("no event for {name} on the watch; saw {seen:?}");
}
