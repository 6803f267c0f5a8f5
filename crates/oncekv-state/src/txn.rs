//! [`Txn`]: a multi-key transaction (as etcd's): compares on keys,
//! prefixes or ranges, then the `success` operations if every compare holds, else the
//! `failure` ones, all at one revision. This module owns its types, the
//! checks that need no state (sizes, and that no key is written twice) and
//! the evaluation of a compare; the state machine runs the operations and
//! undoes them all if one is refused, so a transaction applies whole or not
//! at all, and its whole reply is one completion record.

use crate::command::{Command, Query};
use crate::key_range::{KeyRange, KeyScope};
use crate::kv::StoredValue;
use crate::outcome::Rejection;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeSet;

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
    /// The single command this operation runs as (`None` for
    /// [`TxnOp::DeletePrefix`], [`TxnOp::DeleteRange`] and
    /// [`TxnOp::PutExisting`], which have none: the last is a put whose
    /// value or lease comes from the state).
    pub fn as_command(&self) -> Option<Command> {
        Some(match self.clone() {
            TxnOp::Put { key, value, lease } => Command::Put { key, value, lease },
            TxnOp::Delete { key } => Command::Delete { key },
            TxnOp::Get { key } => Command::Read(Query::Get { key }),
            TxnOp::Scan { prefix, limit } => Command::Read(Query::Scan { prefix, limit }),
            TxnOp::Append { key, value } => Command::Append { key, value },
            TxnOp::Incr { key, by } => Command::Incr { key, by },
            TxnOp::Cas { key, expected, new } => Command::Cas { key, expected, new },
            TxnOp::Range { range, limit } => Command::Read(Query::Range { range, limit }),
            TxnOp::DeletePrefix { .. } | TxnOp::DeleteRange { .. } | TxnOp::PutExisting { .. } => {
                return None;
            }
        })
    }

    /// What it writes; `None` for a read.
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
            TxnOp::Get { .. } | TxnOp::Scan { .. } | TxnOp::Range { .. } => None,
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
            TxnOp::Range { range, .. } | TxnOp::DeleteRange { range } => range.payload_bytes(),
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
        }
    }
}

/// What one operation writes.
enum Written<'a> {
    /// One key.
    Key(&'a [u8]),
    /// Every key under a prefix.
    Prefix(&'a [u8]),
    /// Every key in a range.
    Range(&'a KeyRange),
}

impl Txn {
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

    /// The checks that need no state: at most `ops_max` compares and
    /// operations per branch, and no key written twice in a branch (nor
    /// under a prefix it deletes). Sizes of keys and values are checked by
    /// the caller, op by op.
    pub fn check_shape(&self, ops_max: usize) -> Result<(), Rejection> {
        for count in [self.compare.len(), self.success.len(), self.failure.len()] {
            if count > ops_max {
                return Err(Rejection::TxnTooLarge {
                    ops: count as u64,
                    max: ops_max as u64,
                });
            }
        }
        check_branch(&self.success)?;
        check_branch(&self.failure)
    }
}

/// No key is written twice, nor written under a prefix or in a range the
/// branch deletes, and no two deleted prefixes or ranges overlap.
fn check_branch(ops: &[TxnOp]) -> Result<(), Rejection> {
    let mut keys: BTreeSet<&[u8]> = BTreeSet::new();
    let mut prefixes: Vec<&[u8]> = Vec::new();
    let mut ranges: Vec<&KeyRange> = Vec::new();
    for written in ops.iter().filter_map(TxnOp::written) {
        let (conflict, key) = match written {
            Written::Key(key) => (
                prefixes.iter().any(|p| key.starts_with(p))
                    || ranges.iter().any(|r| r.contains(key))
                    || !keys.insert(key),
                key,
            ),
            Written::Prefix(prefix) => {
                let as_range = KeyRange::prefix(prefix);
                let conflict = prefixes
                    .iter()
                    .any(|p| p.starts_with(prefix) || prefix.starts_with(p))
                    || keys.iter().any(|k| k.starts_with(prefix))
                    || ranges.iter().any(|r| r.overlaps(&as_range));
                prefixes.push(prefix);
                (conflict, prefix)
            }
            Written::Range(range) => {
                let conflict = prefixes
                    .iter()
                    .any(|p| KeyRange::prefix(*p).overlaps(range))
                    || keys.iter().any(|k| range.contains(k))
                    || ranges.iter().any(|r| r.overlaps(range));
                ranges.push(range);
                (conflict, range.start.as_slice())
            }
        };
        if conflict {
            return Err(Rejection::TxnConflict {
                key: String::from_utf8_lossy(key).into_owned(),
            });
        }
    }
    Ok(())
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
