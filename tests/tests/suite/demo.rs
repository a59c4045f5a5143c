//! The README's first section, run as a newcomer runs it: the demo started, then every command of
//! the section's console blocks in the same order (`$ ...` in a shell with the demo's kubeconfig,
//! `demo> ...` typed into the demo; a block with no command is what the demo's terminal shows
//! next), each output compared with the README's. So the README cannot drift from what the demo
//! shows.
//!
//! What the comparison allows: kubectl's `AGE` column (the last one) is left out; `…` in a line
//! stands for anything (the build's output, timestamps, log fields); the demo's address and start
//! time are its own; the gateway's log lines after a `demo>` command may come in any order.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::demo;
use e2e::harness::{self, Process, Stream};

/// The section the demo's walk-through is in.
const SECTION: &str = "## Quick start";
const DEMO: &str = "cargo run -p e2e --bin demo";

/// One command of the README and the output it shows.
#[derive(Debug)]
enum Step {
    /// `$ cargo run -p e2e --bin demo`: what the demo prints when it is ready.
    Demo(Vec<String>),
    /// `$ <command>` in the other terminal.
    Shell(String, Vec<String>),
    /// `demo> <line>` in the demo's terminal.
    Input(String, Vec<String>),
    /// A block of what the demo's terminal shows next, with no command.
    Shows(Vec<String>),
}

#[tokio::test]
async fn the_readme_walk_through_shows_what_the_demo_does() {
    let readme = std::fs::read_to_string(harness::workspace_root().join("README.md")).unwrap();
    let steps = steps(&readme);
    assert!(
        matches!(steps.first(), Some(Step::Demo(_))),
        "the section starts with `{DEMO}`: {steps:#?}"
    );
    let gateway = tokio::task::spawn_blocking(harness::ensure_gateway_built)
        .await
        .unwrap()
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("target/demo");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_demo"));
    cmd.arg("--dir")
        .arg(&dir)
        .args(["--secure-port", "0", "--core-port", "0", "--gateway"])
        .arg(&gateway);
    let spawned = Instant::now();
    let mut demo = Process::spawn_interactive("demo", cmd).unwrap();
    let ready = demo
        .wait_for_line(|l| l.contains(demo::READY), harness::STARTUP_TIMEOUT)
        .await;
    let Some(ready) = ready else {
        panic!("the demo never said it was ready:\n{}", demo.logs());
    };
    eprintln!(
        "demo ready {:.1?} after it was started: {ready}",
        spawned.elapsed()
    );
    let address = between(&ready, "https://", " ").to_owned();

    // Where the lines since the last command start: a block with no command is what the demo's
    // terminal shows after it, which may come before that command ends (kubectl's request makes
    // the gateway log at once, before kubectl has exited).
    let mut since_command = demo.line_count();
    for step in &steps {
        if matches!(step, Step::Shell(..) | Step::Input(..)) {
            since_command = demo.line_count();
        }
        match step {
            Step::Demo(shown) => {
                // Line by line, in order, on stdout.
                let mut from = 0;
                for line in shown.iter().filter(|l| !l.contains('…')) {
                    let want = normalised_demo(line, "127.0.0.1:8443");
                    let found = demo
                        .wait_for_line_from(
                            from,
                            Some(Stream::Stdout),
                            |l| normalised_demo(l, &address).trim_end() == want.trim_end(),
                            Duration::from_secs(10),
                        )
                        .await;
                    let Some((at, _)) = found else {
                        panic!(
                            "the demo did not print {line:?} (in this order):\n{}",
                            demo.stdout()
                        );
                    };
                    from = at + 1;
                }
            }
            Step::Shell(command, shown) => {
                if let Some(path) = command.strip_prefix("export KUBECONFIG=") {
                    // The demo's own default; this run writes it under the scratch directory.
                    assert_eq!(path, "$PWD/target/demo/kubeconfig");
                    assert!(demo::default_dir().ends_with("target/demo"));
                    continue;
                }
                let output = shell(command, &dir.join("kubeconfig"), &home, scratch.path());
                assert_eq!(
                    without_ages(&output),
                    without_ages(&shown.join("\n")),
                    "`{command}` printed\n{output}\n--- demo ---\n{}",
                    demo.logs()
                );
            }
            Step::Input(_, shown) | Step::Shows(shown) => {
                let from = since_command;
                if let Step::Input(line, _) = step {
                    demo.send_line(line).unwrap();
                }
                for expected in shown {
                    let fragments: Vec<&str> = expected
                        .split('…')
                        .map(str::trim)
                        .filter(|f| !f.is_empty())
                        .collect();
                    let found = demo
                        .wait_for_line_from(
                            from,
                            None,
                            |l| in_order(l, &fragments),
                            Duration::from_secs(30),
                        )
                        .await;
                    assert!(
                        found.is_some(),
                        "the demo never printed {expected:?}:\n{}",
                        demo.logs()
                    );
                }
            }
        }
    }

    // Ctrl-C stops everything it started: the gateway's port is free again.
    demo.signal("INT").unwrap();
    let status = demo.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        demo.logs()
    );
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_err(),
        "the gateway still listens on {address}"
    );
}

/// The console blocks of the README's first section, as steps.
fn steps(readme: &str) -> Vec<Step> {
    let start = readme.find(SECTION).expect("the README's first section");
    let section = &readme[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut steps = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```console\n") {
        let body = &rest[open + "```console\n".len()..];
        let close = body.find("\n```").expect("a closed console block");
        let starts_with_output = body[..close]
            .lines()
            .next()
            .is_some_and(|first| !first.starts_with("$ ") && !first.starts_with(demo::PROMPT));
        if starts_with_output {
            steps.push(Step::Shows(Vec::new()));
        }
        for line in body[..close].lines() {
            let line = line.to_owned();
            if let Some(command) = line.strip_prefix("$ ") {
                if command == DEMO {
                    steps.push(Step::Demo(Vec::new()));
                } else {
                    steps.push(Step::Shell(command.to_owned(), Vec::new()));
                }
            } else if let Some(input) = line.strip_prefix(demo::PROMPT) {
                steps.push(Step::Input(input.to_owned(), Vec::new()));
            } else {
                match steps.last_mut() {
                    Some(
                        Step::Demo(shown)
                        | Step::Shell(_, shown)
                        | Step::Input(_, shown)
                        | Step::Shows(shown),
                    ) => shown.push(line),
                    None => panic!("output before any command: {line:?}"),
                }
            }
        }
        rest = &body[close..];
    }
    steps
}

/// Runs `command` as the README's reader does, stderr with stdout, with the demo's kubeconfig
/// and a kubectl cache of this run's own.
fn shell(command: &str, kubeconfig: &Path, home: &Path, cwd: &Path) -> String {
    let output = Command::new("bash")
        .args(["-c", &format!("{command} 2>&1")])
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .current_dir(cwd)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `output` without trailing spaces, trailing empty lines, and the cells of a last `AGE`
/// column.
fn without_ages(output: &str) -> String {
    let mut age_at = None;
    let mut lines: Vec<String> = Vec::new();
    for line in output.lines() {
        if line.trim_end().ends_with(" AGE") {
            age_at = line.rfind("AGE");
        }
        let line = match age_at {
            Some(at) if line.len() >= at => &line[..at],
            _ => line,
        };
        lines.push(line.trim_end().to_owned());
    }
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines.join("\n")
}

/// The demo's output with its address as the README shows it (the default port) and its start
/// time left out.
fn normalised_demo(text: &str, address: &str) -> String {
    let text = text.replace(address, "127.0.0.1:8443");
    let Some(at) = text.find(demo::READY) else {
        return text;
    };
    let after = &text[at + demo::READY.len()..];
    match (after.find(" ("), after.find("s):")) {
        (Some(0), Some(end)) => format!("{}{} (…){}", &text[..at], demo::READY, &after[end + 2..]),
        _ => text,
    }
}

/// Whether `line` contains every fragment, in order.
fn in_order(line: &str, fragments: &[&str]) -> bool {
    let mut rest = line;
    for fragment in fragments {
        match rest.find(fragment) {
            Some(at) => rest = &rest[at + fragment.len()..],
            None => return false,
        }
    }
    true
}

/// The text between `start` and the next `end` in `line`.
fn between<'a>(line: &'a str, start: &str, end: &str) -> &'a str {
    let from = line.find(start).map_or(0, |at| at + start.len());
    let rest = &line[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}
