//! Where the gateway and fixture binaries are, and building the gateway once per test process.

use super::*;

/// The `target/<profile>` directory of the running test executable.
pub fn target_profile_dir() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(io_err("locating the test executable"))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| HarnessError::Binary(format!("{} has no parent", exe.display())))?
        .to_path_buf();
    // Integration tests and unit tests run from target/<profile>/deps; binaries sit one level up.
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Path of a binary built into the same `target/<profile>` directory as the running test.
pub fn binary_path(name: &str) -> Result<PathBuf, HarnessError> {
    let path = target_profile_dir()?.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Binary(format!(
            "{} does not exist; build it with `cargo build --workspace --bins` \
             (cargo builds a package's own binaries for its integration tests only)",
            path.display()
        )))
    }
}

/// Name of the gateway binary (and of its package).
pub const GATEWAY_BIN: &str = "aggregation-gateway";

/// Builds the gateway binary once per test process and returns its path.
///
/// `cargo test -p e2e` does not build other packages' binaries, and a stale gateway makes failures
/// confusing, so the first caller runs `$CARGO build -p aggregation-gateway` with the same profile
/// and target directory as the running test. A nested cargo is safe: `cargo test` holds the build
/// lock only while compiling, not while tests run (verified with cargo 1.95). If another cargo holds
/// the lock, the nested build waits for it. Set `E2E_SKIP_GATEWAY_BUILD=1` to use the existing binary
/// as is. This blocks; call it from `spawn_blocking` in async code ([`Gateway::start`] does).
pub fn ensure_gateway_built() -> Result<PathBuf, HarnessError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_gateway().map_err(|e| match e {
                HarnessError::Build(message) => message,
                other => other.to_string(),
            })
        })
        .clone()
        .map_err(HarnessError::Build)
}

/// Builds the gateway's release binary (what its image ships) once per test process, whatever
/// profile the tests run in, into the same target directory; see [`ensure_gateway_built`]
/// (`E2E_SKIP_GATEWAY_BUILD=1` takes the existing one as it is here too).
pub fn ensure_release_gateway_built() -> Result<PathBuf, HarnessError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let profile_dir = target_profile_dir().map_err(|e| e.to_string())?;
            let release = profile_dir.with_file_name("release");
            if std::env::var_os("E2E_SKIP_GATEWAY_BUILD").is_some_and(|v| v != "0" && !v.is_empty())
            {
                let path = release.join(GATEWAY_BIN);
                return if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!("{} does not exist", path.display()))
                };
            }
            build_gateway_into(&release).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(HarnessError::Build)
}

fn build_gateway() -> Result<PathBuf, HarnessError> {
    if std::env::var_os("E2E_SKIP_GATEWAY_BUILD").is_some_and(|v| v != "0" && !v.is_empty()) {
        return binary_path(GATEWAY_BIN);
    }
    build_gateway_into(&target_profile_dir()?)
}

/// `cargo build -p aggregation-gateway` for the profile of `profile_dir` (`target/<profile>`).
fn build_gateway_into(profile_dir: &Path) -> Result<PathBuf, HarnessError> {
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| HarnessError::Binary(format!("{} has no parent", profile_dir.display())))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        GATEWAY_BIN,
        "--bin",
        GATEWAY_BIN,
        "--target-dir",
    ])
    .arg(target_dir)
    .current_dir(workspace_root());
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    eprintln!("e2e: building {GATEWAY_BIN} (once per process): {cmd:?}");
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running cargo to build the gateway"))?;
    if !output.status.success() {
        return Err(HarnessError::Build(format!(
            "`{cmd:?}` exited with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let path = profile_dir.join(format!("{GATEWAY_BIN}{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Binary(format!(
            "{} was not built",
            path.display()
        )))
    }
}

/// The workspace root (the parent of this package's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}
