//! The results of a run: table rows (direct, via the gateway, ratio, target), the raw figures
//! behind them, the Markdown table, the JSON document and BENCHMARKS.md. The formats here are what
//! readers and CI compare across runs; keep them stable.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use super::load::LOAD_GENERATOR;
use super::{round, BoxError, Settings};

/// What the scenarios add to: the table's rows and, by scenario, the raw figures behind them.
#[derive(Default)]
pub struct Results {
    pub rows: Vec<Row>,
    pub raw: serde_json::Map<String, Value>,
    /// Parts whose figures do not fit the direct/via table (the peers comparison), each printed
    /// after the table under its own heading.
    pub sections: Vec<Section>,
}

// === impl Section ===

/// A titled block of Markdown after the table.
#[derive(Clone, Debug)]
pub struct Section {
    pub title: String,
    pub markdown: String,
}

impl Section {
    pub fn new(title: impl Into<String>, markdown: impl Into<String>) -> Section {
        Section {
            title: title.into(),
            markdown: markdown.into(),
        }
    }

    /// `## title`, a blank line, the body.
    pub fn to_markdown(&self) -> String {
        let mut body = self.markdown.clone();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        format!("## {}\n\n{body}", self.title)
    }
}

/// Every section, one after the other, for stdout and BENCHMARKS.md.
pub fn sections_markdown(sections: &[Section]) -> String {
    sections
        .iter()
        .map(Section::to_markdown)
        .collect::<Vec<_>>()
        .join("\n")
}

// === impl Row ===

/// One table row. `direct`/`via` are in `unit`; `ratio` is via ÷ direct.
#[derive(Clone, Debug)]
pub struct Row {
    scenario: String,
    metric: String,
    unit: &'static str,
    direct: Option<f64>,
    via: Option<f64>,
    target: String,
    met: Option<bool>,
    note: String,
}

impl Row {
    pub fn new(scenario: &str, metric: &str, unit: &'static str) -> Row {
        Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            unit,
            direct: None,
            via: None,
            target: "—".to_owned(),
            met: None,
            note: String::new(),
        }
    }
    pub fn values(mut self, direct: Option<f64>, via: Option<f64>) -> Row {
        self.direct = direct;
        self.via = via;
        self
    }
    pub fn target(mut self, target: impl Into<String>, met: Option<bool>) -> Row {
        self.target = target.into();
        self.met = met;
        self
    }
    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }
    pub fn ratio(&self) -> Option<f64> {
        match (self.direct, self.via) {
            (Some(d), Some(v)) if d > 0.0 => Some(v / d),
            _ => None,
        }
    }
    pub fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario, "metric": self.metric, "unit": self.unit,
            "direct": self.direct.map(|v| round(v, 4)), "via_gateway": self.via.map(|v| round(v, 4)),
            "ratio": self.ratio().map(|v| round(v, 3)), "target": self.target,
            "met": self.met, "note": self.note,
        })
    }
}

fn fmt_value(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "—".to_owned(),
        Some(v) => {
            let n = if v >= 1000.0 {
                format!("{v:.0}")
            } else if v >= 100.0 {
                format!("{v:.1}")
            } else if v >= 1.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.3}")
            };
            format!("{n} {unit}")
        }
    }
}

/// The table as BENCHMARKS.md and stdout show it.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | metric | direct | via gateway | ratio | target | met? | notes |\n|---|---|---:|---:|---:|---|---|---|\n",
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let ratio = r.ratio().map_or("—".to_owned(), |x| format!("{x:.2}×"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.metric,
            fmt_value(r.direct, r.unit),
            fmt_value(r.via, r.unit),
            ratio,
            r.target,
            met,
            r.note
        ));
    }
    out
}

/// The JSON document of a run (`--json`): the settings, every row, the raw figures and the table.
pub fn json_document(
    mode: &str,
    machine: &Value,
    gateway_binary: &Path,
    settings: &Settings,
    open_file_limit: u64,
    results: &Results,
    table: &str,
) -> Value {
    json!({
        "mode": mode,
        "machine": machine,
        "load_generator": LOAD_GENERATOR,
        "gateway_binary": gateway_binary.display().to_string(),
        "settings": {
            "warmup_seconds": settings.warmup.as_secs_f64(),
            "duration_seconds": settings.duration.as_secs_f64(),
            "watch_streams": settings.watch_streams,
            "open_file_limit": open_file_limit,
        },
        "rows": results.rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "raw": results.raw,
        "table_markdown": table,
        "sections": results
            .sections
            .iter()
            .map(|s| json!({ "title": s.title, "markdown": s.markdown }))
            .collect::<Vec<_>>(),
    })
}

// === machine facts and BENCHMARKS.md ===

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// What the run ran on, for the JSON and BENCHMARKS.md.
pub fn machine_facts() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": model,
        "memory_gib": round(mem_kb as f64 / 1024.0 / 1024.0, 1),
        "kernel": command_line("uname", &["-r"]),
        "rustc": command_line("rustc", &["--version"]),
        "date": command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        // Other work on the machine shows here (the bench itself adds about 2-3 while running).
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    })
}

const NOTES_MARKER: &str = "<!-- Notes below this line are written by hand and kept when the bench rewrites this file. -->";

/// Rewrites BENCHMARKS.md: the generated part from this run, the hand-written notes below
/// [`NOTES_MARKER`] kept as they are.
pub fn write_benchmarks_md(
    path: &Path,
    table: &str,
    results: &Results,
    machine: &Value,
    mode: &str,
) -> Result<(), BoxError> {
    let rows = &results.rows;
    let kept = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.split_once(NOTES_MARKER)
                .map(|(_, notes)| notes.to_owned())
        })
        .unwrap_or_else(|| "\n".to_owned());
    let missed: Vec<String> = rows
        .iter()
        .filter(|r| r.met == Some(false))
        .map(|r| {
            format!(
                "- {} — {}: {} via the gateway ({} direct{}), target {}.",
                r.scenario,
                r.metric,
                fmt_value(r.via, r.unit),
                fmt_value(r.direct, r.unit),
                r.ratio()
                    .map_or(String::new(), |x| format!(", ratio {x:.2}×")),
                r.target
            )
        })
        .collect();
    let s = |k: &str| machine[k].as_str().unwrap_or("?").to_owned();
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(
        "What the gateway costs compared with talking to the backend directly, measured in the same \
         run by `tests/src/bin/bench.rs`:\n\n    cargo run --release -p e2e --bin bench -- --write-benchmarks-md\n\n\
         (`--short` for the CI smoke run, `--json FILE` for the raw numbers). It starts a static \
         hyper backend (plain HTTP as the core, TLS as a remote APIService and as the direct \
         target), the release gateway in front of it, and the load generator, all on loopback. \
         Each proxied figure is measured against the backend directly and through the gateway with \
         the same client, TLS and concurrency; the ratio is via ÷ direct. Absolute numbers depend \
         on the machine; the ratios are the point.\n\n",
    );
    out.push_str(&format!(
        "Latest {mode} run: {} — {} × {} (nproc {}), {} GiB RAM, Linux {}, {}; load average \
         at the end of the run {}.\n\n",
        s("date"),
        machine["nproc"],
        s("cpu"),
        machine["nproc"],
        machine["memory_gib"],
        s("kernel"),
        s("rustc"),
        s("loadavg_at_end"),
    ));
    out.push_str(&format!("Load generator: {LOAD_GENERATOR}. The generator, the gateway and the backend share the machine's CPUs, in the direct run as well.\n\n"));
    out.push_str(table);
    if !results.sections.is_empty() {
        out.push('\n');
        out.push_str(&sections_markdown(&results.sections));
    }
    out.push_str("\n## Missed targets (generated)\n\n");
    if missed.is_empty() {
        out.push_str("None.\n");
    } else {
        out.push_str(&missed.join("\n"));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(NOTES_MARKER);
    out.push_str(&kept);
    std::fs::write(path, out)?;
    Ok(())
}
