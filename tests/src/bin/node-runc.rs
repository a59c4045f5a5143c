//! `node-runc`: runc for the real-node suite's containerd (`e2e::real_node::cluster`).
//!
//! This VM's capability bounding set lacks `CAP_SYS_RESOURCE`, so runc cannot lower a process's
//! `oom_score_adj` below 0: every Pod sandbox (the kubelet asks for -998) failed with "can't get
//! final child's PID from pipe: EOF", and Guaranteed Pods would too. Before handing over to the
//! real runc (`$NODE_RUNC`, else `runc` on PATH), this clamps a negative `process.oomScoreAdj` in
//! the bundle's `config.json` to 0. Every other call passes through unchanged.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bundle) = bundle(&args) {
        if let Err(e) = clamp_oom_score_adj(&bundle.join("config.json")) {
            eprintln!("node-runc: {e}");
        }
    }
    let runc = std::env::var_os("NODE_RUNC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("runc"));
    let error = Command::new(&runc).args(&args).exec();
    eprintln!("node-runc: cannot run {}: {error}", runc.display());
    std::process::exit(127);
}

/// The `--bundle`/`-b` argument, in either spelling.
fn bundle(args: &[String]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--bundle" || arg == "-b" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(value) = arg.strip_prefix("--bundle=") {
            return Some(PathBuf::from(value));
        }
    }
    None
}

fn clamp_oom_score_adj(config: &Path) -> Result<(), String> {
    let Ok(text) = std::fs::read(config) else {
        return Ok(()); // not every command with --bundle has a config yet
    };
    let mut spec: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", config.display()))?;
    let adj = &mut spec["process"]["oomScoreAdj"];
    if adj.as_i64().is_some_and(|v| v < 0) {
        *adj = 0.into();
        let text = serde_json::to_vec(&spec).map_err(|e| e.to_string())?;
        std::fs::write(config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    }
    Ok(())
}
