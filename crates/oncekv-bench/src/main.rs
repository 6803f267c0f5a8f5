//! `oncekv-bench`: a closed-loop load generator, a binary of its own so
//! that the product binary (`oncekv`) carries neither its histograms nor
//! etcd's client. Its flags and their checks, and the run: connect the
//! target's clients, run the closed loop (`closed_loop`), print the report
//! (`report`). The targets are oncekv (`oncekv`) and, in a build with the
//! `etcd` feature, etcd (`etcd`), under the same workloads (`workload`);
//! CPU use is read from `/proc` (`cpu`). It reaches a cluster with the
//! same flags as the `oncekv` commands (`oncekv_client::cli`).

mod closed_loop;
mod cpu;
#[cfg(feature = "etcd")]
mod etcd;
mod fill;
mod oncekv;
mod report;
mod watch;
mod workload;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};
use closed_loop::{Measured, Plan, Stop};
use oncekv_client::cli::{Connection, Output};
use report::{Report, Settings};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;
use workload::{Shape, Workload};

/// The process's allocator: mimalloc (feature `mimalloc`, on by default),
/// as in the `oncekv` binary, so the client measured is the same.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code: the run could not be made, or no operation completed (the
/// code `oncekv`'s table gives other errors).
const EXIT_ERROR: u8 = 1;

/// Exit code: the flags do not make a run (`oncekv`'s usage error).
const EXIT_USAGE: u8 = 2;

/// Largest key size accepted (oncekv's own limit is lower; it answers
/// with an error per operation).
const KEY_BYTES_MAX: usize = 64 * 1024;

/// Largest value size accepted.
const VALUE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most tasks.
const CONCURRENCY_MAX: usize = 100_000;

/// Most watchers.
const WATCHERS_MAX: usize = 100_000;

/// Most watchers per connection: an oncekv node takes 256 streams per
/// HTTP/2 connection by default (`--streams-per-connection-max`).
const WATCHERS_PER_CONNECTION_MAX: usize = 200;

/// The endpoint of a local etcd when --endpoints is not given.
const ETCD_DEFAULT_ENDPOINT: &str = "127.0.0.1:2379";

/// What to say when `--target etcd` is asked of a build without it.
#[cfg(not(feature = "etcd"))]
const NO_ETCD: &str = "this oncekv-bench was built without etcd support. Build it with \
    `cargo xtask build-bench` (target/release/oncekv-bench, with the protoc that ships in a \
    crate), or `cargo build --release -p oncekv-bench --features etcd` with PROTOC set to a \
    protoc binary";

const AFTER_HELP: &str = "\
Examples:
  oncekv-bench --workload put --mode session --concurrency 64 --duration 10s
  oncekv-bench --workload mixed --read-ratio 0.9 --concurrency 64 --connections 4
  oncekv-bench --workload cas --keys 10 --ops 10000 --warmup 0s -o json
  oncekv-bench --target etcd --endpoints 127.0.0.1:2379 --workload put --mode session
  oncekv-bench --workload transfer --mode session --keys 1000 --concurrency 32
  oncekv-bench --workload watch --watchers 1000 --connections 10 --concurrency 4 --rate 100

The loop is closed: each task sends one operation, waits for its answer,
then sends the next, so --concurrency operations are in flight. Operations
that begin during --warmup are not measured; the measured part ends after
--duration, or after --ops operations (completed or failed). Latency is
per operation (a CAS: its read and its swap; an etcd transfer: its reads,
its write and its retries).

--workload transfer moves one unit between two distinct random accounts:
on oncekv one transaction of two INCRs (-1, +1); on etcd, which has no
INCR, a read of both accounts then a Txn guarded by both keys' mod
revisions that writes both balances, retried on conflict (the retries are
reported as conflicts).

--workload watch is not a closed loop: --watchers watchers of one prefix,
dealt over --connections connections (at most 200 each), and --concurrency
writers putting keys under it at --rate writes/s in all. Each value carries
the time its write was sent; the report gives the delivery latency (write
sent to event seen, per event and watcher) as percentiles, events delivered
per second, and events expected but never seen. The writers share one extra
connection; --ops does not apply.

Modes: plain (no deduplication: at-least-once, like an etcd Put), session
(exactly-once on one session per connection, its tasks pipelined up to the
session's window), key (an idempotency key per request).

--target etcd (a build with the `etcd` feature: `cargo xtask build-bench`)
runs the same workloads on etcd v3. There, plain is Put/Get/Txn; session
emulates exactly-once as a user can: every write is one transaction that
compares a sequence key of its client (one per task) with the previous
number, then writes and stores the next number, so a retry of an applied
write is recognised; key has no counterpart. APPEND and INCR are
read-modify-write transactions on the key's revision, retried on conflict.

The report gives throughput, latency percentiles (HDR histogram), errors
by kind, CAS conflicts, and CPU: this client's (percent of one core) and
the machine's (percent of all cores), over the measured part. -o json
prints one object for scripts.

Exit codes: 0 measured; 1 the run could not be made, or no operation
completed; 2 usage error.";

/// How writes are made safe to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// No deduplication: at-least-once, like etcd.
    Plain,
    /// Exactly-once on one session per connection, pipelined up to its
    /// window (on etcd: a sequence-key transaction per write).
    Session,
    /// An idempotency key per request (oncekv only).
    Key,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Session => "session",
            Mode::Key => "key",
        }
    }
}

/// The system measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// An oncekv cluster.
    Oncekv,
    /// An etcd v3 cluster (a build with the `etcd` feature).
    Etcd,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Oncekv => "oncekv",
            Target::Etcd => "etcd",
        }
    }
}

/// Which etcd members the clients talk to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EtcdRoute {
    /// Only the leader (found by asking each endpoint for its status), as
    /// oncekv's client does: writes take no forwarding hop.
    Leader,
    /// All endpoints, round-robin (etcd-client's own balancing): a
    /// follower forwards the writes it receives to the leader.
    Balanced,
}

/// The workload flags of `oncekv-bench`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct BenchArgs {
    /// What each operation does.
    #[arg(long, value_enum, default_value_t = Workload::Put)]
    workload: Workload,
    /// How writes are made safe to retry (reads need nothing).
    #[arg(long, value_enum, default_value_t = Mode::Session)]
    mode: Mode,
    /// The system measured; its client addresses go in --endpoints
    /// (for etcd the default is 127.0.0.1:2379).
    #[arg(long, value_enum, default_value_t = Target::Oncekv)]
    target: Target,
    /// With --target etcd: which members the clients send to.
    #[arg(long, value_enum, default_value_t = EtcdRoute::Leader)]
    etcd_route: EtcdRoute,
    /// Tasks, each with one operation in flight (closed loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Independent client connections the tasks are dealt over
    /// round-robin (1..=--concurrency). Each is its own client and, in
    /// session mode, its own session.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Length of the measured part.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Measure this many operations (completed or failed) instead of a
    /// duration.
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    ops: Option<u64>,
    /// Unmeasured warm-up before the measured part.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Distinct keys, drawn uniformly.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Bytes per key: a prefix byte and the key's number, zero-padded.
    #[arg(long, default_value_t = 8)]
    key_bytes: usize,
    /// Bytes per value written (PUT, APPEND, CAS).
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
    /// With --workload mixed: the share of operations that are
    /// linearizable GETs, 0..=1 (the rest are PUTs) [default: 0.9].
    #[arg(long, value_name = "RATIO", allow_negative_numbers = true)]
    read_ratio: Option<f64>,
    /// With --workload watch: watchers of the prefix, dealt over
    /// --connections [default: 1000].
    #[arg(long, value_name = "N")]
    watchers: Option<usize>,
    /// With --workload watch: writes per second, all writers together
    /// [default: 100].
    #[arg(long, value_name = "WRITES_PER_S")]
    rate: Option<f64>,
    /// oncekv only: a write goes alone while fewer than N calls of its
    /// connection are in flight; beyond, the writes that are ready go
    /// together as one batch message [default: the client's, 4; a large
    /// N turns batching off].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    batch_after_calls: Option<u32>,
    /// With --workload put: write keys 0, 1, 2, ... in order (one
    /// sequence shared by all tasks, wrapping at --keys) instead of random
    /// keys; `--keys N --ops N --warmup 0s` writes every key once.
    #[arg(long)]
    fill: bool,
    /// Instead of a run: open N sessions and leave them open, without
    /// keep-alive (each lives an hour of cluster time), with --concurrency
    /// tasks over --connections clients; prints one JSON object (opened,
    /// retried, failed, elapsed_s, opens_per_s). With --target etcd: grant
    /// N leases of an hour (etcd's sessions are leases).
    #[arg(long, value_name = "N", conflicts_with = "fill")]
    open_sessions: Option<u64>,
}

/// The watch workload's own settings.
#[derive(Clone, Copy, Debug, PartialEq)]
struct WatchFlags {
    watchers: usize,
    rate: f64,
}

impl BenchArgs {
    /// The run the flags describe, or what is wrong with them.
    fn plan(&self, progress: bool) -> Result<Plan, String> {
        if !(1..=CONCURRENCY_MAX).contains(&self.concurrency) {
            return Err(format!(
                "--concurrency must be 1..={CONCURRENCY_MAX}, got {}",
                self.concurrency
            ));
        }
        self.watch_flags()?;
        if self.workload != Workload::Watch
            && (self.connections == 0 || self.connections > self.concurrency)
        {
            return Err(format!(
                "--connections must be 1..={} (--concurrency: each connection needs a task), got {}",
                self.concurrency, self.connections
            ));
        }
        if self.fill && self.workload != Workload::Put {
            return Err("--fill applies to --workload put only".into());
        }
        if self.ops == Some(0) {
            return Err("--ops must be at least 1".into());
        }
        if self.ops.is_none() && self.duration.is_zero() {
            return Err("--duration must be longer than 0 (or give --ops N)".into());
        }
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if self.workload == Workload::Transfer && self.keys < 2 {
            return Err(
                "--workload transfer needs --keys 2 or more (two distinct accounts)".into(),
            );
        }
        let needed = Shape::key_bytes_needed(self.keys);
        if self.key_bytes < needed {
            return Err(format!(
                "--key-bytes {} cannot tell {} keys apart: at least {needed} are needed \
                 (a prefix byte and the key's number)",
                self.key_bytes, self.keys
            ));
        }
        if self.key_bytes > KEY_BYTES_MAX {
            return Err(format!(
                "--key-bytes must be at most {KEY_BYTES_MAX}, got {}",
                self.key_bytes
            ));
        }
        if self.value_bytes > VALUE_BYTES_MAX {
            return Err(format!(
                "--value-bytes must be at most {VALUE_BYTES_MAX}, got {}",
                self.value_bytes
            ));
        }
        let read_ratio = match (self.workload, self.read_ratio) {
            (Workload::Mixed, None) => 0.9,
            (Workload::Mixed, Some(ratio)) if (0.0..=1.0).contains(&ratio) => ratio,
            (Workload::Mixed, Some(ratio)) => {
                return Err(format!("--read-ratio must be within 0..=1, got {ratio}"));
            }
            (_, Some(_)) => return Err("--read-ratio applies to --workload mixed only".into()),
            (_, None) => 0.0,
        };
        if self.target == Target::Etcd {
            #[cfg(not(feature = "etcd"))]
            return Err(format!("--target etcd: {NO_ETCD}"));
            #[cfg(feature = "etcd")]
            if self.mode == Mode::Key {
                return Err(
                    "--mode key has no counterpart on etcd (it keeps no idempotency \
                     keys): use plain or session with --target etcd"
                        .into(),
                );
            }
        }
        Ok(Plan {
            shape: Shape {
                workload: self.workload,
                keys: self.keys,
                key_bytes: self.key_bytes,
                value_bytes: self.value_bytes,
                read_ratio,
            },
            warmup: self.warmup,
            stop: match self.ops {
                Some(n) => Stop::Operations(n),
                None => Stop::After(self.duration),
            },
            progress,
        })
    }

    /// With --workload watch, its watchers and rate (checked); else
    /// `None`, and an error if they were given.
    fn watch_flags(&self) -> Result<Option<WatchFlags>, String> {
        if self.workload != Workload::Watch {
            if self.watchers.is_some() || self.rate.is_some() {
                return Err("--watchers and --rate apply to --workload watch only".into());
            }
            return Ok(None);
        }
        let watchers = self.watchers.unwrap_or(1000);
        let rate = self.rate.unwrap_or(100.0);
        if !(1..=WATCHERS_MAX).contains(&watchers) {
            return Err(format!(
                "--watchers must be 1..={WATCHERS_MAX}, got {watchers}"
            ));
        }
        if !(rate.is_finite() && rate > 0.0 && rate <= 1e6) {
            return Err(format!(
                "--rate must be above 0 and at most 1000000, got {rate}"
            ));
        }
        let needed = watchers.div_ceil(WATCHERS_PER_CONNECTION_MAX);
        if self.connections < needed || self.connections > watchers {
            return Err(format!(
                "--connections must be {needed}..={watchers} for {watchers} watchers \
                 (at most {WATCHERS_PER_CONNECTION_MAX} watch streams per connection), got {}",
                self.connections
            ));
        }
        if self.ops.is_some() {
            return Err("--ops does not apply to --workload watch: give --duration".into());
        }
        Ok(Some(WatchFlags { watchers, rate }))
    }

    fn settings(&self, plan: &Plan) -> Settings {
        Settings {
            workload: self.workload.name(),
            mode: self.mode.name(),
            target: self.target.name(),
            etcd_route: (self.target == Target::Etcd).then_some(match self.etcd_route {
                EtcdRoute::Leader => "leader",
                EtcdRoute::Balanced => "balanced",
            }),
            concurrency: self.concurrency,
            connections: self.connections,
            warmup_s: plan.warmup.as_secs_f64(),
            ops_budget: self.ops,
            keys: self.keys,
            key_bytes: self.key_bytes,
            value_bytes: self.value_bytes,
            read_ratio: (self.workload == Workload::Mixed).then_some(plan.shape.read_ratio),
        }
    }
}

/// Measure throughput and latency of a running cluster: oncekv, or etcd
/// (--target etcd) under the same workloads.
#[derive(Debug, Parser)]
#[command(name = "oncekv-bench", version, long_about = None)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,

    /// Log filter (for example `info`, `oncekv_client=debug`).
    #[arg(long, global = true, env = "ONCEKV_LOG", default_value = "warn")]
    log: String,

    #[command(flatten)]
    connection: Connection,
}

fn main() -> ExitCode {
    // A panic in any task ends the process, as in `oncekv`: no task dies
    // quietly while the others go on measuring.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let endpoints_given = matches!(
        matches.value_source("endpoints"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = tokio::runtime::Runtime::new()
        .map_err(|error| anyhow::anyhow!("cannot start the async runtime: {error}"))
        .and_then(|runtime| runtime.block_on(run(&cli.connection, cli.args, endpoints_given)));
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::from(EXIT_ERROR)
    })
}

/// Prints `text` and a newline to stdout; a closed stdout (`oncekv-bench
/// | head`) ends the program quietly instead of panicking.
fn print_line(text: impl std::fmt::Display) {
    use std::io::Write as _;
    if writeln!(std::io::stdout(), "{text}").is_err() {
        std::process::exit(0);
    }
}

/// Runs the benchmark and prints the report. `endpoints_given`: whether
/// --endpoints was set (otherwise etcd is looked for on its default port).
pub async fn run(
    connection: &Connection,
    args: BenchArgs,
    endpoints_given: bool,
) -> anyhow::Result<ExitCode> {
    let progress = connection.output == Output::Text && std::io::stderr().is_terminal();
    let plan = match args.plan(progress) {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if let Ok(Some(flags)) = args.watch_flags() {
        return run_watch(connection, &args, endpoints_given, &plan, flags).await;
    }
    if let Some(sessions) = args.open_sessions {
        let opened = match args.target {
            Target::Oncekv => {
                fill::open_sessions(
                    &connection.endpoints,
                    connection.client_options()?,
                    sessions,
                    args.connections,
                    args.concurrency,
                )
                .await?
            }
            Target::Etcd => {
                let endpoints = etcd_endpoints(connection, endpoints_given);
                grant_etcd_leases(&endpoints, &args, connection, sessions).await?
            }
        };
        print_line(opened.json());
        return Ok(if opened.failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_ERROR)
        });
    }
    if args.fill {
        fill::start_sequential();
    }
    let measured = match args.target {
        Target::Oncekv => {
            let mut options = connection.client_options()?;
            if let Some(calls) = args.batch_after_calls {
                options.batch_after_calls = calls as usize;
            }
            let setup = oncekv::connect(
                &connection.endpoints,
                args.mode,
                args.connections,
                args.concurrency,
                options,
            )
            .await?;
            let measured = closed_loop::run(setup.tasks, plan).await;
            oncekv::close(setup.sessions).await;
            measured?
        }
        Target::Etcd => {
            let endpoints = etcd_endpoints(connection, endpoints_given);
            run_etcd(&endpoints, &args, connection, plan).await?
        }
    };
    let report = Report::new(args.settings(&plan), measured);
    match connection.output {
        Output::Json => print_line(report.json()),
        Output::Text => print_line(report.text()),
    }
    if report.operations == 0 {
        eprintln!("error: no operation completed ({} failed)", report.failed());
        return Ok(ExitCode::from(EXIT_ERROR));
    }
    Ok(ExitCode::SUCCESS)
}

/// The watch workload: its watchers and writers, its run and its report.
async fn run_watch(
    connection: &Connection,
    args: &BenchArgs,
    endpoints_given: bool,
    plan: &Plan,
    flags: WatchFlags,
) -> anyhow::Result<ExitCode> {
    let watch_plan = watch::WatchPlan {
        shape: plan.shape,
        rate: flags.rate,
        warmup: plan.warmup,
        duration: args.duration,
    };
    let prefix = watch::prefix(&plan.shape);
    let measured = match args.target {
        Target::Oncekv => {
            let options = connection.client_options()?;
            let writers = oncekv::connect(
                &connection.endpoints,
                args.mode,
                1,
                args.concurrency,
                options.clone(),
            )
            .await?;
            let watchers = oncekv::watchers(
                &connection.endpoints,
                args.connections,
                flags.watchers,
                &prefix,
                options,
            )
            .await?;
            let measured = watch::run(watchers, writers.tasks, watch_plan).await;
            oncekv::close(writers.sessions).await;
            measured?
        }
        Target::Etcd => {
            let endpoints = etcd_endpoints(connection, endpoints_given);
            run_etcd_watch(&endpoints, args, connection, &prefix, watch_plan, flags).await?
        }
    };
    let report = watch::WatchReport::new(
        watch::WatchSettings {
            mode: args.mode.name(),
            target: args.target.name(),
            etcd_route: (args.target == Target::Etcd).then_some(match args.etcd_route {
                EtcdRoute::Leader => "leader",
                EtcdRoute::Balanced => "balanced",
            }),
            watchers: flags.watchers,
            connections: args.connections,
            writers: args.concurrency,
            rate: flags.rate,
            warmup_s: plan.warmup.as_secs_f64(),
            keys: args.keys,
            value_bytes: args.value_bytes.max(watch::STAMP_BYTES),
        },
        measured,
    );
    match connection.output {
        Output::Json => print_line(report.json()),
        Output::Text => print_line(report.text()),
    }
    if report.events_seen == 0 {
        eprintln!("error: no event of a measured write was seen");
        return Ok(ExitCode::from(EXIT_ERROR));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "etcd")]
async fn run_etcd_watch(
    endpoints: &[String],
    args: &BenchArgs,
    connection: &Connection,
    prefix: &[u8],
    plan: watch::WatchPlan,
    flags: WatchFlags,
) -> anyhow::Result<watch::WatchMeasured> {
    let tls = etcd::tls_options(&connection.tls)?;
    let writers = etcd::connect(
        endpoints,
        args.mode,
        args.etcd_route,
        1,
        args.concurrency,
        connection.timeout,
        tls.clone(),
    )
    .await?;
    let watchers = etcd::watchers(
        endpoints,
        args.etcd_route,
        args.connections,
        flags.watchers,
        prefix,
        connection.timeout,
        tls,
    )
    .await?;
    watch::run(watchers, writers, plan).await
}

#[cfg(not(feature = "etcd"))]
async fn run_etcd_watch(
    _endpoints: &[String],
    _args: &BenchArgs,
    _connection: &Connection,
    _prefix: &[u8],
    _plan: watch::WatchPlan,
    _flags: WatchFlags,
) -> anyhow::Result<watch::WatchMeasured> {
    anyhow::bail!("--target etcd: {NO_ETCD}")
}

/// The etcd endpoints to load: those given, or etcd's default client
/// address (oncekv's default is not etcd's).
fn etcd_endpoints(connection: &Connection, endpoints_given: bool) -> Vec<String> {
    if endpoints_given {
        connection.endpoints.clone()
    } else {
        vec![ETCD_DEFAULT_ENDPOINT.to_string()]
    }
}

#[cfg(feature = "etcd")]
async fn grant_etcd_leases(
    endpoints: &[String],
    args: &BenchArgs,
    connection: &Connection,
    count: u64,
) -> anyhow::Result<fill::Opened> {
    etcd::grant_leases(
        endpoints,
        count,
        args.connections,
        args.concurrency,
        connection.timeout,
        etcd::tls_options(&connection.tls)?,
    )
    .await
}

#[cfg(not(feature = "etcd"))]
async fn grant_etcd_leases(
    _endpoints: &[String],
    _args: &BenchArgs,
    _connection: &Connection,
    _count: u64,
) -> anyhow::Result<fill::Opened> {
    anyhow::bail!("--target etcd: {NO_ETCD}")
}

#[cfg(feature = "etcd")]
async fn run_etcd(
    endpoints: &[String],
    args: &BenchArgs,
    connection: &Connection,
    plan: Plan,
) -> anyhow::Result<Measured> {
    let tasks = etcd::connect(
        endpoints,
        args.mode,
        args.etcd_route,
        args.connections,
        args.concurrency,
        connection.timeout,
        etcd::tls_options(&connection.tls)?,
    )
    .await?;
    closed_loop::run(tasks, plan).await
}

#[cfg(not(feature = "etcd"))]
async fn run_etcd(
    _endpoints: &[String],
    _args: &BenchArgs,
    _connection: &Connection,
    _plan: Plan,
) -> anyhow::Result<Measured> {
    anyhow::bail!("--target etcd: {NO_ETCD}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    fn plan(flags: &[&str]) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("oncekv-bench").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.plan(false)
    }

    fn refused(flags: &[&str], says: &str) {
        match plan(flags) {
            Ok(plan) => panic!("{flags:?} accepted: {plan:?}"),
            Err(message) => assert!(message.contains(says), "{flags:?}: {message}"),
        }
    }

    #[test]
    fn defaults_make_a_timed_run() {
        let plan = plan(&[]).expect("defaults are valid");
        assert_eq!(plan.stop, Stop::After(Duration::from_secs(10)));
        assert_eq!(plan.warmup, Duration::from_secs(2));
        assert_eq!(plan.shape.key_bytes, 8);
        assert_eq!(plan.shape.value_bytes, 64);
        assert_eq!(plan.shape.workload, Workload::Put);
    }

    #[test]
    fn ops_replaces_the_duration() {
        let plan = plan(&["--ops", "200"]).expect("valid");
        assert_eq!(plan.stop, Stop::Operations(200));
        refused(&["--ops", "200", "--duration", "1s"], "cannot be used with");
        refused(&["--ops", "0"], "--ops must be at least 1");
        refused(&["--duration", "0s"], "--duration must be longer than 0");
    }

    #[test]
    fn mixed_takes_a_read_ratio_within_0_and_1() {
        let mixed = plan(&["--workload", "mixed"]).expect("valid");
        assert_eq!(mixed.shape.read_ratio, 0.9);
        let half = plan(&["--workload", "mixed", "--read-ratio", "0.5"]).expect("valid");
        assert_eq!(half.shape.read_ratio, 0.5);
        refused(
            &["--workload", "mixed", "--read-ratio", "1.5"],
            "within 0..=1",
        );
        refused(
            &["--workload", "mixed", "--read-ratio", "-0.1"],
            "within 0..=1",
        );
        refused(
            &["--workload", "mixed", "--read-ratio", "NaN"],
            "within 0..=1",
        );
        refused(&["--read-ratio", "0.5"], "mixed only");
    }

    #[test]
    fn connections_must_each_have_a_task() {
        plan(&["--concurrency", "8", "--connections", "8"]).expect("valid");
        refused(&["--connections", "0"], "--connections must be 1..=16");
        refused(
            &["--concurrency", "4", "--connections", "5"],
            "--connections must be 1..=4",
        );
        refused(&["--concurrency", "0"], "--concurrency must be");
    }

    #[test]
    fn keys_must_fit_their_size() {
        plan(&["--keys", "10000000", "--key-bytes", "8"]).expect("valid");
        refused(
            &["--keys", "100000000", "--key-bytes", "8"],
            "at least 9 are needed",
        );
        refused(&["--keys", "0"], "--keys must be at least 1");
        refused(&["--key-bytes", "100000"], "--key-bytes must be at most");
        refused(
            &["--value-bytes", "100000000"],
            "--value-bytes must be at most",
        );
    }

    #[test]
    fn transfer_needs_two_accounts() {
        plan(&["--workload", "transfer", "--keys", "2"]).expect("valid");
        refused(&["--workload", "transfer", "--keys", "1"], "two distinct");
    }

    #[test]
    fn watch_takes_watchers_a_rate_and_enough_connections() {
        let cli = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("oncekv-bench").chain(flags.iter().copied()))
                .expect("parses")
                .args
        };
        let args = cli(&["--workload", "watch", "--connections", "5"]);
        assert_eq!(
            args.watch_flags(),
            Ok(Some(WatchFlags {
                watchers: 1000,
                rate: 100.0
            }))
        );
        plan(&[
            "--workload",
            "watch",
            "--watchers",
            "10",
            "--concurrency",
            "1",
        ])
        .expect("valid");
        refused(&["--workload", "watch"], "--connections must be 5..=1000");
        refused(
            &[
                "--workload",
                "watch",
                "--watchers",
                "3",
                "--connections",
                "4",
            ],
            "--connections must be 1..=3",
        );
        refused(
            &["--workload", "watch", "--watchers", "1", "--rate", "0"],
            "--rate must be above 0",
        );
        refused(
            &["--workload", "watch", "--watchers", "1", "--ops", "5"],
            "--ops does not apply",
        );
        refused(&["--watchers", "10"], "watch only");
        refused(&["--rate", "10"], "watch only");
    }

    #[test]
    fn etcd_has_no_idempotency_keys() {
        #[cfg(feature = "etcd")]
        {
            plan(&["--target", "etcd", "--mode", "session"]).expect("valid");
            refused(
                &["--target", "etcd", "--mode", "key"],
                "use plain or session",
            );
        }
        #[cfg(not(feature = "etcd"))]
        refused(&["--target", "etcd"], "cargo xtask build-bench");
    }
}
