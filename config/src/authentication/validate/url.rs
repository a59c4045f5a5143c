//! Go's `url.Parse`, as far as kube's issuer URL checks look at its result: the scheme, whether
//! there is user information, a query or a fragment, and, for a URL Go refuses, Go's error text.
//! It follows the Go of the kube tree we track (1.26): bracketed hosts must be IPv6 addresses
//! (the fix of CVE-2025-47912) and the first colon of an unbracketed host starts the port
//! (`urlstrictcolons`).

use super::go::quote_bytes;

/// What kube's checks read of a parsed URL.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Parsed {
    /// Lowercased, as Go keeps it.
    pub scheme: String,
    pub has_user: bool,
    pub has_query: bool,
    pub has_fragment: bool,
}

/// `url.Parse(raw)`, or the text of its error (`parse "...": ...`).
pub(super) fn parse(raw: &str) -> Result<Parsed, String> {
    let (head, fragment) = match raw.split_once('#') {
        Some((head, fragment)) => (head, Some(fragment)),
        None => (raw, None),
    };
    let mut parsed = parse_reference(head)
        .map_err(|e| format!("parse {}: {e}", quote_bytes(head.as_bytes())))?;
    if let Some(fragment) = fragment {
        unescape(fragment.as_bytes(), Mode::Other)
            .map_err(|e| format!("parse {}: {e}", quote_bytes(raw.as_bytes())))?;
        parsed.has_fragment = !fragment.is_empty();
    }
    Ok(parsed)
}

fn parse_reference(s: &str) -> Result<Parsed, String> {
    if s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    let mut parsed = Parsed::default();
    if s == "*" {
        return Ok(parsed);
    }
    let (scheme, rest) = split_scheme(s)?;
    parsed.scheme = scheme.to_ascii_lowercase();
    // A lone trailing `?` is an empty query that Go only remembers to print.
    let rest = match rest.strip_suffix('?') {
        Some(before) if !before.contains('?') => before,
        _ => match rest.split_once('?') {
            Some((before, query)) => {
                parsed.has_query = !query.is_empty();
                before
            }
            None => rest,
        },
    };
    if !rest.starts_with('/') {
        if !parsed.scheme.is_empty() {
            return Ok(parsed); // opaque: `scheme:rest`
        }
        if rest
            .split('/')
            .next()
            .is_some_and(|first| first.contains(':'))
        {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    let mut path = rest;
    if (!parsed.scheme.is_empty() || !rest.starts_with("///")) && rest.starts_with("//") {
        let after = &rest[2..];
        let (authority, tail) = after.split_at(after.find('/').unwrap_or(after.len()));
        parsed.has_user = parse_authority(authority)?;
        path = tail;
    }
    unescape(path.as_bytes(), Mode::Other)?;
    Ok(parsed)
}

/// Go's `getScheme`: a scheme is letters, then letters, digits, `+`, `-` or `.`, then `:`.
fn split_scheme(s: &str) -> Result<(&str, &str), String> {
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&s[..i], &s[i + 1..])),
            _ => return Ok(("", s)),
        }
    }
    Ok(("", s))
}

/// Checks `[userinfo@]host[:port]`; whether there was user information.
fn parse_authority(authority: &str) -> Result<bool, String> {
    let at = authority.rfind('@');
    parse_host(&authority[at.map_or(0, |i| i + 1)..])?;
    let Some(at) = at else {
        return Ok(false);
    };
    let userinfo = &authority[..at];
    if !userinfo.chars().all(userinfo_char) {
        return Err("net/url: invalid userinfo".into());
    }
    for part in userinfo.splitn(2, ':') {
        unescape(part.as_bytes(), Mode::Other)?;
    }
    Ok(true)
}

fn userinfo_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c)
}

fn parse_host(host: &str) -> Result<(), String> {
    let invalid_port =
        |port: &str| format!("invalid port {} after host", quote_bytes(port.as_bytes()));
    let Some(open) = host.rfind('[') else {
        if let Some(colon) = host.find(':') {
            if !valid_optional_port(&host[colon..]) {
                return Err(invalid_port(&host[colon..]));
            }
        }
        return unescape(host.as_bytes(), Mode::Host).map(drop);
    };
    if open > 0 {
        return Err("invalid IP-literal".into());
    }
    let Some(close) = host.rfind(']') else {
        return Err("missing ']' in host".into());
    };
    if !valid_optional_port(&host[close + 1..]) {
        return Err(invalid_port(&host[close + 1..]));
    }
    let inside = &host.as_bytes()[1..close];
    let address = match find(inside, b"%25") {
        Some(zone) => {
            let mut address = unescape(&inside[..zone], Mode::Host)?;
            address.extend(unescape(&inside[zone..], Mode::Zone)?);
            address
        }
        None => unescape(inside, Mode::Host)?,
    };
    match parse_addr(&address) {
        Ok(Family::V4) => Err("invalid IP-literal".into()),
        Ok(Family::V6) => Ok(()),
        Err(e) => Err(format!("invalid host: {e}")),
    }
}

fn valid_optional_port(port: &str) -> bool {
    match port.strip_prefix(':') {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
        None => port.is_empty(),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Host,
    Zone,
    /// Path, fragment, user information: only `%` escapes are checked.
    Other,
}

/// Go's `unescape`: the decoded bytes, or why the text is not a valid escaping.
fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b != b'%' {
            if mode != Mode::Other && b < 0x80 && !host_char(b) {
                return Err(format!(
                    "invalid character {} in host name",
                    quote_bytes(&[b])
                ));
            }
            out.push(b);
            i += 1;
            continue;
        }
        let escape = &s[i..s.len().min(i + 3)];
        let bad = || format!("invalid URL escape {}", quote_bytes(escape));
        let (Some(hi), Some(lo)) = (hex(s.get(i + 1)), hex(s.get(i + 2))) else {
            return Err(bad());
        };
        let value = hi << 4 | lo;
        let percent = escape == b"%25";
        // In a host only non-ASCII bytes may be escaped; in a zone, bytes a host may hold.
        if (mode == Mode::Host && hi < 8 && !percent)
            || (mode == Mode::Zone && !percent && value != b' ' && !host_char(value))
        {
            return Err(bad());
        }
        out.push(value);
        i += 3;
    }
    Ok(out)
}

fn hex(b: Option<&u8>) -> Option<u8> {
    let b = *b?;
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// An ASCII byte Go leaves unescaped in a host (non-ASCII bytes are not).
fn host_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&b)
}

#[derive(Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// `netip.ParseAddr`: the family, or its error text.
fn parse_addr(s: &[u8]) -> Result<Family, String> {
    for &b in s {
        match b {
            b'.' => return ipv4_fields(s, s).map(|()| Family::V4),
            b':' => return parse_ipv6(s).map(|()| Family::V6),
            b'%' => return Err(addr_error(s, "missing IPv6 address", b"")),
            _ => {}
        }
    }
    Err(addr_error(s, "unable to parse IP", b""))
}

fn addr_error(input: &[u8], message: &str, at: &[u8]) -> String {
    let mut text = format!("ParseAddr({}): {message}", quote_bytes(input));
    if !at.is_empty() {
        text += &format!(" (at {})", quote_bytes(at));
    }
    text
}

/// Checks the dotted IPv4 address `part` (the whole of `input`, or its tail in an IPv6 address).
fn ipv4_fields(input: &[u8], part: &[u8]) -> Result<(), String> {
    let fail = |message: &str, at: &[u8]| Err(addr_error(input, message, at));
    let (mut value, mut digits, mut dots) = (0u32, 0, 0);
    for (i, &b) in part.iter().enumerate() {
        if b.is_ascii_digit() {
            if digits == 1 && value == 0 {
                return fail("IPv4 field has octet with leading zero", b"");
            }
            value = value * 10 + u32::from(b - b'0');
            digits += 1;
            if value > 255 {
                return fail("IPv4 field has value >255", b"");
            }
        } else if b == b'.' {
            if i == 0 || i == part.len() - 1 || part[i - 1] == b'.' {
                return fail("IPv4 field must have at least one digit", &part[i..]);
            }
            if dots == 3 {
                return fail("IPv4 address too long", b"");
            }
            dots += 1;
            (value, digits) = (0, 0);
        } else {
            return fail("unexpected character", &part[i..]);
        }
    }
    if dots < 3 {
        return fail("IPv4 address too short", b"");
    }
    Ok(())
}

/// Checks an IPv6 address with an optional `%zone`, as `netip` does.
fn parse_ipv6(input: &[u8]) -> Result<(), String> {
    let fail = |message: &str, at: &[u8]| Err(addr_error(input, message, at));
    let mut s = input;
    if let Some(percent) = input.iter().position(|&b| b == b'%') {
        if percent + 1 == input.len() {
            return fail("zone must be a non-empty string", b"");
        }
        s = &input[..percent];
    }
    let address_end = s.len();
    let mut ellipsis = false;
    if let Some(after) = s.strip_prefix(b"::") {
        ellipsis = true;
        s = after;
        if s.is_empty() {
            return Ok(());
        }
    }
    let mut bytes = 0;
    while bytes < 16 {
        let digits = s.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 {
            return fail("each colon-separated field must have at least one digit", s);
        }
        if digits > 4 {
            return fail("each group must have 4 or less digits", s);
        }
        if s.get(digits) == Some(&b'.') {
            if !ellipsis && bytes != 12 {
                let message =
                    "embedded IPv4 address must replace the final 2 fields of the address";
                return fail(message, s);
            }
            if bytes + 4 > 16 {
                let message =
                    "too many hex fields to fit an embedded IPv4 at the end of the address";
                return fail(message, s);
            }
            ipv4_fields(input, &input[address_end - s.len()..address_end])?;
            (s, bytes) = (b"", bytes + 4);
            break;
        }
        bytes += 2;
        s = &s[digits..];
        match s {
            [] => break,
            [b':'] => return fail("colon must be followed by more characters", s),
            [b':', rest @ ..] => s = rest,
            _ => return fail("unexpected character, want colon", s),
        }
        if let Some(after) = s.strip_prefix(b":") {
            if ellipsis {
                return fail("multiple :: in address", s);
            }
            ellipsis = true;
            s = after;
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return fail("trailing garbage after address", s);
    }
    match (bytes < 16, ellipsis) {
        (true, false) => fail("address string too short", b""),
        (false, true) => fail("the :: must expand to at least one field of zeros", b""),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(raw: &str) -> String {
        parse(raw).expect_err(raw)
    }

    #[test]
    fn refusals_read_as_go_writes_them() {
        let cases = [
            (
                "https://a:b",
                r#"parse "https://a:b": invalid port ":b" after host"#,
            ),
            (
                "https://a:1:2",
                r#"parse "https://a:1:2": invalid port ":1:2" after host"#,
            ),
            (
                "https://[::1",
                r#"parse "https://[::1": missing ']' in host"#,
            ),
            (
                "https://[::1]x",
                r#"parse "https://[::1]x": invalid port "x" after host"#,
            ),
            (
                "https://a b/",
                r#"parse "https://a b/": invalid character " " in host name"#,
            ),
            (
                "https://a/%zz",
                r#"parse "https://a/%zz": invalid URL escape "%zz""#,
            ),
            (
                "https://a/%4",
                r#"parse "https://a/%4": invalid URL escape "%4""#,
            ),
            (
                "https://%41/",
                r#"parse "https://%41/": invalid URL escape "%41""#,
            ),
            (
                "https://a#%",
                r#"parse "https://a#%": invalid URL escape "%""#,
            ),
            ("://x", r#"parse "://x": missing protocol scheme"#),
            (
                "1a:b/x",
                r#"parse "1a:b/x": first path segment in URL cannot contain colon"#,
            ),
            (
                "https://ü@a",
                r#"parse "https://ü@a": net/url: invalid userinfo"#,
            ),
            (
                "https://a/\u{1}",
                r#"parse "https://a/\x01": net/url: invalid control character in URL"#,
            ),
            (
                "https://[1.2.3.4]/",
                r#"parse "https://[1.2.3.4]/": invalid IP-literal"#,
            ),
            (
                "https://a[::1]/",
                r#"parse "https://a[::1]/": invalid IP-literal"#,
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(error_of(raw), want, "{raw}");
        }
    }

    #[test]
    fn bracketed_hosts_are_ipv6_addresses() {
        let cases = [
            (
                "https://[v1.x]/",
                r#"ParseAddr("v1.x"): unexpected character (at "v1.x")"#,
            ),
            (
                "https://[::1::2]/",
                r#"ParseAddr("::1::2"): multiple :: in address (at ":2")"#,
            ),
            (
                "https://[1:2]/",
                r#"ParseAddr("1:2"): address string too short"#,
            ),
            (
                "https://[12345::]/",
                r#"ParseAddr("12345::"): each group must have 4 or less digits (at "12345::")"#,
            ),
            (
                "https://[::1.2.3]/",
                r#"ParseAddr("::1.2.3"): IPv4 address too short"#,
            ),
            ("https://[x]/", r#"ParseAddr("x"): unable to parse IP"#),
        ];
        for (raw, want) in cases {
            assert_eq!(
                error_of(raw),
                format!(
                    "parse {}: invalid host: {want}",
                    quote_bytes(raw.as_bytes())
                )
            );
        }
        for raw in [
            "https://[::1]:8443/",
            "https://[fe80::1%25en0]/",
            "https://[::ffff:1.2.3.4]/",
        ] {
            assert!(parse(raw).is_ok(), "{raw}");
        }
    }

    #[test]
    fn parts_kube_checks() {
        let got = parse("HTTPS://u:p@a.example:8443/p?q=1#f").unwrap();
        let want = Parsed {
            scheme: "https".into(),
            has_user: true,
            has_query: true,
            has_fragment: true,
        };
        assert_eq!(got, want);
        // Go drops a lone `?` and an empty fragment.
        assert_eq!(
            parse("https://a?#").unwrap(),
            Parsed {
                scheme: "https".into(),
                ..Parsed::default()
            }
        );
        assert_eq!(parse("issuer").unwrap(), Parsed::default());
    }
}
