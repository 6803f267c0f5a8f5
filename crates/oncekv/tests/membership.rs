//! `oncekv verify` with the membership changes as its faults, short: a run
//! of the membership kinds under load (with replies dropped after commit
//! beside them) must pass every checker, and each change the nemesis
//! planned must have happened: its steps recorded in the history, none
//! failed, no removed member leading or followed. The run lasts until
//! each kind has run once (each takes seconds), at most twice its
//! duration. Each run starts its own 3-node cluster on loopback from
//! this binary, one at a time.
//!
//! Removing the leader is its own test: the leader hands leadership over
//! before it is removed, so it never leads on alone.

use serde_json::Value;
use std::process::Command;

/// The membership kinds of the first test, and a step each must have
/// recorded.
const KINDS: [(&str, &str); 6] = [
    ("transfer", "transfer: leadership from node"),
    ("add-learner", "add-learner: learner"),
    ("remove-follower", "remove-follower: follower"),
    ("replace", "replace: node"),
    ("grow-shrink", "grow-shrink: learner"),
    ("rolling-restart", "rolling-restart: node"),
];

/// One run at a time: each is a whole cluster under load.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `oncekv verify` for `duration` under the fault kinds `kinds`;
/// its JSON, and the history's fault windows ([`faults`]). Asserts a
/// PASS with every checker, no failed change and no disruption.
fn passes(seed: &str, duration: &str, kinds: &str) -> (Value, Vec<(String, String)>) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().expect("a temporary folder");
    let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args([
            "verify",
            "--duration",
            duration,
            "--seed",
            seed,
            "--clients",
            "4",
        ])
        .args(["--faults", kinds, "-o", "json", "--out"])
        .arg(out.path())
        .output()
        .expect("oncekv runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!("not one JSON object ({error}):\n{stdout}\nstderr:\n{stderr}")
    });
    assert_eq!(output.status.code(), Some(0), "expected PASS: {json:#}");
    assert_eq!(json["verdict"], "PASS", "{json:#}");
    for empty in ["nemesis_failures", "crashed", "disruptions"] {
        assert_eq!(json[empty], serde_json::json!([]), "{empty}: {json:#}");
    }
    for checker in json["checkers"].as_array().expect("checkers") {
        assert_eq!(checker["status"], "pass", "{json:#}");
    }
    let windows = faults(&out.path().join("history.jsonl"));
    (json, windows)
}

/// The history's fault windows: (kind, detail), in the order they began.
fn faults(history: &std::path::Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(history).expect("a history");
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["event"] == "fault_started")
        .map(|event| {
            (
                event["kind"].as_str().unwrap_or_default().to_string(),
                event["detail"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn every_membership_change_happens_under_load_and_every_checker_passes() {
    let names: Vec<&str> = KINDS.iter().map(|(name, _)| *name).collect();
    let (_, windows) = passes("26", "40s", &format!("{},drop-reply", names.join(",")));
    let details: Vec<&str> = windows.iter().map(|(_, detail)| detail.as_str()).collect();
    for (kind, step) in KINDS {
        assert!(
            details.iter().any(|detail| detail.starts_with(step)),
            "no `{step}` step of {kind} in the history: {details:#?}"
        );
    }
    // A learner caught up and was promoted (a new node, from a snapshot
    // once the leader's log was purged), and a leadership transfer and a
    // rolling restart are recorded as such.
    assert!(
        details
            .iter()
            .any(|d| d.contains("caught up (holding a snapshot at index")),
        "no learner caught up from a snapshot: {details:#?}"
    );
    assert!(windows.iter().any(|(kind, _)| kind == "leader_transfer"));
    assert!(windows.iter().any(|(kind, _)| kind == "restart"));
    // The first removed follower was cut off so it missed its removal; it
    // ran on, was watched, and no member followed it.
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("remove-follower: follower") && d.contains("cut off from")),
        "{details:#?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("remove-follower: watched") && d.contains("removed node")),
        "no removed follower watched: {details:#?}"
    );
    // 3 -> 5 -> 3: two learners promoted within one grow-shrink.
    let grown = details
        .iter()
        .filter(|d| d.starts_with("grow-shrink: learner"))
        .count();
    assert!(grown >= 2, "{details:#?}");
}

#[test]
fn a_removed_leader_steps_down_and_a_fresh_member_takes_its_place() {
    let (_, windows) = passes("27", "10s", "remove-leader");
    let details: Vec<&str> = windows.iter().map(|(_, detail)| detail.as_str()).collect();
    for step in [
        "remove-leader: leader",
        "remove-leader: watched",
        "remove-leader: learner",
    ] {
        assert!(
            details.iter().any(|detail| detail.starts_with(step)),
            "no `{step}` step in the history: {details:#?}"
        );
    }
}
