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
use x509_parser::asn1_rs::{Any, Class, Tag};
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::x509::X509Name;

use crate::identity::UserInfo;

/// User (CN) and groups (every O) from a DER certificate's subject, as kube-apiserver's x509
/// authenticator reads them. `None` when the certificate cannot be parsed (by x509-parser, or
/// by Go: see [`read_name`]) or has no CN: kube then treats the certificate as naming nobody and
/// moves on to other credentials.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = read_name(cert.subject()).ok()?;
    if subject.common_name.is_empty() {
        return None;
    }
    Some(UserInfo {
        name: subject.common_name,
        groups: subject.organization,
        ..UserInfo::default()
    })
}

/// The common name of the certificate `der`, as [`read_name`] reads it (the last of several).
pub(crate) fn leaf_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = read_name(cert.subject()).ok()?.common_name;
    (!cn.is_empty()).then_some(cn)
}

/// What kube reads of a subject: `pkix.Name.CommonName` and `Organization`.
#[derive(Debug, Default)]
struct Subject {
    common_name: String,
    organization: Vec<String>,
}

/// A name as Go's `crypto/x509` reads it, which is what kube-apiserver and every Go backend
/// use. `pkix.Name.FillFromRDNSequence` walks every attribute of every RDN and assigns each
/// string-valued CN in turn, so with several CNs **the last one** names the user, and appends
/// every O. Reading another CN (the first, or the last of the types x509-parser's `as_str`
/// decodes, which skips BMPString and T61String) would let one certificate be `alice` here and
/// `admin` at the core.
///
/// `Err` names the attribute whose string Go's `parseASN1String` refuses: Go's parser then
/// refuses the whole certificate. Only string values are checked this strictly; Go also refuses
/// a malformed INTEGER, BOOLEAN, OID or time as an attribute value, which no issuer puts in a
/// client certificate's name.
fn read_name(name: &X509Name<'_>) -> Result<Subject, String> {
    let mut subject = Subject::default();
    for attr in name.iter_attributes() {
        let value = go_string(attr.attr_value())
            .map_err(|why| format!("attribute {}: {why}", attr.attr_type()))?;
        // Not a string to Go (a UniversalString, say): kept as a raw value, never a CN or O.
        let Some(value) = value else { continue };
        if *attr.attr_type() == OID_X509_COMMON_NAME {
            subject.common_name = value;
        } else if *attr.attr_type() == OID_X509_ORGANIZATION_NAME {
            subject.organization.push(value);
        }
    }
    Ok(subject)
}

/// An attribute value as Go's `crypto/x509` `parseASN1String` decodes it. `Ok(None)` for what Go
/// does not read as a string: any tag but these six universal primitive ones (Go matches the
/// whole identifier octet, so a constructed or context-specific UTF8String is no string either).
fn go_string(value: &Any<'_>) -> Result<Option<String>, &'static str> {
    if value.class() != Class::Universal || value.header.is_constructed() {
        return Ok(None);
    }
    let bytes = value.data;
    let text = match value.tag() {
        // T.61 read as Latin-1, as Go and BoringSSL do: each byte is the code point.
        Tag::T61String => bytes.iter().copied().map(char::from).collect(),
        Tag::PrintableString => ascii(bytes, is_printable).ok_or("invalid PrintableString")?,
        Tag::Utf8String => std::str::from_utf8(bytes)
            .map_err(|_| "invalid UTF-8 string")?
            .to_owned(),
        Tag::BmpString => bmp_string(bytes).ok_or("invalid BMPString")?,
        // Go ranges over the text's runes: any byte above 0x7F is part of one above ASCII, or
        // of invalid UTF-8 (U+FFFD).
        Tag::Ia5String => ascii(bytes, |b| b.is_ascii()).ok_or("invalid IA5String")?,
        Tag::NumericString => {
            ascii(bytes, |b| b.is_ascii_digit() || b == b' ').ok_or("invalid NumericString")?
        }
        _ => return Ok(None),
    };
    Ok(Some(text))
}

/// `bytes` as text when every byte passes `allowed` (which admits ASCII only).
fn ascii(bytes: &[u8], allowed: impl Fn(u8) -> bool) -> Option<String> {
    if bytes.iter().all(|&b| allowed(b)) {
        String::from_utf8(bytes.to_vec()).ok()
    } else {
        None
    }
}

/// Go's `isPrintable`: the PrintableString set, plus `*` and `&`, which real certificates use.
fn is_printable(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(b, b'\''..=b')' | b'+'..=b'/' | b' ' | b':' | b'=' | b'?' | b'*' | b'&')
}

/// UCS-2 (big-endian) as Go decodes it: an even length, one trailing U+0000 dropped, and no
/// surrogate or permanent noncharacter (U+FFFE, U+FFFF, U+FDD0 to U+FDEF).
fn bmp_string(bytes: &[u8]) -> Option<String> {
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let bytes = bytes.strip_suffix(&[0, 0]).unwrap_or(bytes);
    bytes
        .chunks_exact(2)
        .map(|pair| match u16::from_be_bytes([pair[0], pair[1]]) {
            0xfffe | 0xffff | 0xfdd0..=0xfdef | 0xd800..=0xdfff => None,
            unit => char::from_u32(u32::from(unit)),
        })
        .collect()
}

/// Whether Go would parse the names (subject and issuer) of every certificate of `chain`. A Go
/// server (kube-apiserver, an aggregated server) parses every certificate a client sends during
/// the TLS handshake and ends the handshake when one does not parse, so such a chain is nobody's
/// and vouches for nothing here either. A certificate x509-parser cannot parse at all is left to
/// the checks after (it names nobody).
fn go_parses_names(chain: &[CertificateDer<'_>]) -> Result<(), String> {
    for (i, der) in chain.iter().enumerate() {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            continue;
        };
        for (field, name) in [("subject", cert.subject()), ("issuer", cert.issuer())] {
            read_name(name).map_err(|why| {
                format!(
                    "certificate {i} of the chain has a {field} Go's crypto/x509 refuses to \
                     parse ({why}), so kube-apiserver would refuse the connection; reissue it \
                     with UTF8String names"
                )
            })?;
        }
    }
    Ok(())
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
        // As a Go server would, before anything else (it would not have let the handshake end).
        if let Err(why) = go_parses_names(chain) {
            return CertCheck {
                front_proxy: verifiers
                    .requestheader_ca
                    .as_ref()
                    .map(|_| Err(why.clone())),
                user: verifiers.client_ca.as_ref().map(|_| Err(why)),
            };
        }
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
        BasicConstraints, CertificateParams, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa,
        Issuer, KeyPair, KeyUsagePurpose,
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

        /// A client certificate whose subject is `entries`, one RDN each, in order, with the
        /// string types given. rcgen keeps one value per attribute type, so a second CN or O
        /// goes in under its OID spelled as a custom type, which encodes the same.
        pub fn client_with_subject(
            &self,
            entries: Vec<(DnType, DnValue)>,
        ) -> Vec<CertificateDer<'static>> {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::default();
            for (ty, value) in entries {
                params.distinguished_name.push(ty, value);
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
        let (users, proxies, auth) = users_and_front_proxies(&dir);

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
        let (users, proxies, auth) = users_and_front_proxies(&dir);
        let user = auth.check(&users.client_named(&["alice", "admin"]));
        assert_eq!(user.user.unwrap().unwrap().unwrap().name, "admin");

        let allowed_last = auth.check(&proxies.client_named(&["other", "front-proxy"]));
        assert!(allowed_last.front_proxy.unwrap().is_ok());
        let allowed_first = auth.check(&proxies.client_named(&["front-proxy", "other"]));
        let why = allowed_first.front_proxy.unwrap().unwrap_err();
        assert!(why.contains("\"other\""), "{why}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A second CN or O, spelled as a custom type (see [`Ca::client_with_subject`]).
    fn second(oid_last: u64) -> DnType {
        DnType::CustomDnType(vec![2, 5, 4, oid_last])
    }

    fn bmp(s: &str) -> DnValue {
        DnValue::BmpString(s.try_into().unwrap())
    }

    /// Every string type Go's `parseASN1String` decodes names the user as it does at the core and
    /// at every Go backend: the last CN, whatever its type (a BMPString or T61String after a
    /// UTF8String included), and every O in order. A UniversalString is no string to Go (it
    /// stays a raw value), so it names nobody and the CN before it stands.
    #[test]
    fn common_names_and_organizations_of_every_string_type_read_as_in_go() {
        provider();
        let dir = tempfile_dir();
        let users = Ca::new("users");
        let auth = CertAuthenticator::new(Some(users.write(&dir, "u.pem")), None, vec![]).unwrap();
        let cn = DnType::CommonName;
        let o = DnType::OrganizationName;
        let utf8 = |s: &str| DnValue::Utf8String(s.into());
        // What the subject holds, the user and groups Go reads from it.
        type Row = (
            &'static str,
            Vec<(DnType, DnValue)>,
            &'static str,
            Vec<&'static str>,
        );
        let rows: Vec<Row> = vec![
            (
                "UTF8String then BMPString",
                vec![(cn.clone(), utf8("admin")), (second(3), bmp("alice"))],
                "alice",
                vec![],
            ),
            (
                "UTF8String then T61String",
                vec![
                    (cn.clone(), utf8("admin")),
                    (
                        second(3),
                        DnValue::TeletexString("alice".try_into().unwrap()),
                    ),
                ],
                "alice",
                vec![],
            ),
            (
                "PrintableString then IA5String",
                vec![
                    (
                        cn.clone(),
                        DnValue::PrintableString("admin".try_into().unwrap()),
                    ),
                    (second(3), DnValue::Ia5String("alice".try_into().unwrap())),
                ],
                "alice",
                vec![],
            ),
            (
                "a BMPString with its terminator",
                vec![(cn.clone(), bmp("alice\u{0}"))],
                "alice",
                vec![],
            ),
            (
                "UTF8String then UniversalString",
                vec![
                    (cn.clone(), utf8("admin")),
                    (
                        second(3),
                        DnValue::UniversalString("alice".try_into().unwrap()),
                    ),
                ],
                "admin",
                vec![],
            ),
            (
                "an O of each of two types",
                vec![
                    (o.clone(), utf8("dev")),
                    (cn.clone(), utf8("alice")),
                    (second(10), bmp("ops")),
                ],
                "alice",
                vec!["dev", "ops"],
            ),
        ];
        for (case, subject, name, groups) in rows {
            let check = auth.check(&users.client_with_subject(subject));
            let user = check.user.unwrap().unwrap();
            let user = user.unwrap_or_else(|| panic!("{case}: names nobody"));
            assert_eq!(user.name, name, "{case}");
            assert_eq!(user.groups, groups, "{case}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Go's `x509.ParseCertificate` refuses a name attribute whose string does not decode (here a
    /// BMPString holding a noncharacter), and a Go server then ends the handshake: such a
    /// certificate is nobody's and vouches for nothing, not the user its other CN names.
    #[test]
    fn a_certificate_go_cannot_parse_is_neither_a_user_nor_a_front_proxy() {
        provider();
        let dir = tempfile_dir();
        let (users, proxies, auth) = users_and_front_proxies(&dir);
        let subject = || {
            vec![
                (
                    DnType::CommonName,
                    DnValue::Utf8String("front-proxy".into()),
                ),
                (DnType::OrganizationName, bmp("dev\u{fdd0}")),
            ]
        };
        let user = auth.check(&users.client_with_subject(subject()));
        let why = user.user.unwrap().unwrap_err();
        assert!(why.contains("BMPString"), "{why}");
        let proxy = auth.check(&proxies.client_with_subject(subject()));
        let why = proxy.front_proxy.unwrap().unwrap_err();
        assert!(why.contains("BMPString"), "{why}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `--requestheader-allowed-names` is checked against the CN Go reads: a front-proxy
    /// certificate with an allowed UTF8String CN and then a BMPString one is the later name, not
    /// an allowed proxy, and the other way round it is one.
    #[test]
    fn allowed_names_are_checked_against_the_last_common_name_of_any_string_type() {
        provider();
        let dir = tempfile_dir();
        let proxies = Ca::new("front-proxy");
        let auth = CertAuthenticator::new(
            None,
            Some(proxies.write(&dir, "proxies.pem")),
            vec!["front-proxy".into()],
        )
        .unwrap();
        let utf8 = |s: &str| DnValue::Utf8String(s.into());
        let allowed_first = auth.check(&proxies.client_with_subject(vec![
            (DnType::CommonName, utf8("front-proxy")),
            (second(3), bmp("zzz")),
        ]));
        let why = allowed_first.front_proxy.unwrap().unwrap_err();
        assert!(why.contains("\"zzz\""), "{why}");
        let allowed_last = auth.check(&proxies.client_with_subject(vec![
            (DnType::CommonName, utf8("zzz")),
            (second(3), bmp("front-proxy")),
        ]));
        assert!(allowed_last.front_proxy.unwrap().is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Go's `parseASN1String`, type by type, on the edges where it differs from "any UTF-8".
    #[test]
    fn attribute_strings_decode_as_gos_parse_asn1_string() {
        use x509_parser::asn1_rs::{Header, Length};
        let value = |class, constructed, tag, data: &'static [u8]| {
            let header = Header::new(class, constructed, tag, Length::Definite(data.len()));
            go_string(&Any::new(header, data))
        };
        let universal = |tag, data| value(Class::Universal, false, tag, data);
        let ok = |s: &str| Ok(Some(s.to_owned()));
        // T61String is Latin-1, byte for byte.
        assert_eq!(universal(Tag::T61String, b"caf\xe9"), ok("café"));
        // PrintableString: its set plus '*' and '&'.
        assert_eq!(
            universal(Tag::PrintableString, b"a-Z 0'()+,./:=?*&"),
            ok("a-Z 0'()+,./:=?*&")
        );
        for bad in [&b"a@b"[..], b"a_b", b"\xc3\xa9"] {
            let header = Header::new(
                Class::Universal,
                false,
                Tag::PrintableString,
                Length::Definite(bad.len()),
            );
            assert_eq!(
                go_string(&Any::new(header, bad)),
                Err("invalid PrintableString"),
                "{bad:?}"
            );
        }
        assert_eq!(universal(Tag::Utf8String, "é".as_bytes()), ok("é"));
        assert_eq!(
            universal(Tag::Utf8String, b"\xff"),
            Err("invalid UTF-8 string")
        );
        assert_eq!(universal(Tag::Ia5String, b"a@b~"), ok("a@b~"));
        assert_eq!(
            universal(Tag::Ia5String, b"\xc3\xa9"),
            Err("invalid IA5String")
        );
        assert_eq!(universal(Tag::NumericString, b"12 3"), ok("12 3"));
        assert_eq!(
            universal(Tag::NumericString, b"12a"),
            Err("invalid NumericString")
        );
        // BMPString: UCS-2, one terminator dropped, no surrogates or noncharacters.
        assert_eq!(
            universal(Tag::BmpString, b"\x00a\x00\xe9\x00\x00"),
            ok("aé")
        );
        assert_eq!(
            universal(Tag::BmpString, b"\x00a\x00\x00\x00\x00"),
            ok("a\u{0}")
        );
        for bad in [
            &b"\x00a\x00"[..],
            b"\xd8\x3d\xde\x00",
            b"\xff\xfe",
            b"\xfd\xd0",
        ] {
            let header = Header::new(
                Class::Universal,
                false,
                Tag::BmpString,
                Length::Definite(bad.len()),
            );
            assert_eq!(
                go_string(&Any::new(header, bad)),
                Err("invalid BMPString"),
                "{bad:?}"
            );
        }
        // What Go keeps as a raw value: other string types, constructed or non-universal tags.
        assert_eq!(universal(Tag::UniversalString, b"\0\0\0a"), Ok(None));
        assert_eq!(universal(Tag::VisibleString, b"a"), Ok(None));
        assert_eq!(
            value(Class::Universal, true, Tag::Utf8String, b""),
            Ok(None)
        );
        assert_eq!(
            value(Class::ContextSpecific, false, Tag::Utf8String, b"a"),
            Ok(None)
        );
    }

    /// A users CA and a front-proxy CA allowing the name `front-proxy`, written to `dir`, and
    /// the authenticator trusting both.
    fn users_and_front_proxies(dir: &std::path::Path) -> (Ca, Ca, CertAuthenticator) {
        let users = Ca::new("users");
        let proxies = Ca::new("front-proxy");
        let auth = CertAuthenticator::new(
            Some(users.write(dir, "users.pem")),
            Some(proxies.write(dir, "proxies.pem")),
            vec!["front-proxy".into()],
        )
        .unwrap();
        (users, proxies, auth)
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
