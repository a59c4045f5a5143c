//! Who the caller is (`UserInfo`), and the headers that carry identity to backends. A remote
//! APIService trusts `X-Remote-*` because our proxy client certificate vouches for it, so every
//! identity header a client sent is removed before ours are set: a caller can never speak for
//! someone else through the gateway. The marks kube-apiserver's peer proxy trusts go the same way.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";

/// Who the availability probe and discovery fetches are: kube-aggregator's identity for them
/// (`remote_available_controller.go`, `handler_discovery.go`).
pub static DISCOVERY_USER: LazyLock<UserInfo> = LazyLock::new(|| UserInfo {
    name: "system:kube-aggregator".into(),
    groups: vec!["system:masters".into()],
    ..Default::default()
});

/// Who OpenAPI fetches are: kube's OpenAPI aggregation controllers' identity.
pub static OPENAPI_USER: LazyLock<UserInfo> = LazyLock::new(|| UserInfo {
    name: "system:aggregator".into(),
    ..Default::default()
});

/// The authenticated (and, when impersonating, the impersonated) caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

// === impl UserInfo ===

impl UserInfo {
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.into(),
            groups: vec![UNAUTHENTICATED.into()],
            ..Default::default()
        }
    }

    /// [`UserInfo::anonymous`], built once: anonymous requests share it instead of allocating
    /// its strings each time.
    pub fn shared_anonymous() -> &'static Arc<Self> {
        static ANONYMOUS_USER: LazyLock<Arc<UserInfo>> =
            LazyLock::new(|| Arc::new(UserInfo::anonymous()));
        &ANONYMOUS_USER
    }

    /// An authenticated user gets `system:authenticated`, as kube-apiserver adds it.
    pub fn authenticated(
        name: String,
        uid: String,
        mut groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> Self {
        if !groups.iter().any(|g| g == AUTHENTICATED) && name != ANONYMOUS {
            groups.push(AUTHENTICATED.into());
        }
        Self {
            name,
            uid,
            groups,
            extra,
        }
    }
}

/// Whether `name` is, or could be read by some backend as, an identity header: `X-Remote-*` or
/// `Impersonate-*`, compared case-insensitively and with `_` taken for `-`. Go never reads
/// `X_Remote_User` as `X-Remote-User`, but WSGI, Rack and nginx (CGI-style `HTTP_X_REMOTE_USER`)
/// do, so a backend behind us could believe a forged underscore form.
pub fn is_identity_header_name(name: &str) -> bool {
    ["x-remote-", "impersonate-"]
        .iter()
        .any(|prefix| starts_with_loosely(name, prefix))
}

/// The marks kube-apiserver's mixed-version proxy (KEP-4020) reads as "a peer already proxied
/// this request, serve it here": `X-Kubernetes-Peer-Proxied: true` is what
/// `k8s.io/apiserver/pkg/util/peerproxy` sets and checks, `X-Kubernetes-APIServer-Rerouted` the
/// name the KEP and the docs give it. The core takes them from anyone, so a client could use one
/// to skip the core's peer routing; only a kube-apiserver peer may send them, never a client
/// through the gateway.
const PEER_ROUTING_HEADERS: [&str; 2] = [
    "x-kubernetes-peer-proxied",
    "x-kubernetes-apiserver-rerouted",
];

/// Whether `name` is one of [`PEER_ROUTING_HEADERS`], compared like identity headers.
pub fn is_peer_routing_header_name(name: &str) -> bool {
    PEER_ROUTING_HEADERS
        .iter()
        .any(|mark| name.len() == mark.len() && starts_with_loosely(name, mark))
}

/// Whether a client-sent header `name` must never pass the gateway because a backend would
/// trust it: an identity header or a peer-routing mark.
fn is_spoofable_header_name(name: &str) -> bool {
    is_identity_header_name(name) || is_peer_routing_header_name(name)
}

/// `name` starts with `prefix` (lower-case, dashes), ignoring case and reading `_` as `-`.
fn starts_with_loosely(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len()
        && name.bytes().zip(prefix.bytes()).all(|(n, p)| {
            let n = if n == b'_' {
                b'-'
            } else {
                n.to_ascii_lowercase()
            };
            n == p
        })
}

/// Whether `headers` carry anything [`strip_identity_headers`] removes. One pass over the names,
/// comparing bytes and hashing nothing: most requests carry none (and every request carries none
/// by the time the backend's turn comes, the authentication layer having stripped them), while a
/// `remove` hashes the name and probes the table even for a name that is not there.
fn carries_identity_headers(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|name| name == AUTHORIZATION || is_spoofable_header_name(name.as_str()))
}

/// Every header through which a client could claim an identity (see [`is_identity_header_name`]),
/// `Authorization`, and the peer-routing marks (see [`is_peer_routing_header_name`]): all that
/// the core or a remote APIService would believe from us but must not from the client.
pub fn strip_identity_headers(headers: &mut HeaderMap) {
    if !carries_identity_headers(headers) {
        return;
    }
    // One `remove` per claimed name (each takes all its values), so the work is bounded by the
    // names the request has, like the scan: hyper's `max_headers` for HTTP/1.1, the header list
    // size for HTTP/2.
    let claimed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_spoofable_header_name(k.as_str()))
        .cloned()
        .collect();
    for name in claimed {
        headers.remove(name);
    }
    headers.remove(AUTHORIZATION);
}

/// A user whose identity cannot be written into headers: passing it on with that part left out
/// would make the backend act for someone else (fewer groups, or no user and so the proxy
/// certificate's own identity), so the request must be refused instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnencodableIdentity {
    user: String,
    part: String,
}

// === impl UnencodableIdentity ===

impl std::fmt::Display for UnencodableIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Internal error occurred: the identity of user {:?} cannot be passed on: its {} is not a valid HTTP header value",
            self.user, self.part
        )
    }
}

impl std::error::Error for UnencodableIdentity {}

/// Characters kube's `headerKeyEscape` leaves alone in `X-Remote-Extra-<key>`: the RFC 7230
/// token characters except `%` (the escape itself).
const EXTRA_KEY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'*')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// `key` as it appears in an `X-Remote-Extra-<key>` or `Impersonate-Extra-<key>` header name:
/// lower-case, percent-encoded like kube's `headerKeyEscape`.
pub fn encode_extra_key(key: &str) -> String {
    utf8_percent_encode(&key.to_ascii_lowercase(), EXTRA_KEY).to_string()
}

const X_REMOTE_USER: HeaderName = HeaderName::from_static("x-remote-user");
const X_REMOTE_UID: HeaderName = HeaderName::from_static("x-remote-uid");
const X_REMOTE_GROUP: HeaderName = HeaderName::from_static("x-remote-group");

/// `value` as a header value, or which `part` of `user` it is when it cannot be one. kube's own
/// names (the anonymous user and the groups every caller has) are static values: a copied one
/// costs an allocation, and another when a request kept for resending clones it.
fn header_value(
    value: &str,
    user: &UserInfo,
    part: impl FnOnce() -> String,
) -> Result<HeaderValue, UnencodableIdentity> {
    match value {
        ANONYMOUS => return Ok(HeaderValue::from_static(ANONYMOUS)),
        UNAUTHENTICATED => return Ok(HeaderValue::from_static(UNAUTHENTICATED)),
        AUTHENTICATED => return Ok(HeaderValue::from_static(AUTHENTICATED)),
        _ => {}
    }
    HeaderValue::from_str(value).map_err(|_| UnencodableIdentity {
        user: user.name.clone(),
        part: part(),
    })
}

/// Appends every `X-Remote-*` header that carries `user` to `headers`, in order, or says which
/// part of the user cannot be a header value (some headers may have been appended by then).
fn append_identity_headers(
    headers: &mut HeaderMap,
    user: &UserInfo,
) -> Result<(), UnencodableIdentity> {
    headers.append(
        X_REMOTE_USER,
        header_value(&user.name, user, || "username".into())?,
    );
    if !user.uid.is_empty() {
        headers.append(
            X_REMOTE_UID,
            header_value(&user.uid, user, || "UID".into())?,
        );
    }
    for group in &user.groups {
        headers.append(
            X_REMOTE_GROUP,
            header_value(group, user, || format!("group {group:?}"))?,
        );
    }
    for (key, values) in &user.extra {
        let name = format!("x-remote-extra-{}", encode_extra_key(key));
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| UnencodableIdentity {
            user: user.name.clone(),
            part: format!("extra key {key:?}"),
        })?;
        for v in values {
            headers.append(
                name.clone(),
                header_value(v, user, || format!("extra {key:?} value"))?,
            );
        }
    }
    Ok(())
}

/// Checks that every part of `user` can travel in identity headers (`X-Remote-*` or
/// `Impersonate-*`: the same values), for callers that set them some other way.
pub fn check_encodable(user: &UserInfo) -> Result<(), UnencodableIdentity> {
    append_identity_headers(&mut HeaderMap::new(), user)
}

/// Sets `X-Remote-User`, one `X-Remote-Group` per group, `X-Remote-Uid` when known, and
/// `X-Remote-Extra-<percent-encoded key>` per extra value, after removing every identity header
/// the client sent. When any part of the user cannot be a header value, nothing is set (the
/// client's headers are still gone) and the request must not be sent.
pub fn set_identity_headers(
    headers: &mut HeaderMap,
    user: &UserInfo,
) -> Result<(), UnencodableIdentity> {
    strip_identity_headers(headers);
    // Written straight into the request; a part that cannot be encoded takes back what was
    // written before it (the names stripped above are exactly the ones set here).
    append_identity_headers(headers, user).inspect_err(|_| strip_identity_headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_identity_never_survives() {
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "admin".parse().unwrap());
        h.append("x-remote-group", "system:masters".parse().unwrap());
        h.insert("x-remote-extra-scopes", "all".parse().unwrap());
        h.insert("impersonate-user", "admin".parse().unwrap());
        h.insert("impersonate-extra-foo", "x".parse().unwrap());
        h.insert("authorization", "Bearer secret".parse().unwrap());
        h.insert("accept", "application/json".parse().unwrap());
        let alice = UserInfo::authenticated(
            "alice".into(),
            String::new(),
            vec!["dev".into()],
            BTreeMap::new(),
        );
        set_identity_headers(&mut h, &alice).unwrap();
        assert_eq!(h["x-remote-user"], "alice");
        let groups: Vec<_> = h
            .get_all("x-remote-group")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(groups, ["dev", AUTHENTICATED]);
        for gone in [
            "x-remote-extra-scopes",
            "impersonate-user",
            "impersonate-extra-foo",
            "authorization",
        ] {
            assert!(h.get(gone).is_none(), "{gone} survived");
        }
        assert_eq!(h["accept"], "application/json");
    }

    #[test]
    fn extra_keys_are_percent_encoded() {
        let mut h = HeaderMap::new();
        let mut extra = BTreeMap::new();
        extra.insert(
            "authentication.kubernetes.io/credential-id".to_owned(),
            vec!["X509SHA256=ab".to_owned()],
        );
        extra.insert("scopes".to_owned(), vec!["a".to_owned(), "b".to_owned()]);
        set_identity_headers(
            &mut h,
            &UserInfo::authenticated("bob".into(), "42".into(), vec![], extra),
        )
        .unwrap();
        assert_eq!(
            h["x-remote-extra-authentication.kubernetes.io%2fcredential-id"],
            "X509SHA256=ab"
        );
        assert_eq!(h.get_all("x-remote-extra-scopes").iter().count(), 2);
        assert_eq!(h["x-remote-uid"], "42");
    }

    #[test]
    fn strip_removes_every_remote_header() {
        let mut h = crate::test_util::headers(&[
            ("X-Remote-User", "a"),
            ("X-Remote-Extra-x", "1"),
            ("X-Remote-Uid", "1"),
            ("Accept", "*/*"),
        ]);
        strip_identity_headers(&mut h);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn underscore_and_case_variants_are_identity_headers_too() {
        for name in [
            "x_remote_user",
            "X_Remote_Group",
            "x-remote_uid",
            "X_REMOTE-EXTRA-scopes",
            "x_remote_extra_foo",
            "impersonate_user",
            "Impersonate_Extra_foo",
            "IMPERSONATE-GROUP",
        ] {
            assert!(is_identity_header_name(name), "{name}");
        }
        for name in [
            "x-remote",
            "x_remotely",
            "x-forwarded-user",
            "remote-user",
            "impersonate",
            "impersonation-user",
            "accept",
        ] {
            assert!(!is_identity_header_name(name), "{name}");
        }
    }

    #[test]
    fn peer_routing_marks_are_stripped_in_every_spelling() {
        for name in [
            "x-kubernetes-peer-proxied",
            "X-Kubernetes-Peer-Proxied",
            "x_kubernetes_peer_proxied",
            "X-Kubernetes-APIServer-Rerouted",
        ] {
            assert!(is_peer_routing_header_name(name), "{name}");
            let mut h = crate::test_util::headers(&[(name, "true"), ("accept", "*/*")]);
            strip_identity_headers(&mut h);
            assert_eq!(h.len(), 1, "{name} survived");
        }
        for name in [
            "x-kubernetes-peer-proxied-by",
            "x-kubernetes-peer",
            "x-kubernetes-pf-flowschema-uid",
        ] {
            assert!(!is_peer_routing_header_name(name), "{name}");
        }
    }

    #[test]
    fn any_one_identity_header_is_enough_to_strip() {
        // The one-pass check decides whether anything is removed: each of these, alone among
        // ordinary headers (first, last or in between), must make it say yes.
        for name in [
            "Authorization",
            "X-Remote-User",
            "x_remote_group",
            "X_REMOTE-EXTRA-scopes",
            "Impersonate-User",
            "impersonate_uid",
            "IMPERSONATE-EXTRA-foo",
        ] {
            for at in 0..3 {
                let mut pairs = vec![("accept", "*/*"), ("user-agent", "kubectl")];
                pairs.insert(at, (name, "forged"));
                let mut h = crate::test_util::headers(&pairs);
                h.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_static("again"),
                );
                strip_identity_headers(&mut h);
                let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
                names.sort();
                assert_eq!(names, ["accept", "user-agent"], "{name} at {at} survived");
            }
        }
        let clean = crate::test_util::headers(&[("accept", "*/*"), ("x-remotes", "kept")]);
        let mut h = clean.clone();
        strip_identity_headers(&mut h);
        assert_eq!(h, clean);
    }

    #[test]
    fn forged_underscore_variants_never_survive() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("x_remote_user", "admin"),
            ("X_Remote_Group", "system:masters"),
            ("x_remote_extra_foo", "all"),
            ("x-remote_uid", "0"),
            ("impersonate_user", "admin"),
            ("Impersonate_Group", "system:masters"),
            ("x_requested_with", "kept"),
        ] {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let alice = UserInfo::authenticated("alice".into(), String::new(), vec![], BTreeMap::new());
        set_identity_headers(&mut h, &alice).unwrap();
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["x-remote-group", "x-remote-user", "x_requested_with"]
        );
        assert_eq!(h["x-remote-user"], "alice");
        assert_eq!(h["x-remote-group"], AUTHENTICATED);
    }

    #[test]
    fn an_identity_that_cannot_be_a_header_refuses_the_request() {
        let forged = || {
            let mut h = HeaderMap::new();
            h.insert("x-remote-user", "admin".parse().unwrap());
            h.insert("x_remote_group", "system:masters".parse().unwrap());
            h.insert("accept", "*/*".parse().unwrap());
            h
        };
        let user = |name: &str, groups: &[&str], extra: &[(&str, &str)]| UserInfo {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                .collect(),
        };
        for (bad, part) in [
            (user("eve\nadmin", &["dev"], &[]), "username"),
            (
                user(
                    "eve",
                    &["dev", "ops\r\nX-Remote-Group: system:masters"],
                    &[],
                ),
                "group",
            ),
            (
                user("eve", &["dev"], &[("scopes", "a\u{7f}")]),
                "extra \"scopes\"",
            ),
        ] {
            let mut h = forged();
            let err = set_identity_headers(&mut h, &bad).unwrap_err();
            assert!(err.to_string().contains(part), "{err}");
            assert!(
                err.to_string().starts_with("Internal error occurred: "),
                "{err}"
            );
            // Nothing of the user is set (no partial identity) and nothing forged is left.
            assert_eq!(h.len(), 1, "{h:?}");
            assert_eq!(h["accept"], "*/*");
            assert_eq!(check_encodable(&bad), Err(err));
        }
        // Non-ASCII text is a valid header value (kube sends it as raw bytes too).
        assert!(check_encodable(&user("élodie", &["dév"], &[("k", "ü")])).is_ok());
    }

    #[test]
    fn anonymous_is_unauthenticated() {
        let a = UserInfo::anonymous();
        assert_eq!(a.groups, [UNAUTHENTICATED]);
    }
}
