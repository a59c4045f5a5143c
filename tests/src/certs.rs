//! Certificate helpers for end-to-end tests: a throwaway certificate authority that issues server
//! certificates (for fixture backends and the gateway) and client certificates (for kubectl users and
//! the gateway's proxy client identity), all in memory and written to disk only when a process needs
//! file paths.
//!
//! Everything uses rcgen with its `ring` backend and rustls' `ring` provider: the workspace must not
//! pull in aws-lc-rs (it needs a C toolchain and cmake, and two providers make rustls refuse to pick
//! one implicitly). [`install_crypto`] installs the ring provider as the process default so helpers
//! that build rustls configs without naming a provider keep working.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SigningKey,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Installs rustls' ring provider as the process-wide default.
///
/// Called by every helper that builds a rustls config, so tests never depend on which helper ran
/// first. Installing twice fails harmlessly (the first provider stays), which is why the error is
/// ignored.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Errors from issuing or parsing test certificates.
#[derive(Debug)]
pub enum CertError {
    /// rcgen refused the parameters (e.g. a SAN that is not a valid DNS name) or failed to sign.
    Rcgen(rcgen::Error),
    /// PEM text did not contain the expected certificate or key.
    Pem(String),
    /// The issued certificate could not be rewritten (multi-organization subjects).
    Der(&'static str),
    /// Writing certificate files failed.
    Io(std::io::Error),
}

impl fmt::Display for CertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertError::Rcgen(e) => write!(f, "certificate generation failed: {e}"),
            CertError::Pem(what) => write!(f, "invalid PEM: {what}"),
            CertError::Der(what) => write!(f, "cannot rewrite certificate DER: {what}"),
            CertError::Io(e) => write!(f, "writing certificate files failed: {e}"),
        }
    }
}

impl std::error::Error for CertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CertError::Rcgen(e) => Some(e),
            CertError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<rcgen::Error> for CertError {
    fn from(e: rcgen::Error) -> Self {
        CertError::Rcgen(e)
    }
}

impl From<std::io::Error> for CertError {
    fn from(e: std::io::Error) -> Self {
        CertError::Io(e)
    }
}

/// A certificate and its private key, both PEM encoded.
#[derive(Clone, Debug)]
pub struct CertifiedPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertifiedPair {
    /// Writes `<stem>.crt` and `<stem>.key` into `dir` and returns their paths (cert, key), the
    /// naming kube-apiserver uses for `--cert-dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> std::io::Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        Ok((cert, key))
    }

    /// The certificate chain (just the leaf) as DER, for building rustls configs.
    pub fn cert_chain(&self) -> Result<Vec<CertificateDer<'static>>, CertError> {
        certs_from_pem(&self.cert_pem)
    }

    /// The private key as DER, for building rustls configs.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, CertError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| CertError::Pem(format!("private key: {e}")))
    }
}

/// Parses every `CERTIFICATE` block of a PEM text; an empty result is an error because a trust
/// bundle without certificates is always a test bug.
pub fn certs_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem(format!("certificate: {e}")))?;
    if certs.is_empty() {
        return Err(CertError::Pem("no CERTIFICATE block found".into()));
    }
    Ok(certs)
}

/// A root store trusting every certificate in `ca_pem`.
pub fn root_store(ca_pem: &str) -> Result<rustls::RootCertStore, CertError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_from_pem(ca_pem)? {
        roots
            .add(cert)
            .map_err(|e| CertError::Pem(format!("CA certificate rejected: {e}")))?;
    }
    Ok(roots)
}

/// What to put into a certificate issued by [`TestCa::issue`].
#[derive(Clone, Debug, Default)]
pub struct CertSpec {
    /// Subject common name (for client certificates: the user name).
    pub common_name: Option<String>,
    /// Further CN attributes after `common_name`, each in an RDN of its own, in order: a subject
    /// with several CNs, which Go's `crypto/x509` reads as the last one.
    pub more_common_names: Vec<String>,
    /// Subject organizations (for client certificates: the groups), in order.
    pub organizations: Vec<String>,
    /// Subject alternative names; entries that parse as IP addresses become IP SANs.
    pub sans: Vec<String>,
    /// Extended key usages; empty means none (rustls/webpki then reject it for TLS use).
    pub usages: Vec<ExtendedKeyUsagePurpose>,
    /// Validity window; `None` means one hour ago until ten years from now.
    pub validity: Option<(SystemTime, SystemTime)>,
}

/// A self-signed certificate authority living only in memory.
pub struct TestCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for TestCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// Creates a CA with the given common name.
    ///
    /// # Panics
    /// Only if key generation or self-signing fails, which does not depend on the input.
    pub fn new(common_name: &str) -> TestCa {
        Self::try_new(common_name).expect("creating a test CA cannot fail with ring available")
    }

    /// Fallible form of [`TestCa::new`].
    pub fn try_new(common_name: &str) -> Result<TestCa, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, None);
        let cert = params.self_signed(&key)?;
        Ok(TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate (PEM), to be trusted by clients or servers.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate (DER).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA private key (PEM), for tests that hand the CA itself to a process (e.g. a signer).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Writes the CA certificate to `dir/<name>` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> std::io::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, &self.cert_pem)?;
        Ok(path)
    }

    /// Issues a server certificate (serverAuth) for the given names and IP addresses.
    ///
    /// # Panics
    /// If a name is not a valid DNS name; use [`TestCa::issue`] to handle that as an error.
    pub fn issue_server(&self, sans: &[&str]) -> CertifiedPair {
        self.issue(&server_spec(sans, None))
            .unwrap_or_else(|e| panic!("issuing a server certificate for {sans:?}: {e}"))
    }

    /// Issues a server certificate valid only from `not_before` to `not_after`, for expiry and
    /// not-yet-valid tests.
    ///
    /// # Panics
    /// If a name is not a valid DNS name.
    pub fn issue_server_valid(
        &self,
        sans: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> CertifiedPair {
        self.issue(&server_spec(sans, Some((not_before, not_after))))
            .unwrap_or_else(|e| panic!("issuing a server certificate for {sans:?}: {e}"))
    }

    /// Issues a client certificate (clientAuth) with CN = user name and one O per group, the way
    /// Kubernetes' x509 authenticator reads them.
    ///
    /// # Panics
    /// Only if signing fails, which does not depend on the input.
    pub fn issue_client(&self, common_name: &str, organizations: &[&str]) -> CertifiedPair {
        self.issue(&CertSpec {
            common_name: Some(common_name.to_owned()),
            organizations: organizations.iter().map(|o| (*o).to_owned()).collect(),
            usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            ..CertSpec::default()
        })
        .unwrap_or_else(|e| panic!("issuing a client certificate for {common_name:?}: {e}"))
    }

    /// Issues a client certificate whose subject holds several CNs, in the order given (one RDN
    /// each), then one O per group: Go's `crypto/x509`, and so Kubernetes, takes the last CN.
    ///
    /// # Panics
    /// If `common_names` is empty; signing does not fail otherwise.
    pub fn issue_client_with_common_names(
        &self,
        common_names: &[&str],
        organizations: &[&str],
    ) -> CertifiedPair {
        let (first, more) = common_names
            .split_first()
            .expect("at least one common name");
        self.issue(&CertSpec {
            common_name: Some((*first).to_owned()),
            more_common_names: more.iter().map(|cn| (*cn).to_owned()).collect(),
            organizations: organizations.iter().map(|o| (*o).to_owned()).collect(),
            usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            ..CertSpec::default()
        })
        .unwrap_or_else(|e| panic!("issuing a client certificate for {common_names:?}: {e}"))
    }

    /// Issues a certificate described by `spec`.
    pub fn issue(&self, spec: &CertSpec) -> Result<CertifiedPair, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        if let Some(cn) = &spec.common_name {
            params
                .distinguished_name
                .push(DnType::CommonName, cn.as_str());
        }
        // rcgen keeps one value per attribute type, so a single organization goes through rcgen and
        // several are written by `rewrite_subject` below.
        if let [only] = spec.organizations.as_slice() {
            params
                .distinguished_name
                .push(DnType::OrganizationName, only.as_str());
        }
        params.subject_alt_names = spec
            .sans
            .iter()
            .map(|name| match name.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(name.as_str().try_into()?)),
            })
            .collect::<Result<Vec<_>, rcgen::Error>>()?;
        params.extended_key_usages = spec.usages.clone();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, spec.validity);
        let cert = params.signed_by(&key, &self.issuer)?;
        let cert_pem = if spec.organizations.len() > 1 || !spec.more_common_names.is_empty() {
            let common_names: Vec<&str> = spec
                .common_name
                .iter()
                .chain(&spec.more_common_names)
                .map(String::as_str)
                .collect();
            let der = rewrite_subject(
                cert.der(),
                &common_names,
                &spec.organizations,
                self.issuer.key(),
            )?;
            pem_encode("CERTIFICATE", &der)
        } else {
            cert.pem()
        };
        Ok(CertifiedPair {
            cert_pem,
            key_pem: key.serialize_pem(),
        })
    }
}

fn server_spec(sans: &[&str], validity: Option<(SystemTime, SystemTime)>) -> CertSpec {
    CertSpec {
        common_name: sans.first().map(|s| (*s).to_owned()),
        sans: sans.iter().map(|s| (*s).to_owned()).collect(),
        usages: vec![ExtendedKeyUsagePurpose::ServerAuth],
        validity,
        ..CertSpec::default()
    }
}

fn set_validity(params: &mut CertificateParams, validity: Option<(SystemTime, SystemTime)>) {
    // Back-dating by an hour tolerates small clock differences between processes; ten years is
    // "never expires" for a test run.
    let (from, to) = validity.unwrap_or_else(|| {
        let now = SystemTime::now();
        (
            now - Duration::from_secs(3600),
            now + Duration::from_secs(10 * 365 * 24 * 3600),
        )
    });
    params.not_before = from.into();
    params.not_after = to.into();
}

// ---- multi-valued subjects ------------------------------------------------------------------------
//
// Kubernetes maps every O attribute of a client certificate to a group, so tests need subjects with
// several O attributes. rcgen 0.14 stores one value per attribute type, so the certificate is issued
// normally and then its subject Name is replaced in the DER and the TBS re-signed with the CA key.

const OID_CN: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];

/// PEM-encodes `der` (64-column base64); pki-types only parses PEM and rcgen's encoder is private.
fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = Vec::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[((n >> (18 - 6 * i)) & 0x3f) as usize]);
            } else {
                b64.push(b'=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Splits one DER TLV off the front of `input`: (tag, whole TLV, rest).
fn split_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertError> {
    let short = CertError::Der("truncated element");
    let (&tag, rest) = input.split_first().ok_or(short)?;
    let (&first, rest) = rest
        .split_first()
        .ok_or(CertError::Der("truncated length"))?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(CertError::Der("unsupported length encoding"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let total = header + len;
    if input.len() < total {
        return Err(CertError::Der("element longer than its container"));
    }
    Ok((tag, &input[..total], &input[total..]))
}

/// Encodes a DER TLV.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// The content of a DER SEQUENCE.
fn sequence_content(der: &[u8]) -> Result<&[u8], CertError> {
    let (tag, whole, _) = split_tlv(der)?;
    if tag != 0x30 {
        return Err(CertError::Der("expected a SEQUENCE"));
    }
    let header = whole.len() - content_len(whole)?;
    Ok(&whole[header..])
}

fn content_len(whole: &[u8]) -> Result<usize, CertError> {
    let first = *whole.get(1).ok_or(CertError::Der("truncated length"))?;
    Ok(if first < 0x80 {
        whole.len() - 2
    } else {
        whole.len() - 2 - usize::from(first & 0x7f)
    })
}

fn rewrite_subject(
    cert_der: &[u8],
    common_names: &[&str],
    organizations: &[String],
    ca_key: &KeyPair,
) -> Result<Vec<u8>, CertError> {
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signatureValue }
    let cert = sequence_content(cert_der)?;
    let (_, tbs, rest) = split_tlv(cert)?;
    let (_, sig_alg, _) = split_tlv(rest)?;

    // TBSCertificate ::= SEQUENCE { [0] version, serial, signature, issuer, validity, subject, ... }
    let mut elements = Vec::new();
    let mut input = sequence_content(tbs)?;
    while !input.is_empty() {
        let (_, element, rest) = split_tlv(input)?;
        elements.push(element.to_vec());
        input = rest;
    }
    let subject_index = if elements.first().map(|e| e[0]) == Some(0xa0) {
        5
    } else {
        4
    };
    if elements.len() <= subject_index {
        return Err(CertError::Der("TBSCertificate has no subject"));
    }

    let mut rdns = Vec::new();
    let attributes = common_names
        .iter()
        .map(|cn| (OID_CN, *cn))
        .chain(organizations.iter().map(|o| (OID_O, o.as_str())));
    for (oid, value) in attributes {
        let mut atv = oid.to_vec();
        atv.extend(tlv(0x0c, value.as_bytes())); // UTF8String
        rdns.extend(tlv(0x31, &tlv(0x30, &atv))); // SET { SEQUENCE { type, value } }
    }
    elements[subject_index] = tlv(0x30, &rdns);

    let new_tbs = tlv(0x30, &elements.concat());
    let signature = ca_key.sign(&new_tbs)?;
    let mut bits = vec![0u8]; // no unused bits
    bits.extend(signature);
    let mut body = new_tbs;
    body.extend_from_slice(sig_alg);
    body.extend(tlv(0x03, &bits));
    Ok(tlv(0x30, &body))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier;
    use rustls::server::WebPkiClientVerifier;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn server_config(pair: &CertifiedPair) -> rustls::ServerConfig {
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(pair.cert_chain().unwrap(), pair.private_key().unwrap())
            .unwrap()
    }

    #[tokio::test]
    async fn issued_server_cert_is_accepted_by_a_client_trusting_the_ca() {
        install_crypto();
        let ca = TestCa::new("test-ca");
        let pair = ca.issue_server(&["localhost", "127.0.0.1", "api.wardle.svc"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&pair)));
        let client_config = rustls::ClientConfig::builder()
            .with_root_certificates(root_store(ca.cert_pem()).unwrap())
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));

        for name in ["localhost", "127.0.0.1", "api.wardle.svc"] {
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn({
                let acceptor = acceptor.clone();
                async move {
                    let mut tls = acceptor.accept(server_io).await.unwrap();
                    tls.write_all(b"hello").await.unwrap();
                    tls.shutdown().await.unwrap();
                }
            });
            let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
            let mut tls = connector.connect(server_name, client_io).await.unwrap();
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"hello", "via {name}");
            server.await.unwrap();
        }

        // A name that is not in the certificate must fail, or the test above proves nothing.
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let _ = acceptor.accept(server_io).await;
        });
        let wrong = rustls::pki_types::ServerName::try_from("other.example").unwrap();
        assert!(connector.connect(wrong, client_io).await.is_err());
    }

    #[test]
    fn client_cert_verifies_against_the_ca_with_all_groups() {
        install_crypto();
        let ca = TestCa::new("client-ca");
        let verifier = WebPkiClientVerifier::builder(Arc::new(root_store(ca.cert_pem()).unwrap()))
            .build()
            .unwrap();
        let now = rustls::pki_types::UnixTime::now();
        for groups in [
            &[][..],
            &["system:masters"][..],
            &["g1", "g2", "system:masters"][..],
        ] {
            let pair = ca.issue_client("alice", groups);
            let chain = pair.cert_chain().unwrap();
            verifier
                .verify_client_cert(&chain[0], &[], now)
                .unwrap_or_else(|e| panic!("groups {groups:?}: {e}"));
            for g in groups {
                let needle = g.as_bytes();
                assert!(
                    chain[0].windows(needle.len()).any(|w| w == needle),
                    "group {g} missing from subject"
                );
            }
        }
        // A certificate from another CA must be rejected.
        let stranger = TestCa::new("other").issue_client("mallory", &[]);
        let chain = stranger.cert_chain().unwrap();
        assert!(verifier.verify_client_cert(&chain[0], &[], now).is_err());
    }

    #[test]
    fn expired_certificate_is_rejected() {
        install_crypto();
        let ca = TestCa::new("ca");
        let now = SystemTime::now();
        let pair = ca.issue_server_valid(
            &["localhost"],
            now - Duration::from_secs(7200),
            now - Duration::from_secs(3600),
        );
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(
            root_store(ca.cert_pem()).unwrap(),
        ))
        .build()
        .unwrap();
        let chain = pair.cert_chain().unwrap();
        let err = verifier
            .verify_server_cert(
                &chain[0],
                &[],
                &rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .unwrap_err();
        assert!(format!("{err:?}").contains("Expired"), "{err:?}");
    }

    #[test]
    fn write_puts_pem_files_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("ca");
        let ca_path = ca.write(dir.path(), "ca.crt").unwrap();
        let (cert, key) = ca
            .issue_server(&["localhost"])
            .write(dir.path(), "apiserver")
            .unwrap();
        assert!(std::fs::read_to_string(ca_path)
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert!(std::fs::read_to_string(cert)
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert!(std::fs::read_to_string(key)
            .unwrap()
            .contains("PRIVATE KEY"));
    }

    #[test]
    fn pem_encoding_matches_rcgen() {
        let ca = TestCa::new("ca");
        assert_eq!(pem_encode("CERTIFICATE", ca.cert_der()), ca.cert_pem());
    }

    #[test]
    fn multi_group_subject_lists_every_organization() {
        let ca = TestCa::new("ca");
        let pair = ca.issue_client("alice", &["g1", "system:masters", "g3"]);
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair.write(dir.path(), "alice").unwrap();
        // openssl is optional in the environment; when present it is an independent DER parser.
        if let Ok(out) = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in"])
            .arg(&cert)
            .output()
        {
            let subject = String::from_utf8_lossy(&out.stdout);
            assert!(
                subject.contains("O=g3,O=system:masters,O=g1,CN=alice"),
                "{subject}"
            );
        }
    }

    #[test]
    fn invalid_san_is_an_error_not_a_panic() {
        let ca = TestCa::new("ca");
        let spec = CertSpec {
            sans: vec!["bad name\u{e9}".into()],
            ..CertSpec::default()
        };
        assert!(ca.issue(&spec).is_err());
    }
}
