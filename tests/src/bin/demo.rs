//! `demo`: the gateway doing its job with no cluster, the README's first command.
//!
//! ```text
//! cargo run -p e2e --bin demo -- [--dir DIR] [--secure-port PORT] [--core-port PORT]
//! ```
//!
//! A core server and two aggregated API servers (the end-to-end tests' fixtures), the real
//! gateway in front of them, and a kubeconfig for it; see `e2e::demo`.

use std::path::PathBuf;

use clap::Parser;
use e2e::demo::{self, Options};

#[derive(Parser, Debug)]
#[command(
    about = "The gateway in front of a core server and two aggregated API servers, with no cluster"
)]
struct Args {
    /// Where the kubeconfig and the gateway's serving certificate go [default: target/demo]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The gateway's port (0: any free one).
    #[arg(long, default_value_t = 8443)]
    secure_port: u16,
    /// The core server's port, where the gateway looks for it by default (0: any free one).
    #[arg(long, default_value_t = 8080)]
    core_port: u16,
    /// The gateway binary [default: built with cargo from this workspace]
    #[arg(long)]
    gateway: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let options = Options {
        dir: args.dir.unwrap_or_else(demo::default_dir),
        secure_port: args.secure_port,
        core_port: args.core_port,
        gateway: args.gateway,
    };
    // Exits rather than returns: the thread reading stdin may still be blocked in a read.
    match demo::run(options).await {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(1);
        }
    }
}
