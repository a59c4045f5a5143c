//! What an operator sees when the configuration is wrong: the real binary refuses to start with
//! exit code 64 and one line naming the flag and its YAML key, whether the mistake is a value clap
//! rejects, a file that is not usable PEM, a kubeconfig that leads nowhere, a log filter or a label
//! selector; and a complete, correct configuration passes `--check-config`.

use e2e::table::assert_rows_passed;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use e2e::certs::TestCa;
use e2e::harness;

/// Runs the gateway with `args`. A configuration the gateway wrongly accepts would start a server
/// that never exits, so the run is bounded and the process killed when the bound is hit.
async fn run(args: &[String]) -> Output {
    let binary = tokio::task::spawn_blocking(harness::ensure_gateway_built)
        .await
        .unwrap()
        .expect("gateway binary");
    let child = tokio::process::Command::new(binary)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("AGGREGATION_GATEWAY_CONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(30), child)
        .await
        .unwrap_or_else(|_| panic!("{args:?}: still running after 30s (configuration accepted?)"))
        .unwrap()
}

/// Files a configuration can point at: good ones, and the usual ways they go wrong.
struct Files {
    dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_key: PathBuf,
    not_pem: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("configuration-ca");
        let ca_file = ca.write(dir.path(), "ca.crt").unwrap();
        let (cert, key) = ca
            .issue_server(&["localhost", "127.0.0.1"])
            .write(dir.path(), "serving")
            .unwrap();
        let (_, other_key) = ca
            .issue_server(&["localhost"])
            .write(dir.path(), "other")
            .unwrap();
        let not_pem = dir.path().join("not-pem.txt");
        std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
        Files {
            ca: ca_file,
            cert,
            key,
            other_key,
            not_pem,
            dir,
        }
    }

    /// A CA bundle holding another CA first and then [`Files::ca`]: it overlaps `ca` by one
    /// certificate, not by file.
    fn bundle_sharing_the_ca(&self) -> PathBuf {
        let other = TestCa::new("other-front-proxy-ca");
        let ca = std::fs::read_to_string(&self.ca).unwrap();
        self.write("sharing-bundle.crt", &format!("{}{ca}", other.cert_pem()))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn kubeconfig(&self, name: &str, server: &str, user: &str) -> PathBuf {
        self.write(
            name,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: core\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
                 users:\n- name: gw\n  user:\n{user}contexts:\n- name: core\n  context:\n    cluster: core\n    user: gw\ncurrent-context: core\n",
                self.ca.display()
            ),
        )
    }
}

fn s(path: &Path) -> String {
    path.display().to_string()
}

/// One bad configuration: what it is, the arguments, and what its one line must contain.
struct Refusal {
    case: &'static str,
    args: Vec<String>,
    want: String,
}

fn refusal(case: &'static str, args: &[&str], want: &str) -> Refusal {
    Refusal {
        case,
        args: args.iter().map(|a| a.to_string()).collect(),
        want: want.to_owned(),
    }
}

/// Runs every row and returns the failures, each naming its row, so that one wrong refusal
/// does not hide the others.
async fn failing_rows(
    rows: &[Refusal],
    check: impl AsyncFn(&Refusal) -> Result<(), String>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for row in rows {
        if let Err(why) = check(row).await {
            failures.push(format!("{}: {why}", row.case));
        }
    }
    failures
}

/// The bad configurations, one row each: values clap itself refuses, files that exist but
/// cannot be used, and values only the gateway's own parsers can judge.
fn bad_configurations(f: &Files) -> Vec<Refusal> {
    let bad_kubeconfig = f.kubeconfig("no-server.kubeconfig", "\"\"", "    token: t\n");
    let kubeconfig_wrong_key = f.kubeconfig(
        "wrong-key.kubeconfig",
        "https://127.0.0.1:6443",
        &format!(
            "    client-certificate: {}\n    client-key: {}\n",
            s(&f.cert),
            s(&f.other_key)
        ),
    );
    let yaml_log_level = f.write("log-level.yaml", "logLevel: verbose\n");
    let (cert, key, other_key, not_pem) = (s(&f.cert), s(&f.key), s(&f.other_key), s(&f.not_pem));
    let (ca, sharing_bundle) = (s(&f.ca), s(&f.bundle_sharing_the_ca()));
    let overlap = "--requestheader-allowed-names (requestheaderAllowedNames): required because \
                   --client-ca-file and --requestheader-client-ca-file share a CA certificate";
    vec![
        refusal(
            "one CA for users and front proxies, no allowed names",
            &[
                "--client-ca-file",
                &ca,
                "--requestheader-client-ca-file",
                &ca,
            ],
            overlap,
        ),
        refusal(
            "a request-header bundle holding the client CA among others, no allowed names",
            &[
                "--client-ca-file",
                &ca,
                "--requestheader-client-ca-file",
                &sharing_bundle,
            ],
            overlap,
        ),
        refusal(
            "a port out of range",
            &["--secure-port", "99999"],
            "--secure-port (securePort): 99999 is not in 0..=65535",
        ),
        refusal(
            "a boolean that is neither",
            &["--anonymous-auth=maybe"],
            "--anonymous-auth (anonymousAuth): \"maybe\" is not one of true, false",
        ),
        refusal(
            "a misspelt flag",
            &["--secur-port", "1"],
            "unknown flag \"--secur-port\"; did you mean --secure-port?",
        ),
        refusal(
            "a serving certificate that is not PEM",
            &["--tls-cert-file", &not_pem, "--tls-private-key-file", &key],
            "--tls-cert-file (tlsCertFile):",
        ),
        refusal(
            "a serving key of another certificate",
            &[
                "--tls-cert-file",
                &cert,
                "--tls-private-key-file",
                &other_key,
            ],
            "--tls-private-key-file (tlsPrivateKeyFile):",
        ),
        refusal(
            "a client CA that is a key",
            &["--client-ca-file", &key],
            "--client-ca-file (clientCaFile):",
        ),
        refusal(
            "a request-header CA that is not PEM",
            &["--requestheader-client-ca-file", &not_pem],
            "--requestheader-client-ca-file (requestheaderClientCaFile):",
        ),
        refusal(
            "a proxy client key that is not PEM",
            &[
                "--proxy-client-cert-file",
                &cert,
                "--proxy-client-key-file",
                &not_pem,
            ],
            "--proxy-client-key-file (proxyClientKeyFile):",
        ),
        refusal(
            "a core CA that is not PEM",
            &[
                "--core-url",
                "https://127.0.0.1:6443",
                "--core-ca-file",
                &not_pem,
            ],
            "--core-ca-file (coreCaFile):",
        ),
        refusal(
            "a core client key of another certificate",
            &[
                "--core-url",
                "https://127.0.0.1:6443",
                "--core-client-cert-file",
                &cert,
                "--core-client-key-file",
                &other_key,
            ],
            "--core-client-key-file (coreClientKeyFile):",
        ),
        refusal(
            "a kubeconfig without a server",
            &["--core-kubeconfig", &s(&bad_kubeconfig)],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        refusal(
            "a kubeconfig with a key of another certificate",
            &["--core-kubeconfig", &s(&kubeconfig_wrong_key)],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        refusal(
            "a kubeconfig that is not YAML",
            &["--core-kubeconfig", &not_pem],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        refusal(
            "an unknown log level",
            &["--log-level", "verbose"],
            "--log-level (logLevel):",
        ),
        refusal(
            "a log filter with an empty target",
            &["--log-level", "info,=debug"],
            "--log-level (logLevel):",
        ),
        refusal(
            "an unknown log level in the config file",
            &["--config", &s(&yaml_log_level)],
            "--log-level (logLevel):",
        ),
        refusal(
            "a label selector without parentheses",
            &["--apiservice-label-selector", "owner in edge"],
            "--apiservice-label-selector (apiserviceLabelSelector):",
        ),
    ]
}

/// The same refusal whether the operator checks the configuration or starts the gateway; the
/// cert dir keeps a wrongly started gateway from writing outside the test.
#[tokio::test]
async fn a_bad_configuration_exits_64_with_one_line_naming_the_flag() {
    let f = Files::new();
    let rows = bad_configurations(&f);
    for check in [true, false] {
        let failures = failing_rows(&rows, async |row: &Refusal| {
            let mut argv = row.args.clone();
            argv.extend(["--cert-dir".into(), s(&f.path("generated"))]);
            if check {
                argv.push("--check-config".into());
            }
            let out = run(&argv).await;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let want = &row.want;
            if out.status.code() != Some(64) {
                Err(format!("{argv:?}: exit {:?}: {stderr}", out.status.code()))
            } else if !out.stdout.is_empty() {
                Err(format!("{argv:?}: {out:?}"))
            } else if lines.len() != 1 {
                Err(format!("{argv:?}: not one line:\n{stderr}"))
            } else if !lines[0].starts_with("aggregation-gateway: invalid configuration: ") {
                Err(format!("{argv:?}: {stderr}"))
            } else if !lines[0].contains(want.as_str()) {
                Err(format!("{argv:?}: want {want:?} in:\n{stderr}"))
            } else {
                Ok(())
            }
        })
        .await;
        assert_rows_passed(&format!("with check-config {check}"), rows.len(), &failures);
    }
}

/// The refusal says what is wrong with the file, not only which flag: one row per mistake.
#[tokio::test]
async fn file_refusals_say_what_is_wrong() {
    let f = Files::new();
    let (cert, key, other_key, not_pem) = (s(&f.cert), s(&f.key), s(&f.other_key), s(&f.not_pem));
    let rows = [
        refusal(
            "a CA file that is not PEM",
            &["--client-ca-file", &not_pem],
            &format!("{not_pem} is not PEM"),
        ),
        refusal(
            "a certificate file holding a key",
            &["--tls-cert-file", &key, "--tls-private-key-file", &key],
            "holds no \"BEGIN CERTIFICATE\" block",
        ),
        refusal(
            "a key of another certificate",
            &[
                "--tls-cert-file",
                &cert,
                "--tls-private-key-file",
                &other_key,
            ],
            &format!("the key in {other_key} does not belong to the certificate in {cert}"),
        ),
        refusal(
            "a kubeconfig that is not YAML",
            &["--core-kubeconfig", &not_pem],
            "not a usable kubeconfig (",
        ),
    ];
    let failures = failing_rows(&rows, async |row: &Refusal| {
        let mut argv = row.args.clone();
        argv.push("--check-config".into());
        let out = run(&argv).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = &row.want;
        if out.status.code() != Some(64) {
            Err(format!("{argv:?}: exit {:?}: {stderr}", out.status.code()))
        } else if !stderr.contains(want.as_str()) {
            Err(format!("{argv:?}: want {want:?} in:\n{stderr}"))
        } else {
            Ok(())
        }
    })
    .await;
    assert_rows_passed("refusals", rows.len(), &failures);
}

#[tokio::test]
async fn a_complete_good_configuration_passes_check_config() {
    let f = Files::new();
    let client = TestCa::new("core-client-ca")
        .issue_client("aggregation-gateway", &[])
        .write(f.dir.path(), "core-client")
        .unwrap();
    let kubeconfig = f.kubeconfig(
        "core.kubeconfig",
        "https://127.0.0.1:6443",
        &format!(
            "    client-certificate: {}\n    client-key: {}\n",
            s(&client.0),
            s(&client.1)
        ),
    );
    let config = f.write(
        "config.yaml",
        &format!(
            "securePort: 0\n\
             tlsCertFile: {cert}\n\
             tlsPrivateKeyFile: {key}\n\
             clientCaFile: {ca}\n\
             requestheaderClientCaFile: {ca}\n\
             requestheaderAllowedNames: [front-proxy-client]\n\
             proxyClientCertFile: {cert}\n\
             proxyClientKeyFile: {key}\n\
             coreKubeconfig: {kubeconfig}\n\
             apiserviceLabelSelector: \"gateway.example.com/owner in (edge, core),!legacy\"\n\
             services:\n\
             - namespace: wardle\n  name: api\n  port: 443\n  urls: [\"https://127.0.0.1:8443\"]\n\
             logLevel: info,aggregation_gateway=debug\n",
            cert = s(&f.cert),
            key = s(&f.key),
            ca = s(&f.ca),
            kubeconfig = s(&kubeconfig),
        ),
    );
    let out = run(&["--check-config".into(), "--config".into(), s(&config)]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("# configuration is valid"), "{stdout}");
    assert!(stdout.contains("wardle"), "{stdout}");
}

/// kube-apiserver 1.35's rule asks for allowed names only when the two CA bundles share a
/// certificate: distinct CAs without names still start (any certificate of the front-proxy CA
/// may then set request headers, as before).
#[tokio::test]
async fn distinct_client_and_request_header_cas_need_no_allowed_names() {
    let f = Files::new();
    let front_proxy_ca = TestCa::new("front-proxy-ca")
        .write(f.dir.path(), "front-proxy-ca.crt")
        .unwrap();
    let out = run(&[
        "--check-config".into(),
        "--client-ca-file".into(),
        s(&f.ca),
        "--requestheader-client-ca-file".into(),
        s(&front_proxy_ca),
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn help_and_version_still_exit_0() {
    let out = run(&["--help".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--apiservice-source"), "{help}");
    // The one setting without a flag is still findable from --help.
    assert!(help.contains("`services:`"), "{help}");
    let out = run(&["--version".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("aggregation-gateway "),
        "{out:?}"
    );
}
