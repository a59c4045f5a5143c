//! The benchmark: what the gateway costs compared with talking to the backend directly, measured
//! in the same run.
//!
//! ```text
//! cargo run --release -p e2e --bin bench -- [--short] [--json out.json] [--gateway PATH] [--write-benchmarks-md]
//! ```
//!
//! This binary is the command line and the order of the run; the parts (static backend, load
//! generator, scenarios, report) are `e2e::bench`, whose module docs explain the method. It also
//! serves as the static backend: `bench serve-backend` is this binary started again by the run.
//!
//! `--short` runs every scenario for about a second (CI checks that the table is produced);
//! the full mode is what `BENCHMARKS.md` shows, and `--write-benchmarks-md` rewrites that file
//! (keeping the hand-written notes below its marker).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use e2e::bench::load::LOAD_GENERATOR;
use e2e::bench::memory::{mb, raise_nofile_limit, rss_bytes, RssSampler};
use e2e::bench::report::{self, Results, Row};
use e2e::bench::setup::{self, Setup};
use e2e::bench::{
    authentication, backend, fairness, openapi, overload, peers, ready, real, rebuild, throughput,
    watch, BoxError, Settings,
};
use e2e::certs::install_crypto;
use e2e::harness;

#[derive(Parser, Debug)]
#[command(about = "Gateway overhead benchmarks: direct vs via the gateway, same run")]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// A few seconds per scenario (CI); the table is produced but targets mean little.
    #[arg(long)]
    short: bool,
    /// Where to write the JSON results [default: <workspace>/target/bench/bench.json].
    #[arg(long)]
    json: Option<PathBuf>,
    /// The gateway binary [default: build `aggregation-gateway` with this binary's profile].
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// Rewrite <workspace>/BENCHMARKS.md with this run's table and machine.
    #[arg(long)]
    write_benchmarks_md: bool,
    /// Watch streams held open [default: 10000, short: 200].
    #[arg(long)]
    watch_streams: Option<usize>,
    /// Measuring window per side of a throughput scenario, seconds [default: 5, short: 1].
    #[arg(long)]
    duration: Option<f64>,
    /// Run only the scenarios whose name contains this text (e.g. "small GET"), for profiling
    /// one of them; the table then has just those rows.
    #[arg(long, conflicts_with = "write_benchmarks_md")]
    only: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// A soak with faults (issue 41): mixed traffic while backends are killed, frozen and
    /// restarted and APIServices come and go; fails on a lost, misrouted or stalled request.
    Soak {
        /// How long the traffic and the faults run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// In front of the real control plane (KUBEBUILDER_ASSETS, SAMPLE_APISERVER), where
        /// kube-apiserver is restarted and certificates rotated too; otherwise the fixtures.
        #[arg(long)]
        real: bool,
    },
    /// Internal: the static backend (prints `listening on ADDR`).
    #[command(hide = true)]
    ServeBackend {
        #[arg(long)]
        tls_cert: Option<PathBuf>,
        #[arg(long)]
        tls_key: Option<PathBuf>,
        /// Also serve this file at `/bench/static/<file name>` (repeatable).
        #[arg(long)]
        static_file: Vec<PathBuf>,
    },
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    install_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Some(Sub::ServeBackend {
            tls_cert,
            tls_key,
            static_file,
        }) => runtime.block_on(backend::serve(tls_cert, tls_key, static_file)),
        Some(Sub::Soak { seconds, real }) => {
            runtime.block_on(soak(Duration::from_secs(seconds), real))
        }
        None => runtime.block_on(run(cli)),
    }
}

async fn soak(length: Duration, real: bool) -> Result<(), BoxError> {
    raise_nofile_limit();
    let (report, on) = if real {
        eprintln!("bench: soak with faults for {length:?}, in front of the real control plane");
        (
            e2e::bench::soak::real::run(length).await?,
            "real control plane",
        )
    } else {
        eprintln!("bench: soak with faults for {length:?}, on the fixtures");
        (e2e::bench::soak::fixtures::run(length).await?, "fixtures")
    };
    println!("| soak (issue 41, {on}) | |\n|---|---|\n{}", report.table());
    let failures = report.failures();
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    let short = cli.short;
    let settings = Settings {
        short,
        warmup: Duration::from_secs_f64(if short { 0.3 } else { 1.0 }),
        duration: Duration::from_secs_f64(cli.duration.unwrap_or(if short { 1.0 } else { 5.0 })),
        watch_streams: cli
            .watch_streams
            .unwrap_or(if short { 200 } else { 10_000 }),
        repeats: if short { 3 } else { 15 },
        only: cli.only.clone(),
    };
    let (nofile, nofile_max) = raise_nofile_limit();
    eprintln!("bench: open-file limit {nofile} (hard {nofile_max})");
    let gateway_binary = setup::gateway_binary(cli.gateway.clone()).await?;
    eprintln!("bench: gateway binary {}", gateway_binary.display());

    let mut results = Results::default();

    // In-process first, while nothing else competes for the CPU.
    if settings.wants("route-table rebuild") || settings.wants("discovery rebuild") {
        eprintln!("bench: route table and discovery rebuilds (in process)");
        rebuild::run(&settings, &mut results);
    }

    let setup = Setup::start(&gateway_binary).await?;
    let gateway_pid = setup.gateway.process.id();
    let tls_pid = setup.tls_backend.process.id();

    // Idle: the gateway has started, synced and served a handful of requests.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_gateway = rss_bytes(gateway_pid).unwrap_or(0);
    let idle_backend = rss_bytes(tls_pid).unwrap_or(0);

    let sampler = RssSampler::start(vec![gateway_pid, tls_pid]);
    throughput::run(&settings, &setup, &mut results).await?;
    let peaks = sampler.finish().await;

    results.rows.push(
        Row::new("resident memory", "RSS idle", "MB")
            .values(Some(mb(idle_backend)), Some(mb(idle_gateway)))
            .target("< 30 MB", Some(mb(idle_gateway) < 30.0))
            .note("direct = the TLS static backend process"),
    );
    let load_gateway = peaks.get(&gateway_pid).copied().unwrap_or(0);
    let load_backend = peaks.get(&tls_pid).copied().unwrap_or(0);
    results.rows.push(
        Row::new("resident memory", "RSS peak under load", "MB")
            .values(Some(mb(load_backend)), Some(mb(load_gateway)))
            .note("peak over all throughput scenarios (sampled every 50 ms)"),
    );

    // Before the watch and overload scenarios, which leave thousands of sockets closing behind
    // them; after the RSS sampler, so the peers' load does not count as the gateway's peak.
    if settings.wants(fairness::NAME) {
        fairness::run(&settings, &setup, &mut results).await?;
    }
    if settings.wants(peers::NAME) {
        peers::run(&settings, &setup, &mut results).await?;
    }
    if settings.wants("watch streams held open") {
        watch::run(&settings, &setup, idle_gateway, &mut results).await?;
    }
    if settings.wants(overload::NAME) {
        overload::run(&settings, &setup, idle_gateway, &mut results).await?;
    }
    if settings.wants("start to ready") {
        ready::run(&settings, &setup, &mut results).await?;
    }
    drop(setup);
    real::run(&settings, &gateway_binary, &mut results).await?;
    if settings.wants(authentication::NAME) {
        authentication::run(&settings, &gateway_binary, &mut results).await?;
    }
    if settings.wants(openapi::NAME) {
        openapi::run(&settings, &gateway_binary, idle_gateway, &mut results).await?;
    }

    let table = report::markdown_table(&results.rows);
    println!("\n{table}");
    println!("load generator: {LOAD_GENERATOR}");
    if !results.sections.is_empty() {
        println!("\n{}", report::sections_markdown(&results.sections));
    }

    let machine = report::machine_facts();
    let mode = if short { "short" } else { "full" };
    let doc = report::json_document(
        mode,
        &machine,
        &gateway_binary,
        &settings,
        nofile,
        &results,
        &table,
    );
    let json_path = cli
        .json
        .clone()
        .unwrap_or_else(|| harness::workspace_root().join("target/bench/bench.json"));
    if let Some(parent) = json_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&json_path, serde_json::to_vec_pretty(&doc)?)?;
    println!("JSON written to {}", json_path.display());
    if cli.write_benchmarks_md {
        let path = harness::workspace_root().join("BENCHMARKS.md");
        report::write_benchmarks_md(&path, &table, &results, &machine, mode)?;
        println!("{} updated", path.display());
    }
    Ok(())
}
