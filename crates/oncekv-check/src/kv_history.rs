//! The KV history model: what clients asked of the whole key-value store
//! (get, put, delete, append, incr, cas, prefix reads and deletes, and
//! multi-key transactions), what they were told, and when.
//!
//! A [`KvHistory`] is a [`History`] of [`KvOperation`]s. Each names its
//! client, its [`KvCall`] (one [`TxnOp`] on its own, or a [`Txn`]), its
//! [`KvOutput`] when the outcome is known, and its real-time interval. An
//! operation with no output may have taken effect at any time after its
//! invocation, or never. This module owns the call and output types and
//! what makes an output answer a call; what the operations do is
//! [`crate::kv_model`]'s, and how a history of them is partitioned for
//! the search [`crate::kv_linearizability`]'s.
//!
//! The operations reuse the record's shapes ([`TxnOp`], [`TxnOpResult`],
//! [`Txn`]): a single operation is exactly a transaction operation run on
//! its own.

use crate::history::{History, HistoryCall, HistoryError, Operation};
use crate::record::{Bytes, KeyRange, Txn, TxnOp, TxnOpResult};
use std::collections::BTreeSet;
use std::fmt;

/// What a client asked of the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvCall {
    /// One operation on its own.
    Op(TxnOp),
    /// An atomic transaction.
    Txn(Txn),
}

/// Where an operation reads or writes: one key, every key under a
/// prefix, or every key in a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch<'a> {
    /// One key.
    Key(&'a [u8]),
    /// Every key under a prefix.
    Prefix(&'a [u8]),
    /// Every key from the first up to the second (excluded), or on.
    Range(&'a Bytes, Option<&'a Bytes>),
}

impl Touch<'_> {
    /// Whether `key` is touched.
    pub fn covers(self, key: &[u8]) -> bool {
        match self {
            Self::Key(k) => k == key,
            Self::Prefix(p) => key.starts_with(p),
            Self::Range(start, end) => crate::record::in_span(start, end, key),
        }
    }
}

/// Where `op` reads or writes, added to `touches` (a nested transaction's
/// compares and operations, in either branch).
fn op_touches<'a>(op: &'a TxnOp, touches: &mut Vec<Touch<'a>>) {
    match op {
        TxnOp::Txn { txn } => txn_touches(txn, touches),
        op => touches.push(op_touch(op)),
    }
}

/// Where `txn`'s compares and operations, in either branch, read or write.
fn txn_touches<'a>(txn: &'a Txn, touches: &mut Vec<Touch<'a>>) {
    touches.extend(txn.compares.iter().map(|compare| match &compare.range {
        KeyRange::Key(key) => Touch::Key(key.as_slice()),
        KeyRange::Prefix(prefix) => Touch::Prefix(prefix.as_slice()),
        KeyRange::Range { start, end } => Touch::Range(start, end.as_ref()),
    }));
    for op in txn.success.iter().chain(&txn.failure) {
        op_touches(op, touches);
    }
}

/// Where one operation other than a nested transaction reads or writes
/// (a nested one's is [`op_touches`]'s: it has no single place).
fn op_touch(op: &TxnOp) -> Touch<'_> {
    match op {
        TxnOp::Put { key, .. }
        | TxnOp::Delete { key }
        | TxnOp::Get { key }
        | TxnOp::Append { key, .. }
        | TxnOp::Incr { key, .. }
        | TxnOp::Cas { key, .. }
        | TxnOp::PutExisting { key, .. } => Touch::Key(key.as_slice()),
        TxnOp::DeletePrefix { prefix } | TxnOp::GetPrefix { prefix } => {
            Touch::Prefix(prefix.as_slice())
        }
        TxnOp::DeleteRange { start, end } | TxnOp::GetRange { start, end } => {
            Touch::Range(start, end.as_ref())
        }
        // Never asked: `op_touches` walks a nested transaction. Everything,
        // to be safe.
        TxnOp::Txn { .. } => Touch::Prefix(&[]),
    }
}

impl KvCall {
    /// Every key or prefix the call reads or writes, in either branch.
    pub fn touches(&self) -> Vec<Touch<'_>> {
        match self {
            Self::Op(op) => {
                let mut touches = Vec::new();
                op_touches(op, &mut touches);
                touches
            }
            Self::Txn(txn) => {
                let mut touches = Vec::new();
                txn_touches(txn, &mut touches);
                touches
            }
        }
    }

    /// The keys of `universe` the call touches.
    pub fn keys_in<'u>(&self, universe: &'u BTreeSet<Vec<u8>>) -> BTreeSet<&'u [u8]> {
        let mut keys = BTreeSet::new();
        for touch in self.touches() {
            match touch {
                Touch::Key(key) => {
                    if let Some(found) = universe.get(key) {
                        keys.insert(found.as_slice());
                    }
                }
                Touch::Prefix(prefix) => keys.extend(
                    universe
                        .range(prefix.to_vec()..)
                        .take_while(|key| key.starts_with(prefix))
                        .map(Vec::as_slice),
                ),
                Touch::Range(start, _) => keys.extend(
                    universe
                        .range(start.0.clone()..)
                        .take_while(|key| touch.covers(key))
                        .map(Vec::as_slice),
                ),
            }
        }
        keys
    }

    /// Whether it can change the store (anything but reads).
    pub fn may_write(&self) -> bool {
        match self {
            Self::Op(op) => !op.is_read(),
            Self::Txn(txn) => txn
                .success
                .iter()
                .chain(&txn.failure)
                .any(|op| !op.is_read()),
        }
    }

    /// Whether it is a plain append (on its own, not in a transaction).
    pub fn is_append(&self) -> bool {
        matches!(self, Self::Op(TxnOp::Append { .. }))
    }
}

/// What a client was told when its operation completed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvOutput {
    /// It took effect within its interval, with a result that was not
    /// recorded (any result is accepted, a deterministic refusal included).
    Acknowledged,
    /// A single operation's result.
    Op(TxnOpResult),
    /// A transaction's branch and one result per operation of it.
    Txn {
        /// Whether every compare held.
        succeeded: bool,
        /// The branch's results, in order.
        results: Vec<TxnOpResult>,
    },
}

/// One client operation on the store.
pub type KvOperation = Operation<KvCall, KvOutput>;

fn fmt_result(f: &mut fmt::Formatter<'_>, result: &TxnOpResult) -> fmt::Result {
    let opt = |value: &Option<Bytes>| {
        value
            .as_ref()
            .map_or_else(|| "nil".to_owned(), |v| format!("{v:?}"))
    };
    match result {
        TxnOpResult::Put { previous } => write!(f, "ok (previous {})", opt(previous)),
        TxnOpResult::Delete { previous } => write!(f, "deleted (previous {})", opt(previous)),
        TxnOpResult::DeletePrefix { deleted } => write!(f, "{deleted} deleted"),
        TxnOpResult::Get { value } => f.write_str(&opt(value)),
        TxnOpResult::GetPrefix { entries } => {
            f.write_str("{")?;
            for (i, entry) in entries.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(f, "{sep}{:?}: {:?}", entry.key, entry.value)?;
            }
            f.write_str("}")
        }
        TxnOpResult::Append { length } => write!(f, "length {length}"),
        TxnOpResult::Incr { value } => write!(f, "{value}"),
        TxnOpResult::Cas { swapped, current } => {
            let verb = if *swapped { "swapped" } else { "not swapped" };
            write!(f, "{verb} (now {})", opt(current))
        }
        TxnOpResult::Txn { succeeded, results } => fmt_branch(f, *succeeded, results),
    }
}

/// A transaction's branch and its results.
fn fmt_branch(f: &mut fmt::Formatter<'_>, succeeded: bool, results: &[TxnOpResult]) -> fmt::Result {
    f.write_str(if succeeded { "succeeded" } else { "failed" })?;
    for result in results {
        f.write_str(" [")?;
        fmt_result(f, result)?;
        f.write_str("]")?;
    }
    Ok(())
}

/// The operation or transaction, as the record shows it.
impl fmt::Display for KvCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Op(op) => write!(f, "{op}"),
            Self::Txn(txn) => write!(f, "{}", crate::record::Op::Txn(txn.clone())),
        }
    }
}

/// `ok`, the result, or the branch and its results.
impl fmt::Display for KvOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acknowledged => f.write_str("ok"),
            Self::Op(result) => fmt_result(f, result),
            Self::Txn { succeeded, results } => fmt_branch(f, *succeeded, results),
        }
    }
}

impl HistoryCall for KvCall {
    type Output = KvOutput;

    /// No transaction is nested in another (the model does not replay
    /// them), and the output answers the call: a transaction's results
    /// match its branch one for one.
    fn check_output(&self, output: Option<&KvOutput>, index: usize) -> Result<(), HistoryError> {
        let nested = match self {
            KvCall::Op(op) => op.is_nested_txn(),
            KvCall::Txn(txn) => txn
                .success
                .iter()
                .chain(&txn.failure)
                .any(TxnOp::is_nested_txn),
        };
        if nested {
            return Err(HistoryError::NestedTxn { index });
        }
        match (self, output) {
            (_, None | Some(KvOutput::Acknowledged)) => Ok(()),
            (KvCall::Op(call), Some(KvOutput::Op(result))) if call.accepts(result) => Ok(()),
            (KvCall::Txn(txn), Some(KvOutput::Txn { succeeded, results })) => {
                let branch = txn.branch(*succeeded);
                if branch.len() != results.len() {
                    return Err(HistoryError::ResultCount {
                        index,
                        expected: branch.len(),
                        got: results.len(),
                    });
                }
                match branch
                    .iter()
                    .zip(results)
                    .position(|(op, result)| !op.accepts(result))
                {
                    Some(position) => Err(HistoryError::ResultMismatch { index, position }),
                    None => Ok(()),
                }
            }
            _ => Err(HistoryError::OutputMismatch { index }),
        }
    }
}

/// A validated list of KV operations, in no particular order.
pub type KvHistory = History<KvCall>;

impl KvHistory {
    /// Every key named by some operation (prefixes name none).
    pub fn keys(&self) -> BTreeSet<Vec<u8>> {
        self.operations()
            .iter()
            .flat_map(|op| op.call.touches())
            .filter_map(|touch| match touch {
                Touch::Key(key) => Some(key.to_vec()),
                Touch::Prefix(_) | Touch::Range(..) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Compare, CompareOp, CompareTarget};

    fn op(call: KvCall, output: Option<KvOutput>) -> KvOperation {
        KvOperation {
            client: 1,
            call,
            output,
            invoke_ns: 0,
            complete_ns: Some(1),
        }
    }

    fn txn() -> Txn {
        Txn {
            compares: vec![Compare {
                range: KeyRange::Prefix("a/".into()),
                op: CompareOp::Equal,
                target: CompareTarget::Exists(true),
            }],
            success: vec![TxnOp::Get { key: "b".into() }],
            failure: vec![],
        }
    }

    #[test]
    fn a_nested_transaction_is_refused_rather_than_checked_wrongly() {
        let nested = Txn {
            success: vec![TxnOp::Txn {
                txn: Box::new(txn()),
            }],
            ..Txn::default()
        };
        let call = KvCall::Txn(nested.clone());
        assert_eq!(
            KvHistory::new(vec![op(call.clone(), None)]),
            Err(HistoryError::NestedTxn { index: 0 })
        );
        // Where it reads or writes: the nested compares and operations.
        let touches = call.touches();
        assert!(touches.contains(&Touch::Prefix(b"a/")), "{touches:?}");
        assert!(touches.contains(&Touch::Key(b"b")), "{touches:?}");
        // Its result answers it only as a nested transaction's.
        let inner = TxnOpResult::Txn {
            succeeded: true,
            results: vec![TxnOpResult::Get { value: None }],
        };
        assert!(nested.success[0].accepts(&inner));
        assert!(!nested.success[0].accepts(&TxnOpResult::Get { value: None }));
        assert!(nested.success[0].is_read());
    }

    #[test]
    fn results_must_answer_the_branch() {
        let ok = op(
            KvCall::Txn(txn()),
            Some(KvOutput::Txn {
                succeeded: true,
                results: vec![TxnOpResult::Get { value: None }],
            }),
        );
        assert!(KvHistory::new(vec![ok]).is_ok());
        let short = op(
            KvCall::Txn(txn()),
            Some(KvOutput::Txn {
                succeeded: true,
                results: vec![],
            }),
        );
        assert_eq!(
            KvHistory::new(vec![short]),
            Err(HistoryError::ResultCount {
                index: 0,
                expected: 1,
                got: 0
            })
        );
        let wrong = op(
            KvCall::Txn(txn()),
            Some(KvOutput::Txn {
                succeeded: true,
                results: vec![TxnOpResult::Incr { value: 1 }],
            }),
        );
        assert_eq!(
            KvHistory::new(vec![wrong]),
            Err(HistoryError::ResultMismatch {
                index: 0,
                position: 0
            })
        );
        let mismatch = op(
            KvCall::Op(TxnOp::Get { key: "k".into() }),
            Some(KvOutput::Op(TxnOpResult::Append { length: 1 })),
        );
        assert_eq!(
            KvHistory::new(vec![mismatch]),
            Err(HistoryError::OutputMismatch { index: 0 })
        );
    }

    #[test]
    fn prefixes_cover_the_keys_under_them() {
        let history = KvHistory::new(vec![
            op(KvCall::Op(TxnOp::Get { key: "a/1".into() }), None),
            op(KvCall::Op(TxnOp::Get { key: "a/2".into() }), None),
            op(KvCall::Op(TxnOp::Get { key: "b".into() }), None),
            op(KvCall::Txn(txn()), None),
        ])
        .expect("valid");
        let universe = history.keys();
        let touched = KvCall::Txn(txn()).keys_in(&universe);
        let touched: Vec<&[u8]> = touched.into_iter().collect();
        assert_eq!(touched, vec![&b"a/1"[..], b"a/2", b"b"]);
        assert!(!KvCall::Txn(txn()).may_write());
    }
}
