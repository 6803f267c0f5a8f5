//! Transactions and deletes in recorded runs: their JSON form, their
//! checking by `verify` (whose linearizability verdict is the KV
//! checker's), and malformed ones refused as typed errors.

mod common;

use common::assert_status;
use oncekv_check::checkers::{CheckerVerdict, Status};
use oncekv_check::coverage::CoverageRequirements;
use oncekv_check::record::{
    Compare, CompareOp, CompareTarget, Event, KeyRange, Op, Record, RecordError, RecordWriter,
    Reply, Txn, TxnOp, read_events,
};
use oncekv_check::verify::{VerifyConfig, verify};

fn record(lines: &str) -> Result<Record, RecordError> {
    Record::from_events(read_events(lines.as_bytes())?)
}

fn config() -> VerifyConfig {
    VerifyConfig {
        coverage: CoverageRequirements::none(),
        ..VerifyConfig::default()
    }
}

/// Two accounts with 5 each, a transfer of 1 guarded by a compare, then an
/// atomic read of both reporting `a` and `b`.
fn transfer_run(a: &str, b: &str) -> String {
    format!(
        r#"
{{"event":"invoke","at_ns":1,"client":1,"op_id":1,"request":{{"session":3,"seq":1}},"op":{{"type":"put","key":"a","value":"5"}}}}
{{"event":"complete","at_ns":2,"client":1,"op_id":1,"attempts":1,"outcome":{{"status":"ok","reply":{{"type":"put"}}}}}}
{{"event":"invoke","at_ns":3,"client":1,"op_id":2,"request":{{"session":3,"seq":2}},"op":{{"type":"put","key":"b","value":"5"}}}}
{{"event":"complete","at_ns":4,"client":1,"op_id":2,"attempts":1,"outcome":{{"status":"ok","reply":{{"type":"put"}}}}}}
{{"event":"invoke","at_ns":5,"client":2,"op_id":3,"request":{{"session":4,"seq":1}},"op":{{"type":"txn","compares":[{{"range":{{"key":"a"}},"op":"greater","target":{{"value":"0"}}}}],"success":[{{"type":"incr","key":"a","by":-1}},{{"type":"incr","key":"b","by":1}}],"failure":[]}}}}
{{"event":"complete","at_ns":9,"client":2,"op_id":3,"attempts":2,"outcome":{{"status":"ok","reply":{{"type":"txn","succeeded":true,"results":[{{"type":"incr","value":4}},{{"type":"incr","value":6}}]}}}}}}
{{"event":"invoke","at_ns":10,"client":1,"op_id":4,"op":{{"type":"txn","success":[{{"type":"get","key":"a"}},{{"type":"get","key":"b"}}]}}}}
{{"event":"complete","at_ns":11,"client":1,"op_id":4,"attempts":1,"outcome":{{"status":"ok","reply":{{"type":"txn","succeeded":true,"results":[{{"type":"get","value":"{a}"}},{{"type":"get","value":"{b}"}}]}}}}}}
{{"event":"invoke","at_ns":12,"client":1,"op_id":5,"op":{{"type":"delete","key":"a"}}}}
{{"event":"complete","at_ns":13,"client":1,"op_id":5,"attempts":1,"outcome":{{"status":"ok","reply":{{"type":"delete","previous":"{a}"}}}}}}
"#
    )
}

#[test]
fn a_conserving_transfer_passes_verify() {
    let run = record(&transfer_run("4", "6")).expect("valid record");
    let verification = verify(&run, &config());
    assert_status(&verification.kv, Status::Pass);
    let text = verification.report.to_text();
    assert!(text.contains("linearizable_kv"), "{text}");
}

#[test]
fn a_transfer_that_loses_money_fails_verify() {
    let run = record(&transfer_run("4", "5")).expect("valid record");
    let verification = verify(&run, &config());
    assert_status(&verification.kv, Status::Fail);
    let explanation = verification.kv.explanation();
    assert!(explanation.contains("keys {a, b}"), "{explanation}");
    assert!(explanation.contains("op #4"), "{explanation}");
}

#[test]
fn txn_events_round_trip_through_the_file_format() {
    let events = read_events(transfer_run("4", "6").as_bytes()).expect("parses");
    let mut buffer = Vec::new();
    {
        let mut writer = RecordWriter::new(&mut buffer);
        for event in &events {
            writer.write(event).expect("writes");
        }
        writer.flush().expect("flushes");
    }
    let again = read_events(buffer.as_slice()).expect("reads back");
    assert_eq!(again, events);
    let Some(Event::Invoke(invoke)) = events.get(4) else {
        panic!("{events:?}");
    };
    assert_eq!(
        invoke.op,
        Op::Txn(Txn {
            compares: vec![Compare {
                range: KeyRange::Key("a".into()),
                op: CompareOp::Greater,
                target: CompareTarget::Value("0".into()),
            }],
            success: vec![
                TxnOp::Incr {
                    key: "a".into(),
                    by: -1
                },
                TxnOp::Incr {
                    key: "b".into(),
                    by: 1
                },
            ],
            failure: vec![],
        })
    );
}

#[test]
fn txn_replies_that_do_not_answer_the_branch_are_refused() {
    let invoke = r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"txn","success":[{"type":"get","key":"a"}],"failure":[]}}"#;
    for reply in [
        // One result too few.
        r#"{"type":"txn","succeeded":true,"results":[]}"#,
        // The failure branch is empty.
        r#"{"type":"txn","succeeded":false,"results":[{"type":"get"}]}"#,
        // A result of another kind.
        r#"{"type":"txn","succeeded":true,"results":[{"type":"incr","value":1}]}"#,
        // Not a txn reply at all.
        r#"{"type":"delete"}"#,
    ] {
        let complete = format!(
            r#"{{"event":"complete","at_ns":2,"client":1,"op_id":1,"attempts":1,"outcome":{{"status":"ok","reply":{reply}}}}}"#
        );
        let result = record(&format!("{invoke}\n{complete}\n"));
        assert!(
            matches!(result, Err(RecordError::Inconsistent { index: 1, .. })),
            "{reply}: {result:?}"
        );
    }
    // A well-formed reply is accepted.
    let complete = r#"{"event":"complete","at_ns":2,"client":1,"op_id":1,"attempts":1,"outcome":{"status":"ok","reply":{"type":"txn","succeeded":true,"results":[{"type":"get"}]}}}"#;
    let run = record(&format!("{invoke}\n{complete}\n")).expect("valid");
    assert!(matches!(
        run.ops[0].outcome.reply(),
        Some(Reply::Txn {
            succeeded: true,
            ..
        })
    ));
}

#[test]
fn malformed_txn_lines_are_parse_errors() {
    for op in [
        r#"{"type":"txn","compares":[{"range":{"key":"a"},"op":"about","target":{"value":"1"}}]}"#,
        r#"{"type":"txn","compares":[{"range":{"keys":"a"},"op":"equal","target":{"value":"1"}}]}"#,
        r#"{"type":"txn","compares":[{"range":{"key":"a"},"op":"equal","target":{"version":-1}}]}"#,
        r#"{"type":"txn","success":[{"type":"teleport","key":"a"}]}"#,
        r#"{"type":"txn","success":{"type":"get","key":"a"}}"#,
        r#"{"type":"delete"}"#,
    ] {
        let line = format!(r#"{{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{op}}}"#);
        assert!(
            matches!(
                read_events(line.as_bytes()),
                Err(RecordError::Parse { line: 1, .. })
            ),
            "{op}"
        );
    }
}
