//! The Dockerfile behind the chart's default image: it parses the way BuildKit's frontend reads
//! it (so a lost continuation backslash fails here, not in a release build), and its final stage
//! agrees with what the chart's defaults run (user, port, entrypoint).
//!
//! Needs `helm` on PATH for the chart's defaults: run `../shared/tools/install-helm`.

use e2e::dockerfile::{dockerfile_path, parse_dockerfile, RuntimeStage};
use e2e::helm::Rendered;
use e2e::real_node::image::{ImageLayout, ImageSpec};

/// The final stage (what the image runs) must agree with the chart's defaults: the USER is the
/// numeric uid/gid the Pod's securityContext runs as (numeric, or the kubelet cannot check
/// runAsNonRoot against it), EXPOSE is the gateway's container port, and the exec-form ENTRYPOINT
/// runs the binary the stage copies in (distroless has no shell for a shell-form one).
#[test]
fn dockerfile_parses_and_its_final_stage_matches_the_charts_defaults() {
    let text = std::fs::read_to_string(dockerfile_path()).unwrap();
    let instructions = parse_dockerfile(&text).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
    let last_from = instructions
        .iter()
        .rposition(|i| i.keyword == "FROM")
        .expect("a FROM");
    assert!(
        instructions[..last_from].iter().any(|i| i.keyword == "RUN"),
        "a multi-stage build: the binary is built in an earlier stage"
    );
    let stage = RuntimeStage::from_instructions(&instructions);

    let pod = Rendered::of(None).deployment().spec.template.spec.unwrap();
    let gateway = pod.containers.iter().find(|c| c.name == "gateway").unwrap();
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    let container_sc = gateway.security_context.clone().unwrap_or_default();
    let run_as_user = container_sc
        .run_as_user
        .or(pod_sc.run_as_user)
        .expect("runAsUser");
    let run_as_group = container_sc.run_as_group.or(pod_sc.run_as_group);

    let (uid, gid) = stage.uid_gid();
    assert_eq!(
        i64::from(uid),
        run_as_user,
        "the image's USER vs the chart's runAsUser"
    );
    if let Some(group) = run_as_group {
        assert_eq!(
            i64::from(gid),
            group,
            "the image's group vs the chart's runAsGroup"
        );
    }

    let port = gateway.ports.as_ref().unwrap()[0].container_port;
    assert_eq!(
        stage
            .exposed
            .iter()
            .map(|p| p.trim_end_matches("/tcp").parse::<i32>().ok())
            .collect::<Vec<_>>(),
        [Some(port)],
        "the image's EXPOSE vs the chart's container port"
    );
    assert!(
        stage.copied.contains(&stage.entrypoint[0]),
        "ENTRYPOINT {} is not copied into the final stage ({:?})",
        stage.entrypoint[0],
        stage.copied
    );
}

/// The real-node suite cannot pull the distroless base, so it builds the gateway's image offline
/// from the binary, from what the Dockerfile's final stage says (`ImageSpec::gateway`). The image
/// must be what the Dockerfile describes: its user and entrypoint, its port, the binary where
/// ENTRYPOINT runs it, an `/etc/passwd` naming the uid, CA certificates, and no shell at all.
#[test]
fn the_offline_image_has_what_the_dockerfile_describes() {
    let binary = e2e::harness::ensure_gateway_built().expect("the gateway binary");
    let stage = RuntimeStage::of_repository();
    let dir = tempfile::tempdir().unwrap();
    let layout = ImageLayout::build(
        &ImageSpec::gateway(&binary, "localhost/aggregation-gateway:test"),
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("building the image: {e}"));

    let config = &layout.config["config"];
    assert_eq!(config["User"], stage.user.as_str(), "USER");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(stage.entrypoint),
        "ENTRYPOINT"
    );
    let exposed: Vec<&String> = config["ExposedPorts"]
        .as_object()
        .expect("ExposedPorts")
        .keys()
        .collect();
    let want: Vec<String> = stage
        .exposed
        .iter()
        .map(|p| {
            if p.contains('/') {
                p.clone()
            } else {
                format!("{p}/tcp")
            }
        })
        .collect();
    assert_eq!(exposed, want.iter().collect::<Vec<_>>(), "EXPOSE");

    let files = layout.files();
    let entry = stage.entrypoint[0].trim_start_matches('/');
    let (_, mode) = files
        .iter()
        .find(|(path, _)| path == entry)
        .unwrap_or_else(|| panic!("{entry} is not in the layer: {files:?}"));
    assert_eq!(mode & 0o111, 0o111, "{entry} is executable");
    for shell in [
        "bin/sh",
        "bin/bash",
        "bin/dash",
        "bin/busybox",
        "usr/bin/sh",
    ] {
        assert!(
            !files.iter().any(|(path, _)| path == shell),
            "the image has a shell ({shell}); the Dockerfile's distroless base has none"
        );
    }
    let (uid, gid) = stage.uid_gid();
    let passwd = layout.file_text("etc/passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(&uid.to_string())
                && l.split(':').nth(3) == Some(&gid.to_string())),
        "/etc/passwd names the USER's uid and gid:\n{passwd}"
    );
    assert!(
        files
            .iter()
            .any(|(path, _)| path.starts_with("etc/ssl/certs/")),
        "CA certificates, as distroless ships them"
    );
    let (_, tmp_mode) = files
        .iter()
        .find(|(path, _)| path == "tmp")
        .expect("a /tmp");
    assert_eq!(
        tmp_mode & 0o1777,
        0o1777,
        "/tmp is world-writable and sticky"
    );
}

#[test]
fn dockerfile_parser_catches_a_missing_continuation_backslash() {
    // The runtime LABEL as it once was: its second and third lines lost their backslash.
    let broken = "\
# syntax=docker/dockerfile:1.7
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title=\"aggregation-gateway\"
      org.opencontainers.image.description=\"A front proxy.\"
      org.opencontainers.image.licenses=\"Apache-2.0\"
USER 65532:65532
";
    let err = parse_dockerfile(broken).unwrap_err();
    assert!(
        err.starts_with("line 4: \"org.opencontainers.image.description=\\\"A\" is not a Dockerfile instruction")
            && err.contains("(line 3 ends without '\\\\')"),
        "{err}"
    );

    let fixed = broken
        .replace("\"aggregation-gateway\"\n", "\"aggregation-gateway\" \\\n")
        .replace("proxy.\"\n", "proxy.\" \\\n");
    let instructions = parse_dockerfile(&fixed).unwrap();
    let keywords: Vec<&str> = instructions.iter().map(|i| i.keyword.as_str()).collect();
    assert_eq!(keywords, ["FROM", "LABEL", "USER"]);
    assert!(instructions[1]
        .args
        .ends_with("org.opencontainers.image.licenses=\"Apache-2.0\""));

    // A continuation into the end of the file, and heredoc bodies, are handled too.
    assert!(parse_dockerfile("FROM x\nRUN true \\\n")
        .unwrap_err()
        .contains("past the end"));
    let heredoc = "FROM x\nRUN <<EOF\nset -e\necho hi\nEOF\nUSER 1\n";
    assert_eq!(parse_dockerfile(heredoc).unwrap().len(), 3);
}
