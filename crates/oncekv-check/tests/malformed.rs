//! Malformed record files are typed errors, never panics; and records with
//! extreme but well-formed values go through every checker and the report
//! without panicking.

use oncekv_check::record::{
    Answer, AttemptResponse, Bytes, Completion, Event, FaultKind, FaultStart, FinalValue,
    Invocation, LeaderChange, Op, Outcome, Record, RecordError, Reply, RequestIdentity,
    read_events,
};
use oncekv_check::report::HtmlOptions;
use oncekv_check::verify::{VerifyConfig, verify};

#[test]
fn malformed_lines_are_errors() {
    let lines = [
        "{",
        "[]",
        "null",
        "42",
        r#"{"event":"invoke"}"#,
        r#"{"event":"invoke","at_ns":-1,"client":1,"op_id":1,"op":{"type":"get","key":"k"}}"#,
        r#"{"event":"invoke","at_ns":18446744073709551616,"client":1,"op_id":1,"op":{"type":"get","key":"k"}}"#,
        r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"fly","key":"k"}}"#,
        r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"get","key":{"hex":"f"}}}"#,
        r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"get","key":{"hex":"00","x":1}}}"#,
        r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"get","key":{}}}"#,
        r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"op":{"type":"get","key":7}}"#,
        r#"{"event":"complete","at_ns":1,"client":1,"op_id":1,"attempts":1,"outcome":{"status":"maybe"}}"#,
        r#"{"event":"complete","at_ns":1,"client":1,"op_id":1,"attempts":-2,"outcome":{"status":"unknown"}}"#,
        r#"{"event":"response","at_ns":1,"client":1,"attempt":1,"answer":{"type":"applied"}}"#,
        r#"{"event":"fault_started","at_ns":1,"fault_id":1,"kind":7}"#,
        "\u{feff}{}",
    ];
    for line in lines {
        match read_events(line.as_bytes()) {
            Err(RecordError::Parse { line: 1, .. }) => {}
            other => panic!("{line:?} gave {other:?}"),
        }
    }
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(read_events(deep.as_bytes()).is_err());
    let binary: &[u8] = &[0xff, 0xfe, 0x00, b'\n'];
    assert!(read_events(binary).is_err());
}

#[test]
fn inconsistent_identities_are_errors() {
    let line = r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"request":{"seq":3},"op":{"type":"get","key":"k"}}"#;
    let events = read_events(line.as_bytes()).expect("parses");
    assert!(matches!(
        Record::from_events(events),
        Err(RecordError::Inconsistent { index: 0, .. })
    ));
}

#[test]
fn missing_files_are_errors() {
    let missing = std::path::Path::new("/nonexistent/oncekv/run.jsonl");
    assert!(matches!(
        Record::load(missing),
        Err(RecordError::File { .. })
    ));
}

#[test]
fn extreme_values_do_not_panic() {
    let mut events = vec![Event::FaultStarted(FaultStart {
        at_ns: u64::MAX,
        fault_id: u64::MAX,
        kind: FaultKind::Other,
        target: Some(u64::MAX),
        detail: Some("<&>\u{0}".to_owned()),
    })];
    let ops = [
        (
            Op::Incr {
                key: "c".into(),
                by: i64::MIN,
            },
            Reply::Incr { value: i64::MAX },
        ),
        (
            Op::Incr {
                key: "c".into(),
                by: i64::MAX,
            },
            Reply::Incr { value: i64::MIN },
        ),
        (
            Op::Append {
                key: Bytes(vec![0xff]),
                token: Bytes(vec![]),
            },
            Reply::Append { length: u64::MAX },
        ),
        (
            Op::Append {
                key: "a".into(),
                token: "t".into(),
            },
            Reply::Append { length: u64::MAX },
        ),
        (
            Op::Cas {
                key: "r".into(),
                expected: None,
                new: Bytes(vec![0, 1, 2]),
            },
            Reply::Cas {
                swapped: false,
                current: None,
            },
        ),
    ];
    for (i, (op, reply)) in ops.into_iter().enumerate() {
        let id = u64::MAX - i as u64;
        events.push(Event::Invoke(Invocation {
            at_ns: 0,
            client: u64::MAX,
            op_id: id,
            request: RequestIdentity::session(u64::MAX, u64::MAX),
            op,
        }));
        events.push(Event::Complete(Completion {
            at_ns: u64::MAX,
            client: u64::MAX,
            op_id: id,
            attempts: u32::MAX,
            outcome: Outcome::Ok {
                reply: reply.clone(),
                canonical: None,
            },
            request: None,
        }));
        events.push(Event::Response(AttemptResponse {
            at_ns: u64::MAX,
            client: u64::MAX,
            op_id: Some(id),
            request: RequestIdentity::session(u64::MAX, u64::MAX),
            attempt: u32::MAX,
            node: None,
            answer: Answer::Replayed {
                reply,
                canonical: None,
                applied_index: Some(u64::MAX),
            },
            dropped_after_commit: true,
            batch: 1,
        }));
    }
    events.push(Event::LeaderChanged(LeaderChange {
        at_ns: u64::MAX,
        leader: None,
        term: Some(u64::MAX),
        observer: None,
    }));
    for (key, value) in [("c", "99999999999999999999999"), ("a", "t;t"), ("r", "x")] {
        events.push(Event::FinalValue(FinalValue {
            at_ns: u64::MAX,
            key: key.into(),
            value: Some(value.into()),
        }));
    }
    let record = Record::from_events(events).expect("consistent");
    let verification = verify(&record, &VerifyConfig::default());
    let _ = verification.report.to_text();
    let html = verification
        .report
        .to_html(&record, &HtmlOptions::default());
    assert!(html.contains("</svg>"));
    assert!(!html.contains('\u{0}'));
}
