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
use std::sync::Arc;
use std::time::Duration;

use apiservice::model::{RegisteredAPIService, RemoteBackendSpec};
use apiservice::resolve::{Endpoint, ServiceResolver};
use apiservice::traffic::ConnectionSettings;
use gateway_config::tls::{self, Identity, ServerTrust};
use http::uri::{Authority, Scheme};
use http::Method;
use hyper_rustls::FixedServerNameResolver;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::ServerName;
use tokio::sync::watch;

use crate::workqueue::Queue;

use super::balance::{PickError, Picked};
use super::failures::{FailureSignal, Watched};
use super::pool::{Connector, PoolError, PoolSettings, ServiceConnections};
use super::probe::{Probe, ProbeError};
use super::retry::{self, Attempts, Replay};
use crate::backend::proxy::{self, Upstream};
use crate::body::{self, Body, Request, Response};
use crate::error::{GatewayError, Unreachable};
use crate::identity::{set_identity_headers, UserInfo, DISCOVERY_USER, OPENAPI_USER};

/// kube-aggregator's limit for `/apis/<group>/<version>` discovery through the proxy.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

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

pub struct RemoteBackend {
    pub name: Arc<str>,
    spec: RemoteBackendSpec,
    /// How its connections are kept (from the APIService's annotations).
    connection_settings: ConnectionSettings,
    resolver: Arc<dyn ServiceResolver>,
    /// The connections to the Service, shared with every APIService that names it with the
    /// same trust (see `backend::pool`).
    connections: Arc<ServiceConnections>,
    drain: watch::Receiver<bool>,
    /// `--aggregator-reject-forwarding-redirect` (see [`is_forwarding_redirect`]).
    reject_forwarding_redirects: bool,
}

// === impl RemoteBackend ===

impl Drop for RemoteBackend {
    fn drop(&mut self) {
        self.connections.failures().remove_api_service(&self.name);
    }
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

/// A TLS connector whose TCP connections report failures to `failures` (`None`: nowhere; a
/// tunnel ends whenever its session does, which says nothing about the backend).
fn connector(
    tls: rustls::ClientConfig,
    server_name: ServerName<'static>,
    http2: bool,
    failures: Option<Arc<FailureSignal>>,
) -> Connector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .with_server_name_resolver(FixedServerNameResolver::new(server_name));
    let http = Watched::new(http, failures);
    if http2 {
        builder.enable_http1().enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    }
}

impl RemoteBackend {
    /// A backend with connections of its own; see [`RemoteBackend::with_connections`] for
    /// connections shared with other APIServices.
    pub fn new(
        api: &RegisteredAPIService,
        spec: &RemoteBackendSpec,
        proxy_identity: Option<&Identity>,
        resolver: Arc<dyn ServiceResolver>,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, RemoteSetupError> {
        let connections =
            Self::service_connections(&api.name, spec, &api.traffic.connections, proxy_identity)?;
        Ok(Self::with_connections(
            api,
            spec,
            Arc::new(connections),
            resolver,
            drain,
        ))
    }

    /// The backend of `api`, sending on `connections` (made by
    /// [`RemoteBackend::service_connections`] for the same spec).
    pub fn with_connections(
        api: &RegisteredAPIService,
        spec: &RemoteBackendSpec,
        connections: Arc<ServiceConnections>,
        resolver: Arc<dyn ServiceResolver>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        let name: Arc<str> = api.name.as_str().into();
        connections.failures().add_api_service(&name);
        Self {
            name,
            spec: spec.clone(),
            connection_settings: api.traffic.connections,
            resolver,
            connections,
            drain,
            reject_forwarding_redirects: true,
        }
    }

    /// Connections to the Service `spec` names, trusted as `spec` says, kept as `settings`
    /// say, presenting `proxy_identity`: what every APIService with the same spec and settings
    /// can share. `api_name` names the APIService in errors.
    pub fn service_connections(
        api_name: &str,
        spec: &RemoteBackendSpec,
        settings: &ConnectionSettings,
        proxy_identity: Option<&Identity>,
    ) -> Result<ServiceConnections, RemoteSetupError> {
        let trust = if spec.insecure_skip_tls_verify {
            ServerTrust::InsecureSkipVerify
        } else if let Some(pem) = &spec.ca_bundle {
            ServerTrust::Roots(tls::roots_from_pem(pem, api_name).map_err(|source| {
                RemoteSetupError::CaBundle {
                    name: api_name.to_owned(),
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
                name: api_name.to_owned(),
                server_name,
            }
        })?;
        let tls_config = |trust| {
            tls::client_config(trust, proxy_identity, &[]).map_err(|source| RemoteSetupError::Tls {
                name: api_name.to_owned(),
                source: Box::new(source),
            })
        };
        let failures = FailureSignal::new();
        let pooled = connector(
            tls_config(trust.clone())?,
            sni.clone(),
            true,
            Some(failures.clone()),
        );
        let kept = connector(tls_config(trust.clone())?, sni.clone(), true, None);
        let http1 = connector(tls_config(trust.clone())?, sni.clone(), false, None);
        let probe = Probe::new(tls_config(trust)?, sni);
        Ok(ServiceConnections::new(
            pooled,
            kept,
            http1,
            probe,
            failures,
            PoolSettings::with(settings),
        ))
    }

    /// The connections this backend sends on (to share them with APIServices of the same spec).
    pub fn connections(&self) -> &Arc<ServiceConnections> {
        &self.connections
    }

    /// Whether a backend's redirect (a 3xx with a `Location`) becomes a 502 (the default) or
    /// reaches the client (`--aggregator-reject-forwarding-redirect=false`).
    pub fn rejecting_forwarding_redirects(mut self, reject: bool) -> Self {
        self.reject_forwarding_redirects = reject;
        self
    }

    /// Whether a backend's redirect is refused (see [`is_forwarding_redirect`]): documents the
    /// gateway passes on for itself follow the same rule.
    pub fn rejects_forwarding_redirects(&self) -> bool {
        self.reject_forwarding_redirects
    }

    /// Connection failures on this Service's connections ask `queue` to re-check the
    /// APIServices sending on them.
    pub fn reporting_failures_to(self, queue: Queue<String>) -> Self {
        self.connections.failures().report_to(queue);
        self
    }

    /// Whether this backend was built from the same spec and connection settings (so it can be
    /// kept across a rebuild).
    pub fn same_spec(&self, spec: &RemoteBackendSpec, settings: &ConnectionSettings) -> bool {
        self.spec == *spec && self.connection_settings == *settings
    }

    fn upstream(&self) -> Result<Upstream, GatewayError> {
        let endpoint = self
            .resolver
            .resolve(&self.spec.service)
            .map_err(|e| self.unavailable(e))?;
        let authority: Authority = endpoint.authority().parse().map_err(|_| {
            let invalid = PickError::InvalidAddress(endpoint.authority().to_owned());
            self.unavailable(Unreachable::Pick(Box::new(invalid)))
        })?;
        Ok(Upstream {
            scheme: Scheme::HTTPS,
            authority,
        })
    }

    fn unavailable(&self, cause: impl Into<Unreachable>) -> GatewayError {
        GatewayError::BackendUnavailable {
            api_service: self.name.to_string(),
            cause: cause.into(),
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
        let endpoints = self
            .resolver
            .endpoints(&self.spec.service)
            .map_err(|e| self.unavailable(e))?;
        let upgrade = proxy::is_upgrade(req.headers());
        let discovery = is_group_version_discovery(req.method(), req.uri().path());
        let first = self.pick(&endpoints, None)?;
        proxy::prepare_request(&mut req, &upstream_at(&first), client);
        // Sending the request without the caller's identity would have the backend act for the
        // gateway instead: refuse it.
        set_identity_headers(req.headers_mut(), user).map_err(|e| {
            tracing::warn!(error = %e, "request refused");
            GatewayError::Internal(e.to_string())
        })?;
        if upgrade {
            let upgrades = self.connections.upgrades();
            let mut resp = proxy::forward_upgrade(req, |r| upgrades.request(r), self.drain.clone())
                .await
                .map_err(|e| self.failed_request(&first, endpoints.len(), PoolError::Upgrade(e)))?;
            remove_cors_grants(resp.headers_mut());
            return Ok(resp);
        }
        // Anonymous callers over HTTP/1.1: a k8s.io/apiserver backend closes an HTTP/2
        // connection after an anonymous request (kube's UnauthenticatedHTTP2DOSMitigation),
        // and every other caller's requests share that connection.
        let http1 = user.name == crate::identity::ANONYMOUS;
        let send = self.send(req, &endpoints, first, http1, long_running);
        // kube-aggregator bounds the whole exchange of group-version discovery, body included:
        // a backend trickling its answer must not hold the client for the request timeout.
        let discovery_deadline = tokio::time::Instant::now() + DISCOVERY_TIMEOUT;
        let resp = if discovery {
            tokio::time::timeout_at(discovery_deadline, send)
                .await
                .map_err(|_| {
                    self.unavailable(Unreachable::Timeout {
                        what: "discovery".into(),
                        after: DISCOVERY_TIMEOUT,
                    })
                })?
        } else {
            send.await
        }?;
        if self.reject_forwarding_redirects && is_forwarding_redirect(&resp) {
            return Err(GatewayError::BackendRedirect {
                api_service: self.name.to_string(),
                status: resp.status().as_u16(),
            });
        }
        let mut resp = proxy::client_response(resp, long_running, &self.drain);
        remove_cors_grants(resp.headers_mut());
        if discovery {
            resp = resp.map(|b| {
                body::until(
                    b,
                    discovery_deadline,
                    "discovery did not complete within 5s",
                )
            });
        }
        Ok(resp)
    }

    /// An endpoint for the next attempt (see `balance`).
    fn pick(
        &self,
        endpoints: &[Endpoint],
        avoid: Option<&Authority>,
    ) -> Result<Picked, GatewayError> {
        self.connections
            .balancer()
            .pick(endpoints, avoid)
            .map_err(|e| self.unavailable(Unreachable::Pick(Box::new(e))))
    }

    /// Sends `req` (prepared for `first`) and, when it fails in a way `retry` allows, again on
    /// another endpoint or connection. The endpoint counts the request in flight until the
    /// response body ends. A `long_running` request's body is never held back for sending
    /// again (see `retry`).
    async fn send(
        &self,
        req: Request,
        endpoints: &[Endpoint],
        first: Picked,
        http1: bool,
        long_running: bool,
    ) -> Result<http::Response<Body>, GatewayError> {
        let (req, replay) = Replay::keep(req, long_running).await?;
        let (mut req, caller_body) = retry::watch_body(req);
        let mut attempts = Attempts::new(req.method().clone());
        let mut picked = first;
        loop {
            let sent = if http1 {
                self.connections.send_http1(req).await
            } else {
                let dial_deadline = attempts.dial_deadline();
                self.connections
                    .send_dialing_until(req, dial_deadline)
                    .await
            };
            let e = match sent {
                Ok((resp, lease)) => {
                    self.connections.balancer().succeeded(&picked);
                    // One box for the body, holding its connection (or stream) and the endpoint's
                    // count of requests in flight.
                    return Ok(resp.map(|b| body::with_guard(b, (lease, picked))));
                }
                Err(e) => e,
            };
            // The caller's body failed (it ended before its Content-Length, or its stream was
            // reset): the backend had nothing to do with it, and the request cannot be sent
            // again. The caller's own 400, and no mark against the endpoint.
            if let Some(why) = caller_body.failure() {
                tracing::debug!(error = %e, %why, "the request body failed while being sent");
                return Err(GatewayError::BadRequest(format!(
                    "the request body could not be read to its end ({why}); send a body that \
                     matches its Content-Length"
                )));
            }
            let failure = e.failure();
            let endpoint = &picked.health.authority;
            let frozen = self.connections.unresponsive(endpoint);
            let again = match &replay {
                Some(replay) if attempts.again(failure, endpoint, frozen, endpoints) => replay,
                _ => return Err(self.failed_request(&picked, endpoints.len(), e)),
            };
            if failure.is_endpoint_failure() {
                self.note_endpoint_failure(&picked, endpoints.len(), &e);
            }
            tracing::debug!(
                error = %e,
                attempt = attempts.failed(),
                endpoint = %endpoint,
                "request failed before reaching the backend's answer; sending again"
            );
            let next = self.pick(endpoints, Some(endpoint))?;
            req = again.request();
            proxy::set_upstream(&mut req, &upstream_at(&next));
            picked = next;
        }
    }

    /// The availability probe: `GET /apis/<group>/<version>` (`/api/<version>` for the legacy
    /// core group) on the probe's own connections to the Service, as [`DISCOVERY_USER`]; see
    /// [`Probe`].
    pub async fn probe(&self, group: &str, version: &str) -> Result<(), ProbeError> {
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let resolve = || {
            self.upstream()
                .map(|upstream| upstream.authority)
                .map_err(|e| ProbeError::Unresolved(Box::new(e)))
        };
        self.connections
            .probe()
            .check(resolve, &path, &DISCOVERY_USER)
            .await
    }

    /// Keeps one HTTP/2 connection open to each endpoint of the Service, so that one dying or
    /// freezing is noticed without traffic (see `pool`). Called after a passed availability
    /// check.
    pub fn keep_connections(&self) {
        let Ok(endpoints) = self.resolver.endpoints(&self.spec.service) else {
            return;
        };
        let authorities: Vec<Authority> = endpoints
            .iter()
            .filter_map(|e| e.authority().parse().ok())
            .collect();
        self.connections.keep(&authorities);
    }

    /// A GET the gateway makes on its own behalf (discovery, OpenAPI), bounded by `timeout`: as
    /// kube-aggregator's own identity for that document (see [`own_identity`]), never a caller's,
    /// whatever identity headers `headers` carried.
    pub async fn get(
        &self,
        path_and_query: &str,
        headers: http::HeaderMap,
        timeout: Duration,
    ) -> Result<http::Response<Body>, GatewayError> {
        let endpoints = self
            .resolver
            .endpoints(&self.spec.service)
            .map_err(|e| self.unavailable(e))?;
        let first = self.pick(&endpoints, None)?;
        let mut req = http::Request::builder()
            .method(Method::GET)
            .uri(format!(
                "https://{}{path_and_query}",
                first.health.authority
            ))
            .body(body::empty())
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        *req.headers_mut() = headers;
        set_identity_headers(req.headers_mut(), own_identity(path_and_query))
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        match tokio::time::timeout(timeout, self.send(req, &endpoints, first, false, false)).await {
            Err(_) => Err(self.unavailable(Unreachable::Timeout {
                what: format!("GET {path_and_query}"),
                after: timeout,
            })),
            Ok(result) => result,
        }
    }

    /// The Service this backend reaches (discovery is fetched once per Service).
    pub fn service(&self) -> &apiservice::model::ServiceRef {
        &self.spec.service
    }

    /// A request that failed in transport: could not connect (refused, TLS refused), or the
    /// connection was reset or closed under it. Either says the backend may be gone: re-check
    /// it now, and take the endpoint out of the balancer's choices. Not when the caller's own
    /// request body failed, nor when the pool only ran out of streams, which say nothing about
    /// the backend.
    fn failed_request(&self, picked: &Picked, endpoints: usize, e: PoolError) -> GatewayError {
        if e.failure().is_endpoint_failure() {
            self.note_endpoint_failure(picked, endpoints, &e);
        }
        self.transport_error(e)
    }

    fn note_endpoint_failure(&self, picked: &Picked, endpoints: usize, e: &PoolError) {
        self.connections.failures().report(if e.is_connect() {
            "connect failed"
        } else {
            "request failed in transport"
        });
        self.connections
            .balancer()
            .failed(picked, endpoints <= 1, &crate::error::chain(e));
    }

    fn transport_error(&self, e: PoolError) -> GatewayError {
        self.unavailable(match e {
            PoolError::Exhausted { .. } | PoolError::NoConnection { .. } => {
                Unreachable::Pool(Box::new(e))
            }
            e => Unreachable::Transport(Box::new(e)),
        })
    }
}

/// Where a request to `picked` goes: aggregated servers always speak TLS.
fn upstream_at(picked: &Picked) -> Upstream {
    Upstream {
        scheme: Scheme::HTTPS,
        authority: picked.health.authority.clone(),
    }
}

/// A redirect the client would follow somewhere else: a 3xx naming a `Location`. kube-aggregator
/// (`--aggregator-reject-forwarding-redirect`, `upgradeaware.go`) turns exactly these into a 502,
/// so a backend cannot send the caller, credentials and all, to another host; a 304 answering a
/// conditional request has no `Location` and passes.
fn is_forwarding_redirect<B>(resp: &http::Response<B>) -> bool {
    resp.status().is_redirection() && resp.headers().contains_key(http::header::LOCATION)
}

/// Removes every `Access-Control-Allow-*` header a backend sent. The gateway's origin is the one
/// the browser sees; an aggregated server must not be able to open it to other origins (or to
/// credentials) for the whole API. kube-aggregator's `corsRemovingTransport` removes the four it
/// knows; any `Access-Control-Allow-*` grants, so all of them go.
fn remove_cors_grants(headers: &mut http::HeaderMap) {
    let grants: Vec<http::HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-allow-"))
        .cloned()
        .collect();
    for name in grants {
        headers.remove(name);
    }
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
            traffic: Default::default(),
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

    /// A deleted APIService's name leaves its Service's connections with its last backend, so
    /// an endpoint probe never asks the backend for a group-version it no longer serves.
    #[tokio::test]
    async fn a_deleted_apiservice_leaves_its_services_connections() {
        let api = |name: &str, version: &str| RegisteredAPIService {
            traffic: Default::default(),
            name: name.into(),
            group: "shared.io".into(),
            version: version.into(),
            group_priority_minimum: 100,
            version_priority: 10,
            backend: apiservice::model::Backend::Local,
        };
        let spec = RemoteBackendSpec {
            service: apiservice::model::ServiceRef {
                namespace: "ns".into(),
                name: "api".into(),
                port: 443,
            },
            ca_bundle: None,
            insecure_skip_tls_verify: true,
        };
        let (_, drain) = watch::channel(false);
        let resolver: Arc<dyn ServiceResolver> = Arc::new(Closed(1));
        let alpha = api("v1alpha1.shared.io", "v1alpha1");
        let connections = Arc::new(
            RemoteBackend::service_connections(&alpha.name, &spec, &Default::default(), None)
                .unwrap(),
        );
        let backend = |a: &RegisteredAPIService| {
            RemoteBackend::with_connections(
                a,
                &spec,
                connections.clone(),
                resolver.clone(),
                drain.clone(),
            )
        };
        let first = connections.failures().clone();
        let alpha_backend = backend(&alpha);
        // The route table was rebuilt: a second backend for the same APIService, then the old
        // one dropped.
        let alpha_rebuilt = backend(&alpha);
        drop(alpha_backend);
        let beta_backend = backend(&api("v1beta1.shared.io", "v1beta1"));
        assert_eq!(
            first.first_api_service().as_deref(),
            Some("v1alpha1.shared.io")
        );
        drop(alpha_rebuilt);
        assert_eq!(
            first.first_api_service().as_deref(),
            Some("v1beta1.shared.io")
        );
        drop(beta_backend);
        assert_eq!(first.first_api_service(), None);
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
    fn only_a_3xx_with_a_location_is_a_forwarding_redirect() {
        let resp = |code: u16, location: bool| {
            let mut b = http::Response::builder().status(code);
            if location {
                b = b.header("location", "https://elsewhere.example/");
            }
            b.body(()).unwrap()
        };
        assert!(is_forwarding_redirect(&resp(302, true)));
        assert!(is_forwarding_redirect(&resp(307, true)));
        assert!(!is_forwarding_redirect(&resp(304, false)));
        assert!(!is_forwarding_redirect(&resp(300, false)));
        assert!(!is_forwarding_redirect(&resp(201, true)));
    }

    #[test]
    fn every_access_control_allow_header_is_removed() {
        let mut h = crate::test_util::headers(&[
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            ("access-control-allow-private-network", "true"),
            ("access-control-expose-headers", "etag"),
            ("etag", "\"1\""),
        ]);
        remove_cors_grants(&mut h);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["access-control-expose-headers", "etag"]);
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
