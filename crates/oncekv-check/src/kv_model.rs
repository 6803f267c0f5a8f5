//! What the store's operations do: the sequential specification the KV
//! linearizability search checks histories against.
//!
//! The state of a partition is a map from each of its keys to
//! `Option<bytes>` (absent or a value); everything starts absent. Per
//! operation, as the state machine does it:
//!
//! * `get` returns the value; `put` sets it and returns the previous one;
//!   `delete` removes it and returns the previous one;
//! * `append` appends (absent counts as empty) and returns the new length;
//! * `incr` reads the value as an ASCII decimal `i64` (absent counts as 0),
//!   adds, writes the sum back in decimal and returns it; a value that is
//!   not such a number, or an overflow, is a deterministic refusal that
//!   changes nothing;
//! * `cas` swaps iff the value equals `expected` (`None`: absent) and
//!   returns whether it swapped and the value after it;
//! * prefix reads return the present keys under the prefix in key order;
//!   prefix deletes remove them and return how many;
//! * a transaction evaluates every compare, runs the success branch if all
//!   hold and the failure branch otherwise, and is refused as a whole
//!   (changing nothing) when one of its operations is refused.
//!
//! **Compares.** `value` compares are bytewise; a `value` compare on an
//! absent key is false (as etcd's); `exists` compares `false < true`. On a
//! prefix, `exists` asks whether any key under it is present, and the other
//! targets must hold for every present key under it (a `value` compare
//! with none present is false). **Versions and revisions are not
//! modelled**: the store's revision counter is not part of this model's
//! state. An absent key has version and revisions 0 (as in etcd), so a
//! compare is decided when the key is absent, and when the key is present
//! only where "some number at least 1" decides it (`version == 0` is
//! false, `version > 0` true); otherwise the compare is *unconstrained*,
//! and the transaction may take either branch: a reported branch is then
//! accepted, and an unknown-outcome transaction may run either.
//!
//! Keys only ever appended to, by single appends (no read, transaction or
//! other write touches them), are *length-only*: their contents are never
//! observed, so appended bytes are replaced by zeros and concurrent appends
//! in different orders reach the same state (the append lengths are still
//! checked). Without this, a history of unread appends would have a state
//! per order and exhaust any bound.

use crate::kv_history::{KvCall, KvOperation, KvOutput};
use crate::linearizability::{KeyState, ReadState};
use crate::record::{
    Bytes, Compare, CompareOp, CompareTarget, KeyRange, KeyValue, TxnOp, TxnOpResult,
};
use crate::search::{Interner, Model};

/// A three-valued truth: the model cannot always decide a compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Truth {
    True,
    False,
    Either,
}

impl Truth {
    fn of(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }

    fn and(self, other: Self) -> Self {
        match (self, other) {
            (Self::False, _) | (_, Self::False) => Self::False,
            (Self::True, Self::True) => Self::True,
            _ => Self::Either,
        }
    }
}

/// What `op operand` says of "some number at least 1" (a present key's
/// version or revision).
fn positive_holds(op: CompareOp, operand: u64) -> Truth {
    match op {
        CompareOp::Equal if operand == 0 => Truth::False,
        CompareOp::NotEqual | CompareOp::Greater if operand == 0 => Truth::True,
        CompareOp::Less if operand <= 1 => Truth::False,
        _ => Truth::Either,
    }
}

/// A deterministic refusal: the operation (or its whole transaction)
/// changed nothing.
struct Refused;

/// The model of one partition.
pub(crate) struct KvModel<'a> {
    /// The partition's keys, sorted; slot `i` of a state is `keys[i]`.
    keys: Vec<&'a [u8]>,
    /// Whether the key at a slot is length-only.
    length_only: Vec<bool>,
    /// The partition's operations, by local index.
    ops: Vec<&'a KvOperation>,
    /// Value ids: 0 is absent, `n > 0` is `values[n - 1]`.
    values: Interner<Vec<u8>>,
    /// State ids: one value id per slot. State 0 is all absent.
    states: Interner<Box<[u32]>>,
}

impl<'a> KvModel<'a> {
    /// The model of a partition with these keys (sorted, distinct), of
    /// which `length_only` are only ever appended to, and these
    /// operations (local index = position).
    pub(crate) fn new(
        keys: Vec<&'a [u8]>,
        length_only: Vec<bool>,
        ops: Vec<&'a KvOperation>,
    ) -> Self {
        let mut states = Interner::new();
        states.intern(vec![0; keys.len()].into_boxed_slice());
        Self {
            keys,
            length_only,
            ops,
            values: Interner::new(),
            states,
        }
    }

    /// The id of the initial state (every key absent).
    pub(crate) const INITIAL: u32 = 0;

    fn value(&self, id: u32) -> Option<&[u8]> {
        self.values.get(id.checked_sub(1)?).map(Vec::as_slice)
    }

    fn slot(&self, key: &[u8]) -> Option<usize> {
        self.keys.binary_search(&key).ok()
    }

    fn slots_under(&self, prefix: &[u8]) -> std::ops::Range<usize> {
        let start = self.keys.partition_point(|key| *key < prefix);
        let len = self.keys[start..]
            .iter()
            .take_while(|key| key.starts_with(prefix))
            .count();
        start..start + len
    }

    fn slots_between(&self, start: &Bytes, end: Option<&Bytes>) -> std::ops::Range<usize> {
        let first = self.keys.partition_point(|key| *key < start.as_slice());
        let len = self.keys[first..]
            .iter()
            .take_while(|key| end.is_none_or(|end| **key < end.as_slice()))
            .count();
        first..first + len
    }

    /// The slots of the keys `range` names.
    fn slots_of(&self, range: &KeyRange) -> std::ops::Range<usize> {
        match range {
            KeyRange::Key(key) => match self.slot(key.as_slice()) {
                Some(slot) => slot..slot + 1,
                None => 0..0,
            },
            KeyRange::Prefix(prefix) => self.slots_under(prefix.as_slice()),
            KeyRange::Range { start, end } => self.slots_between(start, end.as_ref()),
        }
    }

    /// The present keys of `slots` and their values.
    fn entries(&self, work: &[u32], slots: std::ops::Range<usize>) -> Vec<KeyValue> {
        slots
            .filter_map(|slot| {
                Some(KeyValue {
                    key: Bytes::from(*self.keys.get(slot)?),
                    value: self.current(work, slot)?,
                })
            })
            .collect()
    }

    /// Removes the present keys of `slots`; answers how many.
    fn remove(work: &mut [u32], slots: std::ops::Range<usize>) -> u64 {
        let mut deleted = 0;
        for slot in slots {
            if let Some(cell) = work.get_mut(slot)
                && *cell != 0
            {
                *cell = 0;
                deleted += 1;
            }
        }
        deleted
    }

    fn current(&self, work: &[u32], slot: usize) -> Option<Bytes> {
        self.value(work.get(slot).copied().unwrap_or(0))
            .map(Bytes::from)
    }

    fn set(&mut self, work: &mut [u32], slot: usize, value: Option<Vec<u8>>) {
        let id = match value {
            None => 0,
            Some(bytes) => self.values.intern(bytes).saturating_add(1),
        };
        if let Some(cell) = work.get_mut(slot) {
            *cell = id;
        }
    }

    /// Runs `op` on `work`; `None` when the operation names a key outside
    /// the partition (which cannot happen for partitions built by
    /// [`crate::kv_linearizability`]).
    fn exec(&mut self, op: &TxnOp, work: &mut [u32]) -> Option<Result<TxnOpResult, Refused>> {
        let key_slot = |model: &Self, key: &Bytes| model.slot(key.as_slice());
        Some(Ok(match op {
            TxnOp::Get { key } => TxnOpResult::Get {
                value: self.current(work, key_slot(self, key)?),
            },
            TxnOp::Put { key, value } => {
                let slot = key_slot(self, key)?;
                let previous = self.current(work, slot);
                self.set(work, slot, Some(value.0.clone()));
                TxnOpResult::Put { previous }
            }
            TxnOp::Delete { key } => {
                let slot = key_slot(self, key)?;
                let previous = self.current(work, slot);
                self.set(work, slot, None);
                TxnOpResult::Delete { previous }
            }
            TxnOp::Append { key, value } => {
                let slot = key_slot(self, key)?;
                let mut bytes = self.current(work, slot).map(|b| b.0).unwrap_or_default();
                if self.length_only.get(slot).copied().unwrap_or(false) {
                    bytes.resize(bytes.len() + value.len(), 0);
                } else {
                    bytes.extend_from_slice(value.as_slice());
                }
                let length = bytes.len() as u64;
                self.set(work, slot, Some(bytes));
                TxnOpResult::Append { length }
            }
            TxnOp::Incr { key, by } => {
                let slot = key_slot(self, key)?;
                let current = match self.current(work, slot) {
                    None => Some(0),
                    Some(bytes) => std::str::from_utf8(bytes.as_slice())
                        .ok()
                        .and_then(|text| text.parse::<i64>().ok()),
                };
                let Some(value) = current.and_then(|c| c.checked_add(*by)) else {
                    return Some(Err(Refused));
                };
                self.set(work, slot, Some(value.to_string().into_bytes()));
                TxnOpResult::Incr { value }
            }
            TxnOp::Cas { key, expected, new } => {
                let slot = key_slot(self, key)?;
                let current = self.current(work, slot);
                if current != *expected {
                    TxnOpResult::Cas {
                        swapped: false,
                        current,
                    }
                } else {
                    self.set(work, slot, Some(new.0.clone()));
                    TxnOpResult::Cas {
                        swapped: true,
                        current: Some(new.clone()),
                    }
                }
            }
            TxnOp::GetPrefix { prefix } => TxnOpResult::GetPrefix {
                entries: self.entries(work, self.slots_under(prefix.as_slice())),
            },
            TxnOp::GetRange { start, end } => TxnOpResult::GetPrefix {
                entries: self.entries(work, self.slots_between(start, end.as_ref())),
            },
            TxnOp::DeletePrefix { prefix } => TxnOpResult::DeletePrefix {
                deleted: Self::remove(work, self.slots_under(prefix.as_slice())),
            },
            TxnOp::DeleteRange { start, end } => TxnOpResult::DeletePrefix {
                deleted: Self::remove(work, self.slots_between(start, end.as_ref())),
            },
            // Histories holding one are refused (`HistoryError::NestedTxn`).
            TxnOp::Txn { .. } => return None,
            TxnOp::PutExisting { key, value } => {
                let slot = key_slot(self, key)?;
                let Some(previous) = self.current(work, slot) else {
                    return Some(Err(Refused));
                };
                let value = value.clone().unwrap_or_else(|| previous.clone());
                self.set(work, slot, Some(value.0));
                TxnOpResult::Put {
                    previous: Some(previous),
                }
            }
        }))
    }

    fn compare_slot(&self, compare: &Compare, work: &[u32], slot: usize) -> Truth {
        let value = self.value(work.get(slot).copied().unwrap_or(0));
        match &compare.target {
            CompareTarget::Value(operand) => match value {
                None => Truth::False,
                Some(bytes) => Truth::of(compare.op.holds(bytes, operand.as_slice())),
            },
            CompareTarget::Exists(operand) => {
                Truth::of(compare.op.holds(&value.is_some(), operand))
            }
            CompareTarget::Version(operand)
            | CompareTarget::CreateRevision(operand)
            | CompareTarget::ModRevision(operand) => match value {
                None => Truth::of(compare.op.holds(&0, operand)),
                Some(_) => positive_holds(compare.op, *operand),
            },
            // Leases are not modelled: a present key's is unknown.
            CompareTarget::Lease(operand) => match value {
                None => Truth::of(compare.op.holds(&None, &operand.as_deref())),
                Some(_) => Truth::Either,
            },
        }
    }

    fn compare(&self, compare: &Compare, work: &[u32]) -> Truth {
        match &compare.range {
            KeyRange::Key(key) => match self.slot(key.as_slice()) {
                Some(slot) => self.compare_slot(compare, work, slot),
                // Outside the partition: never written, so absent.
                None => self.compare_absent(compare),
            },
            KeyRange::Prefix(_) | KeyRange::Range { .. } => {
                let present: Vec<usize> = self
                    .slots_of(&compare.range)
                    .filter(|&slot| work.get(slot).is_some_and(|&v| v != 0))
                    .collect();
                match &compare.target {
                    CompareTarget::Exists(operand) => {
                        Truth::of(compare.op.holds(&!present.is_empty(), operand))
                    }
                    _ if present.is_empty() => self.compare_absent(compare),
                    _ => present.iter().fold(Truth::True, |truth, &slot| {
                        truth.and(self.compare_slot(compare, work, slot))
                    }),
                }
            }
        }
    }

    fn compare_absent(&self, compare: &Compare) -> Truth {
        match &compare.target {
            CompareTarget::Value(_) => Truth::False,
            CompareTarget::Exists(operand) => Truth::of(compare.op.holds(&false, operand)),
            CompareTarget::Version(operand)
            | CompareTarget::CreateRevision(operand)
            | CompareTarget::ModRevision(operand) => Truth::of(compare.op.holds(&0, operand)),
            CompareTarget::Lease(operand) => {
                Truth::of(compare.op.holds(&None, &operand.as_deref()))
            }
        }
    }

    /// Runs the operation at `local` with alternative `choice` on `work`;
    /// `false` when it cannot take effect there as its output says.
    fn run(&mut self, local: usize, choice: u32, work: &mut Vec<u32>) -> bool {
        let Some(op) = self.ops.get(local).copied() else {
            return false;
        };
        match (&op.call, &op.output) {
            (KvCall::Op(call), output) => {
                let before = work.clone();
                match (self.exec(call, work), output) {
                    (None, _) => false,
                    (Some(Err(Refused)), None | Some(KvOutput::Op(_))) => false,
                    (Some(Err(Refused)), Some(_)) => {
                        *work = before;
                        true
                    }
                    (Some(Ok(result)), Some(KvOutput::Op(expected))) => result == *expected,
                    (Some(Ok(_)), _) => true,
                }
            }
            (KvCall::Txn(txn), output) => {
                let condition = txn
                    .compares
                    .iter()
                    .fold(Truth::True, |truth, c| truth.and(self.compare(c, work)));
                let succeeded = match (output, condition, choice) {
                    (Some(KvOutput::Txn { succeeded, .. }), _, 0) => *succeeded,
                    (Some(KvOutput::Txn { .. }), _, _) => return false,
                    (_, Truth::True, 0) | (_, Truth::Either, 0) => true,
                    (_, Truth::False, 0) | (_, Truth::Either, 1) => false,
                    _ => return false,
                };
                let allowed = match condition {
                    Truth::True => succeeded,
                    Truth::False => !succeeded,
                    Truth::Either => true,
                };
                if !allowed {
                    return false;
                }
                let expected = match output {
                    Some(KvOutput::Txn { results, .. }) => Some(results.as_slice()),
                    _ => None,
                };
                let before = work.clone();
                for (position, call) in txn.branch(succeeded).iter().enumerate() {
                    match self.exec(call, work) {
                        None => return false,
                        Some(Err(Refused)) => {
                            // Refused as a whole: a recorded result says
                            // otherwise; an acknowledged one accepts it.
                            if matches!(output, Some(KvOutput::Acknowledged)) {
                                *work = before;
                                return true;
                            }
                            return false;
                        }
                        Some(Ok(result)) => {
                            if let Some(results) = expected
                                && results.get(position) != Some(&result)
                            {
                                return false;
                            }
                        }
                    }
                }
                true
            }
        }
    }
}

impl ReadState for KvModel<'_> {
    /// The present keys of `state` and their values (length-only keys
    /// hold zeros of the right length).
    fn read_state(&self, state: u32) -> Vec<KeyState> {
        let Some(slots) = self.states.get(state) else {
            return Vec::new();
        };
        slots
            .iter()
            .enumerate()
            .filter_map(|(slot, &value)| {
                Some(KeyState {
                    key: self.keys.get(slot)?.to_vec(),
                    value: self.value(value)?.to_vec(),
                    length_only: self.length_only.get(slot).copied().unwrap_or(false),
                })
            })
            .collect()
    }
}

impl Model for KvModel<'_> {
    fn choices(&self, local: usize) -> u32 {
        match self.ops.get(local) {
            Some(op) if matches!(op.call, KvCall::Txn(_)) => 2,
            _ => 1,
        }
    }

    fn step(&mut self, local: usize, state: u32, choice: u32) -> Option<u32> {
        let mut work = self.states.get(state)?.to_vec();
        if !self.run(local, choice, &mut work) {
            return None;
        }
        let unknown = self.ops.get(local).is_some_and(|op| op.output.is_none());
        if unknown && self.states.get(state).is_some_and(|s| **s == *work) {
            // An unknown outcome that changes nothing is the same as
            // leaving it out.
            return None;
        }
        Some(self.states.intern(work.into_boxed_slice()))
    }
}
