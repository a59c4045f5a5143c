//! The fixture session: a core serving TLS that believes `X-Remote-*` from the gateway's proxy
//! certificate only (CN `aggregator`, as kube-apiserver's `--requestheader-allowed-names`), and
//! the gateway in front of it with `--authentication-config`.

use std::path::PathBuf;

use e2e::certs::TestCa;
use e2e::harness::{self, HttpClient, Kubectl, KubectlVersion};
use e2e::scenario::{path_arg, Scenario};
use serde_json::Value;

pub struct Session {
    pub s: Scenario,
    /// The `--authentication-config` file.
    pub config: PathBuf,
    core_client: HttpClient,
}

impl Session {
    pub async fn start(config: &Value) -> Session {
        let builder = Scenario::builder();
        let pki = builder.pki();
        let core_ca = TestCa::new("core-serving-ca");
        let (cert, key) = core_ca
            .issue_server(&["127.0.0.1"])
            .write(pki.dir(), "core-serving")
            .unwrap();
        let core_ca_file = core_ca.write(pki.dir(), "core-serving-ca.crt").unwrap();
        let file = pki.write("authentication-config.json", &config.to_string());
        let core_args = [
            "--tls-cert-file".to_owned(),
            path_arg(&cert),
            "--tls-private-key-file".to_owned(),
            path_arg(&key),
            "--client-ca-file".to_owned(),
            path_arg(&pki.proxy_ca_file),
            "--requestheader-allowed-names".to_owned(),
            "aggregator".to_owned(),
        ];
        let gateway_args = [
            "--apiservice-source".to_owned(),
            "none".to_owned(),
            "--core-ca-file".to_owned(),
            path_arg(&core_ca_file),
            "--authentication-config".to_owned(),
            path_arg(&file),
        ];
        let core_args: Vec<&str> = core_args.iter().map(String::as_str).collect();
        let gateway_args: Vec<&str> = gateway_args.iter().map(String::as_str).collect();
        let s = builder
            .core_args(&core_args)
            .gateway_args(&gateway_args)
            .start()
            .await;
        Session {
            s,
            config: file,
            core_client: harness::http1_client(core_ca.cert_pem(), None).unwrap(),
        }
    }

    /// kubectl 1.33 through the gateway with `token`.
    pub fn kubectl(&self, token: &str) -> Kubectl {
        let g = &self.s.gateway;
        Kubectl::new(&g.url(), Some(&g.ca_file), KubectlVersion::V1_33)
            .and_then(|k| k.with_token(token))
            .expect("a kubectl session")
    }

    async fn core_requests(&self) -> Vec<Value> {
        let url = format!("{}/fixture/requests", self.s.core.url());
        let (_, _, body) = harness::get(&self.core_client, &url).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// TokenReviews the core got since the last [`Session::clear_core_requests`].
    pub async fn token_reviews(&self) -> usize {
        let requests = self.core_requests().await;
        let review = |r: &&Value| {
            r["method"] == "POST"
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.contains("/tokenreviews"))
        };
        requests.iter().filter(review).count()
    }

    pub async fn clear_core_requests(&self) {
        let url = format!("{}/fixture/requests", self.s.core.url());
        let req = http::Request::delete(url)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        harness::send(&self.core_client, req).await.unwrap();
    }

    /// `/metrics` of the gateway, read with the default token (anonymous is limited by path).
    pub async fn metrics(&self) -> String {
        let g = &self.s.gateway;
        let req = http::Request::get(format!("{}/metrics", g.url()))
            .header(
                "authorization",
                format!("Bearer {}", harness::DEFAULT_TOKEN),
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let (status, _, body) = harness::send(&g.http1_client(None), req).await.unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8_lossy(&body).into_owned()
    }
}
