//! The gateway beside kube-apiserver's built-in aggregator, on the real control plane of the
//! real-control-plane suite (`e2e::real`), when its binaries are given (`KUBEBUILDER_ASSETS`,
//! `SAMPLE_APISERVER`); otherwise the scenario says it skipped and adds no rows.
//!
//! Both sides serve the same sample-apiserver for the same APIService, so "direct" here is
//! kube-apiserver (its aggregator proxying to sample-apiserver, its own aggregated `/apis`, its
//! own ConfigMap) and "via" is the gateway in front of that kube-apiserver: for flunders the
//! gateway replaces kube-aggregator's hop, for `/apis` it serves its merged document, and for a
//! ConfigMap it adds a hop in front of kube-apiserver. The load generator is anonymous (no
//! per-request credentials to forge), so the control plane lets `system:unauthenticated` read
//! flunders, ConfigMaps and discovery; every request is still authorized by SubjectAccessReview
//! (the gateway's, cached, and sample-apiserver's), as with real users.

use std::sync::Arc;

use super::load::{load, Endpoint, LoadSpec, Proto};
use super::report::{Results, Row};
use super::{BoxError, Settings, AGGREGATED_V2};
use crate::harness::{Gateway, GatewayOptions};
use crate::real::sample_apiserver::{WARDLE_GROUP, WARDLE_VERSION};
use crate::real::{ControlPlane, RealBinaries, SampleApiserver};

/// The scenario names, for `--only`.
pub const FLUNDERS: &str = "real: flunders list (sample-apiserver), HTTP/1.1, 32 connections";
pub const APIS: &str = "real: aggregated /apis, HTTP/1.1, 32 connections";
pub const CONFIGMAP: &str = "real: ConfigMap GET (kube-apiserver), HTTP/1.1, 32 connections";

const ANONYMOUS_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: bench-anonymous-reader
rules:
- apiGroups: ["wardle.example.com"]
  resources: ["flunders"]
  verbs: ["get", "list"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
- nonResourceURLs: ["/api", "/api/*", "/apis", "/apis/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: bench-anonymous-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: bench-anonymous-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:unauthenticated
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: bench
  namespace: default
data:
  key: value
"#;

/// Runs the three scenarios the settings want; nothing when the binaries are not given.
pub async fn run(
    settings: &Settings,
    gateway_binary: &std::path::Path,
    results: &mut Results,
) -> Result<(), BoxError> {
    let names = [FLUNDERS, APIS, CONFIGMAP];
    if !names.iter().any(|n| settings.wants(n)) {
        return Ok(());
    }
    let Some(binaries) = RealBinaries::or_skip("bench scenarios \"real: ...\"") else {
        return Ok(());
    };
    eprintln!("bench: starting etcd, kube-apiserver and sample-apiserver");
    let plane = ControlPlane::start(&binaries).await?;
    let sample = SampleApiserver::start(&plane, &binaries).await?;
    let admin = plane.admin();
    admin.apply_yaml(ANONYMOUS_READER).await;
    admin.apply_yaml(&sample.apiservice_yaml(&plane)).await;
    for i in 0..3 {
        admin
            .apply_yaml(&format!(
                "apiVersion: {WARDLE_GROUP}/{WARDLE_VERSION}\nkind: Flunder\nmetadata:\n  \
                 name: bench-{i}\n  namespace: default\nspec: {{}}\n"
            ))
            .await;
    }
    let pki = &plane.pki;
    let path = |p: &std::path::Path| p.display().to_string();
    let gateway = Gateway::start(
        GatewayOptions::new(plane.url.clone())
            .binary(gateway_binary)
            .args([
                "--core-ca-file".to_owned(),
                path(&pki.cluster_ca_file),
                "--core-client-cert-file".to_owned(),
                path(&pki.admin_files.0),
                "--core-client-key-file".to_owned(),
                path(&pki.admin_files.1),
                "--proxy-client-cert-file".to_owned(),
                path(&pki.gateway_proxy_client.0),
                "--proxy-client-key-file".to_owned(),
                path(&pki.gateway_proxy_client.1),
            ]),
    )
    .await?;

    let direct = Endpoint {
        addr: plane.url.trim_start_matches("https://").parse()?,
        ca_pem: Some(Arc::from(pki.cluster_ca.cert_pem())),
        client_cert: None,
    };
    let via = Endpoint {
        addr: gateway.addr,
        ca_pem: Some(Arc::from(gateway.ca_pem()?.as_str())),
        client_cert: None,
    };
    let flunders = format!("/apis/{WARDLE_GROUP}/{WARDLE_VERSION}/namespaces/default/flunders");
    // Both sides serve flunders before anything is measured.
    let ready = crate::harness::wait_until(std::time::Duration::from_secs(60), || async {
        let probe = LoadSpec {
            proto: Proto::H1,
            connections: 1,
            streams_per_connection: 1,
            path: flunders.clone(),
            accept: None,
            warmup: std::time::Duration::ZERO,
            duration: std::time::Duration::from_millis(200),
        };
        let d = load(&direct, &probe).await;
        let v = load(&via, &probe).await;
        matches!((d, v), (Ok(d), Ok(v)) if d.errors == 0 && v.errors == 0 && d.requests > 0 && v.requests > 0)
    })
    .await;
    if !ready {
        return Err(format!(
            "flunders were not served by both kube-apiserver and the gateway within 60 s:\n{}",
            gateway.process.logs()
        )
        .into());
    }

    let base = LoadSpec {
        proto: Proto::H1,
        connections: 32,
        streams_per_connection: 1,
        path: String::new(),
        accept: None,
        warmup: settings.warmup,
        duration: settings.duration,
    };
    let scenarios = [
        (FLUNDERS, flunders.as_str(), None, "kube-aggregator proxying to sample-apiserver vs the gateway proxying to it (target 1.5×)"),
        (APIS, "/apis", Some(AGGREGATED_V2), "kube-apiserver's aggregated document vs the gateway's merged one"),
        (CONFIGMAP, "/api/v1/namespaces/default/configmaps/bench", None, "kube-apiserver directly vs through the gateway"),
    ];
    for (name, path, accept, note) in scenarios {
        if !settings.wants(name) {
            continue;
        }
        eprintln!("bench: {name}");
        let spec = LoadSpec {
            path: path.to_owned(),
            accept,
            ..base.clone()
        };
        let d = load(&direct, &spec).await?;
        let v = load(&via, &spec).await?;
        eprintln!(
            "bench:   kube-apiserver {:.0} req/s p99 {:.3} ms errors {:?}; gateway {:.0} req/s p99 {:.3} ms errors {:?}",
            d.rps(), d.p99_ms, d.error_kinds, v.rps(), v.p99_ms, v.error_kinds
        );
        if v.errors > 0 {
            eprintln!("bench:   first error via the gateway: {:?}", v.error_sample);
        }
        let errors = if d.errors + v.errors > 0 {
            format!("; {} direct / {} via errors", d.errors, v.errors)
        } else {
            String::new()
        };
        results.rows.push(
            Row::new(name, "throughput", "req/s")
                .values(Some(d.rps()), Some(v.rps()))
                .note(format!("{note}{errors}")),
        );
        results
            .rows
            .push(Row::new(name, "p99 latency", "ms").values(Some(d.p99_ms), Some(v.p99_ms)));
        results.raw.insert(
            name.to_owned(),
            serde_json::json!({
                "path": path, "direct": d.to_json(), "via_gateway": v.to_json(),
                "direct_is": "kube-apiserver v1.33 (its built-in aggregator for flunders)",
            }),
        );
    }
    drop(gateway);
    drop(sample);
    drop(plane);
    Ok(())
}
