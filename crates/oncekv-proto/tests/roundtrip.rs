//! Wire conversions round-trip: every request (but the internal tick),
//! outcome and reply survives `to_wire` then `from_wire` unchanged, and
//! malformed wire input is an error, never a panic.

use oncekv_proto::convert::{
    ConvertError, outcome_from_wire, outcome_to_wire, request_from_wire, request_to_wire,
};
use oncekv_proto::v1;
use oncekv_state::{
    ClusterTime, Command, Compare, CompareOp, CompareTarget, IdempotencyKey, KeyMeta, KeyRange,
    KeyScope, KeyValue, LeaseInfo, LogIndex, Malformed, Origin, Outcome, Overload, Query,
    Rejection, Reply, Request, RequestHeader, RequestId, Secret, Seq, SessionId, Txn, TxnOp,
    Update,
};
use proptest::prelude::*;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..8)
}

fn key_range() -> impl Strategy<Value = KeyRange> {
    (bytes(), prop::option::of(bytes())).prop_map(|(start, end)| KeyRange { start, end })
}

fn update<T: std::fmt::Debug + Clone>(
    value: impl Strategy<Value = T>,
) -> impl Strategy<Value = Update<T>> {
    prop::option::of(value).prop_map(|value| value.map_or(Update::Keep, Update::Set))
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (any::<u64>(), any::<u32>()).prop_map(|(ttl_ms, window)| Command::OpenSession {
            ttl_ms,
            window,
            secret: Secret(0)
        }),
        (any::<u64>(), any::<u128>()).prop_map(|(s, k)| Command::KeepAlive {
            session: SessionId(s),
            secret: Secret(k)
        }),
        (any::<u64>(), any::<u128>()).prop_map(|(s, k)| Command::CloseSession {
            session: SessionId(s),
            secret: Secret(k)
        }),
        (bytes(), bytes(), prop::option::of(".{0,4}")).prop_map(|(key, value, lease)| {
            Command::Put {
                key,
                value: value.into(),
                lease,
            }
        }),
        bytes().prop_map(|key| Command::Delete { key }),
        (bytes(), bytes()).prop_map(|(key, value)| Command::Append { key, value }),
        (bytes(), any::<i64>()).prop_map(|(key, by)| Command::Incr { key, by }),
        (bytes(), prop::option::of(bytes()), bytes())
            .prop_map(|(key, expected, new)| Command::Cas { key, expected, new }),
        (".{0,4}", any::<u64>()).prop_map(|(name, ttl_ms)| Command::LeaseGrant { name, ttl_ms }),
        ".{0,4}".prop_map(|name| Command::LeaseKeepAlive { name }),
        ".{0,4}".prop_map(|name| Command::LeaseRevoke { name }),
        bytes().prop_map(|key| Command::Read(Query::Get { key })),
        (bytes(), any::<u32>())
            .prop_map(|(prefix, limit)| Command::Read(Query::Scan { prefix, limit })),
        (key_range(), any::<u32>())
            .prop_map(|(range, limit)| Command::Read(Query::Range { range, limit })),
        (1u64.., key_range(), any::<u32>()).prop_map(|(revision, range, limit)| Command::Read(
            Query::At {
                revision,
                query: Box::new(Query::Range { range, limit })
            }
        )),
        Just(Command::Read(Query::LeaseList)),
        Just(Command::AlarmDisarm),
        (any::<u64>(), any::<bool>())
            .prop_map(|(member, raise)| Command::AlarmSet { member, raise }),
        txn().prop_map(Command::Txn),
        any::<u64>().prop_map(|revision| Command::Compact { revision }),
        (1u64.., bytes()).prop_map(|(revision, key)| Command::Read(Query::At {
            revision,
            query: Box::new(Query::Get { key })
        })),
        (1u64.., bytes(), any::<u32>()).prop_map(|(revision, prefix, limit)| Command::Read(
            Query::At {
                revision,
                query: Box::new(Query::Scan { prefix, limit })
            }
        )),
    ]
}

fn txn_op() -> impl Strategy<Value = TxnOp> {
    prop_oneof![
        (bytes(), bytes(), prop::option::of(".{0,4}")).prop_map(|(key, value, lease)| TxnOp::Put {
            key,
            value,
            lease
        }),
        bytes().prop_map(|key| TxnOp::Delete { key }),
        bytes().prop_map(|prefix| TxnOp::DeletePrefix { prefix }),
        bytes().prop_map(|key| TxnOp::Get { key }),
        (bytes(), any::<u32>()).prop_map(|(prefix, limit)| TxnOp::Scan { prefix, limit }),
        (bytes(), bytes()).prop_map(|(key, value)| TxnOp::Append { key, value }),
        (bytes(), any::<i64>()).prop_map(|(key, by)| TxnOp::Incr { key, by }),
        (bytes(), prop::option::of(bytes()), bytes()).prop_map(|(key, expected, new)| TxnOp::Cas {
            key,
            expected,
            new
        }),
        (key_range(), any::<u32>()).prop_map(|(range, limit)| TxnOp::Range { range, limit }),
        key_range().prop_map(|range| TxnOp::DeleteRange { range }),
        (bytes(), update(bytes()), update(prop::option::of(".{0,4}")))
            .prop_map(|(key, value, lease)| TxnOp::PutExisting { key, value, lease }),
    ]
}

fn txn() -> impl Strategy<Value = Txn> {
    let target = prop_oneof![
        bytes().prop_map(CompareTarget::Value),
        any::<u64>().prop_map(CompareTarget::Version),
        any::<u64>().prop_map(CompareTarget::CreateRevision),
        any::<u64>().prop_map(CompareTarget::ModRevision),
        any::<bool>().prop_map(CompareTarget::Exists),
        prop::option::of(".{0,4}").prop_map(CompareTarget::Lease),
    ];
    let scope = prop_oneof![
        Just(KeyScope::Key),
        Just(KeyScope::Prefix),
        prop::option::of(bytes()).prop_map(|end| KeyScope::Range { end }),
    ];
    let op = prop_oneof![
        Just(CompareOp::Equal),
        Just(CompareOp::NotEqual),
        Just(CompareOp::Less),
        Just(CompareOp::Greater)
    ];
    let compare = (bytes(), scope, target, op)
        .prop_map(|(key, scope, target, op)| Compare {
            key,
            scope,
            target,
            op,
        })
        .boxed();
    let flat = (
        prop::collection::vec(compare.clone(), 0..3),
        prop::collection::vec(txn_op(), 0..3),
        prop::collection::vec(txn_op(), 0..3),
    )
        .prop_map(|(compare, success, failure)| Txn {
            compare,
            success,
            failure,
        });
    // Transactions nested in either branch, a few levels deep.
    flat.prop_recursive(3, 12, 3, move |inner| {
        let op = prop_oneof![txn_op(), inner.prop_map(TxnOp::Txn)].boxed();
        (
            prop::collection::vec(compare.clone(), 0..3),
            prop::collection::vec(op.clone(), 0..3),
            prop::collection::vec(op, 0..3),
        )
            .prop_map(|(compare, success, failure)| Txn {
                compare,
                success,
                failure,
            })
    })
}

fn meta() -> impl Strategy<Value = KeyMeta> {
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(c, m, v)| KeyMeta {
        create_revision: c,
        mod_revision: m,
        version: v,
    })
}

fn origin() -> impl Strategy<Value = Origin> {
    prop_oneof![
        Just(Origin::Plain),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u128>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(s, q, k, f, a)| {
                Origin::Session(RequestHeader {
                    id: RequestId {
                        session: SessionId(s),
                        seq: Seq(q),
                    },
                    secret: Secret(k),
                    first_incomplete: Seq(f),
                    attempt: a,
                })
            }),
        bytes().prop_map(|key| Origin::Key(IdempotencyKey(key))),
    ]
}

fn rejection() -> impl Strategy<Value = Rejection> {
    prop_oneof![
        Just(Rejection::NotAnInteger),
        Just(Rejection::Overflow),
        ".{0,4}".prop_map(|name| Rejection::LeaseExists { name }),
        ".{0,4}".prop_map(|name| Rejection::LeaseNotFound { name }),
        (any::<u32>(), any::<u32>()).prop_map(|(b, m)| Rejection::KeyLength {
            bytes: b as usize,
            max: m as usize
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(b, m)| Rejection::ValueTooLarge {
            bytes: b as usize,
            max: m as usize
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(b, m)| Rejection::LeaseNameLength {
            bytes: b as usize,
            max: m as usize
        }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(ttl_ms, min_ms, max_ms)| {
            Rejection::TtlOutOfRange {
                ttl_ms,
                min_ms,
                max_ms,
            }
        }),
        (any::<u32>(), any::<u32>())
            .prop_map(|(window, max)| Rejection::WindowOutOfRange { window, max }),
        any::<u64>().prop_map(|max| Rejection::TooManyKeys { max }),
        any::<u64>().prop_map(|max| Rejection::TooManyLeases { max }),
        (any::<u64>(), any::<u64>()).prop_map(|(revision, compacted)| Rejection::Compacted {
            revision,
            compacted
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(revision, current)| Rejection::FutureRevision { revision, current }),
        Just(Rejection::NotVersioned),
        (any::<u64>(), any::<u64>()).prop_map(|(ops, max)| Rejection::TxnTooLarge { ops, max }),
        ".{0,6}".prop_map(|key| Rejection::TxnConflict { key }),
        ".{0,6}".prop_map(|key| Rejection::KeyNotFound { key }),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(depth, ops, depth_max, ops_max)| Rejection::TxnTreeTooLarge {
                depth,
                ops,
                depth_max,
                ops_max
            }
        ),
        (any::<u64>(), any::<u64>())
            .prop_map(|(bytes, max)| Rejection::ReplyTooLarge { bytes, max }),
        any::<u64>().prop_map(|max| Rejection::TooManyAlarms { max }),
    ]
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (any::<u64>(), any::<u128>(), any::<u64>(), any::<u32>()).prop_map(
            |(s, k, ttl_ms, window)| Reply::SessionOpened {
                session: SessionId(s),
                secret: Secret(k),
                ttl_ms,
                window
            }
        ),
        any::<u64>().prop_map(|ttl_ms| Reply::SessionKeptAlive { ttl_ms }),
        Just(Reply::SessionClosed),
        Just(Reply::Ticked),
        prop::option::of(bytes()).prop_map(|previous| Reply::Put { previous }),
        (prop::option::of(bytes()), prop::option::of(meta()))
            .prop_map(|(value, meta)| Reply::Get { value, meta }),
        prop::option::of(bytes()).prop_map(|previous| Reply::Delete { previous }),
        any::<u64>().prop_map(|length| Reply::Append { length }),
        any::<i64>().prop_map(|value| Reply::Incr { value }),
        (any::<bool>(), prop::option::of(bytes()))
            .prop_map(|(swapped, current)| Reply::Cas { swapped, current }),
        (
            prop::collection::vec((bytes(), bytes(), meta()), 0..3),
            any::<bool>()
        )
            .prop_map(|(entries, more)| Reply::Scan {
                entries: entries
                    .into_iter()
                    .map(|(key, value, meta)| KeyValue { key, value, meta })
                    .collect(),
                more
            }),
        (any::<bool>(), prop::collection::vec(any::<i64>(), 0..3)).prop_map(
            |(succeeded, values)| Reply::Txn {
                succeeded,
                results: values
                    .into_iter()
                    .map(|value| Reply::Incr { value })
                    .collect()
            }
        ),
        (
            prop::collection::vec((bytes(), bytes(), meta()), 0..3),
            any::<bool>(),
            any::<u64>()
        )
            .prop_map(|(entries, more, count)| Reply::Range {
                entries: entries
                    .into_iter()
                    .map(|(key, value, meta)| KeyValue { key, value, meta })
                    .collect(),
                more,
                count
            }),
        any::<u64>().prop_map(|deleted| Reply::DeletePrefix { deleted }),
        any::<u64>().prop_map(|revision| Reply::Compacted { revision }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(sessions, keys)| Reply::UserPurged { sessions, keys }),
        (".{0,4}", any::<u64>(), any::<u64>()).prop_map(|(name, ttl_ms, t)| Reply::LeaseGranted {
            name,
            ttl_ms,
            expires_at: ClusterTime(t)
        }),
        (".{0,4}", any::<u64>()).prop_map(|(name, t)| Reply::LeaseKeptAlive {
            name,
            expires_at: ClusterTime(t)
        }),
        (".{0,4}", any::<u64>())
            .prop_map(|(name, keys_deleted)| Reply::LeaseRevoked { name, keys_deleted }),
        prop::collection::vec((".{0,4}", any::<u64>(), any::<u64>(), any::<u64>()), 0..3).prop_map(
            |leases| Reply::Leases {
                leases: leases
                    .into_iter()
                    .map(|(name, ttl_ms, t, keys)| LeaseInfo {
                        name,
                        ttl_ms,
                        expires_at: ClusterTime(t),
                        keys
                    })
                    .collect()
            }
        ),
        rejection().prop_map(Reply::Rejected),
        any::<bool>().prop_map(|was_raised| Reply::AlarmDisarmed { was_raised }),
        any::<bool>().prop_map(|changed| Reply::AlarmSet { changed }),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        reply().prop_map(Outcome::Applied),
        (reply(), any::<u64>()).prop_map(|(reply, i)| Outcome::Replayed {
            reply,
            applied_index: LogIndex(i)
        }),
        Just(Outcome::SessionExpired),
        Just(Outcome::Unauthorized),
        any::<u64>().prop_map(|f| Outcome::Stale { floor: Seq(f) }),
        Just(Outcome::RequestMismatch),
        any::<u64>().prop_map(|e| Outcome::SequenceGap { expected: Seq(e) }),
        Just(Outcome::Malformed(Malformed::SeqZero)),
        (any::<u64>(), any::<u64>()).prop_map(|(seq, first_incomplete)| Outcome::Malformed(
            Malformed::FirstIncompleteAhead {
                seq,
                first_incomplete
            }
        )),
        any::<u32>().prop_map(|b| Outcome::Malformed(Malformed::IdempotencyKeyLength {
            bytes: b as usize
        })),
        ".{0,6}".prop_map(|command| Outcome::Malformed(Malformed::ControlNotAllowed { command })),
        (0u8..10, any::<u64>()).prop_map(|(kind, max)| Outcome::Overloaded(match kind {
            0 => Overload::Sessions { max },
            1 => Overload::IdempotencyKeys { max },
            2 => Overload::IdempotencyBytes { max },
            3 => Overload::SessionRecordBytes { max },
            4 => Overload::RecordBytes { max },
            5 => Overload::UserSessions { max },
            6 => Overload::UserRecordBytes { max },
            7 => Overload::UserIdempotencyKeys { max },
            8 => Overload::UserIdempotencyBytes { max },
            _ => Overload::NoSpace { max },
        })),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(origin in origin(), command in command()) {
        let request = Request { origin, command };
        let wire = request_to_wire(&request).expect("representable");
        let back = request_from_wire(wire).expect("valid");
        prop_assert_eq!(back, request);
    }

    #[test]
    fn outcomes_round_trip(outcome in outcome()) {
        prop_assert_eq!(outcome_from_wire(outcome_to_wire(&outcome)).expect("valid"), outcome);
    }
}

#[test]
fn tick_is_not_representable() {
    assert_eq!(
        request_to_wire(&Request::plain(Command::Tick)),
        Err(ConvertError::Internal("tick"))
    );
}

#[test]
fn malformed_wire_input_is_an_error() {
    assert_eq!(
        request_from_wire(v1::ExecuteRequest::default()),
        Err(ConvertError::Missing("command"))
    );
    let empty_command = v1::ExecuteRequest {
        origin: None,
        command: Some(v1::Command { kind: None }),
    };
    assert_eq!(
        request_from_wire(empty_command),
        Err(ConvertError::Missing("command.kind"))
    );
    let short = v1::ExecuteRequest {
        origin: Some(v1::execute_request::Origin::Session(v1::RequestHeader {
            secret: vec![1],
            ..Default::default()
        })),
        command: Some(v1::Command {
            kind: Some(v1::command::Kind::Delete(v1::Delete { key: vec![1] })),
        }),
    };
    assert_eq!(request_from_wire(short), Err(ConvertError::SecretLength(1)));
    assert!(outcome_from_wire(v1::Outcome { kind: None }).is_err());
    let no_reply = v1::Outcome {
        kind: Some(v1::outcome::Kind::Replayed(v1::Replayed {
            reply: None,
            applied_index: 1,
        })),
    };
    assert!(outcome_from_wire(no_reply).is_err());
}

#[test]
fn call_failures_round_trip_and_an_empty_one_is_an_error() {
    use oncekv_proto::convert::{CallFailure, failure_from_wire, failure_to_wire};
    for failure in [
        CallFailure::NotLeader {
            leader_id: Some(3),
            leader_client_address: Some("127.0.0.1:7379".into()),
        },
        CallFailure::NotLeader {
            leader_id: None,
            leader_client_address: None,
        },
        CallFailure::Unavailable("not applied within 5000 ms".into()),
        CallFailure::NoLeader("no leader".into()),
        CallFailure::Invalid("key must be 1..=16 bytes, got 0".into()),
    ] {
        assert_eq!(
            failure_from_wire(failure_to_wire(failure.clone())),
            Ok(failure)
        );
    }
    assert_eq!(
        failure_from_wire(v1::Failure { kind: None }),
        Err(ConvertError::Missing("failure.kind"))
    );
}
