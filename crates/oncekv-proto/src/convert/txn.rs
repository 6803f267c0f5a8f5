//! Conversions of revisions, transactions, compaction and watch events
//! between the wire (`v1`) and the state machine's model.

use super::{ConvertError, Result, command_from_wire, command_to_wire};
use crate::v1;
use oncekv_state::{
    Command, Compare, CompareOp, CompareTarget, Event, KeyMeta, KeyRange, KeyScope, KeyValue,
    Rejection, Txn, TxnOp, Update,
};

/// Revisions for the wire.
pub fn meta_to_wire(meta: &KeyMeta) -> v1::KeyMeta {
    v1::KeyMeta {
        create_revision: meta.create_revision,
        mod_revision: meta.mod_revision,
        version: meta.version,
    }
}

/// Revisions from the wire.
pub fn meta_from_wire(meta: v1::KeyMeta) -> KeyMeta {
    KeyMeta {
        create_revision: meta.create_revision,
        mod_revision: meta.mod_revision,
        version: meta.version,
    }
}

pub(super) fn key_value_to_wire(kv: &KeyValue) -> v1::KeyValue {
    v1::KeyValue {
        key: kv.key.clone(),
        value: kv.value.clone(),
        meta: Some(meta_to_wire(&kv.meta)),
    }
}

pub(super) fn key_value_from_wire(kv: v1::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key,
        value: kv.value,
        meta: kv.meta.map(meta_from_wire).unwrap_or_default(),
    }
}

/// A transaction for the wire.
pub(super) fn txn_to_wire(txn: &Txn) -> Result<v1::Txn> {
    let ops = |ops: &[TxnOp]| ops.iter().map(op_to_wire).collect::<Result<Vec<_>>>();
    Ok(v1::Txn {
        compare: txn.compare.iter().map(compare_to_wire).collect(),
        success: ops(&txn.success)?,
        failure: ops(&txn.failure)?,
    })
}

/// A transaction from the wire.
pub(super) fn txn_from_wire(txn: v1::Txn) -> Result<Txn> {
    let ops = |ops: Vec<v1::TxnOp>| ops.into_iter().map(op_from_wire).collect::<Result<_>>();
    Ok(Txn {
        compare: txn
            .compare
            .into_iter()
            .map(compare_from_wire)
            .collect::<Result<_>>()?,
        success: ops(txn.success)?,
        failure: ops(txn.failure)?,
    })
}

fn compare_to_wire(compare: &Compare) -> v1::Compare {
    use v1::compare::Target;
    let op = match compare.op {
        CompareOp::Equal => v1::CompareOp::Equal,
        CompareOp::NotEqual => v1::CompareOp::NotEqual,
        CompareOp::Less => v1::CompareOp::Less,
        CompareOp::Greater => v1::CompareOp::Greater,
    };
    let target = match &compare.target {
        CompareTarget::Value(value) => Target::Value(value.clone()),
        CompareTarget::Version(n) => Target::Version(*n),
        CompareTarget::CreateRevision(n) => Target::CreateRevision(*n),
        CompareTarget::ModRevision(n) => Target::ModRevision(*n),
        CompareTarget::Exists(exists) => Target::Exists(*exists),
        CompareTarget::Lease(name) => Target::Lease(v1::LeaseTarget { name: name.clone() }),
    };
    let (prefix, range_end) = match &compare.scope {
        KeyScope::Key => (false, None),
        KeyScope::Prefix => (true, None),
        KeyScope::Range { end } => (false, Some(v1::RangeEnd { end: end.clone() })),
    };
    v1::Compare {
        key: compare.key.clone(),
        prefix,
        op: op.into(),
        target: Some(target),
        range_end,
    }
}

/// Which keys a compare or a watch of `key` addresses, from the wire's
/// `prefix` and `range_end` (which wins when set).
pub fn scope_from_wire(prefix: bool, range_end: Option<v1::RangeEnd>) -> KeyScope {
    match (range_end, prefix) {
        (Some(range_end), _) => KeyScope::Range { end: range_end.end },
        (None, true) => KeyScope::Prefix,
        (None, false) => KeyScope::Key,
    }
}

/// A key range for the wire.
pub(super) fn key_range_to_wire(range: &KeyRange) -> v1::KeyRange {
    v1::KeyRange {
        start: range.start.clone(),
        end: range.end.clone(),
    }
}

/// A key range from the wire.
pub(super) fn key_range_from_wire(range: Option<v1::KeyRange>) -> Result<KeyRange> {
    let range = range.ok_or(ConvertError::Missing("range.keys"))?;
    Ok(KeyRange {
        start: range.start,
        end: range.end,
    })
}

fn compare_from_wire(compare: v1::Compare) -> Result<Compare> {
    use v1::compare::Target;
    let op = match v1::CompareOp::try_from(compare.op).unwrap_or(v1::CompareOp::Unspecified) {
        v1::CompareOp::Equal => CompareOp::Equal,
        v1::CompareOp::NotEqual => CompareOp::NotEqual,
        v1::CompareOp::Less => CompareOp::Less,
        v1::CompareOp::Greater => CompareOp::Greater,
        v1::CompareOp::Unspecified => return Err(ConvertError::Missing("compare.op")),
    };
    let target = match compare
        .target
        .ok_or(ConvertError::Missing("compare.target"))?
    {
        Target::Value(value) => CompareTarget::Value(value),
        Target::Version(n) => CompareTarget::Version(n),
        Target::CreateRevision(n) => CompareTarget::CreateRevision(n),
        Target::ModRevision(n) => CompareTarget::ModRevision(n),
        Target::Exists(exists) => CompareTarget::Exists(exists),
        Target::Lease(lease) => CompareTarget::Lease(lease.name),
    };
    Ok(Compare {
        key: compare.key,
        scope: scope_from_wire(compare.prefix, compare.range_end),
        target,
        op,
    })
}

fn op_to_wire(op: &TxnOp) -> Result<v1::TxnOp> {
    use v1::txn_op::Kind;
    let kind = match (op, op.as_command()) {
        (TxnOp::DeletePrefix { prefix }, _) => Kind::DeletePrefix(v1::Delete {
            key: prefix.clone(),
        }),
        (TxnOp::DeleteRange { range }, _) => Kind::DeleteRange(key_range_to_wire(range)),
        (TxnOp::PutExisting { key, value, lease }, _) => {
            let (keep_lease, lease) = match lease {
                Update::Keep => (true, None),
                Update::Set(lease) => (false, lease.clone()),
            };
            Kind::PutExisting(v1::PutExisting {
                key: key.clone(),
                value: match value {
                    Update::Keep => None,
                    Update::Set(value) => Some(value.clone()),
                },
                keep_lease,
                lease,
            })
        }
        (TxnOp::Txn(nested), _) => Kind::Txn(txn_to_wire(nested)?),
        (_, None) => return Err(ConvertError::Internal("txn op")),
        (_, Some(command)) => match command_to_wire(&command)?.kind {
            Some(v1::command::Kind::Put(put)) => Kind::Put(put),
            Some(v1::command::Kind::Delete(delete)) => Kind::Delete(delete),
            Some(v1::command::Kind::Append(append)) => Kind::Append(append),
            Some(v1::command::Kind::Incr(incr)) => Kind::Incr(incr),
            Some(v1::command::Kind::Cas(cas)) => Kind::Cas(cas),
            Some(v1::command::Kind::Read(v1::Query {
                kind: Some(v1::query::Kind::Get(get)),
            })) => Kind::Get(get),
            Some(v1::command::Kind::Read(v1::Query {
                kind: Some(v1::query::Kind::Scan(scan)),
            })) => Kind::Scan(scan),
            Some(v1::command::Kind::Read(v1::Query {
                kind: Some(v1::query::Kind::Range(range)),
            })) => Kind::Range(range),
            _ => return Err(ConvertError::Internal("txn op")),
        },
    };
    Ok(v1::TxnOp { kind: Some(kind) })
}

fn op_from_wire(op: v1::TxnOp) -> Result<TxnOp> {
    use v1::txn_op::Kind;
    let command = |kind| command_from_wire(v1::Command { kind: Some(kind) });
    let read = |kind| v1::command::Kind::Read(v1::Query { kind: Some(kind) });
    let command = match op.kind.ok_or(ConvertError::Missing("txn_op.kind"))? {
        Kind::DeletePrefix(delete) => return Ok(TxnOp::DeletePrefix { prefix: delete.key }),
        Kind::DeleteRange(range) => {
            return Ok(TxnOp::DeleteRange {
                range: key_range_from_wire(Some(range))?,
            });
        }
        Kind::PutExisting(put) => {
            return Ok(TxnOp::PutExisting {
                key: put.key,
                value: put.value.map_or(Update::Keep, Update::Set),
                lease: if put.keep_lease {
                    Update::Keep
                } else {
                    Update::Set(put.lease)
                },
            });
        }
        Kind::Txn(nested) => return Ok(TxnOp::Txn(txn_from_wire(nested)?)),
        Kind::Range(range) => command(read(v1::query::Kind::Range(range)))?,
        Kind::Put(put) => command(v1::command::Kind::Put(put))?,
        Kind::Delete(delete) => command(v1::command::Kind::Delete(delete))?,
        Kind::Append(append) => command(v1::command::Kind::Append(append))?,
        Kind::Incr(incr) => command(v1::command::Kind::Incr(incr))?,
        Kind::Cas(cas) => command(v1::command::Kind::Cas(cas))?,
        Kind::Get(get) => command(read(v1::query::Kind::Get(get)))?,
        Kind::Scan(scan) => command(read(v1::query::Kind::Scan(scan)))?,
    };
    Ok(match command {
        Command::Put { key, value, lease } => TxnOp::Put {
            key,
            value: value.to_vec(),
            lease,
        },
        Command::Delete { key } => TxnOp::Delete { key },
        Command::Append { key, value } => TxnOp::Append { key, value },
        Command::Incr { key, by } => TxnOp::Incr { key, by },
        Command::Cas { key, expected, new } => TxnOp::Cas { key, expected, new },
        Command::Read(oncekv_state::Query::Get { key }) => TxnOp::Get { key },
        Command::Read(oncekv_state::Query::Scan { prefix, limit }) => TxnOp::Scan { prefix, limit },
        Command::Read(oncekv_state::Query::Range { range, limit }) => TxnOp::Range { range, limit },
        // A read at a past revision cannot run inside a transaction.
        _ => return Err(ConvertError::OutOfRange { field: "txn_op" }),
    })
}

/// A change for the wire (with its previous value if `previous`).
pub fn event_to_wire(event: &Event, previous: bool) -> v1::Event {
    let (kind, value, meta) = match &event.value {
        Some(stored) => (
            v1::EventType::Put,
            stored.value.to_vec(),
            meta_to_wire(&stored.meta),
        ),
        None => (
            v1::EventType::Delete,
            Vec::new(),
            v1::KeyMeta {
                mod_revision: event.revision,
                ..v1::KeyMeta::default()
            },
        ),
    };
    v1::Event {
        r#type: kind.into(),
        key: event.key.clone(),
        value,
        meta: Some(meta),
        previous: event
            .previous
            .as_ref()
            .filter(|_| previous)
            .map(|p| p.value.to_vec()),
        revision: event.revision,
    }
}

/// The rejections of this module's features, for the wire.
pub(super) fn rejection_to_wire(rejection: &Rejection) -> Option<v1::rejection::Kind> {
    use v1::rejection::Kind;
    Some(match rejection {
        Rejection::Compacted {
            revision,
            compacted,
        } => Kind::Compacted(v1::RevisionCompacted {
            revision: *revision,
            compacted: *compacted,
        }),
        Rejection::FutureRevision { revision, current } => {
            Kind::FutureRevision(v1::RevisionCompacted {
                revision: *revision,
                compacted: *current,
            })
        }
        Rejection::NotVersioned => Kind::NotVersioned(v1::Empty {}),
        Rejection::TxnTooLarge { ops, max } => Kind::TxnTooLarge(v1::Length {
            bytes: *ops,
            max: *max,
        }),
        Rejection::TxnConflict { key } => Kind::TxnConflict(v1::Name { name: key.clone() }),
        Rejection::KeyNotFound { key } => Kind::KeyNotFound(v1::Name { name: key.clone() }),
        Rejection::TxnTreeTooLarge {
            depth,
            ops,
            depth_max,
            ops_max,
        } => Kind::TxnTreeTooLarge(v1::TxnTreeTooLarge {
            depth: *depth,
            ops: *ops,
            depth_max: *depth_max,
            ops_max: *ops_max,
        }),
        Rejection::ReplyTooLarge { bytes, max } => Kind::ReplyTooLarge(v1::Length {
            bytes: *bytes,
            max: *max,
        }),
        _ => return None,
    })
}

/// The rejections of this module's features, from the wire.
pub(super) fn rejection_from_wire(kind: v1::rejection::Kind) -> Option<Rejection> {
    use v1::rejection::Kind;
    Some(match kind {
        Kind::Compacted(c) => Rejection::Compacted {
            revision: c.revision,
            compacted: c.compacted,
        },
        Kind::FutureRevision(c) => Rejection::FutureRevision {
            revision: c.revision,
            current: c.compacted,
        },
        Kind::NotVersioned(_) => Rejection::NotVersioned,
        Kind::TxnTooLarge(length) => Rejection::TxnTooLarge {
            ops: length.bytes,
            max: length.max,
        },
        Kind::TxnConflict(name) => Rejection::TxnConflict { key: name.name },
        Kind::KeyNotFound(name) => Rejection::KeyNotFound { key: name.name },
        Kind::TxnTreeTooLarge(tree) => Rejection::TxnTreeTooLarge {
            depth: tree.depth,
            ops: tree.ops,
            depth_max: tree.depth_max,
            ops_max: tree.ops_max,
        },
        Kind::ReplyTooLarge(length) => Rejection::ReplyTooLarge {
            bytes: length.bytes,
            max: length.max,
        },
        _ => return None,
    })
}
