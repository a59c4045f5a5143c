//! Instructions per request where `perf` cannot count them (no hardware counters, as in most
//! VMs): each proxy is started once more under valgrind's callgrind, which counts every
//! instruction the program executes in software, so the figure repeats on a noisy machine.
//!
//! The counters are zeroed after a warm-up and dumped after the measured wrk run
//! (`callgrind_control -z` / `-d`, which reach the running process through vgdb), so start-up
//! and warm-up are not in the figure. Under callgrind a proxy runs some 50 times slower and its
//! threads take turns, so it answers fewer requests per wake-up than at full speed; that costs
//! every proxy alike, and the figures compare the proxies with each other, not with the perf
//! figures of another machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::BoxError;

/// Where callgrind's output files go, and how to run a program under it.
pub struct Callgrind {
    dir: PathBuf,
}

impl Callgrind {
    pub fn new(dir: &Path) -> Result<Callgrind, BoxError> {
        let dir = dir.join("callgrind");
        std::fs::create_dir_all(&dir)?;
        Ok(Callgrind { dir })
    }

    /// valgrind's arguments for running `program` (labelled `name`) under callgrind. valgrind
    /// logs to a file so that the program's own output (nginx's errors, the gateway's `serving`
    /// line) is what its pipes carry.
    fn valgrind_args(&self, name: &str) -> Vec<String> {
        vec![
            "--tool=callgrind".to_owned(),
            format!(
                "--callgrind-out-file={}",
                self.dir.join(format!("{name}.out")).display()
            ),
            format!(
                "--log-file={}",
                self.dir.join(format!("{name}.valgrind.log")).display()
            ),
        ]
    }

    /// A command running `program` under callgrind; add the program's arguments to it.
    pub fn command(&self, name: &str, program: &str) -> Command {
        let mut cmd = Command::new("valgrind");
        cmd.args(self.valgrind_args(name)).arg(program);
        cmd
    }

    /// An executable script that runs `program` under callgrind with the arguments it is given,
    /// for starters that take a binary path (the harness's gateway). `exec` keeps the pid.
    pub fn script(&self, name: &str, program: &Path) -> Result<PathBuf, BoxError> {
        use std::os::unix::fs::PermissionsExt;
        let args: String = self
            .valgrind_args(name)
            .iter()
            .map(|a| format!(" '{a}'"))
            .collect();
        let path = self.dir.join(format!("{name}.sh"));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec valgrind{args} '{}' \"$@\"\n",
                program.display()
            ),
        )?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    /// Zeroes the process's counters: what follows is what the next [`Callgrind::dump`] reports.
    pub async fn zero(&self, pid: u32) -> Result<(), BoxError> {
        control(&["-z", &pid.to_string()]).await
    }

    /// Dumps the counters and returns the instructions executed since the last zero or dump.
    pub async fn dump(&self, name: &str, pid: u32) -> Result<u64, BoxError> {
        control(&["-d", &pid.to_string()]).await?;
        // Every dump is a new file, `<name>.out.<n>`; the newest is the highest `n`.
        let prefix = format!("{name}.out.");
        let newest = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().into_string().ok()?;
                let n: u64 = file.strip_prefix(&prefix)?.parse().ok()?;
                Some((n, e.path()))
            })
            .max_by_key(|(n, _)| *n)
            .ok_or_else(|| {
                format!(
                    "callgrind wrote no dump for {name} in {}",
                    self.dir.display()
                )
            })?;
        let text = std::fs::read_to_string(&newest.1)?;
        summary(&text).ok_or_else(|| {
            format!("no summary line in callgrind's dump {}", newest.1.display()).into()
        })
    }
}

/// Runs `callgrind_control` (bounded: it gives up by itself if the process does not answer).
async fn control(args: &[&str]) -> Result<(), BoxError> {
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new("callgrind_control")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("callgrind_control {} did not answer in 60s", args.join(" ")))??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !stdout.contains("OK") {
        return Err(format!(
            "callgrind_control {} failed ({}): {stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}

/// The instructions a dump covers: its `summary:` line (the only event collected is `Ir`).
fn summary(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_of_a_dump() {
        let dump = "# callgrind format\nversion: 1\npart: 1\n\npositions: line\nevents: Ir\nsummary: 109192193\n\nob=(22) /usr/sbin/haproxy\n";
        assert_eq!(summary(dump), Some(109192193));
        assert_eq!(summary("events: Ir\n"), None);
    }
}
