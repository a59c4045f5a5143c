//! Raw HTTP/1.1 and HTTP/2 clients, for what kubectl and curl cannot do.

use super::*;

/// A pooled HTTP client speaking exactly one HTTP version to `https` (and plain `http`) URLs.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A rustls client config trusting `ca_pem`, presenting `client_cert` if given, offering `alpn`.
pub fn tls_client_config(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, HarnessError> {
    install_crypto();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| CertError::Pem(format!("protocol versions: {e}")))?
    .with_root_certificates(root_store(ca_pem)?);
    let mut config = match client_cert {
        Some(pair) => builder
            .with_client_auth_cert(pair.cert_chain()?, pair.private_key()?)
            .map_err(|e| CertError::Pem(format!("client certificate rejected: {e}")))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn client(config: rustls::ClientConfig, http2: bool) -> HttpClient {
    let mut http = HttpConnector::new();
    // The TLS layer needs https URLs passed through.
    http.enforce_http(false);
    // Built from a config rather than hyper-rustls' builder so the ALPN list is exactly ours (its
    // HTTP/1-only mode sends no ALPN at all).
    let connector = HttpsConnector::from((http, config));
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(http2);
    builder.build(connector)
}

/// An HTTP/1.1-only client (ALPN `http/1.1`).
pub fn http1_client(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
) -> Result<HttpClient, HarnessError> {
    Ok(client(
        tls_client_config(ca_pem, client_cert, &[b"http/1.1"])?,
        false,
    ))
}

/// An HTTP/2-only client (ALPN `h2`; prior knowledge on plain `http`).
pub fn http2_client(
    ca_pem: &str,
    client_cert: Option<&CertifiedPair>,
) -> Result<HttpClient, HarnessError> {
    Ok(client(
        tls_client_config(ca_pem, client_cert, &[b"h2"])?,
        true,
    ))
}

/// `GET url`, collecting the whole body (within [`HTTP_TIMEOUT`]).
pub async fn get(
    client: &HttpClient,
    url: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let request = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| HarnessError::Http {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    send(client, request).await
}

/// Sends `request`, collecting the whole body (within [`HTTP_TIMEOUT`]).
pub async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, HeaderMap, Bytes), HarnessError> {
    let url = request.uri().to_string();
    let http_err = |reason: String| HarnessError::Http {
        url: url.clone(),
        reason,
    };
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| http_err(format!("{e:?}")))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| http_err(format!("reading the body: {e}")))?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    };
    tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("request to {url}")))?
}

/// Opens a TLS connection to `addr` trusting `ca_pem`, offering ALPN `http/1.1`, for tests that
/// write raw bytes (upgrades, slow headers, malformed requests).
pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<TlsStream<TcpStream>, HarnessError> {
    let config = tls_client_config(ca_pem, None, &[b"http/1.1"])?;
    tls_connect_with(addr, config).await
}

/// Opens a TLS connection to `addr` with a prepared config (client certificate, other ALPN).
/// The server name is the IP address of `addr`.
pub async fn tls_connect_with(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> Result<TlsStream<TcpStream>, HarnessError> {
    let connect = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(io_err(format!("connecting to {addr}")))?;
        let _ = tcp.set_nodelay(true);
        let server_name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(io_err(format!("TLS handshake with {addr}")))
    };
    tokio::time::timeout(HTTP_TIMEOUT, connect)
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("connecting to {addr}")))?
}

/// Reads an HTTP/1.x response head (through the blank line) byte by byte, so nothing after it is
/// consumed — the rest of the stream may be an upgraded protocol.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Result<String, HarnessError> {
    let read = async {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream
                .read(&mut byte)
                .await
                .map_err(io_err("reading a response head"))?;
            if n == 0 {
                return Err(HarnessError::Io {
                    context: "reading a response head".into(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed after {:?}",
                            String::from_utf8_lossy(&head)
                        ),
                    ),
                });
            }
            head.push(byte[0]);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| HarnessError::Timeout(timeout, "reading a response head".into()))?
}

/// Sends `request` and returns as soon as the response headers arrive, with the body still
/// streaming (for watches and other long-running responses).
pub async fn send_streaming(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, HarnessError> {
    let url = request.uri().to_string();
    tokio::time::timeout(HTTP_TIMEOUT, client.request(request))
        .await
        .map_err(|_| HarnessError::Timeout(HTTP_TIMEOUT, format!("request to {url}")))?
        .map_err(|e| HarnessError::Http {
            url,
            reason: format!("{e:?}"),
        })
}

/// Opens `watches` watches made by `request` (each ending at its `timeoutSeconds`) in rounds of
/// `per_round` at once on `client`, and reads each to its end: how many ended cleanly, and the
/// first few failures.
pub async fn ended_watches(
    client: &HttpClient,
    request: impl Fn() -> Request<Full<Bytes>>,
    watches: usize,
    per_round: usize,
) -> (usize, Vec<String>) {
    let (mut clean, mut failures) = (0, Vec::new());
    for round in 0..watches / per_round {
        let ends = futures::future::join_all((0..per_round).map(|i| {
            let req = request();
            async move {
                let n = round * per_round + i;
                let resp = send_streaming(client, req)
                    .await
                    .map_err(|e| format!("watch {n}: {e}"))?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("watch {n}: {}", resp.status()));
                }
                let mut body = resp.into_body();
                let read = tokio::time::timeout(Duration::from_secs(10), async {
                    while let Some(frame) = body.frame().await {
                        frame.map_err(|e| format!("watch {n}: {e:?}"))?;
                    }
                    Ok(())
                });
                read.await
                    .unwrap_or_else(|_| Err(format!("watch {n}: not ended within 10 s")))
            }
        }))
        .await;
        for end in ends {
            match end {
                Ok(()) => clean += 1,
                Err(e) if failures.len() < 3 => failures.push(e),
                Err(_) => {}
            }
        }
    }
    (clean, failures)
}
