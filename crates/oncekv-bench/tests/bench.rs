//! `oncekv-bench` against real servers on loopback: the CAS, mixed and
//! INCR workloads and `--ops` against an oncekv node (checking the JSON
//! report and, for INCR, the counter the cluster holds), the transfer
//! workload (the accounts still sum to zero) and the watch workload (every
//! watcher saw every write), its flag checks,
//! and, when an `etcd` binary is on PATH, the etcd target in plain and
//! session mode against a 1-node etcd (without one it is skipped, and
//! listed by `cargo xtask verify`, or failed under `CI=true`).

mod support;

use serde_json::Value;
use std::process::{Command as Process, Output};
use std::time::Duration;
use support::{FAST, exclusive};

/// Runs `PROGRAM ARGS`; returns the exit code, stdout and stderr.
fn run(program: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Process::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("run {}: {error}", program.display()));
    (
        status.code().expect("exit code"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Runs `oncekv-bench ARGS`; returns the exit code, stdout and stderr.
fn oncekv_bench(args: &[&str]) -> (i32, String, String) {
    run(env!("CARGO_BIN_EXE_oncekv-bench").as_ref(), args)
}

/// Runs `oncekv ARGS` (a client command); returns the exit code, stdout
/// and stderr.
fn oncekv(args: &[&str]) -> (i32, String, String) {
    run(&support::oncekv_binary(), args)
}

/// Runs `oncekv-bench ARGS -o json --endpoints ENDPOINT` and parses the
/// report; fails the test unless it exits 0.
fn bench(endpoint: &str, args: &[&str]) -> Value {
    let mut all = vec!["-o", "json", "--endpoints", endpoint];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = oncekv_bench(&all);
    assert_eq!(code, 0, "oncekv-bench {all:?}: {stdout}\n{stderr}");
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|_| panic!("not JSON: {stdout:?}; stderr: {stderr}"))
}

fn number(report: &Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {report}"))
}

fn count(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {report}"))
}

fn assert_no_errors(report: &Value) {
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_cas_mixed_and_counted_operations_against_a_node() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();

    // Eight tasks racing on one key: they all read before any swap lands,
    // so some swaps must lose, and some must win.
    let cas = bench(
        &endpoint,
        &[
            "--workload",
            "cas",
            "--keys",
            "1",
            "--concurrency",
            "8",
            "--connections",
            "2",
            "--ops",
            "300",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&cas);
    assert_eq!(count(&cas, "operations"), 300, "{cas}");
    assert_eq!(cas["op_counts"]["cas"], 300, "{cas}");
    let conflicts = count(&cas, "cas_conflicts");
    assert!(
        conflicts > 0 && conflicts < 300,
        "{conflicts} conflicts: {cas}"
    );
    assert_eq!(
        (
            cas["workload"].as_str(),
            cas["mode"].as_str(),
            cas["target"].as_str()
        ),
        (Some("cas"), Some("session"), Some("oncekv"))
    );
    assert_eq!(
        (count(&cas, "connections"), count(&cas, "concurrency")),
        (2, 8)
    );
    let p50 = number(&cas, "p50_ms");
    assert!(
        p50 > 0.0
            && p50 <= number(&cas, "p99_ms")
            && number(&cas, "p99_ms") <= number(&cas, "max_ms"),
        "{cas}"
    );
    let throughput = number(&cas, "throughput_ops");
    let expected = 300.0 / number(&cas, "duration_s");
    assert!((throughput - expected).abs() < 1e-6 * expected, "{cas}");

    // Alone on its keys, a CAS never loses.
    let alone = bench(
        &endpoint,
        &[
            "--workload",
            "cas",
            "--mode",
            "plain",
            "--concurrency",
            "1",
            "--ops",
            "50",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&alone);
    assert_eq!(
        (count(&alone, "operations"), count(&alone, "cas_conflicts")),
        (50, 0),
        "{alone}"
    );

    // Half reads, half writes, for one second.
    let mixed = bench(
        &endpoint,
        &[
            "--workload",
            "mixed",
            "--read-ratio",
            "0.5",
            "--concurrency",
            "4",
            "--connections",
            "2",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&mixed);
    let operations = count(&mixed, "operations");
    let (gets, puts) = (
        mixed["op_counts"]["get"].as_u64().unwrap_or(0),
        mixed["op_counts"]["put"].as_u64().unwrap_or(0),
    );
    assert!(operations > 0, "{mixed}");
    assert_eq!(gets + puts, operations, "{mixed}");
    assert!(gets > 0 && puts > 0, "{mixed}");
    assert_eq!(number(&mixed, "duration_s"), 1.0, "{mixed}");
    assert_eq!(number(&mixed, "read_ratio"), 0.5, "{mixed}");
    assert_eq!(
        number(&mixed, "throughput_ops"),
        operations as f64,
        "{mixed}"
    );
    let client_cpu = number(&mixed, "client_cpu_pct");
    assert!(client_cpu > 0.0, "{mixed}");
    let machine_cpu = number(&mixed, "machine_cpu_pct");
    assert!(machine_cpu > 0.0 && machine_cpu <= 100.0, "{mixed}");

    // INCR on sessions from eight tasks: the counter holds exactly the
    // number of increments measured.
    let incr = bench(
        &endpoint,
        &[
            "--workload",
            "incr",
            "--keys",
            "1",
            "--concurrency",
            "8",
            "--ops",
            "100",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&incr);
    assert_eq!(count(&incr, "operations"), 100, "{incr}");
    let (code, value, stderr) = oncekv(&["get", "i0000000", "--endpoints", &endpoint]);
    assert_eq!((code, value.trim()), (0, "100"), "{stderr}");

    // Idempotency keys.
    let keyed = bench(
        &endpoint,
        &[
            "--workload",
            "put",
            "--mode",
            "key",
            "--concurrency",
            "2",
            "--ops",
            "40",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&keyed);
    assert_eq!(count(&keyed, "operations"), 40, "{keyed}");
}

/// The value of `key` on `endpoint`, as a number.
fn balance(endpoint: &str, key: &str) -> i64 {
    let (code, value, stderr) = oncekv(&["get", key, "--endpoints", endpoint]);
    assert_eq!(code, 0, "get {key}: {stderr}");
    value
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{key} holds {value:?}"))
}

/// A short watch run: every watcher saw every measured write.
fn assert_every_event_seen(watch: &Value, watchers: u64) {
    assert_no_errors(watch);
    assert_eq!(watch["workload"], "watch", "{watch}");
    let writes = count(watch, "writes");
    assert!(writes >= 10, "{writes} writes: {watch}");
    assert_eq!(
        count(watch, "events_expected"),
        writes * watchers,
        "{watch}"
    );
    assert_eq!(count(watch, "events_seen"), writes * watchers, "{watch}");
    assert_eq!(count(watch, "events_missing"), 0, "{watch}");
    assert!(number(watch, "events_per_s") > 0.0, "{watch}");
    let p50 = number(watch, "p50_ms");
    assert!(p50 > 0.0 && p50 <= number(watch, "p99_ms"), "{watch}");
}

const WATCH_FLAGS: &[&str] = &[
    "--workload",
    "watch",
    "--watchers",
    "20",
    "--connections",
    "2",
    "--concurrency",
    "2",
    "--rate",
    "50",
    "--duration",
    "1s",
    "--warmup",
    "0.2s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_transfers_and_watches_against_a_node() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();

    // Transfers between two accounts, each one transaction: whatever the
    // interleaving, the balances sum to zero.
    for mode in ["session", "plain", "key"] {
        let transfer = bench(
            &endpoint,
            &[
                "--workload",
                "transfer",
                "--mode",
                mode,
                "--keys",
                "2",
                "--concurrency",
                "4",
                "--ops",
                "60",
                "--warmup",
                "0s",
            ],
        );
        assert_no_errors(&transfer);
        assert_eq!(count(&transfer, "operations"), 60, "{transfer}");
        assert_eq!(transfer["op_counts"]["transfer"], 60, "{transfer}");
        assert_eq!(count(&transfer, "rmw_retries"), 0, "{transfer}");
    }
    let (first, second) = (
        balance(&endpoint, "t0000000"),
        balance(&endpoint, "t0000001"),
    );
    assert_eq!(first + second, 0, "{first} + {second}");
    assert!(first.abs() <= 180, "{first}");

    let watch = bench(&endpoint, WATCH_FLAGS);
    assert_every_event_seen(&watch, 20);
    assert_eq!(watch["target"], "oncekv", "{watch}");
}

#[test]
fn bench_refuses_flags_that_make_no_run() {
    for (flags, says) in [
        (
            &["--workload", "mixed", "--read-ratio", "1.5"][..],
            "within 0..=1",
        ),
        (&["--ops", "0"][..], "--ops must be at least 1"),
        (&["--connections", "0"][..], "--connections must be 1..=16"),
        (
            &["--concurrency", "2", "--connections", "3"][..],
            "--connections must be 1..=2",
        ),
        (&["--read-ratio", "0.5"][..], "mixed only"),
        (
            &["--workload", "transfer", "--keys", "1"][..],
            "two distinct accounts",
        ),
        (
            &["--workload", "watch"][..],
            "--connections must be 5..=1000",
        ),
        (&["--watchers", "3"][..], "watch only"),
    ] {
        let mut args = vec!["--endpoints", "127.0.0.1:1"];
        args.extend_from_slice(flags);
        let (code, _, stderr) = oncekv_bench(&args);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[cfg(not(feature = "etcd"))]
#[test]
fn target_etcd_says_how_to_build_it() {
    let (code, _, stderr) = oncekv_bench(&["--target", "etcd"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("built without etcd support") && stderr.contains("cargo xtask build-bench"),
        "{stderr}"
    );
}

/// The reference etcd, with a client of its own.
#[cfg(feature = "etcd")]
struct Etcd(oncekv_harness::testing::EtcdProcess);

#[cfg(feature = "etcd")]
impl std::ops::Deref for Etcd {
    type Target = oncekv_harness::testing::EtcdProcess;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

#[cfg(feature = "etcd")]
impl Etcd {
    /// Starts one if an `etcd` binary is on PATH.
    fn start() -> Option<Etcd> {
        oncekv_harness::testing::EtcdProcess::start().map(Etcd)
    }

    /// Waits until it answers a read.
    async fn ready(&self) -> etcd_client::Client {
        support::eventually(Duration::from_secs(30), "etcd to answer", || async {
            let mut client = etcd_client::Client::connect([self.endpoint.as_str()], None)
                .await
                .ok()?;
            client.get("ready", None).await.ok()?;
            Some(client)
        })
        .await
    }
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_transfers_and_watches_against_etcd() {
    let _one = exclusive().await;
    let Some(etcd) = Etcd::start() else {
        support::missing_dependency(
            "bench::bench_runs_transfers_and_watches_against_etcd",
            support::Dependency::Etcd,
            "no etcd binary on PATH",
        );
        return;
    };
    let mut client = etcd.ready().await;
    // Eight tasks on two accounts: reads race, guarded writes conflict and
    // are retried; the balances still sum to zero.
    for mode in ["plain", "session"] {
        let transfer = bench(
            &etcd.endpoint,
            &[
                "--target",
                "etcd",
                "--workload",
                "transfer",
                "--mode",
                mode,
                "--keys",
                "2",
                "--concurrency",
                "8",
                "--ops",
                "80",
                "--warmup",
                "0s",
            ],
        );
        assert_no_errors(&transfer);
        assert_eq!(count(&transfer, "operations"), 80, "{transfer}");
        assert!(count(&transfer, "rmw_retries") > 0, "{transfer}");
    }
    let mut sum = 0;
    for key in ["t0000000", "t0000001"] {
        let response = client.get(key, None).await.expect("get");
        let value = response.kvs().first().expect("the account exists").value();
        sum += std::str::from_utf8(value)
            .expect("text")
            .parse::<i64>()
            .expect("a number");
    }
    assert_eq!(sum, 0);

    let mut flags = vec!["--target", "etcd"];
    flags.extend_from_slice(WATCH_FLAGS);
    let watch = bench(&etcd.endpoint, &flags);
    assert_every_event_seen(&watch, 20);
    assert_eq!(watch["target"], "etcd", "{watch}");
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_against_etcd_in_plain_and_session_mode() {
    let _one = exclusive().await;
    let Some(etcd) = Etcd::start() else {
        support::missing_dependency(
            "bench::bench_runs_against_etcd_in_plain_and_session_mode",
            support::Dependency::Etcd,
            "no etcd binary on PATH",
        );
        return;
    };
    let mut client = etcd.ready().await;
    for mode in ["plain", "session"] {
        let put = bench(
            &etcd.endpoint,
            &[
                "--target",
                "etcd",
                "--workload",
                "put",
                "--mode",
                mode,
                "--concurrency",
                "4",
                "--connections",
                "2",
                "--ops",
                "200",
                "--warmup",
                "0s",
            ],
        );
        assert_no_errors(&put);
        assert_eq!(count(&put, "operations"), 200, "{put}");
        assert_eq!(
            (put["target"].as_str(), put["mode"].as_str()),
            (Some("etcd"), Some(mode))
        );
        assert_eq!(count(&put, "duplicates"), 0, "{put}");
    }
    // Session mode writes a sequence key per task: four tasks, four keys,
    // each at its last sequence number.
    let sequences = client
        .get("__seq/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read sequence keys");
    let numbers: u64 = sequences
        .kvs()
        .iter()
        .map(|kv| {
            std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .expect("a decimal sequence number")
        })
        .sum();
    assert_eq!(sequences.kvs().len(), 4);
    assert_eq!(numbers, 200, "one sequence number per write");

    // Read-modify-write INCR from four tasks on one key, on sessions: the
    // counter holds exactly the increments measured, however many rounds
    // lost a race and were retried.
    let incr = bench(
        &etcd.endpoint,
        &[
            "--target",
            "etcd",
            "--workload",
            "incr",
            "--mode",
            "session",
            "--keys",
            "1",
            "--concurrency",
            "4",
            "--ops",
            "100",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&incr);
    assert_eq!(count(&incr, "operations"), 100, "{incr}");
    let counter = client.get("i0000000", None).await.expect("read counter");
    assert_eq!(
        counter.kvs().first().map(|kv| kv.value().to_vec()),
        Some(b"100".to_vec()),
        "{incr}"
    );

    let cas = bench(
        &etcd.endpoint,
        &[
            "--target",
            "etcd",
            "--workload",
            "cas",
            "--mode",
            "plain",
            "--keys",
            "1",
            "--concurrency",
            "4",
            "--ops",
            "100",
            "--warmup",
            "0s",
        ],
    );
    assert_no_errors(&cas);
    assert_eq!(count(&cas, "operations"), 100, "{cas}");
    let conflicts = count(&cas, "cas_conflicts");
    assert!(conflicts > 0 && conflicts < 100, "{cas}");

    let (code, _, stderr) = oncekv_bench(&[
        "--target",
        "etcd",
        "--mode",
        "key",
        "--endpoints",
        &etcd.endpoint,
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("use plain or session"), "{stderr}");
}

/// A reader that goes away (`oncekv-bench | head -0`) ends the command
/// quietly: no panic on the closed pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_command_without_a_panic() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();
    let mut child = Process::new(env!("CARGO_BIN_EXE_oncekv-bench"))
        .args(["--endpoints", &endpoint, "--ops", "20"])
        .args(["--warmup", "0s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run oncekv-bench");
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("wait for oncekv-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}
