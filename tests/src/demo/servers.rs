//! The demo's core and aggregated API servers, in this process: started, stopped and started
//! again on the same address (so that their Services on the core stay right), as `stop wardle`
//! and `start wardle` ask.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fixture::state::Fixture;
use crate::fixture::{
    aggregated_server, core_server, BoxError, FixtureConfig, Policy, RequestHeaderAuth, Server,
    TlsFiles,
};
use crate::scenario::Pki;

/// One aggregated API server of the demo.
#[derive(Debug)]
pub struct Aggregated {
    /// What `stop`/`start` call it.
    pub name: &'static str,
    /// Its Service is `<namespace>/api`.
    pub namespace: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub group_priority_minimum: u32,
    pub version_priority: u32,
    /// Serves `/openapi/v3` (otherwise `/openapi/v2` only).
    pub openapi_v3: bool,
    pub description: &'static str,
}

impl Aggregated {
    /// The APIService's name, `<version>.<group>`.
    pub fn apiservice(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }
}

/// The aggregated servers: the sample-apiserver's flunders, and a metrics-server's metrics.
pub const AGGREGATED: [Aggregated; 2] = [
    Aggregated {
        name: "wardle",
        namespace: "wardle",
        group: "wardle.example.com",
        version: "v1alpha1",
        group_priority_minimum: 1000,
        version_priority: 15,
        openapi_v3: true,
        description: "wardle.example.com/v1alpha1: flunders and fischers",
    },
    Aggregated {
        name: "metrics",
        namespace: "metrics",
        group: "metrics.k8s.io",
        version: "v1beta1",
        group_priority_minimum: 100,
        version_priority: 100,
        openapi_v3: false,
        description: "metrics.k8s.io/v1beta1: node and pod metrics, OpenAPI v2 only",
    },
];

/// A server serving in a task of its own until told to stop.
struct Running {
    fixture: Arc<Fixture>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), BoxError>>,
}

impl Running {
    async fn start(
        config: FixtureConfig,
        address: &str,
        tls: Option<&TlsFiles>,
    ) -> Result<(Running, SocketAddr), BoxError> {
        let server = Server::bind(config, address, tls).await?;
        let address = server.local_addr()?;
        let fixture = server.fixture();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server.serve_until(async {
            let _ = stopped.await;
        }));
        Ok((
            Running {
                fixture,
                stop,
                task,
            },
            address,
        ))
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// One aggregated server: how to start it again, and whether it runs.
struct Backend {
    spec: &'static Aggregated,
    config: FixtureConfig,
    tls: TlsFiles,
    address: SocketAddr,
    running: Option<Running>,
}

/// The core and the aggregated servers.
pub struct Servers {
    core: Running,
    core_address: SocketAddr,
    backends: Vec<Backend>,
}

impl Servers {
    /// Starts the aggregated servers on free ports, then the core on `core_port` with their
    /// APIServices and Services stored, as a cluster would have them.
    pub async fn start(pki: &Pki, core_port: u16) -> Result<Servers, BoxError> {
        let (cert, key) = &pki.backend_cert;
        let tls = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: Some(pki.proxy_ca_file.clone()),
        };
        let mut backends = Vec::new();
        for spec in &AGGREGATED {
            let config = backend_config(spec);
            let (running, address) =
                Running::start(config.clone(), "127.0.0.1:0", Some(&tls)).await?;
            backends.push(Backend {
                spec,
                config,
                tls: tls.clone(),
                address,
                running: Some(running),
            });
        }
        let mut config = core_server::config("32", true, policy());
        for backend in &backends {
            config.seed.extend(registration(
                backend.spec,
                backend.address.port(),
                pki.backend_ca.cert_pem(),
            ));
        }
        let address = format!("127.0.0.1:{core_port}");
        let (core, core_address) = Running::start(config, &address, None)
            .await
            .map_err(|e| format!("the core server: {e} (another port: --core-port)"))?;
        Ok(Servers {
            core,
            core_address,
            backends,
        })
    }

    pub fn core_address(&self) -> SocketAddr {
        self.core_address
    }

    /// Whether the core says every APIService of the demo is `Available`.
    pub fn all_available(&self) -> bool {
        let (apiservices, _) =
            self.core
                .fixture
                .store
                .list("apiregistration.k8s.io", "apiservices", None);
        AGGREGATED.iter().all(|spec| {
            apiservices
                .iter()
                .find(|a| a["metadata"]["name"] == spec.apiservice().as_str())
                .and_then(|a| a["status"]["conditions"].as_array())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == "Available" && c["status"] == "True")
                })
        })
    }

    /// `stop <name>` or `start <name>`; what happened, in a line.
    pub async fn command(&mut self, line: &str) -> String {
        let names: Vec<&str> = AGGREGATED.iter().map(|s| s.name).collect();
        let usage = format!(
            "commands: stop <server>, start <server>; servers: {}",
            names.join(", ")
        );
        let Some((verb, name)) = line.split_once(' ') else {
            return usage;
        };
        let Some(backend) = self
            .backends
            .iter_mut()
            .find(|b| b.spec.name == name.trim())
        else {
            return usage;
        };
        let what = format!("{} ({})", backend.spec.name, backend.spec.apiservice());
        match (verb, backend.running.take()) {
            ("stop", Some(running)) => {
                running.stop().await;
                format!("stopped {what}")
            }
            ("start", None) => {
                let address = backend.address.to_string();
                match Running::start(backend.config.clone(), &address, Some(&backend.tls)).await {
                    Ok((running, _)) => {
                        backend.running = Some(running);
                        format!("started {what} again")
                    }
                    Err(e) => format!("cannot start {what}: {e}"),
                }
            }
            ("stop", None) => format!("{what} is stopped already"),
            ("start", Some(running)) => {
                backend.running = Some(running);
                format!("{what} runs already")
            }
            (_, running) => {
                backend.running = running;
                usage
            }
        }
    }

    pub async fn stop_all(self) {
        for backend in self.backends {
            if let Some(running) = backend.running {
                running.stop().await;
            }
        }
        self.core.stop().await;
    }
}

/// An aggregated server that trusts identity only from the gateway's proxy certificate (CN
/// `aggregator`), with a few objects of its own.
fn backend_config(spec: &Aggregated) -> FixtureConfig {
    let versions = [spec.version.to_owned()];
    let table = match spec.name {
        "metrics" => aggregated_server::metrics_table(spec.group, &versions),
        _ => aggregated_server::table(spec.group, &versions),
    };
    let trust = RequestHeaderAuth {
        allowed_names: vec!["aggregator".to_owned()],
    };
    let mut config = aggregated_server::serving(table, false, true, Some(trust));
    config.openapi_v3 = spec.openapi_v3;
    if spec.name == "wardle" {
        let api_version = format!("{}/{}", spec.group, spec.version);
        config.seed = ["alpha", "beta"]
            .iter()
            .map(|name| {
                json!({"apiVersion": api_version, "kind": "Flunder",
                       "metadata": {"name": name, "namespace": "default"},
                       "spec": {"reference": "", "referenceType": "Flunder"}})
            })
            .collect();
    }
    config
}

/// The core's policy: the demo's token is user `demo` in `system:masters`.
fn policy() -> Policy {
    let mut policy = Policy::default();
    policy.tokens.insert(
        super::TOKEN.to_owned(),
        serde_json::from_value(json!({"username": super::USER, "groups": ["system:masters"]}))
            .expect("a policy user"),
    );
    policy
}

/// What registers `spec` on a cluster: its namespace, its Service (a ClusterIP of 127.0.0.1 on
/// the server's port, where the server listens) with a ready endpoint, and its APIService.
fn registration(spec: &Aggregated, port: u16, ca: &str) -> Vec<Value> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "api", "namespace": spec.namespace},
               "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                        "ports": [{"name": "https", "port": port, "targetPort": port,
                                   "protocol": "TCP"}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "api-1", "namespace": spec.namespace,
                            "labels": {"kubernetes.io/service-name": "api"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
               "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": spec.apiservice()},
               "spec": {"group": spec.group, "version": spec.version,
                        "groupPriorityMinimum": spec.group_priority_minimum,
                        "versionPriority": spec.version_priority,
                        "caBundle": ca,
                        "service": {"namespace": spec.namespace, "name": "api", "port": port}}}),
    ]
}
