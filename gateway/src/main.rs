//! The `aggregation-gateway` binary: parse, validate (exit 64 on a bad value), run.

use std::process::ExitCode;

use clap::Parser;
use gateway_config::Cli;

/// mimalloc: about half the instructions of glibc's malloc and free per request, which
/// allocates some 50 blocks; `memory` makes it hand memory back after peaks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// sysexits' EX_USAGE: the configuration was refused.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    // One rustls crypto provider for the process, before any TLS configuration is built.
    gateway_config::tls::install_crypto_provider();
    let Settings {
        check_only,
        options,
        config,
        log_filter,
    } = match Settings::read() {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let (runtime, threads) = match runtime(config.runtime) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("aggregation-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(code) = runtime.block_on(check_core(&config.core)) {
        return code;
    }
    if let Err(e) = aggregation_gateway::auth::check_authentication_config(&config.authn) {
        return refused(&gateway_config::ConfigError::new(
            "authentication-config",
            e,
        ));
    }
    if check_only {
        match serde_saphyr::to_string(&options) {
            Ok(yaml) => print!("# configuration is valid\n{yaml}"),
            Err(_) => println!("configuration is valid"),
        }
        return ExitCode::SUCCESS;
    }
    aggregation_gateway::logging::init(&config.logging, log_filter);
    match raise_open_file_limit() {
        Ok(limit) => tracing::info!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    runtime.spawn(aggregation_gateway::memory::collect_after_peaks(threads));
    match runtime.block_on(aggregation_gateway::app::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let chain = aggregation_gateway::error::chain(&e);
            tracing::error!(error = %chain, "cannot start");
            eprintln!("aggregation-gateway: {chain}");
            ExitCode::FAILURE
        }
    }
}

/// The command line and the file it names, validated: what to run, or the exit code that
/// refuses it (after one line on stderr saying what to fix).
struct Settings {
    check_only: bool,
    options: gateway_config::Options,
    config: gateway_config::Config,
    log_filter: tracing_subscriber::EnvFilter,
}

impl Settings {
    fn read() -> Result<Self, ExitCode> {
        let cli = match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => {
                // --help and --version.
                let _ = e.print();
                return Err(ExitCode::SUCCESS);
            }
            Err(e) => {
                let line = gateway_config::options::cli_error_line(&e);
                return Err(refused(&line));
            }
        };
        let check_only = cli.check_config;
        let (options, config) = gateway_config::load(cli).map_err(|e| refused(&e))?;
        // The filter syntax is the logger's to judge; asking it here keeps --check-config and a
        // real start refusing the same values.
        let log_filter = aggregation_gateway::logging::filter(&config.logging.level)
            .map_err(|message| refused(&gateway_config::ConfigError::new("log-level", message)))?;
        Ok(Self {
            check_only,
            options,
            config,
            log_filter,
        })
    }
}

/// The runtime `--worker-threads` asks for, and how many threads run its tasks.
///
/// One thread is the default. Where the gateway shares two cores with its clients and backend
/// (a sidecar beside kube-apiserver), tokio's multi-thread scheduler cost about half as much CPU
/// again per proxied request as the current-thread one, with one worker as with two: requests'
/// memory, wake-ups and metric counters move between threads and caches (BENCHMARKS.md, "The
/// runtime's shape"). Heavy work (OpenAPI merges, gzip) runs on the blocking pool either way.
fn runtime(
    shape: gateway_config::RuntimeShape,
) -> std::io::Result<(tokio::runtime::Runtime, usize)> {
    use gateway_config::RuntimeShape;
    let (mut builder, threads) = match shape {
        RuntimeShape::CurrentThread => (tokio::runtime::Builder::new_current_thread(), 1),
        RuntimeShape::MultiThread(n) => (tokio::runtime::Builder::new_multi_thread(), n as usize),
        RuntimeShape::PerCpu => (
            tokio::runtime::Builder::new_multi_thread(),
            // A Pod's CPU limit (the cgroup's quota) lowers this, as GOMAXPROCS-aware Go does.
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
    };
    if !matches!(shape, RuntimeShape::CurrentThread) {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .on_thread_park(aggregation_gateway::memory::collect_if_asked)
        .enable_all()
        .build()?;
    Ok((runtime, threads))
}

/// The settings of the core that only a look at its files can judge (certificates, keys, the
/// kubeconfig), refused as a bad flag is.
async fn check_core(core: &gateway_config::CoreConfig) -> Result<(), ExitCode> {
    let Err(e) = aggregation_gateway::backend::core::check_settings(core).await else {
        return Ok(());
    };
    let message = e.to_string();
    // The error names its flag already; the refusal line names it once.
    let message = message
        .strip_prefix(&format!("--{} ", e.flag()))
        .unwrap_or(&message);
    Err(refused(&gateway_config::ConfigError::new(
        e.flag(),
        message,
    )))
}

/// One line on stderr saying what was refused, and the exit code for a refused configuration.
fn refused(what: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("aggregation-gateway: {what}");
    ExitCode::from(EXIT_CONFIG)
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does at start (so
/// kube-apiserver runs with it): every client connection, and every watch's connection to the
/// core, is a descriptor. Returns the soft limit now in force.
fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            lim = raised;
        }
    }
    Ok(lim.rlim_cur)
}
