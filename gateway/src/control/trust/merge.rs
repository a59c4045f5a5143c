//! What the ConfigMap should say: its current data with the gateway's entries added. A pure
//! function, so the rules (union, drop only what expired, leave "any name" alone) are
//! unit-tested without a core.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The keys of `kube-system/extension-apiserver-authentication`, as kube-apiserver writes them and
/// k8s.io/apiserver's delegating authentication reads them.
pub const CLIENT_CA: &str = "client-ca-file";
pub const REQUESTHEADER_CA: &str = "requestheader-client-ca-file";
pub const ALLOWED_NAMES: &str = "requestheader-allowed-names";
pub const USERNAME_HEADERS: &str = "requestheader-username-headers";
/// Read by k8s.io/apiserver since 1.32; kube-apiserver writes it from `--requestheader-uid-headers`
/// (feature `RemoteRequestHeaderUID`, on by default since 1.33). A backend reads no UID without it.
pub const UID_HEADERS: &str = "requestheader-uid-headers";
pub const GROUP_HEADERS: &str = "requestheader-group-headers";
pub const EXTRA_PREFIXES: &str = "requestheader-extra-headers-prefix";

/// The headers the gateway sets on proxied requests (`auth/onward.rs`).
pub const GATEWAY_USERNAME_HEADER: &str = "X-Remote-User";
pub const GATEWAY_UID_HEADER: &str = "X-Remote-Uid";
pub const GATEWAY_GROUP_HEADER: &str = "X-Remote-Group";
pub const GATEWAY_EXTRA_PREFIX: &str = "X-Remote-Extra-";

/// What the gateway needs aggregated servers to trust, from its current certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayTrust {
    /// `--client-ca-file`: aggregated servers authenticate the same client certificates.
    pub client_ca: Vec<CertificateDer<'static>>,
    /// The CA of the proxy client certificate: the request-header CA backends must trust.
    pub proxy_ca: Vec<CertificateDer<'static>>,
    /// The proxy client certificate's common name, for `requestheader-allowed-names`.
    pub proxy_cn: Option<String>,
}

impl GatewayTrust {
    /// Whether there is anything to publish.
    pub fn is_empty(&self) -> bool {
        self.client_ca.is_empty() && self.proxy_ca.is_empty()
    }
}

/// How long past its `notAfter` a certificate stays in a bundle: kube's controller allows five
/// minutes for clocks that disagree.
pub const EXPIRY_SLACK: Duration = Duration::from_secs(5 * 60);

/// The ConfigMap's data with `ours` added, or `None` when it already says everything `ours` does
/// (no write needed).
///
/// Like kube-apiserver's cluster-authentication-trust controller, this is a union: certificates
/// already in a bundle stay, in their order, and ours are appended unless present (compared as
/// DER, so formatting differences do not duplicate them); names and headers are appended unless
/// present. Keys the gateway has nothing for are left as they are. As kube's controller does,
/// the union of a bundle the gateway writes to leaves out every certificate that expired more
/// than [`EXPIRY_SLACK`] before `now` (a bundle would otherwise only ever grow with rotations);
/// a block that is not a readable certificate is someone else's and stays. One case is
/// different from a plain union: an empty `requestheader-allowed-names` next to a request-header
/// CA means "any name that CA signed" (k8s.io/apiserver), so adding our name would narrow it
/// and lock out the other writer's proxy; it stays empty.
pub fn merged(
    current: &BTreeMap<String, String>,
    ours: &GatewayTrust,
    now: SystemTime,
) -> Option<BTreeMap<String, String>> {
    let mut next = current.clone();
    if !ours.client_ca.is_empty() {
        union_bundle(&mut next, CLIENT_CA, &ours.client_ca, now);
    }
    if !ours.proxy_ca.is_empty() {
        let any_name =
            has_bundle(current, REQUESTHEADER_CA) && string_list(current, ALLOWED_NAMES).is_empty();
        union_bundle(&mut next, REQUESTHEADER_CA, &ours.proxy_ca, now);
        if let Some(cn) = ours.proxy_cn.as_deref().filter(|_| !any_name) {
            union_list(&mut next, ALLOWED_NAMES, &[cn]);
        }
        union_list(&mut next, USERNAME_HEADERS, &[GATEWAY_USERNAME_HEADER]);
        union_list(&mut next, UID_HEADERS, &[GATEWAY_UID_HEADER]);
        union_list(&mut next, GROUP_HEADERS, &[GATEWAY_GROUP_HEADER]);
        union_list(&mut next, EXTRA_PREFIXES, &[GATEWAY_EXTRA_PREFIX]);
    }
    (next != *current).then_some(next)
}

fn has_bundle(data: &BTreeMap<String, String>, key: &str) -> bool {
    data.get(key).is_some_and(|pem| !pem.trim().is_empty())
}

/// Appends the certificates of `ours` missing from the PEM bundle at `key`, and leaves out the
/// expired ones (see [`merged`]). The bundle's text is kept as it is when nothing is left out.
fn union_bundle(
    data: &mut BTreeMap<String, String>,
    key: &str,
    ours: &[CertificateDer<'static>],
    now: SystemTime,
) {
    let current = data.get(key).cloned().unwrap_or_default();
    let present: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(current.as_bytes())
        .filter_map(Result::ok)
        .collect();
    let live = |cert: &CertificateDer<'_>| !expired(cert, now);
    let mut bundle = if present.iter().all(live) {
        current
    } else {
        present.iter().filter(|c| live(c)).map(|c| pem(c)).collect()
    };
    let mut changed = bundle != *data.get(key).map_or("", String::as_str);
    for cert in ours.iter().filter(|c| live(c)) {
        if present.iter().any(|p| p.as_ref() == cert.as_ref()) {
            continue;
        }
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&pem(cert));
        changed = true;
    }
    if changed {
        data.insert(key.to_owned(), bundle);
    }
}

/// Whether `cert` expired more than [`EXPIRY_SLACK`] before `now`; a block that does not parse
/// as a certificate is not known to have expired.
fn expired(cert: &CertificateDer<'_>, now: SystemTime) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    let not_after = parsed.validity().not_after.timestamp();
    let cutoff = now
        .checked_sub(EXPIRY_SLACK)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    not_after < cutoff
}

/// The JSON string list at `key` (kube-apiserver writes them as JSON arrays); empty when absent
/// or unreadable.
fn string_list(data: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    data.get(key)
        .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
        .unwrap_or_default()
}

/// Appends the entries of `ours` missing from the JSON list at `key`. A value that is not a JSON
/// list of strings belongs to someone else and is left alone.
fn union_list(data: &mut BTreeMap<String, String>, key: &str, ours: &[&str]) {
    let mut list = match data.get(key) {
        None => Vec::new(),
        Some(text) => match serde_json::from_str::<Vec<String>>(text) {
            Ok(list) => list,
            Err(_) => return,
        },
    };
    let before = list.len();
    for entry in ours {
        if !list.iter().any(|e| e == entry) {
            list.push((*entry).to_owned());
        }
    }
    if list.len() != before || !data.contains_key(key) {
        data.insert(
            key.to_owned(),
            serde_json::to_string(&list).expect("a list of strings serializes"),
        );
    }
}

/// One certificate as a PEM block with 64-column lines, as Go's `pem.Encode` writes it.
fn pem(cert: &CertificateDer<'_>) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        SystemTime::now()
    }

    /// A real CA certificate named `cn`, valid until the start of `year`.
    fn ca_until(cn: &str, year: i32) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    /// The start of `year` (UTC) and `minutes` more.
    fn at(year: i32, minutes: u64) -> SystemTime {
        let start = match year {
            2030 => 1_893_456_000,
            _ => unreachable!("only 2030 is used"),
        };
        SystemTime::UNIX_EPOCH + Duration::from_secs(start + minutes * 60)
    }

    #[test]
    fn expired_certificates_leave_the_union_as_kubes_controller_drops_them() {
        let (old_other, live_other) = (ca_until("old-other", 2030), ca_until("other", 2099));
        let (old_ours, live_ours) = (ca_until("old-ours", 2030), ca_until("ours", 2099));
        let current = data(&[(CLIENT_CA, pem(&old_other) + &pem(&live_other))]);
        let ours = GatewayTrust {
            client_ca: vec![old_ours.clone(), live_ours.clone()],
            ..GatewayTrust::default()
        };
        // Within kube's five minutes of slack everything is still published.
        let next = merged(&current, &ours, at(2030, 4)).unwrap();
        assert_eq!(
            certs_at(&next, CLIENT_CA),
            vec![
                old_other.clone(),
                live_other.clone(),
                old_ours,
                live_ours.clone()
            ]
        );
        // Past it, the expired ones leave, another writer's included.
        let next = merged(&current, &ours, at(2030, 6)).unwrap();
        assert_eq!(
            certs_at(&next, CLIENT_CA),
            vec![live_other.clone(), live_ours]
        );
        assert_eq!(merged(&next, &ours, at(2030, 6)), None, "and stay out");
        // A bundle with nothing expired keeps its text as it is.
        let kept = data(&[(CLIENT_CA, pem(&live_other).replace('\n', "\r\n"))]);
        let only_other = GatewayTrust {
            client_ca: vec![live_other],
            ..GatewayTrust::default()
        };
        assert_eq!(merged(&kept, &only_other, at(2030, 6)), None);
    }

    fn cert(seed: u8) -> CertificateDer<'static> {
        // Any bytes do: the merge compares DER, it never parses it.
        CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, seed])
    }

    fn data(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn certs_at(data: &BTreeMap<String, String>, key: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(data[key].as_bytes())
            .map(Result::unwrap)
            .collect()
    }

    fn ours() -> GatewayTrust {
        GatewayTrust {
            client_ca: vec![cert(1)],
            proxy_ca: vec![cert(2)],
            proxy_cn: Some("aggregation-gateway".into()),
        }
    }

    #[test]
    fn an_empty_configmap_gets_everything_the_gateway_publishes() {
        let next = merged(&BTreeMap::new(), &ours(), now()).unwrap();
        assert_eq!(certs_at(&next, CLIENT_CA), vec![cert(1)]);
        assert_eq!(certs_at(&next, REQUESTHEADER_CA), vec![cert(2)]);
        assert_eq!(next[ALLOWED_NAMES], r#"["aggregation-gateway"]"#);
        assert_eq!(next[USERNAME_HEADERS], r#"["X-Remote-User"]"#);
        assert_eq!(next[UID_HEADERS], r#"["X-Remote-Uid"]"#);
        assert_eq!(next[GROUP_HEADERS], r#"["X-Remote-Group"]"#);
        assert_eq!(next[EXTRA_PREFIXES], r#"["X-Remote-Extra-"]"#);
    }

    #[test]
    fn another_writers_entries_stay_first_and_ours_are_appended() {
        let current = data(&[
            (CLIENT_CA, pem(&cert(9))),
            (REQUESTHEADER_CA, pem(&cert(8))),
            (ALLOWED_NAMES, r#"["front-proxy-client"]"#.into()),
            (USERNAME_HEADERS, r#"["X-Remote-User"]"#.into()),
            ("some-other-key", "kept".into()),
        ]);
        let next = merged(&current, &ours(), now()).unwrap();
        assert_eq!(certs_at(&next, CLIENT_CA), vec![cert(9), cert(1)]);
        assert_eq!(certs_at(&next, REQUESTHEADER_CA), vec![cert(8), cert(2)]);
        assert_eq!(
            next[ALLOWED_NAMES],
            r#"["front-proxy-client","aggregation-gateway"]"#
        );
        assert_eq!(next[USERNAME_HEADERS], r#"["X-Remote-User"]"#);
        assert_eq!(next["some-other-key"], "kept");
    }

    #[test]
    fn nothing_to_write_when_everything_is_already_there() {
        let once = merged(&BTreeMap::new(), &ours(), now()).unwrap();
        assert_eq!(merged(&once, &ours(), now()), None);
    }

    #[test]
    fn a_new_proxy_ca_after_rotation_is_added_and_the_old_one_kept() {
        let once = merged(&BTreeMap::new(), &ours(), now()).unwrap();
        let rotated = GatewayTrust {
            proxy_ca: vec![cert(3)],
            ..ours()
        };
        let next = merged(&once, &rotated, now()).unwrap();
        assert_eq!(certs_at(&next, REQUESTHEADER_CA), vec![cert(2), cert(3)]);
    }

    #[test]
    fn an_empty_allowed_names_list_means_any_name_and_stays_empty() {
        let current = data(&[
            (REQUESTHEADER_CA, pem(&cert(8))),
            (ALLOWED_NAMES, "[]".into()),
        ]);
        let next = merged(&current, &ours(), now()).unwrap();
        assert_eq!(next[ALLOWED_NAMES], "[]");
        assert_eq!(certs_at(&next, REQUESTHEADER_CA), vec![cert(8), cert(2)]);
    }

    #[test]
    fn a_value_that_is_not_a_json_list_is_left_alone() {
        let current = data(&[(GROUP_HEADERS, "X-Remote-Group".into())]);
        let next = merged(&current, &ours(), now()).unwrap();
        assert_eq!(next[GROUP_HEADERS], "X-Remote-Group");
    }

    #[test]
    fn the_same_certificate_in_another_formatting_is_not_added_twice() {
        let reformatted = pem(&cert(1)).replace('\n', "\r\n");
        let current = data(&[(CLIENT_CA, reformatted.clone())]);
        let only_client = GatewayTrust {
            client_ca: vec![cert(1)],
            ..GatewayTrust::default()
        };
        assert_eq!(merged(&current, &only_client, now()), None);
    }
}
