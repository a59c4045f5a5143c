//! Client certificates. The TLS handshake accepts a chain from either the client CA or the
//! request-header CA (one rustls verifier over their union), so by the time a request arrives we
//! only know that the chain is good for *one* of them. Which one matters: a front-proxy
//! certificate may vouch for `X-Remote-*` headers but is not itself a user, and a user's
//! certificate must never make its `X-Remote-*` headers believed. So every chain is verified
//! again, separately, against each CA.
//!
//! The verifiers are rebuilt when the CA files change (same directory watch as the serving
//! material), and swapped in atomically; a broken file keeps the previous verifiers.
//!
//! A chain cannot change within a TLS connection, so a connection's requests share one
//! verification ([`PeerCertificates`]): an ECDSA check per request was a fifth of the gateway's
//! CPU for certificate users. It is done again when the verifiers are rebuilt, and at least every
//! [`RECHECK`], so a certificate that expires stops working within that.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use gateway_config::tls::{self, TlsError};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use tokio::time::Instant;

use crate::identity::UserInfo;

/// User (CN) and groups (every O) from a DER certificate's subject, as kube-apiserver's x509
/// authenticator reads them. `None` when the certificate cannot be parsed or has no CN: kube then
/// treats the certificate as naming nobody and moves on to other credentials.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = common_name(subject)?;
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(UserInfo {
        name,
        groups,
        ..UserInfo::default()
    })
}

/// The subject's common name as Go's `crypto/x509` reads it, which is what kube-apiserver and
/// every Go backend use: `pkix.Name.FillFromRDNSequence` walks every attribute of every RDN and
/// assigns each string-valued CN in turn, so with several CNs **the last one** names the user.
/// Reading the first instead would let one certificate be `alice` here and `admin` at the core.
/// `None` when there is none (or it is empty).
fn common_name(subject: &x509_parser::x509::X509Name<'_>) -> Option<String> {
    subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .last()
        .filter(|cn| !cn.is_empty())
        .map(str::to_owned)
}

/// The common name of the certificate `der`, as [`common_name`] reads it (the last of several).
pub(crate) fn leaf_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    common_name(cert.subject())
}

/// A verifier for one CA bundle.
fn verifier(path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = tls::load_roots(&[path])?;
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| TlsError::Roots {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn verify(
    verifier: &dyn ClientCertVerifier,
    chain: &[CertificateDer<'static>],
) -> Result<(), String> {
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or_else(|| "empty certificate chain".to_owned())?;
    verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

struct Verifiers {
    client_ca: Option<Arc<dyn ClientCertVerifier>>,
    requestheader_ca: Option<Arc<dyn ClientCertVerifier>>,
}

/// How long a connection's verified chain is trusted before it is verified again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// A connection's client certificate chain (leaf first), and the last check of it, shared by the
/// connection's requests.
pub struct PeerCertificates {
    pub chain: Vec<CertificateDer<'static>>,
    /// Read without a lock: the connection's HTTP/2 streams read it at once.
    last: ArcSwapOption<LastCheck>,
}

struct LastCheck {
    /// The verifiers it was made with: a reload makes it stale at once.
    verifiers: Arc<Verifiers>,
    at: Instant,
    check: CertCheck,
}

// === impl PeerCertificates ===

impl PeerCertificates {
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        Self {
            chain,
            last: ArcSwapOption::empty(),
        }
    }
}

impl std::fmt::Debug for PeerCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCertificates")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// What a presented certificate chain is good for.
#[derive(Clone, Debug, Default)]
pub struct CertCheck {
    /// `Some(Ok)` when the chain belongs to the request-header CA and its CN is allowed: its
    /// `X-Remote-*` headers may be believed. `Some(Err)` says why not; `None` when no
    /// request-header CA is configured.
    pub front_proxy: Option<Result<(), String>>,
    /// `Some(Ok(user))` when the chain belongs to the client CA (`None` inside when the
    /// certificate names nobody). `None` when no client CA is configured.
    pub user: Option<Result<Option<UserInfo>, String>>,
}

pub struct CertAuthenticator {
    client_ca_file: Option<PathBuf>,
    requestheader_ca_file: Option<PathBuf>,
    allowed_names: Vec<String>,
    verifiers: ArcSwap<Verifiers>,
}

// === impl CertAuthenticator ===

impl CertAuthenticator {
    pub fn new(
        client_ca_file: Option<PathBuf>,
        requestheader_ca_file: Option<PathBuf>,
        allowed_names: Vec<String>,
    ) -> Result<Self, TlsError> {
        let verifiers = Self::build(client_ca_file.as_deref(), requestheader_ca_file.as_deref())?;
        Ok(Self {
            client_ca_file,
            requestheader_ca_file,
            allowed_names,
            verifiers: ArcSwap::from_pointee(verifiers),
        })
    }

    fn build(client: Option<&Path>, requestheader: Option<&Path>) -> Result<Verifiers, TlsError> {
        Ok(Verifiers {
            client_ca: client.map(verifier).transpose()?,
            requestheader_ca: requestheader.map(verifier).transpose()?,
        })
    }

    /// The CA files, for the reload watch.
    pub fn files(&self) -> Vec<PathBuf> {
        self.client_ca_file
            .iter()
            .chain(self.requestheader_ca_file.iter())
            .cloned()
            .collect()
    }

    /// Re-reads the CA files; on error the previous verifiers stay.
    pub fn reload(&self) {
        match Self::build(
            self.client_ca_file.as_deref(),
            self.requestheader_ca_file.as_deref(),
        ) {
            Ok(v) => {
                self.verifiers.store(Arc::new(v));
                tracing::info!("client certificate authorities reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "keeping the previous client certificate authorities")
            }
        }
    }

    /// What a connection's chain is good for: its last check while that is fresh (made with
    /// the current verifiers, less than [`RECHECK`] ago), else a new one.
    pub fn check_peer(&self, peer: &PeerCertificates) -> CertCheck {
        let verifiers = self.verifiers.load_full();
        if let Some(last) = &*peer.last.load() {
            if Arc::ptr_eq(&last.verifiers, &verifiers) && last.at.elapsed() < RECHECK {
                return last.check.clone();
            }
        }
        let check = self.check_with(&verifiers, &peer.chain);
        peer.last.store(Some(Arc::new(LastCheck {
            verifiers,
            at: Instant::now(),
            check: check.clone(),
        })));
        check
    }

    /// Verifies `chain` (leaf first) against each CA separately: a signature check or two.
    pub fn check(&self, chain: &[CertificateDer<'static>]) -> CertCheck {
        self.check_with(&self.verifiers.load(), chain)
    }

    fn check_with(&self, verifiers: &Verifiers, chain: &[CertificateDer<'static>]) -> CertCheck {
        let front_proxy = verifiers.requestheader_ca.as_deref().map(|v| {
            verify(v, chain)
                .map_err(|e| format!("not a front-proxy certificate: {e}"))
                .and_then(|()| self.allowed(chain))
        });
        let user = verifiers.client_ca.as_deref().map(|v| {
            verify(v, chain)
                .map_err(|e| format!("verifying the client certificate: {e}"))
                .map(|()| chain.first().and_then(|leaf| user_from_certificate(leaf)))
        });
        CertCheck { front_proxy, user }
    }

    fn allowed(&self, chain: &[CertificateDer<'static>]) -> Result<(), String> {
        if self.allowed_names.is_empty() {
            return Ok(());
        }
        let cn = chain.first().and_then(|leaf| leaf_common_name(leaf));
        match cn {
            Some(cn) if self.allowed_names.contains(&cn) => Ok(()),
            cn => Err(format!(
                "front-proxy certificate CN {:?} is not one of --requestheader-allowed-names {:?}",
                cn.unwrap_or_default(),
                self.allowed_names
            )),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    pub struct Ca {
        pub pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl Ca {
        pub fn new(cn: &str) -> Ca {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let cert = params.self_signed(&key).unwrap();
            Ca {
                pem: cert.pem(),
                issuer: Issuer::new(params, key),
            }
        }

        /// A client certificate: CN = `cn`, one O (rcgen keeps a single value per type).
        pub fn client(&self, cn: &str, org: Option<&str>) -> Vec<CertificateDer<'static>> {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, cn);
            if let Some(o) = org {
                params.distinguished_name.push(DnType::OrganizationName, o);
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            vec![cert.der().clone()]
        }

        /// A client certificate whose subject has one CN RDN per name, in order. rcgen keeps one
        /// value per attribute type, so the later names go in under CN's OID spelled as a custom
        /// type, which encodes the same.
        pub fn client_named(&self, cns: &[&str]) -> Vec<CertificateDer<'static>> {
            // A third name would replace the second under the same custom key.
            assert!(cns.len() <= 2, "at most two common names");
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::default();
            for (i, cn) in cns.iter().enumerate() {
                let ty = if i == 0 {
                    DnType::CommonName
                } else {
                    DnType::CustomDnType(vec![2, 5, 4, 3])
                };
                params.distinguished_name.push(ty, *cn);
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            vec![cert.der().clone()]
        }

        pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
            let path = dir.join(name);
            std::fs::write(&path, &self.pem).unwrap();
            path
        }
    }

    fn provider() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }

    #[test]
    fn each_chain_is_attributed_to_its_own_ca() {
        provider();
        let dir = tempfile_dir();
        let users = Ca::new("users");
        let proxies = Ca::new("front-proxy");
        let auth = CertAuthenticator::new(
            Some(users.write(&dir, "users.pem")),
            Some(proxies.write(&dir, "proxies.pem")),
            vec!["front-proxy".into()],
        )
        .unwrap();

        let alice = auth.check(&users.client("alice", Some("dev")));
        let user = alice.user.unwrap().unwrap().unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev"]);
        assert!(alice.front_proxy.unwrap().is_err(), "a user is not a proxy");

        let proxy = auth.check(&proxies.client("front-proxy", None));
        assert!(proxy.front_proxy.unwrap().is_ok());
        assert!(proxy.user.unwrap().is_err(), "a proxy is not a user");

        let stranger = auth.check(&proxies.client("someone-else", None));
        let why = stranger.front_proxy.unwrap().unwrap_err();
        assert!(why.contains("someone-else"), "{why}");

        let foreign = Ca::new("other").client("mallory", Some("system:masters"));
        let check = auth.check(&foreign);
        assert!(check.user.unwrap().is_err());
        assert!(check.front_proxy.unwrap().is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A connection's requests share one verification, until the CA files are reloaded: then a
    /// chain the new CA does not sign is refused at once, whatever was concluded before.
    #[tokio::test(start_paused = true)]
    async fn a_connections_chain_is_verified_again_after_a_reload_and_after_recheck() {
        provider();
        let dir = tempfile_dir();
        let users = Ca::new("users");
        let file = users.write(&dir, "users.pem");
        let auth = CertAuthenticator::new(Some(file.clone()), None, vec![]).unwrap();
        let peer = PeerCertificates::new(users.client("alice", Some("dev")));

        let first = auth.check_peer(&peer);
        assert_eq!(first.user.unwrap().unwrap().unwrap().name, "alice");
        let checked_at = peer.last.load().as_ref().unwrap().at;
        // Within RECHECK, the same conclusion without a new verification.
        tokio::time::advance(RECHECK / 2).await;
        assert!(auth.check_peer(&peer).user.unwrap().is_ok());
        assert_eq!(peer.last.load().as_ref().unwrap().at, checked_at);
        // After RECHECK, verified again.
        tokio::time::advance(RECHECK).await;
        assert!(auth.check_peer(&peer).user.unwrap().is_ok());
        assert!(peer.last.load().as_ref().unwrap().at > checked_at);

        // The CA is replaced: alice's chain no longer verifies, at once.
        std::fs::write(&file, Ca::new("other users").pem).unwrap();
        auth.reload();
        let after = auth.check_peer(&peer);
        assert!(
            after.user.unwrap().is_err(),
            "a chain verified with the previous CA stayed accepted after a reload"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn any_name_is_allowed_when_the_list_is_empty() {
        provider();
        let dir = tempfile_dir();
        let proxies = Ca::new("front-proxy");
        let auth =
            CertAuthenticator::new(None, Some(proxies.write(&dir, "p.pem")), vec![]).unwrap();
        let check = auth.check(&proxies.client("anything", None));
        assert!(check.front_proxy.unwrap().is_ok());
        assert!(check.user.is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_certificate_without_cn_names_nobody() {
        provider();
        let dir = tempfile_dir();
        let users = Ca::new("users");
        let auth = CertAuthenticator::new(Some(users.write(&dir, "u.pem")), None, vec![]).unwrap();
        let check = auth.check(&users.client("", Some("dev")));
        assert!(matches!(check.user, Some(Ok(None))), "{check:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_last_of_several_common_names_is_the_name_as_in_go() {
        provider();
        let dir = tempfile_dir();
        let users = Ca::new("users");
        let proxies = Ca::new("front-proxy");
        let auth = CertAuthenticator::new(
            Some(users.write(&dir, "users.pem")),
            Some(proxies.write(&dir, "proxies.pem")),
            vec!["front-proxy".into()],
        )
        .unwrap();
        let user = auth.check(&users.client_named(&["alice", "admin"]));
        assert_eq!(user.user.unwrap().unwrap().unwrap().name, "admin");

        let allowed_last = auth.check(&proxies.client_named(&["other", "front-proxy"]));
        assert!(allowed_last.front_proxy.unwrap().is_ok());
        let allowed_first = auth.check(&proxies.client_named(&["front-proxy", "other"]));
        let why = allowed_first.front_proxy.unwrap().unwrap_err();
        assert!(why.contains("\"other\""), "{why}");
        let _ = std::fs::remove_dir_all(dir);
    }

    pub fn tempfile_dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gateway-auth-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
