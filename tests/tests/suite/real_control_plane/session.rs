//! The processes of the session: the control plane, sample-apiserver, and the gateways in front
//! of kube-apiserver, with kubectl and raw clients for both sides.

use std::time::Duration;

use e2e::harness::{
    get, http1_client, http2_client, wait_until, Gateway, HttpClient, Kubectl, KubectlVersion,
};
use e2e::real::pki::{ADMIN_TOKEN, ALICE_TOKEN};
use e2e::real::sample_apiserver::WARDLE_GROUP;
use e2e::real::{ControlPlane, RealBinaries, SampleApiserver};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;

/// The accept header of aggregated discovery v2.
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The accept header of aggregated discovery v2beta1.
pub const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// Everything of the session.
pub struct Real {
    pub plane: ControlPlane,
    pub sample: SampleApiserver,
    /// The gateway with the `file` source and a static `services:` entry for `wardle/api`, and
    /// its own authorization turned off, so sample-apiserver makes every decision itself.
    pub file_gateway: Gateway,
    /// The gateway watching APIServices on kube-apiserver (the default source), probing every 5 s.
    pub gateway: Gateway,
}

impl Real {
    /// Starts the control plane, sample-apiserver and both gateways.
    pub async fn start(binaries: &RealBinaries) -> Real {
        let plane = ControlPlane::start(binaries)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sample = SampleApiserver::start(&plane, binaries)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let file_gateway = start_file_gateway(&plane, &sample).await;
        let gateway = Gateway::start(
            plane
                .gateway_options()
                .args(["--apiservice-availability-interval", "5s"]),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        Real {
            plane,
            sample,
            file_gateway,
            gateway,
        }
    }

    /// Registers `v1alpha1.wardle.example.com` on kube-apiserver and waits until both
    /// kube-apiserver's aggregator and the (kube source) gateway serve flunders.
    pub async fn register_wardle(&self) {
        self.plane
            .admin()
            .apply_yaml(&self.sample.apiservice_yaml(&self.plane))
            .await;
        let direct = self.direct_client();
        let through = self.gateway_client();
        let url = |base: &str| format!("{base}/apis/{WARDLE_GROUP}/v1alpha1/flunders");
        let served = wait_until(Duration::from_secs(60), || async {
            self.status_of(&direct, &url(&self.plane.url)).await == StatusCode::OK
                && self.status_of(&through, &url(&self.gateway.url())).await == StatusCode::OK
                && self
                    .wardle_in_discovery(&through, &self.gateway.url())
                    .await
                && self.wardle_in_discovery(&direct, &self.plane.url).await
        })
        .await;
        assert!(
            served,
            "flunders were not served by kube-apiserver and the gateway within 60 s of \
             registering the APIService"
        );
    }

    async fn status_of(&self, client: &HttpClient, url: &str) -> StatusCode {
        let request = self.admin_request(url, "application/json");
        match e2e::harness::send(client, request).await {
            Ok((status, _, _)) => status,
            Err(_) => StatusCode::BAD_GATEWAY,
        }
    }

    async fn wardle_in_discovery(&self, client: &HttpClient, base: &str) -> bool {
        let request = self.admin_request(&format!("{base}/apis"), AGGREGATED_V2);
        let Ok((StatusCode::OK, _, body)) = e2e::harness::send(client, request).await else {
            return false;
        };
        String::from_utf8_lossy(&body).contains(WARDLE_GROUP)
    }

    /// A GET as `admin` (bearer token) with `accept`.
    pub fn admin_request(&self, url: &str, accept: &str) -> Request<Full<bytes::Bytes>> {
        Request::get(url)
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("accept", accept)
            .body(Full::default())
            .unwrap()
    }

    /// `GET path` as admin with `accept`, from kube-apiserver directly and through the gateway:
    /// (direct, gateway), each (status, body).
    pub async fn both(
        &self,
        path: &str,
        accept: &str,
    ) -> ((StatusCode, Value), (StatusCode, Value)) {
        let direct = self
            .fetch(
                &self.direct_client(),
                &format!("{}{path}", self.plane.url),
                accept,
            )
            .await;
        let through = self
            .fetch(
                &self.gateway_client(),
                &format!("{}{path}", self.gateway.url()),
                accept,
            )
            .await;
        (direct, through)
    }

    /// `GET url` as admin: status and body as JSON (`Null` when not JSON).
    pub async fn fetch(&self, client: &HttpClient, url: &str, accept: &str) -> (StatusCode, Value) {
        let (status, _, body) = e2e::harness::send(client, self.admin_request(url, accept))
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// HTTP/1.1 to kube-apiserver, trusting its CA (credentials go in each request).
    pub fn direct_client(&self) -> HttpClient {
        http1_client(self.plane.pki.cluster_ca.cert_pem(), None).unwrap()
    }

    /// HTTP/1.1 to the gateway, trusting its serving certificate.
    pub fn gateway_client(&self) -> HttpClient {
        self.gateway.http1_client(None)
    }

    /// HTTP/2 to kube-apiserver and to the gateway.
    pub fn h2_clients(&self) -> (HttpClient, HttpClient) {
        (
            http2_client(self.plane.pki.cluster_ca.cert_pem(), None).unwrap(),
            self.gateway.http2_client(None),
        )
    }

    /// kubectl through the (kube source) gateway with `token`.
    pub fn through_gateway(&self, token: &str) -> Kubectl {
        kubectl_for(&self.gateway, token)
    }

    /// kubectl as admin through the gateway and straight to kube-apiserver: (direct, gateway).
    pub fn admins(&self) -> (Kubectl, Kubectl) {
        (self.plane.admin(), self.through_gateway(ADMIN_TOKEN))
    }

    /// kubectl as the unprivileged `alice` straight to kube-apiserver.
    pub fn alice_direct(&self) -> Kubectl {
        self.plane.kubectl(ALICE_TOKEN)
    }

    /// The gateways' logs and the last lines of the other processes, for a failed session.
    pub fn logs(&self) -> String {
        let tail = |logs: String| {
            let lines: Vec<&str> = logs.lines().collect();
            lines[lines.len().saturating_sub(80)..].join("\n")
        };
        format!(
            "{}\n{}\n{}\n{}\n{}",
            tail(self.plane.kube_apiserver.logs()),
            tail(self.sample.process.logs()),
            tail(self.file_gateway.process.logs()),
            tail(self.gateway.process.logs()),
            tail(self.plane.etcd.logs()),
        )
    }

    /// Whether the gateway's `/readyz` passes (for checks that start more gateways).
    #[allow(dead_code)]
    pub async fn gateway_ready(&self, gateway: &Gateway) -> bool {
        let client = gateway.http1_client(None);
        matches!(
            get(&client, &format!("{}/readyz", gateway.url())).await,
            Ok((StatusCode::OK, _, _))
        )
    }
}

/// A kubectl session through `gateway` with a bearer token.
pub fn kubectl_for(gateway: &Gateway, token: &str) -> Kubectl {
    Kubectl::for_release(
        &gateway.url(),
        Some(&gateway.ca_file),
        KubectlVersion::default(),
    )
    .and_then(|k| k.with_token(token))
    .unwrap()
}

async fn start_file_gateway(plane: &ControlPlane, sample: &SampleApiserver) -> Gateway {
    let dir = plane.pki.dir().join("file-apiservices");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("wardle.yaml"), sample.apiservice_yaml(plane)).unwrap();
    let config = plane.pki.write(
        "file-gateway.yaml",
        &format!(
            "services:\n- namespace: wardle\n  name: api\n  port: {}\n  urls: [\"{}\"]\n",
            sample.port,
            sample.url()
        ),
    );
    Gateway::start(
        plane
            .gateway_options()
            .config(config)
            .args(["--apiservice-source", "file", "--apiservice-dir"])
            .args([dir.display().to_string()])
            .args(["--authorization-webhook=false"]),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}
