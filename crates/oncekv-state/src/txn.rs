//! [`Txn`]: a multi-key transaction (as etcd's): compares on keys,
//! prefixes or ranges, then the `success` operations if every compare holds, else the
//! `failure` ones, all at one revision. A branch may hold transactions of
//! its own ([`TxnOp::Txn`], etcd's nested transactions): every compare on
//! the path taken through them is evaluated against the state before the
//! outermost transaction's first operation runs, then the operations run
//! in order. This module owns its types, the checks that need no state
//! (sizes, nesting, and that no key is written twice) and the evaluation
//! of a compare; the state machine runs the operations and undoes them all
//! if one is refused, so a transaction applies whole or not at all, and
//! its whole reply is one completion record.

use crate::key_range::{KeyRange, KeyScope};
use crate::refusal::Rejection;
use crate::value::StoredValue;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// The most levels a transaction and the transactions nested in it may
/// have (a transaction without nested ones has one). etcd has no such
/// bound beyond its operation budget, which shrinks at each level.
pub const TXN_DEPTH_MAX: usize = 8;

/// How many times the most compares or operations a branch may hold
/// (`Limits::txn_ops_max`) a transaction may hold in all, counting every
/// compare and operation of every transaction nested in it, so a nested
/// transaction costs no more to check and run than a flat one may.
pub const TXN_TREE_OPS_FACTOR: usize = 3;

/// A transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    /// Conditions, all of which must hold for `success` to run.
    pub compare: Vec<Compare>,
    /// Run when every compare holds.
    pub success: Vec<TxnOp>,
    /// Run otherwise.
    pub failure: Vec<TxnOp>,
}

/// One condition on a key, or on every key under a prefix or in a range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// The key, the prefix, or the range's start, as `scope` says.
    pub key: Vec<u8>,
    /// Which keys: `key` alone, or every key under it as a prefix or in
    /// the range from it. Over more than one key, the compare holds when it
    /// holds for every key there (and, with no key there, as for one absent
    /// key); `Exists` asks whether any key is there. (Encoded as the `bool`
    /// `prefix` once was, for the first two scopes.)
    pub scope: KeyScope,
    /// What is compared.
    pub target: CompareTarget,
    /// How.
    pub op: CompareOp,
}

/// What a compare looks at. An absent key has version and revisions 0, and
/// no value (a value compare on it is false, as in etcd).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The value, bytewise.
    Value(Vec<u8>),
    /// The version.
    Version(u64),
    /// The create revision.
    CreateRevision(u64),
    /// The mod revision.
    ModRevision(u64),
    /// Whether the key exists (`false` < `true`).
    Exists(bool),
    /// The name of the lease the key is attached to, bytewise (`None`, no
    /// lease, is below every name; an absent key has none).
    Lease(Option<String>),
}

/// A comparison operator: the key's side is on the left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `<`
    Less,
    /// `>`
    Greater,
}

impl CompareOp {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            CompareOp::Equal => ordering == Ordering::Equal,
            CompareOp::NotEqual => ordering != Ordering::Equal,
            CompareOp::Less => ordering == Ordering::Less,
            CompareOp::Greater => ordering == Ordering::Greater,
        }
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Set a key (optionally attached to a lease).
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease to attach it to.
        lease: Option<String>,
    },
    /// Remove a key.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Remove every key under a prefix.
    DeletePrefix {
        /// The prefix.
        prefix: Vec<u8>,
    },
    /// Read a key (seeing the transaction's earlier writes).
    Get {
        /// The key.
        key: Vec<u8>,
    },
    /// Read keys under a prefix.
    Scan {
        /// The prefix.
        prefix: Vec<u8>,
        /// Most entries (0: the configured maximum).
        limit: u32,
    },
    /// Append to a key's value.
    Append {
        /// The key.
        key: Vec<u8>,
        /// The suffix.
        value: Vec<u8>,
    },
    /// Add to a decimal counter.
    Incr {
        /// The key.
        key: Vec<u8>,
        /// The increment.
        by: i64,
    },
    /// Compare-and-set one key.
    Cas {
        /// The key.
        key: Vec<u8>,
        /// The expected value (`None`: absent).
        expected: Option<Vec<u8>>,
        /// The new value.
        new: Vec<u8>,
    },
    /// Read the keys in a range (seeing the transaction's earlier writes),
    /// with how many there are.
    Range {
        /// The keys.
        range: KeyRange,
        /// Most entries (0: the configured maximum).
        limit: u32,
    },
    /// Remove every key in a range.
    DeleteRange {
        /// The keys.
        range: KeyRange,
    },
    /// Set a key that exists, keeping its value or its lease as asked
    /// (etcd's `ignore_value` and `ignore_lease`); refused as
    /// [`Rejection::KeyNotFound`] when the key is absent. Answers as a put.
    PutExisting {
        /// The key.
        key: Vec<u8>,
        /// Its new value, or the one it has.
        value: Update<Vec<u8>>,
        /// The lease to attach it to (`None`: no lease), or the one it has.
        lease: Update<Option<String>>,
    },
    /// A transaction inside this one (etcd's nested `RequestTxn`): its
    /// compares are evaluated with the enclosing transaction's, against
    /// the state before any operation of the outermost transaction runs;
    /// then its branch's operations run here, in order, at the same
    /// revision. Answers [`crate::Reply::Txn`].
    Txn(Txn),
    /// Read the keys in a range as they were at a past revision (etcd's
    /// Range with a `revision` inside a transaction), from the history.
    /// The latest revision it may name is the one before the
    /// transaction's entry (the entry's own is the transaction's, in the
    /// future for a read inside it, as on etcd), so the transaction's
    /// writes are never seen; a compacted or future revision refuses the
    /// transaction. (Variants are only ever added last, so the encoding of
    /// every earlier one is unchanged.)
    RangeAt {
        /// The keys.
        range: KeyRange,
        /// Most entries (0: the configured maximum).
        limit: u32,
        /// The revision read at.
        revision: u64,
    },
}

/// What a [`TxnOp::PutExisting`] does with one part of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Update<T> {
    /// Keep what the key has.
    Keep,
    /// Set this.
    Set(T),
}

impl<T> Update<T> {
    /// What it sets, or `current`.
    pub fn or_current(self, current: T) -> T {
        match self {
            Update::Keep => current,
            Update::Set(value) => value,
        }
    }
}

impl TxnOp {
    /// What it writes itself; `None` for a read and for a nested
    /// transaction (whose branches' writes are its operations').
    fn written(&self) -> Option<Written<'_>> {
        match self {
            TxnOp::Put { key, .. }
            | TxnOp::Delete { key }
            | TxnOp::Append { key, .. }
            | TxnOp::Incr { key, .. }
            | TxnOp::Cas { key, .. }
            | TxnOp::PutExisting { key, .. } => Some(Written::Key(key)),
            TxnOp::DeletePrefix { prefix } => Some(Written::Prefix(prefix)),
            TxnOp::DeleteRange { range } => Some(Written::Range(range)),
            TxnOp::Get { .. }
            | TxnOp::Scan { .. }
            | TxnOp::Range { .. }
            | TxnOp::RangeAt { .. }
            | TxnOp::Txn(_) => None,
        }
    }

    /// Bytes of keys and values it carries.
    pub fn payload_bytes(&self) -> u64 {
        let bytes = match self {
            TxnOp::Put { key, value, lease } => {
                key.len() + value.len() + lease.as_ref().map_or(0, String::len)
            }
            TxnOp::Append { key, value } => key.len() + value.len(),
            TxnOp::Cas { key, expected, new } => {
                key.len() + expected.as_ref().map_or(0, Vec::len) + new.len()
            }
            TxnOp::Delete { key } | TxnOp::Get { key } | TxnOp::Incr { key, .. } => key.len(),
            TxnOp::DeletePrefix { prefix } | TxnOp::Scan { prefix, .. } => prefix.len(),
            TxnOp::Range { range, .. }
            | TxnOp::RangeAt { range, .. }
            | TxnOp::DeleteRange { range } => range.payload_bytes(),
            TxnOp::PutExisting { key, value, lease } => {
                let value = match value {
                    Update::Set(value) => value.len(),
                    Update::Keep => 0,
                };
                let lease = match lease {
                    Update::Set(Some(name)) => name.len(),
                    Update::Set(None) | Update::Keep => 0,
                };
                key.len() + value + lease
            }
            TxnOp::Txn(txn) => return txn.payload_bytes(),
        };
        bytes as u64
    }

    /// A short lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            TxnOp::Put { .. } => "put",
            TxnOp::Delete { .. } => "delete",
            TxnOp::DeletePrefix { .. } => "delete_prefix",
            TxnOp::Get { .. } => "get",
            TxnOp::Scan { .. } => "scan",
            TxnOp::Append { .. } => "append",
            TxnOp::Incr { .. } => "incr",
            TxnOp::Cas { .. } => "cas",
            TxnOp::Range { .. } => "range",
            TxnOp::DeleteRange { .. } => "delete_range",
            TxnOp::PutExisting { .. } => "put_existing",
            TxnOp::Txn(_) => "txn",
            TxnOp::RangeAt { .. } => "range_at",
        }
    }
}

/// What one operation writes.
#[derive(Clone, Copy)]
enum Written<'a> {
    /// One key.
    Key(&'a [u8]),
    /// Every key under a prefix.
    Prefix(&'a [u8]),
    /// Every key in a range.
    Range(&'a KeyRange),
}

impl Txn {
    /// Whether it only reads: every operation of both branches, and of the
    /// transactions nested in them, is a get, a scan or a range. Such a
    /// transaction changes nothing whichever branch it takes.
    pub fn only_reads(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| match op {
            TxnOp::Txn(nested) => nested.only_reads(),
            op => op.written().is_none(),
        })
    }

    /// Bytes of keys and values it carries.
    pub fn payload_bytes(&self) -> u64 {
        let compares: u64 = self
            .compare
            .iter()
            .map(|c| {
                let target = match &c.target {
                    CompareTarget::Value(value) => value.len() as u64,
                    CompareTarget::Lease(Some(name)) => name.len() as u64,
                    _ => 8,
                };
                (c.key.len() + c.scope.payload_bytes()) as u64 + target
            })
            .sum();
        let ops: u64 = self
            .success
            .iter()
            .chain(&self.failure)
            .map(TxnOp::payload_bytes)
            .sum();
        compares.saturating_add(ops)
    }

    /// The checks that need no state: its nesting and its counts, and no
    /// key written twice in a branch (nor under a prefix it deletes).
    ///
    /// Counts are etcd's (`checkTxnRequest`): at most `ops_max` compares
    /// and at most `ops_max` operations per branch, and a transaction
    /// nested in a branch gets what is left of that budget after the most
    /// its enclosing transaction holds in one of them. Beyond etcd, at most
    /// [`TXN_DEPTH_MAX`] levels, and at most [`TXN_TREE_OPS_FACTOR`] times
    /// `ops_max` compares and operations in all (a transaction without
    /// nested ones always passes those two). A branch's writes include its
    /// nested transactions' (both their branches: either may run), but the
    /// two branches of one transaction never conflict with each other.
    /// Sizes of keys and values are checked by the caller, op by op.
    pub fn check_shape(&self, ops_max: usize) -> Result<(), Rejection> {
        let (depth, ops) = self.tree_size();
        let ops_tree_max = ops_max.saturating_mul(TXN_TREE_OPS_FACTOR);
        if depth > TXN_DEPTH_MAX || ops > ops_tree_max {
            return Err(Rejection::TxnTreeTooLarge {
                depth: depth as u64,
                ops: ops as u64,
                depth_max: TXN_DEPTH_MAX as u64,
                ops_max: ops_tree_max as u64,
            });
        }
        self.check_counts(ops_max)?;
        check_branch(&self.success)?;
        check_branch(&self.failure)?;
        Ok(())
    }

    /// etcd's counts, with `budget` for this level.
    fn check_counts(&self, budget: usize) -> Result<(), Rejection> {
        let counts = [self.compare.len(), self.success.len(), self.failure.len()];
        if let Some(&count) = counts.iter().find(|&&count| count > budget) {
            return Err(Rejection::TxnTooLarge {
                ops: count as u64,
                max: budget as u64,
            });
        }
        let left = budget - counts.into_iter().max().unwrap_or(0);
        self.nested()
            .try_for_each(|nested| nested.check_counts(left))
    }

    /// The transactions nested directly in either branch, in order.
    pub fn nested(&self) -> impl Iterator<Item = &Txn> {
        self.success
            .iter()
            .chain(&self.failure)
            .filter_map(|op| match op {
                TxnOp::Txn(nested) => Some(nested),
                _ => None,
            })
    }

    /// How many levels it has (1 without nested transactions), and how
    /// many compares and operations all of them hold.
    pub fn tree_size(&self) -> (usize, usize) {
        let own = self.compare.len() + self.success.len() + self.failure.len();
        self.nested().fold((1, own), |(depth, ops), nested| {
            let (nested_depth, nested_ops) = nested.tree_size();
            (depth.max(nested_depth + 1), ops.saturating_add(nested_ops))
        })
    }
}

/// What a branch has written so far, to find a second write of a key.
#[derive(Default)]
struct Writes<'a> {
    keys: BTreeSet<&'a [u8]>,
    prefixes: Vec<&'a [u8]>,
    ranges: Vec<&'a KeyRange>,
}

impl<'a> Writes<'a> {
    /// Whether `written` writes a key written already (or a deleted prefix
    /// or range overlaps one deleted already).
    fn conflicts(&self, written: &Written<'a>) -> bool {
        match *written {
            Written::Key(key) => {
                self.prefixes.iter().any(|p| key.starts_with(p))
                    || self.ranges.iter().any(|r| r.contains(key))
                    || self.keys.contains(key)
            }
            Written::Prefix(prefix) => {
                let as_range = KeyRange::prefix(prefix);
                self.prefixes
                    .iter()
                    .any(|p| p.starts_with(prefix) || prefix.starts_with(p))
                    || self.keys.iter().any(|k| k.starts_with(prefix))
                    || self.ranges.iter().any(|r| r.overlaps(&as_range))
            }
            Written::Range(range) => {
                self.prefixes
                    .iter()
                    .any(|p| KeyRange::prefix(*p).overlaps(range))
                    || self.keys.iter().any(|k| range.contains(k))
                    || self.ranges.iter().any(|r| r.overlaps(range))
            }
        }
    }

    fn add(&mut self, written: Written<'a>) {
        match written {
            Written::Key(key) => {
                self.keys.insert(key);
            }
            Written::Prefix(prefix) => self.prefixes.push(prefix),
            Written::Range(range) => self.ranges.push(range),
        }
    }
}

impl Written<'_> {
    /// The key a conflict is reported under.
    fn key(&self) -> &[u8] {
        match self {
            Written::Key(key) | Written::Prefix(key) => key,
            Written::Range(range) => range.start.as_slice(),
        }
    }
}

/// No key is written twice, nor written under a prefix or in a range the
/// branch deletes, and no two deleted prefixes or ranges overlap; a nested
/// transaction's writes (either branch's) count as the branch's. Returns
/// what the branch may write.
fn check_branch(ops: &[TxnOp]) -> Result<Vec<Written<'_>>, Rejection> {
    let conflict = |written: &Written<'_>| Rejection::TxnConflict {
        key: String::from_utf8_lossy(written.key()).into_owned(),
    };
    let mut writes = Writes::default();
    let mut all = Vec::new();
    for op in ops {
        let found = match op {
            TxnOp::Txn(nested) => {
                // Either branch may run, never both: each is checked on
                // its own, and against what this branch wrote before.
                let mut found = check_branch(&nested.success)?;
                found.extend(check_branch(&nested.failure)?);
                found
            }
            op => op.written().into_iter().collect(),
        };
        if let Some(written) = found.iter().find(|written| writes.conflicts(written)) {
            return Err(conflict(written));
        }
        for written in &found {
            writes.add(*written);
        }
        all.extend(found);
    }
    Ok(all)
}

/// Whether `compare` holds for one key's state (`None`: absent).
pub(crate) fn holds_for(compare: &Compare, stored: Option<&StoredValue>) -> bool {
    let meta = stored.map(|s| s.meta).unwrap_or_default();
    let ordering = match &compare.target {
        CompareTarget::Value(expected) => match stored {
            Some(stored) => stored.value.as_slice().cmp(expected.as_slice()),
            None => return false,
        },
        CompareTarget::Version(n) => meta.version.cmp(n),
        CompareTarget::CreateRevision(n) => meta.create_revision.cmp(n),
        CompareTarget::ModRevision(n) => meta.mod_revision.cmp(n),
        CompareTarget::Exists(exists) => stored.is_some().cmp(exists),
        CompareTarget::Lease(name) => stored
            .and_then(|stored| stored.lease.as_deref())
            .cmp(&name.as_deref()),
    };
    compare.op.holds(ordering)
}

/// Whether `compare` holds for the keys its scope addresses, when more
/// than one (given in order).
pub(crate) fn holds_for_each<'a>(
    compare: &Compare,
    mut under: impl Iterator<Item = &'a StoredValue>,
) -> bool {
    let Some(first) = under.next() else {
        return holds_for(compare, None);
    };
    if let CompareTarget::Exists(exists) = &compare.target {
        return compare.op.holds(true.cmp(exists));
    }
    holds_for(compare, Some(first)) && under.all(|stored| holds_for(compare, Some(stored)))
}

impl Txn {
    /// An empty transaction (no compares: its `success` branch runs).
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Adds a compare.
    pub fn compare(mut self, compare: Compare) -> Txn {
        self.compare.push(compare);
        self
    }

    /// Adds an operation to the branch run when every compare holds.
    pub fn on_success(mut self, op: TxnOp) -> Txn {
        self.success.push(op);
        self
    }

    /// Adds an operation to the branch run when a compare fails.
    pub fn on_failure(mut self, op: TxnOp) -> Txn {
        self.failure.push(op);
        self
    }
}

impl Compare {
    fn on_key(key: impl Into<Vec<u8>>, target: CompareTarget, op: CompareOp) -> Compare {
        Compare {
            key: key.into(),
            scope: KeyScope::Key,
            target,
            op,
        }
    }

    /// `key`'s value compared with `value`.
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Compare {
        Compare::on_key(key, CompareTarget::Value(value.into()), op)
    }

    /// `key`'s version compared with `version` (0: absent).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: u64) -> Compare {
        Compare::on_key(key, CompareTarget::Version(version), op)
    }

    /// `key`'s create revision compared with `revision`.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: u64) -> Compare {
        Compare::on_key(key, CompareTarget::CreateRevision(revision), op)
    }

    /// `key`'s mod revision compared with `revision`.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: u64) -> Compare {
        Compare::on_key(key, CompareTarget::ModRevision(revision), op)
    }

    /// `key` exists.
    pub fn exists(key: impl Into<Vec<u8>>) -> Compare {
        Compare::on_key(key, CompareTarget::Exists(true), CompareOp::Equal)
    }

    /// `key` is absent.
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare::on_key(key, CompareTarget::Exists(false), CompareOp::Equal)
    }

    /// This compare over every key under `key` as a prefix.
    pub fn over_prefix(mut self) -> Compare {
        self.scope = KeyScope::Prefix;
        self
    }

    /// This compare over every key from `key` up to `end` (excluded), or
    /// from `key` on when `end` is `None`.
    pub fn over_range(mut self, end: Option<Vec<u8>>) -> Compare {
        self.scope = KeyScope::Range { end };
        self
    }
}

impl TxnOp {
    /// Sets `key` to `value`.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }

    /// Removes `key`.
    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Delete { key: key.into() }
    }

    /// Reads `key`.
    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Get { key: key.into() }
    }

    /// Adds `by` to the counter at `key`.
    pub fn incr(key: impl Into<Vec<u8>>, by: i64) -> TxnOp {
        TxnOp::Incr {
            key: key.into(),
            by,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Entry, Proposal, Request};
    use crate::ids::{ClusterTime, LogIndex};
    use crate::outcome::Reply;

    fn bytes_of(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
            .collect()
    }

    /// A transaction with every operation there was before nested
    /// transactions were added.
    fn every_earlier_op() -> Txn {
        Txn {
            compare: vec![
                Compare::value("a", CompareOp::Equal, "1"),
                Compare::exists("p/").over_prefix(),
                Compare::mod_revision("r", CompareOp::Less, 9).over_range(Some(b"s".to_vec())),
            ],
            success: vec![
                TxnOp::Put {
                    key: b"a".to_vec(),
                    value: b"2".to_vec(),
                    lease: Some("l".into()),
                },
                TxnOp::Delete { key: b"b".to_vec() },
                TxnOp::DeletePrefix {
                    prefix: b"p/".to_vec(),
                },
                TxnOp::Get { key: b"a".to_vec() },
                TxnOp::Scan {
                    prefix: b"q".to_vec(),
                    limit: 3,
                },
                TxnOp::Append {
                    key: b"c".to_vec(),
                    value: b"x".to_vec(),
                },
                TxnOp::Incr {
                    key: b"d".to_vec(),
                    by: -2,
                },
                TxnOp::Cas {
                    key: b"e".to_vec(),
                    expected: None,
                    new: b"y".to_vec(),
                },
            ],
            failure: vec![
                TxnOp::Range {
                    range: KeyRange::new(b"f".to_vec(), b"g".to_vec()),
                    limit: 0,
                },
                TxnOp::DeleteRange {
                    range: KeyRange::from_key(b"h".to_vec()),
                },
                TxnOp::PutExisting {
                    key: b"i".to_vec(),
                    value: Update::Keep,
                    lease: Update::Set(None),
                },
            ],
        }
    }

    /// The bytes below were written by the release before `TxnOp::Txn`
    /// and `Rejection::TxnTreeTooLarge` (each the last variant of its
    /// enum, so postcard numbers every earlier one as before): log
    /// entries, completion records and snapshots it wrote read back the
    /// same, and encode to the same bytes again.
    #[test]
    fn what_was_written_before_nested_transactions_reads_the_same() {
        let entry = Entry {
            index: LogIndex(42),
            proposal: Proposal {
                time: ClusterTime(7),
                principal: None,
                request: Request::plain(Command::Txn(every_earlier_op())),
            },
        };
        let written = bytes_of(
            "2a0700000f030161000001310002702f0104010001720201017303090208000161013201016c010162\
             0202702f030161040171030501630178060164030701650001790308016601016700090168000a0169\
             000100",
        );
        assert_eq!(postcard::from_bytes::<Entry>(&written).unwrap(), entry);
        assert_eq!(postcard::to_allocvec(&entry).unwrap(), written);
        let reply = Reply::Txn {
            succeeded: false,
            results: vec![Reply::Rejected(Rejection::KeyNotFound { key: "i".into() })],
        };
        let written = bytes_of("120001161c0169");
        assert_eq!(postcard::from_bytes::<Reply>(&written).unwrap(), reply);
        assert_eq!(postcard::to_allocvec(&reply).unwrap(), written);
        let rejection = Rejection::TxnTooLarge { ops: 3, max: 2 };
        let written = bytes_of("1a0302");
        assert_eq!(
            postcard::from_bytes::<Rejection>(&written).unwrap(),
            rejection
        );
        // The new variants take the next numbers.
        let nested = TxnOp::Txn(Txn::new());
        assert_eq!(postcard::to_allocvec(&nested).unwrap(), [11, 0, 0, 0]);
        let tree = Rejection::TxnTreeTooLarge {
            depth: 1,
            ops: 2,
            depth_max: 3,
            ops_max: 4,
        };
        assert_eq!(postcard::to_allocvec(&tree).unwrap(), [29, 1, 2, 3, 4]);
    }

    fn nested(txn: Txn) -> TxnOp {
        TxnOp::Txn(txn)
    }

    #[test]
    fn a_nested_transaction_gets_what_its_enclosing_one_leaves_of_the_budget() {
        // Two operations at the top: a nested one may hold 4 - 2.
        let inner = |ops: usize| {
            let mut txn = Txn::new();
            for i in 0..ops {
                txn = txn.on_success(TxnOp::put(format!("k{i}"), "v"));
            }
            txn
        };
        let outer = |ops: usize| {
            Txn::new()
                .on_success(TxnOp::get("a"))
                .on_success(nested(inner(ops)))
        };
        assert_eq!(outer(2).check_shape(4), Ok(()));
        assert_eq!(
            outer(3).check_shape(4),
            Err(Rejection::TxnTooLarge { ops: 3, max: 2 })
        );
        // Counted per level, as etcd counts: compares too.
        let compares = Txn::new()
            .compare(Compare::exists("a"))
            .compare(Compare::exists("b"))
            .compare(Compare::exists("c"))
            .on_success(nested(inner(1)));
        assert_eq!(compares.check_shape(4), Ok(()));
        assert_eq!(
            compares.check_shape(3),
            Err(Rejection::TxnTooLarge { ops: 1, max: 0 })
        );
    }

    #[test]
    fn nesting_is_bounded_in_depth_and_in_all() {
        let mut txn = Txn::new().on_success(TxnOp::put("a", "1"));
        for _ in 1..TXN_DEPTH_MAX {
            txn = Txn::new().on_failure(nested(txn));
        }
        assert_eq!(txn.tree_size(), (TXN_DEPTH_MAX, TXN_DEPTH_MAX));
        assert_eq!(txn.check_shape(128), Ok(()));
        let deeper = Txn::new().on_success(nested(txn));
        assert_eq!(
            deeper.check_shape(128),
            Err(Rejection::TxnTreeTooLarge {
                depth: TXN_DEPTH_MAX as u64 + 1,
                ops: TXN_DEPTH_MAX as u64 + 1,
                depth_max: TXN_DEPTH_MAX as u64,
                ops_max: 128 * TXN_TREE_OPS_FACTOR as u64,
            })
        );
        // Each level within the budget, but too many in all: 2 + 2 * 3
        // nested ones of 1 + 2 each is 8 > 2 * 3.
        let leaf = Txn::new().on_success(TxnOp::get("a"));
        let wide = Txn::new()
            .on_success(nested(leaf.clone()))
            .on_failure(nested(leaf.clone()));
        let mut tree = Txn::new();
        for _ in 0..2 {
            tree = tree.on_success(nested(wide.clone()));
        }
        assert_eq!(tree.tree_size(), (3, 2 + 2 * (2 + 2)));
        assert!(matches!(
            tree.check_shape(2),
            Err(Rejection::TxnTreeTooLarge {
                ops: 10,
                ops_max: 6,
                ..
            })
        ));
        // A flat transaction always passes both bounds.
        let mut flat = Txn::new();
        for i in 0..128 {
            flat = flat
                .compare(Compare::exists(format!("c{i}")))
                .on_success(TxnOp::put(format!("s{i}"), "v"))
                .on_failure(TxnOp::put(format!("f{i}"), "v"));
        }
        assert_eq!(flat.check_shape(128), Ok(()));
    }

    #[test]
    fn a_key_written_twice_across_nesting_is_refused_but_not_across_branches() {
        let conflict = |key: &str| {
            Err(Rejection::TxnConflict {
                key: key.to_string(),
            })
        };
        // A nested transaction's two branches never both run.
        let either = Txn::new()
            .on_success(TxnOp::put("k", "1"))
            .on_failure(TxnOp::delete("k"));
        assert_eq!(
            Txn::new().on_success(nested(either.clone())).check_shape(8),
            Ok(())
        );
        // But either of them conflicts with the enclosing branch's writes,
        // before or after it, and with another nested transaction's.
        let before = Txn::new()
            .on_success(TxnOp::put("k", "0"))
            .on_success(nested(either.clone()));
        assert_eq!(before.check_shape(8), conflict("k"));
        let after = Txn::new()
            .on_success(nested(either.clone()))
            .on_success(TxnOp::incr("k", 1));
        assert_eq!(after.check_shape(8), conflict("k"));
        let twice = Txn::new()
            .on_failure(nested(either.clone()))
            .on_failure(nested(either.clone()));
        assert_eq!(twice.check_shape(8), conflict("k"));
        let under_prefix = Txn::new()
            .on_success(TxnOp::DeletePrefix {
                prefix: b"k".to_vec(),
            })
            .on_success(nested(Txn::new().on_failure(TxnOp::put("k2", "v"))));
        assert_eq!(under_prefix.check_shape(8), conflict("k2"));
        // Inside one nested branch, as in a flat one.
        let inside = Txn::new().on_success(nested(
            Txn::new()
                .on_success(TxnOp::put("x", "1"))
                .on_success(TxnOp::put("x", "2")),
        ));
        assert_eq!(inside.check_shape(8), conflict("x"));
        // The other branch of the enclosing transaction is apart too.
        let apart = Txn::new()
            .on_success(nested(either.clone()))
            .on_failure(TxnOp::put("k", "3"));
        assert_eq!(apart.check_shape(8), Ok(()));
        // Reads are not writes.
        let reads = Txn::new()
            .on_success(TxnOp::get("k"))
            .on_success(nested(either))
            .on_success(TxnOp::get("k"));
        assert_eq!(reads.check_shape(8), Ok(()));
    }
}
