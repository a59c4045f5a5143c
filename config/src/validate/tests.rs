//! `Options::validate`'s tests: one refusal per rule, and the example config file.

mod unit {
    use std::path::Path;
    use std::time::Duration;

    use super::super::*;

    fn opts(yaml: &str) -> Options {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn embedded_defaults_validate() {
        let c = Options::default().validate().unwrap();
        assert_eq!(c.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(
            c.core.endpoint,
            Some(CoreEndpoint::Url("http://127.0.0.1:8080".into()))
        );
        assert_eq!(c.limits.request_timeout, Duration::from_secs(60));
        assert!(c.authn.anonymous);
        // kube-apiserver's: --http2-max-streams-per-connection=0 means 100.
        assert_eq!(c.serving.http2_max_streams, 100);
        // Bodies to remote APIServices are the backend's business unless asked.
        assert_eq!(c.limits.apiservice_max_request_body_bytes, 0);
        assert_eq!(c.limits.max_request_body_bytes, 3 * 1024 * 1024);
    }

    /// `--worker-threads`: one thread unless asked, a pool of N, one worker per CPU for 0, and a
    /// refusal that says what to write instead of an absurd count.
    #[test]
    fn worker_threads_pick_the_runtime() {
        use crate::config::RuntimeShape;
        for (yaml, want) in [
            ("{}", RuntimeShape::CurrentThread),
            ("workerThreads: 1", RuntimeShape::CurrentThread),
            ("workerThreads: 0", RuntimeShape::PerCpu),
            ("workerThreads: 4", RuntimeShape::MultiThread(4)),
            ("workerThreads: 1024", RuntimeShape::MultiThread(1024)),
        ] {
            assert_eq!(opts(yaml).validate().unwrap().runtime, want, "{yaml}");
        }
        let err = opts("workerThreads: 100000").validate().unwrap_err();
        assert_eq!(err.flag, "worker-threads");
        assert!(
            err.message
                .contains("more than 1024 threads; use 0 for one per CPU"),
            "{err}"
        );
    }

    /// One row per `--core-url`: the endpoint it means, or a part of the refusal naming the flag.
    #[test]
    fn core_url_forms() {
        for (raw, want) in [
            (
                "unix:///run/x.sock",
                Ok(CoreEndpoint::Unix("/run/x.sock".into())),
            ),
            ("/run/x.sock", Ok(CoreEndpoint::Unix("/run/x.sock".into()))),
            (
                "https://10.0.0.1:6443/",
                Ok(CoreEndpoint::Url("https://10.0.0.1:6443".into())),
            ),
            (
                "ftp://x",
                Err("must start with http://, https:// or unix://"),
            ),
            ("http://", Err("missing host")),
            ("http://h/prefix", Err("must not have a path")),
            ("unix://relative", Err("needs an absolute path")),
            (
                "localhost:8080",
                Err("must start with http://, https:// or unix://"),
            ),
        ] {
            match (parse_core_url(raw), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{raw}"),
                (Err(err), Err(want)) => {
                    assert_eq!(err.flag, "core-url", "{raw}");
                    assert!(err.message.contains(want), "{raw}: {err}");
                }
                (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// One row per refused setting: the whole line printed at start, naming the flag and its YAML
    /// key (or, for the file-only `services`, where it is set).
    #[test]
    fn refusals_are_one_line_naming_flag_and_key() {
        for (case, yaml, flag, want) in [
            (
                "a value outside its choices",
                "apiserviceSource: files\n",
                "apiservice-source",
                "invalid configuration: --apiservice-source (apiserviceSource): \"files\" is not \
                 one of kube, file, none",
            ),
            (
                "a missing file is refused at start",
                "clientCaFile: /nonexistent/ca.crt\n",
                "client-ca-file",
                "invalid configuration: --client-ca-file (clientCaFile): cannot read \
                 /nonexistent/ca.crt: No such file or directory (os error 2)",
            ),
            (
                "the file source needs a directory",
                "apiserviceSource: file\n",
                "apiservice-dir",
                "invalid configuration: --apiservice-dir (apiserviceDir): required when \
                 --apiservice-source=file",
            ),
            (
                "static services must be https",
                "services:\n- namespace: w\n  name: api\n  urls: [http://127.0.0.1:1]\n",
                "services",
                "invalid configuration: services (file only): w/api: \"http://127.0.0.1:1\" must \
                 be an https:// URL (aggregated servers serve TLS)",
            ),
            (
                "a bad label selector is refused at validation",
                "apiserviceLabelSelector: \"owner in edge\"\n",
                "apiservice-label-selector",
                "invalid configuration: --apiservice-label-selector (apiserviceLabelSelector): \
                 \"owner in edge\": owner in needs a parenthesized list: owner in (a,b); \
                 selectors look like env=prod,tier in (a,b),!legacy",
            ),
            (
                "a timeout of zero",
                "requestTimeout: 0s\n",
                "request-timeout",
                "invalid configuration: --request-timeout (requestTimeout): must be greater than 0s",
            ),
            (
                "priority and fairness with no seats to share out",
                "maxRequestsInflight: 0\nmaxMutatingRequestsInflight: 0\n",
                "max-requests-inflight",
                "invalid configuration: --max-requests-inflight (maxRequestsInflight): with \
                 --enable-priority-and-fairness, --max-requests-inflight and \
                 --max-mutating-requests-inflight must add up to more than 0",
            ),
            (
                "headers too small for a Kubernetes request",
                "maxHeaderBytes: 100\n",
                "max-header-bytes",
                "invalid configuration: --max-header-bytes (maxHeaderBytes): must be at least 8192",
            ),
            (
                "allowed names without the CA that signs them",
                "requestheaderAllowedNames: [front-proxy]\n",
                "requestheader-allowed-names",
                "invalid configuration: --requestheader-allowed-names \
                 (requestheaderAllowedNames): needs --requestheader-client-ca-file: names are \
                 only checked on certificates that CA signed",
            ),
        ] {
            let err = opts(yaml).validate().unwrap_err();
            assert_eq!(err.flag, flag, "{case}");
            assert_eq!(err.to_string(), want, "{case}");
        }
    }

    /// Without priority and fairness, 0 still means unlimited, as kube's old filter read it.
    #[test]
    fn unlimited_in_flight_is_allowed_without_priority_and_fairness() {
        let limits = opts(
            "enablePriorityAndFairness: false\nmaxRequestsInflight: 0\nmaxMutatingRequestsInflight: 0\n",
        )
        .validate()
        .unwrap()
        .limits;
        assert!(!limits.priority_and_fairness);
        assert_eq!(
            (
                limits.max_requests_inflight,
                limits.max_mutating_requests_inflight
            ),
            (0, 0)
        );
        assert!(
            Options::default()
                .validate()
                .unwrap()
                .limits
                .priority_and_fairness
        );
    }

    #[test]
    fn a_label_selector_reaches_the_kube_source() {
        let c = opts("apiserviceLabelSelector: \"owner in (edge),!legacy\"\n")
            .validate()
            .unwrap();
        assert_eq!(
            c.apiservices.source,
            ApiServiceSource::Kube {
                label_selector: Some("owner in (edge),!legacy".into())
            }
        );
    }

    #[test]
    fn half_a_key_pair_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "x").unwrap();
        let err = Options {
            tls_cert_file: Some(cert),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.flag, "tls-private-key-file");
    }

    /// A CA and a leaf it signed, as PEM: (ca, leaf cert, leaf key).
    fn pki() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (ca_cert.pem(), leaf.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Every file flag, each given the files that make it valid, so a case can spoil one.
    fn all_files(dir: &Path, ca: &str, cert: &str, key: &str) -> Vec<(&'static str, String)> {
        let ca = write(dir, "ca.crt", ca);
        let cert = write(dir, "tls.crt", cert);
        let key = write(dir, "tls.key", key);
        vec![
            ("tlsCertFile", cert.clone()),
            ("tlsPrivateKeyFile", key.clone()),
            ("clientCaFile", ca.clone()),
            ("requestheaderClientCaFile", ca.clone()),
            ("proxyClientCertFile", cert.clone()),
            ("proxyClientKeyFile", key.clone()),
            ("coreUrl", "https://127.0.0.1:6443".to_owned()),
            ("coreCaFile", ca),
            ("coreClientCertFile", cert),
            ("coreClientKeyFile", key),
        ]
    }

    /// The YAML of `pairs`, with front-proxy names: [`all_files`] trusts one CA for users and
    /// front proxies, which needs them (see `overlapping_user_and_front_proxy_cas_need_allowed_names`).
    fn yaml(pairs: &[(&str, String)]) -> String {
        let mut text: String = pairs.iter().map(|(k, v)| format!("{k}: {v:?}\n")).collect();
        text.push_str("requestheaderAllowedNames: [front-proxy]\n");
        text
    }

    #[test]
    fn overlapping_user_and_front_proxy_cas_need_allowed_names() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _, _) = pki();
        let (other_ca, _, _) = pki();
        let ca_file = write(dir.path(), "ca.crt", &ca);
        let other_file = write(dir.path(), "other.crt", &other_ca);
        let bundle = write(dir.path(), "bundle.crt", &format!("{other_ca}{ca}"));
        let config = |proxy_ca: &str, names: &str| {
            opts(&format!(
                "clientCaFile: {ca_file:?}\nrequestheaderClientCaFile: {proxy_ca:?}\n{names}"
            ))
            .validate()
        };
        for (case, proxy_ca) in [
            ("the same file", &ca_file),
            ("a bundle holding it", &bundle),
        ] {
            let err = config(proxy_ca, "").unwrap_err();
            assert_eq!(err.flag, "requestheader-allowed-names", "{case}: {err}");
            assert!(
                err.message.starts_with(
                    "required because --client-ca-file and --requestheader-client-ca-file share \
                     a CA certificate"
                ),
                "{case}: {err}"
            );
            assert!(err.message.contains(proxy_ca.as_str()), "{case}: {err}");
            assert!(
                config(proxy_ca, "requestheaderAllowedNames: [front-proxy]\n").is_ok(),
                "{case}: with names"
            );
        }
        assert!(
            config(&other_file, "").is_ok(),
            "distinct CAs need no names"
        );
    }

    #[test]
    fn usable_pem_files_validate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let c = opts(&yaml(&all_files(dir.path(), &ca, &cert, &key)))
            .validate()
            .unwrap();
        assert!(c.serving.cert.is_some() && c.proxy_client.is_some());
        assert!(c.core.client_cert.is_some() && c.core.ca_file.is_some());
    }

    #[test]
    fn unusable_pem_files_are_refused_naming_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let good = all_files(dir.path(), &ca, &cert, &key);
        let not_pem = write(dir.path(), "not-pem", "hello\n");
        let der = write(dir.path(), "der", "0\u{1}\u{2}binary");
        let truncated = write(
            dir.path(),
            "truncated",
            &cert[..cert.find("-----END").unwrap()],
        );
        for (i, (key_name, _)) in good.iter().enumerate() {
            if *key_name == "coreUrl" {
                continue;
            }
            let is_key = key_name.ends_with("KeyFile");
            // A key where a certificate belongs (and the other way round) is the common mix-up.
            let swapped = if is_key { &good[0].1 } else { &good[1].1 };
            for (bad, want) in [
                (&not_pem, "is not PEM"),
                (&der, "is not PEM"),
                (
                    swapped,
                    if is_key {
                        "no unencrypted private key"
                    } else {
                        "no \"BEGIN CERTIFICATE\""
                    },
                ),
                (
                    &truncated,
                    "is truncated: a \"BEGIN CERTIFICATE\" block has no \"END CERTIFICATE\" line",
                ),
            ] {
                let mut pairs = good.clone();
                pairs[i].1 = bad.clone();
                let err = opts(&yaml(&pairs)).validate().unwrap_err();
                assert_eq!(err.key, *key_name, "{bad}: {err}");
                assert!(err.message.contains(bad.as_str()), "{err}");
                assert!(err.message.contains(want), "{key_name} {bad}: {err}");
            }
        }
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki();
        let (_, _, other_key) = pki();
        let other = write(dir.path(), "other.key", &other_key);
        for (cert_key, key_key) in [
            ("tlsCertFile", "tlsPrivateKeyFile"),
            ("proxyClientCertFile", "proxyClientKeyFile"),
            ("coreClientCertFile", "coreClientKeyFile"),
        ] {
            let mut pairs = all_files(dir.path(), &ca, &cert, &key);
            pairs.iter_mut().find(|(k, _)| *k == key_key).unwrap().1 = other.clone();
            let err = opts(&yaml(&pairs)).validate().unwrap_err();
            assert_eq!(err.key, key_key, "{err}");
            assert!(err.message.contains("does not belong"), "{err}");
            assert!(err.message.contains(&cert_key_flag(cert_key)), "{err}");
        }
    }

    fn cert_key_flag(key: &str) -> String {
        let mut flag = String::new();
        for c in key.chars() {
            if c.is_ascii_uppercase() {
                flag.push('-');
            }
            flag.push(c.to_ascii_lowercase());
        }
        format!("--{flag}")
    }

    #[test]
    fn log_level_takes_levels_and_filters_but_not_stray_words() {
        for ok in [
            "info",
            "DEBUG",
            "warn",
            "3",
            "info,aggregation_gateway=debug",
            "hyper=off,info,",
            "aggregation_gateway=",
            "[request]=trace",
        ] {
            opts(&format!("logLevel: {ok:?}\n")).validate().unwrap();
        }
        for bad in ["verbose", "warning", "debgu", "info,hyper=loud", " ", "6"] {
            let err = opts(&format!("logLevel: {bad:?}\n"))
                .validate()
                .unwrap_err();
            assert_eq!(err.flag, "log-level", "{bad:?}");
            assert!(
                err.message.contains("error, warn, info, debug, trace, off"),
                "{err}"
            );
        }
    }
}

mod example {
    /// The example in the repository is what the README starts the gateway with; it must stay valid
    /// and must spell out the embedded defaults.
    #[test]
    fn example_config_is_valid_and_matches_defaults() {
        let text = include_str!("../../example.yaml");
        let options: crate::Options = serde_saphyr::from_str(text).unwrap();
        let from_file = options.validate().unwrap();
        let defaults = crate::Options::default().validate().unwrap();
        assert_eq!(
            format!("{:?}", from_file.limits),
            format!("{:?}", defaults.limits)
        );
        assert_eq!(from_file.listen, defaults.listen);
        assert_eq!(from_file.runtime, defaults.runtime);
        assert_eq!(from_file.core.endpoint, defaults.core.endpoint);
        assert_eq!(from_file.apiservices.source, defaults.apiservices.source);
        assert_eq!(from_file.shutdown_timeout, defaults.shutdown_timeout);
        assert_eq!(from_file.leader_election, defaults.leader_election);
        assert_eq!(
            from_file.apiservices.readyz_reachable,
            defaults.apiservices.readyz_reachable
        );
    }
}
