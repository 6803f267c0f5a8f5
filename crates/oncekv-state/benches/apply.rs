//! Apply throughput of the state machine: PUT, APPEND and INCR, plain vs. on
//! a session vs. under an idempotency key, with 1 and 10,000 live sessions.
//! Modes run interleaved in rounds so machine noise hits all of them; the
//! table reports medians and the ratio of each mode to plain.
//!
//! Run: `cargo bench -p oncekv-state` (`ONCEKV_BENCH_OPS`, `ONCEKV_BENCH_ROUNDS`
//! change the size).

use oncekv_state::{
    ClusterTime, Command, Entry, IdempotencyKey, Limits, LogIndex, Origin, Outcome, Proposal,
    Reply, Request, RequestHeader, RequestId, Secret, Seq, SessionId, StateMachine,
};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Session,
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

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn command(op: &str, i: usize) -> Command {
    let key = format!("key{:04}", i % 1000).into_bytes();
    match op {
        "put" => Command::Put {
            key,
            value: vec![b'v'; 64].into(),
            lease: None,
        },
        "append" => Command::Append {
            key,
            value: b"token;".to_vec(),
        },
        _ => Command::Incr { key, by: 1 },
    }
}

/// A machine with `live` sessions, and the entries of one run.
fn prepare(op: &str, mode: Mode, live: usize, ops: usize) -> (StateMachine, Vec<Entry>) {
    let mut machine = StateMachine::new(Limits::default());
    let mut index = 0u64;
    let mut sessions = Vec::with_capacity(live);
    for i in 0..live {
        index += 1;
        let secret = Secret(i as u128 + 1);
        let open = Command::OpenSession {
            ttl_ms: 3_600_000,
            window: 128,
            secret,
        };
        let entry = Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(0),
                principal: None,
                request: Request::plain(open),
            },
        };
        let Outcome::Applied(Reply::SessionOpened { session, .. }) = machine.apply(&entry) else {
            panic!("session not opened");
        };
        sessions.push((session, secret, 0u64));
    }
    let mut entries = Vec::with_capacity(ops);
    for i in 0..ops {
        index += 1;
        let origin = match mode {
            Mode::Plain => Origin::Plain,
            Mode::Key => Origin::Key(IdempotencyKey(format!("req-{i}").into_bytes())),
            Mode::Session => {
                let slot = i % sessions.len();
                let (session, secret, last): (SessionId, Secret, u64) = sessions[slot];
                let seq = last + 1;
                sessions[slot].2 = seq;
                Origin::Session(RequestHeader {
                    id: RequestId {
                        session,
                        seq: Seq(seq),
                    },
                    secret,
                    first_incomplete: Seq(seq),
                    attempt: 1,
                })
            }
        };
        let request = Request {
            origin,
            command: command(op, i),
        };
        entries.push(Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(i as u64 / 1000),
                principal: None,
                request,
            },
        });
    }
    (machine, entries)
}

fn measure(op: &str, mode: Mode, live: usize, ops: usize) -> f64 {
    let (mut machine, entries) = prepare(op, mode, live, ops);
    let start = Instant::now();
    for entry in &entries {
        let outcome = machine.apply(entry);
        debug_assert!(matches!(outcome, Outcome::Applied(_)));
        std::hint::black_box(outcome);
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: keep it quick.
    let quick = !std::env::args().any(|arg| arg == "--bench");
    let ops = env_or("ONCEKV_BENCH_OPS", if quick { 2_000 } else { 200_000 });
    let rounds = env_or("ONCEKV_BENCH_ROUNDS", if quick { 1 } else { 7 });
    let modes = [Mode::Plain, Mode::Session, Mode::Key];
    println!("apply throughput, {ops} ops per run, median of {rounds} interleaved rounds\n");
    let [a, b, c] = modes.map(Mode::name);
    println!("| op | live sessions | {a} ops/s | {b} ops/s | {c} ops/s | {b} / {a} | {c} / {a} |");
    println!("|---|---|---|---|---|---|---|");
    for op in ["put", "append", "incr"] {
        for live in [1, if quick { 100 } else { 10_000 }] {
            let mut samples = vec![Vec::new(); modes.len()];
            for _ in 0..rounds {
                for (slot, mode) in modes.iter().enumerate() {
                    samples[slot].push(measure(op, *mode, live, ops));
                }
            }
            let medians: Vec<f64> = samples.into_iter().map(median).collect();
            println!(
                "| {op} | {live} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} |",
                medians[0],
                medians[1],
                medians[2],
                medians[1] / medians[0],
                medians[2] / medians[0],
            );
        }
    }
}
