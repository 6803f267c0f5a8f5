//! The smoke run of the fuzz targets, part of the ordinary `cargo test`:
//! each target over its checked-in seed corpus (`corpus/<target>/`), then
//! over pseudo-random inputs from a fixed seed (random bytes, and seeds
//! mutated the way a fuzzer would: bits flipped, bytes inserted,
//! overwritten, cut, spliced). A failing input is printed in hex, to be
//! saved as `corpus/<target>/crash-*` and replayed under the fuzzer.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// Inputs per pure target, and for the peer target (a real node).
const PURE_INPUTS: usize = 3000;
const SEGMENT_INPUTS: usize = 2000;
const PEER_INPUTS: usize = 300;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The seeds of `target`, by name.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let name = path.file_name().expect("a file name");
            let bytes = std::fs::read(&path).expect("a seed");
            (name.to_string_lossy().into_owned(), bytes)
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 3, "the seed corpus of {target} is missing");
    seeds
}

/// xorshift64*: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn new(target: &str) -> Rng {
        let seed = target.bytes().fold(0x5eed_0f0c_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next() as u8).collect()
    }
}

/// A fuzzer-like mutation of `seed` (with `other` for splicing).
fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut input = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(input.len());
        match rng.below(6) {
            0 if !input.is_empty() => input[at] ^= 1 << rng.below(8),
            1 if !input.is_empty() => input[at] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5)],
            2 => {
                let length = 1 + rng.below(8);
                let bytes = rng.bytes(length);
                input.splice(at..at, bytes);
            }
            3 if !input.is_empty() => {
                let end = (at + 1 + rng.below(8)).min(input.len());
                input.drain(at..end);
            }
            4 => input.truncate(at),
            _ => {
                let from = rng.below(other.len());
                let tail = &other[from..];
                input.truncate(at);
                input.extend_from_slice(tail);
            }
        }
    }
    input
}

/// Runs `body` on `input`, naming the input if it fails.
fn run(target: &str, name: &str, body: fn(&[u8]), input: &[u8]) {
    let result = std::panic::catch_unwind(|| body(input));
    if let Err(cause) = result {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("{target}: input {name} failed; its bytes in hex:\n{hex}");
        std::panic::resume_unwind(cause);
    }
}

/// The seeds, then `count` generated inputs (half random, half mutated
/// seeds) of at most `max_len` bytes.
fn smoke(target: &str, body: fn(&[u8]), count: usize, max_len: usize) {
    let started = Instant::now();
    let seeds = seeds(target);
    for (name, seed) in &seeds {
        run(target, name, body, seed);
    }
    let mut rng = Rng::new(target);
    for n in 0..count {
        let input = if n % 2 == 0 {
            let length = rng.below(max_len + 1);
            rng.bytes(length)
        } else {
            let seed = &seeds[rng.below(seeds.len())].1;
            let other = &seeds[rng.below(seeds.len())].1;
            mutate(&mut rng, seed, other)
        };
        run(target, &format!("#{n}"), body, &input);
    }
    eprintln!(
        "{target}: {} seeds and {count} generated inputs in {:.1?}",
        seeds.len(),
        started.elapsed()
    );
}

#[test]
fn client_request_smoke() {
    smoke(
        "client_request",
        oncekv_fuzz::client_request,
        PURE_INPUTS,
        512,
    );
}

#[test]
fn snapshot_restore_smoke() {
    smoke(
        "snapshot_restore",
        oncekv_fuzz::snapshot_restore,
        PURE_INPUTS,
        512,
    );
}

#[test]
fn segment_recovery_smoke() {
    smoke(
        "segment_recovery",
        oncekv_fuzz::segment_recovery,
        SEGMENT_INPUTS,
        512,
    );
}

#[test]
fn batch_request_smoke() {
    smoke(
        "batch_request",
        oncekv_fuzz::batch_request,
        PURE_INPUTS,
        1024,
    );
}

#[test]
fn etcd_request_smoke() {
    smoke("etcd_request", oncekv_fuzz::etcd_request, PURE_INPUTS, 512);
}

#[test]
fn peer_message_smoke() {
    smoke("peer_message", oncekv_fuzz::peer_message, PEER_INPUTS, 256);
    let stats = oncekv_fuzz::peer_message::stats();
    eprintln!("peer_message: {stats:?}");
    assert!(
        stats.calls_answered > 0 && stats.writes_applied > 0,
        "the node answered no peer call or applied no write: {stats:?}"
    );
}

/// The valid seeds reach past the checks they are meant to pass, so the
/// smoke run and the fuzzer start deep.
#[test]
fn valid_seeds_reach_deep() {
    for (name, seed) in seeds("client_request") {
        let applied = oncekv_fuzz::client_request::applied_requests(&seed);
        if !name.starts_with("random") {
            assert!(applied >= 10, "{name} applied only {applied} requests");
        }
    }
    for (name, seed) in seeds("snapshot_restore") {
        let expected = !["random", "bad-", "default-limits-mismatch"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        assert_eq!(
            oncekv_fuzz::snapshot_restore::restores(&seed),
            expected,
            "snapshot seed {name}"
        );
    }
    for (name, seed) in seeds("segment_recovery") {
        let expected = [
            "log",
            "log-raw",
            "two-segments",
            "purged-first-segment-1",
            "garbage-header",
            "cut-short",
            "unwritten-zeros",
        ]
        .contains(&name.as_str());
        assert_eq!(
            oncekv_fuzz::segment_recovery::opens(&seed),
            expected,
            "segment seed {name}"
        );
    }
}

/// The batch seeds decode as their names say, and the etcd seeds reach
/// past the adapter's checks.
#[test]
fn batch_and_etcd_seeds_reach_deep() {
    let cap = oncekv_proto::BATCH_REQUESTS_MAX;
    let batches: [(&str, Option<usize>); 20] = [
        ("empty", Some(0)),
        ("one-put", Some(1)),
        ("sessions", Some(15)),
        ("leases", Some(14)),
        ("at-cap", Some(cap)),
        ("at-cap-puts", Some(cap)),
        ("cap-plus-one", None),
        ("cap-plus-one-puts", None),
        ("past-cap-broken", None),
        ("broken-before-cap", None),
        ("interleaved-unknown-past-cap", None),
        ("unknown-fields", Some(1)),
        ("nested-cut-short", None),
        ("truncated-length-varint", None),
        ("truncated-key-varint", None),
        ("huge-length", None),
        ("overlong-varint", None),
        ("group-then-request", Some(1)),
        ("wrong-wire-type", None),
        ("end-group-alone", None),
    ];
    let batch_seeds = seeds("batch_request");
    for (name, expected) in batches {
        let (_, seed) = batch_seeds
            .iter()
            .find(|(seed, _)| seed == name)
            .unwrap_or_else(|| panic!("batch seed {name} is missing"));
        assert_eq!(
            oncekv_fuzz::batch_request::decoded_requests(seed),
            expected,
            "batch seed {name}"
        );
    }
    for (name, seed) in seeds("etcd_request") {
        let reached = oncekv_fuzz::etcd_request::reached(&seed);
        let deep = match name.as_str() {
            "kv" | "nested-txn" | "leases" | "auth" => reached.applied >= 4,
            "watch" => reached.read >= 5 && reached.refused >= 1,
            "cluster-alarm" => reached.decoded == 9 && reached.refused >= 3,
            "invalid" => reached.refused + reached.applied >= 10,
            "broken-messages" => reached.decoded == 1 && reached.applied == 1,
            "too-deep-txn" => reached.decoded == 0,
            _ => true,
        };
        assert!(deep, "etcd seed {name} reached only {reached:?}");
    }
}
