//! Instructions a proxy process retires while it serves a measured round, from `perf stat`
//! attached to its pid, so that rows compare the work each proxy does per request rather than
//! how much CPU time it was given on a shared machine.
//!
//! Hardware counters are not always there: virtual machines often expose no PMU (the kernel logs
//! "PMU not available due to virtualization") and then perf answers `<not supported>`. The bench
//! probes once and, when counting is impossible, says why in place of a figure.

use std::process::Command;
use std::time::Duration;

use super::super::BoxError;
use crate::harness::Process;

/// How instructions are counted on this machine.
#[derive(Clone, Debug)]
pub enum Counting {
    /// `perf stat` during every measured run.
    Perf,
    /// perf cannot (why); each proxy runs once more under callgrind ([`super::callgrind`]).
    Callgrind(String),
    /// Not at all (why), for the table.
    Unavailable(String),
}

/// perf if it counts; otherwise callgrind when valgrind is installed and the run is not `--short`
/// (callgrind's pass takes minutes).
pub fn probe(short: bool) -> Counting {
    let why = match perf_counts() {
        Ok(()) => return Counting::Perf,
        Err(why) => why,
    };
    if short {
        Counting::Unavailable(format!("{why}; callgrind is not run in --short mode"))
    } else if std::env::var_os("BENCH_PEERS_NO_CALLGRIND").is_some() {
        Counting::Unavailable(format!(
            "{why}; callgrind not run (BENCH_PEERS_NO_CALLGRIND)"
        ))
    } else if super::on_path("valgrind") && super::on_path("callgrind_control") {
        Counting::Callgrind(why)
    } else {
        Counting::Unavailable(format!("{why}; valgrind (callgrind) is not installed"))
    }
}

/// Asks perf to count the instructions of `true`; anything but a number means it cannot.
fn perf_counts() -> Result<(), String> {
    let output = Command::new("perf")
        .args(["stat", "-e", "instructions", "-x,", "true"])
        .output()
        .map_err(|e| format!("perf could not be run ({e})"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    match instructions(&stderr) {
        Ok(_) => Ok(()),
        Err(why) => Err(format!(
            "perf stat cannot count instructions here ({why}){}",
            if why.contains("not supported") {
                ": no hardware performance counters, as in a VM without a virtual PMU"
            } else {
                ""
            }
        )),
    }
}

/// `perf stat -e instructions` attached to one running process (all its threads).
pub struct PerfStat {
    process: Process,
}

impl PerfStat {
    /// Starts counting `pid`'s instructions from now on.
    pub async fn attach(pid: u32) -> Result<PerfStat, BoxError> {
        let mut cmd = Command::new("perf");
        cmd.args(["stat", "-e", "instructions", "-x,", "-p", &pid.to_string()]);
        let mut process = Process::spawn("perf-stat", cmd)?;
        // perf prints nothing when it has attached; give it a moment before the load starts, so
        // the first requests are not missed (a few ms of an idle proxy add nothing measurable).
        tokio::time::sleep(Duration::from_millis(150)).await;
        if let Some(status) = process.try_wait() {
            return Err(format!(
                "perf stat -p {pid} exited at once ({status}):\n{}",
                process.logs()
            )
            .into());
        }
        Ok(PerfStat { process })
    }

    /// Stops counting (SIGINT, as at a terminal) and returns the instructions counted.
    pub async fn finish(mut self) -> Result<u64, BoxError> {
        self.process.signal("INT")?;
        if self
            .process
            .wait_exit(Duration::from_secs(10))
            .await
            .is_none()
        {
            return Err("perf stat did not stop within 10s of SIGINT".into());
        }
        // The count is printed at exit; wait for the line to have been read from the pipe.
        let found = self
            .process
            .wait_for_line(|l| l.contains(",instructions"), Duration::from_secs(5))
            .await;
        let Some(line) = found else {
            return Err(format!("perf stat printed no count:\n{}", self.process.logs()).into());
        };
        Ok(instructions(&line)?)
    }
}

/// The instructions count in `perf stat -x,` output (`<count>,<unit>,instructions,...`).
fn instructions(output: &str) -> Result<u64, String> {
    let line = output
        .lines()
        .find(|l| l.contains(",instructions"))
        .ok_or_else(|| format!("no instructions line in {output:?}"))?;
    let value = line.split(',').next().unwrap_or("").trim();
    value.parse::<u64>().map_err(|_| {
        if value.starts_with('<') {
            // `<not supported>` or `<not counted>`.
            format!("perf says {value}")
        } else {
            format!("unexpected count {value:?}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_count_and_says_why_there_is_none() {
        assert_eq!(
            instructions("1234567,,instructions,1000000,100.00,,\n"),
            Ok(1234567)
        );
        // What perf prints in a VM without a PMU.
        assert_eq!(
            instructions("<not supported>,,instructions,0,100.00,,\n"),
            Err("perf says <not supported>".to_owned())
        );
        assert!(instructions("").is_err());
    }
}
