//! A fixture OIDC issuer for structured-authentication tests: an HTTPS server on 127.0.0.1 (port
//! 0) with its own CA, serving OIDC discovery (`/.well-known/openid-configuration`, and
//! optionally at another path, for `issuer.discoveryURL`) and the JWKS it names, counting both;
//! it mints compact JWTs with its current keys ([`Issuer::sign`]), rotates them
//! ([`Issuer::rotate`]), and fails on request ([`Issuer::misbehave`]).
//!
//! Keys: RS256/384/512 and PS256/384/512 sign with an RSA-2048 key committed under
//! `tests/fixtures/oidc/` (ring cannot generate RSA keys); ES256 and ES384 with P-256 and P-384
//! keys ring generates per issuer. Every JWT carries the `kid` of its key.

mod keys;
mod server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::certs::{install_crypto, TestCa};
use keys::{b64, Keys};

pub use server::{JWKS_PATH, WELL_KNOWN};

/// How the issuer fails, from now on (both discovery and JWKS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// It serves.
    None,
    /// Connections are closed before the TLS handshake: an issuer that is down.
    Refuse,
    /// Requests are never answered.
    Hang,
    /// A 200 whose body is not JSON.
    Garbage,
    /// A 200 whose JSON body is this many bytes and never ends.
    Oversized(usize),
    /// A 500.
    ServerError,
}

/// What to do with the old keys on [`Issuer::rotate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotation {
    /// The JWKS then serves the new keys only.
    Replace,
    /// The JWKS serves the new keys and the previous ones.
    Overlap,
}

/// How the issuer serves discovery.
#[derive(Clone, Debug)]
pub struct IssuerOptions {
    /// A tag in its kids (two issuers' kids differ).
    pub tag: String,
    /// Serve discovery at `/.well-known/openid-configuration` (off: only at `discovery_path`).
    pub well_known: bool,
    /// Also serve discovery at this path.
    pub discovery_path: Option<String>,
    /// The `issuer` discovery names, when not the issuer's URL.
    pub issuer_claim: Option<String>,
    /// How it fails from the start.
    pub misbehaviour: Misbehaviour,
}

impl Default for IssuerOptions {
    fn default() -> Self {
        IssuerOptions {
            tag: "idp".into(),
            well_known: true,
            discovery_path: None,
            issuer_claim: None,
            misbehaviour: Misbehaviour::None,
        }
    }
}

pub(crate) struct State {
    options: IssuerOptions,
    /// `https://127.0.0.1:<port>`.
    base: String,
    keys: Mutex<Keys>,
    /// The JWKS served: the current keys, and the previous ones after an overlapping rotation.
    published: Mutex<Vec<Value>>,
    misbehaviour: Mutex<Misbehaviour>,
    discovery_fetches: AtomicU64,
    jwks_fetches: AtomicU64,
}

impl State {
    fn misbehaviour(&self) -> Misbehaviour {
        *self.misbehaviour.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn published(&self) -> Vec<Value> {
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn issuer_claim(&self) -> String {
        let claim = self.options.issuer_claim.clone();
        claim.unwrap_or_else(|| self.base.clone())
    }
    fn is_alternate_discovery(&self, path: &str) -> bool {
        self.options.discovery_path.as_deref() == Some(path)
    }
}

/// A running issuer; stops when dropped.
pub struct Issuer {
    pub addr: SocketAddr,
    ca: TestCa,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").field("url", &self.url()).finish()
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Issuer {
    /// An issuer with [`IssuerOptions::default`].
    pub async fn start() -> Issuer {
        Issuer::start_with(IssuerOptions::default()).await
    }

    pub async fn start_with(options: IssuerOptions) -> Issuer {
        install_crypto();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let ca = TestCa::new("oidc-issuer-ca");
        let serving = ca.issue_server(&["127.0.0.1"]);
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                serving.cert_chain().unwrap(),
                serving.private_key().unwrap(),
            )
            .expect("the issuer's TLS config");
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let keys = Keys::new(&options.tag, 0);
        let state = Arc::new(State {
            base: format!("https://{addr}"),
            published: Mutex::new(keys.jwks()),
            keys: Mutex::new(keys),
            misbehaviour: Mutex::new(options.misbehaviour),
            options,
            discovery_fetches: AtomicU64::new(0),
            jwks_fetches: AtomicU64::new(0),
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(server::serve(listener, acceptor, state.clone()));
        Issuer {
            addr,
            ca,
            state,
            task,
        }
    }

    /// `https://127.0.0.1:<port>`: `issuer.url`, and the `iss` of its tokens.
    pub fn url(&self) -> String {
        self.state.base.clone()
    }

    /// The URL of the alternate discovery path, if it has one (`issuer.discoveryURL`).
    pub fn discovery_url(&self) -> Option<String> {
        let path = self.state.options.discovery_path.as_ref()?;
        Some(format!("{}{path}", self.state.base))
    }

    /// The CA that signed its serving certificate (`issuer.certificateAuthority`).
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Writes the CA to `dir/<name>`.
    pub fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        self.ca.write(dir, name).expect("writing the issuer CA")
    }

    /// Discovery documents served so far.
    pub fn discovery_fetches(&self) -> u64 {
        self.state.discovery_fetches.load(Ordering::SeqCst)
    }

    /// JWKS documents served so far.
    pub fn jwks_fetches(&self) -> u64 {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// The JWKS served now.
    pub fn jwks(&self) -> Value {
        json!({ "keys": self.state.published() })
    }

    /// How it fails from now on ([`Misbehaviour::None`]: it serves again).
    pub fn misbehave(&self, how: Misbehaviour) {
        *self
            .state
            .misbehaviour
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = how;
    }

    /// Moves to new signing keys (new kids); returns the new generation.
    pub fn rotate(&self, rotation: Rotation) -> u32 {
        let mut keys = self.state.keys.lock().unwrap_or_else(|e| e.into_inner());
        let next = Keys::new(&self.state.options.tag, keys.generation + 1);
        let mut published = next.jwks();
        if rotation == Rotation::Overlap {
            published.extend(keys.jwks());
        }
        *keys = next;
        *self
            .state
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = published;
        keys.generation
    }

    /// The kid `alg` signs with now.
    pub fn kid(&self, alg: &str) -> String {
        let keys = self.state.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.kid(alg).to_owned()
    }

    /// A compact JWT of `claims`, signed with `alg` by the current key of its family; the header
    /// is `{"alg", "kid", "typ": "JWT"}` (`none`: no kid).
    pub fn sign(&self, alg: &str, claims: Value) -> String {
        let header = match alg {
            "none" => json!({"alg": "none", "typ": "JWT"}),
            _ => json!({"alg": alg, "kid": self.kid(alg), "typ": "JWT"}),
        };
        self.sign_with_header(header, claims)
    }

    /// A compact JWT with exactly `header` (its `alg` picks the key; a `kid` is not added).
    pub fn sign_with_header(&self, header: Value, claims: Value) -> String {
        let alg = header["alg"]
            .as_str()
            .expect("a header with alg")
            .to_owned();
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let keys = self.state.keys.lock().unwrap_or_else(|e| e.into_inner());
        let signature = keys.sign(&alg, input.as_bytes());
        format!("{input}.{}", b64(&signature))
    }

    /// `iss` = this issuer, `aud`, `sub`, `iat` and `nbf` now, `exp` in an hour: the claims of a
    /// valid token, to extend.
    pub fn claims(&self, aud: &str, sub: &str) -> Value {
        let now = now();
        json!({"iss": self.url(), "aud": aud, "sub": sub, "iat": now, "nbf": now, "exp": now + 3600})
    }
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs() as i64
}

#[cfg(test)]
mod selftest;
