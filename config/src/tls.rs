//! TLS material: loading PEM files, generating the self-signed serving pair, building rustls
//! configurations, and noticing when files change on disk (Secrets are swapped by symlink, so we
//! watch directories, not files). One crypto provider, ring, for the whole process.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::config::{CertKeyPair, ServingConfig};

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

/// The serving pair to use: the user's files, or a self-signed pair in `cert_dir` (reused when a
/// previous run left a valid one, like kube-apiserver's --cert-dir).
pub fn ensure_serving_cert(serving: &ServingConfig) -> Result<(CertKeyPair, bool), TlsError> {
    if let Some(pair) = &serving.cert {
        return Ok((pair.clone(), false));
    }
    let pair = CertKeyPair {
        cert_file: serving.cert_dir.join("aggregation-gateway.crt"),
        key_file: serving.cert_dir.join("aggregation-gateway.key"),
    };
    if Identity::load(&pair).is_ok() {
        return Ok((pair, true));
    }
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "aggregation-gateway self-signed");
    for ip in ["127.0.0.1", "::1"] {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(ip.parse().expect("literal IP")));
    }
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    std::fs::create_dir_all(&serving.cert_dir).map_err(|source| TlsError::Write {
        path: serving.cert_dir.clone(),
        source,
    })?;
    write_private(&pair.key_file, key.serialize_pem().as_bytes())?;
    std::fs::write(&pair.cert_file, cert.pem()).map_err(|source| TlsError::Write {
        path: pair.cert_file.clone(),
        source,
    })?;
    Ok((pair, true))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    opts.open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|source| TlsError::Write {
            path: path.to_owned(),
            source,
        })
}

/// Everything that goes into the serving `ServerConfig`; rebuilt as a whole on reload because the
/// client-CA set is fixed per config.
#[derive(Debug, Clone)]
pub struct ServerTlsSettings {
    pub serving: CertKeyPair,
    /// CA bundles that may sign client certificates (client CA and request-header CA). rustls
    /// accepts any of them at the handshake; authentication decides which one a chain belongs to.
    pub client_ca_files: Vec<PathBuf>,
    pub tls13_only: bool,
    pub cipher_suites: Vec<String>,
}

impl ServerTlsSettings {
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![
            self.serving.cert_file.clone(),
            self.serving.key_file.clone(),
        ];
        files.extend(self.client_ca_files.iter().cloned());
        files
    }

    pub fn build(&self) -> Result<Arc<ServerConfig>, TlsError> {
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
        let identity = Identity::load(&self.serving)?;
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
            .map_err(|source| TlsError::Pair {
                cert: self.serving.cert_file.clone(),
                key: self.serving.key_file.clone(),
                source,
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
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

/// Calls `on_change` (debounced) whenever anything changes in the directories holding `files`.
/// Kubernetes swaps mounted Secrets through a `..data` symlink, which shows up as events on the
/// directory rather than on the file, so the directory is what we watch. Dropping the returned
/// watcher stops it.
pub fn watch_files(
    files: &[PathBuf],
    on_change: impl Fn() + Send + 'static,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if !event.kind.is_access() {
                let _ = tx.send(());
            }
        }
    })?;
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            }
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
    }
    std::thread::Builder::new()
        .name("tls-file-watch".into())
        .spawn(move || {
            // Writers often touch a file several times (truncate, write, rename); wait until they
            // have been quiet briefly so we read the final content once.
            while rx.recv().is_ok() {
                while rx.recv_timeout(Duration::from_millis(200)).is_ok() {}
                on_change();
            }
        })
        .expect("spawning a thread");
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving_in(dir: &Path) -> ServingConfig {
        ServingConfig {
            cert: None,
            cert_dir: dir.to_owned(),
            tls13_only: false,
            cipher_suites: vec![],
            http2_max_streams: 100,
            max_client_connections: 0,
        }
    }

    #[test]
    fn self_signed_pair_is_generated_once_and_reused() {
        install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (pair, generated) = ensure_serving_cert(&serving_in(dir.path())).unwrap();
        assert!(generated);
        let first = std::fs::read(&pair.cert_file).unwrap();
        let (again, _) = ensure_serving_cert(&serving_in(dir.path())).unwrap();
        assert_eq!(std::fs::read(&again.cert_file).unwrap(), first);
        let settings = ServerTlsSettings {
            serving: pair,
            client_ca_files: vec![],
            tls13_only: false,
            cipher_suites: vec![],
        };
        let config = settings.build().unwrap();
        assert_eq!(config.alpn_protocols[0], b"h2");
    }

    #[test]
    fn mismatched_key_is_refused() {
        install_crypto_provider();
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let (pa, _) = ensure_serving_cert(&serving_in(a.path())).unwrap();
        let (pb, _) = ensure_serving_cert(&serving_in(b.path())).unwrap();
        let err = Identity::load(&CertKeyPair {
            cert_file: pa.cert_file,
            key_file: pb.key_file,
        })
        .unwrap_err();
        assert!(matches!(err, TlsError::Pair { .. }), "{err}");
    }

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
