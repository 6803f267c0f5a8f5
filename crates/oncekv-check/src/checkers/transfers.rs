//! The transfers checker: money moved between accounts by transactions is
//! conserved, and every transfer applied exactly once.
//!
//! A *transfer* is a recorded [`Op::Txn`] whose success branch INCRements
//! one or more accounts (amounts summing to zero) and APPENDs one unique,
//! delimited token to a ledger key; it may also read. Accounts start
//! absent (0) and are changed only by transfers. After the run the final
//! values of the accounts and the ledgers (read in one transaction) must
//! show:
//!
//! * every ledger token names a transfer, and appears at most once (a
//!   transfer applied twice appends its token twice: the resent request of
//!   a naive client);
//! * every acknowledged transfer whose success branch ran is in its
//!   ledger, and none that definitely did not run (failed, rejected, or
//!   whose compares failed) is: acknowledged ⊆ applied ⊆ acknowledged ∪
//!   unknown;
//! * each account's balance is exactly the sum of the applied transfers'
//!   amounts for it (a transaction applies whole or not at all);
//! * the balances sum to zero (conservation).
//!
//! Missing final values leave the checker `Undecided`, never a pass.

use super::Findings;
use super::exactly_once::TokenFormat;
use crate::record::{Bytes, Op, OpId, Outcome, Record, Reply, Txn, TxnOp};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One transfer, as the checker reads it from the record.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Transfer {
    op: OpId,
    ledger: Bytes,
    deltas: Vec<(Bytes, i64)>,
    status: Applied,
}

/// What the client was told about a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    /// Its success branch ran.
    Yes,
    /// It definitely did not change anything.
    No,
    /// Unknown.
    Maybe,
}

/// A broken promise of the transfers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferViolation {
    /// A token applied more than once.
    AppliedTwice {
        /// The transfer.
        op: OpId,
        /// Its token.
        token: Bytes,
        /// How many times it is in the ledger.
        times: usize,
    },
    /// An acknowledged transfer missing from its ledger.
    Lost {
        /// The transfer.
        op: OpId,
        /// Its token.
        token: Bytes,
    },
    /// A transfer reported as not applied that is in its ledger.
    AppliedThoughFailed {
        /// The transfer.
        op: OpId,
        /// Its token.
        token: Bytes,
    },
    /// A ledger token no transfer appended.
    UnknownToken {
        /// The ledger.
        ledger: Bytes,
        /// The token.
        token: Bytes,
    },
    /// An account's balance differs from its applied transfers' sum.
    Balance {
        /// The account.
        account: Bytes,
        /// The sum of the applied transfers' amounts.
        expected: i64,
        /// What it holds (`None`: not an integer).
        actual: Option<i64>,
    },
    /// The balances do not sum to zero.
    NotConserved {
        /// Their sum.
        sum: i64,
    },
}

impl fmt::Display for TransferViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AppliedTwice { op, token, times } => {
                write!(f, "transfer {op} ({token}) applied {times} times")
            }
            Self::Lost { op, token } => {
                write!(f, "transfer {op} ({token}) acknowledged but not applied")
            }
            Self::AppliedThoughFailed { op, token } => {
                write!(
                    f,
                    "transfer {op} ({token}) reported not applied, but applied"
                )
            }
            Self::UnknownToken { ledger, token } => {
                write!(
                    f,
                    "ledger {ledger} holds {token}, which no transfer appended"
                )
            }
            Self::Balance {
                account,
                expected,
                actual,
            } => match actual {
                Some(actual) => write!(
                    f,
                    "account {account} holds {actual}, its applied transfers sum to {expected}"
                ),
                None => write!(f, "account {account} does not hold an integer"),
            },
            Self::NotConserved { sum } => write!(f, "the balances sum to {sum}, not 0"),
        }
    }
}

/// What the checker could not decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferUndecided {
    /// A ledger or account has no final value.
    NoFinalValue {
        /// The key.
        key: Bytes,
    },
}

impl fmt::Display for TransferUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoFinalValue { key } => write!(f, "no final value of {key}"),
        }
    }
}

/// The transfers checker's verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransfersVerdict {
    /// Transfers recorded.
    pub transfers: usize,
    /// Of them, acknowledged as applied.
    pub acknowledged: usize,
    /// Of them, with an unknown outcome.
    pub unknown: usize,
    /// Accounts.
    pub accounts: usize,
    /// Violations found.
    pub violations: Vec<TransferViolation>,
    /// What could not be decided.
    pub undecided: Vec<TransferUndecided>,
}

impl Findings for TransfersVerdict {
    const CHECKER: &'static str = "transfers";
    const PASS: &'static str = "conserved, each applied exactly once";
    type Violation = TransferViolation;
    type Undecided = TransferUndecided;

    fn violations(&self) -> &[TransferViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[TransferUndecided] {
        &self.undecided
    }

    fn scope(&self) -> String {
        format!(
            "{} transfer(s) ({} acknowledged, {} unknown) over {} account(s)",
            self.transfers, self.acknowledged, self.unknown, self.accounts
        )
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        (self.transfers == 0).then_some("no transfers recorded")
    }
}

/// A transfer's ledger, token and amounts per account.
type Shape = (Bytes, Bytes, Vec<(Bytes, i64)>);

/// The transfer `txn` describes, with its token, if it is one.
fn transfer_of(txn: &Txn, tokens: TokenFormat) -> Option<Shape> {
    let mut ledger = None;
    let mut deltas = Vec::new();
    for op in &txn.success {
        match op {
            TxnOp::Incr { key, by } => deltas.push((key.clone(), *by)),
            TxnOp::Append { key, value } => {
                if ledger.is_some() {
                    return None;
                }
                let token = value.0.strip_suffix(&[tokens.delimiter])?;
                ledger = Some((key.clone(), Bytes(token.to_vec())));
            }
            op if op.is_read() => {}
            _ => return None,
        }
    }
    let (ledger, token) = ledger?;
    (!deltas.is_empty()).then_some((ledger, token, deltas))
}

fn applied(outcome: &Outcome) -> Applied {
    match outcome {
        Outcome::Ok {
            reply: Reply::Txn { succeeded, .. },
            ..
        } => {
            if *succeeded {
                Applied::Yes
            } else {
                Applied::No
            }
        }
        Outcome::Ok { .. } | Outcome::Failed { .. } => Applied::No,
        Outcome::Unknown { .. } => Applied::Maybe,
    }
}

/// Checks the transfers of `record` against `final_values`.
pub fn check(
    record: &Record,
    final_values: &BTreeMap<Bytes, Option<Bytes>>,
    tokens: TokenFormat,
) -> TransfersVerdict {
    let mut verdict = TransfersVerdict::default();
    let mut transfers: BTreeMap<Bytes, Transfer> = BTreeMap::new();
    let mut ledgers: BTreeSet<Bytes> = BTreeSet::new();
    let mut accounts: BTreeSet<Bytes> = BTreeSet::new();
    for op in &record.ops {
        let Op::Txn(txn) = &op.op else { continue };
        let Some((ledger, token, deltas)) = transfer_of(txn, tokens) else {
            continue;
        };
        let status = applied(&op.outcome);
        verdict.transfers += 1;
        match status {
            Applied::Yes => verdict.acknowledged += 1,
            Applied::Maybe => verdict.unknown += 1,
            Applied::No => {}
        }
        ledgers.insert(ledger.clone());
        accounts.extend(deltas.iter().map(|(key, _)| key.clone()));
        transfers.insert(
            token,
            Transfer {
                op: op.id,
                ledger,
                deltas,
                status,
            },
        );
    }
    verdict.accounts = accounts.len();
    if verdict.transfers == 0 {
        return verdict;
    }

    // How many times each token is in its ledger.
    let mut times: BTreeMap<Bytes, usize> = BTreeMap::new();
    for ledger in &ledgers {
        let Some(value) = final_values.get(ledger) else {
            verdict.undecided.push(TransferUndecided::NoFinalValue {
                key: ledger.clone(),
            });
            continue;
        };
        let value = value.as_ref().map_or(&[][..], |v| &v.0[..]);
        for token in value.split(|b| *b == tokens.delimiter) {
            if token.is_empty() {
                continue;
            }
            let token = Bytes(token.to_vec());
            match transfers.get(&token) {
                Some(transfer) if transfer.ledger == *ledger => {
                    *times.entry(token).or_default() += 1;
                }
                _ => verdict.violations.push(TransferViolation::UnknownToken {
                    ledger: ledger.clone(),
                    token,
                }),
            }
        }
    }
    if !verdict.undecided.is_empty() {
        return verdict;
    }

    let mut expected: BTreeMap<Bytes, i64> = accounts.iter().map(|a| (a.clone(), 0)).collect();
    for (token, transfer) in &transfers {
        let n = times.get(token).copied().unwrap_or(0);
        match (transfer.status, n) {
            (_, n) if n > 1 => verdict.violations.push(TransferViolation::AppliedTwice {
                op: transfer.op,
                token: token.clone(),
                times: n,
            }),
            (Applied::Yes, 0) => verdict.violations.push(TransferViolation::Lost {
                op: transfer.op,
                token: token.clone(),
            }),
            (Applied::No, 1) => verdict
                .violations
                .push(TransferViolation::AppliedThoughFailed {
                    op: transfer.op,
                    token: token.clone(),
                }),
            _ => {}
        }
        for (account, by) in &transfer.deltas {
            let entry = expected.entry(account.clone()).or_default();
            *entry = entry.wrapping_add(by.wrapping_mul(n as i64));
        }
    }

    let mut sum: i64 = 0;
    for (account, expected) in expected {
        let Some(value) = final_values.get(&account) else {
            verdict
                .undecided
                .push(TransferUndecided::NoFinalValue { key: account });
            continue;
        };
        let actual = match value {
            None => Some(0),
            Some(bytes) => std::str::from_utf8(&bytes.0)
                .ok()
                .and_then(|text| text.parse::<i64>().ok()),
        };
        if let Some(actual) = actual {
            sum = sum.wrapping_add(actual);
        }
        if actual != Some(expected) {
            verdict.violations.push(TransferViolation::Balance {
                account,
                expected,
                actual,
            });
        }
    }
    if verdict.undecided.is_empty() && sum != 0 {
        verdict
            .violations
            .push(TransferViolation::NotConserved { sum });
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};
    use crate::record::{OpRecord, RequestIdentity, TxnOpResult};

    fn transfer(id: OpId, token: &str, from: &str, to: &str, n: i64, outcome: Outcome) -> OpRecord {
        let txn = Txn {
            compares: Vec::new(),
            success: vec![
                TxnOp::Incr {
                    key: Bytes::from(from),
                    by: -n,
                },
                TxnOp::Incr {
                    key: Bytes::from(to),
                    by: n,
                },
                TxnOp::Append {
                    key: Bytes::from("ledger"),
                    value: Bytes::from(format!("{token};").as_str()),
                },
            ],
            failure: Vec::new(),
        };
        OpRecord {
            id,
            client: 1,
            op: Op::Txn(txn),
            request: RequestIdentity::plain(),
            invoke_ns: id * 10,
            complete_ns: Some(id * 10 + 5),
            attempts: 1,
            outcome,
        }
    }

    fn ok() -> Outcome {
        Outcome::Ok {
            reply: Reply::Txn {
                succeeded: true,
                results: vec![
                    TxnOpResult::Incr { value: 0 },
                    TxnOpResult::Incr { value: 0 },
                    TxnOpResult::Append { length: 0 },
                ],
            },
            canonical: None,
        }
    }

    fn unknown() -> Outcome {
        Outcome::Unknown { detail: None }
    }

    fn finals(a: i64, b: i64, ledger: &str) -> BTreeMap<Bytes, Option<Bytes>> {
        BTreeMap::from([
            (Bytes::from("a"), Some(Bytes::from(a.to_string().as_str()))),
            (Bytes::from("b"), Some(Bytes::from(b.to_string().as_str()))),
            (Bytes::from("ledger"), Some(Bytes::from(ledger))),
        ])
    }

    fn record(ops: Vec<OpRecord>) -> Record {
        Record {
            ops,
            ..Record::default()
        }
    }

    #[test]
    fn applied_once_and_unknown_either_way_passes() {
        let r = record(vec![
            transfer(1, "t1", "a", "b", 5, ok()),
            transfer(2, "t2", "b", "a", 2, unknown()),
            transfer(3, "t3", "a", "b", 7, unknown()),
        ]);
        let verdict = check(&r, &finals(-3, 3, "t1;t2;"), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn a_transfer_applied_twice_fails() {
        let r = record(vec![transfer(1, "t1", "a", "b", 5, ok())]);
        let verdict = check(&r, &finals(-10, 10, "t1;t1;"), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Fail);
        assert!(matches!(
            verdict.violations[0],
            TransferViolation::AppliedTwice { times: 2, .. }
        ));
    }

    #[test]
    fn lost_partial_and_unconserved_fail() {
        let r = record(vec![
            transfer(1, "t1", "a", "b", 5, ok()),
            transfer(2, "t2", "a", "b", 1, ok()),
        ]);
        let verdict = check(&r, &finals(-5, 6, "t1;"), TokenFormat::default());
        let text = verdict.to_string();
        assert!(text.contains("acknowledged but not applied"), "{text}");
        assert!(text.contains("account b holds 6"), "{text}");
        assert!(text.contains("sum to 1"), "{text}");
    }

    #[test]
    fn a_failed_transfer_that_applied_fails_and_garbage_is_no_panic() {
        let failed = Outcome::Failed {
            reason: crate::record::FailReason::SessionExpired,
            detail: None,
        };
        let r = record(vec![transfer(1, "t1", "a", "b", 5, failed)]);
        let mut values = finals(-5, 5, "t1;zz;");
        values.insert(Bytes::from("a"), Some(Bytes(vec![0xff])));
        let verdict = check(&r, &values, TokenFormat::default());
        let text = verdict.to_string();
        assert!(text.contains("reported not applied"), "{text}");
        assert!(text.contains("no transfer appended"), "{text}");
        assert!(text.contains("not hold an integer"), "{text}");
    }

    #[test]
    fn missing_final_values_are_undecided() {
        let r = record(vec![transfer(1, "t1", "a", "b", 5, ok())]);
        let verdict = check(&r, &BTreeMap::new(), TokenFormat::default());
        assert_eq!(verdict.status(), Status::Undecided);
    }
}
