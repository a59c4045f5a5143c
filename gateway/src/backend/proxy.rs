//! Proxying written once for every backend: which headers cross the gateway (RFC 9110 hop-by-hop
//! rules, `X-Forwarded-*`), streaming bodies in both directions, and tunnelling upgraded
//! connections (SPDY/3.1 and WebSocket for exec, attach and port-forward) after a 101.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::body::{self, Request, Response};
use crate::extensions::RequestContext;

/// Hop-by-hop headers (RFC 9110 §7.6.1, plus the historical ones Go's proxy also drops).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The forwarding headers the backends get. Constants, so inserting one does not copy its name
/// (a `&str` name is copied into a new `HeaderName` on every insert).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// True when the client asks to switch protocols (`Connection: Upgrade` plus `Upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let (mut connection, mut upgrade) = (false, false);
    for name in headers.keys() {
        connection |= name == header::CONNECTION;
        upgrade |= name == header::UPGRADE;
    }
    connection
        && upgrade
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Whether `headers` hold any hop-by-hop header or `Upgrade`. One pass over the names, comparing
/// them (a standard name is a one-byte tag) and hashing nothing: the common message has none
/// (a `Connection`-named header needs a `Connection` header, which is one), while each of the
/// ten `remove`s [`strip_hop_by_hop`] would do hashes its name and probes the table even when
/// the name is not there.
fn carries_hop_by_hop(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|name| name == header::UPGRADE || HOP_BY_HOP.iter().any(|h| h == name))
}

/// Removes hop-by-hop headers, including any named by `Connection`. When `keep_upgrade` is set,
/// `Upgrade` and a `Connection: Upgrade` survive so the next hop sees the same upgrade request.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    if !keep_upgrade && !carries_hop_by_hop(headers) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == header::UPGRADE))
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// Where a request is going: scheme and authority of the backend. The path and query are sent as
/// the client wrote them.
#[derive(Clone, Debug)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
}

/// Points an already prepared request at another upstream (a retry on another endpoint).
pub fn set_upstream(req: &mut Request, upstream: &Upstream) {
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(upstream.scheme.clone());
    parts.authority = Some(upstream.authority.clone());
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// Rewrites a client request into the request for `upstream`. The client's trailers are dropped
/// (see [`body::without_trailers`]): like `Trailer` and `TE`, they are not passed on.
pub fn prepare_request(req: &mut Request, upstream: &Upstream, client: Option<SocketAddr>) {
    let body = std::mem::take(req.body_mut());
    *req.body_mut() = body::without_trailers(body);
    let upgrade = is_upgrade(req.headers());
    // The client's URI is taken apart rather than cloned: its path goes on as it is.
    let client_uri = std::mem::take(req.uri_mut()).into_parts();
    let headers = req.headers_mut();
    // The original `Host` is taken out (one lookup, no copy) before hop-by-hop stripping, so
    // `X-Forwarded-Host` carries it even when `Connection` names it.
    let original_host = headers.remove(header::HOST).or_else(|| {
        client_uri
            .authority
            .as_ref()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(upstream.scheme.clone());
    uri.authority = Some(upstream.authority.clone());
    uri.path_and_query = Some(
        client_uri
            .path_and_query
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    *req.uri_mut() = Uri::from_parts(uri).expect("scheme, authority and path are already valid");
    // The connection decides the version on the wire (h2 when negotiated); asking for HTTP/1.1
    // here lets the pooled client use either.
    *req.version_mut() = Version::HTTP_11;

    // The connection's own copy of the client's address, when the request came on it: a
    // client that sent no `X-Forwarded-For` gets it without a copy of the text.
    let connection_address = client.and_then(|addr| {
        RequestContext::conn_of(req.extensions())
            .filter(|conn| conn.remote == addr)
            .map(|conn| conn.client_address().clone())
    });
    let headers = req.headers_mut();
    strip_hop_by_hop(headers, upgrade);
    if upgrade {
        // A backstop: authentication already took any bearer-token subprotocol off (see
        // `auth::websocket`), and no upgrade may carry one to a backend whatever path it took.
        crate::auth::websocket::strip(headers);
    }
    if let Some(addr) = client {
        // One lookup for reading what the client sent and replacing it.
        match headers.entry(X_FORWARDED_FOR) {
            Entry::Occupied(mut sent) => {
                if let Some(v) = forwarded_for(Some(sent.get()), addr.ip()) {
                    sent.insert(v);
                }
            }
            Entry::Vacant(none) => {
                if let Some(v) = connection_address.or_else(|| forwarded_for(None, addr.ip())) {
                    none.insert(v);
                }
            }
        }
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    if let Some(host) = original_host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    // The gateway's span becomes the backend's parent (only when the request is traced).
    crate::otel::propagate(req);
}

/// `X-Forwarded-For` with `ip` appended to what the client sent (an empty or non-text value is
/// replaced). Formatted on the stack: the header value is the request's only allocation here
/// (none when the client sent no `X-Forwarded-For` on a connection of ours: [`prepare_request`]
/// uses the connection's copy of the address then).
fn forwarded_for(prior: Option<&HeaderValue>, ip: IpAddr) -> Option<HeaderValue> {
    let mut own = [0u8; 48];
    let own = ip_text(ip, &mut own)?;
    match prior.and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.is_empty() => {
            let mut value = Vec::with_capacity(prior.len() + 2 + own.len());
            value.extend_from_slice(prior.as_bytes());
            value.extend_from_slice(b", ");
            value.extend_from_slice(own);
            HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()
        }
        _ => HeaderValue::from_bytes(own).ok(),
    }
}

/// `ip` as text, written into `buf`. An IPv4 address (nearly every client) is written digit by
/// digit: `Display` goes through the formatter once per octet (BENCHMARKS.md, "Why the code is
/// shaped so").
fn ip_text(ip: IpAddr, buf: &mut [u8; 48]) -> Option<&[u8]> {
    let IpAddr::V4(v4) = ip else {
        use std::io::Write as _;
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        write!(cursor, "{ip}").ok()?;
        let len = cursor.position() as usize;
        return Some(&buf[..len]);
    };
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            buf[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            buf[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        buf[len] = b'0' + octet % 10;
        len += 1;
    }
    Some(&buf[..len])
}

/// Cleans a backend response for the client: hop-by-hop headers go, except on a 101 where the
/// `Upgrade`/`Connection` pair is the answer itself.
pub fn prepare_response(resp: &mut Response) {
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    strip_hop_by_hop(resp.headers_mut(), switching);
}

/// Sends an upgrade request with `send` and, when the backend answers 101, tunnels the client's
/// connection to the backend's. Any other answer is passed back as is.
pub async fn forward_upgrade<F, E>(
    mut req: Request,
    send: impl FnOnce(Request) -> F,
    drain: watch::Receiver<bool>,
) -> Result<Response, E>
where
    F: std::future::Future<Output = Result<hyper::Response<hyper::body::Incoming>, E>>,
{
    // hyper keeps the client connection's pending upgrade in the request extensions; it must stay
    // with us while the request itself goes to the backend.
    let mut client_req = http::Request::new(body::empty());
    *client_req.extensions_mut() = std::mem::take(req.extensions_mut());
    let mut resp = send(req).await?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        tunnel(&mut client_req, &mut resp, drain);
    }
    let mut resp = resp.map(body::boxed);
    prepare_response(&mut resp);
    Ok(resp)
}

/// A backend response as the client gets it: hop-by-hop headers removed, and a long-running body
/// ended cleanly when the gateway drains. Takes the body boxed already (the backends box it
/// with their guards): boxing it again here would cost another allocation per request.
pub fn client_response(
    resp: Response,
    long_running: bool,
    drain: &watch::Receiver<bool>,
) -> Response {
    let mut resp = resp.map(|b| {
        if long_running {
            drainable(b, drain.clone())
        } else {
            b
        }
    });
    prepare_response(&mut resp);
    resp
}

/// After both sides agreed to switch protocols, copies bytes both ways until either side closes,
/// or until the gateway drains long-running connections at shutdown.
pub fn tunnel(
    client: &mut Request,
    upstream: &mut hyper::Response<hyper::body::Incoming>,
    drain: watch::Receiver<bool>,
) {
    let client_side = hyper::upgrade::on(client);
    let upstream_side = hyper::upgrade::on(upstream);
    tokio::spawn(async move {
        let (client_io, upstream_io) = match tokio::try_join!(client_side, upstream_side) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
        };
        let mut client_io = TokioIo::new(client_io);
        let mut upstream_io = TokioIo::new(upstream_io);
        let mut drain = drain;
        tokio::select! {
            res = tokio::io::copy_bidirectional(&mut client_io, &mut upstream_io) => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "upgraded connection ended with an error");
                }
            }
            _ = drained(&mut drain) => {
                use tokio::io::AsyncWriteExt;
                let _ = client_io.shutdown().await;
                let _ = upstream_io.shutdown().await;
            }
        }
    });
}

/// Ends a long-running response body cleanly when the gateway drains at shutdown, so watchers see
/// the stream close (and re-watch elsewhere) instead of a reset.
pub fn drainable(body: body::Body, drain: watch::Receiver<bool>) -> body::Body {
    if *drain.borrow() {
        return body::empty();
    }
    let mut drain = drain;
    body::boxed(Drainable {
        inner: body,
        drained: Box::pin(async move { drained(&mut drain).await }),
        ended: false,
    })
}

pin_project_lite::pin_project! {
    /// A body that ends where its inner body ends or where the gateway drains. It says when the
    /// inner body is at its end: the frame that closes the stream upstream then closes it for the
    /// client too, and is not relayed as an empty frame of its own (a Rust client allows 100 such
    /// frames on a connection, then sends GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames").
    struct Drainable {
        #[pin]
        inner: body::Body,
        drained: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        ended: bool,
    }
}

impl http_body::Body for Drainable {
    type Data = bytes::Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, body::BoxError>>> {
        let this = self.project();
        if *this.ended {
            return std::task::Poll::Ready(None);
        }
        // The drain first: a watch that always has an event ready still ends at shutdown.
        if this.drained.as_mut().poll(cx).is_ready() {
            *this.ended = true;
            return std::task::Poll::Ready(None);
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.ended {
            return http_body::SizeHint::with_exact(0);
        }
        // The gateway may end it early: no exact size can be promised.
        http_body::SizeHint::new()
    }
}

/// Resolves once the gateway starts draining (or the sender is gone).
pub async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extensions::ConnInfo;
    use crate::test_util::headers;

    #[tokio::test]
    async fn a_drainable_body_says_it_is_at_its_end_with_its_inner_body_and_ends_on_drain() {
        use http_body::Body as _;
        use http_body_util::BodyExt as _;
        let (tx, rx) = watch::channel(false);
        let mut body = drainable(body::full("event"), rx.clone());
        assert!(!body.is_end_stream());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "event");
        // The last frame said so: hyper closes the stream with it, sending no empty frame more.
        assert!(body.is_end_stream());

        let never_ending =
            body::boxed(http_body_util::StreamBody::new(futures::stream::pending::<
                Result<http_body::Frame<bytes::Bytes>, body::BoxError>,
            >()));
        let mut body = drainable(never_ending, rx);
        tx.send(true).unwrap();
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "secret"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("accept", "application/json"),
            ("audit-id", "abc"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["accept", "audit-id"]);
    }

    #[test]
    fn any_one_hop_by_hop_header_is_enough_to_strip() {
        // The one-pass check decides whether anything is removed: each of these, alone among
        // ordinary headers and in any case, must make it say yes.
        for name in [
            "Connection",
            "Keep-Alive",
            "PROXY-CONNECTION",
            "proxy-authenticate",
            "Proxy-Authorization",
            "TE",
            "trailer",
            "Transfer-Encoding",
            "upgrade",
        ] {
            let mut h = headers(&[("accept", "*/*"), (name, "x"), ("user-agent", "kubectl")]);
            strip_hop_by_hop(&mut h, false);
            let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
            names.sort();
            assert_eq!(names, ["accept", "user-agent"], "{name} survived");
        }
    }

    #[test]
    fn every_connection_value_names_headers_to_remove() {
        let mut h = headers(&[
            ("x-one", "1"),
            ("Connection", "X-One"),
            ("x-two", "2"),
            ("connection", "x-Two , keep-alive,"),
            ("accept", "*/*"),
            ("x-three", "3"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["accept", "x-three"]);
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_is_left_as_it_is() {
        let sent = headers(&[
            ("accept", "application/json"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-connection", "kept"),
            ("keep-alive-ish", "kept"),
        ]);
        let mut h = sent.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, sent);
        assert!(!is_upgrade(&h));
    }

    #[test]
    fn an_upgrade_needs_both_headers() {
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&headers(&[("connection", "upgrade")])));
        assert!(!is_upgrade(&headers(&[
            ("connection", "keep-alive"),
            ("upgrade", "websocket")
        ])));
        assert!(is_upgrade(&headers(&[
            ("upgrade", "websocket"),
            ("connection", "keep-alive"),
            ("connection", "UPGRADE")
        ])));
    }

    #[test]
    fn upgrade_requests_keep_their_upgrade() {
        let mut h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "SPDY/3.1");
        assert_eq!(h["connection"], "Upgrade");
        assert_eq!(h["x-stream-protocol-version"], "v4.channel.k8s.io");
    }

    #[test]
    fn an_upgrade_goes_on_without_a_token_subprotocol() {
        let mut req = http::Request::builder()
            .uri("/api/v1/namespaces/default/pods/web-0/exec")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header(
                "sec-websocket-protocol",
                "base64url.bearer.authorization.k8s.io.c2VjcmV0, v5.channel.k8s.io",
            )
            .body(body::empty())
            .unwrap();
        prepare_for_core(&mut req, None);
        assert_eq!(req.headers()["sec-websocket-protocol"], "v5.channel.k8s.io");
        assert_eq!(req.headers()["upgrade"], "websocket");
    }

    /// `req` prepared for a plain core at 127.0.0.1:9, from `client` (`None`: unknown).
    fn prepare_for_core(req: &mut Request, client: Option<&str>) {
        let upstream = Upstream {
            scheme: Scheme::HTTP,
            authority: "127.0.0.1:9".parse().unwrap(),
        };
        prepare_request(req, &upstream, client.map(|c| c.parse().unwrap()));
    }

    #[test]
    fn forwarded_headers_are_set_and_path_kept() {
        let mut req = http::Request::builder()
            .uri("/api/v1/pods?labelSelector=a%3Db&watch=1")
            .header("host", "gateway.example:8443")
            .header("x-forwarded-for", "10.0.0.1")
            .body(body::empty())
            .unwrap();
        prepare_for_core(&mut req, Some("192.0.2.7:5555"));
        assert_eq!(
            req.uri().to_string(),
            "http://127.0.0.1:9/api/v1/pods?labelSelector=a%3Db&watch=1"
        );
        assert_eq!(req.headers()["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(req.headers()["x-forwarded-host"], "gateway.example:8443");
        assert_eq!(req.headers()["x-forwarded-proto"], "https");
        assert!(req.headers().get("host").is_none());
    }

    #[test]
    fn a_client_without_forwarded_for_gets_its_connection_address() {
        for (peer, other) in [
            ("192.0.2.7:5555", "192.0.2.8:5555"),
            ("[::1]:443", "[::2]:443"),
        ] {
            let addr: SocketAddr = peer.parse().unwrap();
            // The request carries its connection (the listener's extension), or another one.
            for conn in [peer, other] {
                let mut req = http::Request::builder()
                    .uri("/api")
                    .extension(RequestContext::new(ConnInfo::new(conn.parse().unwrap())))
                    .body(body::empty())
                    .unwrap();
                prepare_for_core(&mut req, Some(peer));
                assert_eq!(
                    req.headers()["x-forwarded-for"],
                    addr.ip().to_string().as_str()
                );
            }
        }
    }

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        let mut buf = [0u8; 48];
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.100.9",
            "1.20.199.0",
            "192.0.2.7",
            "::1",
            "::ffff:192.0.2.7",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip, &mut buf).unwrap(), ip.to_string().as_bytes());
        }
        for n in (0..=u32::MAX).step_by(9_973) {
            let ip = IpAddr::from(n.to_be_bytes());
            assert_eq!(ip_text(ip, &mut buf).unwrap(), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn forwarded_headers_replace_what_the_client_sent() {
        let mut req = http::Request::builder()
            .uri("/api")
            .header("host", "gateway.example")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-forwarded-for", "10.0.0.2")
            .header("x-forwarded-proto", "http")
            .header("x-forwarded-host", "forged.example")
            .header("connection", "host")
            .body(body::empty())
            .unwrap();
        prepare_for_core(&mut req, Some("192.0.2.7:5555"));
        let all = |name| -> Vec<_> { req.headers().get_all(name).iter().collect() };
        // The first value the client sent, then the client's address (as before: one value).
        assert_eq!(all("x-forwarded-for"), ["10.0.0.1, 192.0.2.7"]);
        assert_eq!(all("x-forwarded-proto"), ["https"]);
        // `Connection: host` does not hide the client's `Host` from the backend.
        assert_eq!(all("x-forwarded-host"), ["gateway.example"]);
        assert!(all("host").is_empty());
        assert!(all("connection").is_empty());

        // HTTP/2: no `Host`, the authority of the URI.
        let mut req = http::Request::builder()
            .uri("https://gateway.example:8443/api?x=1")
            .body(body::empty())
            .unwrap();
        prepare_for_core(&mut req, None);
        assert_eq!(req.uri().to_string(), "http://127.0.0.1:9/api?x=1");
        assert_eq!(req.headers()["x-forwarded-host"], "gateway.example:8443");
        assert!(req.headers().get("x-forwarded-for").is_none());
    }
}
