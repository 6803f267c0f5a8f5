//! The `oncekv` command: a thin shell over the libraries. `serve` runs a
//! node; the other commands are clients of a running cluster.

/// Writes to stdout like `print!`; a closed stdout (`oncekv ... | head`)
/// ends the program quietly instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if write!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

/// `say!` with a newline, like `println!`.
macro_rules! sayln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

/// The process's allocator: mimalloc (feature `mimalloc`, on by default),
/// which `docs/benchmarks.md` measured on the write path.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod certs;
mod commands;
mod completion;
mod exit;
mod links;
mod netns;
mod serve;
mod session_file;
mod verify;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

const EXIT_CODES: &str = exit::TABLE;

/// oncekv: a replicated, durable key-value store that applies every
/// mutating request exactly once.
#[derive(Debug, Parser)]
#[command(name = "oncekv", version, about, long_about = None, propagate_version = true, after_help = EXIT_CODES)]
struct Cli {
    /// Log filter (for example `info`, `oncekv_server=debug`).
    #[arg(long, global = true, env = "ONCEKV_LOG", default_value = "warn")]
    log: String,

    #[command(flatten)]
    connection: commands::Connection,

    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run a node (with no flags: a single-node cluster on 127.0.0.1:7379
    /// with data in ./oncekv-data).
    Serve(Box<serve::ServeArgs>),
    /// Prove exactly-once under faults: run a workload against a local
    /// cluster (or --endpoints) while injecting faults, then check it.
    Verify(verify::VerifyArgs),
    /// Hold a network of hosts (network namespaces, root) whose peer
    /// links pass through shaped proxies (delay, jitter, loss), for
    /// benchmarks across hosts, until interrupted.
    Netns(netns::NetnsArgs),
    /// Make the certificates of a TLS cluster: a CA, node and client
    /// certificates (PEM files).
    Certs(certs::CertsArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) for every subcommand and flag.
    Completion(completion::CompletionArgs),
    /// Print the manual page (roff), or write one per subcommand with --dir.
    Man(completion::ManArgs),
    #[command(flatten)]
    Client(commands::ClientCommand),
}

fn main() -> ExitCode {
    oncekv_server::sync::abort_on_panic();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    if let Some(serve) = matches.subcommand_matches("serve") {
        refuse_client_flags(serve);
    }
    let endpoints_given = matches!(
        matches.value_source("endpoints"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match &cli.command {
        Commands::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.worker_threads())
            .enable_all()
            .build(),
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Commands::Serve(args) => runtime.block_on(serve::run(*args)),
        Commands::Certs(args) => certs::run(args, cli.connection.login.as_deref()),
        Commands::Completion(args) => completion::run_completion(&args, Cli::command()),
        Commands::Man(args) => completion::run_man(&args, Cli::command()),
        Commands::Netns(args) => runtime.block_on(netns::run(args)),
        Commands::Verify(args) => {
            runtime.block_on(verify::run(&cli.connection, args, endpoints_given))
        }
        Commands::Client(command) => {
            match runtime.block_on(commands::run(&cli.connection, command)) {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::from(commands::EXIT_ERROR)
                }
            }
        }
    }
}

/// The client-side flags every command takes, and what `serve` takes
/// instead: `serve --cert` would otherwise be accepted and ignored, and the
/// node would serve plaintext while its operator believes it is on TLS.
const CLIENT_FLAGS_OF_SERVE: [(&str, &str, &str); 5] = [
    (
        "tls_cacert",
        "--cacert",
        "a node's TLS flags are --cert-file and --key-file, and --client-ca-file to require client certificates",
    ),
    (
        "tls_client_cert",
        "--cert",
        "a node's certificate is --cert-file (and --peer-cert-file for the peer port)",
    ),
    (
        "tls_client_key",
        "--key",
        "a node's private key is --key-file (and --peer-key-file for the peer port)",
    ),
    (
        "endpoints",
        "--endpoints",
        "a node's own addresses are --listen-client and --listen-peer, its cluster --initial-cluster or --join",
    ),
    (
        "login",
        "--user",
        "users are created with `oncekv user add` against a running node",
    ),
];

/// Exits with a usage error when `serve` was given a client-side flag on
/// its command line; warns when one comes from the environment (set for
/// the client commands of the same shell) and is ignored.
fn refuse_client_flags(serve: &clap::ArgMatches) {
    for (id, flag, instead) in CLIENT_FLAGS_OF_SERVE {
        match serve.value_source(id) {
            Some(ValueSource::CommandLine) => {
                let mut command = Cli::command();
                command
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!(
                            "{flag} is a client flag, which `oncekv serve` does not take: {instead}"
                        ),
                    )
                    .exit();
            }
            Some(ValueSource::EnvVariable) => {
                eprintln!(
                    "warning: {flag} from the environment is a client setting; `oncekv serve` ignores it"
                );
            }
            _ => {}
        }
    }
}
