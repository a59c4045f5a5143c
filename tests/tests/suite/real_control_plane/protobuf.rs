//! Protobuf, as kube-controller-manager, the scheduler and every client-go client with
//! `ContentType: application/vnd.kubernetes.protobuf` speak it, on core resources the gateway only
//! passes through: the same bytes as from kube-apiserver, for a get, a list and a watch event.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::harness::{send, send_streaming, HttpClient};
use http::{header, StatusCode};
use http_body_util::BodyExt;

use super::session::Real;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const PROTOBUF_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";

async fn get_bytes(real: &Real, client: &HttpClient, url: &str) -> (StatusCode, String, Bytes) {
    let (status, headers, body) = send(client, real.admin_request(url, PROTOBUF))
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, content_type, body)
}

/// Opens a protobuf watch at `url`.
async fn open_watch(real: &Real, client: &HttpClient, url: &str) -> WatchStream {
    let response = send_streaming(client, real.admin_request(url, PROTOBUF_WATCH))
        .await
        .unwrap_or_else(|e| panic!("watch {url}: {e}"));
    assert_eq!(response.status(), StatusCode::OK, "watch {url}");
    WatchStream {
        content_type: response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        body: response.into_body(),
    }
}

struct WatchStream {
    content_type: String,
    body: hyper::body::Incoming,
}

impl WatchStream {
    /// The next frame: a 4-byte big-endian length and that many bytes of a `WatchEvent`.
    async fn frame(&mut self) -> Bytes {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buffer = Vec::new();
        loop {
            if buffer.len() >= 4 {
                let len = u32::from_be_bytes(buffer[..4].try_into().unwrap()) as usize;
                if buffer.len() >= 4 + len {
                    return Bytes::from(buffer[..4 + len].to_vec());
                }
            }
            let frame = tokio::time::timeout_at(deadline.into(), self.body.frame())
                .await
                .expect("a watch event within 15 s")
                .expect("the watch stays open")
                .expect("the watch body reads");
            if let Ok(data) = frame.into_data() {
                buffer.extend_from_slice(&data);
            }
        }
    }
}

pub async fn passes_unchanged(real: &Real) {
    let admin = real.plane.admin();
    admin
        .run_ok(&[
            "create",
            "configmap",
            "proto-check",
            "-n",
            "default",
            "--from-literal=a=1",
        ])
        .await;
    let (direct, through) = real.h2_clients();
    let object = "/api/v1/namespaces/default/configmaps/proto-check";
    let list = "/api/v1/namespaces/default/configmaps";
    for path in [object, list] {
        let want = get_bytes(real, &direct, &format!("{}{path}", real.plane.url)).await;
        let got = get_bytes(real, &through, &format!("{}{path}", real.gateway.url())).await;
        assert_eq!(want.0, StatusCode::OK, "GET {path} from kube-apiserver");
        assert_eq!(
            want.1, PROTOBUF,
            "GET {path} from kube-apiserver is protobuf"
        );
        assert_eq!(
            (got.0, &got.1),
            (want.0, &want.1),
            "GET {path} through the gateway"
        );
        assert!(
            got.2 == want.2,
            "GET {path}: the protobuf bytes differ through the gateway"
        );
    }

    let rv = admin
        .run_ok(&[
            "get",
            "configmap",
            "proto-check",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .await
        .stdout;
    let watch = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&\
         fieldSelector=metadata.name%3Dproto-check"
    );
    let mut want = open_watch(real, &direct, &format!("{}{watch}", real.plane.url)).await;
    let mut got = open_watch(real, &through, &format!("{}{watch}", real.gateway.url())).await;
    admin
        .run_ok(&[
            "patch",
            "configmap",
            "proto-check",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"a":"2"}}"#,
        ])
        .await;
    assert_eq!(got.content_type, want.content_type, "watch content type");
    let (want, got) = (want.frame().await, got.frame().await);
    assert!(
        got == want,
        "the protobuf watch event through the gateway differs from kube-apiserver's ({} vs {} \
         bytes)",
        got.len(),
        want.len()
    );
    admin
        .run_ok(&["delete", "configmap", "proto-check", "-n", "default"])
        .await;
}
