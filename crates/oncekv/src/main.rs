//! The `oncekv` command: a thin shell over the libraries. `serve` runs a
//! node; the other commands are clients of a running cluster.

mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// oncekv: a replicated, durable key-value store that applies every
/// mutating request exactly once.
#[derive(Debug, Parser)]
#[command(name = "oncekv", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log filter (for example `info`, `oncekv_server=debug`).
    #[arg(long, global = true, env = "ONCEKV_LOG", default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run a node (with no flags: a single-node cluster on 127.0.0.1:7379
    /// with data in ./oncekv-data).
    Serve(Box<serve::ServeArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Commands::Serve(args) => runtime.block_on(serve::run(*args)),
    }
}
