//! The register checker: PUT, GET and CAS operations of a recorded run,
//! translated into a [`History`] and decided by
//! [`linearizability::check`].
//!
//! The translation, per operation:
//!
//! * `Put` → a write (its `previous` reply is not used);
//! * `Get` → a read of the returned value;
//! * `Cas` that swapped → a compare-and-set that swapped;
//! * `Cas` that did not swap and reported a current value other than the
//!   expected one → a read of that value (a failed CAS changes nothing and
//!   observed the register); otherwise a compare-and-set that did not swap;
//! * a definite failure or a deterministic rejection → dropped (it changed
//!   nothing and observed nothing);
//! * an unknown outcome → the same call with no output (it may take effect
//!   at any time after its invocation, or never).
//!
//! Keys also touched by APPEND or INCR are not registers and are skipped
//! (and named in the verdict).
//!
//! [`crate::verify`] no longer runs this checker: [`super::linearizable_kv`]
//! checks every history this one would, with more constraints (a put's
//! previous value) and without skipping keys. It stays for callers that
//! want the register view alone, next to the register search that the
//! Jepsen etcd histories validate.

use super::{CheckerVerdict, Status};
use crate::history::{Call, History, HistoryError, Operation, Output};
use crate::linearizability::{self, Bounds, Verdict};
use crate::record::{Bytes, Op, OpId, OutcomeClass, Record, Reply};
use std::collections::BTreeSet;
use std::fmt;

/// A register history built from a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterHistory {
    /// The history.
    pub history: History,
    /// For each of its operations, the record's operation id.
    pub origin: Vec<OpId>,
    /// Operations dropped because they definitely changed nothing.
    pub dropped: usize,
    /// Keys skipped because other operations touched them.
    pub skipped_keys: Vec<Bytes>,
}

/// Translates the register operations of `record`.
pub fn register_history(record: &Record) -> Result<RegisterHistory, HistoryError> {
    let skipped: BTreeSet<&Bytes> = record
        .ops
        .iter()
        .filter(|op| matches!(op.op, Op::Append { .. } | Op::Incr { .. }))
        .filter_map(|op| op.op.key())
        .collect();
    let mut operations = Vec::new();
    let mut origin = Vec::new();
    let mut dropped = 0;
    for op in &record.ops {
        let (key, call) = match &op.op {
            Op::Put { key, value } => (key, Call::Write(value.0.clone())),
            Op::Get { key } => (key, Call::Read),
            Op::Cas { key, expected, new } => (
                key,
                Call::Cas {
                    expected: expected.as_ref().map(|v| v.0.clone()),
                    new: new.0.clone(),
                },
            ),
            _ => continue,
        };
        if skipped.contains(key) {
            continue;
        }
        if matches!(
            op.outcome.class(),
            OutcomeClass::Failed | OutcomeClass::Rejected
        ) {
            dropped += 1;
            continue;
        }
        let (call, output) = match (call, op.outcome.reply()) {
            (call, None) => (call, None),
            (call @ Call::Write(_), Some(Reply::Put { .. })) => (call, Some(Output::Write)),
            (Call::Read, Some(Reply::Get { value })) => (
                Call::Read,
                Some(Output::Read(value.as_ref().map(|v| v.0.clone()))),
            ),
            (call @ Call::Cas { .. }, Some(Reply::Cas { swapped: true, .. })) => {
                (call, Some(Output::Cas { swapped: true }))
            }
            (
                Call::Cas { expected, new },
                Some(Reply::Cas {
                    swapped: false,
                    current,
                }),
            ) => {
                let current = current.as_ref().map(|v| v.0.clone());
                if current != expected {
                    (Call::Read, Some(Output::Read(current)))
                } else {
                    (
                        Call::Cas { expected, new },
                        Some(Output::Cas { swapped: false }),
                    )
                }
            }
            // A reply of another kind: Record::from_events refuses these;
            // for a record built by hand, keep the call with an unknown
            // outcome, which constrains least.
            (call, Some(_)) => (call, None),
        };
        let complete_ns = if output.is_some() {
            op.complete_ns
        } else {
            None
        };
        operations.push(Operation {
            client: op.client,
            key: key.0.clone(),
            call,
            output,
            invoke_ns: op.invoke_ns,
            complete_ns,
        });
        origin.push(op.id);
    }
    Ok(RegisterHistory {
        history: History::new(operations)?,
        origin,
        dropped,
        skipped_keys: skipped.into_iter().cloned().collect(),
    })
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistersVerdict {
    /// The search ran.
    Checked {
        /// The history searched.
        registers: RegisterHistory,
        /// Its verdict.
        verdict: Verdict,
    },
    /// The record's operations do not form a valid history.
    Invalid(HistoryError),
}

impl CheckerVerdict for RegistersVerdict {
    fn checker(&self) -> &'static str {
        "linearizable_registers"
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
            Self::Checked { registers, verdict } => {
                let keys: BTreeSet<&[u8]> = registers
                    .history
                    .operations()
                    .iter()
                    .map(|op| op.key.as_slice())
                    .collect();
                if registers.history.is_empty() {
                    return "no register operations recorded".to_owned();
                }
                format!(
                    "{verdict}: {} register operation(s) on {} key(s), {} dropped as not applied",
                    registers.history.len(),
                    keys.len(),
                    registers.dropped
                )
            }
            Self::Invalid(error) => format!("could not build a register history: {error}"),
        }
    }

    fn details(&self) -> Vec<String> {
        let Self::Checked { registers, verdict } = self else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        if verdict.is_not_linearizable() {
            lines.extend(
                verdict
                    .describe(&registers.history)
                    .lines()
                    .map(str::to_owned),
            );
            let referenced = match verdict {
                Verdict::NotLinearizable { explanation, .. } => explanation
                    .longest_prefix
                    .iter()
                    .copied()
                    .chain(explanation.blocked)
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            };
            let mapping: Vec<String> = referenced
                .iter()
                .filter_map(|&i| registers.origin.get(i).map(|id| format!("#{i} = op #{id}")))
                .collect();
            if !mapping.is_empty() {
                lines.push(format!("history positions: {}", mapping.join(", ")));
            }
        }
        if !registers.skipped_keys.is_empty() {
            let keys: Vec<String> = registers
                .skipped_keys
                .iter()
                .map(ToString::to_string)
                .collect();
            lines.push(format!(
                "not registers (appended or incremented): {}",
                keys.join(", ")
            ));
        }
        lines
    }
}

impl fmt::Display for RegistersVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explanation())
    }
}

/// Checks that the register operations of `record` are linearizable.
pub fn check(record: &Record, bounds: &Bounds) -> RegistersVerdict {
    match register_history(record) {
        Ok(registers) => {
            let verdict = linearizability::check(&registers.history, bounds);
            RegistersVerdict::Checked { registers, verdict }
        }
        Err(error) => RegistersVerdict::Invalid(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FailReason, OpRecord, Outcome, RequestIdentity};

    fn op(id: OpId, op: Op, times: (u64, u64), outcome: Outcome) -> OpRecord {
        OpRecord {
            id,
            client: id,
            op,
            request: RequestIdentity::session(1, id),
            invoke_ns: times.0,
            complete_ns: Some(times.1),
            attempts: 1,
            outcome,
        }
    }

    fn put(id: OpId, value: &str, times: (u64, u64)) -> OpRecord {
        op(
            id,
            Op::Put {
                key: "r".into(),
                value: value.into(),
            },
            times,
            Outcome::Ok {
                reply: Reply::Put { previous: None },
                canonical: None,
            },
        )
    }

    fn get(id: OpId, value: Option<&str>, times: (u64, u64)) -> OpRecord {
        op(
            id,
            Op::Get { key: "r".into() },
            times,
            Outcome::Ok {
                reply: Reply::Get {
                    value: value.map(Bytes::from),
                },
                canonical: None,
            },
        )
    }

    fn cas(id: OpId, expected: &str, new: &str, times: (u64, u64), reply: Reply) -> OpRecord {
        op(
            id,
            Op::Cas {
                key: "r".into(),
                expected: Some(expected.into()),
                new: new.into(),
            },
            times,
            Outcome::Ok {
                reply,
                canonical: None,
            },
        )
    }

    fn record(ops: Vec<OpRecord>) -> Record {
        Record {
            ops,
            ..Record::default()
        }
    }

    #[test]
    fn a_linearizable_register_history_passes() {
        let verdict = check(
            &record(vec![
                put(1, "1", (0, 10)),
                get(2, Some("1"), (20, 30)),
                cas(
                    3,
                    "1",
                    "2",
                    (40, 50),
                    Reply::Cas {
                        swapped: true,
                        current: Some("2".into()),
                    },
                ),
                get(4, Some("2"), (60, 70)),
            ]),
            &Bounds::default(),
        );
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn a_stale_read_fails_and_names_record_ops() {
        let verdict = check(
            &record(vec![
                put(7, "1", (0, 10)),
                put(8, "2", (20, 30)),
                get(9, Some("1"), (40, 50)),
            ]),
            &Bounds::default(),
        );
        assert_eq!(verdict.status(), Status::Fail, "{verdict}");
        let text = verdict.explanation();
        assert!(text.contains("#2 = op #9"), "{text}");
    }

    #[test]
    fn a_failed_cas_is_a_read_of_its_current_value() {
        // The CAS saw "3", which nobody wrote.
        let verdict = check(
            &record(vec![
                put(1, "1", (0, 10)),
                cas(
                    2,
                    "2",
                    "5",
                    (20, 30),
                    Reply::Cas {
                        swapped: false,
                        current: Some("3".into()),
                    },
                ),
            ]),
            &Bounds::default(),
        );
        assert_eq!(verdict.status(), Status::Fail, "{verdict}");
    }

    #[test]
    fn failed_and_unknown_operations_are_translated() {
        let mut lost = put(2, "2", (20, 30));
        lost.outcome = Outcome::Failed {
            reason: FailReason::NotLeader,
            detail: None,
        };
        let mut maybe = put(3, "3", (20, 30));
        maybe.outcome = Outcome::Unknown { detail: None };
        let good = record(vec![
            put(1, "1", (0, 10)),
            lost.clone(),
            maybe,
            get(4, Some("3"), (100, 110)),
        ]);
        let verdict = check(&good, &Bounds::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        let RegistersVerdict::Checked { registers, .. } = &verdict else {
            panic!("{verdict}");
        };
        assert_eq!(registers.dropped, 1);
        assert_eq!(registers.origin, vec![1, 3, 4]);

        // The definitely failed write cannot be read.
        let bad = record(vec![
            put(1, "1", (0, 10)),
            lost,
            get(4, Some("2"), (100, 110)),
        ]);
        assert_eq!(check(&bad, &Bounds::default()).status(), Status::Fail);
    }

    #[test]
    fn appended_keys_are_skipped() {
        let mut ops = vec![put(1, "1", (0, 10)), get(2, Some("9"), (20, 30))];
        ops.push(op(
            3,
            Op::Append {
                key: "r".into(),
                token: "t".into(),
            },
            (0, 1),
            Outcome::Unknown { detail: None },
        ));
        let verdict = check(&record(ops), &Bounds::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert!(verdict.explanation().contains("not registers"), "{verdict}");
    }

    #[test]
    fn search_bounds_make_it_undecided() {
        let mut ops: Vec<OpRecord> = (0..12).map(|i| put(i, &i.to_string(), (0, 1000))).collect();
        ops.push(get(99, Some("100"), (2000, 2001)));
        let bounds = Bounds {
            max_states: 4,
            ..Bounds::default()
        };
        let verdict = check(&record(ops), &bounds);
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
    }
}
