//! cert-manager: the serving and proxy-client Certificates are rendered only when enabled, and
//! the Secrets they write are the ones the gateway mounts and its config names.

use e2e::helm::{label, Rendered, CONFIG_DIR, EXAMPLES, FULLNAME, NAMESPACE};

use super::typed::Certificate;
use e2e::table::check_each;

#[test]
fn cert_manager_certificates_are_rendered_only_when_enabled_and_are_the_ones_mounted() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let certs = r.all("Certificate");
            if example != Some("cert-manager") {
                assert!(certs.is_empty(), "{}", label(example));
                return;
            }
            assert_eq!(certs.len(), 2);
            let serving: Certificate = r.get("Certificate", &format!("{FULLNAME}-serving"));
            let dns = serving.spec.dns_names.clone().unwrap();
            for name in [
                FULLNAME.to_owned(),
                format!("{FULLNAME}.{NAMESPACE}"),
                format!("{FULLNAME}.{NAMESPACE}.svc"),
                "api.example.com".to_owned(),
            ] {
                assert!(
                    dns.contains(&name),
                    "serving certificate lacks {name}: {dns:?}"
                );
            }
            assert!(serving.spec.usages.contains(&"server auth".to_owned()));
            assert_eq!(
                (
                    serving.spec.issuer_ref.name.as_str(),
                    serving.spec.issuer_ref.kind.as_str()
                ),
                ("cluster-ca", "ClusterIssuer")
            );
            let proxy: Certificate = r.get("Certificate", &format!("{FULLNAME}-proxy-client"));
            assert!(proxy.spec.usages.contains(&"client auth".to_owned()));
            assert!(!proxy.spec.usages.contains(&"server auth".to_owned()));
            assert_eq!(proxy.spec.common_name.as_deref(), Some("aggregator"));

            // The Secrets cert-manager writes are the ones the gateway mounts and its config names.
            let pod = r.deployment().spec.template.spec.unwrap();
            let secret_of = |volume: &str| {
                pod.volumes
                    .as_ref()
                    .unwrap()
                    .iter()
                    .find(|v| v.name == volume)
                    .and_then(|v| v.secret.clone())
                    .and_then(|s| s.secret_name)
            };
            assert_eq!(secret_of("serving"), Some(serving.spec.secret_name.clone()));
            assert_eq!(
                secret_of("proxy-client"),
                Some(proxy.spec.secret_name.clone())
            );
            let config = r.config();
            assert_eq!(
                config["tlsCertFile"],
                format!("{CONFIG_DIR}/serving/tls.crt")
            );
            assert_eq!(
                config["tlsPrivateKeyFile"],
                format!("{CONFIG_DIR}/serving/tls.key")
            );
            assert_eq!(
                config["proxyClientCertFile"],
                format!("{CONFIG_DIR}/proxy-client/tls.crt")
            );
            assert_eq!(
                config["proxyClientKeyFile"],
                format!("{CONFIG_DIR}/proxy-client/tls.key")
            );
        },
    );
    // Default values: no serving certificate, so the gateway generates one; no proxy identity.
    let config = Rendered::of(None).config();
    assert!(config.get("tlsCertFile").is_none() && config.get("proxyClientCertFile").is_none());
}
