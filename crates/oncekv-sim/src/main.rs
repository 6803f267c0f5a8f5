//! `oncekv-sim`: runs seeded simulations of a three-node oncekv cluster
//! under faults and checks each history; prints one line per seed and, for
//! a seed that fails, its report and the command that replays it.

use clap::Parser;
use oncekv_check::coverage::RunVerdict;
use oncekv_sim::{SimOptions, simulate};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Seeded simulations of an oncekv cluster under crashes, partitions,
/// lost replies and lost messages, checked for exactly-once.
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
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
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
}

/// Prints a line; a closed stdout (`| head`) ends the program quietly.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if writeln!(std::io::stdout(), "{line}").is_err() {
        std::process::exit(0);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first, args.seeds),
    };
    let (mut passed, mut failed, mut inconclusive) = (Vec::new(), Vec::new(), Vec::new());
    for seed in first..first.saturating_add(count) {
        let began = Instant::now();
        let options = SimOptions {
            seed,
            length: args.length,
            clients: usize::try_from(args.clients).unwrap_or(4),
            dedup: !args.unsafe_no_dedup,
            faults: true,
        };
        match simulate(&options) {
            Ok(outcome) => {
                let verdict = outcome.verdict();
                let coverage = &outcome.verification.report.coverage;
                say(format_args!(
                    "seed {seed}: {verdict:?}: {} operations, {} faults, {} leader changes, {} replays, {} replies dropped after commit, {} session expiries; {:.1} s simulated in {:.1} s; history {:016x}",
                    outcome.record.ops.len(),
                    outcome.faults.len(),
                    coverage.leader_changes,
                    coverage.replayed,
                    coverage.replies_dropped_after_commit,
                    coverage.session_expiries,
                    outcome.simulated.as_secs_f64(),
                    began.elapsed().as_secs_f64(),
                    outcome.digest,
                ));
                if verdict != RunVerdict::Pass || args.verbose {
                    for fault in &outcome.faults {
                        say(format_args!("    fault {fault}"));
                    }
                    say(format_args!("{}", outcome.verification.report.to_text()));
                }
                match verdict {
                    RunVerdict::Pass => passed.push(seed),
                    RunVerdict::Fail => failed.push(seed),
                    RunVerdict::Inconclusive => inconclusive.push(seed),
                }
            }
            Err(error) => {
                say(format_args!("seed {seed}: ERROR: {error}"));
                failed.push(seed);
            }
        }
        if failed.last() == Some(&seed) || inconclusive.last() == Some(&seed) {
            say(format_args!("    replay: cargo xtask sim --seed {seed}"));
        }
    }
    say(format_args!(
        "{} seeds: {} passed, {} failed {:?}, {} inconclusive {:?}",
        count,
        passed.len(),
        failed.len(),
        failed,
        inconclusive.len(),
        inconclusive
    ));
    if !failed.is_empty() {
        ExitCode::FAILURE
    } else if !inconclusive.is_empty() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}
