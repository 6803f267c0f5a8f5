//! `oncekv-sim`: runs seeded simulations of a three-node oncekv cluster
//! under faults and membership changes and checks each history; prints
//! one line per seed and, for a seed that does not pass, its faults, its
//! report and the command that replays it. A sweep
//! runs every seed in a process of its own (several at once), so a seed
//! gives the same history in a sweep as alone.

use clap::Parser;
use oncekv_check::coverage::RunVerdict;
use oncekv_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Seeded simulations of an oncekv cluster under crashes, partitions,
/// lost replies, lost connections, lost messages and membership changes
/// (leadership moved, a learner added, a follower removed, the leader
/// removed, a member replaced), checked for exactly-once.
///
/// A seed fixes the whole run: `--seed N` replays exactly the history
/// that seed N had in a sweep.
///
/// With `RUST_LOG` set (e.g. `RUST_LOG=oncekv_server=debug`), the nodes'
/// and clients' logs go to stderr, stamped with simulated time.
///
/// Exit code: 0 every seed passed, 1 a seed violated a property (or a node
/// failed), 3 no violation but a seed was inconclusive.
#[derive(Debug, Parser)]
#[command(name = "oncekv-sim", version)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// The first seed (seeds run are FIRST, FIRST+1, ...).
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run exactly this seed (same as --first SEED --seeds 1).
    #[arg(long, conflicts_with_all = ["seeds", "first"])]
    seed: Option<u64>,
    /// Simulated time of the workload in each run.
    #[arg(long, default_value = "42s", value_parser = humantime::parse_duration)]
    length: Duration,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    clients: u64,
    /// Negative control: nodes do not deduplicate (the run must fail).
    #[arg(long)]
    unsafe_no_dedup: bool,
    /// Print every run's report, not only failing ones.
    #[arg(long, short)]
    verbose: bool,
    /// Seeds of a sweep run at once, each in a process of its own
    /// [default: the number of CPUs].
    #[arg(long, short, value_parser = clap::value_parser!(u64).range(1..=256))]
    jobs: Option<u64>,
    /// Write each seed's history (`seed-N.jsonl`, readable by `oncekv
    /// check`) and report (`seed-N.html`) into this directory; in a sweep,
    /// only for seeds that do not pass.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print only the seed's own lines (how a sweep runs each seed).
    #[arg(long, hide = true)]
    one: bool,
}

/// Prints finished lines; a closed stdout (`| head`) ends the program
/// quietly.
fn print_lines(lines: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(lines.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// Prints the sweep's last line and returns its exit code.
fn summary(count: u64, verdicts: &BTreeMap<u64, SeedVerdict>) -> ExitCode {
    let with = |wanted: SeedVerdict| -> Vec<u64> {
        verdicts
            .iter()
            .filter(|(_, verdict)| **verdict == wanted)
            .map(|(seed, _)| *seed)
            .collect()
    };
    let (passed, failed, inconclusive) = (
        with(SeedVerdict::Passed),
        with(SeedVerdict::Failed),
        with(SeedVerdict::Inconclusive),
    );
    print_lines(&format!(
        "{count} seeds: {} passed, {} failed {failed:?}, {} inconclusive {inconclusive:?}\n",
        passed.len(),
        failed.len(),
        inconclusive.len(),
    ));
    if !failed.is_empty() {
        SeedVerdict::Failed.exit_code()
    } else if !inconclusive.is_empty() {
        SeedVerdict::Inconclusive.exit_code()
    } else {
        SeedVerdict::Passed.exit_code()
    }
}

/// Exit code of a seed that had no violation but was inconclusive.
const INCONCLUSIVE: u8 = 3;

/// What one seed came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SeedVerdict {
    Passed,
    Failed,
    Inconclusive,
}

impl SeedVerdict {
    fn exit_code(self) -> ExitCode {
        match self {
            SeedVerdict::Passed => ExitCode::SUCCESS,
            SeedVerdict::Failed => ExitCode::FAILURE,
            SeedVerdict::Inconclusive => ExitCode::from(INCONCLUSIVE),
        }
    }
}

/// Runs `seed` in this process and returns its lines and verdict.
fn run_here(args: &Args, seed: u64) -> (String, SeedVerdict) {
    let began = Instant::now();
    let options = SimOptions {
        seed,
        length: args.length,
        clients: usize::try_from(args.clients).unwrap_or(4),
        dedup: !args.unsafe_no_dedup,
        faults: true,
    };
    let mut lines = String::new();
    let verdict = match simulate(&options) {
        Ok(outcome) => {
            let verdict = outcome.verdict();
            let coverage = &outcome.verification.report.coverage;
            lines += &format!(
                "seed {seed}: {verdict:?}: {} operations, {} faults, {} of {} membership changes completed, {} leader changes, {} replays, {} replies dropped after commit, {} session expiries; {:.1} s simulated in {:.1} s; history {:016x}\n",
                outcome.record.ops.len(),
                outcome.record.faults.len(),
                outcome
                    .changes
                    .iter()
                    .filter(|change| change.failure.is_none())
                    .count(),
                outcome.changes.len(),
                coverage.leader_changes,
                coverage.replayed,
                coverage.replies_dropped_after_commit,
                coverage.session_expiries,
                outcome.simulated.as_secs_f64(),
                began.elapsed().as_secs_f64(),
                outcome.digest,
            );
            if let Some(dir) = &args.out
                && (verdict != RunVerdict::Pass || !args.one)
            {
                lines += &match write_outputs(dir, seed, &outcome) {
                    Ok(written) => format!("    history and report: {written}\n"),
                    Err(error) => format!("    could not write the history: {error}\n"),
                };
            }
            if verdict != RunVerdict::Pass || args.verbose {
                for fault in &outcome.faults {
                    lines += &format!("    fault {fault}\n");
                }
                lines += &format!("{}\n", outcome.verification.report.to_text());
            }
            match verdict {
                RunVerdict::Pass => SeedVerdict::Passed,
                RunVerdict::Fail => SeedVerdict::Failed,
                RunVerdict::Inconclusive => SeedVerdict::Inconclusive,
            }
        }
        Err(error) => {
            lines += &format!("seed {seed}: ERROR: {error}\n");
            SeedVerdict::Failed
        }
    };
    if verdict != SeedVerdict::Passed {
        lines += &format!("    replay: cargo xtask sim --seed {seed}\n");
    }
    (lines, verdict)
}

/// Writes `outcome`'s history and report into `dir`; says where.
fn write_outputs(
    dir: &Path,
    seed: u64,
    outcome: &oncekv_sim::SimOutcome,
) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let history = dir.join(format!("seed-{seed}.jsonl"));
    outcome
        .record
        .save(&history)
        .map_err(|error| error.to_string())?;
    let html = dir.join(format!("seed-{seed}.html"));
    let page = outcome
        .verification
        .report
        .to_html(&outcome.record, &Default::default());
    std::fs::write(&html, page).map_err(|error| format!("{}: {error}", html.display()))?;
    Ok(format!("{} {}", history.display(), html.display()))
}

/// Runs `seed` in a fresh process of this program and returns its lines
/// and verdict. A fresh process starts from the same state every time (the
/// async runtime numbers its tasks process-wide, and the numbers decide,
/// for one, the order in which a crashed host's tasks are dropped).
fn run_apart(args: &Args, seed: u64) -> (String, SeedVerdict) {
    let mut command = match std::env::current_exe() {
        Ok(program) => Command::new(program),
        Err(error) => {
            return (
                format!("seed {seed}: ERROR: cannot find this program to run the seed: {error}\n"),
                SeedVerdict::Failed,
            );
        }
    };
    command
        .args(["--one", "--seed", &seed.to_string()])
        .args([
            "--length",
            &humantime::format_duration(args.length).to_string(),
        ])
        .args(["--clients", &args.clients.to_string()])
        .stdin(Stdio::null());
    if args.unsafe_no_dedup {
        command.arg("--unsafe-no-dedup");
    }
    if args.verbose {
        command.arg("--verbose");
    }
    if let Some(dir) = &args.out {
        command.arg("--out").arg(dir);
    }
    let output = match command.output() {
        Ok(output) => output,
        Err(error) => {
            return (
                format!("seed {seed}: ERROR: cannot start its process: {error}\n"),
                SeedVerdict::Failed,
            );
        }
    };
    let mut lines = String::from_utf8_lossy(&output.stdout).into_owned();
    let verdict = match output.status.code() {
        Some(0) => SeedVerdict::Passed,
        Some(code) if code == i32::from(INCONCLUSIVE) => SeedVerdict::Inconclusive,
        Some(1) => SeedVerdict::Failed,
        _ => {
            lines += &format!(
                "seed {seed}: ERROR: its process ended with {}\n{}    replay: cargo xtask sim --seed {seed}\n",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            SeedVerdict::Failed
        }
    };
    (lines, verdict)
}

/// Runs the seeds `first..first + count`, `jobs` at once, and prints each
/// seed's lines in seed order as soon as they and all before them are in.
fn sweep(args: &Args, first: u64, count: u64, jobs: u64) -> BTreeMap<u64, SeedVerdict> {
    let next = AtomicU64::new(first);
    let end = first.saturating_add(count);
    let (done_tx, done_rx) = mpsc::channel();
    let mut verdicts = BTreeMap::new();
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(count) {
            let done_tx = done_tx.clone();
            let next = &next;
            scope.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    if done_tx.send((seed, run_apart(args, seed))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        let mut waiting = BTreeMap::new();
        let mut due = first;
        for (seed, result) in done_rx {
            waiting.insert(seed, result);
            while let Some((lines, verdict)) = waiting.remove(&due) {
                print_lines(&lines);
                verdicts.insert(due, verdict);
                due += 1;
            }
        }
    });
    verdicts
}

/// Stamps log lines with simulated time (0 outside a simulation).
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let at = turmoil::sim_elapsed().unwrap_or_default();
        write!(w, "{:>9.3}s", at.as_secs_f64())
    }
}

/// With `RUST_LOG` set (e.g. `oncekv_server=debug`), the nodes' and
/// clients' logs go to stderr, stamped with simulated time.
fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(SimTime)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    }
}

fn main() -> ExitCode {
    oncekv_server::sync::abort_on_panic();
    init_logging();
    let args = Args::parse();
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first, args.seeds),
    };
    if args.one || count == 1 {
        let (lines, verdict) = run_here(&args, first);
        print_lines(&lines);
        if args.one {
            return verdict.exit_code();
        }
        return summary(count, &BTreeMap::from([(first, verdict)]));
    }
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| u64::try_from(n.get()).unwrap_or(1))
    });
    let verdicts = sweep(&args, first, count, jobs);
    summary(count, &verdicts)
}
