//! Why the log is a purpose-built segment log: the latency of one durable
//! append on the data disk, measured side by side in one run for
//! (a) the floor: a 100-byte `write` + `fdatasync` on a plain file,
//! (b) `SegmentLog::append` of one entry, waiting for its flush callback,
//! (c) a redb write transaction inserting one 100-byte value (redb fsyncs
//!     per commit), and
//! (d) `SegmentLog::append` of 64 entries at once (group commit).
//! Rounds alternate between the candidates; medians are reported.
//!
//! Run: `cargo bench -p oncekv-server --bench log_append` (`ONCEKV_BENCH_OPS`
//! sets appends per round; set `TMPDIR` to measure another disk).

use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::type_config::TypeConfig;
use openraft::alias::{EntryOf, OneshotOf};
use openraft::async_runtime::Oneshot;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::testing::blank_ent;
use std::io::Write;
use std::time::{Duration, Instant};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn raw_fdatasync(dir: &std::path::Path, ops: usize) -> Vec<Duration> {
    let mut file = std::fs::File::create(dir.join("raw")).expect("file");
    (0..ops)
        .map(|_| {
            let start = Instant::now();
            file.write_all(&[7u8; 100]).expect("write");
            file.sync_data().expect("fdatasync");
            start.elapsed()
        })
        .collect()
}

fn redb_commits(dir: &std::path::Path, ops: usize) -> Vec<Duration> {
    const TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
    let db = redb::Database::create(dir.join("redb")).expect("redb");
    (0..ops as u64)
        .map(|i| {
            let start = Instant::now();
            let txn = db.begin_write().expect("txn");
            {
                let mut table = txn.open_table(TABLE).expect("table");
                table.insert(i, [7u8; 100].as_slice()).expect("insert");
            }
            txn.commit().expect("commit");
            start.elapsed()
        })
        .collect()
}

async fn segment_log(dir: &std::path::Path, ops: usize, batch: u64) -> Vec<Duration> {
    let mut log = SegmentLog::open(dir).expect("log");
    let mut next = 1u64;
    let mut samples = Vec::with_capacity(ops);
    for _ in 0..ops {
        let entries: Vec<EntryOf<TypeConfig>> = (next..next + batch)
            .map(|i| blank_ent::<TypeConfig>(1, 1, i))
            .collect();
        next += batch;
        let start = Instant::now();
        let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
        log.append(entries, IOFlushed::signal(tx))
            .await
            .expect("append");
        rx.await.expect("callback").expect("durable");
        samples.push(start.elapsed());
    }
    samples
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let quick = !std::env::args().any(|arg| arg == "--bench");
    let ops: usize = std::env::var("ONCEKV_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20 } else { 300 });
    let rounds = if quick { 1 } else { 5 };
    let mut results: [Vec<Duration>; 4] = Default::default();
    for _ in 0..rounds {
        let dir = tempfile::tempdir().expect("tempdir");
        results[0].push(median(raw_fdatasync(dir.path(), ops)));
        results[1].push(median(segment_log(&dir.path().join("seg1"), ops, 1).await));
        results[2].push(median(redb_commits(dir.path(), ops)));
        results[3].push(median(
            segment_log(&dir.path().join("seg64"), ops, 64).await,
        ));
    }
    let names = [
        "write + fdatasync (floor)",
        "SegmentLog append, 1 entry",
        "redb commit, 1 value",
        "SegmentLog append, 64 entries",
    ];
    let floor = median(results[0].clone());
    println!("durable append latency, median of {rounds} rounds x {ops} appends\n");
    println!("| candidate | p50 µs | x floor |");
    println!("|---|---|---|");
    for (name, samples) in names.iter().zip(results) {
        let p50 = median(samples);
        println!(
            "| {name} | {:.0} | {:.2} |",
            micros(p50),
            p50.as_secs_f64() / floor.as_secs_f64()
        );
    }
}
