//! The exactly-once checker for append workloads.
//!
//! Clients append unique tokens, each followed by a delimiter (`;` by
//! default), to a few keys; after the run the final value of each key is
//! read. Splitting a final value into tokens and comparing with the
//! history, for every token:
//!
//! * acknowledged (an `Ok` reply): it appears **exactly once**;
//! * outcome unknown: it appears **at most once**;
//! * definitely not applied (a definite failure, or a deterministic
//!   rejection): it does **not** appear;
//! * never invoked on that key: it does not appear (a *phantom*);
//! * and no token appears twice.
//!
//! (A token invoked more than once, which a well-formed workload never
//! does, may appear between its acknowledged count and its acknowledged
//! plus unknown count.) Two more consequences of appends being atomic and
//! ordered are checked:
//!
//! * the length an append returned is the value's length just after it, so
//!   the final value's prefix of that length ends with the token;
//! * an append acknowledged before another was invoked precedes it in the
//!   value.
//!
//! A key also written by PUT, CAS or INCR, a key whose final value was not
//! read, and a token that is empty or contains the delimiter leave that key
//! undecided, never passed.

use super::Findings;
use crate::record::{Bytes, OpId, OpRecord, OutcomeClass, Record, Reply};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// How tokens are laid out in a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenFormat {
    /// The byte that terminates every token.
    pub delimiter: u8,
}

impl Default for TokenFormat {
    /// `;`-terminated tokens.
    fn default() -> Self {
        Self { delimiter: b';' }
    }
}

/// A value split into tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedValue<'a> {
    /// The terminated tokens with their byte offsets, in order.
    pub tokens: Vec<(usize, &'a [u8])>,
    /// Bytes after the last delimiter, if any.
    pub tail: Option<&'a [u8]>,
}

/// Splits `value` into delimiter-terminated tokens.
pub fn parse_tokens(value: &[u8], format: TokenFormat) -> ParsedValue<'_> {
    let mut tokens = Vec::new();
    let mut start = 0;
    for (at, &byte) in value.iter().enumerate() {
        if byte == format.delimiter {
            tokens.push((start, &value[start..at]));
            start = at + 1;
        }
    }
    let tail = (start < value.len()).then(|| &value[start..]);
    ParsedValue { tokens, tail }
}

/// One way the final values contradict the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExactlyOnceViolation {
    /// An acknowledged append is missing (or appears fewer times than it
    /// was acknowledged).
    Lost {
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// The acknowledged operations.
        ops: Vec<OpId>,
        /// How many times it appears.
        found: usize,
    },
    /// A token appears more often than it may have been applied.
    Duplicated {
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// The operations that appended it.
        ops: Vec<OpId>,
        /// How many times it appears.
        found: usize,
        /// The most it may appear (acknowledged plus unknown).
        allowed: usize,
    },
    /// A token whose every append definitely did not apply appears.
    AppliedAfterFailure {
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// The operations, all definitely not applied.
        ops: Vec<OpId>,
        /// How many times it appears.
        found: usize,
    },
    /// A token appears that was never appended to this key.
    Phantom {
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// How many times it appears.
        found: usize,
        /// Keys the token was appended to instead, if any.
        appended_to: Vec<Bytes>,
    },
    /// Bytes after the last delimiter: a torn or foreign write.
    UnterminatedTail {
        /// The key.
        key: Bytes,
        /// The bytes.
        tail: Bytes,
    },
    /// The length an append returned does not end with its token in the
    /// final value.
    LengthMismatch {
        /// The key.
        key: Bytes,
        /// The token.
        token: Bytes,
        /// The operation.
        op: OpId,
        /// The length it returned.
        length: u64,
    },
    /// An append acknowledged before another was invoked comes after it.
    Reordered {
        /// The key.
        key: Bytes,
        /// The token acknowledged first.
        earlier: Bytes,
        /// Its operation.
        earlier_op: OpId,
        /// The token invoked after that acknowledgement, found before it.
        later: Bytes,
        /// Its operation.
        later_op: OpId,
    },
}

fn ids(ops: &[OpId]) -> String {
    ops.iter()
        .map(|id| format!("#{id}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for ExactlyOnceViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost {
                key,
                token,
                ops,
                found,
            } => write!(
                f,
                "lost: token {token} on key {key} was acknowledged ({}) but appears {found} time(s)",
                ids(ops)
            ),
            Self::Duplicated {
                key,
                token,
                ops,
                found,
                allowed,
            } => write!(
                f,
                "duplicated: token {token} on key {key} appears {found} times, at most {allowed} allowed (ops {})",
                ids(ops)
            ),
            Self::AppliedAfterFailure {
                key,
                token,
                ops,
                found,
            } => write!(
                f,
                "applied though definitely not applied: token {token} on key {key} appears {found} time(s) (ops {})",
                ids(ops)
            ),
            Self::Phantom {
                key,
                token,
                found,
                appended_to,
            } => {
                write!(
                    f,
                    "phantom: token {token} appears {found} time(s) on key {key} but was never appended to it"
                )?;
                if !appended_to.is_empty() {
                    let keys: Vec<String> = appended_to.iter().map(ToString::to_string).collect();
                    write!(f, " (it was appended to {})", keys.join(", "))?;
                }
                Ok(())
            }
            Self::UnterminatedTail { key, tail } => {
                write!(
                    f,
                    "torn value: key {key} ends with unterminated bytes {tail}"
                )
            }
            Self::LengthMismatch {
                key,
                token,
                op,
                length,
            } => write!(
                f,
                "length mismatch: op #{op} appended {token} to key {key} and got length {length}, but the final value's first {length} bytes do not end with it"
            ),
            Self::Reordered {
                key,
                earlier,
                earlier_op,
                later,
                later_op,
            } => write!(
                f,
                "reordered: on key {key}, {later} (op #{later_op}, invoked after {earlier} was acknowledged by op #{earlier_op}) appears before it"
            ),
        }
    }
}

/// Why a key was left undecided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExactlyOnceUndecided {
    /// The key's final value was not read.
    NoFinalValue {
        /// The key.
        key: Bytes,
        /// How many appends it had.
        appends: usize,
    },
    /// The key was also written by something other than appends.
    MixedKey {
        /// The key.
        key: Bytes,
        /// The other operations' kinds.
        others: Vec<&'static str>,
    },
    /// A token is empty or contains the delimiter, so values cannot be
    /// split unambiguously.
    BadToken {
        /// The key.
        key: Bytes,
        /// The operation.
        op: OpId,
        /// The token.
        token: Bytes,
    },
}

impl fmt::Display for ExactlyOnceUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoFinalValue { key, appends } => write!(
                f,
                "undecided: key {key} had {appends} append(s) but its final value was not read"
            ),
            Self::MixedKey { key, others } => write!(
                f,
                "undecided: key {key} was also written by {}",
                others.join(", ")
            ),
            Self::BadToken { key, op, token } => write!(
                f,
                "undecided: op #{op} appended token {token:?} to key {key}, which is empty or contains the delimiter"
            ),
        }
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExactlyOnceVerdict {
    /// Keys whose final value was compared with the history.
    pub keys_checked: usize,
    /// Append operations recorded.
    pub appends: usize,
    /// Of which acknowledged.
    pub acknowledged: usize,
    /// Of which with an unknown outcome.
    pub unknown: usize,
    /// Of which definitely not applied.
    pub not_applied: usize,
    /// Tokens found in the checked final values.
    pub tokens_found: usize,
    /// Everything that contradicts exactly-once.
    pub violations: Vec<ExactlyOnceViolation>,
    /// Keys that could not be checked.
    pub undecided: Vec<ExactlyOnceUndecided>,
}

impl Findings for ExactlyOnceVerdict {
    const CHECKER: &'static str = "exactly_once";
    const PASS: &'static str = "every append applied exactly once";
    type Violation = ExactlyOnceViolation;
    type Undecided = ExactlyOnceUndecided;

    fn violations(&self) -> &[ExactlyOnceViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[ExactlyOnceUndecided] {
        &self.undecided
    }

    fn scope(&self) -> String {
        format!(
            "{} append(s) ({} acknowledged, {} unknown, {} not applied) on {} key(s), {} token(s) found",
            self.appends,
            self.acknowledged,
            self.unknown,
            self.not_applied,
            self.keys_checked,
            self.tokens_found
        )
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        (self.appends == 0).then_some("no append operations recorded")
    }

    fn undecided_wording(&self) -> String {
        format!("{} key(s) undecided, no violation", self.undecided.len())
    }
}

/// Checks the append operations of `record` against `final_values`.
pub fn check(
    record: &Record,
    final_values: &BTreeMap<Bytes, Option<Bytes>>,
    format: TokenFormat,
) -> ExactlyOnceVerdict {
    let mut verdict = ExactlyOnceVerdict::default();
    let mut appends: BTreeMap<&Bytes, Vec<&OpRecord>> = BTreeMap::new();
    let mut writers: BTreeMap<&Bytes, BTreeSet<&'static str>> = BTreeMap::new();
    let mut token_keys: BTreeMap<&[u8], BTreeSet<&Bytes>> = BTreeMap::new();
    for op in &record.ops {
        match &op.op {
            crate::record::Op::Append { key, token } => {
                verdict.appends += 1;
                match op.outcome.class() {
                    OutcomeClass::Ok => verdict.acknowledged += 1,
                    OutcomeClass::Unknown => verdict.unknown += 1,
                    OutcomeClass::Failed | OutcomeClass::Rejected => verdict.not_applied += 1,
                }
                appends.entry(key).or_default().push(op);
                token_keys.entry(token.as_slice()).or_default().insert(key);
            }
            crate::record::Op::Get { .. } => {}
            other => {
                if let Some(key) = other.key() {
                    writers.entry(key).or_default().insert(other.name());
                }
            }
        }
    }

    for (key, ops) in appends {
        if let Some(others) = writers.get(key) {
            verdict.undecided.push(ExactlyOnceUndecided::MixedKey {
                key: key.clone(),
                others: others.iter().copied().collect(),
            });
            continue;
        }
        let Some(final_value) = final_values.get(key) else {
            verdict.undecided.push(ExactlyOnceUndecided::NoFinalValue {
                key: key.clone(),
                appends: ops.len(),
            });
            continue;
        };
        let bad = ops.iter().find_map(|op| match &op.op {
            crate::record::Op::Append { token, .. }
                if token.is_empty() || token.as_slice().contains(&format.delimiter) =>
            {
                Some((op.id, token.clone()))
            }
            _ => None,
        });
        if let Some((op, token)) = bad {
            verdict.undecided.push(ExactlyOnceUndecided::BadToken {
                key: key.clone(),
                op,
                token,
            });
            continue;
        }
        verdict.keys_checked += 1;
        let value = final_value.as_ref().map_or(&[][..], Bytes::as_slice);
        check_key(key, value, &ops, &token_keys, format, &mut verdict);
    }
    verdict
}

fn token_of(op: &OpRecord) -> &[u8] {
    match &op.op {
        crate::record::Op::Append { token, .. } => token.as_slice(),
        _ => &[],
    }
}

fn check_key(
    key: &Bytes,
    value: &[u8],
    ops: &[&OpRecord],
    token_keys: &BTreeMap<&[u8], BTreeSet<&Bytes>>,
    format: TokenFormat,
    verdict: &mut ExactlyOnceVerdict,
) {
    let parsed = parse_tokens(value, format);
    verdict.tokens_found += parsed.tokens.len();
    if let Some(tail) = parsed.tail {
        verdict
            .violations
            .push(ExactlyOnceViolation::UnterminatedTail {
                key: key.clone(),
                tail: Bytes::from(tail),
            });
    }
    // Offsets of each token in the value.
    let mut found: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    for &(offset, token) in &parsed.tokens {
        found.entry(token).or_default().push(offset);
    }
    let mut by_token: BTreeMap<&[u8], Vec<&OpRecord>> = BTreeMap::new();
    for op in ops {
        by_token.entry(token_of(op)).or_default().push(op);
    }

    for (&token, token_ops) in &by_token {
        let count = found.get(token).map_or(0, Vec::len);
        let acked: Vec<OpId> = token_ops
            .iter()
            .filter(|op| op.outcome.class() == OutcomeClass::Ok)
            .map(|op| op.id)
            .collect();
        let unknown = token_ops
            .iter()
            .filter(|op| op.outcome.class() == OutcomeClass::Unknown)
            .count();
        let all: Vec<OpId> = token_ops.iter().map(|op| op.id).collect();
        let allowed = acked.len() + unknown;
        if count < acked.len() {
            verdict.violations.push(ExactlyOnceViolation::Lost {
                key: key.clone(),
                token: Bytes::from(token),
                ops: acked.clone(),
                found: count,
            });
        } else if count > allowed && allowed == 0 {
            verdict
                .violations
                .push(ExactlyOnceViolation::AppliedAfterFailure {
                    key: key.clone(),
                    token: Bytes::from(token),
                    ops: all,
                    found: count,
                });
        } else if count > allowed {
            verdict.violations.push(ExactlyOnceViolation::Duplicated {
                key: key.clone(),
                token: Bytes::from(token),
                ops: all,
                found: count,
                allowed,
            });
        }
    }

    for (&token, offsets) in &found {
        if by_token.contains_key(token) {
            continue;
        }
        let appended_to = token_keys
            .get(token)
            .map(|keys| keys.iter().map(|k| (*k).clone()).collect())
            .unwrap_or_default();
        verdict.violations.push(ExactlyOnceViolation::Phantom {
            key: key.clone(),
            token: Bytes::from(token),
            found: offsets.len(),
            appended_to,
        });
    }

    // The length each acknowledged append returned.
    for op in ops {
        let Some(Reply::Append { length }) = op.outcome.reply() else {
            continue;
        };
        let token = token_of(op);
        let fits = usize::try_from(*length)
            .ok()
            .and_then(|end| value.get(..end))
            .and_then(|prefix| prefix.strip_suffix(&[format.delimiter][..]))
            .is_some_and(|prefix| prefix.ends_with(token));
        if !fits {
            verdict
                .violations
                .push(ExactlyOnceViolation::LengthMismatch {
                    key: key.clone(),
                    token: Bytes::from(token),
                    op: op.id,
                    length: *length,
                });
        }
    }

    check_order(key, ops, &found, &by_token, verdict);
}

/// An append acknowledged at `t` took effect before `t`; one invoked after
/// `t` takes effect after it, so it must come later in the value. Only
/// tokens appended by one operation and found once take part.
fn check_order(
    key: &Bytes,
    ops: &[&OpRecord],
    found: &BTreeMap<&[u8], Vec<usize>>,
    by_token: &BTreeMap<&[u8], Vec<&OpRecord>>,
    verdict: &mut ExactlyOnceVerdict,
) {
    let placed: Vec<(&OpRecord, usize)> = ops
        .iter()
        .filter_map(|op| {
            let token = token_of(op);
            let single_op = by_token.get(token).is_some_and(|v| v.len() == 1);
            match found.get(token).map(Vec::as_slice) {
                Some(&[offset]) if single_op => Some((*op, offset)),
                _ => None,
            }
        })
        .collect();
    let mut acked: Vec<(u64, &OpRecord, usize)> = placed
        .iter()
        .filter(|(op, _)| op.outcome.class() == OutcomeClass::Ok)
        .filter_map(|&(op, offset)| op.complete_ns.map(|at| (at, op, offset)))
        .collect();
    acked.sort_by_key(|&(at, op, _)| (at, op.id));
    let mut invoked: Vec<(&OpRecord, usize)> = placed;
    invoked.sort_by_key(|(op, _)| (op.invoke_ns, op.id));

    let mut next = 0;
    let mut latest: Option<(&OpRecord, usize)> = None;
    for (op, offset) in invoked {
        while let Some(&(at, earlier, earlier_offset)) = acked.get(next) {
            if at >= op.invoke_ns {
                break;
            }
            if latest.is_none_or(|(_, o)| earlier_offset > o) {
                latest = Some((earlier, earlier_offset));
            }
            next += 1;
        }
        if let Some((earlier, earlier_offset)) = latest
            && earlier_offset > offset
        {
            verdict.violations.push(ExactlyOnceViolation::Reordered {
                key: key.clone(),
                earlier: Bytes::from(token_of(earlier)),
                earlier_op: earlier.id,
                later: Bytes::from(token_of(op)),
                later_op: op.id,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};
    use crate::record::{FailReason, Op, Outcome, RequestIdentity};

    struct Builder {
        ops: Vec<OpRecord>,
        value: Vec<u8>,
    }

    impl Builder {
        fn new() -> Self {
            Self {
                ops: Vec::new(),
                value: Vec::new(),
            }
        }

        fn push(&mut self, token: &str, times: (u64, u64), outcome: Outcome) -> &mut Self {
            let id = self.ops.len() as u64 + 1;
            self.ops.push(OpRecord {
                id,
                client: id,
                op: Op::Append {
                    key: "k".into(),
                    token: token.into(),
                },
                request: RequestIdentity::session(1, id),
                invoke_ns: times.0,
                complete_ns: Some(times.1),
                attempts: 1,
                outcome,
            });
            self
        }

        /// An acknowledged append, applied to the value now.
        fn acked(&mut self, token: &str, times: (u64, u64)) -> &mut Self {
            self.value.extend_from_slice(token.as_bytes());
            self.value.push(b';');
            let length = self.value.len() as u64;
            self.push(
                token,
                times,
                Outcome::Ok {
                    reply: Reply::Append { length },
                    canonical: None,
                },
            )
        }

        fn unknown(&mut self, token: &str, times: (u64, u64), applied: bool) -> &mut Self {
            if applied {
                self.value.extend_from_slice(token.as_bytes());
                self.value.push(b';');
            }
            self.push(token, times, Outcome::Unknown { detail: None })
        }

        fn failed(&mut self, token: &str, times: (u64, u64)) -> &mut Self {
            self.push(
                token,
                times,
                Outcome::Failed {
                    reason: FailReason::SessionExpired,
                    detail: None,
                },
            )
        }

        fn raw(&mut self, bytes: &str) -> &mut Self {
            self.value.extend_from_slice(bytes.as_bytes());
            self
        }

        fn check(&self) -> ExactlyOnceVerdict {
            let record = Record {
                ops: self.ops.clone(),
                ..Record::default()
            };
            let finals = BTreeMap::from([(Bytes::from("k"), Some(Bytes(self.value.clone())))]);
            check(&record, &finals, TokenFormat::default())
        }
    }

    fn good() -> Builder {
        let mut b = Builder::new();
        b.acked("a", (0, 10))
            .unknown("b", (5, 50), true)
            .unknown("c", (6, 60), false)
            .failed("d", (7, 8))
            .acked("e", (20, 30));
        b
    }

    #[test]
    fn a_good_history_passes() {
        let verdict = good().check();
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.appends, 5);
        assert_eq!(verdict.acknowledged, 2);
        assert_eq!(verdict.unknown, 2);
        assert_eq!(verdict.not_applied, 1);
        assert_eq!(verdict.tokens_found, 3);
        assert!(
            verdict
                .headline()
                .starts_with("every append applied exactly once")
        );
    }

    #[test]
    fn parse_splits_terminated_tokens() {
        let parsed = parse_tokens(b"a;bb;;c", TokenFormat::default());
        assert_eq!(
            parsed.tokens,
            vec![(0, &b"a"[..]), (2, &b"bb"[..]), (5, &b""[..])]
        );
        assert_eq!(parsed.tail, Some(&b"c"[..]));
        assert_eq!(parse_tokens(b"", TokenFormat::default()).tokens, vec![]);
    }

    #[test]
    fn a_lost_acknowledged_append_fails() {
        let mut b = good();
        b.value = b"b;e;".to_vec();
        let verdict = b.check();
        assert_eq!(verdict.status(), Status::Fail);
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, ExactlyOnceViolation::Lost { token, .. } if token == &Bytes::from("a"))),
            "{verdict}"
        );
    }

    #[test]
    fn a_duplicated_append_fails() {
        let mut b = good();
        b.raw("e;");
        let verdict = b.check();
        assert!(
            verdict.violations.iter().any(|v| matches!(
                v,
                ExactlyOnceViolation::Duplicated {
                    found: 2,
                    allowed: 1,
                    ..
                }
            )),
            "{verdict}"
        );
    }

    #[test]
    fn an_unknown_append_applied_twice_fails() {
        let mut b = good();
        b.raw("c;c;");
        let verdict = b.check();
        assert!(
            verdict.violations.iter().any(|v| matches!(
                v,
                ExactlyOnceViolation::Duplicated { token, found: 2, .. } if token == &Bytes::from("c")
            )),
            "{verdict}"
        );
    }

    #[test]
    fn a_failed_append_that_applied_fails() {
        let mut b = good();
        b.raw("d;");
        let verdict = b.check();
        assert!(
            verdict.violations.iter().any(|v| matches!(
                v,
                ExactlyOnceViolation::AppliedAfterFailure { token, .. } if token == &Bytes::from("d")
            )),
            "{verdict}"
        );
    }

    #[test]
    fn a_rejected_append_counts_as_not_applied() {
        let mut b = Builder::new();
        b.push(
            "r",
            (0, 1),
            Outcome::Ok {
                reply: Reply::Rejected {
                    reason: "value too large".to_owned(),
                },
                canonical: None,
            },
        )
        .raw("r;");
        let verdict = b.check();
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ExactlyOnceViolation::AppliedAfterFailure { .. }]
            ),
            "{verdict}"
        );
    }

    #[test]
    fn a_phantom_token_and_a_torn_tail_fail() {
        let mut b = good();
        b.raw("zz;").raw("half");
        let verdict = b.check();
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, ExactlyOnceViolation::Phantom { token, .. } if token == &Bytes::from("zz"))),
            "{verdict}"
        );
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, ExactlyOnceViolation::UnterminatedTail { .. })),
            "{verdict}"
        );
    }

    #[test]
    fn a_wrong_returned_length_fails() {
        let mut b = Builder::new();
        b.acked("a", (0, 1)).acked("b", (2, 3));
        // The server claims "b" ended at length 2, where "a;" ends.
        b.ops[1].outcome = Outcome::Ok {
            reply: Reply::Append { length: 2 },
            canonical: None,
        };
        let verdict = b.check();
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ExactlyOnceViolation::LengthMismatch {
                    op: 2,
                    length: 2,
                    ..
                }]
            ),
            "{verdict}"
        );
    }

    #[test]
    fn real_time_order_is_enforced() {
        let mut b = Builder::new();
        // "early" was acknowledged at 10, "late" invoked at 20, yet "late"
        // comes first.
        b.unknown("late", (20, 30), true).acked("early", (0, 10));
        let verdict = b.check();
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [ExactlyOnceViolation::Reordered {
                    later_op: 1,
                    earlier_op: 2,
                    ..
                }]
            ),
            "{verdict}"
        );
        // Overlapping operations may go either way.
        let mut overlap = Builder::new();
        overlap
            .unknown("late", (5, 30), true)
            .acked("early", (0, 10));
        assert_eq!(overlap.check().status(), Status::Pass);
    }

    #[test]
    fn missing_final_value_mixed_keys_and_bad_tokens_are_undecided() {
        let b = good();
        let record = Record {
            ops: b.ops.clone(),
            ..Record::default()
        };
        let verdict = check(&record, &BTreeMap::new(), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Undecided);
        assert!(matches!(
            verdict.undecided.as_slice(),
            [ExactlyOnceUndecided::NoFinalValue { appends: 5, .. }]
        ));

        let mut mixed = record.clone();
        let mut put = mixed.ops[0].clone();
        put.id = 99;
        put.op = Op::Put {
            key: "k".into(),
            value: "x".into(),
        };
        mixed.ops.push(put);
        let finals = BTreeMap::from([(Bytes::from("k"), None)]);
        let verdict = check(&mixed, &finals, TokenFormat::default());
        assert!(matches!(
            verdict.undecided.as_slice(),
            [ExactlyOnceUndecided::MixedKey { .. }]
        ));

        let mut bad = Builder::new();
        bad.acked("a;b", (0, 1));
        assert!(matches!(
            bad.check().undecided.as_slice(),
            [ExactlyOnceUndecided::BadToken { .. }]
        ));
    }

    #[test]
    fn an_absent_key_loses_every_acknowledged_append() {
        let b = good();
        let record = Record {
            ops: b.ops.clone(),
            ..Record::default()
        };
        let finals = BTreeMap::from([(Bytes::from("k"), None)]);
        let verdict = check(&record, &finals, TokenFormat::default());
        let lost = verdict
            .violations
            .iter()
            .filter(|v| matches!(v, ExactlyOnceViolation::Lost { .. }))
            .count();
        assert_eq!(lost, 2, "{verdict}");
    }

    #[test]
    fn an_empty_record_passes_vacuously() {
        let verdict = check(&Record::default(), &BTreeMap::new(), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass);
        assert_eq!(verdict.headline(), "no append operations recorded");
    }
}
