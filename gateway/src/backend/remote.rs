//! A remote APIService's backend: TLS verified against its `caBundle` with the server name
//! `<service>.<namespace>.svc` (never the dialled address), our proxy client certificate
//! presented, HTTP/2 pooled with liveness pings, a separate HTTP/1.1 path for upgrades, and the
//! caller's identity in `X-Remote-*` headers.
//!
//! Requests the gateway makes on its own behalf carry kube-aggregator's identities, because a
//! backend that authorizes (delegating to the core, as the sample-apiserver does) would refuse an
//! unnamed caller and every APIService would turn `FailedDiscoveryCheck`:
//! - the availability probe and discovery: `system:kube-aggregator` in `system:masters`
//!   (`remote_available_controller.go` and `handler_discovery.go`);
//! - OpenAPI: `system:aggregator` without groups (the OpenAPI aggregation controllers).

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use apiservice::model::{RegisteredAPIService, RemoteBackendSpec};
use apiservice::resolve::ServiceResolver;
use gateway_config::tls::{self, Identity, ServerTrust};
use http::uri::{Authority, Scheme};
use http::Method;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rustls::pki_types::ServerName;
use tokio::sync::watch;

use super::failures::{FailureSignal, Watched};
use super::probe::Probe;
use crate::body::{self, Body, Request, Response};
use crate::error::GatewayError;
use crate::identity::{set_identity_headers, UserInfo};
use crate::proxy::{self, Upstream};
use crate::workqueue::Queue;

/// HTTP/2 connections per backend (see `RemoteBackend::pooled`).
const H2_CONNECTIONS: usize = 4;

/// kube-aggregator's limit for `/apis/<group>/<version>` discovery through the proxy.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Who the availability probe and discovery fetches are (see the module docs).
static DISCOVERY_USER: LazyLock<UserInfo> = LazyLock::new(|| UserInfo {
    name: "system:kube-aggregator".into(),
    groups: vec!["system:masters".into()],
    ..Default::default()
});

/// Who OpenAPI fetches are (see the module docs).
static OPENAPI_USER: LazyLock<UserInfo> = LazyLock::new(|| UserInfo {
    name: "system:aggregator".into(),
    ..Default::default()
});

/// The identity for a GET the gateway makes for itself: OpenAPI documents as kube's OpenAPI
/// controllers, everything else (discovery) as its discovery manager.
fn own_identity(path_and_query: &str) -> &'static UserInfo {
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p);
    if path == "/openapi" || path.starts_with("/openapi/") {
        &OPENAPI_USER
    } else {
        &DISCOVERY_USER
    }
}

type HttpsClient = Client<HttpsConnector<Watched>, Body>;

pub struct RemoteBackend {
    pub name: Arc<str>,
    spec: RemoteBackendSpec,
    resolver: Arc<dyn ServiceResolver>,
    /// Several HTTP/2 connections, used in turn: one connection is driven by one task, so a
    /// single one caps throughput at one core and puts every stream behind one flow-control
    /// window (kube-aggregator's users hit this as kubernetes#60042).
    pooled: Box<[HttpsClient]>,
    next: std::sync::atomic::AtomicUsize,
    upgrades: HttpsClient,
    drain: watch::Receiver<bool>,
    /// Connection failures on real traffic ask for an availability re-check through this, so a
    /// dead backend is noticed when it dies instead of at the next periodic check (see
    /// `failures`).
    failures: Arc<FailureSignal>,
    /// The availability probe's own connections (see `probe`).
    probe: Probe,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteSetupError {
    #[error("{name}: spec.caBundle: {source}")]
    CaBundle {
        name: String,
        #[source]
        source: Box<tls::TlsError>,
    },
    #[error("{name}: TLS: {source}")]
    Tls {
        name: String,
        #[source]
        source: Box<tls::TlsError>,
    },
    #[error("{name}: {server_name:?} is not a valid TLS server name")]
    ServerName { name: String, server_name: String },
}

fn client(
    tls: rustls::ClientConfig,
    server_name: ServerName<'static>,
    http2: bool,
    failures: Option<Arc<FailureSignal>>,
) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .with_server_name_resolver(FixedServerNameResolver::new(server_name));
    let http = Watched::new(http, failures);
    let connector = if http2 {
        builder.enable_http1().enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    };
    super::client_builder().build(connector)
}

impl RemoteBackend {
    pub fn new(
        api: &RegisteredAPIService,
        spec: &RemoteBackendSpec,
        proxy_identity: Option<&Identity>,
        resolver: Arc<dyn ServiceResolver>,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, RemoteSetupError> {
        let trust = if spec.insecure_skip_tls_verify {
            ServerTrust::InsecureSkipVerify
        } else if let Some(pem) = &spec.ca_bundle {
            ServerTrust::Roots(tls::roots_from_pem(pem, &api.name).map_err(|source| {
                RemoteSetupError::CaBundle {
                    name: api.name.clone(),
                    source: Box::new(source),
                }
            })?)
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            ServerTrust::Roots(roots)
        };
        let server_name = spec.service.server_name();
        let sni = ServerName::try_from(server_name.clone()).map_err(|_| {
            RemoteSetupError::ServerName {
                name: api.name.clone(),
                server_name,
            }
        })?;
        let tls_config = |trust| {
            tls::client_config(trust, proxy_identity, &[]).map_err(|source| RemoteSetupError::Tls {
                name: api.name.clone(),
                source: Box::new(source),
            })
        };
        let name: Arc<str> = api.name.as_str().into();
        let failures = FailureSignal::new(name.clone());
        let pooled = (0..H2_CONNECTIONS)
            .map(|_| {
                let tls = tls_config(trust.clone())?;
                Ok(client(tls, sni.clone(), true, Some(failures.clone())))
            })
            .collect::<Result<Box<[_]>, RemoteSetupError>>()?;
        // A tunnel ends whenever its session does: that says nothing about the backend.
        let upgrades = client(tls_config(trust.clone())?, sni.clone(), false, None);
        let probe = Probe::new(tls_config(trust)?, sni);
        Ok(Self {
            name,
            spec: spec.clone(),
            resolver,
            pooled,
            next: std::sync::atomic::AtomicUsize::new(0),
            upgrades,
            drain,
            failures,
            probe,
        })
    }

    /// Connection failures on proxied requests ask `queue` to re-check this APIService.
    pub fn reporting_failures_to(self, queue: Queue<String>) -> Self {
        self.failures.report_to(queue);
        self
    }

    /// Whether this backend was built from the same spec (so it can be kept across a rebuild).
    pub fn same_spec(&self, spec: &RemoteBackendSpec) -> bool {
        self.spec == *spec
    }

    fn upstream(&self) -> Result<Upstream, GatewayError> {
        let endpoint = self
            .resolver
            .resolve(&self.spec.service)
            .map_err(|e| self.unavailable(e.message))?;
        let authority: Authority = endpoint.authority().parse().map_err(|_| {
            self.unavailable(format!(
                "resolved address {:?} is not valid",
                endpoint.authority()
            ))
        })?;
        Ok(Upstream {
            scheme: Scheme::HTTPS,
            authority,
        })
    }

    fn unavailable(&self, reason: impl Into<String>) -> GatewayError {
        GatewayError::BackendUnavailable {
            api_service: self.name.to_string(),
            reason: reason.into(),
        }
    }

    /// Proxies a client request: path unchanged, identity replaced by the authenticated user's.
    pub async fn forward(
        &self,
        mut req: Request,
        user: &UserInfo,
        client: Option<SocketAddr>,
        long_running: bool,
    ) -> Result<Response, GatewayError> {
        let upstream = self.upstream()?;
        let upgrade = proxy::is_upgrade(req.headers());
        let discovery = is_group_version_discovery(req.method(), req.uri().path());
        proxy::prepare_request(&mut req, &upstream, client);
        // Sending the request without the caller's identity would have the backend act for the
        // gateway instead: refuse it.
        set_identity_headers(req.headers_mut(), user).map_err(|e| {
            tracing::warn!(error = %e, "request refused");
            GatewayError::Internal(e.to_string())
        })?;
        if upgrade {
            return proxy::forward_upgrade(req, |r| self.upgrades.request(r), self.drain.clone())
                .await
                .map_err(|e| self.failed_request(e));
        }
        let send = self.pooled().request(req);
        let resp = if discovery {
            tokio::time::timeout(DISCOVERY_TIMEOUT, send)
                .await
                .map_err(|_| self.unavailable("discovery did not answer within 5s"))?
        } else {
            send.await
        }
        .map_err(|e| self.failed_request(e))?;
        if resp.status().is_redirection() {
            return Err(GatewayError::BackendRedirect {
                api_service: self.name.to_string(),
                status: resp.status().as_u16(),
            });
        }
        Ok(proxy::client_response(resp, long_running, &self.drain))
    }

    /// The availability probe: `GET /apis/<group>/<version>` (`/api/<version>` for the legacy
    /// core group) on the probe's own connections, as [`DISCOVERY_USER`]; see [`Probe`].
    pub async fn probe(&self, group: &str, version: &str) -> Result<(), String> {
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let resolve = || {
            self.upstream()
                .map(|upstream| upstream.authority)
                .map_err(|e| e.to_string())
        };
        self.probe.check(resolve, &path, &DISCOVERY_USER).await
    }

    /// A GET the gateway makes on its own behalf (discovery, OpenAPI), bounded by `timeout`: as
    /// kube-aggregator's own identity for that document (see [`own_identity`]), never a caller's,
    /// whatever identity headers `headers` carried.
    pub async fn get(
        &self,
        path_and_query: &str,
        headers: http::HeaderMap,
        timeout: Duration,
    ) -> Result<http::Response<hyper::body::Incoming>, GatewayError> {
        let upstream = self.upstream()?;
        let mut req = http::Request::builder()
            .method(Method::GET)
            .uri(format!("https://{}{path_and_query}", upstream.authority))
            .body(body::empty())
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        *req.headers_mut() = headers;
        set_identity_headers(req.headers_mut(), own_identity(path_and_query))
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        match tokio::time::timeout(timeout, self.pooled().request(req)).await {
            Err(_) => Err(self.unavailable(format!(
                "GET {path_and_query} did not answer within {}s",
                timeout.as_secs()
            ))),
            Ok(Err(e)) => Err(self.failed_request(e)),
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// The Service this backend reaches (discovery is fetched once per Service).
    pub fn service(&self) -> &apiservice::model::ServiceRef {
        &self.spec.service
    }

    fn pooled(&self) -> &HttpsClient {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.pooled[i % self.pooled.len()]
    }

    /// A request that failed in transport: could not connect (refused, TLS refused), or the
    /// connection was reset or closed under it. Either says the backend may be gone: re-check
    /// it now. Not when the caller's own request body failed, which says nothing about it.
    fn failed_request(&self, e: hyper_util::client::legacy::Error) -> GatewayError {
        if !caused_by_request_body(&e) {
            self.failures.report(if e.is_connect() {
                "connect failed"
            } else {
                "request failed in transport"
            });
        }
        self.transport_error(e)
    }

    fn transport_error(&self, e: hyper_util::client::legacy::Error) -> GatewayError {
        self.unavailable(format!(
            "error trying to reach service: {}",
            crate::error::chain(&e)
        ))
    }
}

/// Whether a transport error came from the request body the caller sent (it failed, or was
/// aborted), rather than from the backend's side of the connection.
fn caused_by_request_body(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_user() || h.is_body_write_aborted();
        }
        source = err.source();
    }
    false
}

/// `/apis/<group>/<version>` exactly (trailing slash allowed): the discovery document kubectl
/// fetches per group-version, which kube-aggregator bounds to 5 s.
fn is_group_version_discovery(method: &Method, path: &str) -> bool {
    method == Method::GET && {
        let trimmed = path.trim_end_matches('/');
        trimmed
            .strip_prefix("/apis/")
            .is_some_and(|rest| rest.split('/').count() == 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed(u16);

    impl ServiceResolver for Closed {
        fn resolve(
            &self,
            _: &apiservice::model::ServiceRef,
        ) -> Result<apiservice::resolve::Endpoint, apiservice::resolve::ResolveError> {
            Ok(apiservice::resolve::Endpoint::new("127.0.0.1", self.0))
        }
    }

    #[tokio::test]
    async fn a_refused_connection_asks_for_an_availability_recheck_once_per_burst() {
        use crate::workqueue::{Next, WorkQueue};
        let api = RegisteredAPIService {
            name: "v1.dead.io".into(),
            group: "dead.io".into(),
            version: "v1".into(),
            group_priority_minimum: 100,
            version_priority: 10,
            backend: apiservice::model::Backend::Remote(RemoteBackendSpec {
                service: apiservice::model::ServiceRef {
                    namespace: "dead".into(),
                    name: "api".into(),
                    port: 443,
                },
                ca_bundle: None,
                insecure_skip_tls_verify: true,
            }),
        };
        let apiservice::model::Backend::Remote(spec) = &api.backend else {
            unreachable!()
        };
        // A port nothing listens on: every connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut rechecks: WorkQueue<String, ()> = WorkQueue::new(|_| crate::workqueue::Backoff {
            min: Duration::from_millis(5),
            max: Duration::from_secs(1),
        });
        let (_, drain) = watch::channel(false);
        let backend = RemoteBackend::new(&api, spec, None, Arc::new(Closed(port)), drain)
            .unwrap()
            .reporting_failures_to(rechecks.queue().clone());
        for _ in 0..3 {
            let req = http::Request::get("/apis/dead.io/v1/things")
                .body(body::empty())
                .unwrap();
            let result = backend
                .forward(req, &crate::identity::UserInfo::anonymous(), None, false)
                .await;
            assert!(
                matches!(result, Err(GatewayError::BackendUnavailable { .. })),
                "a refused connection is a 503"
            );
        }
        let first = tokio::time::timeout(Duration::from_secs(1), rechecks.next())
            .await
            .expect("a recheck was asked for");
        assert!(matches!(first, Next::Ready(ref name) if name == "v1.dead.io"));
        // Three failures within 200 ms are one report.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), rechecks.next())
                .await
                .is_err()
        );
    }

    #[test]
    fn own_requests_use_kube_aggregators_identities() {
        for path in [
            "/apis",
            "/api",
            "/apis/wardle.example.com/v1alpha1",
            "/api/v1",
        ] {
            let user = own_identity(path);
            assert_eq!(user.name, "system:kube-aggregator", "{path}");
            assert_eq!(user.groups, ["system:masters"], "{path}");
        }
        for path in [
            "/openapi/v3",
            "/openapi/v3/apis/wardle.example.com/v1alpha1?hash=AB",
            "/openapi/v2",
        ] {
            let user = own_identity(path);
            assert_eq!(user.name, "system:aggregator", "{path}");
            assert!(user.groups.is_empty(), "{path}");
        }
        assert_eq!(own_identity("/openapix").name, "system:kube-aggregator");
    }

    #[test]
    fn discovery_paths() {
        assert!(is_group_version_discovery(
            &Method::GET,
            "/apis/wardle.example.com/v1alpha1"
        ));
        assert!(is_group_version_discovery(
            &Method::GET,
            "/apis/wardle.example.com/v1alpha1/"
        ));
        assert!(!is_group_version_discovery(
            &Method::GET,
            "/apis/wardle.example.com/v1alpha1/flunders"
        ));
        assert!(!is_group_version_discovery(
            &Method::POST,
            "/apis/wardle.example.com/v1alpha1"
        ));
    }
}
