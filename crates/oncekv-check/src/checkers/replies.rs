//! The reply checker: every answer to one request is the original reply.
//!
//! Requests are grouped by their dedup key (session and seq, or
//! idempotency key; plain requests have none and are skipped). Within a
//! group every reply seen, on the wire by any attempt ([`Answer::Applied`]
//! or [`Answer::Replayed`], including replies the fault proxy dropped after
//! commit) and as the operation's final `Ok` outcome, must be identical:
//! the same typed reply and, where the recorder kept the reply's canonical
//! bytes on both sides, the same bytes. A request also runs at one log
//! index only: every index reported for it (an `Applied` answer's entry, a
//! `Replayed` answer's original entry) must be the same. Two `Applied`
//! answers alone prove nothing, since a retry that meets its request still
//! in flight on the leader is answered with that entry's result.
//!
//! [`Answer::Applied`]: crate::record::Answer::Applied
//! [`Answer::Replayed`]: crate::record::Answer::Replayed

use super::{Findings, at};
use crate::record::{Answer, Bytes, DedupKey, OpId, Outcome, Record, Reply};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;

/// Where a reply was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// On the wire, as an attempt's answer.
    Attempt {
        /// The operation, if the recorder knew it.
        op: Option<OpId>,
        /// The attempt (1-based).
        attempt: u32,
        /// When.
        at_ns: u64,
        /// Whether it was answered `Replayed`.
        replayed: bool,
        /// Whether the fault proxy dropped it after commit.
        dropped: bool,
    },
    /// As the operation's final outcome.
    Outcome {
        /// The operation.
        op: OpId,
    },
}

impl fmt::Display for Sighting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Attempt {
                op,
                attempt,
                at_ns,
                replayed,
                dropped,
            } => {
                if let Some(op) = op {
                    write!(f, "op #{op} ")?;
                }
                let how = if *replayed { "replayed" } else { "applied" };
                write!(f, "attempt {attempt} ({how}, at {}", at(*at_ns))?;
                if *dropped {
                    f.write_str(", dropped after commit")?;
                }
                f.write_str(")")
            }
            Self::Outcome { op } => write!(f, "op #{op} final outcome"),
        }
    }
}

/// One way a request's answers disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyViolation {
    /// Two replies to one request differ.
    Differs {
        /// The request.
        request: DedupKey,
        /// The first reply seen.
        first: Reply,
        /// Where.
        first_at: Sighting,
        /// A reply that differs from it.
        other: Reply,
        /// Where.
        other_at: Sighting,
        /// Whether only the canonical bytes differ.
        bytes_only: bool,
    },
    /// Answers to one request report different log indexes: it ran more
    /// than once.
    AppliedTwice {
        /// The request.
        request: DedupKey,
        /// Each index reported, with where.
        indexes: BTreeMap<u64, Vec<Sighting>>,
    },
}

impl fmt::Display for ReplyViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Differs {
                request,
                first,
                first_at,
                other,
                other_at,
                bytes_only,
            } => {
                if *bytes_only {
                    write!(
                        f,
                        "{request}: {first_at} and {other_at} got replies with different bytes ({first})"
                    )
                } else {
                    write!(
                        f,
                        "{request}: {first_at} got {first} but {other_at} got {other}"
                    )
                }
            }
            Self::AppliedTwice { request, indexes } => {
                let at: Vec<String> = indexes
                    .iter()
                    .map(|(index, seen)| {
                        let seen: Vec<String> = seen.iter().map(ToString::to_string).collect();
                        format!("index {index} ({})", seen.join(", "))
                    })
                    .collect();
                write!(
                    f,
                    "{request} ran at {} log indexes: {}",
                    at.len(),
                    at.join("; ")
                )
            }
        }
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepliesVerdict {
    /// Requests with a dedup key and at least one reply.
    pub requests: usize,
    /// Of which with two or more replies to compare.
    pub compared: usize,
    /// Replies compared, in all.
    pub replies: usize,
    /// `Replayed` answers seen.
    pub replayed: usize,
    /// Every disagreement.
    pub violations: Vec<ReplyViolation>,
}

impl Findings for RepliesVerdict {
    const CHECKER: &'static str = "replies";
    const PASS: &'static str = "every retry got the original reply";
    type Violation = ReplyViolation;
    /// Never undecided: every reply seen is compared.
    type Undecided = Infallible;

    fn violations(&self) -> &[ReplyViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[Infallible] {
        &[]
    }

    fn scope(&self) -> String {
        format!(
            "{} request(s) answered, {} with several replies ({} replies, {} replayed)",
            self.requests, self.compared, self.replies, self.replayed
        )
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        None
    }
}

struct Seen<'a> {
    reply: &'a Reply,
    canonical: Option<&'a Bytes>,
    at: Sighting,
    index: Option<u64>,
}

/// Checks that every request's replies agree.
pub fn check(record: &Record) -> RepliesVerdict {
    let mut groups: BTreeMap<DedupKey, Vec<Seen<'_>>> = BTreeMap::new();
    let mut verdict = RepliesVerdict::default();
    for response in &record.responses {
        let Some(key) = response.request.dedup_key() else {
            continue;
        };
        let Some((reply, canonical)) = response.answer.reply() else {
            continue;
        };
        let replayed = matches!(response.answer, Answer::Replayed { .. });
        if replayed {
            verdict.replayed += 1;
        }
        groups.entry(key).or_default().push(Seen {
            reply,
            canonical,
            at: Sighting::Attempt {
                op: response.op_id,
                attempt: response.attempt,
                at_ns: response.at_ns,
                replayed,
                dropped: response.dropped_after_commit,
            },
            index: response.answer.applied_index(),
        });
    }
    for op in &record.ops {
        let Some(key) = op.request.dedup_key() else {
            continue;
        };
        let Outcome::Ok { reply, canonical } = &op.outcome else {
            continue;
        };
        groups.entry(key).or_default().push(Seen {
            reply,
            canonical: canonical.as_ref(),
            at: Sighting::Outcome { op: op.id },
            index: None,
        });
    }

    for (request, seen) in groups {
        verdict.requests += 1;
        verdict.replies += seen.len();
        if seen.len() > 1 {
            verdict.compared += 1;
        }
        let mut indexes: BTreeMap<u64, Vec<Sighting>> = BTreeMap::new();
        for s in &seen {
            if let Some(index) = s.index {
                indexes.entry(index).or_default().push(s.at.clone());
            }
        }
        if indexes.len() > 1 {
            verdict.violations.push(ReplyViolation::AppliedTwice {
                request: request.clone(),
                indexes,
            });
        }
        let Some((first, rest)) = seen.split_first() else {
            continue;
        };
        // The canonical bytes to compare with: the first seen.
        let reference_bytes = seen.iter().find_map(|s| s.canonical);
        for other in rest {
            let typed_differs = other.reply != first.reply;
            let bytes_differ = matches!(
                (reference_bytes, other.canonical),
                (Some(a), Some(b)) if a != b
            );
            if typed_differs || bytes_differ {
                verdict.violations.push(ReplyViolation::Differs {
                    request: request.clone(),
                    first: first.reply.clone(),
                    first_at: first.at.clone(),
                    other: other.reply.clone(),
                    other_at: other.at.clone(),
                    bytes_only: !typed_differs,
                });
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};
    use crate::record::{AttemptResponse, FailReason, Op, OpRecord, RequestIdentity};

    fn response(seq: u64, attempt: u32, answer: Answer) -> AttemptResponse {
        AttemptResponse {
            at_ns: u64::from(attempt) * 100,
            client: 1,
            op_id: Some(seq),
            request: RequestIdentity::session(9, seq),
            attempt,
            node: Some(1),
            answer,
            dropped_after_commit: attempt == 1,
            batch: 1,
        }
    }

    fn applied(length: u64, bytes: &[u8]) -> Answer {
        Answer::Applied {
            reply: Reply::Append { length },
            canonical: Some(Bytes::from(bytes)),
            log_index: Some(4),
        }
    }

    fn replayed(length: u64, bytes: &[u8]) -> Answer {
        Answer::Replayed {
            reply: Reply::Append { length },
            canonical: Some(Bytes::from(bytes)),
            applied_index: Some(4),
        }
    }

    fn op(seq: u64, outcome: Outcome) -> OpRecord {
        OpRecord {
            id: seq,
            client: 1,
            op: Op::Append {
                key: "k".into(),
                token: "t".into(),
            },
            request: RequestIdentity::session(9, seq),
            invoke_ns: 0,
            complete_ns: Some(1000),
            attempts: 3,
            outcome,
        }
    }

    fn ok(length: u64, bytes: &[u8]) -> Outcome {
        Outcome::Ok {
            reply: Reply::Append { length },
            canonical: Some(Bytes::from(bytes)),
        }
    }

    /// For a verdict whose one violation is two differing replies, whether
    /// they differ in their bytes only.
    fn differs_in_bytes_only(verdict: &RepliesVerdict) -> Option<bool> {
        match verdict.violations.as_slice() {
            [ReplyViolation::Differs { bytes_only, .. }] => Some(*bytes_only),
            _ => None,
        }
    }

    #[test]
    fn identical_retries_pass() {
        let record = Record {
            ops: vec![op(1, ok(4, b"\x08\x04"))],
            responses: vec![
                response(1, 1, applied(4, b"\x08\x04")),
                response(
                    1,
                    2,
                    Answer::Transient {
                        detail: "not leader".to_owned(),
                    },
                ),
                response(1, 3, replayed(4, b"\x08\x04")),
            ],
            ..Record::default()
        };
        let verdict = check(&record);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.requests, 1);
        assert_eq!(verdict.replies, 3);
        assert_eq!(verdict.replayed, 1);
    }

    #[test]
    fn a_different_replayed_reply_fails() {
        let record = Record {
            responses: vec![
                response(1, 1, applied(4, b"\x08\x04")),
                response(1, 2, replayed(8, b"\x08\x08")),
            ],
            ..Record::default()
        };
        let verdict = check(&record);
        assert_eq!(differs_in_bytes_only(&verdict), Some(false), "{verdict}");
        assert!(verdict.explanation().contains("request 9:1"), "{verdict}");
    }

    #[test]
    fn different_bytes_for_the_same_typed_reply_fail() {
        let record = Record {
            ops: vec![op(1, ok(4, b"\x08\x04\x00"))],
            responses: vec![response(1, 1, applied(4, b"\x08\x04"))],
            ..Record::default()
        };
        let verdict = check(&record);
        assert_eq!(differs_in_bytes_only(&verdict), Some(true), "{verdict}");
    }

    #[test]
    fn a_final_outcome_that_differs_from_the_wire_fails() {
        let record = Record {
            ops: vec![op(1, ok(5, b"\x08\x05"))],
            responses: vec![response(1, 1, applied(4, b"\x08\x04"))],
            ..Record::default()
        };
        assert_eq!(check(&record).status(), Status::Fail);
    }

    #[test]
    fn one_entry_answering_two_attempts_passes() {
        // A retry that met the request in flight gets the same entry's
        // result, and a later retry a replay of it.
        let record = Record {
            responses: vec![
                response(1, 1, applied(4, b"\x08\x04")),
                response(1, 2, applied(4, b"\x08\x04")),
                response(1, 3, replayed(4, b"\x08\x04")),
            ],
            ..Record::default()
        };
        assert_eq!(check(&record).status(), Status::Pass);
    }

    #[test]
    fn running_at_two_indexes_fails() {
        let mut second = applied(4, b"\x08\x04");
        if let Answer::Applied { log_index, .. } = &mut second {
            *log_index = Some(7);
        }
        let record = Record {
            responses: vec![
                response(1, 1, applied(4, b"\x08\x04")),
                response(1, 2, second),
            ],
            ..Record::default()
        };
        let verdict = check(&record);
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ReplyViolation::AppliedTwice { indexes, .. }] if indexes.len() == 2
            ),
            "{verdict}"
        );
        assert!(
            verdict.explanation().contains("ran at 2 log indexes"),
            "{verdict}"
        );
    }

    #[test]
    fn refusals_plain_requests_and_other_requests_are_not_compared() {
        let mut plain = response(2, 1, applied(1, b"a"));
        plain.request = RequestIdentity::plain();
        let mut plain_again = response(2, 2, applied(2, b"b"));
        plain_again.request = RequestIdentity::plain();
        let record = Record {
            ops: vec![op(
                3,
                Outcome::Failed {
                    reason: FailReason::Stale,
                    detail: None,
                },
            )],
            responses: vec![
                response(1, 1, applied(4, b"x")),
                response(3, 1, applied(9, b"y")),
                response(
                    3,
                    2,
                    Answer::Refused {
                        reason: FailReason::Stale,
                    },
                ),
                plain,
                plain_again,
            ],
            ..Record::default()
        };
        let verdict = check(&record);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.requests, 2);
        assert_eq!(verdict.compared, 0);
    }

    #[test]
    fn idempotency_keys_are_grouped_too() {
        let mut first = response(1, 1, applied(4, b"a"));
        first.request = RequestIdentity::idempotent("key-1");
        let mut second = response(2, 2, replayed(5, b"b"));
        second.request = RequestIdentity::idempotent("key-1");
        let record = Record {
            responses: vec![first, second],
            ..Record::default()
        };
        assert_eq!(check(&record).status(), Status::Fail);
    }
}
