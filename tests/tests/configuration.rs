//! What an operator sees when the configuration is wrong: the real binary refuses to start with
//! exit code 64 and one line naming the flag and its YAML key, whether the mistake is a value clap
//! rejects, a file that is not usable PEM, a kubeconfig that leads nowhere, a log filter or a label
//! selector; and a complete, correct configuration passes `--check-config`.

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

#[tokio::test]
async fn a_bad_configuration_exits_64_with_one_line_naming_the_flag() {
    let f = Files::new();
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
    let cases: Vec<(Vec<String>, &str)> = vec![
        // Values clap itself refuses.
        (
            vec!["--secure-port".into(), "99999".into()],
            "--secure-port (securePort): 99999 is not in 0..=65535",
        ),
        (
            vec!["--anonymous-auth=maybe".into()],
            "--anonymous-auth (anonymousAuth): \"maybe\" is not one of true, false",
        ),
        (
            vec!["--secur-port".into(), "1".into()],
            "unknown flag \"--secur-port\"; did you mean --secure-port?",
        ),
        // Files that exist but cannot be used.
        (
            vec![
                "--tls-cert-file".into(),
                s(&f.not_pem),
                "--tls-private-key-file".into(),
                s(&f.key),
            ],
            "--tls-cert-file (tlsCertFile):",
        ),
        (
            vec![
                "--tls-cert-file".into(),
                s(&f.cert),
                "--tls-private-key-file".into(),
                s(&f.other_key),
            ],
            "--tls-private-key-file (tlsPrivateKeyFile):",
        ),
        (
            vec!["--client-ca-file".into(), s(&f.key)],
            "--client-ca-file (clientCaFile):",
        ),
        (
            vec!["--requestheader-client-ca-file".into(), s(&f.not_pem)],
            "--requestheader-client-ca-file (requestheaderClientCaFile):",
        ),
        (
            vec![
                "--proxy-client-cert-file".into(),
                s(&f.cert),
                "--proxy-client-key-file".into(),
                s(&f.not_pem),
            ],
            "--proxy-client-key-file (proxyClientKeyFile):",
        ),
        (
            vec![
                "--core-url".into(),
                "https://127.0.0.1:6443".into(),
                "--core-ca-file".into(),
                s(&f.not_pem),
            ],
            "--core-ca-file (coreCaFile):",
        ),
        (
            vec![
                "--core-url".into(),
                "https://127.0.0.1:6443".into(),
                "--core-client-cert-file".into(),
                s(&f.cert),
                "--core-client-key-file".into(),
                s(&f.other_key),
            ],
            "--core-client-key-file (coreClientKeyFile):",
        ),
        (
            vec!["--core-kubeconfig".into(), s(&bad_kubeconfig)],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        (
            vec!["--core-kubeconfig".into(), s(&kubeconfig_wrong_key)],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        (
            vec!["--core-kubeconfig".into(), s(&f.not_pem)],
            "--core-kubeconfig (coreKubeconfig):",
        ),
        // Values only the gateway's own parsers can judge.
        (
            vec!["--log-level".into(), "verbose".into()],
            "--log-level (logLevel):",
        ),
        (
            vec!["--log-level".into(), "info,=debug".into()],
            "--log-level (logLevel):",
        ),
        (
            vec!["--config".into(), s(&yaml_log_level)],
            "--log-level (logLevel):",
        ),
        (
            vec!["--apiservice-label-selector".into(), "owner in edge".into()],
            "--apiservice-label-selector (apiserviceLabelSelector):",
        ),
    ];
    for (args, want) in cases {
        // The same refusal whether the operator checks the configuration or starts the gateway;
        // the cert dir keeps a wrongly started gateway from writing outside the test.
        for check in [true, false] {
            let mut argv = args.clone();
            argv.extend(["--cert-dir".into(), s(&f.path("generated"))]);
            if check {
                argv.push("--check-config".into());
            }
            let out = run(&argv).await;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{argv:?}: {stderr}");
            assert!(out.stdout.is_empty(), "{argv:?}: {out:?}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{argv:?}: not one line:\n{stderr}");
            assert!(
                lines[0].starts_with("aggregation-gateway: invalid configuration: "),
                "{argv:?}: {stderr}"
            );
            assert!(
                lines[0].contains(want),
                "{argv:?}: want {want:?} in:\n{stderr}"
            );
        }
    }
}

/// The refusal says what is wrong with the file, not only which flag.
#[tokio::test]
async fn file_refusals_say_what_is_wrong() {
    let f = Files::new();
    for (args, want) in [
        (
            vec!["--client-ca-file".into(), s(&f.not_pem)],
            format!("{} is not PEM", s(&f.not_pem)),
        ),
        (
            vec![
                "--tls-cert-file".into(),
                s(&f.key),
                "--tls-private-key-file".into(),
                s(&f.key),
            ],
            "holds no \"BEGIN CERTIFICATE\" block".to_owned(),
        ),
        (
            vec![
                "--tls-cert-file".into(),
                s(&f.cert),
                "--tls-private-key-file".into(),
                s(&f.other_key),
            ],
            format!(
                "the key in {} does not belong to the certificate in {}",
                s(&f.other_key),
                s(&f.cert)
            ),
        ),
        (
            vec!["--core-kubeconfig".into(), s(&f.not_pem)],
            "not a usable kubeconfig (".to_owned(),
        ),
    ] {
        let mut argv: Vec<String> = args;
        argv.push("--check-config".into());
        let out = run(&argv).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{argv:?}: {stderr}");
        assert!(
            stderr.contains(&want),
            "{argv:?}: want {want:?} in:\n{stderr}"
        );
    }
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
