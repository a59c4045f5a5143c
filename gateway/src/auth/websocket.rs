//! Bearer tokens offered as a WebSocket subprotocol, read as kube-apiserver's
//! `k8s.io/apiserver/pkg/authentication/request/websocket/protocol.go` (`ProtocolAuthenticator`)
//! reads them. A browser's WebSocket API cannot set `Authorization`, so web consoles and
//! client-go's WebSocket transport (kubectl exec, attach, port-forward) offer
//! `base64url.bearer.authorization.k8s.io.<unpadded base64url token>` beside the subprotocols
//! they really speak (`v5.channel.k8s.io`, ...).
//!
//! As in kube, only a WebSocket upgrade is read this way (`Upgrade: websocket` and
//! `Connection: upgrade`: `wsstream.IsWebSocketRequest`), only when bearer tokens are reviewed at
//! all, and after an `Authorization` bearer token. Two token entries, one that does not decode,
//! or a token with no other subprotocol beside it (the server must have one to answer with) fail
//! authentication; an empty one is no credential.
//!
//! kube takes the entry out of the header once its token authenticated someone; here it goes
//! from every request whatever authenticated it ([`strip`]), as `Authorization` does: it is a
//! credential, and no backend, log or later layer should see it.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use bytes::{BufMut, BytesMut};
use http::header::{HeaderName, HeaderValue, CONNECTION, SEC_WEBSOCKET_PROTOCOL, UPGRADE};
use http::HeaderMap;

/// The prefix of the subprotocol entry that carries a token.
pub const PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Go's `base64.RawURLEncoding`: the URL-safe alphabet, no padding (a `=` is an error), and
/// nonzero bits after the last character accepted (Go is not strict about them by default).
const RAW_URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// Why a token subprotocol is no credential. The messages say what to send instead; the caller
/// reads only kube's "Unauthorized", the log says which.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolTokenError {
    #[error("more than one {PREFIX}<token> WebSocket subprotocol; offer the token once")]
    Multiple,
    #[error(
        "the {PREFIX}<token> WebSocket subprotocol is not unpadded base64url; encode the token \
         with the URL-safe alphabet and no '=' padding"
    )]
    Encoding,
    #[error("the {PREFIX}<token> WebSocket subprotocol does not decode to UTF-8 text")]
    NotText,
    #[error(
        "the {PREFIX}<token> WebSocket subprotocol is the only one offered; offer the \
         subprotocol the connection speaks beside it (e.g. v5.channel.k8s.io)"
    )]
    NoOtherProtocol,
    #[error("the bearer token in the WebSocket subprotocol holds control characters")]
    NotAHeaderValue,
}

/// Whether the request is a WebSocket upgrade as kube's `wsstream.IsWebSocketRequest` decides:
/// the first `Upgrade` value is `websocket` (any case) and the first `Connection` value lists
/// `upgrade`.
pub fn is_websocket_request(headers: &HeaderMap) -> bool {
    let first = |name: HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    first(UPGRADE).is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
        && first(CONNECTION).is_some_and(|c| {
            c.split(',')
                .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
        })
}

/// Whether authenticating these headers may review a subprotocol token (cheap, for
/// `Authenticator::may_wait`).
pub fn offers_token(headers: &HeaderMap) -> bool {
    headers.contains_key(SEC_WEBSOCKET_PROTOCOL) && is_websocket_request(headers)
}

/// Every subprotocol entry of every `Sec-WebSocket-Protocol` line (RFC 6455 §11.3.4: several
/// lines are one comma-separated list), trimmed.
fn entries(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
}

/// A bearer token offered as a subprotocol.
#[derive(Debug)]
pub struct ProtocolToken {
    /// What is reviewed.
    pub token: String,
    /// `Bearer <token>`, marked sensitive: what the core gets in passthrough mode, so that it
    /// authenticates the same caller.
    pub authorization: HeaderValue,
}

/// The bearer token a WebSocket upgrade offers as a subprotocol. `Ok(None)` when the request is
/// no WebSocket upgrade or offers no token (an empty one included, as in kube).
pub fn token(headers: &HeaderMap) -> Result<Option<ProtocolToken>, ProtocolTokenError> {
    if !is_websocket_request(headers) {
        return Ok(None);
    }
    let (mut token, mut seen, mut others) = (None, false, 0usize);
    for entry in entries(headers) {
        let Some(encoded) = entry.strip_prefix(PREFIX.as_bytes()) else {
            others += 1;
            continue;
        };
        if std::mem::replace(&mut seen, true) {
            return Err(ProtocolTokenError::Multiple);
        }
        let decoded = RAW_URL
            .decode(encoded)
            .map_err(|_| ProtocolTokenError::Encoding)?;
        token = Some(String::from_utf8(decoded).map_err(|_| ProtocolTokenError::NotText)?);
    }
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if others == 0 {
        return Err(ProtocolTokenError::NoOtherProtocol);
    }
    // kube hands the token to its authenticator as it is; here it must also fit in the
    // `Authorization` header the core gets, which no control character does.
    let mut authorization = HeaderValue::from_bytes(format!("Bearer {token}").as_bytes())
        .map_err(|_| ProtocolTokenError::NotAHeaderValue)?;
    authorization.set_sensitive(true);
    Ok(Some(ProtocolToken {
        token,
        authorization,
    }))
}

/// Takes every token entry out of `Sec-WebSocket-Protocol`, keeping the other subprotocols in
/// their order as one line, and the header out altogether when none remain. Headers without a
/// token entry are left as they are (no copy).
pub fn strip(headers: &mut HeaderMap) {
    if !entries(headers).any(|e| e.starts_with(PREFIX.as_bytes())) {
        return;
    }
    let mut kept = BytesMut::new();
    for entry in entries(headers).filter(|e| !e.is_empty() && !e.starts_with(PREFIX.as_bytes())) {
        if !kept.is_empty() {
            kept.put_slice(b", ");
        }
        kept.put_slice(entry);
    }
    // The entries come from header values, so they are valid in one.
    match HeaderValue::from_maybe_shared(kept.freeze()) {
        Ok(v) if !v.is_empty() => {
            headers.insert(SEC_WEBSOCKET_PROTOCOL, v);
        }
        _ => {
            headers.remove(SEC_WEBSOCKET_PROTOCOL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    fn upgrade(protocols: &[&str]) -> HeaderMap {
        let mut h = headers(&[("Connection", "Upgrade"), ("Upgrade", "websocket")]);
        for p in protocols {
            h.append(SEC_WEBSOCKET_PROTOCOL, p.parse().unwrap());
        }
        h
    }

    fn entry(token: &str) -> String {
        format!("{PREFIX}{}", RAW_URL.encode(token))
    }

    /// The token, after checking that the `Authorization` value is the same token.
    fn token_of(h: &HeaderMap) -> Result<Option<String>, ProtocolTokenError> {
        token(h).map(|found| {
            found.map(|t| {
                assert_eq!(
                    t.authorization.as_bytes(),
                    format!("Bearer {}", t.token).as_bytes()
                );
                assert!(t.authorization.is_sensitive());
                t.token
            })
        })
    }

    #[test]
    fn only_websocket_upgrades_are_read() {
        let offered = format!("{}, v5.channel.k8s.io", entry("t"));
        let cases: [(&[(&str, &str)], bool); 6] = [
            (&[("Connection", "Upgrade"), ("Upgrade", "websocket")], true),
            (
                &[
                    ("Connection", "keep-alive, upgrade"),
                    ("Upgrade", "WebSocket"),
                ],
                true,
            ),
            (&[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")], false),
            (&[("Upgrade", "websocket")], false),
            (&[("Connection", "Upgrade")], false),
            (
                &[("Connection", "keep-alive"), ("Upgrade", "websocket")],
                false,
            ),
        ];
        for (sent, websocket) in cases {
            let mut h = headers(sent);
            h.insert(SEC_WEBSOCKET_PROTOCOL, offered.parse().unwrap());
            assert_eq!(is_websocket_request(&h), websocket, "{sent:?}");
            assert_eq!(offers_token(&h), websocket, "{sent:?}");
            let want = websocket.then(|| "t".to_owned());
            assert_eq!(token_of(&h), Ok(want), "{sent:?}");
        }
    }

    #[test]
    fn the_token_is_found_among_the_subprotocols_of_every_line() {
        let h = upgrade(&[
            "v4.channel.k8s.io",
            &format!("{}, v5.channel.k8s.io", entry("abc")),
        ]);
        assert_eq!(token_of(&h), Ok(Some("abc".into())));
        // Any bytes of UTF-8 text, `-` and `_` in the encoding, trailing bits Go ignores.
        let h = upgrade(&[&entry("é?>~"), "v5.channel.k8s.io"]);
        assert_eq!(token_of(&h), Ok(Some("é?>~".into())));
        let h = upgrade(&[&format!("{PREFIX}YWJj-_8"), "x"]);
        assert!(matches!(token(&h), Err(ProtocolTokenError::NotText)));
        let h = upgrade(&[&format!("{PREFIX}YR"), "x"]);
        assert_eq!(token_of(&h), Ok(Some("a".into())));
    }

    #[test]
    fn malformed_token_subprotocols_fail_and_an_empty_one_is_no_credential() {
        let cases: [(Vec<String>, ProtocolTokenError); 5] = [
            (
                vec![entry("a"), entry("b"), "x".into()],
                ProtocolTokenError::Multiple,
            ),
            (
                vec![format!("{PREFIX}YWJj=="), "x".into()],
                ProtocolTokenError::Encoding,
            ),
            (
                vec![format!("{PREFIX}a+b/"), "x".into()],
                ProtocolTokenError::Encoding,
            ),
            (vec![entry("abc")], ProtocolTokenError::NoOtherProtocol),
            (
                vec![entry("a\u{7f}b"), "x".into()],
                ProtocolTokenError::NotAHeaderValue,
            ),
        ];
        for (protocols, want) in cases {
            let refs: Vec<&str> = protocols.iter().map(String::as_str).collect();
            assert_eq!(token_of(&upgrade(&refs)), Err(want), "{protocols:?}");
        }
        assert_eq!(token_of(&upgrade(&[PREFIX, "x"])), Ok(None));
        assert_eq!(token_of(&upgrade(&["v5.channel.k8s.io"])), Ok(None));
        assert_eq!(token_of(&upgrade(&[])), Ok(None));
        // The error says what to do.
        let why = ProtocolTokenError::NoOtherProtocol.to_string();
        assert!(why.contains("v5.channel.k8s.io"), "{why}");
    }

    #[test]
    fn stripping_keeps_the_other_subprotocols_in_order() {
        let mut h = upgrade(&[
            "v4.channel.k8s.io",
            &format!("{}, v5.channel.k8s.io", entry("secret")),
        ]);
        strip(&mut h);
        let left: Vec<_> = h.get_all(SEC_WEBSOCKET_PROTOCOL).iter().collect();
        assert_eq!(left, ["v4.channel.k8s.io, v5.channel.k8s.io"]);

        // Only the token: the header goes.
        let mut h = upgrade(&[&entry("secret")]);
        strip(&mut h);
        assert!(!h.contains_key(SEC_WEBSOCKET_PROTOCOL), "{h:?}");

        // Malformed entries go too, and no token means no change at all.
        let mut h = upgrade(&[&format!("{PREFIX}!!, x")]);
        strip(&mut h);
        assert_eq!(h[SEC_WEBSOCKET_PROTOCOL], "x");
        let mut h = upgrade(&["a,  b", "c"]);
        strip(&mut h);
        let left: Vec<_> = h.get_all(SEC_WEBSOCKET_PROTOCOL).iter().collect();
        assert_eq!(left, ["a,  b", "c"]);
    }
}
