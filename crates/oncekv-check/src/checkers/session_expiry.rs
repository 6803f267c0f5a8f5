//! The session-expiry checker: nothing applies on a session after its
//! client was told it expired.
//!
//! A session's id is never reused, and once the state machine expires a
//! session every later request on it is refused. So from the first moment
//! a client learns that session `s` expired (an
//! [`Event::SessionExpired`](crate::record::Event::SessionExpired) marker,
//! an operation on `s` failed with `SessionExpired`, or an attempt on `s`
//! refused with it), any request on `s` first invoked later must not have
//! run:
//!
//! * its operation has no `Ok` outcome (not even a rejection, which is a
//!   reply of a command that ran);
//! * no attempt of it was answered `Applied` or `Replayed`;
//! * for appends, its token is not in the key's final value.
//!
//! A request's first invocation is the earliest invocation of any
//! operation carrying its dedup key.

use super::exactly_once::{TokenFormat, parse_tokens};
use super::{Findings, at};
use crate::record::{
    Answer, Bytes, ClientId, DedupKey, FailReason, Op, OpId, OpRecord, Outcome, Record,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// How a client learned that a session expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpirySource {
    /// A session-expiry marker for this client.
    Reported {
        /// The client.
        client: ClientId,
    },
    /// An operation's outcome.
    Outcome {
        /// The operation.
        op: OpId,
    },
    /// An attempt's answer.
    Answer {
        /// The operation, if known.
        op: Option<OpId>,
        /// The attempt.
        attempt: u32,
    },
}

impl fmt::Display for ExpirySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reported { client } => write!(f, "reported to client {client}"),
            Self::Outcome { op } => write!(f, "outcome of op #{op}"),
            Self::Answer {
                op: Some(op),
                attempt,
            } => write!(f, "answer to op #{op} attempt {attempt}"),
            Self::Answer { op: None, attempt } => write!(f, "answer to attempt {attempt}"),
        }
    }
}

/// The first time a session was known to be expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownExpiry {
    /// The session.
    pub session: u64,
    /// When.
    pub at_ns: u64,
    /// How it was learned.
    pub source: ExpirySource,
}

/// Evidence that a request ran after its session expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryViolation {
    /// An operation on an expired session got a reply.
    Replied {
        /// The expiry.
        expiry: KnownExpiry,
        /// The operation.
        op: OpId,
        /// Its request.
        request: Option<DedupKey>,
        /// When the request was first invoked.
        invoked_ns: u64,
        /// The reply.
        reply: String,
    },
    /// An attempt on an expired session was answered `Applied` or
    /// `Replayed`.
    Answered {
        /// The expiry.
        expiry: KnownExpiry,
        /// The request.
        request: DedupKey,
        /// When it was first invoked.
        invoked_ns: u64,
        /// The attempt.
        attempt: u32,
        /// When the answer came.
        at_ns: u64,
    },
    /// An append on an expired session is in the final value.
    InFinalState {
        /// The expiry.
        expiry: KnownExpiry,
        /// The operation.
        op: OpId,
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// When it was first invoked.
        invoked_ns: u64,
    },
}

impl fmt::Display for ExpiryViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expired = |e: &KnownExpiry| {
            format!(
                "session {} expired at {} ({})",
                e.session,
                at(e.at_ns),
                e.source
            )
        };
        match self {
            Self::Replied {
                expiry,
                op,
                request,
                invoked_ns,
                reply,
            } => {
                write!(f, "{}, yet op #{op}", expired(expiry))?;
                if let Some(request) = request {
                    write!(f, " ({request})")?;
                }
                write!(
                    f,
                    ", first invoked at {}, got a reply: {reply}",
                    at(*invoked_ns)
                )
            }
            Self::Answered {
                expiry,
                request,
                invoked_ns,
                attempt,
                at_ns,
            } => write!(
                f,
                "{}, yet {request}, first invoked at {}, ran: attempt {attempt} was answered at {}",
                expired(expiry),
                at(*invoked_ns),
                at(*at_ns)
            ),
            Self::InFinalState {
                expiry,
                op,
                key,
                token,
                invoked_ns,
            } => write!(
                f,
                "{}, yet token {token} of op #{op}, first invoked at {}, is in key {key}",
                expired(expiry),
                at(*invoked_ns)
            ),
        }
    }
}

/// Why part of the check could not be done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryUndecided {
    /// Appends after expiry to a key whose final value was not read.
    NoFinalValue {
        /// The key.
        key: Bytes,
        /// The appends that could not be checked.
        ops: Vec<OpId>,
    },
}

impl fmt::Display for ExpiryUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoFinalValue { key, ops } => write!(
                f,
                "undecided: {} append(s) after expiry to key {key}, whose final value was not read",
                ops.len()
            ),
        }
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionExpiryVerdict {
    /// Every session known to have expired, with when it was first known.
    pub expired: Vec<KnownExpiry>,
    /// Operations invoked on a session after it was known expired.
    pub ops_after_expiry: usize,
    /// Everything that ran after expiry.
    pub violations: Vec<ExpiryViolation>,
    /// What could not be checked.
    pub undecided: Vec<ExpiryUndecided>,
}

impl Findings for SessionExpiryVerdict {
    const CHECKER: &'static str = "session_expiry";
    const PASS: &'static str = "nothing ran after its session expired";
    type Violation = ExpiryViolation;
    type Undecided = ExpiryUndecided;

    fn violations(&self) -> &[ExpiryViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[ExpiryUndecided] {
        &self.undecided
    }

    fn scope(&self) -> String {
        format!(
            "{} session(s) expired, {} operation(s) invoked on them afterwards",
            self.expired.len(),
            self.ops_after_expiry
        )
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        self.expired
            .is_empty()
            .then_some("no session expiry observed")
    }

    fn undecided_wording(&self) -> String {
        "partly undecided, no violation".to_owned()
    }
}

/// The first moment each session was known expired.
pub fn known_expiries(record: &Record) -> BTreeMap<u64, KnownExpiry> {
    let mut known: BTreeMap<u64, KnownExpiry> = BTreeMap::new();
    let mut note = |session: u64, at_ns: u64, source: ExpirySource| {
        let earlier = known.get(&session).is_some_and(|k| k.at_ns <= at_ns);
        if !earlier {
            known.insert(
                session,
                KnownExpiry {
                    session,
                    at_ns,
                    source,
                },
            );
        }
    };
    for report in &record.expiries {
        note(
            report.session,
            report.at_ns,
            ExpirySource::Reported {
                client: report.client,
            },
        );
    }
    for op in &record.ops {
        if let (
            Some(session),
            Some(at_ns),
            Outcome::Failed {
                reason: FailReason::SessionExpired,
                ..
            },
        ) = (op.request.session, op.complete_ns, &op.outcome)
        {
            note(session, at_ns, ExpirySource::Outcome { op: op.id });
        }
    }
    for response in &record.responses {
        if let (
            Some(session),
            Answer::Refused {
                reason: FailReason::SessionExpired,
            },
        ) = (response.request.session, &response.answer)
        {
            note(
                session,
                response.at_ns,
                ExpirySource::Answer {
                    op: response.op_id,
                    attempt: response.attempt,
                },
            );
        }
    }
    known
}

/// Checks that nothing ran on a session after it was known expired.
pub fn check(
    record: &Record,
    final_values: &BTreeMap<Bytes, Option<Bytes>>,
    format: TokenFormat,
) -> SessionExpiryVerdict {
    let known = known_expiries(record);
    let mut verdict = SessionExpiryVerdict {
        expired: known.values().cloned().collect(),
        ..SessionExpiryVerdict::default()
    };
    if known.is_empty() {
        return verdict;
    }
    let mut first_invoked: BTreeMap<DedupKey, u64> = BTreeMap::new();
    for op in &record.ops {
        if let Some(key) = op.request.dedup_key() {
            let at = first_invoked.entry(key).or_insert(op.invoke_ns);
            *at = (*at).min(op.invoke_ns);
        }
    }
    let first_of = |op: &OpRecord| {
        op.request
            .dedup_key()
            .and_then(|key| first_invoked.get(&key).copied())
            .unwrap_or(op.invoke_ns)
    };

    // Operations first invoked after their session was known expired.
    let late: Vec<(&OpRecord, &KnownExpiry, u64)> = record
        .ops
        .iter()
        .filter_map(|op| {
            let expiry = known.get(&op.request.session?)?;
            let invoked = first_of(op);
            (invoked > expiry.at_ns).then_some((op, expiry, invoked))
        })
        .collect();
    verdict.ops_after_expiry = late.len();

    for &(op, expiry, invoked_ns) in &late {
        if let Some(reply) = op.outcome.reply() {
            verdict.violations.push(ExpiryViolation::Replied {
                expiry: expiry.clone(),
                op: op.id,
                request: op.request.dedup_key(),
                invoked_ns,
                reply: reply.to_string(),
            });
        }
    }

    for response in &record.responses {
        let (Some(session), Some(request)) =
            (response.request.session, response.request.dedup_key())
        else {
            continue;
        };
        let (Some(expiry), Some(&invoked_ns)) = (known.get(&session), first_invoked.get(&request))
        else {
            continue;
        };
        if invoked_ns > expiry.at_ns && response.answer.reply().is_some() {
            verdict.violations.push(ExpiryViolation::Answered {
                expiry: expiry.clone(),
                request,
                invoked_ns,
                attempt: response.attempt,
                at_ns: response.at_ns,
            });
        }
    }

    let mut unread: BTreeMap<&Bytes, Vec<OpId>> = BTreeMap::new();
    let mut tokens: BTreeMap<&Bytes, BTreeSet<&[u8]>> = BTreeMap::new();
    for &(op, expiry, invoked_ns) in &late {
        let Op::Append { key, token } = &op.op else {
            continue;
        };
        let Some(value) = final_values.get(key) else {
            unread.entry(key).or_default().push(op.id);
            continue;
        };
        let present = tokens.entry(key).or_insert_with(|| {
            value.as_ref().map_or_else(BTreeSet::new, |value| {
                parse_tokens(value.as_slice(), format)
                    .tokens
                    .into_iter()
                    .map(|(_, token)| token)
                    .collect()
            })
        });
        if present.contains(token.as_slice()) {
            verdict.violations.push(ExpiryViolation::InFinalState {
                expiry: expiry.clone(),
                op: op.id,
                key: key.clone(),
                token: token.clone(),
                invoked_ns,
            });
        }
    }
    verdict.undecided = unread
        .into_iter()
        .map(|(key, ops)| ExpiryUndecided::NoFinalValue {
            key: key.clone(),
            ops,
        })
        .collect();
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};
    use crate::record::{AttemptResponse, ExpiryReport, Reply, RequestIdentity};

    fn append(id: OpId, seq: u64, token: &str, invoke: u64, outcome: Outcome) -> OpRecord {
        OpRecord {
            id,
            client: 1,
            op: Op::Append {
                key: "k".into(),
                token: token.into(),
            },
            request: RequestIdentity::session(5, seq),
            invoke_ns: invoke,
            complete_ns: Some(invoke + 10),
            attempts: 1,
            outcome,
        }
    }

    fn expired() -> Outcome {
        Outcome::Failed {
            reason: FailReason::SessionExpired,
            detail: None,
        }
    }

    fn ok(length: u64) -> Outcome {
        Outcome::Ok {
            reply: Reply::Append { length },
            canonical: None,
        }
    }

    fn base() -> Record {
        Record {
            ops: vec![
                append(1, 1, "a", 0, ok(2)),
                append(2, 2, "b", 100, expired()),
                append(3, 3, "c", 200, expired()),
            ],
            expiries: vec![ExpiryReport {
                at_ns: 150,
                client: 1,
                session: 5,
            }],
            ..Record::default()
        }
    }

    fn finals(value: &str) -> BTreeMap<Bytes, Option<Bytes>> {
        BTreeMap::from([(Bytes::from("k"), Some(Bytes::from(value)))])
    }

    #[test]
    fn a_clean_expiry_passes() {
        let verdict = check(&base(), &finals("a;"), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        // The failed op #2 completed at 110, before the marker at 150.
        assert_eq!(verdict.expired[0].at_ns, 110);
        assert_eq!(verdict.ops_after_expiry, 1);
    }

    #[test]
    fn a_reply_after_expiry_fails() {
        let mut record = base();
        record.ops[2].outcome = ok(4);
        let verdict = check(&record, &finals("a;c;"), TokenFormat::default());
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, ExpiryViolation::Replied { op: 3, .. })),
            "{verdict}"
        );
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, ExpiryViolation::InFinalState { op: 3, .. })),
            "{verdict}"
        );
    }

    #[test]
    fn a_token_in_final_state_after_expiry_fails() {
        let mut record = base();
        record.ops[2].outcome = Outcome::Unknown { detail: None };
        let verdict = check(&record, &finals("a;c;"), TokenFormat::default());
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ExpiryViolation::InFinalState { op: 3, .. }]
            ),
            "{verdict}"
        );
        // An op invoked before the expiry may have applied.
        let verdict = check(&base(), &finals("a;b;"), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn a_retry_of_an_earlier_request_is_judged_by_its_first_invocation() {
        let mut record = base();
        // Op #4 re-sends request 5:2 (first invoked at 100, before the
        // expiry was known at 110) afterwards; the first send may have
        // applied in time.
        record.ops[1].outcome = Outcome::Unknown { detail: None };
        record
            .ops
            .push(append(4, 2, "b", 300, Outcome::Unknown { detail: None }));
        let verdict = check(&record, &finals("a;b;"), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn an_applied_answer_after_expiry_fails() {
        let mut record = base();
        record.ops[2].outcome = Outcome::Unknown { detail: None };
        record.responses.push(AttemptResponse {
            at_ns: 205,
            client: 1,
            op_id: Some(3),
            request: RequestIdentity::session(5, 3),
            attempt: 1,
            node: None,
            answer: Answer::Applied {
                reply: Reply::Append { length: 4 },
                canonical: None,
                log_index: None,
            },
            dropped_after_commit: true,
            batch: 1,
        });
        let verdict = check(&record, &finals("a;"), TokenFormat::default());
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ExpiryViolation::Answered { attempt: 1, .. }]
            ),
            "{verdict}"
        );
    }

    #[test]
    fn unread_final_values_are_undecided_and_no_expiry_passes() {
        let verdict = check(&base(), &BTreeMap::new(), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
        let quiet = Record {
            ops: vec![append(1, 1, "a", 0, ok(2))],
            ..Record::default()
        };
        let verdict = check(&quiet, &BTreeMap::new(), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass);
        assert_eq!(verdict.headline(), "no session expiry observed");
    }
}
