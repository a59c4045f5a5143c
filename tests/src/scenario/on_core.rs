//! The core fixture, directly: creating objects on it, reading what it recorded, and APIService conditions.

use super::*;

/// A plain-HTTP client for the fixture core.
pub fn core_client() -> HttpClient {
    harness::http1_client(TestCa::new("unused").cert_pem(), None).unwrap()
}

/// POSTs a JSON object straight to the core fixture (what a cluster's controllers would create).
pub async fn create_on_core(core: &FixtureCore, path: &str, object: Value) -> StatusCode {
    let req = Request::post(format!("{}{path}", core.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .unwrap();
    harness::send(&core_client(), req).await.unwrap().0
}

/// Creates `object` at `path` on the core, asserts 201 (with the core's answer if not), and
/// returns the object as the core stored it (with its UID).
pub async fn created_on_core(core: &FixtureCore, path: &str, object: Value) -> Value {
    let req = Request::post(format!("{}{path}", core.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(object.to_string())))
        .unwrap();
    let (status, _, body) = harness::send(&core_client(), req).await.unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "POST {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).unwrap()
}

/// The requests the core recorded since the last [`clear_core_requests`], oldest first.
pub async fn core_requests(core: &FixtureCore) -> Vec<Value> {
    let (_, _, body) = harness::get(&core_client(), &format!("{}/fixture/requests", core.url()))
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// The values of header `name` (any case) in a request a fixture recorded
/// (`{"headers": [[name, value], ...]}`), in the order they came.
pub fn recorded_header(request: &Value, name: &str) -> Vec<String> {
    recorded_header_pairs(request)
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.to_owned())
        .collect()
}

/// The header names of a recorded request, as they were spelled.
pub fn recorded_header_names(request: &Value) -> Vec<String> {
    recorded_header_pairs(request)
        .map(|(n, _)| n.to_owned())
        .collect()
}

fn recorded_header_pairs(request: &Value) -> impl Iterator<Item = (&str, &str)> {
    request["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|pair| Some((pair[0].as_str()?, pair[1].as_str()?)))
}

/// The first request in `requests` (as [`core_requests`] returns them) whose path is `path`.
pub fn recorded<'a>(requests: &'a [Value], path: &str) -> &'a Value {
    requests
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("the core never saw {path}: {requests:?}"))
}

/// The recorded POSTs whose path contains `fragment` (e.g. `subjectaccessreviews`).
pub async fn core_posts(core: &FixtureCore, fragment: &str) -> Vec<Value> {
    core_requests(core)
        .await
        .into_iter()
        .filter(|r| {
            r["method"] == "POST" && r["path"].as_str().is_some_and(|p| p.contains(fragment))
        })
        .collect()
}

/// Forgets the requests the core recorded so far.
pub async fn clear_core_requests(core: &FixtureCore) {
    let req = Request::delete(format!("{}/fixture/requests", core.url()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    harness::send(&core_client(), req).await.unwrap();
}

/// The `Available` condition of APIService `name` as stored on the core (what `kubectl get
/// apiservices` shows): `(status, reason)`, or `None` while the APIService or its condition
/// does not exist.
pub async fn available_condition(core: &FixtureCore, name: &str) -> Option<(String, String)> {
    let url = format!(
        "{}/apis/apiregistration.k8s.io/v1/apiservices/{name}",
        core.url()
    );
    let (status, _, body) = harness::get(&core_client(), &url).await.ok()?;
    if status != StatusCode::OK {
        return None;
    }
    let api = json_or_null(&body);
    let condition = api["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")?;
    Some((
        condition["status"].as_str()?.to_owned(),
        condition["reason"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Service `wardle/api` on the core: a ClusterIP of 127.0.0.1 whose `https` port is `port`, as
/// the wardle backend listens on loopback.
pub async fn create_wardle_service(core: &FixtureCore, port: u16) {
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "api", "namespace": "wardle"},
        "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                 "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}]}
    });
    assert_eq!(
        create_on_core(core, "/api/v1/namespaces/wardle/services", service).await,
        StatusCode::CREATED
    );
}

/// EndpointSlice `name` of Service `wardle/api` on the core: 127.0.0.1 on `port`, `ready` or not.
pub async fn create_endpoint_slice(
    core: &FixtureCore,
    name: &str,
    port: u16,
    ready: bool,
) -> StatusCode {
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    create_on_core(
        core,
        "/apis/discovery.k8s.io/v1/namespaces/wardle/endpointslices",
        slice,
    )
    .await
}

impl Scenario {
    /// Registers wardle.example.com/v1alpha1 (Service `wardle/api`) on the core with `kubectl
    /// apply`, as a user does, and waits until the gateway has written `Available=True` there.
    pub async fn register_wardle_until_available(&self) {
        let api = self.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle");
        self.kubectl(&self.user("alice", &[]))
            .apply_yaml(&api.yaml())
            .await;
        let name = api.name();
        let available = harness::wait_until(std::time::Duration::from_secs(10), || async {
            available_condition(&self.core, &name).await == Some(("True".into(), "Passed".into()))
        })
        .await;
        assert!(available, "{name} never became Available\n{}", self.logs());
    }
}
