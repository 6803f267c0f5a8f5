//! The simulation in CI: a few fixed seeds must pass every checker with
//! the dangerous paths exercised; one seed run twice must give the same
//! history within one process (the simulation is deterministic there);
//! and a cluster that does not deduplicate must be caught.

use oncekv_check::coverage::RunVerdict;
use oncekv_sim::{SimOptions, SimOutcome, simulate};
use std::time::Duration;

fn run(options: SimOptions) -> SimOutcome {
    let seed = options.seed;
    simulate(&options).unwrap_or_else(|error| {
        panic!("seed {seed}: the simulation failed: {error}; replay: cargo xtask sim --seed {seed}")
    })
}

fn assert_passes(seed: u64) {
    let outcome = run(SimOptions {
        seed,
        ..SimOptions::default()
    });
    assert_eq!(
        outcome.verdict(),
        RunVerdict::Pass,
        "seed {seed}; replay: cargo xtask sim --seed {seed}\nfaults: {:#?}\n{}",
        outcome.faults,
        outcome.verification.report.to_text()
    );
}

#[test]
fn seed_1_passes() {
    assert_passes(1);
}

#[test]
fn seed_2_passes() {
    assert_passes(2);
}

#[test]
fn seed_3_passes() {
    assert_passes(3);
}

#[test]
fn a_seed_replays_the_same_history() {
    if !cfg!(tokio_unstable) {
        eprintln!("built without --cfg tokio_unstable (.cargo/config.toml): not deterministic");
        return;
    }
    let options = SimOptions {
        seed: 11,
        length: Duration::from_secs(6),
        ..SimOptions::default()
    };
    let first = run(options.clone());
    let second = run(options);
    assert!(first.record.ops.len() > 100, "too little happened");
    assert_eq!(first.record.ops.len(), second.record.ops.len());
    assert_eq!(first.faults, second.faults);
    assert_eq!(first.digest, second.digest, "two runs of seed 11 differ");
}

#[test]
fn a_cluster_without_dedup_is_caught() {
    let outcome = run(SimOptions {
        seed: 1,
        dedup: false,
        ..SimOptions::default()
    });
    assert_eq!(
        outcome.verdict(),
        RunVerdict::Fail,
        "{}",
        outcome.verification.report.to_text()
    );
}
