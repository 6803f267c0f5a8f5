//! `oncekv verify --api etcd` end to end, short: the workload speaks etcd's
//! v3 API as etcd's users write read-modify-write code (a read, then a Txn
//! guarded by the key's mod revision, resent when its reply is lost).
//!
//! * With the `oncekv-idempotency-key` metadata, against a 3-node oncekv
//!   cluster under every fault kind that can run here: PASS, every resend
//!   answered with the first response (the replies checker compares them).
//!   The run includes the Kubernetes-shaped workload (`etcd_resources`,
//!   `etcd_watch`: kine's create, update, delete and compaction Txns, paged
//!   lists, watchers with progress requests that relist when compacted),
//!   judged by the KV and watch checkers.
//! * Without the metadata (`--naive-client`): the resent Txn finds the
//!   key changed, the client applies its update again, and the checkers
//!   must catch it.
//! * Against a real etcd (Debian's etcd-server), which ignores the
//!   metadata: the checkers must catch the same double application. This
//!   is the demonstration that etcd's clients double-apply through lost
//!   replies and oncekv does not.

use oncekv_harness::testing::{Dependency, EtcdProcess, missing_dependency, on_path};
use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;

/// One run at a time: each is a whole cluster under load.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `oncekv verify --api etcd ARGS -o json`; returns the exit code
/// and the JSON.
fn verify(args: &[&str]) -> (i32, Value) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().expect("a temporary folder");
    let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["verify", "--api", "etcd"])
        .args(args)
        .args(["--clients", "4", "-o", "json", "--out"])
        .arg(out.path())
        .output()
        .expect("oncekv runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!("not one JSON object ({error}):\n{stdout}\nstderr:\n{stderr}")
    });
    (output.status.code().expect("an exit code"), json)
}

fn checker<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["checkers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["checker"] == name))
        .unwrap_or_else(|| panic!("no checker {name} in {json}"))
}

fn failed(json: &Value, name: &str) -> bool {
    checker(json, name)["status"] == "fail"
}

#[test]
fn etcd_writes_with_the_idempotency_metadata_apply_once_under_every_fault() {
    let (code, json) = verify(&["--duration", "20s", "--seed", "21"]);
    assert_eq!(code, 0, "expected PASS: {json:#}");
    assert_eq!(json["verdict"], "PASS");
    let coverage = &json["coverage"];
    for kind in ["kill", "pause", "partition", "drop_replies", "reset"] {
        assert!(
            coverage["faults"][kind].as_u64().unwrap_or(0) >= 1,
            "fault kind {kind} not injected: {json:#}"
        );
    }
    assert!(
        coverage["replies_dropped_after_commit"].as_u64() >= Some(1),
        "{json:#}"
    );
    // Resends were answered, and every answer to one key was the first.
    let replies = checker(&json, "replies");
    assert_eq!(replies["status"], "pass", "{json:#}");
    // The Kubernetes-shaped part: its Txns, lists and reads judged by the
    // KV checker, and its watchers (list, watch from the list's revision
    // with progress requests, relist when compacted) by the watch checker
    // against the committed changes of the resources.
    assert_eq!(checker(&json, "linearizable_kv")["status"], "pass");
    let watches = checker(&json, "watches");
    assert_eq!(watches["status"], "pass", "{json:#}");
    let headline = watches["headline"].as_str().unwrap_or_default();
    assert!(
        headline.contains("every watcher saw the committed sequence")
            && !headline.contains(" 0 change"),
        "{headline}"
    );
}

#[test]
fn etcd_writes_resent_without_the_metadata_are_caught() {
    let (code, json) = verify(&[
        "--naive-client",
        "--faults",
        "drop-reply",
        "--duration",
        "12s",
        "--seed",
        "22",
    ]);
    assert_eq!(code, 7, "expected a violation: {json:#}");
    assert_eq!(json["verdict"], "FAIL");
    assert!(
        failed(&json, "exactly_once") || failed(&json, "counters"),
        "neither the appends nor the counters caught it: {json:#}"
    );
}

#[test]
fn a_real_etcd_applies_resent_writes_twice_and_is_caught() {
    if on_path("etcd").is_none() {
        missing_dependency(
            "a_real_etcd_applies_resent_writes_twice_and_is_caught",
            Dependency::Etcd,
            "the reference etcd",
        );
        return;
    }
    let etcd = EtcdProcess::start().expect("etcd starts");
    let (code, json) = verify(&[
        "--endpoints",
        &etcd.endpoint,
        "--faults",
        "drop-reply",
        "--duration",
        "12s",
        "--seed",
        "23",
    ]);
    assert_eq!(
        code,
        7,
        "expected a violation: {json:#}\netcd log:\n{}",
        etcd.log()
    );
    // With the metadata on, etcd (which ignores it) answers a resend of
    // one key at a second revision: the replies checker sees it, and the
    // appends or counters show the update applied twice.
    assert!(failed(&json, "replies"), "{json:#}");
    assert!(
        failed(&json, "exactly_once") || failed(&json, "counters"),
        "{json:#}"
    );
}
