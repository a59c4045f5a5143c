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

    /// Dumps the counters and returns what the program did since the last zero or dump.
    pub async fn dump(&self, name: &str, pid: u32) -> Result<Counts, BoxError> {
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
        let instructions = summary(&text)
            .ok_or_else(|| format!("no summary line in callgrind's dump {}", newest.1.display()))?;
        Ok(Counts {
            instructions,
            allocations: allocations(&text),
        })
    }
}

/// What one dump covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instructions executed.
    pub instructions: u64,
    /// Calls into the allocator that return a new block: the C allocator's (`malloc`, `calloc`,
    /// the aligned ones), or mimalloc's where the program links it (the gateway's global
    /// allocator); `realloc` is not counted, as it resizes a block already counted.
    pub allocations: u64,
}

/// The allocators' entry points a new block comes from: glibc's (which may name them either
/// way), and mimalloc's, which Rust's global allocator calls by their own names
/// (`mi_malloc_aligned` for every `alloc`, `mi_zalloc_aligned` for `alloc_zeroed`).
const ALLOCATING: [&str; 17] = [
    "malloc",
    "__libc_malloc",
    "calloc",
    "__libc_calloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "__libc_memalign",
    "__posix_memalign",
    "mi_malloc",
    "mi_zalloc",
    "mi_calloc",
    "mi_malloc_aligned",
    "mi_zalloc_aligned",
    "mi_malloc_small",
    "mi_heap_malloc",
    "mi_heap_malloc_aligned",
];

/// Calls to the allocator a dump records: the `calls=` lines whose callee (`cfn=`) is one of
/// [`ALLOCATING`], made from a function that is not one of them itself (glibc's aligned
/// allocation may go through another entry point). callgrind compresses names: `(id) name`
/// defines an id, `(id)` alone refers to it; `'2` marks a recursion level.
fn allocations(dump: &str) -> u64 {
    use std::collections::HashMap;
    let mut names: HashMap<&str, &str> = HashMap::new();
    let (mut caller_allocates, mut callee_allocates) = (false, false);
    let mut total = 0;
    for line in dump.lines() {
        if let Some(spec) = line.strip_prefix("fn=") {
            caller_allocates = ALLOCATING.contains(&resolve(&mut names, spec));
        } else if let Some(spec) = line.strip_prefix("cfn=") {
            callee_allocates = ALLOCATING.contains(&resolve(&mut names, spec));
        } else if let Some(calls) = line.strip_prefix("calls=") {
            if callee_allocates && !caller_allocates {
                total += calls
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

/// The function a `fn=`/`cfn=` spec names, recording a compressed name's id.
fn resolve<'a>(names: &mut std::collections::HashMap<&'a str, &'a str>, spec: &'a str) -> &'a str {
    let spec = spec.trim();
    let name = match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
        Some((id, "")) => names.get(id).copied().unwrap_or(""),
        Some((id, name)) => {
            let name = name.trim();
            names.insert(id, name);
            name
        }
        None => spec,
    };
    name.split('\'').next().unwrap_or("")
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

    #[test]
    fn counts_the_calls_into_the_allocator() {
        let dump = "events: Ir\nsummary: 1000\n\
            fn=(1) main\n0 10\ncfn=(2) malloc\ncalls=3 0\n0 300\ncfn=(3) free\ncalls=3 0\n0 90\n\
            fn=(4) alloc::raw_vec::grow\ncfn=(2)\ncalls=2 0\n0 200\ncfn=(5) realloc\ncalls=1 0\n0 50\n\
            fn=(6) posix_memalign\ncfn=(2)\ncalls=1 0\n0 100\n\
            fn=(7) h2::proto::Frame'2\ncfn=(8) calloc'2\ncalls=4 0\n0 100\n";
        // 3 + 2 from Rust code, 4 calloc; not realloc, free, or posix_memalign's own malloc.
        assert_eq!(allocations(dump), 9);
    }

    #[test]
    fn counts_the_calls_into_mimalloc() {
        // Rust's global allocator calls mi_malloc_aligned, which calls on inside mimalloc.
        let dump = "events: Ir\nsummary: 1000\n\
            fn=(1) __rust_alloc\ncfn=(2) mi_malloc_aligned\ncalls=5 0\n0 100\n\
            fn=(2)\ncfn=(3) mi_heap_malloc_aligned\ncalls=5 0\n0 80\n\
            fn=(3)\ncfn=(4) mi_malloc\ncalls=5 0\n0 60\n\
            fn=(5) __rust_alloc_zeroed\ncfn=(6) mi_zalloc_aligned\ncalls=2 0\n0 40\n\
            fn=(7) __rust_dealloc\ncfn=(8) mi_free\ncalls=7 0\n0 70\n";
        // 5 + 2 blocks; mimalloc's calls to itself and the frees are not new blocks.
        assert_eq!(allocations(dump), 7);
    }
}
