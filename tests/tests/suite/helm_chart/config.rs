//! The rendered config against the gateway itself: the `config.yaml` of the ConfigMap is accepted
//! by the gateway's own `Options` parser and validation, and by the real binary's
//! `--check-config`, with the files it names laid out as the Pod would mount them.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::harness::ensure_gateway_built;
use e2e::helm::{label, Rendered, CONFIG_DIR, EXAMPLES, FULLNAME, NAMESPACE, SA_DIR};

use e2e::table::check_each;

/// A stand-in for the Pod's filesystem: the files the config names, with real PEM contents, under a
/// temporary root; the config's absolute paths are rewritten to point there.
pub(super) struct FakePodFs {
    root: tempfile::TempDir,
}

impl FakePodFs {
    pub(super) fn new(rendered: &Rendered) -> Self {
        let root = tempfile::tempdir().unwrap();
        let (ca_pem, cert_pem, key_pem) = test_pki();
        let etc = root.path().join("etc");
        for dir in ["serving", "proxy-client", "core-client"] {
            std::fs::create_dir_all(etc.join(dir)).unwrap();
            std::fs::write(etc.join(dir).join("tls.crt"), &cert_pem).unwrap();
            std::fs::write(etc.join(dir).join("tls.key"), &key_pem).unwrap();
            std::fs::write(etc.join(dir).join("ca.crt"), &ca_pem).unwrap();
        }
        for dir in ["client-ca", "requestheader-ca", "core-ca"] {
            std::fs::create_dir_all(etc.join(dir)).unwrap();
            std::fs::write(etc.join(dir).join("ca.crt"), &ca_pem).unwrap();
        }
        std::fs::create_dir_all(etc.join("core-token")).unwrap();
        std::fs::write(etc.join("core-token/token"), "gateway-token\n").unwrap();
        let sa = root.path().join("sa");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), "service-account-token\n").unwrap();
        std::fs::write(sa.join("ca.crt"), &ca_pem).unwrap();
        // The file source's directory holds what the APIService ConfigMap renders.
        let apiservices = etc.join("apiservices");
        std::fs::create_dir_all(&apiservices).unwrap();
        // The structured authentication file, from the ConfigMap the chart renders for it.
        let authentication = etc.join("authentication");
        std::fs::create_dir_all(&authentication).unwrap();
        for cm in rendered.all("ConfigMap") {
            let dir = match cm["metadata"]["name"].as_str() {
                Some(n) if n == format!("{FULLNAME}-apiservices") => &apiservices,
                Some(n) if n == format!("{FULLNAME}-authentication") => &authentication,
                _ => continue,
            };
            for (key, text) in cm["data"].as_object().unwrap() {
                std::fs::write(dir.join(key), text.as_str().unwrap()).unwrap();
            }
        }
        Self { root }
    }

    pub(super) fn rewrite(&self, config: &str) -> String {
        let etc = self.root.path().join("etc");
        let sa = self.root.path().join("sa");
        let tmp = self.root.path().join("tmp");
        config
            .replace(CONFIG_DIR, etc.to_str().unwrap())
            .replace(SA_DIR, sa.to_str().unwrap())
            .replace("/tmp/aggregation-gateway", tmp.to_str().unwrap())
    }

    pub(super) fn write_config(&self, config: &str) -> PathBuf {
        let path = self.root.path().join("config.yaml");
        std::fs::write(&path, self.rewrite(config)).unwrap();
        path
    }
}

/// A CA and a leaf certificate it signed (server and client use), as PEM.
fn test_pki() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "helm-chart-test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![
        format!("{FULLNAME}.{NAMESPACE}.svc"),
        "localhost".to_owned(),
    ])
    .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "front-proxy-client");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[test]
fn rendered_config_is_accepted_by_the_gateway_options_parser_and_validation() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let ctx = label(example);
            let text = r.config_text();
            // As rendered: every key is one `Options` knows (it denies unknown fields).
            let options: gateway_config::Options =
                serde_saphyr::from_str(&text).unwrap_or_else(|e| {
                    panic!("{ctx}: config.yaml is refused by Options: {e}\n{text}")
                });
            // The chart never leaves a modeled setting to a default that differs from what it says.
            assert_eq!(options.secure_port, Some(8443), "{ctx}");
            // With the Pod's files in place, validation accepts it.
            let fs = FakePodFs::new(&r);
            let options: gateway_config::Options =
                serde_saphyr::from_str(&fs.rewrite(&text)).unwrap();
            let config = options
                .validate()
                .unwrap_or_else(|e| panic!("{ctx}: {e}\n{text}"));
            assert_eq!(config.listen.port(), 8443, "{ctx}");
            let want_source = match example {
                Some("file-apiservices") => "File",
                _ => "Kube",
            };
            assert!(
                format!("{:?}", config.apiservices.source).starts_with(want_source),
                "{ctx}: {:?}",
                config.apiservices.source
            );
        },
    );
}

/// The chart's default values configure the gateway with the gateway's own defaults, so a
/// default is written once (in the config crate's validation) and the chart is checked against
/// it. The chart's deliberate choices for a Pod are named here: it listens on every address,
/// waits 10 s after SIGTERM for the endpoints to drop it, and reaches the cluster's API server.
#[test]
fn its_defaults_are_the_gateways() {
    let r = Rendered::of(None);
    let fs = FakePodFs::new(&r);
    let text = fs.rewrite(&r.config_text());
    let options: gateway_config::Options = serde_saphyr::from_str(&text).unwrap();
    let chart = options.validate().unwrap_or_else(|e| panic!("{e}\n{text}"));
    let gateway = gateway_config::Options::default().validate().unwrap();
    let settings = |c: &gateway_config::Config| {
        vec![
            ("limits", format!("{:?}", c.limits)),
            (
                "authentication caches",
                format!(
                    "anonymous {} webhook {} ttl {:?}/{:?}",
                    c.authn.anonymous,
                    c.authn.token_webhook,
                    c.authn.token_cache_ttl,
                    c.authn.token_cache_unauthorized_ttl
                ),
            ),
            (
                "authorization",
                format!(
                    "webhook {} ttl {:?}/{:?} metrics {} constrained {}",
                    c.authz.webhook,
                    c.authz.cache_authorized_ttl,
                    c.authz.cache_unauthorized_ttl,
                    c.authz.authorize_metrics,
                    c.authz.constrained_impersonation
                ),
            ),
            (
                "apiservices",
                format!(
                    "routing {} redirects {} every {:?} discovery {:?} readyz {}",
                    c.apiservices.endpoint_routing,
                    c.apiservices.aggregator_reject_forwarding_redirect,
                    c.apiservices.availability_interval,
                    c.apiservices.discovery_refresh_interval,
                    c.apiservices.readyz_reachable
                ),
            ),
            ("shutdown timeout", format!("{:?}", c.shutdown_timeout)),
            ("listen port", c.listen.port().to_string()),
        ]
    };
    for ((what, from_chart), (_, default)) in settings(&chart).into_iter().zip(settings(&gateway)) {
        assert_eq!(
            from_chart, default,
            "{what}: the chart's default values differ from the gateway's defaults\n{text}"
        );
    }
    assert_eq!(
        chart.shutdown_delay_duration,
        std::time::Duration::from_secs(10)
    );
}

/// The gateway binary, built once per test process by the harness (as every e2e test builds it).
fn gateway_binary() -> PathBuf {
    ensure_gateway_built().unwrap_or_else(|e| panic!("{e}"))
}

pub(super) fn check_config(config: &Path) -> std::process::Output {
    Command::new(gateway_binary())
        .arg("--check-config")
        .arg("--config")
        .arg(config)
        .env_remove("AGGREGATION_GATEWAY_CONFIG")
        .output()
        .expect("run aggregation-gateway --check-config")
}

#[test]
fn rendered_config_passes_the_gateway_binarys_check_config() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let fs = FakePodFs::new(&r);
            let path = fs.write_config(&r.config_text());
            let out = check_config(&path);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}: aggregation-gateway --check-config refused the rendered config:\n{}{}\n{}",
                label(example),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                fs.rewrite(&r.config_text())
            );
        },
    );

    // And the check is real: a config the gateway cannot run with exits 64 with one line naming it.
    let r = Rendered::of(None);
    let fs = FakePodFs::new(&r);
    let path = fs.write_config(&format!("{}securPort: 1\n", r.config_text()));
    let out = check_config(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a misspelled key must be refused: {stderr}"
    );
    assert!(stderr.contains("securPort"), "{stderr}");
}

/// The per-replica reachability readiness check is off unless asked for, and the election is
/// told to the gateway only with the kube source (the one that writes status).
#[test]
fn readiness_and_leader_election_settings_reach_the_gateway() {
    let config = Rendered::of(None).config();
    assert_eq!(config["readyzAggregatedApiserviceReachable"], false);
    assert_eq!(config["leaderElect"], true);
    let config = Rendered::with(
        None,
        &[
            "probes.readiness.aggregatedApiserviceReachable=true",
            "leaderElection.leaseDuration=30s",
            "leaderElection.renewDeadline=20s",
            "leaderElection.retryPeriod=4s",
        ],
    )
    .config();
    assert_eq!(config["readyzAggregatedApiserviceReachable"], true);
    assert_eq!(
        (
            config["leaderElectLeaseDuration"].as_str(),
            config["leaderElectRenewDeadline"].as_str(),
            config["leaderElectRetryPeriod"].as_str()
        ),
        (Some("30s"), Some("20s"), Some("4s"))
    );
    let config = Rendered::of(Some("file-apiservices")).config();
    assert!(config.get("leaderElect").is_none(), "{config}");
}
