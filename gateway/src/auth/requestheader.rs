//! Request-header identity (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Uid`,
//! `X-Remote-Extra-<key>`), read the way kube-apiserver's request-header authenticator reads it.
//! Only consulted for a connection whose client certificate is an allowed front-proxy
//! certificate (see `x509`); for everyone else these headers are removed unread.

use std::collections::BTreeMap;

use http::HeaderMap;
use percent_encoding::percent_decode_str;

use crate::identity::UserInfo;

pub const USER: &str = "x-remote-user";
pub const GROUP: &str = "x-remote-group";
pub const UID: &str = "x-remote-uid";
pub const EXTRA_PREFIX: &str = "x-remote-extra-";

/// Every header value of `name` that is valid text (others are ignored, as Go would never have
/// produced them from a well-formed proxy).
pub(crate) fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
}

/// The key of an extra header: lower-case, percent-decoded (kube's `unescapeExtraKey`; a key that
/// does not decode is used as it is).
pub fn decode_extra_key(raw: &str) -> String {
    let lower = raw.to_ascii_lowercase();
    match percent_decode_str(&lower).decode_utf8() {
        Ok(k) => k.into_owned(),
        Err(_) => lower,
    }
}

/// The extras carried in headers starting with `prefix` (`x-remote-extra-` or
/// `impersonate-extra-`), one value per header line.
pub(crate) fn extras(headers: &HeaderMap, prefix: &str) -> BTreeMap<String, Vec<String>> {
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let Some(raw) = name.as_str().strip_prefix(prefix) else {
            continue;
        };
        if raw.is_empty() {
            continue;
        }
        if let Ok(v) = value.to_str() {
            extra
                .entry(decode_extra_key(raw))
                .or_default()
                .push(v.to_owned());
        }
    }
    extra
}

/// The user a trusted front proxy names, or `None` when it names nobody (no or an empty
/// `X-Remote-User`): kube then falls through to the other authenticators.
pub fn user_from_headers(headers: &HeaderMap) -> Option<UserInfo> {
    let name = values(headers, USER).find(|v| !v.is_empty())?.to_owned();
    Some(UserInfo {
        name,
        uid: values(headers, UID).next().unwrap_or_default().to_owned(),
        groups: values(headers, GROUP).map(str::to_owned).collect(),
        extra: extras(headers, EXTRA_PREFIX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    #[test]
    fn reads_user_groups_uid_and_decoded_extras() {
        let h = headers(&[
            ("X-Remote-User", "alice"),
            ("X-Remote-Group", "dev"),
            ("X-Remote-Group", "ops"),
            ("X-Remote-Uid", "42"),
            (
                "X-Remote-Extra-Authentication.Kubernetes.io%2fCredential-Id",
                "X509SHA256=ab",
            ),
            ("X-Remote-Extra-Scopes", "a"),
            ("X-Remote-Extra-Scopes", "b"),
            ("Accept", "application/json"),
        ]);
        let user = user_from_headers(&h).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "42");
        assert_eq!(user.groups, ["dev", "ops"]);
        assert_eq!(
            user.extra["authentication.kubernetes.io/credential-id"],
            ["X509SHA256=ab"]
        );
        assert_eq!(user.extra["scopes"], ["a", "b"]);
    }

    #[test]
    fn no_or_empty_user_names_nobody() {
        assert!(user_from_headers(&headers(&[("X-Remote-Group", "dev")])).is_none());
        assert!(user_from_headers(&headers(&[("X-Remote-User", "")])).is_none());
    }

    #[test]
    fn undecodable_keys_are_kept_as_sent() {
        assert_eq!(decode_extra_key("a%ffb"), "a%ffb");
        assert_eq!(decode_extra_key("Foo%2Fbar"), "foo/bar");
    }
}
