//! The Dockerfile at the repository root, read the way BuildKit's frontend reads it, and its
//! final stage (what the image runs): user, entrypoint, exposed ports and copied files.
//!
//! Two users: `tests/suite/dockerfile.rs` (it parses, and agrees with the chart's defaults) and the
//! real-node suite, which cannot pull the distroless base and builds the same content offline
//! from the release binary ([`crate::real_node::image`]), from what this module reads.

use std::path::{Path, PathBuf};

/// Every instruction keyword BuildKit's Dockerfile frontend knows.
pub const DOCKERFILE_INSTRUCTIONS: [&str; 18] = [
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
pub struct Instruction {
    pub line: usize,
    pub keyword: String,
    pub args: String,
}

/// Splits a Dockerfile into instructions the way the frontend does: comment and blank lines are
/// dropped (also inside a continuation), a line ending in the escape character continues onto the
/// next, heredoc bodies (`<<EOF` ... `EOF`) belong to their instruction. Any other line must start
/// with an instruction keyword: a line that does not is what a forgotten trailing backslash leaves.
pub fn parse_dockerfile(text: &str) -> Result<Vec<Instruction>, String> {
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

/// The Dockerfile at the repository root.
pub fn dockerfile_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile")
}

/// What the final stage of the Dockerfile gives the image.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeStage {
    /// `USER` as written (`uid` or `uid:gid`).
    pub user: String,
    /// The exec-form `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `EXPOSE`d ports, as written (`8443`, `8443/tcp`).
    pub exposed: Vec<String>,
    /// `COPY` destinations, in order.
    pub copied: Vec<String>,
    /// The base image.
    pub from: String,
}

impl RuntimeStage {
    /// The final stage of the repository's Dockerfile.
    ///
    /// # Panics
    /// When the file does not parse, or the stage lacks a single USER, ENTRYPOINT (exec form) or
    /// EXPOSE.
    pub fn of_repository() -> RuntimeStage {
        let text = std::fs::read_to_string(dockerfile_path())
            .expect("read the Dockerfile at the repository root");
        let instructions = parse_dockerfile(&text).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
        RuntimeStage::from_instructions(&instructions)
    }

    /// The final stage of parsed instructions; see [`RuntimeStage::of_repository`].
    pub fn from_instructions(instructions: &[Instruction]) -> RuntimeStage {
        let last_from = instructions
            .iter()
            .rposition(|i| i.keyword == "FROM")
            .expect("a FROM");
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
        RuntimeStage {
            user: only("USER").args.clone(),
            entrypoint: serde_json::from_str(&only("ENTRYPOINT").args)
                .expect("ENTRYPOINT in exec (JSON array) form"),
            exposed: only("EXPOSE")
                .args
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            copied: stage
                .iter()
                .filter(|i| i.keyword == "COPY")
                .filter_map(|i| i.args.split_whitespace().last())
                .map(str::to_owned)
                .collect(),
            from: stage[0]
                .args
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    /// `(uid, gid)` of `USER` (gid = uid when not given).
    ///
    /// # Panics
    /// When either is not numeric (the kubelet can only check `runAsNonRoot` against a number).
    pub fn uid_gid(&self) -> (u32, u32) {
        let (uid, gid) = self
            .user
            .split_once(':')
            .unwrap_or((self.user.as_str(), self.user.as_str()));
        let number = |s: &str| {
            s.parse::<u32>()
                .unwrap_or_else(|_| panic!("USER {}: uid and gid must be numeric", self.user))
        };
        (number(uid), number(gid))
    }
}
