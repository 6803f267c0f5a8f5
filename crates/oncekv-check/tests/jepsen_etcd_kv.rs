//! Validates the KV checker against the same recorded Jepsen etcd
//! histories as the register checker (`tests/jepsen_etcd.rs`, corpus in
//! `tests/data/jepsen-etcd/`, or `ONCEKV_HISTORIES`): each register history
//! is translated into a KV history and must get the verdict of
//! `EXPECTED.txt`.
//!
//! The translation is how etcd itself runs these operations: a read is a
//! get, a write a put (acknowledged, previous value not reported), and a
//! compare-and-set the transaction `if value(k) == expected then put k new`
//! (`exists(k) == false` for an absent expectation), which succeeded
//! exactly when the CAS swapped. So this also exercises the transaction
//! path of the KV model on real histories.

use oncekv_check::jepsen::parse_log_file;
use oncekv_check::kv_history::{KvCall, KvHistory, KvOperation, KvOutput};
use oncekv_check::record::{
    Bytes, Compare, CompareOp, CompareTarget, KeyRange, Txn, TxnOp, TxnOpResult,
};
use oncekv_check::{Bounds, Call, History, Output, Verdict, check_with_stats};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn corpus_dir() -> PathBuf {
    let root = match std::env::var_os("ONCEKV_HISTORIES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"),
    };
    let dir = if root.join("EXPECTED.txt").is_file() {
        root
    } else {
        root.join("jepsen-etcd")
    };
    assert!(
        dir.join("EXPECTED.txt").is_file(),
        "the Jepsen etcd corpus was not found in {}",
        dir.display()
    );
    dir
}

/// `(file, linearizable?)` from `EXPECTED.txt`.
fn expected_verdicts(dir: &Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(dir.join("EXPECTED.txt")).expect("EXPECTED.txt");
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split_whitespace();
            let file = fields.next().expect("a file").to_owned();
            let linearizable = match fields.next() {
                Some("linearizable") => true,
                Some("not-linearizable") => false,
                other => panic!("{line:?}: unknown verdict {other:?}"),
            };
            (file, linearizable)
        })
        .collect()
}

fn to_kv(history: &History<Call>) -> KvHistory {
    let ops = history
        .operations()
        .iter()
        .map(|op| {
            let key = Bytes(op.call.key().to_vec());
            let (call, output) = match &op.call {
                Call::Read { .. } => (
                    KvCall::Op(TxnOp::Get { key }),
                    op.output.as_ref().map(|output| match output {
                        Output::Read(value) => KvOutput::Op(TxnOpResult::Get {
                            value: value.clone().map(Bytes),
                        }),
                        _ => KvOutput::Acknowledged,
                    }),
                ),
                Call::Write { value, .. } => (
                    KvCall::Op(TxnOp::Put {
                        key,
                        value: Bytes(value.clone()),
                    }),
                    op.output.as_ref().map(|_| KvOutput::Acknowledged),
                ),
                Call::Cas { expected, new, .. } => {
                    let compare = match expected {
                        Some(value) => Compare {
                            range: KeyRange::Key(key.clone()),
                            op: CompareOp::Equal,
                            target: CompareTarget::Value(Bytes(value.clone())),
                        },
                        None => Compare {
                            range: KeyRange::Key(key.clone()),
                            op: CompareOp::Equal,
                            target: CompareTarget::Exists(false),
                        },
                    };
                    let txn = Txn {
                        compares: vec![compare],
                        success: vec![TxnOp::Put {
                            key,
                            value: Bytes(new.clone()),
                        }],
                        failure: vec![],
                    };
                    let output = op.output.as_ref().map(|output| match output {
                        Output::Cas { swapped: true } => KvOutput::Txn {
                            succeeded: true,
                            results: vec![TxnOpResult::Put {
                                previous: expected.clone().map(Bytes),
                            }],
                        },
                        Output::Cas { swapped: false } => KvOutput::Txn {
                            succeeded: false,
                            results: vec![],
                        },
                        _ => KvOutput::Acknowledged,
                    });
                    (KvCall::Txn(txn), output)
                }
            };
            KvOperation {
                client: op.client,
                call,
                output,
                invoke_ns: op.invoke_ns,
                complete_ns: op.complete_ns,
            }
        })
        .collect();
    KvHistory::new(ops).unwrap_or_else(|err| panic!("translation: {err}"))
}

#[test]
fn every_history_gets_its_expected_verdict_as_kv() {
    let dir = corpus_dir();
    let bounds = Bounds {
        time_limit: Duration::from_secs(10),
        ..Bounds::default()
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for (file, linearizable) in expected_verdicts(&dir) {
        let history = parse_log_file(&dir.join(&file)).unwrap_or_else(|err| panic!("{err}"));
        let (verdict, stats) = check_with_stats(&to_kv(&history), &bounds);
        let right = match verdict {
            Verdict::Linearizable => linearizable,
            Verdict::NotLinearizable { .. } => !linearizable,
            Verdict::Unknown { .. } => false,
        };
        if !right {
            failures.push(format!(
                "{file}: expected linearizable={linearizable}, got {verdict} ({stats:?})"
            ));
        }
        checked += 1;
    }
    assert!(checked > 0);
    assert!(
        failures.is_empty(),
        "{} of {checked} histories got the wrong verdict:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
