//! Translations from what the client library and the wire say into the
//! recorded history's terms: transactions, replies, definite failures and
//! unknown outcomes, and an attempt's answer as the fault proxy sees it.

use oncekv_check::record::{
    self as rec, Answer, Bytes, FailReason, KeyRange, KeyValue, Outcome, Reply, TxnOpResult,
};
use oncekv_client::ClientError;
use oncekv_proto::convert::CallFailure;
use oncekv_proto::v1;
use oncekv_state as state;
use prost::Message;

/// A state-machine reply in the record's terms.
pub fn reply(reply: &state::Reply) -> Reply {
    let bytes = |value: &Option<Vec<u8>>| value.clone().map(Bytes::from);
    match reply {
        state::Reply::Put { previous } => Reply::Put {
            previous: bytes(previous),
        },
        state::Reply::Get { value, .. } => Reply::Get {
            value: bytes(value),
        },
        state::Reply::Append { length } => Reply::Append { length: *length },
        state::Reply::Incr { value } => Reply::Incr { value: *value },
        state::Reply::Cas { swapped, current } => Reply::Cas {
            swapped: *swapped,
            current: bytes(current),
        },
        state::Reply::LeaseGranted {
            name,
            ttl_ms,
            expires_at,
        } => Reply::LeaseGranted {
            name: name.clone(),
            ttl_ms: *ttl_ms,
            expires_at_ms: expires_at.0,
        },
        state::Reply::LeaseRevoked { name, keys_deleted } => Reply::LeaseRevoked {
            name: name.clone(),
            keys_deleted: *keys_deleted,
        },
        state::Reply::Delete { previous } => Reply::Delete {
            previous: bytes(previous),
        },
        state::Reply::Txn { succeeded, results } => {
            match results.iter().map(txn_result).collect::<Option<Vec<_>>>() {
                Some(results) => Reply::Txn {
                    succeeded: *succeeded,
                    results,
                },
                None => Reply::Rejected {
                    reason: format!("unexpected transaction results {results:?}"),
                },
            }
        }
        state::Reply::Rejected(rejection) => Reply::Rejected {
            reason: rejection.to_string(),
        },
        // Replies of commands the workload never issues (sessions, scans,
        // keep-alives) are recorded as what they are, by name.
        other => Reply::Rejected {
            reason: format!("unexpected reply {other:?}"),
        },
    }
}

/// One operation's result inside a transaction's reply; `None` for a
/// reply no transaction operation gives.
fn txn_result(reply: &state::Reply) -> Option<TxnOpResult> {
    let bytes = |value: &Option<Vec<u8>>| value.clone().map(Bytes::from);
    Some(match reply {
        state::Reply::Put { previous } => TxnOpResult::Put {
            previous: bytes(previous),
        },
        state::Reply::Delete { previous } => TxnOpResult::Delete {
            previous: bytes(previous),
        },
        state::Reply::DeletePrefix { deleted } => TxnOpResult::DeletePrefix { deleted: *deleted },
        state::Reply::Get { value, .. } => TxnOpResult::Get {
            value: bytes(value),
        },
        state::Reply::Scan { entries, .. } | state::Reply::Range { entries, .. } => {
            TxnOpResult::GetPrefix {
                entries: entries
                    .iter()
                    .map(|entry| KeyValue {
                        key: Bytes(entry.key.clone()),
                        value: Bytes(entry.value.clone()),
                    })
                    .collect(),
            }
        }
        state::Reply::Append { length } => TxnOpResult::Append { length: *length },
        state::Reply::Incr { value } => TxnOpResult::Incr { value: *value },
        state::Reply::Cas { swapped, current } => TxnOpResult::Cas {
            swapped: *swapped,
            current: bytes(current),
        },
        state::Reply::Txn { succeeded, results } => TxnOpResult::Txn {
            succeeded: *succeeded,
            results: results.iter().map(txn_result).collect::<Option<_>>()?,
        },
        _ => return None,
    })
}

/// A transaction in the record's terms. A scan's or a range read's limit
/// is not recorded: the workload's reads are unlimited. `None` for one the
/// record cannot model: a read at a past revision inside it.
pub fn txn(txn: &state::Txn) -> Option<rec::Txn> {
    Some(rec::Txn {
        compares: txn.compare.iter().map(compare).collect(),
        success: txn.success.iter().map(txn_op).collect::<Option<_>>()?,
        failure: txn.failure.iter().map(txn_op).collect::<Option<_>>()?,
    })
}

fn compare(compare: &state::Compare) -> rec::Compare {
    let key = Bytes(compare.key.clone());
    let range = match &compare.scope {
        state::KeyScope::Key => KeyRange::Key(key),
        state::KeyScope::Prefix => KeyRange::Prefix(key),
        state::KeyScope::Range { end } => KeyRange::Range {
            start: key,
            end: end.clone().map(Bytes),
        },
    };
    let op = match compare.op {
        state::CompareOp::Equal => rec::CompareOp::Equal,
        state::CompareOp::NotEqual => rec::CompareOp::NotEqual,
        state::CompareOp::Less => rec::CompareOp::Less,
        state::CompareOp::Greater => rec::CompareOp::Greater,
    };
    let target = match &compare.target {
        state::CompareTarget::Value(value) => rec::CompareTarget::Value(Bytes(value.clone())),
        state::CompareTarget::Version(n) => rec::CompareTarget::Version(*n),
        state::CompareTarget::CreateRevision(n) => rec::CompareTarget::CreateRevision(*n),
        state::CompareTarget::ModRevision(n) => rec::CompareTarget::ModRevision(*n),
        state::CompareTarget::Exists(b) => rec::CompareTarget::Exists(*b),
        state::CompareTarget::Lease(name) => rec::CompareTarget::Lease(name.clone()),
    };
    rec::Compare { range, op, target }
}

fn txn_op(op: &state::TxnOp) -> Option<rec::TxnOp> {
    let b = |bytes: &Vec<u8>| Bytes(bytes.clone());
    Some(match op {
        state::TxnOp::Put { key, value, .. } => rec::TxnOp::Put {
            key: b(key),
            value: b(value),
        },
        state::TxnOp::Delete { key } => rec::TxnOp::Delete { key: b(key) },
        state::TxnOp::DeletePrefix { prefix } => rec::TxnOp::DeletePrefix { prefix: b(prefix) },
        state::TxnOp::Get { key } => rec::TxnOp::Get { key: b(key) },
        state::TxnOp::Scan { prefix, .. } => rec::TxnOp::GetPrefix { prefix: b(prefix) },
        state::TxnOp::Append { key, value } => rec::TxnOp::Append {
            key: b(key),
            value: b(value),
        },
        state::TxnOp::Incr { key, by } => rec::TxnOp::Incr {
            key: b(key),
            by: *by,
        },
        state::TxnOp::Cas { key, expected, new } => rec::TxnOp::Cas {
            key: b(key),
            expected: expected.clone().map(Bytes),
            new: b(new),
        },
        state::TxnOp::Range { range, .. } => rec::TxnOp::GetRange {
            start: b(&range.start),
            end: range.end.clone().map(Bytes),
        },
        state::TxnOp::DeleteRange { range } => rec::TxnOp::DeleteRange {
            start: b(&range.start),
            end: range.end.clone().map(Bytes),
        },
        // The record does not model leases: a kept or changed lease is not
        // recorded.
        state::TxnOp::PutExisting { key, value, .. } => rec::TxnOp::PutExisting {
            key: b(key),
            value: match value {
                state::Update::Keep => None,
                state::Update::Set(value) => Some(b(value)),
            },
        },
        state::TxnOp::Txn(nested) => rec::TxnOp::Txn {
            txn: Box::new(txn(nested)?),
        },
        state::TxnOp::RangeAt { .. } => return None,
    })
}

/// The reply's canonical bytes: its wire encoding, which is the same for
/// the same reply however often it is sent.
pub fn canonical(reply: &state::Reply) -> Bytes {
    Bytes(oncekv_proto::convert::reply_to_wire(reply).encode_to_vec())
}

/// An `Ok` outcome with the reply's canonical bytes.
pub fn ok(reply_: &state::Reply) -> Outcome {
    Outcome::Ok {
        reply: reply(reply_),
        canonical: Some(canonical(reply_)),
    }
}

/// A client error as the operation's outcome: a rejection is a reply (the
/// command ran and said no), `OutcomeUnknown` is unknown, the rest are
/// definite failures.
pub fn error_outcome(error: &ClientError) -> Outcome {
    let failed = |reason| Outcome::Failed {
        reason,
        detail: Some(error.to_string()),
    };
    match error {
        ClientError::Rejected(rejection) => ok(&state::Reply::Rejected(rejection.clone())),
        ClientError::OutcomeUnknown { .. } => Outcome::Unknown {
            detail: Some(error.to_string()),
        },
        ClientError::SessionExpired => failed(FailReason::SessionExpired),
        ClientError::Unauthorized => failed(FailReason::Unauthorized),
        ClientError::Stale { .. } => failed(FailReason::Stale),
        ClientError::SequenceGap { .. } => failed(FailReason::SequenceGap),
        ClientError::RequestMismatch => failed(FailReason::RequestMismatch),
        ClientError::Malformed(_) => failed(FailReason::Malformed),
        ClientError::Invalid(_) => failed(FailReason::Invalid),
        ClientError::Unreachable(_) => failed(FailReason::Unreachable),
        ClientError::Overloaded(_) => failed(FailReason::Overloaded),
        ClientError::Unauthenticated(_) | ClientError::PermissionDenied(_) => {
            failed(FailReason::PermissionDenied)
        }
        ClientError::Config(_) => failed(FailReason::Other),
    }
}

/// What one attempt's wire response says, as the proxy saw it, and
/// whether it proves the request committed (an outcome from the state
/// machine: applied, replayed, or a refusal decided at apply).
pub fn answer(response: &v1::ExecuteResponse) -> (Answer, bool) {
    use v1::execute_response::Result as Wire;
    let transient = |detail: String| (Answer::Transient { detail }, false);
    match &response.result {
        Some(Wire::Outcome(outcome)) => {
            match oncekv_proto::convert::outcome_from_wire(outcome.clone()) {
                Ok(state::Outcome::Applied(reply_)) => (
                    Answer::Applied {
                        reply: reply(&reply_),
                        canonical: Some(canonical(&reply_)),
                        log_index: Some(response.log_index),
                    },
                    true,
                ),
                Ok(state::Outcome::Replayed {
                    reply: reply_,
                    applied_index,
                }) => (
                    Answer::Replayed {
                        reply: reply(&reply_),
                        canonical: Some(canonical(&reply_)),
                        applied_index: Some(applied_index.0),
                    },
                    true,
                ),
                Ok(refusal) => (
                    Answer::Refused {
                        reason: refusal_reason(&refusal),
                    },
                    true,
                ),
                Err(error) => transient(format!("undecodable outcome: {error}")),
            }
        }
        Some(Wire::Failure(failure)) => {
            match oncekv_proto::convert::failure_from_wire(failure.clone()) {
                Ok(CallFailure::NotLeader { .. }) => transient("not leader".into()),
                Ok(CallFailure::NoLeader(reason)) => transient(format!("no leader: {reason}")),
                Ok(CallFailure::Unavailable(reason)) => transient(format!("unavailable: {reason}")),
                Ok(CallFailure::Invalid(_)) => (
                    Answer::Refused {
                        reason: FailReason::Invalid,
                    },
                    false,
                ),
                Ok(CallFailure::Shed { .. }) => (
                    Answer::Refused {
                        reason: FailReason::Overloaded,
                    },
                    false,
                ),
                Ok(CallFailure::Unauthenticated(_) | CallFailure::PermissionDenied(_)) => (
                    Answer::Refused {
                        reason: FailReason::PermissionDenied,
                    },
                    false,
                ),
                Err(error) => transient(format!("undecodable failure: {error}")),
            }
        }
        None => transient("empty response".into()),
    }
}

fn refusal_reason(outcome: &state::Outcome) -> FailReason {
    match outcome {
        state::Outcome::SessionExpired => FailReason::SessionExpired,
        state::Outcome::Unauthorized => FailReason::Unauthorized,
        state::Outcome::Stale { .. } => FailReason::Stale,
        state::Outcome::RequestMismatch => FailReason::RequestMismatch,
        state::Outcome::SequenceGap { .. } => FailReason::SequenceGap,
        state::Outcome::Malformed(_) => FailReason::Malformed,
        state::Outcome::Overloaded(_) => FailReason::Overloaded,
        state::Outcome::PermissionDenied { .. } => FailReason::PermissionDenied,
        state::Outcome::Applied(_) | state::Outcome::Replayed { .. } => FailReason::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_replies_have_equal_canonical_bytes_and_others_differ() {
        let a = state::Reply::Append { length: 12 };
        assert_eq!(canonical(&a), canonical(&a.clone()));
        assert_ne!(
            canonical(&a),
            canonical(&state::Reply::Append { length: 13 })
        );
    }

    #[test]
    fn a_read_at_a_past_revision_is_not_modelled() {
        let t = state::Txn::new().on_success(state::TxnOp::RangeAt {
            range: state::KeyRange::prefix("a"),
            limit: 0,
            revision: 3,
        });
        assert_eq!(txn(&t), None);
    }

    #[test]
    fn transactions_and_their_replies_translate() {
        let t = state::Txn::new()
            .compare(state::Compare::exists("a"))
            .on_success(state::TxnOp::incr("a", -2))
            .on_success(state::TxnOp::get("b"))
            .on_failure(state::TxnOp::get("a"));
        let recorded = txn(&t).expect("modelled");
        assert_eq!(recorded.compares.len(), 1);
        assert_eq!(
            recorded.success[0],
            rec::TxnOp::Incr {
                key: Bytes::from("a"),
                by: -2
            }
        );
        let answer = state::Reply::Txn {
            succeeded: true,
            results: vec![
                state::Reply::Incr { value: -2 },
                state::Reply::Get {
                    value: None,
                    meta: None,
                },
            ],
        };
        let got = reply(&answer);
        assert!(
            oncekv_check::record::Op::Txn(recorded.clone()).accepts(&got),
            "{got:?}"
        );
        let odd = state::Reply::Txn {
            succeeded: true,
            results: vec![state::Reply::Ticked],
        };
        assert!(reply(&odd).is_rejection());
    }

    #[test]
    fn only_an_unknown_outcome_is_unknown() {
        let unknown = ClientError::OutcomeUnknown {
            request_id: None,
            attempts: 3,
            last_answer: None,
        };
        assert!(matches!(error_outcome(&unknown), Outcome::Unknown { .. }));
        assert!(matches!(
            error_outcome(&ClientError::SessionExpired),
            Outcome::Failed {
                reason: FailReason::SessionExpired,
                ..
            }
        ));
        let rejected = ClientError::Rejected(state::Rejection::NotAnInteger);
        assert!(error_outcome(&rejected).class() == oncekv_check::record::OutcomeClass::Rejected);
    }
}
