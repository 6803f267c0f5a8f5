//! Memory and scale of the state machine: what one live session, one
//! completion record, one idempotency key and one stored key cost in real
//! heap bytes and in resident memory, next to what the byte budgets count
//! for the same state; apply throughput with many live sessions; and how
//! long a copy of the state (`clone()`, what a node's snapshot holds the
//! state lock for), `snapshot()`, `state_digest()` and `restore()` take at
//! those sizes.
//!
//! Heap bytes come from a counting global allocator installed in this
//! binary (`stats_alloc`: a wrapper around the system allocator that counts
//! the bytes and blocks requested and freed; the workspace forbids unsafe
//! code, so the wrapper comes from that crate). Each case runs in a child
//! process of its own, so that the growth of its resident set (`VmRSS`,
//! which adds the allocator's per-block headers, rounding and free space) is
//! its own; the parent prints the tables.
//!
//! Run: `cargo bench -p oncekv-state --bench memory` (`ONCEKV_BENCH_OPS`
//! changes the entries per throughput run, `ONCEKV_BENCH_ROUNDS` the rounds;
//! `ONCEKV_MEMORY_CASE=scenario:n` runs one case alone and prints its raw
//! result line, `ONCEKV_BENCH_VALUE_BYTES` the size of the `store` cases'
//! values, 16 bytes by default).

use oncekv_state::{
    ClusterTime, Command, CompletionRecord, ENTRY_OVERHEAD_BYTES, Entry, IdempotencyKey, KeyRecord,
    Limits, LogIndex, Origin, Outcome, Proposal, Reply, Request, RequestHeader, RequestId, Secret,
    Seq, Session, SessionId, StateMachine, StoredValue,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Command as Process, Stdio};
use std::time::Instant;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CASE_VAR: &str = "ONCEKV_MEMORY_CASE";
/// The size of each stored value in the `store` cases (16 bytes unless
/// set).
const VALUE_BYTES_VAR: &str = "ONCEKV_BENCH_VALUE_BYTES";
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
/// Counters the INCRs go to, preset to ten digits so that an increment
/// never changes a value's length (the store stays the same size).
const COUNTERS: usize = 1000;
/// Unacknowledged completion records per session in the `records` case.
const RECORDS_PER_SESSION: usize = 100;
/// Sessions of the hot subset in the throughput case.
const HOT: usize = 100;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The default limits, with room for a million sessions and keys (the
/// defaults allow 100,000 sessions, 1,000,000 keys and 128 MiB of them,
/// about 350,000 keys of 16 bytes), and a store of 8 GiB.
fn limits() -> Limits {
    Limits {
        sessions_max: 2_000_000,
        idempotency_keys_max: 2_000_000,
        idempotency_bytes_max: 1 << 30,
        store_bytes_max: 8 << 30,
        ..Limits::default()
    }
}

/// Live heap bytes and blocks, as the counting allocator sees them.
fn heap() -> (i64, i64) {
    let stats = GLOBAL.stats();
    (
        stats.bytes_allocated as i64 - stats.bytes_deallocated as i64,
        stats.allocations as i64 - stats.deallocations as i64,
    )
}

/// The resident set of this process, in bytes.
fn rss() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<i64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// A deterministic pseudo-random sequence (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A client's view of its session.
#[derive(Clone, Copy, Debug)]
struct Client {
    session: SessionId,
    secret: Secret,
    /// The seq of its next request.
    next: u64,
    /// The lowest seq whose reply it still awaits (its acknowledgement).
    awaited: u64,
}

impl Client {
    /// The origin of its next request; `ack` acknowledges every reply
    /// before it (a sequential client), otherwise the watermark stays.
    fn origin(&mut self, ack: bool) -> Origin {
        let seq = self.next;
        self.next += 1;
        if ack {
            self.awaited = seq;
        }
        Origin::Session(RequestHeader {
            id: RequestId {
                session: self.session,
                seq: Seq(seq),
            },
            secret: self.secret,
            first_incomplete: Seq(self.awaited),
            attempt: 1,
        })
    }
}

fn counter_key(i: usize) -> Vec<u8> {
    format!("ctr{:04}", i % COUNTERS).into_bytes()
}

fn incr(i: usize) -> Command {
    Command::Incr {
        key: counter_key(i),
        by: 1,
    }
}

/// A state machine and the log position of the next entry.
struct Driver {
    machine: StateMachine,
    index: u64,
    rng: Rng,
}

impl Driver {
    fn new() -> Driver {
        let mut driver = Driver {
            machine: StateMachine::new(limits()),
            index: 0,
            rng: Rng(7),
        };
        for i in 0..COUNTERS {
            driver.apply(
                Origin::Plain,
                Command::Put {
                    key: counter_key(i),
                    value: b"1000000000".to_vec().into(),
                    lease: None,
                },
            );
        }
        driver
    }

    /// The next entry (cluster time advances a millisecond per 1,000).
    fn entry(&mut self, origin: Origin, command: Command) -> Entry {
        self.index += 1;
        Entry {
            index: LogIndex(self.index),
            proposal: Proposal {
                time: ClusterTime(self.index / 1000),
                principal: None,
                request: Request { origin, command },
            },
        }
    }

    fn apply(&mut self, origin: Origin, command: Command) -> Reply {
        let entry = self.entry(origin, command);
        match self.machine.apply(&entry) {
            Outcome::Applied(reply) => reply,
            other => panic!("entry {} not applied: {other:?}", entry.index.0),
        }
    }

    fn open(&mut self, window: u32) -> Client {
        let secret = Secret(u128::from(self.rng.next()) << 64 | u128::from(self.rng.next()));
        let open = Command::OpenSession {
            ttl_ms: 3_600_000,
            window,
            secret,
        };
        let Reply::SessionOpened { session, .. } = self.apply(Origin::Plain, open) else {
            panic!("session not opened");
        };
        Client {
            session,
            secret,
            next: 1,
            awaited: 1,
        }
    }

    fn session_incr(&mut self, client: &mut Client, ack: bool) {
        let origin = client.origin(ack);
        let i = self.index as usize;
        self.apply(origin, incr(i));
    }
}

/// What one case is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// Open sessions (window 128) that never sent a request.
    Idle,
    /// Sessions of a sequential client: one request sent and not yet
    /// acknowledged, so one record held.
    Steady,
    /// Sessions that once had a full window of `w` requests in flight, then
    /// acknowledged them all: one record held.
    Burst(u32),
    /// Completion records of INCRs, 100 unacknowledged per session (the
    /// sessions themselves are opened before the baseline).
    Records,
    /// Keyed INCRs under distinct 16-byte idempotency keys, in increasing
    /// order or drawn at random (as clients draw them).
    Keys { random: bool },
    /// Plain PUTs of distinct 16-byte keys with 16-byte values, in
    /// increasing order or at random.
    Store { random: bool },
    /// Apply throughput with `n` live sessions.
    Apply,
}

impl Scenario {
    fn parse(name: &str) -> Option<Scenario> {
        Some(match name {
            "idle" => Scenario::Idle,
            "steady" => Scenario::Steady,
            "burst128" => Scenario::Burst(128),
            "burst1024" => Scenario::Burst(1024),
            "records" => Scenario::Records,
            "keys" => Scenario::Keys { random: false },
            "keys-random" => Scenario::Keys { random: true },
            "store" => Scenario::Store { random: false },
            "store-random" => Scenario::Store { random: true },
            "apply" => Scenario::Apply,
            _ => return None,
        })
    }

    fn name(self) -> String {
        match self {
            Scenario::Idle => "idle".into(),
            Scenario::Steady => "steady".into(),
            Scenario::Burst(window) => format!("burst{window}"),
            Scenario::Records => "records".into(),
            Scenario::Keys { random } => if random { "keys-random" } else { "keys" }.into(),
            Scenario::Store { random } => if random { "store-random" } else { "store" }.into(),
            Scenario::Apply => "apply".into(),
        }
    }

    fn describe(self) -> String {
        match self {
            Scenario::Idle => "live session, idle (window 128)".into(),
            Scenario::Steady => "live session, sequential client (1 INCR record held)".into(),
            Scenario::Burst(window) => format!(
                "live session after {window} in flight, all acknowledged (window {window}, 1 record held)"
            ),
            Scenario::Records => format!(
                "completion record, INCR reply ({RECORDS_PER_SESSION} unacknowledged per session)"
            ),
            Scenario::Keys { random } => format!(
                "idempotency key (16-byte key{}, INCR reply)",
                if random { ", random" } else { ", in order" }
            ),
            Scenario::Store { random } => format!(
                "store key (16-byte key{}, 16-byte value)",
                if random { ", random" } else { ", in order" }
            ),
            Scenario::Apply => "apply".into(),
        }
    }

    /// What the byte budgets count for this scenario's entries.
    fn budget(self) -> &'static str {
        match self {
            Scenario::Idle => "none (sessions_max)",
            Scenario::Steady | Scenario::Burst(_) | Scenario::Records => "completion_record_bytes",
            Scenario::Keys { .. } => "idempotency_bytes",
            Scenario::Store { .. } => "store_bytes",
            Scenario::Apply => "",
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn millis(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

/// One memory case, in this process: builds the state, measures it, times
/// the snapshot, the digest and a restore. Returns the result line.
fn memory_case(scenario: Scenario, n: usize, rounds: usize) -> String {
    let mut driver = Driver::new();
    let mut clients: Vec<Client> = Vec::with_capacity(n);
    if scenario == Scenario::Records {
        for _ in 0..n / RECORDS_PER_SESSION {
            let client = driver.open(128);
            clients.push(client);
        }
    }
    let snapshot_before = driver.machine.snapshot().len();
    let stats_before = driver.machine.stats();
    let (heap_before, blocks_before) = heap();
    let rss_before = rss();
    match scenario {
        Scenario::Idle => {
            for _ in 0..n {
                let client = driver.open(128);
                clients.push(client);
            }
        }
        Scenario::Steady => {
            for _ in 0..n {
                let mut client = driver.open(128);
                driver.session_incr(&mut client, true);
            }
        }
        Scenario::Burst(window) => {
            for _ in 0..n {
                let mut client = driver.open(window);
                for _ in 0..window {
                    driver.session_incr(&mut client, false);
                }
                driver.session_incr(&mut client, true);
            }
        }
        Scenario::Records => {
            for client in &mut clients {
                for _ in 0..RECORDS_PER_SESSION {
                    driver.session_incr(client, false);
                }
            }
        }
        Scenario::Keys { random } => {
            for i in 0..n {
                let key = if random {
                    format!("{:016x}", driver.rng.next())
                } else {
                    format!("idem-{i:011}")
                };
                driver.apply(Origin::Key(IdempotencyKey(key.into_bytes())), incr(i));
            }
        }
        Scenario::Store { random } => {
            let value_bytes = env_or(VALUE_BYTES_VAR, 16);
            for i in 0..n {
                let key = if random {
                    format!("{:016x}", driver.rng.next())
                } else {
                    format!("key-{i:012}")
                };
                let put = Command::Put {
                    key: key.into_bytes(),
                    value: vec![b'v'; value_bytes].into(),
                    lease: None,
                };
                driver.apply(Origin::Plain, put);
            }
        }
        Scenario::Apply => unreachable!("not a memory case"),
    }
    let (heap_after, blocks_after) = heap();
    let rss_after = rss();
    let stats = driver.machine.stats();
    let counted = match scenario {
        Scenario::Idle => 0,
        Scenario::Steady | Scenario::Burst(_) | Scenario::Records => {
            stats.completion_record_bytes - stats_before.completion_record_bytes
        }
        Scenario::Keys { .. } => stats.idempotency_bytes - stats_before.idempotency_bytes,
        Scenario::Store { .. } => stats.store_bytes - stats_before.store_bytes,
        Scenario::Apply => unreachable!("not a memory case"),
    };
    let machine = &driver.machine;
    let mut snapshot_ms = Vec::new();
    let mut digest_ms = Vec::new();
    let mut restore_ms = Vec::new();
    let mut copy_ms = Vec::new();
    let mut restored_heap = 0;
    let mut snapshot_len = 0;
    let mut snapshot_allocated = 0;
    for _ in 0..rounds {
        // What a node's snapshot holds the state lock for: a copy.
        let start = Instant::now();
        let copy = machine.clone();
        copy_ms.push(millis(start));
        drop(copy);
        let region = Region::new(GLOBAL);
        let start = Instant::now();
        let bytes = machine.snapshot();
        snapshot_ms.push(millis(start));
        snapshot_allocated = region.change().bytes_allocated;
        snapshot_len = bytes.len();
        let start = Instant::now();
        std::hint::black_box(machine.state_digest());
        digest_ms.push(millis(start));
        let (heap_before_restore, _) = heap();
        let start = Instant::now();
        let restored = StateMachine::restore(machine.limits(), &bytes).expect("restores");
        restore_ms.push(millis(start));
        restored_heap = heap().0 - heap_before_restore;
        assert!(restored == *machine, "restored state differs");
        drop(restored);
    }
    std::hint::black_box(&clients);
    format!(
        "{} {n} {} {} {} {counted} {} {:.3} {:.3} {:.3} {snapshot_len} {snapshot_allocated} {} {} {} {} {:.3} {restored_heap}",
        scenario.name(),
        heap_after - heap_before,
        blocks_after - blocks_before,
        rss_after - rss_before,
        snapshot_len - snapshot_before,
        median(snapshot_ms),
        median(digest_ms),
        median(restore_ms),
        stats.sessions,
        stats.completion_records,
        stats.idempotency_keys,
        stats.keys,
        median(copy_ms),
    )
}

/// How the throughput case spreads its requests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spread {
    /// Over every live session, uniformly at random.
    All,
    /// Over 100 of them, uniformly at random.
    Hot,
    /// Plain INCRs (no session), for reference.
    Plain,
}

/// The throughput case: `n` live sessions, each with one request applied;
/// then rounds of `ops` session INCRs (each acknowledging its session's
/// previous one) spread over all sessions, over a hot 100, and plain.
fn apply_case(n: usize, ops: usize, rounds: usize) -> String {
    let mut driver = Driver::new();
    let mut clients: Vec<Client> = (0..n).map(|_| driver.open(128)).collect();
    for client in &mut clients {
        driver.session_incr(client, true);
    }
    let hot: Vec<usize> = (0..HOT.min(n)).map(|i| i * (n / HOT.min(n))).collect();
    let spreads = [Spread::All, Spread::Hot, Spread::Plain];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); spreads.len()];
    for _ in 0..rounds {
        for (slot, spread) in spreads.iter().enumerate() {
            let entries: Vec<Entry> = (0..ops)
                .map(|i| {
                    let origin = match spread {
                        Spread::All => {
                            let j = driver.rng.below(n);
                            clients[j].origin(true)
                        }
                        Spread::Hot => {
                            let j = hot[driver.rng.below(hot.len())];
                            clients[j].origin(true)
                        }
                        Spread::Plain => Origin::Plain,
                    };
                    driver.entry(origin, incr(i))
                })
                .collect();
            let start = Instant::now();
            for entry in &entries {
                let outcome = driver.machine.apply(entry);
                assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
                std::hint::black_box(outcome);
            }
            samples[slot].push(ops as f64 / start.elapsed().as_secs_f64());
        }
    }
    let mut line = format!("apply {n} {ops} {rounds}");
    for values in samples {
        let low = values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = values.iter().copied().fold(0.0, f64::max);
        let _ = write!(line, " {:.0} {low:.0} {high:.0}", median(values));
    }
    line
}

fn run_case(spec: &str, quick: bool) -> String {
    let (name, n) = spec.split_once(':').expect("scenario:n");
    let scenario = Scenario::parse(name).expect("a known scenario");
    let n: usize = n.parse().expect("a count");
    let rounds = env_or("ONCEKV_BENCH_ROUNDS", if quick { 1 } else { 3 });
    match scenario {
        Scenario::Apply => {
            let ops = env_or("ONCEKV_BENCH_OPS", if quick { 1_000 } else { 200_000 });
            apply_case(n, ops, rounds)
        }
        _ => memory_case(scenario, n, rounds),
    }
}

/// A memory case's result, parsed from its line.
#[derive(Debug)]
struct Measured {
    scenario: Scenario,
    n: usize,
    heap: f64,
    blocks: f64,
    rss: f64,
    counted: f64,
    snapshot_growth: f64,
    snapshot_ms: f64,
    digest_ms: f64,
    restore_ms: f64,
    snapshot_len: f64,
    snapshot_allocated: f64,
    copy_ms: f64,
    restored_heap: f64,
}

impl Measured {
    fn parse(line: &str) -> Measured {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> f64 { fields[i].parse().expect("a number") };
        Measured {
            scenario: Scenario::parse(fields[0]).expect("a scenario"),
            n: fields[1].parse().expect("a count"),
            heap: number(2),
            blocks: number(3),
            rss: number(4),
            counted: number(5),
            snapshot_growth: number(6),
            snapshot_ms: number(7),
            digest_ms: number(8),
            restore_ms: number(9),
            snapshot_len: number(10),
            snapshot_allocated: number(11),
            copy_ms: number(16),
            restored_heap: number(17),
        }
    }

    fn per(&self, bytes: f64) -> f64 {
        bytes / self.n as f64
    }
}

fn spawn(spec: &str) -> String {
    eprintln!("measuring {spec} ...");
    let output = Process::new(std::env::current_exe().expect("own path"))
        .args(std::env::args().skip(1))
        .env(CASE_VAR, spec)
        .stderr(Stdio::inherit())
        .output()
        .expect("runs a case");
    assert!(output.status.success(), "case {spec} failed");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("RESULT "))
        .expect("a result line")
        .to_string()
}

fn ratio(measured: f64, counted: f64) -> String {
    if counted > 0.0 {
        format!("{:.2}", measured / counted)
    } else {
        "-".into()
    }
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: keep it quick
    // (and debug builds check every invariant after each apply).
    let quick = !std::env::args().any(|arg| arg == "--bench");
    if let Ok(spec) = std::env::var(CASE_VAR) {
        println!("RESULT {}", run_case(&spec, quick));
        return;
    }
    let sizes = |full: [usize; 2]| if quick { vec![100] } else { full.to_vec() };
    let memory_cases = [
        (Scenario::Idle, sizes([10_000, 1_000_000])),
        (Scenario::Steady, sizes([10_000, 1_000_000])),
        (Scenario::Burst(128), sizes([10_000, 100_000])),
        (Scenario::Burst(1024), sizes([1_000, 10_000])),
        (Scenario::Records, sizes([10_000, 1_000_000])),
        (Scenario::Keys { random: false }, sizes([10_000, 1_000_000])),
        (Scenario::Keys { random: true }, sizes([10_000, 1_000_000])),
        (
            Scenario::Store { random: false },
            sizes([10_000, 1_000_000]),
        ),
        (Scenario::Store { random: true }, sizes([10_000, 1_000_000])),
    ];
    let mut measured = Vec::new();
    for (scenario, ns) in &memory_cases {
        for n in ns {
            let line = spawn(&format!("{}:{n}", scenario.name()));
            measured.push(Measured::parse(&line));
        }
    }
    let mut throughput = Vec::new();
    let apply_sizes = if quick {
        vec![100]
    } else {
        vec![10_000, 100_000, 1_000_000]
    };
    for n in apply_sizes {
        throughput.push(spawn(&format!("apply:{n}")));
    }

    println!("## Sizes of the types (bytes, this build)\n");
    println!(
        "Session {}, Option<CompletionRecord> {}, Reply {}, KeyRecord {}, StoredValue {}; \
         ENTRY_OVERHEAD_BYTES = {ENTRY_OVERHEAD_BYTES}\n",
        size_of::<Session>(),
        size_of::<Option<CompletionRecord>>(),
        size_of::<Reply>(),
        size_of::<KeyRecord>(),
        size_of::<StoredValue>(),
    );

    println!("## Memory per entry (bytes per entry)\n");
    println!(
        "| entry | N | heap | heap blocks | resident (RSS) | counted | budget | heap / counted | RSS / counted | snapshot | entries in 2 GiB (by RSS), millions |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for m in &measured {
        let rss = m.per(m.rss);
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {:.0} | {:.2} |",
            m.scenario.describe(),
            m.n,
            m.per(m.heap),
            m.per(m.blocks),
            rss,
            m.per(m.counted),
            m.scenario.budget(),
            ratio(m.heap, m.counted),
            ratio(m.rss, m.counted),
            m.per(m.snapshot_growth),
            if rss > 0.0 {
                2.0 * GIB / rss / 1e6
            } else {
                0.0
            },
        );
    }

    println!(
        "\n## What blocks applies: snapshot, digest and restore of that state (median of {})\n",
        env_or("ONCEKV_BENCH_ROUNDS", if quick { 1 } else { 3 })
    );
    println!(
        "| state | N | clone() ms | snapshot() ms | state_digest() ms | restore() ms | snapshot MiB | allocated by snapshot() MiB | heap of the entries MiB | heap of the restored state MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for m in &measured {
        println!(
            "| {} | {} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            m.scenario.describe(),
            m.n,
            m.copy_ms,
            m.snapshot_ms,
            m.digest_ms,
            m.restore_ms,
            m.snapshot_len / MIB,
            m.snapshot_allocated / MIB,
            m.heap / MIB,
            m.restored_heap / MIB,
        );
    }

    println!(
        "\n## Apply throughput with N live sessions (session INCRs, each acknowledging its previous one)\n"
    );
    println!(
        "| live sessions | ops per run | rounds | spread over all: median ops/s (min-max) | hot 100: median ops/s (min-max) | plain INCR: median ops/s (min-max) |"
    );
    println!("|---|---|---|---|---|---|");
    for line in &throughput {
        let f: Vec<&str> = line.split_whitespace().collect();
        println!(
            "| {} | {} | {} | {} ({}-{}) | {} ({}-{}) | {} ({}-{}) |",
            f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12]
        );
    }

    // The default limits at their bounds, in resident memory, from the
    // largest N of each case (the costlier variant where there are two).
    let mut largest: BTreeMap<String, &Measured> = BTreeMap::new();
    for m in &measured {
        largest.insert(m.scenario.name(), m);
    }
    let per = |names: &[&str], field: fn(&Measured) -> f64| {
        names
            .iter()
            .filter_map(|name| largest.get(*name))
            .map(|m| m.per(field(m)))
            .fold(0.0, f64::max)
    };
    let rss_of = |names: &[&str]| per(names, |m| m.rss);
    let counted_of = |names: &[&str]| per(names, |m| m.counted).max(1.0);
    let d = Limits::default();
    let sessions = d.sessions_max as f64;
    let records = d.record_bytes_max as f64 / counted_of(&["records"]);
    let keys = (d.idempotency_keys_max as f64)
        .min(d.idempotency_bytes_max as f64 / counted_of(&["keys", "keys-random"]));
    let store_keys = (d.kv_keys_max as f64)
        .min(d.store_bytes_max as f64 / counted_of(&["store", "store-random"]));
    let idle = sessions * rss_of(&["idle"]);
    let full_128 = sessions * rss_of(&["burst128"]);
    let full_max = sessions * rss_of(&["burst1024"]);
    let in_records = records * rss_of(&["records"]);
    let in_keys = keys * rss_of(&["keys", "keys-random"]);
    let in_store = store_keys * rss_of(&["store", "store-random"]);
    // Records live in their sessions' rings: a ring that once held a full
    // window already has room for them.
    let total = |full: f64| full.max(idle + in_records) + in_keys + in_store;
    let rows = [
        (format!("{} idle sessions", d.sessions_max), idle),
        (
            format!("{} sessions after a full window of 128", d.sessions_max),
            full_128,
        ),
        (
            format!(
                "{} sessions after a full window of {} (window_max)",
                d.sessions_max, d.window_max
            ),
            full_max,
        ),
        (
            format!(
                "record_bytes_max ({} MiB) of INCR records: {:.2} M records",
                d.record_bytes_max >> 20,
                records / 1e6
            ),
            in_records,
        ),
        (
            format!(
                "idempotency keys at their bound: {:.2} M keys of 16 bytes",
                keys / 1e6
            ),
            in_keys,
        ),
        (
            format!(
                "store at its bound with 16-byte keys and values: {:.1} M keys (kv_keys_max)",
                store_keys / 1e6
            ),
            in_store,
        ),
        (
            "all together, clients on window 128".to_string(),
            total(full_128),
        ),
        (
            format!("all together, clients on window {}", d.window_max),
            total(full_max),
        ),
    ];
    println!("\n## Limits::default() at its bounds, in resident memory (from the largest N)\n");
    println!("| what | GiB |");
    println!("|---|---|");
    for (what, bytes) in &rows {
        println!("| {what} | {:.2} |", bytes / GIB);
    }
}
