//! Transfers and watchers through the whole pipeline: events written as
//! JSON lines, read back, folded, and judged by `verify`. A correct run
//! passes both checkers (and the KV linearizability checker, which sees
//! the transfers as transactions); a transfer applied twice and a watcher
//! that skipped a change are each caught.

mod common;

use common::assert_status;
use oncekv_check::checkers::{CheckerVerdict, Status};
use oncekv_check::record::{
    Bytes, Completion, Event, FinalValue, Invocation, Op, Outcome, Record, RecordWriter, Reply,
    RequestIdentity, Txn, TxnOp, TxnOpResult, WatchEnd, WatchKind, WatchSeen, WatchStart,
    WatchStop,
};
use oncekv_check::verify::{VerifyConfig, verify};

fn transfer(from: &str, to: &str, amount: i64, token: &str) -> Txn {
    Txn {
        compares: Vec::new(),
        success: vec![
            TxnOp::Incr {
                key: Bytes::from(from),
                by: -amount,
            },
            TxnOp::Incr {
                key: Bytes::from(to),
                by: amount,
            },
            TxnOp::Append {
                key: Bytes::from("ledger"),
                value: Bytes::from(format!("{token};").as_str()),
            },
        ],
        failure: Vec::new(),
    }
}

/// Two transfers, applied at revisions 10 and 11, watched by two watchers
/// and the reference. `skip` drops watcher 1's second change; `twice`
/// applies the second transfer twice (revisions 11 and 12).
fn events(skip: bool, twice: bool) -> Vec<Event> {
    let mut events = Vec::new();
    let mut ledger = String::new();
    let mut balances = [0i64; 2];
    let mut changes: Vec<(u64, &str, String)> = Vec::new();
    let mut revision = 9;
    let plan = [
        ("acct/0", "acct/1", 5, "c1-1"),
        ("acct/1", "acct/0", 2, "c1-2"),
    ];
    for (n, (from, to, amount, token)) in plan.into_iter().enumerate() {
        let op_id = n as u64 + 1;
        let at = op_id * 100;
        events.push(Event::Invoke(Invocation {
            at_ns: at,
            client: 1,
            op_id,
            request: RequestIdentity::session(7, op_id),
            op: Op::Txn(transfer(from, to, amount, token)),
        }));
        let times = if twice && n == 1 { 2 } else { 1 };
        let mut results = Vec::new();
        for _ in 0..times {
            revision += 1;
            let (f, t) = (from.ends_with('1') as usize, to.ends_with('1') as usize);
            balances[f] -= amount;
            balances[t] += amount;
            ledger.push_str(&format!("{token};"));
            changes.push((revision, from, balances[f].to_string()));
            changes.push((revision, to, balances[t].to_string()));
            results = vec![
                TxnOpResult::Incr { value: balances[f] },
                TxnOpResult::Incr { value: balances[t] },
                TxnOpResult::Append {
                    length: ledger.len() as u64,
                },
            ];
        }
        events.push(Event::Complete(Completion {
            at_ns: at + 50,
            client: 1,
            op_id,
            attempts: times as u32,
            outcome: Outcome::Ok {
                reply: Reply::Txn {
                    succeeded: true,
                    results,
                },
                canonical: None,
            },
            request: None,
        }));
    }
    let last = revision;
    for (watcher, reference) in [(1, false), (2, false), (3, true)] {
        events.push(Event::WatchStarted(WatchStart {
            at_ns: 1,
            watcher,
            prefix: Bytes::from("acct/"),
            start_revision: 1,
            reference,
        }));
        for (i, (revision, key, value)) in changes.iter().enumerate() {
            if skip && watcher == 1 && i == 2 {
                continue;
            }
            events.push(Event::Watched(WatchSeen {
                at_ns: 500 + i as u64,
                watcher,
                revision: *revision,
                key: Bytes::from(*key),
                kind: WatchKind::Put,
                value: Some(Bytes::from(value.as_str())),
            }));
        }
        events.push(Event::WatchStopped(WatchStop {
            at_ns: 600,
            watcher,
            delivered_through: last,
            end: WatchEnd::Stopped,
        }));
    }
    for (key, value) in [
        ("acct/0", balances[0].to_string()),
        ("acct/1", balances[1].to_string()),
        ("ledger", ledger),
    ] {
        events.push(Event::FinalValue(FinalValue {
            at_ns: 700,
            key: Bytes::from(key),
            value: Some(Bytes::from(value.as_str())),
        }));
    }
    events
}

fn through_a_file(events: &[Event], name: &str) -> Record {
    let path = std::env::temp_dir().join(format!(
        "oncekv-transfers-{name}-{}.jsonl",
        std::process::id()
    ));
    let mut writer = RecordWriter::create(&path).expect("create");
    for event in events {
        writer.write(event).expect("write");
    }
    drop(writer);
    let record = Record::load(&path).expect("load");
    let _ = std::fs::remove_file(&path);
    record
}

#[test]
fn a_correct_run_passes_both() {
    let record = through_a_file(&events(false, false), "correct");
    let verification = verify(&record, &VerifyConfig::default());
    assert_status(&verification.transfers, Status::Pass);
    assert_eq!(verification.transfers.acknowledged, 2);
    assert_status(&verification.watches, Status::Pass);
    assert_eq!(verification.watches.watchers, 2);
    assert_status(&verification.kv, Status::Pass);
    let text = verification.report.to_text();
    assert!(text.contains("transfers"), "{text}");
    assert!(text.contains("watches"), "{text}");
}

#[test]
fn a_transfer_applied_twice_is_caught() {
    let record = through_a_file(&events(false, true), "twice");
    let verification = verify(&record, &VerifyConfig::default());
    assert_eq!(verification.transfers.status(), Status::Fail);
    assert!(
        verification
            .transfers
            .to_string()
            .contains("applied 2 times"),
        "{}",
        verification.transfers
    );
}

#[test]
fn a_watcher_that_skipped_a_change_is_caught() {
    let record = through_a_file(&events(true, false), "skip");
    let verification = verify(&record, &VerifyConfig::default());
    assert_eq!(verification.watches.status(), Status::Fail);
    let text = verification.watches.to_string();
    assert!(text.contains("watcher 1 missed"), "{text}");
    assert!(!text.contains("watcher 2"), "{text}");
}
