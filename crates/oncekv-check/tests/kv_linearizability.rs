//! Hand-made KV histories with known verdicts: anomalies the checker must
//! refuse (a stale read, a lost append, an append or an incr applied
//! twice, a half-applied transaction, a transfer that does not conserve
//! its sum, a value nobody wrote), histories it must accept (overlapping
//! operations, unknown outcomes, transactions, prefixes), and the bounds
//! that make it answer Unknown.

use oncekv_check::kv_history::{KvCall, KvHistory, KvOperation, KvOutput};
use oncekv_check::record::{
    Bytes, Compare, CompareOp, CompareTarget, KeyRange, KeyValue, Txn, TxnOp, TxnOpResult,
};
use oncekv_check::{Bounds, UnknownReason, Verdict, check, check_with_stats};
use std::time::Duration;

fn b(text: &str) -> Bytes {
    Bytes::from(text)
}

fn done(client: u64, call: KvCall, output: KvOutput, at: (u64, u64)) -> KvOperation {
    KvOperation {
        client,
        call,
        output: Some(output),
        invoke_ns: at.0,
        complete_ns: Some(at.1),
    }
}

fn unknown(client: u64, call: KvCall, invoke: u64) -> KvOperation {
    KvOperation {
        client,
        call,
        output: None,
        invoke_ns: invoke,
        complete_ns: None,
    }
}

fn single(op: TxnOp) -> KvCall {
    KvCall::Op(op)
}

fn put(client: u64, key: &str, value: &str, previous: Option<&str>, at: (u64, u64)) -> KvOperation {
    done(
        client,
        single(TxnOp::Put {
            key: b(key),
            value: b(value),
        }),
        KvOutput::Op(TxnOpResult::Put {
            previous: previous.map(b),
        }),
        at,
    )
}

fn get(client: u64, key: &str, value: Option<&str>, at: (u64, u64)) -> KvOperation {
    done(
        client,
        single(TxnOp::Get { key: b(key) }),
        KvOutput::Op(TxnOpResult::Get {
            value: value.map(b),
        }),
        at,
    )
}

/// A prefix read that listed these keys and values.
fn get_prefix(client: u64, prefix: &str, entries: &[(&str, &str)], at: (u64, u64)) -> KvOperation {
    let entries = entries
        .iter()
        .map(|&(key, value)| KeyValue {
            key: b(key),
            value: b(value),
        })
        .collect();
    done(
        client,
        single(TxnOp::GetPrefix { prefix: b(prefix) }),
        KvOutput::Op(TxnOpResult::GetPrefix { entries }),
        at,
    )
}

fn append_call(key: &str, suffix: &str) -> KvCall {
    single(TxnOp::Append {
        key: b(key),
        value: b(suffix),
    })
}

fn append(client: u64, key: &str, suffix: &str, length: u64, at: (u64, u64)) -> KvOperation {
    done(
        client,
        append_call(key, suffix),
        KvOutput::Op(TxnOpResult::Append { length }),
        at,
    )
}

fn incr_call(key: &str, by: i64) -> KvCall {
    single(TxnOp::Incr { key: b(key), by })
}

fn incr(client: u64, key: &str, by: i64, value: i64, at: (u64, u64)) -> KvOperation {
    done(
        client,
        incr_call(key, by),
        KvOutput::Op(TxnOpResult::Incr { value }),
        at,
    )
}

/// Moves `amount` from `from` to `to` with two increments, as one txn.
fn transfer_txn(from: &str, to: &str, amount: i64) -> KvCall {
    KvCall::Txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::Incr {
                key: b(from),
                by: -amount,
            },
            TxnOp::Incr {
                key: b(to),
                by: amount,
            },
        ],
        failure: vec![],
    })
}

fn transfer(client: u64, from: (&str, i64), to: (&str, i64), at: (u64, u64)) -> KvOperation {
    let amount = 1;
    done(
        client,
        transfer_txn(from.0, to.0, amount),
        KvOutput::Txn {
            succeeded: true,
            results: vec![
                TxnOpResult::Incr { value: from.1 },
                TxnOpResult::Incr { value: to.1 },
            ],
        },
        at,
    )
}

/// Reads both keys atomically.
fn read_both(client: u64, keys: (&str, &str), values: (&str, &str), at: (u64, u64)) -> KvOperation {
    done(
        client,
        KvCall::Txn(Txn {
            compares: vec![],
            success: vec![TxnOp::Get { key: b(keys.0) }, TxnOp::Get { key: b(keys.1) }],
            failure: vec![],
        }),
        KvOutput::Txn {
            succeeded: true,
            results: vec![
                TxnOpResult::Get {
                    value: Some(b(values.0)),
                },
                TxnOpResult::Get {
                    value: Some(b(values.1)),
                },
            ],
        },
        at,
    )
}

fn refused(ops: Vec<KvOperation>) -> String {
    let history = KvHistory::new(ops).expect("valid history");
    let result = check(&history, &Bounds::default());
    assert!(
        result.is_not_linearizable(),
        "expected a violation, got {result}"
    );
    result.describe(&history)
}

fn accepted(ops: Vec<KvOperation>) {
    let history = KvHistory::new(ops).expect("valid history");
    let result = check(&history, &Bounds::default());
    assert!(
        result.is_linearizable(),
        "expected linearizable, got {}",
        result.describe(&history)
    );
}

// ---- anomalies that must be refused ----

#[test]
fn a_stale_read_is_refused() {
    let text = refused(vec![
        put(1, "k", "1", None, (0, 1)),
        put(1, "k", "2", Some("1"), (2, 3)),
        get(2, "k", Some("1"), (4, 5)),
    ]);
    assert!(text.contains("then #2 cannot be placed"), "{text}");
}

#[test]
fn a_lost_append_is_refused() {
    // Both appends were acknowledged; the later read lacks the first.
    refused(vec![
        append(1, "a", "x;", 2, (0, 1)),
        append(2, "a", "y;", 4, (2, 3)),
        get(3, "a", Some("y;"), (4, 5)),
    ]);
    // Lost before anyone read: the key is empty again.
    refused(vec![
        append(1, "a", "x;", 2, (0, 1)),
        get(3, "a", None, (4, 5)),
    ]);
}

#[test]
fn an_append_applied_twice_is_refused() {
    refused(vec![
        append(1, "a", "x;", 2, (0, 1)),
        get(3, "a", Some("x;x;"), (4, 5)),
    ]);
    // Seen only through lengths: the second append reports one too many.
    refused(vec![
        append(1, "a", "x;", 2, (0, 1)),
        append(2, "a", "y;", 6, (2, 3)),
    ]);
}

#[test]
fn an_incr_applied_twice_is_refused() {
    refused(vec![
        incr(1, "c", 1, 1, (0, 1)),
        get(2, "c", Some("2"), (2, 3)),
    ]);
    // An unknown increment may apply once, not twice.
    refused(vec![
        incr(1, "c", 1, 1, (0, 1)),
        unknown(2, incr_call("c", 5), 2),
        get(3, "c", Some("11"), (4, 5)),
    ]);
}

#[test]
fn a_half_applied_txn_is_refused() {
    let swap = KvCall::Txn(Txn {
        compares: vec![Compare {
            range: KeyRange::Key(b("a")),
            op: CompareOp::Equal,
            target: CompareTarget::Value(b("10")),
        }],
        success: vec![
            TxnOp::Put {
                key: b("a"),
                value: b("5"),
            },
            TxnOp::Put {
                key: b("b"),
                value: b("5"),
            },
        ],
        failure: vec![],
    });
    let text = refused(vec![
        put(1, "a", "10", None, (0, 1)),
        done(
            1,
            swap,
            KvOutput::Txn {
                succeeded: true,
                results: vec![
                    TxnOpResult::Put {
                        previous: Some(b("10")),
                    },
                    TxnOpResult::Put { previous: None },
                ],
            },
            (2, 3),
        ),
        get(2, "a", Some("5"), (4, 5)),
        get(2, "b", None, (6, 7)),
    ]);
    assert!(text.contains("keys {a, b}"), "{text}");
}

#[test]
fn a_transfer_that_does_not_conserve_the_sum_is_refused() {
    // a and b start at 5 and 5; two concurrent transfers each move 1 from a
    // to b. An atomic read of both may see 5/5, 4/6 or 3/7, never 4/5.
    let setup = vec![
        put(1, "a", "5", None, (0, 1)),
        put(1, "b", "5", None, (0, 1)),
    ];
    let mut good = setup.clone();
    good.extend([
        transfer(2, ("a", 4), ("b", 6), (10, 20)),
        transfer(3, ("a", 3), ("b", 7), (10, 20)),
        read_both(4, ("a", "b"), ("4", "6"), (12, 18)),
        read_both(4, ("a", "b"), ("3", "7"), (30, 40)),
    ]);
    accepted(good);
    let mut bad = setup;
    bad.extend([
        transfer(2, ("a", 4), ("b", 6), (10, 20)),
        transfer(3, ("a", 3), ("b", 7), (10, 20)),
        read_both(4, ("a", "b"), ("4", "5"), (12, 18)),
    ]);
    refused(bad);
}

#[test]
fn a_read_of_a_value_never_written_is_refused() {
    refused(vec![
        put(1, "k", "1", None, (0, 1)),
        put(2, "k", "2", None, (0, 1)),
        get(3, "k", Some("3"), (2, 3)),
    ]);
    // A prefix read listing a key nobody wrote.
    refused(vec![
        put(1, "p/1", "1", None, (0, 1)),
        get_prefix(2, "p/", &[("p/1", "1"), ("p/9", "9")], (2, 3)),
    ]);
}

#[test]
fn a_put_reporting_the_wrong_previous_value_is_refused() {
    refused(vec![
        put(1, "k", "1", None, (0, 1)),
        put(1, "k", "2", None, (2, 3)),
    ]);
}

#[test]
fn a_failed_compare_that_held_is_refused() {
    let guarded = KvCall::Txn(Txn {
        compares: vec![Compare {
            range: KeyRange::Key(b("k")),
            op: CompareOp::Equal,
            target: CompareTarget::Exists(true),
        }],
        success: vec![],
        failure: vec![],
    });
    refused(vec![
        put(1, "k", "1", None, (0, 1)),
        done(
            2,
            guarded,
            KvOutput::Txn {
                succeeded: false,
                results: vec![],
            },
            (2, 3),
        ),
    ]);
}

// ---- histories that must pass ----

#[test]
fn overlapping_operations_may_take_effect_in_any_order() {
    accepted(vec![
        put(1, "k", "1", None, (0, 10)),
        put(2, "k", "2", Some("1"), (0, 10)),
        get(3, "k", Some("1"), (1, 5)),
        get(3, "k", Some("2"), (11, 12)),
        done(
            4,
            single(TxnOp::Delete { key: b("k") }),
            KvOutput::Op(TxnOpResult::Delete {
                previous: Some(b("2")),
            }),
            (13, 14),
        ),
        get(3, "k", None, (15, 16)),
    ]);
}

#[test]
fn concurrent_appends_and_incrs_pass() {
    accepted(vec![
        append(1, "a", "x;", 4, (0, 10)),
        append(2, "a", "y;", 2, (0, 10)),
        get(3, "a", Some("y;"), (1, 2)),
        get(3, "a", Some("y;x;"), (11, 12)),
        incr(1, "c", 2, 2, (20, 30)),
        incr(2, "c", 3, 5, (20, 30)),
        get(3, "c", Some("5"), (31, 32)),
    ]);
}

#[test]
fn unknown_outcomes_may_apply_late_or_never() {
    accepted(vec![
        append(1, "a", "x;", 2, (0, 1)),
        unknown(2, append_call("a", "y;"), 2),
        unknown(3, append_call("a", "z;"), 2),
        get(4, "a", Some("x;"), (3, 4)),
        get(4, "a", Some("x;y;"), (5, 6)),
        incr(1, "c", 1, 1, (0, 1)),
        unknown(2, incr_call("c", 10), 2),
        get(4, "c", Some("1"), (3, 4)),
        get(4, "c", Some("11"), (5, 6)),
        // An unknown transfer seen by a later atomic read.
        put(1, "m", "5", None, (0, 1)),
        put(1, "n", "5", None, (0, 1)),
        unknown(5, transfer_txn("m", "n", 2), 10),
        read_both(6, ("m", "n"), ("3", "7"), (20, 21)),
    ]);
}

#[test]
fn unread_appends_are_decided_by_their_lengths() {
    // Forty appends on one key, eight at a time, never read: without the
    // length-only abstraction each order would be its own state.
    let mut ops = Vec::new();
    for wave in 0..5u64 {
        for client in 0..8u64 {
            let at = wave * 100;
            // Tokens are four bytes, so the i-th append reports 4i.
            let length = 4 * (wave * 8 + client + 1);
            ops.push(append(
                client,
                "a",
                &format!("{wave}-{client};"),
                length,
                (at, at + 50),
            ));
        }
    }
    let history = KvHistory::new(ops).expect("valid history");
    let (result, stats) = check_with_stats(&history, &Bounds::default());
    assert!(result.is_linearizable(), "{}", result.describe(&history));
    assert!(stats.states < 1 << 14, "{stats:?}");
}

#[test]
fn txns_with_unmodelled_compares_may_take_either_branch() {
    // A version compare on a present key is not decided by the model:
    // both reported branches pass, and an unknown txn may run either.
    let txn = |succeeded: Option<bool>, client: u64, at: (u64, u64)| {
        let call = KvCall::Txn(Txn {
            compares: vec![Compare {
                range: KeyRange::Key(b("k")),
                op: CompareOp::Equal,
                target: CompareTarget::Version(3),
            }],
            success: vec![TxnOp::Put {
                key: b("k"),
                value: b("s"),
            }],
            failure: vec![TxnOp::Put {
                key: b("k"),
                value: b("f"),
            }],
        });
        match succeeded {
            Some(succeeded) => done(
                client,
                call,
                KvOutput::Txn {
                    succeeded,
                    results: vec![TxnOpResult::Put {
                        previous: Some(b("1")),
                    }],
                },
                at,
            ),
            None => unknown(client, call, at.0),
        }
    };
    accepted(vec![
        put(1, "k", "1", None, (0, 1)),
        txn(Some(false), 2, (2, 3)),
        get(3, "k", Some("f"), (4, 5)),
    ]);
    accepted(vec![
        put(1, "k", "1", None, (0, 1)),
        txn(Some(true), 2, (2, 3)),
        get(3, "k", Some("s"), (4, 5)),
    ]);
    accepted(vec![
        put(1, "k", "1", None, (0, 1)),
        txn(None, 2, (2, 2)),
        get(3, "k", Some("f"), (4, 5)),
    ]);
    // On an absent key the version is 0, so `version == 3` is false.
    refused(vec![
        done(
            2,
            KvCall::Txn(Txn {
                compares: vec![Compare {
                    range: KeyRange::Key(b("k")),
                    op: CompareOp::Equal,
                    target: CompareTarget::Version(3),
                }],
                success: vec![],
                failure: vec![],
            }),
            KvOutput::Txn {
                succeeded: true,
                results: vec![],
            },
            (2, 3),
        ),
        put(1, "k", "1", None, (4, 5)),
    ]);
}

#[test]
fn prefix_operations_see_every_key_under_the_prefix() {
    accepted(vec![
        put(1, "p/1", "1", None, (0, 1)),
        put(2, "p/2", "2", None, (0, 1)),
        put(2, "q", "x", None, (0, 1)),
        get_prefix(3, "p/", &[("p/1", "1"), ("p/2", "2")], (2, 3)),
        done(
            3,
            single(TxnOp::DeletePrefix { prefix: b("p/") }),
            KvOutput::Op(TxnOpResult::DeletePrefix { deleted: 2 }),
            (4, 5),
        ),
        get(1, "p/1", None, (6, 7)),
        get(1, "q", Some("x"), (6, 7)),
    ]);
}

#[test]
fn multi_key_txns_join_their_keys_into_one_partition() {
    let history = KvHistory::new(vec![
        put(1, "a", "5", None, (0, 1)),
        put(1, "b", "5", None, (0, 1)),
        put(1, "c", "5", None, (0, 1)),
        transfer(2, ("a", 4), ("b", 6), (2, 3)),
    ])
    .expect("valid history");
    let (result, stats) = check_with_stats(&history, &Bounds::default());
    assert!(result.is_linearizable(), "{result}");
    assert_eq!(stats.partitions, 2, "{{a, b}} and {{c}}");
}

// ---- bounds ----

fn many_concurrent_puts(count: u32) -> KvHistory {
    let mut ops: Vec<KvOperation> = (0..count)
        .map(|i| {
            done(
                u64::from(i),
                single(TxnOp::Put {
                    key: b("k"),
                    value: Bytes::from(i.to_string()),
                }),
                KvOutput::Acknowledged,
                (0, 1000),
            )
        })
        .collect();
    ops.push(get(99, "k", Some("never"), (1001, 1002)));
    KvHistory::new(ops).expect("valid history")
}

#[test]
fn tiny_bounds_answer_unknown() {
    let history = many_concurrent_puts(12);
    let states = check(
        &history,
        &Bounds {
            max_states: 8,
            ..Bounds::default()
        },
    );
    assert!(
        matches!(
            &states,
            Verdict::Unknown {
                reason: UnknownReason::StateLimit { max_states: 8, .. }
            }
        ),
        "{states}"
    );
    let time = check(
        &history,
        &Bounds {
            time_limit: Duration::ZERO,
            ..Bounds::default()
        },
    );
    assert!(
        matches!(
            &time,
            Verdict::Unknown {
                reason: UnknownReason::TimeLimit { .. }
            }
        ),
        "{time}"
    );
    // With the default bounds the memo decides it.
    let (full, stats) = check_with_stats(&history, &Bounds::default());
    assert!(full.is_not_linearizable(), "{full}");
    assert!(stats.states < 1 << 16, "{stats:?}");
}

#[test]
fn identical_unknown_operations_are_interchangeable() {
    // Sixteen unknown increments, none of which applied: without the
    // symmetry reduction the search walks all 2^16 subsets of them before
    // finding the empty one.
    let mut ops: Vec<KvOperation> = (0..16).map(|i| unknown(i, incr_call("c", 1), i)).collect();
    ops.push(incr(99, "c", 1, 1, (100, 101)));
    // And sixteen unknown, unread appends of one length: two applied.
    ops.extend((0..16).map(|i| unknown(i, append_call("a", &format!("{:02};", i)), i)));
    ops.push(append(99, "a", "zz;", 9, (100, 101)));
    let history = KvHistory::new(ops).expect("valid history");
    let (result, stats) = check_with_stats(&history, &Bounds::default());
    assert!(result.is_linearizable(), "{}", result.describe(&history));
    assert!(stats.states < 200, "{stats:?}");
}
