//! The KV checker: every key operation of a recorded run (GET, PUT,
//! DELETE, APPEND, INCR, CAS and transactions), translated into a
//! [`KvHistory`] and decided by [`linearizability::check`] against the
//! model of the whole store ([`crate::kv_model`]). No key is skipped.
//!
//! The translation, per operation:
//!
//! * `Put`, `Get`, `Delete`, `Incr`, `Cas` → the same operation, its reply
//!   as the result the model must reproduce (a put's and a delete's
//!   previous value, an incr's new value, a cas's swap and current value);
//! * `Append{token}` → an append of the token followed by the workload's
//!   delimiter ([`TokenFormat`]), its reply the new length;
//! * `Txn` → a transaction, its reply the branch taken and the results;
//! * a definite failure or a deterministic rejection → dropped (it changed
//!   nothing);
//! * an unknown outcome → no output (it may take effect at any time after
//!   its invocation, or never);
//! * lease operations → not key operations, left out. (The record's puts
//!   attach no key to a lease, so no lease expiry deletes a checked key.)
//!
//! Every register history is a KV history, so this also covers what a
//! register view alone would check, with more constraints (previous
//! values) and without skipping the keys that are also appended or
//! incremented.

use super::exactly_once::TokenFormat;
use super::{CheckerVerdict, Status};
use crate::history::HistoryError;
use crate::kv_history::{KvCall, KvHistory, KvOperation, KvOutput};
use crate::linearizability::{self, Bounds, Verdict};
use crate::record::{Op, OpId, OutcomeClass, Record, Reply, TxnOp, TxnOpResult};

/// A KV history built from a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordKvHistory {
    /// The history.
    pub history: KvHistory,
    /// For each of its operations, the record's operation id.
    pub origin: Vec<OpId>,
    /// Operations dropped because they definitely changed nothing.
    pub dropped: usize,
    /// Operations left out because they touch no key (leases).
    pub not_key_operations: usize,
}

fn translate(op: &Op, format: TokenFormat) -> Option<KvCall> {
    Some(KvCall::Op(match op {
        Op::Put { key, value } => TxnOp::Put {
            key: key.clone(),
            value: value.clone(),
        },
        Op::Get { key } => TxnOp::Get { key: key.clone() },
        Op::Delete { key } => TxnOp::Delete { key: key.clone() },
        Op::Append { key, token } => {
            let mut value = token.0.clone();
            value.push(format.delimiter);
            TxnOp::Append {
                key: key.clone(),
                value: value.into(),
            }
        }
        Op::Incr { key, by } => TxnOp::Incr {
            key: key.clone(),
            by: *by,
        },
        Op::Cas { key, expected, new } => TxnOp::Cas {
            key: key.clone(),
            expected: expected.clone(),
            new: new.clone(),
        },
        Op::Txn(txn) => return Some(KvCall::Txn(txn.clone())),
        Op::LeaseGrant { .. } | Op::LeaseRevoke { .. } => return None,
    }))
}

fn output(reply: &Reply) -> Option<KvOutput> {
    let result = match reply {
        Reply::Put { previous } => TxnOpResult::Put {
            previous: previous.clone(),
        },
        Reply::Get { value } => TxnOpResult::Get {
            value: value.clone(),
        },
        Reply::Delete { previous } => TxnOpResult::Delete {
            previous: previous.clone(),
        },
        Reply::Append { length } => TxnOpResult::Append { length: *length },
        Reply::Incr { value } => TxnOpResult::Incr { value: *value },
        Reply::Cas { swapped, current } => TxnOpResult::Cas {
            swapped: *swapped,
            current: current.clone(),
        },
        Reply::Txn { succeeded, results } => {
            return Some(KvOutput::Txn {
                succeeded: *succeeded,
                results: results.clone(),
            });
        }
        Reply::LeaseGranted { .. } | Reply::LeaseRevoked { .. } | Reply::Rejected { .. } => {
            return None;
        }
    };
    Some(KvOutput::Op(result))
}

/// Translates the key operations of `record`; appended tokens end with
/// `format`'s delimiter.
pub fn kv_history(record: &Record, format: TokenFormat) -> Result<RecordKvHistory, HistoryError> {
    let mut operations = Vec::new();
    let mut origin = Vec::new();
    let mut dropped = 0;
    let mut not_key_operations = 0;
    for op in &record.ops {
        let Some(call) = translate(&op.op, format) else {
            not_key_operations += 1;
            continue;
        };
        if matches!(
            op.outcome.class(),
            OutcomeClass::Failed | OutcomeClass::Rejected
        ) {
            dropped += 1;
            continue;
        }
        // A reply of another kind (Record::from_events refuses these; a
        // record built by hand may hold one) is taken as unknown, which
        // constrains least.
        let output = op
            .outcome
            .reply()
            .filter(|reply| op.op.accepts(reply))
            .and_then(output);
        let complete_ns = output.as_ref().and(op.complete_ns);
        operations.push(KvOperation {
            client: op.client,
            call,
            output,
            invoke_ns: op.invoke_ns,
            complete_ns,
        });
        origin.push(op.id);
    }
    Ok(RecordKvHistory {
        history: KvHistory::new(operations)?,
        origin,
        dropped,
        not_key_operations,
    })
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCheckVerdict {
    /// The search ran.
    Checked {
        /// The history searched.
        kv: RecordKvHistory,
        /// Its verdict.
        verdict: Verdict,
    },
    /// The record's operations do not form a valid history.
    Invalid(HistoryError),
}

impl CheckerVerdict for KvCheckVerdict {
    fn checker(&self) -> &'static str {
        "linearizable_kv"
    }

    fn status(&self) -> Status {
        match self {
            Self::Checked { verdict, .. } => match verdict {
                Verdict::Linearizable => Status::Pass,
                Verdict::NotLinearizable { .. } => Status::Fail,
                Verdict::Unknown { .. } => Status::Undecided,
            },
            Self::Invalid(_) => Status::Undecided,
        }
    }

    fn headline(&self) -> String {
        match self {
            Self::Checked { kv, verdict } => {
                if kv.history.is_empty() {
                    return "no key operations recorded".to_owned();
                }
                format!(
                    "{verdict}: {} key operation(s) on {} key(s), {} dropped as not applied",
                    kv.history.len(),
                    kv.history.keys().len(),
                    kv.dropped
                )
            }
            Self::Invalid(error) => format!("could not build a KV history: {error}"),
        }
    }

    fn details(&self) -> Vec<String> {
        let Self::Checked { kv, verdict } = self else {
            return Vec::new();
        };
        let Verdict::NotLinearizable { explanation, .. } = verdict else {
            return Vec::new();
        };
        let mut lines: Vec<String> = verdict
            .describe(&kv.history)
            .lines()
            .map(str::to_owned)
            .collect();
        let mapping: Vec<String> = explanation
            .longest_prefix
            .iter()
            .copied()
            .chain(explanation.blocked)
            .filter_map(|i| kv.origin.get(i).map(|id| format!("#{i} = op #{id}")))
            .collect();
        if !mapping.is_empty() {
            lines.push(format!("history positions: {}", mapping.join(", ")));
        }
        lines
    }
}

/// Checks that the key operations of `record` are linearizable.
pub fn check(record: &Record, format: TokenFormat, bounds: &Bounds) -> KvCheckVerdict {
    match kv_history(record, format) {
        Ok(kv) => {
            let verdict = linearizability::check(&kv.history, bounds);
            KvCheckVerdict::Checked { kv, verdict }
        }
        Err(error) => KvCheckVerdict::Invalid(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Bytes, FailReason, OpRecord, Outcome, RequestIdentity};

    fn op(id: OpId, op: Op, times: (u64, u64), reply: Option<Reply>) -> OpRecord {
        OpRecord {
            id,
            client: id,
            op,
            request: RequestIdentity::session(1, id),
            invoke_ns: times.0,
            complete_ns: Some(times.1),
            attempts: 1,
            outcome: match reply {
                Some(reply) => Outcome::Ok {
                    reply,
                    canonical: None,
                },
                None => Outcome::Unknown { detail: None },
            },
        }
    }

    fn append(id: OpId, token: &str, times: (u64, u64), length: Option<u64>) -> OpRecord {
        op(
            id,
            Op::Append {
                key: "a".into(),
                token: token.into(),
            },
            times,
            length.map(|length| Reply::Append { length }),
        )
    }

    fn get(id: OpId, value: Option<&str>, times: (u64, u64)) -> OpRecord {
        op(
            id,
            Op::Get { key: "a".into() },
            times,
            Some(Reply::Get {
                value: value.map(Bytes::from),
            }),
        )
    }

    fn verdict(ops: Vec<OpRecord>) -> KvCheckVerdict {
        let record = Record {
            ops,
            ..Record::default()
        };
        check(&record, TokenFormat::default(), &Bounds::default())
    }

    #[test]
    fn appended_keys_are_checked_with_their_delimiter() {
        let good = verdict(vec![
            append(1, "x", (0, 10), Some(2)),
            append(2, "y", (0, 10), Some(4)),
            get(3, Some("x;y;"), (20, 30)),
        ]);
        assert_eq!(good.status(), Status::Pass, "{good}");
        let twice = verdict(vec![
            append(1, "x", (0, 10), Some(2)),
            get(3, Some("x;x;"), (20, 30)),
        ]);
        assert_eq!(twice.status(), Status::Fail, "{twice}");
        assert!(twice.explanation().contains("op #3"), "{twice}");
    }

    #[test]
    fn failed_operations_are_dropped_and_unknown_ones_may_apply() {
        let mut failed = append(2, "y", (0, 10), None);
        failed.outcome = Outcome::Failed {
            reason: FailReason::NotLeader,
            detail: None,
        };
        let unknown = append(3, "z", (0, 10), None);
        let lease = op(
            4,
            Op::LeaseRevoke { name: "l".into() },
            (0, 1),
            Some(Reply::LeaseRevoked {
                name: "l".into(),
                keys_deleted: 0,
            }),
        );
        let result = verdict(vec![
            append(1, "x", (0, 10), Some(2)),
            failed,
            unknown,
            lease,
            get(5, Some("x;z;"), (20, 30)),
        ]);
        assert_eq!(result.status(), Status::Pass, "{result}");
        let KvCheckVerdict::Checked { kv, .. } = &result else {
            panic!("{result}");
        };
        assert_eq!((kv.dropped, kv.not_key_operations), (1, 1));
        assert_eq!(kv.origin, vec![1, 3, 5]);
    }
}
