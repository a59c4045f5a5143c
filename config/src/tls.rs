//! TLS material: loading PEM files and building rustls configurations here; the serving identity
//! (user files or a generated pair, `--cert-dir`) in `serving`, and noticing when files change on
//! disk in `watch`. One crypto provider, ring, for the whole process.

mod serving;
mod watch;

pub use serving::{check_private_dir, ensure_serving_cert, ServingIdentity};
pub use watch::{describe, not_after_unix, watch_files, DEFAULT_RESYNC};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::config::CertKeyPair;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {path}: {source}")]
    Certs {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCerts { path: PathBuf },
    #[error("cannot read private key from {path}: {source}")]
    Key {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("CA bundle {path}: {message}")]
    Roots { path: PathBuf, message: String },
    #[error("CA bundle from {origin}: {message}")]
    RootsPem { origin: String, message: String },
    #[error("certificate {cert} does not go with key {key}, or is unusable: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("generating a self-signed serving certificate: {0}")]
    Generate(String),
    #[error("--cert-dir {path} cannot hold a private key: {why}; give a directory only this user can write (mode 0700)")]
    UnsafeCertDir { path: PathBuf, why: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The process-wide provider. Installing it first thing keeps rustls from guessing (and panicking
/// when two providers are compiled in).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn suite_name(suite: &rustls::SupportedCipherSuite) -> String {
    format!("{:?}", suite.suite())
}

/// IANA names of the TLS 1.2 suites that may be chosen with --tls-cipher-suites.
pub fn supported_cipher_suite_names() -> Vec<String> {
    provider()
        .cipher_suites
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS12)
        .map(suite_name)
        .collect()
}

pub fn cipher_suite_known(name: &str) -> bool {
    supported_cipher_suite_names().iter().any(|s| s == name)
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certs {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCerts {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Key {
        path: path.to_owned(),
        source,
    })
}

/// Root store from one or more CA bundle files.
pub fn load_roots(paths: &[&Path]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for path in paths {
        for cert in load_certs(path)? {
            roots.add(cert).map_err(|e| TlsError::Roots {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
    }
    Ok(roots)
}

/// Root store from PEM bytes, e.g. an APIService's `spec.caBundle`.
pub fn roots_from_pem(pem: &[u8], origin: &str) -> Result<RootCertStore, TlsError> {
    ca_roots(pem).map_err(|message| TlsError::RootsPem {
        origin: origin.to_owned(),
        message,
    })
}

/// Why PEM material a user supplied cannot be used, worded for a refusal at start: what is wrong
/// and what to give instead. The caller prefixes where the material came from.
fn pem_error(e: &rustls::pki_types::pem::Error, kind: &str) -> String {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { end_marker } => {
            let label = String::from_utf8_lossy(end_marker);
            format!("is truncated: a \"BEGIN {label}\" block has no \"END {label}\" line")
        }
        E::IllegalSectionStart { line } => format!(
            "is not valid PEM: malformed line {:?}",
            String::from_utf8_lossy(line)
        ),
        E::Base64Decode(m) => format!("is not valid PEM: a {kind} block is not base64 ({m})"),
        other => format!("is not valid PEM: {other}"),
    }
}

fn not_pem(pem: &[u8], convert: &str) -> Option<String> {
    (!pem.windows(10).any(|w| w == b"-----BEGIN")).then(|| {
        format!("is not PEM (no \"-----BEGIN\" line); a DER file converts with `{convert}`")
    })
}

/// Certificates from PEM bytes; at least one, or a message saying why not.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    if let Some(m) = not_pem(pem, "openssl x509 -inform der -in FILE") {
        return Err(m);
    }
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(&e, "CERTIFICATE"))?;
    if certs.is_empty() {
        return Err(
            "holds no \"BEGIN CERTIFICATE\" block (is it a key or a CSR?); give the PEM certificate"
                .to_owned(),
        );
    }
    Ok(certs)
}

/// A private key from PEM bytes, or a message saying why not.
pub fn key_from_pem(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    use rustls::pki_types::pem::Error as E;
    if let Some(m) = not_pem(pem, "openssl pkey -inform der -in FILE") {
        return Err(m);
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        E::NoItemsFound => "holds no unencrypted private key (\"BEGIN PRIVATE KEY\", \"BEGIN RSA \
             PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\"); give the key, decrypted"
            .to_owned(),
        e => pem_error(&e, "PRIVATE KEY"),
    })
}

/// Checks a CA bundle the way it is used at run time (see [`ca_roots`]).
pub fn check_ca_pem(pem: &[u8]) -> Result<(), String> {
    ca_roots(pem).map(drop)
}

/// Every certificate in a CA bundle as a trust anchor; at least one, or a message saying why
/// not. One reading for the bundles checked at start and the `caBundle`s read at run time.
fn ca_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs_from_pem(pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "certificate #{} cannot be used as a CA ({e}); give PEM CA certificates",
                i + 1
            )
        })?;
    }
    Ok(roots)
}

/// Checks that a key belongs to a certificate chain (and that its algorithm is supported): the
/// same check [`Identity::load`] makes when it loads the files.
pub fn check_pair(
    certs: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
) -> Result<(), String> {
    ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs.to_vec(), key.clone_key())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A certificate chain and its key, loaded together so a half-rotated pair is caught.
#[derive(Debug)]
pub struct Identity {
    pub certs: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

// === impl Identity ===

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    pub fn load(pair: &CertKeyPair) -> Result<Self, TlsError> {
        let certs = load_certs(&pair.cert_file)?;
        let key = load_key(&pair.key_file)?;
        // Building a throwaway config is the cheapest check that the key matches the certificate.
        ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|source| TlsError::Pair {
                cert: pair.cert_file.clone(),
                key: pair.key_file.clone(),
                source,
            })?;
        Ok(Self { certs, key })
    }
}

/// Everything that goes into the serving `ServerConfig`; rebuilt as a whole on reload because the
/// client-CA set is fixed per config.
#[derive(Debug, Clone)]
pub struct ServerTlsSettings {
    pub serving: ServingIdentity,
    /// CA bundles that may sign client certificates (client CA and request-header CA). rustls
    /// accepts any of them at the handshake; authentication decides which one a chain belongs to.
    pub client_ca_files: Vec<PathBuf>,
    pub tls13_only: bool,
    pub cipher_suites: Vec<String>,
}

// === impl ServerTlsSettings ===

impl ServerTlsSettings {
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = self.serving.files();
        files.extend(self.client_ca_files.iter().cloned());
        files
    }

    /// The serving `ServerConfig` and the certificate chain it presents.
    pub fn build(&self) -> Result<(Arc<ServerConfig>, Vec<CertificateDer<'static>>), TlsError> {
        let mut provider = provider();
        if !self.cipher_suites.is_empty() {
            provider.cipher_suites.retain(|s| {
                s.version() == &rustls::version::TLS13
                    || self.cipher_suites.contains(&suite_name(s))
            });
        }
        let provider = Arc::new(provider);
        let versions: &[&rustls::SupportedProtocolVersion] = if self.tls13_only {
            &[&rustls::version::TLS13]
        } else {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)?;
        let identity = self.serving.load()?;
        let chain = identity.certs.clone();
        let builder = if self.client_ca_files.is_empty() {
            builder.with_no_client_auth()
        } else {
            let paths: Vec<&Path> = self.client_ca_files.iter().map(PathBuf::as_path).collect();
            let roots = load_roots(&paths)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Roots {
                    path: self.client_ca_files[0].clone(),
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        };
        let mut config = builder
            .with_single_cert(identity.certs, identity.key)
            .map_err(|source| {
                let (cert, key) = match &self.serving {
                    ServingIdentity::Files(pair) => (pair.cert_file.clone(), pair.key_file.clone()),
                    ServingIdentity::InMemory(_) => ("(generated)".into(), "(generated)".into()),
                };
                TlsError::Pair { cert, key, source }
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok((Arc::new(config), chain))
    }
}

/// How the gateway verifies a server it connects to.
#[derive(Clone)]
pub enum ServerTrust {
    /// Verify against these roots.
    Roots(RootCertStore),
    /// `insecureSkipTLSVerify`: only when an APIService explicitly asks for it.
    InsecureSkipVerify,
}

/// A client configuration for the core or a remote backend.
pub fn client_config(
    trust: ServerTrust,
    identity: Option<&Identity>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match trust {
        ServerTrust::Roots(roots) => builder.with_root_certificates(roots),
        ServerTrust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipServerVerification(provider))),
    };
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(id.certs.clone(), id.key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[derive(Debug)]
struct SkipServerVerification(Arc<CryptoProvider>);

// === impl SkipServerVerification ===

impl ServerCertVerifier for SkipServerVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_suite_names_are_iana() {
        assert!(cipher_suite_known(
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
        ));
        assert!(!cipher_suite_known("TLS_RSA_WITH_RC4_128_SHA"));
    }

    #[test]
    fn ca_bundle_without_certificates_is_an_error() {
        assert!(roots_from_pem(b"not pem", "v1.x").is_err());
    }
}
