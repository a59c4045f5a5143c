//! The core server: a pooled client (HTTP/2 when the core offers it over TLS), a separate
//! HTTP/1.1 client for upgrades, and the gateway's own credentials for the requests it makes
//! itself (health, APIService watch, discovery).
//!
//! Proxied requests go out on one of up to three client sets, chosen per request by
//! `auth::onward` from `--core-identity` and how the caller authenticated: *caller* (no client
//! certificate: the caller's own token is the only credential), *proxy* (our proxy client
//! certificate, vouching for the `X-Remote-*` we set for certificate users), or *own* (the
//! gateway's credentials, with `Impersonate-*`). A proxied request never rides on the gateway's
//! own client certificate unless the gateway set its identity headers itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use gateway_config::tls::{self, Identity, ServerTrust};
use gateway_config::{CoreConfig, CoreEndpoint, CoreIdentity};
use http::header::{self, HeaderValue};
use http::uri::{Authority, Scheme};
use http::Uri;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rustls::pki_types::ServerName;
use tokio::sync::watch;

use super::failures::{FailureSignal, Watched};
use super::pool::{self, Http1Connections, PoolError, PoolSettings, ServiceConnections};
use super::probe::Probe;
use super::retry;
use super::unix::UnixConnector;
use crate::auth::onward::{prepare_core_request, CoreCredentials};
use crate::auth::Authenticated;
use crate::backend::proxy::{self, Upstream};
use crate::body::{Body, Request, Response};
use crate::error::GatewayError;
use crate::identity::ANONYMOUS;

#[derive(Debug, thiserror::Error)]
pub enum CoreSetupError {
    #[error("core TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("--core-kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("--core-url {0:?} is not a valid URL")]
    Url(String),
    #[error("--core-token-file {path}: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How the connections to the core that carry requests are pinged: as hyper-util's client did
/// before the pool carried them (10 s, 5 s), gentler than a remote backend's, since every
/// client's watches ride on them and a core busy for a few seconds is no reason to cut them.
const CORE_PING_INTERVAL: Duration = Duration::from_secs(10);
const CORE_PING_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
enum HttpClient {
    /// An HTTPS core: HTTP/2 when it picks it by ALPN, on as many connections as its stream
    /// limit asks for (see `pool`). kube-apiserver takes 100 streams per connection; hyper-util's
    /// client kept one connection and queued every request past the hundredth on it with no
    /// deadline, so a hundred open watches stalled every other request on those credentials.
    /// Go's client opens another connection, and so does the pool.
    Pool(Arc<ServiceConnections>),
    /// A plain-HTTP core (HTTP/1.1, a connection per request in flight) or a Unix socket.
    Legacy(Box<LegacyClient>),
}

/// hyper-util's client: plain HTTP, Unix sockets, and upgrades (whose answer must stay hyper's
/// own, for the upgrade to be taken from it).
#[derive(Clone)]
enum LegacyClient {
    Tcp(Client<HttpsConnector<HttpConnector>, Body>),
    Unix(Client<UnixConnector, Body>),
}

impl LegacyClient {
    async fn request(
        &self,
        req: Request,
    ) -> Result<hyper::Response<Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Self::Tcp(c) => c.request(req).await,
            Self::Unix(c) => c.request(req).await,
        }
    }
}

/// Why a request could not be sent to the core.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Client(#[from] hyper_util::client::legacy::Error),
}

impl SendError {
    /// The core refused the request without acting on it (a GOAWAY, REFUSED_STREAM).
    fn refused_unprocessed(&self) -> bool {
        match self {
            Self::Pool(PoolError::Request(e)) => pool::refused_unprocessed(e),
            Self::Pool(_) => false,
            Self::Client(e) => pool::refused_unprocessed(e),
        }
    }
}

// === impl HttpClient ===

impl HttpClient {
    /// Sends `req`, again on another connection when the core refused it unprocessed (see
    /// `retry`). Only HTTPS can carry HTTP/2 (chosen by ALPN), whose GOAWAY refuses streams
    /// already sent; over plain HTTP/1.1 hyper-util itself retries a request its closing
    /// connection never sent, so no copy is kept there (the sidecar core's hot path).
    async fn send(&self, req: Request) -> Result<http::Response<Body>, SendError> {
        let multiplexed = req.uri().scheme() == Some(&http::uri::Scheme::HTTPS);
        let mut again = multiplexed.then(|| retry::resendable(&req)).flatten();
        let mut req = req;
        let mut attempt = 1;
        loop {
            let sent = match self {
                Self::Pool(pool) => pool.send(req).await.map_err(SendError::from),
                Self::Legacy(c) => c
                    .request(req)
                    .await
                    .map(|r| r.map(crate::body::boxed))
                    .map_err(SendError::from),
            };
            match (sent, again.take()) {
                (Err(e), Some(copy))
                    if attempt < retry::MAX_ATTEMPTS && e.refused_unprocessed() =>
                {
                    tracing::debug!(error = %e, attempt, "the core refused the request unprocessed; sending again");
                    again = retry::resendable(&copy);
                    req = copy;
                    attempt += 1;
                }
                (sent, _) => return sent,
            }
        }
    }
}

/// Where the gateway's own credentials for the core come from.
enum Credentials {
    None,
    /// Re-read periodically: projected service-account tokens rotate.
    TokenFile(PathBuf, ArcSwapOption<HeaderValue>),
    Token(HeaderValue),
}

/// A pooled client and its HTTP/1.1 twins, with one TLS identity. Anonymous callers' requests
/// go out on HTTP/1.1: a k8s.io/apiserver core answers an anonymous request on HTTP/2 with a
/// GOAWAY (kube's `UnauthenticatedHTTP2DOSMitigation`), which would close the connection every
/// other caller's requests share; on HTTP/1.1 it keeps the connection alive.
#[derive(Clone)]
struct Clients {
    pooled: HttpClient,
    /// HTTP/1.1 only, for upgrades.
    upgrades: LegacyClient,
    /// HTTP/1.1 only, for anonymous callers (see `pool::http1`).
    http1: Http1Connections,
}

/// How the core is verified, and the clients to fall back to without a proxy certificate.
struct ProxyRebuild {
    trust: Option<ServerTrust>,
    authority: Authority,
    https: bool,
    caller: Clients,
}

/// The clients for a core at `authority` over TCP: pooled HTTP/2 connections when `https`.
fn tcp_clients(
    trust: Option<&ServerTrust>,
    identity: Option<&Identity>,
    authority: &Authority,
    https: bool,
) -> Result<Clients, CoreSetupError> {
    let http1 = tcp_connector(trust, identity, false)?;
    let pooled = if https {
        HttpClient::Pool(Arc::new(core_pool(trust, identity, authority)?))
    } else {
        HttpClient::Legacy(Box::new(LegacyClient::Tcp(
            super::client_builder().build(tcp_connector(trust, identity, true)?),
        )))
    };
    Ok(Clients {
        pooled,
        upgrades: LegacyClient::Tcp(super::client_builder().build(http1.clone())),
        http1: Http1Connections::new(http1),
    })
}

/// The connections to an HTTPS core, verified as `authority`'s host (the `--core-url` host,
/// as before). The pool's availability probe and failure signal are a remote backend's
/// business; the core's own readiness check watches the core.
fn core_pool(
    trust: Option<&ServerTrust>,
    identity: Option<&Identity>,
    authority: &Authority,
) -> Result<ServiceConnections, CoreSetupError> {
    let tls = tls::client_config(core_trust(trust), identity, &[])?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let server_name = ServerName::try_from(host.to_owned())
        .map_err(|_| CoreSetupError::Url(authority.to_string()))?;
    let connector = |http2: bool| {
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_only();
        let http = Watched::new(core_http_connector(), None);
        if http2 {
            builder.enable_http1().enable_http2().wrap_connector(http)
        } else {
            builder.enable_http1().wrap_connector(http)
        }
    };
    let settings = PoolSettings {
        request_ping_interval: CORE_PING_INTERVAL,
        request_ping_timeout: CORE_PING_TIMEOUT,
        ..PoolSettings::default()
    };
    Ok(ServiceConnections::new(
        connector(true),
        connector(true),
        connector(false),
        Probe::new(tls.clone(), server_name),
        FailureSignal::new(),
        settings,
    ))
}

pub struct CoreBackend {
    upstream: Upstream,
    url: String,
    /// The gateway's own TLS identity (if any): its own requests and impersonate mode.
    own: Clients,
    /// No client certificate: callers the core authenticates itself.
    caller: Clients,
    /// Our proxy client certificate: certificate users as `X-Remote-*` (passthrough mode).
    /// Swapped whole when the certificate is rotated (see `set_proxy_identity`).
    proxy: ArcSwap<Clients>,
    /// What the proxy clients are rebuilt from; `None` on a Unix socket (no TLS there).
    rebuild: Option<ProxyRebuild>,
    identity: CoreIdentity,
    credentials: Credentials,
    drain: watch::Receiver<bool>,
}

/// The clients of one core endpoint, one set per identity the gateway presents to it.
struct Connections {
    upstream: Upstream,
    url: String,
    own: Clients,
    caller: Clients,
    proxy: Clients,
    rebuild: Option<ProxyRebuild>,
}

impl Connections {
    fn unix(path: &std::path::Path) -> Self {
        let connector = UnixConnector(Arc::new(path.to_path_buf()));
        let client = LegacyClient::Unix(super::client_builder().build(connector.clone()));
        // No TLS on a socket: one client serves every identity.
        let clients = Clients {
            pooled: HttpClient::Legacy(Box::new(client.clone())),
            upgrades: client,
            http1: Http1Connections::new(connector),
        };
        Self {
            upstream: Upstream {
                scheme: Scheme::HTTP,
                authority: Authority::from_static("localhost"),
            },
            url: format!("unix://{}", path.display()),
            own: clients.clone(),
            caller: clients.clone(),
            proxy: clients,
            rebuild: None,
        }
    }

    fn tcp(
        url: &str,
        resolved: &Resolved,
        proxy_identity: Option<&Identity>,
    ) -> Result<Self, CoreSetupError> {
        let uri: Uri = url
            .parse()
            .map_err(|_| CoreSetupError::Url(url.to_owned()))?;
        let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned())
        else {
            return Err(CoreSetupError::Url(url.to_owned()));
        };
        let trust = resolved.trust.as_ref();
        let https = scheme == Scheme::HTTPS;
        let clients = |identity: Option<&Identity>| tcp_clients(trust, identity, &authority, https);
        let own = clients(resolved.identity.as_ref())?;
        // Without a certificate of our own, the caller clients would be the same.
        let caller = match resolved.identity {
            Some(_) => clients(None)?,
            None => own.clone(),
        };
        let proxy = match proxy_identity {
            Some(id) => clients(Some(id))?,
            None => caller.clone(),
        };
        let rebuild = ProxyRebuild {
            trust: resolved.trust.clone(),
            authority: authority.clone(),
            https,
            caller: caller.clone(),
        };
        Ok(Self {
            upstream: Upstream { scheme, authority },
            url: url.to_owned(),
            own,
            caller,
            proxy,
            rebuild: Some(rebuild),
        })
    }
}

/// The gateway's own bearer token for the core: `--core-token-file`'s, or the kubeconfig's.
fn credentials(cfg: &CoreConfig, token: Option<String>) -> Result<Credentials, CoreSetupError> {
    Ok(match (&cfg.token_file, token) {
        (Some(path), _) => {
            let token = read_token(path)?;
            Credentials::TokenFile(path.clone(), ArcSwapOption::from_pointee(token))
        }
        (None, Some(t)) => {
            Credentials::Token(bearer(&t).ok_or_else(|| CoreSetupError::Kubeconfig {
                path: cfg.kubeconfig.clone().unwrap_or_default(),
                message: "token is not a valid header value".into(),
            })?)
        }
        (None, None) => Credentials::None,
    })
}

/// Everything needed to reach the core, after merging --core-kubeconfig with the --core-* flags.
struct Resolved {
    endpoint: CoreEndpoint,
    trust: Option<ServerTrust>,
    identity: Option<Identity>,
    token: Option<String>,
}

async fn resolve(cfg: &CoreConfig) -> Result<Resolved, CoreSetupError> {
    let mut resolved = Resolved {
        endpoint: CoreEndpoint::Url(String::new()),
        trust: None,
        identity: None,
        token: None,
    };
    if let Some(path) = &cfg.kubeconfig {
        let err = |message: String| CoreSetupError::Kubeconfig {
            path: path.clone(),
            message,
        };
        // kube-rs's messages may carry a multi-line source snippet; the first line says it.
        let first_line = |e: &dyn std::fmt::Display| {
            let text = e.to_string();
            text.lines().next().unwrap_or_default().trim().to_owned()
        };
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .map_err(|e| err(format!("not a usable kubeconfig ({})", first_line(&e))))?;
        let kc = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| err(first_line(&e)))?;
        if cfg.endpoint.is_none() && !matches!(kc.cluster_url.path(), "" | "/") {
            // Requests keep the client's path, so a server below a path prefix cannot be proxied.
            return Err(err(format!(
                "the server {} has a path; the core must be served at its root (or set --core-url)",
                kc.cluster_url
            )));
        }
        resolved.endpoint =
            CoreEndpoint::Url(kc.cluster_url.to_string().trim_end_matches('/').to_owned());
        if kc.accept_invalid_certs {
            resolved.trust = Some(ServerTrust::InsecureSkipVerify);
        } else if let Some(ders) = &kc.root_cert {
            let mut roots = rustls::RootCertStore::empty();
            for der in ders {
                roots
                    .add(der.clone().into())
                    .map_err(|e| err(e.to_string()))?;
            }
            resolved.trust = Some(ServerTrust::Roots(roots));
        }
        resolved.identity = kubeconfig_identity(&kc.auth_info).map_err(err)?;
        if let Some(token) = kc.auth_info.token.as_ref() {
            use secrecy::ExposeSecret;
            resolved.token = Some(token.expose_secret().to_owned());
        }
    }
    if let Some(endpoint) = &cfg.endpoint {
        resolved.endpoint = endpoint.clone();
    }
    if let Some(ca) = &cfg.ca_file {
        resolved.trust = Some(ServerTrust::Roots(tls::load_roots(&[ca.as_path()])?));
    }
    if let Some(pair) = &cfg.client_cert {
        resolved.identity = Some(Identity::load(pair)?);
    }
    Ok(resolved)
}

// === impl CoreSetupError ===

impl CoreSetupError {
    /// The flag whose value is at fault, for the one-line configuration refusal.
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Tls(_) => "core-ca-file",
            Self::Kubeconfig { .. } => "core-kubeconfig",
            Self::Url(_) => "core-url",
            Self::Token { .. } => "core-token-file",
        }
    }
}

/// Loads what `--core-kubeconfig` and the `--core-*` flags name, with kube-rs's kubeconfig
/// loader, and builds the TLS clients from it, without connecting: a core the gateway could not
/// start with is refused up front, and `--check-config` answers as a start would.
pub async fn check_settings(cfg: &CoreConfig) -> Result<(), CoreSetupError> {
    let resolved = resolve(cfg).await?;
    tcp_connector(resolved.trust.as_ref(), resolved.identity.as_ref(), true).map_err(|e| {
        match (&cfg.kubeconfig, &cfg.client_cert) {
            // The client certificate came from the kubeconfig: say so, not --core-ca-file.
            (Some(path), None) => CoreSetupError::Kubeconfig {
                path: path.clone(),
                message: format!("its TLS client settings cannot be used ({e})"),
            },
            _ => e,
        }
    })?;
    Ok(())
}

/// The client certificate a kubeconfig user names, inline (base64 `*-data`) or as files.
fn kubeconfig_identity(user: &kube::config::AuthInfo) -> Result<Option<Identity>, String> {
    use base64::Engine;
    use rustls::pki_types::pem::PemObject;
    use secrecy::ExposeSecret;
    let decode = |b64: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| e.to_string())
    };
    let cert = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => decode(data)?,
        (None, Some(path)) => std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        (None, None) => return Ok(None),
    };
    let key = match (&user.client_key_data, &user.client_key) {
        (Some(data), _) => decode(data.expose_secret())?,
        (None, Some(path)) => std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        (None, None) => return Err("client certificate without a client key".into()),
    };
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&key).map_err(|e| e.to_string())?;
    Ok(Some(Identity { certs, key }))
}

fn core_http_connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    http
}

/// How the core is verified: as configured, or by the system's roots.
fn core_trust(trust: Option<&ServerTrust>) -> ServerTrust {
    match trust {
        Some(ServerTrust::Roots(r)) => ServerTrust::Roots(r.clone()),
        Some(ServerTrust::InsecureSkipVerify) => ServerTrust::InsecureSkipVerify,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            ServerTrust::Roots(roots)
        }
    }
}

fn tcp_connector(
    trust: Option<&ServerTrust>,
    identity: Option<&Identity>,
    http2: bool,
) -> Result<HttpsConnector<HttpConnector>, CoreSetupError> {
    let http = core_http_connector();
    // hyper-rustls sets ALPN itself from the enabled HTTP versions.
    let tls = tls::client_config(core_trust(trust), identity, &[])?;
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    Ok(if http2 {
        builder.enable_http1().enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    })
}

// === impl CoreBackend ===

impl CoreBackend {
    /// Rebuilds the proxy-certificate clients whenever the certificate is rotated; runs until
    /// the certificate's sender is gone.
    pub async fn follow_proxy_identity(
        self: Arc<Self>,
        mut identity: watch::Receiver<Option<Arc<Identity>>>,
    ) {
        while identity.changed().await.is_ok() {
            let current = identity.borrow_and_update().clone();
            self.set_proxy_identity(current.as_deref());
        }
    }

    /// `proxy_identity` is the proxy client certificate (`--proxy-client-cert-file`), presented
    /// to the core for certificate users in passthrough mode.
    pub async fn new(
        cfg: &CoreConfig,
        proxy_identity: Option<&Identity>,
        drain: watch::Receiver<bool>,
    ) -> Result<Self, CoreSetupError> {
        let resolved = resolve(cfg).await?;
        let Connections {
            upstream,
            url,
            own,
            caller,
            proxy,
            rebuild,
        } = match &resolved.endpoint {
            CoreEndpoint::Unix(path) => Connections::unix(path),
            CoreEndpoint::Url(url) => Connections::tcp(url, &resolved, proxy_identity)?,
        };
        let credentials = credentials(cfg, resolved.token)?;
        if cfg.identity == CoreIdentity::Passthrough && proxy_identity.is_none() {
            tracing::info!("no --proxy-client-cert-file: certificate users reach the core without identity headers it can trust");
        }
        Ok(Self {
            upstream,
            url,
            own,
            caller,
            proxy: ArcSwap::from_pointee(proxy),
            rebuild,
            identity: cfg.identity,
            credentials,
            drain,
        })
    }

    /// Presents a rotated proxy client certificate on new connections to the core; requests
    /// already in flight finish on their connections. A build failure keeps the previous clients.
    pub fn set_proxy_identity(&self, identity: Option<&Identity>) {
        let Some(rebuild) = &self.rebuild else { return };
        let clients = match identity {
            Some(id) => match tcp_clients(
                rebuild.trust.as_ref(),
                Some(id),
                &rebuild.authority,
                rebuild.https,
            ) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "keeping the previous proxy client certificate for the core");
                    return;
                }
            },
            None => rebuild.caller.clone(),
        };
        self.proxy.store(Arc::new(clients));
    }

    /// The core's URL as the user configured it (for messages).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Proxies a client request to the core: path, query and headers as the client sent them,
    /// except identity (see the module documentation and `auth::onward`).
    pub async fn forward(
        &self,
        mut req: Request,
        client: Option<SocketAddr>,
        long_running: bool,
    ) -> Result<Response, GatewayError> {
        let upgrade = proxy::is_upgrade(req.headers());
        // Hop-by-hop stripping first: `Connection` may name any header, and whatever it names
        // is removed. Identity headers and our own `Authorization` must come after it, or a
        // caller could strip them and reach the core on our credentials.
        proxy::prepare_request(&mut req, &self.upstream, client);
        let (mut parts, body) = req.into_parts();
        // One lookup in the extensions for both uses below.
        let authenticated = parts.extensions.get::<Authenticated>();
        let anonymous = authenticated.is_some_and(|a| a.user().name == ANONYMOUS);
        let credentials = prepare_core_request(&mut parts.headers, authenticated, self.identity)?;
        let proxy_clients;
        let clients = match credentials {
            CoreCredentials::Caller => &self.caller,
            CoreCredentials::Proxy => {
                proxy_clients = self.proxy.load();
                &**proxy_clients
            }
            CoreCredentials::Own => {
                if let Some(auth) = self.authorization() {
                    parts.headers.insert(header::AUTHORIZATION, auth);
                }
                &self.own
            }
        };
        let req = Request::from_parts(parts, body);
        if upgrade {
            return proxy::forward_upgrade(
                req,
                |r| clients.upgrades.request(r),
                self.drain.clone(),
            )
            .await
            .map_err(|e| self.unavailable(e));
        }
        // Without TLS there is no ALPN to pick HTTP/2, so every request to a plain-HTTP (or
        // Unix socket) core is HTTP/1.1 anyway: the kept connections carry them all.
        let http1 = anonymous || self.upstream.scheme != Scheme::HTTPS;
        let resp = if http1 {
            // A request the core's connection closed under before it was sent comes back from
            // hyper and is sent again there; nothing else is, so no copy is kept.
            let (resp, connection) = clients
                .http1
                .send(req)
                .await
                .map_err(|e| self.unavailable(e))?;
            resp.map(|b| crate::body::with_guard(b, connection))
        } else {
            clients
                .pooled
                .send(req)
                .await
                .map_err(|e| self.unavailable(e))?
        };
        Ok(proxy::client_response(resp, long_running, &self.drain))
    }

    /// A request the gateway makes on its own behalf, with its own credentials.
    pub async fn send_own(&self, mut req: Request) -> Result<Response, GatewayError> {
        let path_and_query = req.uri().path_and_query().cloned();
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.upstream.scheme.clone());
        parts.authority = Some(self.upstream.authority.clone());
        parts.path_and_query = path_and_query;
        *req.uri_mut() =
            Uri::from_parts(parts).map_err(|e| GatewayError::Internal(e.to_string()))?;
        if let Some(auth) = self.authorization() {
            req.headers_mut().insert(header::AUTHORIZATION, auth);
        }
        self.own
            .pooled
            .send(req)
            .await
            .map_err(|e| self.unavailable(e))
    }

    fn authorization(&self) -> Option<HeaderValue> {
        match &self.credentials {
            Credentials::None => None,
            Credentials::Token(v) => Some(v.clone()),
            Credentials::TokenFile(_, v) => v.load_full().map(|v| (*v).clone()),
        }
    }

    /// Re-reads a token file (called periodically; a failed read keeps the previous token).
    pub fn refresh_token(&self) {
        if let Credentials::TokenFile(path, current) = &self.credentials {
            match read_token(path) {
                Ok(v) => current.store(Some(Arc::new(v))),
                Err(e) => tracing::warn!(error = %e, "keeping the previous core token"),
            }
        }
    }

    fn unavailable(&self, e: impl std::error::Error + Send + Sync + 'static) -> GatewayError {
        GatewayError::CoreUnavailable {
            url: self.url.clone(),
            source: Box::new(e),
        }
    }
}

fn bearer(token: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim())).ok()?;
    v.set_sensitive(true);
    Some(v)
}

fn read_token(path: &PathBuf) -> Result<HeaderValue, CoreSetupError> {
    let text = std::fs::read_to_string(path).map_err(|source| CoreSetupError::Token {
        path: path.clone(),
        source,
    })?;
    bearer(&text).ok_or_else(|| CoreSetupError::Token {
        path: path.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a valid bearer token"),
    })
}
