//! The benchmark harness runs in its short mode and produces its table and JSON with every
//! scenario. Targets are not asserted here: a CI machine's numbers (debug builds, shared CPUs)
//! say nothing about them; `BENCHMARKS.md` holds a full release run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::harness::ensure_gateway_built;

/// Every scenario the issue asks for, as the table names it.
const SCENARIOS: &[&str] = &[
    "small GET, HTTP/1.1 keep-alive, 32 connections",
    "small GET, HTTP/2, 32 streams on 4 connections",
    "TLS termination + TLS to backend",
    "1 MiB response",
    "aggregated discovery /apis",
    "watch streams held open",
    "route-table rebuild",
    "route lookup",
    "discovery rebuild",
    "resident memory",
    "start to ready",
    "overload",
    "priority and fairness",
    "openapi v2",
];

#[test]
fn short_benchmark_produces_the_table_and_json() {
    // The debug gateway: building a release one would cost CI minutes, and short mode only
    // checks that the harness works.
    let gateway = ensure_gateway_built().expect("gateway builds");
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("bench.json");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--short")
        .arg("--gateway")
        .arg(&gateway)
        .arg("--json")
        .arg(&json_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bench starts");
    // Bounded: the short run takes about 30 s on 2 cores with debug builds.
    let limit = Duration::from_secs(240);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench --short failed ({:?}) after {:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status,
        started.elapsed()
    );

    assert!(
        stdout.contains(
            "| scenario | metric | direct | via gateway | ratio | target | met? | notes |"
        ),
        "no Markdown table on stdout:\n{stdout}"
    );
    assert!(
        stdout.contains("load generator:"),
        "the load generator is named"
    );
    for scenario in SCENARIOS {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("| ") && l.contains(scenario)),
            "scenario {scenario:?} missing from the table:\n{stdout}"
        );
    }

    // The peers part (issue 17): nginx and HAProxy beside the gateway when wrk, nginx and haproxy
    // are installed, every server answering in both shapes; otherwise a line saying it was
    // skipped and why.
    let peers = stdout
        .split_once("## peers: the gateway beside nginx and HAProxy (wrk)")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no peers section on stdout:\n{stdout}"));
    if !peers.contains("skipped: nginx/haproxy/wrk not installed") {
        for shape in ["fallthrough:", "remote:"] {
            for server in [
                "direct TLS backend",
                "gateway",
                "nginx (1 worker)",
                "HAProxy (1 thread)",
            ] {
                let row = peers
                    .lines()
                    .find(|l| {
                        l.starts_with(&format!("| {shape}")) && l.contains(&format!("| {server} |"))
                    })
                    .unwrap_or_else(|| panic!("no peers row for {shape} {server}:\n{peers}"));
                assert!(row.ends_with("| 0 |"), "errors in the peers row: {row}");
            }
        }
    }

    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("JSON written")).unwrap();
    assert_eq!(doc["mode"], "short");
    assert!(doc["machine"]["nproc"].as_u64().unwrap_or(0) > 0);
    let rows = doc["rows"].as_array().expect("rows");
    for scenario in SCENARIOS {
        assert!(
            rows.iter()
                .any(|r| r["scenario"].as_str().is_some_and(|s| s.contains(scenario))),
            "scenario {scenario:?} missing from the JSON"
        );
    }
    // Each proxied scenario measured both sides and served requests without errors.
    for (name, run) in doc["raw"].as_object().expect("raw").iter() {
        if let (Some(direct), Some(via)) = (run.get("direct"), run.get("via_gateway")) {
            if let Some(requests) = direct.get("requests") {
                assert!(
                    requests.as_u64().unwrap_or(0) > 0,
                    "{name}: no direct requests"
                );
                assert!(
                    via["requests"].as_u64().unwrap_or(0) > 0,
                    "{name}: no requests via the gateway"
                );
                assert_eq!(via["errors"], 0, "{name}: errors via the gateway");
            }
        }
    }
}
