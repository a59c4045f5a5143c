//! The gateway's Pod: the container (image, args, ports, probes, security context), the mounts
//! every configured file comes through, the core sidecar, shutdown timing, the rollout checksum,
//! and the scheduling values and disruption budget.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{json, Value};

use e2e::helm::{
    example_file, helm_template, label, Rendered, CONFIG_DIR, EXAMPLES, FULLNAME, RELEASE, SA_DIR,
};

use e2e::table::check_each;

#[test]
fn gateway_container_serves_https_with_health_probes_and_a_locked_down_context() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let c = r.gateway_container();
            let ctx = label(example);
            let config = r.config();
            let port = config["securePort"].as_i64().unwrap() as i32;

            let image = c.image.as_deref().unwrap();
            assert!(
                image.starts_with("ghcr.io/aggregation-gateway/aggregation-gateway:"),
                "{ctx}: {image}"
            );
            assert_eq!(
                c.args.as_deref(),
                Some(&[format!("--config={CONFIG_DIR}/config.yaml")][..]),
                "{ctx}"
            );
            assert_eq!(
                config["bindAddress"], "0.0.0.0",
                "{ctx}: the gateway must listen beyond loopback in a Pod"
            );

            let ports = c.ports.as_deref().unwrap();
            assert_eq!(ports.len(), 1, "{ctx}");
            assert_eq!(
                (ports[0].name.as_deref(), ports[0].container_port),
                (Some("https"), port),
                "{ctx}"
            );

            for (probe, path) in [
                (&c.startup_probe, "/livez"),
                (&c.liveness_probe, "/livez"),
                (&c.readiness_probe, "/readyz"),
            ] {
                let get = probe
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .unwrap_or_else(|| panic!("{ctx}: {path} probe"));
                assert_eq!(get.path.as_deref(), Some(path), "{ctx}");
                assert_eq!(
                    get.scheme.as_deref(),
                    Some("HTTPS"),
                    "{ctx}: {path} probe scheme"
                );
                assert_eq!(serde_json::to_value(&get.port).unwrap(), "https", "{ctx}");
            }

            // No preStop hook: the gateway keeps serving for shutdownDelayDuration after SIGTERM by
            // itself, so a preStop sleep would only postpone SIGTERM and stack on top of that delay.
            assert!(
                c.lifecycle
                    .as_ref()
                    .and_then(|l| l.pre_stop.as_ref())
                    .is_none(),
                "{ctx}: preStop on the gateway"
            );
            assert_ne!(
                config["shutdownDelayDuration"], "0s",
                "{ctx}: without a preStop the gateway's own delay must be on"
            );

            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{ctx}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{ctx}");
            assert_eq!(sc.run_as_non_root, Some(true), "{ctx}");
            assert_eq!(sc.privileged, Some(false), "{ctx}");
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_owned()][..]),
                "{ctx}"
            );
            assert_eq!(
                sc.seccomp_profile.as_ref().unwrap().type_,
                "RuntimeDefault",
                "{ctx}"
            );
            let pod = r.deployment().spec.template.spec.unwrap();
            let psc = pod.security_context.unwrap();
            assert_eq!(
                (psc.run_as_non_root, psc.run_as_user, psc.run_as_group),
                (Some(true), Some(65532), Some(65532)),
                "{ctx}"
            );
            assert_eq!(
                psc.seccomp_profile.unwrap().type_,
                "RuntimeDefault",
                "{ctx}"
            );

            // A read-only root filesystem with a writable /tmp; a self-signed serving certificate
            // stays in memory (no certDir), so no key is ever written to a shared directory.
            let mounts = c.volume_mounts.clone().unwrap();
            assert!(
                mounts
                    .iter()
                    .any(|m| m.mount_path == "/tmp" && m.read_only != Some(true)),
                "{ctx}"
            );
            assert!(config.get("certDir").is_none(), "{ctx}: {config}");

            // The Service exposes that port by name.
            let svc: Service = r.get("Service", FULLNAME);
            let sp = &svc.spec.unwrap().ports.unwrap()[0];
            assert_eq!(
                serde_json::to_value(sp.target_port.as_ref().unwrap()).unwrap(),
                "https",
                "{ctx}"
            );
        },
    );
}

/// Every file the config names is inside a mount of the gateway container, from the volume that
/// should hold it: `<dir>/<name>/<key>` comes from a Secret (or ConfigMap) mounted whole at
/// `<dir>/<name>` (so the kubelet's atomic updates reach the gateway), never through subPath.
#[test]
fn every_path_in_the_config_is_mounted_as_a_directory() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let ctx = label(example);
            let c = r.gateway_container();
            let pod = r.deployment().spec.template.spec.unwrap();
            let volumes: BTreeMap<String, Value> = pod
                .volumes
                .unwrap()
                .into_iter()
                .map(|v| (v.name.clone(), serde_json::to_value(v).unwrap()))
                .collect();
            let mounts = c.volume_mounts.unwrap();
            let config = r.config();
            let config_mount = mounts
                .iter()
                .find(|m| m.mount_path == format!("{CONFIG_DIR}/config.yaml"))
                .unwrap();
            assert_eq!(
                config_mount.sub_path.as_deref(),
                Some("config.yaml"),
                "{ctx}"
            );
            assert_eq!(
                volumes[&config_mount.name]["configMap"]["name"], FULLNAME,
                "{ctx}"
            );

            for (key, value) in config.as_object().unwrap() {
                let Some(path) = value
                    .as_str()
                    .filter(|p| p.starts_with(CONFIG_DIR) || p.starts_with(SA_DIR))
                else {
                    continue;
                };
                if path.starts_with(SA_DIR) {
                    assert_eq!(
                        pod.automount_service_account_token,
                        Some(true),
                        "{ctx}: {key} needs the token mounted"
                    );
                    continue;
                }
                let rel = &path[CONFIG_DIR.len() + 1..];
                let (dir, file) = rel.split_once('/').map_or((rel, ""), |(d, f)| (d, f));
                let mount = mounts
                    .iter()
                    .find(|m| m.mount_path == format!("{CONFIG_DIR}/{dir}"))
                    .unwrap_or_else(|| panic!("{ctx}: {key}={path} is not mounted"));
                assert_eq!(mount.read_only, Some(true), "{ctx}: {key}");
                assert!(
                    mount.sub_path.is_none(),
                    "{ctx}: {key} mounted with subPath would never see updates"
                );
                let volume = &volumes[&mount.name];
                match (key.as_str(), file) {
                    ("apiserviceDir", "") => {
                        assert_eq!(
                            volume["configMap"]["name"],
                            format!("{FULLNAME}-apiservices"),
                            "{ctx}"
                        )
                    }
                    ("authenticationConfig", "authentication-config.yaml") => {
                        assert!(
                            volume["configMap"]["name"].is_string(),
                            "{ctx}: {key} from {volume}"
                        )
                    }
                    (_, "tls.crt" | "tls.key" | "ca.crt" | "token") => {
                        assert!(
                            volume["secret"]["secretName"].is_string(),
                            "{ctx}: {key} from {volume}"
                        )
                    }
                    _ => panic!("{ctx}: {key}={path}: unexpected file name"),
                }
            }
            // And nothing is mounted that the config does not use.
            for m in &mounts {
                let used = m.mount_path == "/tmp"
                    || m.mount_path.ends_with("/config.yaml")
                    || config
                        .as_object()
                        .unwrap()
                        .values()
                        .any(|v| v.as_str().is_some_and(|p| p.starts_with(&m.mount_path)));
                assert!(used, "{ctx}: {} is mounted but unused", m.mount_path);
            }
        },
    );
}

#[test]
fn the_core_sidecar_is_in_the_pod_only_in_the_sidecar_example() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            let pod = r.deployment().spec.template.spec.unwrap();
            let names: Vec<String> = pod.containers.iter().map(|c| c.name.clone()).collect();
            assert_eq!(names, ["gateway"], "{}", label(example));
            let init = pod.init_containers.unwrap_or_default();
            let core_url = r.config()["coreUrl"].as_str().unwrap().to_owned();
            if example == Some("sidecar-core") {
                assert_eq!(init.len(), 1);
                let core = &init[0];
                assert_eq!(core.name, "core");
                // A native sidecar: started before the gateway, stopped after it has drained.
                assert_eq!(core.restart_policy.as_deref(), Some("Always"));
                assert_eq!(
                    core.image.as_deref(),
                    Some("registry.example.com/my-api-server:1.4.2")
                );
                let port = core.ports.as_ref().unwrap()[0].container_port;
                assert_eq!(core_url, format!("http://127.0.0.1:{port}"));
                // The example's core listens on 127.0.0.1: the kubelet, which probes the Pod IP,
                // could never reach it (issue 24: the Pod stayed `Init:0/1`, the core restarted
                // every 120 s), so it has no network probe at all.
                for probe in [
                    &core.startup_probe,
                    &core.liveness_probe,
                    &core.readiness_probe,
                ]
                .into_iter()
                .flatten()
                {
                    assert!(
                        probe.http_get.is_none()
                            && probe.tcp_socket.is_none()
                            && probe.grpc.is_none(),
                        "a network probe on a loopback core: {probe:?}"
                    );
                }
                assert_eq!(core.args.as_ref().unwrap().len(), 3);
            } else {
                assert!(init.is_empty(), "{}", label(example));
                assert!(
                    !core_url.contains("127.0.0.1"),
                    "{}: {core_url}",
                    label(example)
                );
            }
        },
    );

    // As an ordinary container the core is kept alive through the gateway's drain by a preStop sleep.
    let r = Rendered::with(Some("sidecar-core"), &["core.sidecar.native=false"]);
    let pod = r.deployment().spec.template.spec.unwrap();
    assert!(pod.init_containers.unwrap_or_default().is_empty());
    let core = pod
        .containers
        .iter()
        .find(|c| c.name == "core")
        .expect("core container");
    let sleep = core
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .sleep
        .as_ref()
        .unwrap();
    assert_eq!(sleep.seconds, 60, "shutdown delay 15s + timeout 45s");
}

/// The kubelet sends httpGet, tcpSocket and grpc probes to the Pod IP; a core bound to loopback
/// never passes one. The chart refuses that combination with a message saying why, instead of a
/// Pod that stays in `Init` while its core is restarted every two minutes.
#[test]
fn a_network_probe_on_a_loopback_core_is_refused() {
    let sidecar = vec![example_file("sidecar-core")];
    let probes = [
        "core.sidecar.startupProbe.httpGet.port=8080",
        "core.sidecar.livenessProbe.tcpSocket.port=8080",
        "core.sidecar.readinessProbe.grpc.port=8080",
    ];
    check_each(
        probes,
        |set| (*set).to_owned(),
        |set| {
            let error =
                helm_template(&sidecar, &[set]).expect_err("a probe the kubelet cannot reach");
            assert!(
                error.contains("the core listens on loopback (--bind-address=127.0.0.1)")
                    && error.contains("probes to the Pod IP"),
                "{set}: {error}"
            );
        },
    );
    // An exec probe runs inside the container, and a core bound to the Pod IP is reachable.
    for sets in [
        &["core.sidecar.livenessProbe.exec.command={/usr/local/bin/health}"][..],
        &[
            "core.sidecar.args={--bind-address=0.0.0.0,--insecure-port=8080}",
            "core.sidecar.startupProbe.httpGet.port=8080",
        ],
    ] {
        helm_template(&sidecar, sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    }
}

#[test]
fn termination_grace_period_covers_the_shutdown_delay_and_timeout() {
    let cases: [(Option<&str>, &[&str], i64); 4] = [
        (None, &[], 10 + 60 + 5),
        (Some("sidecar-core"), &[], 15 + 45 + 5),
        (
            None,
            &["shutdown.delayDuration=1m30s", "shutdown.timeout=500ms"],
            90 + 1 + 5,
        ),
        (None, &["shutdown.terminationGracePeriodSeconds=300"], 300),
    ];
    check_each(
        cases,
        |(example, sets, _)| format!("{} {sets:?}", label(*example)),
        |(example, sets, want)| {
            let r = Rendered::with(example, sets);
            let pod = r.deployment().spec.template.spec.unwrap();
            assert_eq!(
                pod.termination_grace_period_seconds,
                Some(want),
                "{} {sets:?}",
                label(example)
            );
            let config = r.config();
            let delay: gateway_config::GoDuration = config["shutdownDelayDuration"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let timeout: gateway_config::GoDuration =
                config["shutdownTimeout"].as_str().unwrap().parse().unwrap();
            assert!(
                (delay.0 + timeout.0).as_secs_f64() <= want as f64,
                "{sets:?}"
            );
        },
    );
}

#[test]
fn checksum_annotation_changes_exactly_when_the_config_changes() {
    let checksum = |sets: &[&str]| {
        let d = Rendered::with(None, sets).deployment();
        d.spec.template.metadata.unwrap().annotations.unwrap()["checksum/config"].clone()
    };
    let base = checksum(&[]);
    assert_eq!(base.len(), 64);
    assert_eq!(base, checksum(&[]), "rendering is deterministic");
    assert_ne!(base, checksum(&["limits.maxRequestsInflight=10"]));
    assert_ne!(base, checksum(&["logging.level=debug"]));
    assert_ne!(base, checksum(&["extraConfig.authorizeMetrics=false"]));
    assert_eq!(
        base,
        checksum(&["replicaCount=5"]),
        "a non-config value must not roll the Pods"
    );
}

#[test]
fn pod_scheduling_values_and_disruption_budget() {
    let r = Rendered::of(Some("sidecar-core"));
    let d = r.deployment();
    let spec = d.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let tsc = &pod.topology_spread_constraints.unwrap()[0];
    assert_eq!(tsc.topology_key, "topology.kubernetes.io/zone");
    let selector = tsc
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(
        selector["app.kubernetes.io/instance"], RELEASE,
        "selector labels are filled in"
    );
    assert!(pod.affinity.unwrap().pod_anti_affinity.is_some());

    // nodeSelector, tolerations and the gateway's resources from values reach the Pod spec, and
    // the gateway's resources are not confused with the core sidecar's.
    assert_eq!(
        serde_json::to_value(&pod.node_selector).unwrap(),
        json!({"kubernetes.io/os": "linux", "node-role.example.com/edge": "true"})
    );
    assert_eq!(
        serde_json::to_value(&pod.tolerations).unwrap(),
        json!([{"key": "node-role.example.com/edge", "operator": "Exists", "effect": "NoSchedule"}])
    );
    let gateway = pod.containers.iter().find(|c| c.name == "gateway").unwrap();
    assert_eq!(
        serde_json::to_value(&gateway.resources).unwrap(),
        json!({"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
    );
    let core = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        serde_json::to_value(&core.resources).unwrap(),
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}})
    );
    let defaults = Rendered::of(None).deployment().spec.template.spec.unwrap();
    assert!(defaults.node_selector.is_none() && defaults.tolerations.is_none());

    let pdb: PodDisruptionBudget = r.get("PodDisruptionBudget", FULLNAME);
    let pdb = pdb.spec.unwrap();
    assert_eq!(serde_json::to_value(pdb.max_unavailable).unwrap(), 1);
    assert_eq!(
        pdb.selector.unwrap().match_labels,
        spec.selector.match_labels
    );
    let pdb: PodDisruptionBudget =
        Rendered::of(Some("cert-manager")).get("PodDisruptionBudget", FULLNAME);
    let pdb = pdb.spec.unwrap();
    assert_eq!(
        (
            serde_json::to_value(pdb.min_available).unwrap(),
            pdb.max_unavailable
        ),
        (json!(1), None)
    );
    assert!(
        !Rendered::with(None, &["podDisruptionBudget.enabled=false"]).has("PodDisruptionBudget")
    );

    let svc: Service = r.get("Service", FULLNAME);
    let svc_spec = svc.spec.unwrap();
    assert_eq!(svc_spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        svc.metadata.annotations.unwrap()["service.beta.kubernetes.io/aws-load-balancer-type"],
        "nlb"
    );
}
