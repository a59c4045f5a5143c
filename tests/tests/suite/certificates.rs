//! The gateway's own serving certificate as an operator meets it: a generated one is never taken
//! from, or written through, a directory someone else controls, and a rotated one is picked up
//! whatever shape the rotation takes on disk (a replaced directory, a Secret volume's linked
//! folder rewritten in place).
//!
//! What the gateway serves is read off the TLS handshake itself: [`served_leaf`] connects with a
//! client that records the certificate it is shown. The expiry of the certificates in use is on
//! `/metrics` for alerting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use e2e::certs::{install_crypto, CertSpec, CertifiedPair, TestCa};
use e2e::harness::{self, Gateway, GatewayOptions, Process};
use rcgen::ExtendedKeyUsagePurpose;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

// ---- what the gateway serves --------------------------------------------------------------------

/// Accepts any server certificate and remembers it: the tests ask *which* certificate is
/// served, not whether some CA trusts it.
#[derive(Debug)]
struct Recorder {
    seen: Mutex<Option<Vec<u8>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.seen.lock().unwrap() = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The DER of the leaf certificate a new TLS connection to `addr` is shown.
async fn served_leaf(addr: SocketAddr) -> Vec<u8> {
    install_crypto();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let recorder = Arc::new(Recorder {
        seen: Mutex::new(None),
        provider: provider.clone(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    harness::tls_connect_with(addr, config)
        .await
        .unwrap_or_else(|e| panic!("TLS handshake with the gateway at {addr}: {e}"));
    let seen = recorder.seen.lock().unwrap().take();
    seen.expect("the handshake showed a certificate")
}

fn leaf_of(pair: &CertifiedPair) -> Vec<u8> {
    pair.cert_chain().unwrap()[0].to_vec()
}

// ---- generated certificates (no --tls-cert-file) ------------------------------------------------

/// The gateway binary started by hand, so that the harness's own `--cert-dir` is not on the
/// command line, with `env` set.
fn spawn_gateway(args: &[&str], env: &[(&str, &Path)]) -> Process {
    let binary = harness::ensure_gateway_built().unwrap();
    let mut cmd = Command::new(binary);
    cmd.args([
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        "0",
        "--core-url",
        "http://127.0.0.1:1",
        "--apiservice-source",
        "none",
        "--logging-format",
        "json",
    ])
    .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Process::spawn("aggregation-gateway", cmd).unwrap()
}

/// The address of the gateway's `serving` event.
async fn serving_address(process: &Process) -> SocketAddr {
    let line = process
        .wait_for_line(
            |l| l.contains("\"serving\"") && l.contains("address"),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|| panic!("the gateway never served:\n{}", process.logs()));
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    let fields = value.get("fields").unwrap_or(&value);
    fields["address"].as_str().unwrap().parse().unwrap()
}

/// A key pair planted where earlier versions looked by default (`$TMPDIR/aggregation-gateway`)
/// is not served: without `--cert-dir` the generated certificate lives in memory, and nothing
/// is written to the shared temporary directory.
#[tokio::test]
async fn a_key_pair_planted_in_the_temporary_directory_is_not_served() {
    let tmp = tempfile::tempdir().unwrap();
    let planted_dir = tmp.path().join("aggregation-gateway");
    std::fs::create_dir(&planted_dir).unwrap();
    let planted = TestCa::new("mallory-ca").issue_server(&["localhost", "127.0.0.1"]);
    let crt = planted_dir.join("aggregation-gateway.crt");
    let key = planted_dir.join("aggregation-gateway.key");
    std::fs::write(&crt, &planted.cert_pem).unwrap();
    std::fs::write(&key, &planted.key_pem).unwrap();

    let gateway = spawn_gateway(&[], &[("TMPDIR", tmp.path())]);
    let addr = serving_address(&gateway).await;
    let served = served_leaf(addr).await;
    assert_ne!(
        served,
        leaf_of(&planted),
        "the gateway serves the planted certificate:\n{}",
        gateway.logs()
    );
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&planted_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    assert_eq!(entries, [crt, key], "nothing new in the shared directory");
    assert!(
        !gateway.logs().contains("cert_file"),
        "no file to point at: {}",
        gateway.logs()
    );
}

/// With `--cert-dir`, a directory other users can write is refused at start with a message
/// naming it, and nothing is written into it.
#[tokio::test]
async fn a_cert_dir_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let dir = shared.to_str().unwrap();
    let mut gateway = spawn_gateway(&["--cert-dir", dir], &[]);
    let status = gateway
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("the gateway started anyway:\n{}", gateway.logs()));
    assert!(!status.success());
    let logs = gateway.logs();
    assert!(
        logs.contains(dir) && logs.contains("lets other users write"),
        "{logs}"
    );
    assert!(std::fs::read_dir(&shared).unwrap().next().is_none());
}

/// In its own directory, the gateway writes the pair as 0600 files and replaces a symlink
/// planted at the key's name instead of writing the key through it.
#[tokio::test]
async fn generated_files_are_private_and_never_written_through_a_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let elsewhere = tmp.path().join("where-mallory-reads");
    std::os::unix::fs::symlink(&elsewhere, dir.join("aggregation-gateway.key")).unwrap();

    let gateway = spawn_gateway(&["--cert-dir", dir.to_str().unwrap()], &[]);
    let addr = serving_address(&gateway).await;
    assert!(
        !elsewhere.exists(),
        "the key was written through the symlink"
    );
    for name in ["aggregation-gateway.crt", "aggregation-gateway.key"] {
        let meta = std::fs::symlink_metadata(dir.join(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name}");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
    }
    // The file the log points at is the certificate being served.
    let pem = std::fs::read_to_string(dir.join("aggregation-gateway.crt")).unwrap();
    let written = e2e::certs::certs_from_pem(&pem).unwrap()[0].to_vec();
    assert_eq!(served_leaf(addr).await, written);
    assert!(gateway.logs().contains("aggregation-gateway.crt"));
}

// ---- rotation -----------------------------------------------------------------------------------

/// A gateway serving `dir/tls.crt` + `dir/tls.key`, re-reading them every second.
async fn serving_from(dir: &Path) -> Gateway {
    let crt = dir.join("tls.crt");
    let key = dir.join("tls.key");
    Gateway::start(GatewayOptions::new("http://127.0.0.1:1").args([
        "--apiservice-source",
        "none",
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-private-key-file",
        key.to_str().unwrap(),
        "--cert-reload-interval",
        "1s",
    ]))
    .await
    .unwrap()
}

fn write_pair(dir: &Path, pair: &CertifiedPair) {
    std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
}

/// Waits until new connections are shown `want`; fails with the gateway's log.
async fn until_served(gateway: &Gateway, want: &[u8], shape: &str) {
    let switched = harness::wait_until(Duration::from_secs(10), || async {
        served_leaf(gateway.addr).await == want
    })
    .await;
    assert!(
        switched,
        "{shape}: the new certificate was never served:\n{}",
        gateway.process.logs()
    );
    let logs = gateway.process.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("serving TLS material reloaded") && l.contains("serial")),
        "{shape}: the reload is logged with the new serial:\n{logs}"
    );
}

/// The directory holding the files is replaced by a new one (renamed away, another put in its
/// place): the watch on the old directory never fires again, the periodic re-read still sees it.
#[tokio::test]
async fn a_replaced_certificate_directory_is_picked_up() {
    let ca = TestCa::new("serving-ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("serving");
    std::fs::create_dir(&dir).unwrap();
    let first = ca.issue_server(&["localhost", "127.0.0.1"]);
    write_pair(&dir, &first);
    let gateway = serving_from(&dir).await;
    assert_eq!(served_leaf(gateway.addr).await, leaf_of(&first));

    let second = ca.issue_server(&["localhost", "127.0.0.1"]);
    let staged = tmp.path().join("serving.new");
    std::fs::create_dir(&staged).unwrap();
    write_pair(&staged, &second);
    std::fs::rename(&dir, tmp.path().join("serving.old")).unwrap();
    std::fs::rename(&staged, &dir).unwrap();
    until_served(&gateway, &leaf_of(&second), "replaced directory").await;
}

/// A Secret volume's layout (`tls.crt -> ..data/tls.crt`, `..data -> ..2024_v1`) with the files
/// rewritten in place inside the linked folder: no event reaches the watched directory.
#[tokio::test]
async fn an_in_place_write_inside_a_linked_folder_is_picked_up() {
    use std::os::unix::fs::symlink;
    let ca = TestCa::new("serving-ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("serving");
    let version = dir.join("..2024_v1");
    std::fs::create_dir_all(&version).unwrap();
    let first = ca.issue_server(&["localhost", "127.0.0.1"]);
    write_pair(&version, &first);
    symlink("..2024_v1", dir.join("..data")).unwrap();
    symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
    symlink("..data/tls.key", dir.join("tls.key")).unwrap();
    let gateway = serving_from(&dir).await;
    assert_eq!(served_leaf(gateway.addr).await, leaf_of(&first));

    let second = ca.issue_server(&["localhost", "127.0.0.1"]);
    write_pair(&version, &second);
    until_served(
        &gateway,
        &leaf_of(&second),
        "in-place write in a linked folder",
    )
    .await;
}

// ---- expiry as metrics --------------------------------------------------------------------------

/// `aggregation_gateway_certificate_expiration_timestamp_seconds{certificate="<which>"}` in
/// `/metrics`, if present.
fn expiry_metric(metrics: &str, which: &str) -> Option<i64> {
    let series = format!(
        "aggregation_gateway_certificate_expiration_timestamp_seconds{{certificate=\"{which}\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as i64)
}

/// Unix seconds, as a certificate's notAfter holds them (no fraction).
fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// The serving certificate and the proxy client certificate's expiry dates are on `/metrics`
/// (what the chart's certificate-expiry alert reads), and follow a rotation of either.
#[tokio::test]
async fn certificate_expiry_is_published_as_metrics_and_follows_rotation() {
    let ca = TestCa::new("serving-ca");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let now = SystemTime::now();
    let day = Duration::from_secs(24 * 3600);
    let serving = |until| ca.issue_server_valid(&["localhost", "127.0.0.1"], now - day, until);
    let proxy_client = |until| {
        ca.issue(&CertSpec {
            common_name: Some("aggregation-gateway".into()),
            usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            validity: Some((now - day, until)),
            ..CertSpec::default()
        })
        .unwrap()
    };
    let write = |pair: &CertifiedPair, stem: &str| {
        std::fs::write(dir.join(format!("{stem}.crt")), &pair.cert_pem).unwrap();
        std::fs::write(dir.join(format!("{stem}.key")), &pair.key_pem).unwrap();
    };
    let (serving_until, proxy_until) = (now + 30 * day, now + 90 * day);
    write(&serving(serving_until), "tls");
    write(&proxy_client(proxy_until), "proxy");
    let arg = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let gateway = Gateway::start(GatewayOptions::new("http://127.0.0.1:1").args([
        "--apiservice-source".to_owned(),
        "none".to_owned(),
        "--tls-cert-file".to_owned(),
        arg("tls.crt"),
        "--tls-private-key-file".to_owned(),
        arg("tls.key"),
        "--proxy-client-cert-file".to_owned(),
        arg("proxy.crt"),
        "--proxy-client-key-file".to_owned(),
        arg("proxy.key"),
        "--cert-reload-interval".to_owned(),
        "1s".to_owned(),
        // No core answers here to authorize the scrape.
        "--authorize-metrics=false".to_owned(),
    ]))
    .await
    .unwrap();
    let client = harness::http1_client(ca.cert_pem(), None).unwrap();
    let metrics = || async {
        let (status, _, body) = harness::get(&client, &format!("{}/metrics", gateway.url()))
            .await
            .unwrap();
        assert_eq!(status, http::StatusCode::OK);
        String::from_utf8_lossy(&body).into_owned()
    };
    let text = metrics().await;
    assert_eq!(
        expiry_metric(&text, "serving"),
        Some(unix_seconds(serving_until)),
        "{text}"
    );
    assert_eq!(
        expiry_metric(&text, "proxy-client"),
        Some(unix_seconds(proxy_until)),
        "{text}"
    );

    let (serving_until, proxy_until) = (now + 60 * day, now + 120 * day);
    write(&serving(serving_until), "tls");
    write(&proxy_client(proxy_until), "proxy");
    let rotated = harness::wait_until(Duration::from_secs(10), || async {
        let text = metrics().await;
        expiry_metric(&text, "serving") == Some(unix_seconds(serving_until))
            && expiry_metric(&text, "proxy-client") == Some(unix_seconds(proxy_until))
    })
    .await;
    assert!(
        rotated,
        "the metrics never showed the rotated certificates:\n{}\n{}",
        metrics().await,
        gateway.process.logs()
    );
}
