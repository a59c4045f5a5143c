//! The Dockerfile behind the chart's default image: it parses the way BuildKit's frontend reads
//! it (so a lost continuation backslash fails here, not in a release build), and its final stage
//! agrees with what the chart's defaults run (user, port, entrypoint).
//!
//! Needs `helm` on PATH for the chart's defaults: run `../shared/tools/install-helm`.

use std::path::Path;

use e2e::helm::Rendered;

/// Every instruction keyword BuildKit's Dockerfile frontend knows.
const DOCKERFILE_INSTRUCTIONS: [&str; 18] = [
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
];

/// One instruction with its continuation lines joined, and the line it starts on.
#[derive(Debug)]
struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

/// Splits a Dockerfile into instructions the way the frontend does: comment and blank lines are
/// dropped (also inside a continuation), a line ending in the escape character continues onto the
/// next, heredoc bodies (`<<EOF` ... `EOF`) belong to their instruction. Any other line must start
/// with an instruction keyword: a line that does not is what a forgotten trailing backslash leaves.
fn parse_dockerfile(text: &str) -> Result<Vec<Instruction>, String> {
    let mut escape = '\\';
    // Parser directives (`# syntax=`, `# escape=`) are only recognized before anything else.
    for line in text.lines() {
        let Some(directive) = line.trim().strip_prefix('#') else {
            break;
        };
        match directive.trim().split_once('=') {
            Some((name, value)) if name.trim().eq_ignore_ascii_case("escape") => {
                escape = value.trim().chars().next().unwrap_or('\\');
            }
            Some((name, _)) if !name.trim().contains(' ') => {}
            _ => break,
        }
    }

    let mut out: Vec<Instruction> = Vec::new();
    let mut open: Option<Instruction> = None;
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if let Some((end, strip_tabs)) = heredocs.first() {
            let body = if *strip_tabs {
                raw.trim_start_matches('\t')
            } else {
                raw
            };
            if body == end {
                heredocs.remove(0);
            }
            continue;
        }
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (content, continues) = match trimmed.strip_suffix(escape) {
            Some(head) => (head, true),
            None => (trimmed, false),
        };
        let mut current = match open.take() {
            Some(mut current) => {
                current.args.push(' ');
                current.args.push_str(content.trim());
                current
            }
            None => {
                let (word, args) = content
                    .split_once(char::is_whitespace)
                    .unwrap_or((content, ""));
                let keyword = word.to_ascii_uppercase();
                if !DOCKERFILE_INSTRUCTIONS.contains(&keyword.as_str()) {
                    let after = out
                        .last()
                        .map(|p| format!(" (line {} ends without {escape:?})", p.line))
                        .unwrap_or_default();
                    return Err(format!(
                        "line {n}: {word:?} is not a Dockerfile instruction nor a continuation{after}: {trimmed}"
                    ));
                }
                Instruction {
                    line: n,
                    keyword,
                    args: args.trim().to_owned(),
                }
            }
        };
        if continues {
            open = Some(current);
            continue;
        }
        if matches!(current.keyword.as_str(), "RUN" | "COPY" | "ADD") {
            heredocs = heredoc_terminators(&current.args);
        }
        current.args = current.args.trim().to_owned();
        out.push(current);
    }
    if let Some(current) = open {
        return Err(format!(
            "line {}: {} continues past the end of the file",
            current.line, current.keyword
        ));
    }
    if let Some((end, _)) = heredocs.first() {
        return Err(format!("heredoc {end:?} is never closed"));
    }
    Ok(out)
}

/// The terminators of the heredocs an instruction opens (`<<EOF`, `<<-EOF`, `<<"EOF"`), in order,
/// with whether leading tabs are stripped before comparing.
fn heredoc_terminators(args: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut rest = args;
    while let Some(at) = rest.find("<<") {
        rest = &rest[at + 2..];
        let strip_tabs = rest.starts_with('-');
        let word = rest.trim_start_matches('-').trim_start_matches(['"', '\'']);
        let end: String = word
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !end.is_empty() {
            out.push((end, strip_tabs));
        }
    }
    out
}

fn read_dockerfile() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"))
        .expect("read the Dockerfile at the repository root")
}

/// The final stage (what the image runs) must agree with the chart's defaults: the USER is the
/// numeric uid/gid the Pod's securityContext runs as (numeric, or the kubelet cannot check
/// runAsNonRoot against it), EXPOSE is the gateway's container port, and the exec-form ENTRYPOINT
/// runs the binary the stage copies in (distroless has no shell for a shell-form one).
#[test]
fn dockerfile_parses_and_its_final_stage_matches_the_charts_defaults() {
    let instructions =
        parse_dockerfile(&read_dockerfile()).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
    let last_from = instructions
        .iter()
        .rposition(|i| i.keyword == "FROM")
        .expect("a FROM");
    assert!(
        instructions[..last_from].iter().any(|i| i.keyword == "RUN"),
        "a multi-stage build: the binary is built in an earlier stage"
    );
    let stage = &instructions[last_from..];
    let only = |keyword: &str| -> &Instruction {
        let found: Vec<&Instruction> = stage.iter().filter(|i| i.keyword == keyword).collect();
        assert_eq!(
            found.len(),
            1,
            "the final stage needs exactly one {keyword}: {found:?}"
        );
        found[0]
    };

    let pod = Rendered::of(None).deployment().spec.template.spec.unwrap();
    let gateway = pod.containers.iter().find(|c| c.name == "gateway").unwrap();
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    let container_sc = gateway.security_context.clone().unwrap_or_default();
    let run_as_user = container_sc
        .run_as_user
        .or(pod_sc.run_as_user)
        .expect("runAsUser");
    let run_as_group = container_sc.run_as_group.or(pod_sc.run_as_group);

    let user = &only("USER").args;
    let (uid, gid) = user
        .split_once(':')
        .map_or((user.as_str(), None), |(u, g)| (u, Some(g)));
    let uid: i64 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user}: the uid must be numeric"));
    assert_eq!(
        uid, run_as_user,
        "the image's USER vs the chart's runAsUser"
    );
    if let (Some(gid), Some(group)) = (gid, run_as_group) {
        assert_eq!(
            gid.parse::<i64>().ok(),
            Some(group),
            "the image's group vs the chart's runAsGroup"
        );
    }

    let port = gateway.ports.as_ref().unwrap()[0].container_port;
    let exposed: Vec<&str> = only("EXPOSE").args.split_whitespace().collect();
    assert_eq!(
        exposed
            .iter()
            .map(|p| p.trim_end_matches("/tcp").parse::<i32>().ok())
            .collect::<Vec<_>>(),
        [Some(port)],
        "the image's EXPOSE vs the chart's container port"
    );

    let entrypoint: Vec<String> = serde_json::from_str(&only("ENTRYPOINT").args)
        .expect("ENTRYPOINT in exec (JSON array) form");
    let copied: Vec<&str> = stage
        .iter()
        .filter(|i| i.keyword == "COPY")
        .filter_map(|i| i.args.split_whitespace().last())
        .collect();
    assert!(
        copied.contains(&entrypoint[0].as_str()),
        "ENTRYPOINT {} is not copied into the final stage ({copied:?})",
        entrypoint[0]
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
