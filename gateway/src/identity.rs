//! Who the caller is (`UserInfo`), and the headers that carry identity to backends. A remote
//! APIService trusts `X-Remote-*` because our proxy client certificate vouches for it, so every
//! identity header a client sent is removed before ours are set: a caller can never speak for
//! someone else through the gateway.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";

/// The authenticated (and, when impersonating, the impersonated) caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

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

/// Every header through which a client could claim an identity.
pub fn strip_identity_headers(headers: &mut HeaderMap) {
    let claimed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            let k = k.as_str();
            k.starts_with("x-remote-") || k.starts_with("impersonate-")
        })
        .cloned()
        .collect();
    for name in claimed {
        headers.remove(name);
    }
    headers.remove(AUTHORIZATION);
}

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

/// Sets `X-Remote-User`, one `X-Remote-Group` per group, `X-Remote-Uid` when known, and
/// `X-Remote-Extra-<percent-encoded key>` per extra value. Values that cannot be header values
/// are skipped (and logged) rather than failing the request.
pub fn set_identity_headers(headers: &mut HeaderMap, user: &UserInfo) {
    strip_identity_headers(headers);
    let mut put = |name: HeaderName, value: &str| match HeaderValue::from_str(value) {
        Ok(v) => {
            headers.append(name, v);
        }
        Err(_) => {
            tracing::warn!(header = %name, "identity value is not a valid header value; skipped")
        }
    };
    put(HeaderName::from_static("x-remote-user"), &user.name);
    if !user.uid.is_empty() {
        put(HeaderName::from_static("x-remote-uid"), &user.uid);
    }
    for group in &user.groups {
        put(HeaderName::from_static("x-remote-group"), group);
    }
    for (key, values) in &user.extra {
        let encoded = encode_extra_key(key);
        let Ok(name) = HeaderName::from_bytes(format!("x-remote-extra-{encoded}").as_bytes())
        else {
            continue;
        };
        for v in values {
            put(name.clone(), v);
        }
    }
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
        set_identity_headers(&mut h, &alice);
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
        );
        assert_eq!(
            h["x-remote-extra-authentication.kubernetes.io%2fcredential-id"],
            "X509SHA256=ab"
        );
        assert_eq!(h.get_all("x-remote-extra-scopes").iter().count(), 2);
        assert_eq!(h["x-remote-uid"], "42");
    }

    #[test]
    fn anonymous_is_unauthenticated() {
        let a = UserInfo::anonymous();
        assert_eq!(a.groups, [UNAUTHENTICATED]);
    }
}
