//! The KV instance of the linearizability core: how a [`KvHistory`] is
//! split into partitions and compiled against the store's model, so that
//! [`crate::linearizability::check`] can decide whether it could have come
//! from one copy of the store, each operation (a transaction included)
//! taking effect at one instant between its invocation and its response.
//!
//! * **Partitions.** Keys are independent unless one operation spans
//!   several: the partitions are the connected components of keys linked
//!   by the operations that touch them (union-find; a prefix touches every
//!   key of the history under it). Each partition is checked alone,
//!   smallest first, with the map of its keys as the model's state.
//!   Operations touching no key of the history (a prefix read under which
//!   nothing was ever written) form a partition of their own, over no
//!   keys.
//! * **The model** is [`crate::kv_model`]'s; keys only ever appended to by
//!   single appends are length-only there.
//! * **Unknown outcomes** that cannot write (reads, read-only
//!   transactions) constrain nothing and are dropped up front.
//!
//! Everything starts absent: the history is taken to hold every write the
//! store saw.

use crate::kv_history::{KvCall, KvHistory, KvOperation};
use crate::kv_model::KvModel;
use crate::linearizability::{
    Bounds, Linearizable, Partition, SearchStats, Verdict, intervals, search_partitions,
};
use crate::record::TxnOp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// What makes two unknown-outcome operations interchangeable.
#[derive(PartialEq, Eq, Hash)]
enum ClassKey<'a> {
    /// The same call.
    Call(&'a KvCall),
    /// Appends of the same length to the same length-only key.
    Length(&'a [u8], usize),
}

/// Union-find over key indices.
struct Components {
    parent: Vec<usize>,
}

impl Components {
    fn new(count: usize) -> Self {
        Self {
            parent: (0..count).collect(),
        }
    }

    fn find(&mut self, mut at: usize) -> usize {
        while self.parent[at] != at {
            let up = self.parent[self.parent[at]];
            self.parent[at] = up;
            at = up;
        }
        at
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a.max(b)] = a.min(b);
        }
    }
}

/// One partition before it is compiled: its keys and the history
/// positions of its operations.
struct Group<'h> {
    keys: Vec<&'h [u8]>,
    ops: Vec<usize>,
}

/// Splits the history's operations into partitions; returns them and how
/// many operations were dropped as constraining nothing.
fn partitions<'h>(
    history: &'h KvHistory,
    universe: &'h BTreeSet<Vec<u8>>,
) -> (Vec<Group<'h>>, usize) {
    let index: BTreeMap<&[u8], usize> = universe
        .iter()
        .enumerate()
        .map(|(i, key)| (key.as_slice(), i))
        .collect();
    let mut components = Components::new(universe.len());
    let mut touched: Vec<Option<usize>> = Vec::with_capacity(history.len());
    let mut dropped = 0;
    for op in history.operations() {
        if op.output.is_none() && !op.call.may_write() {
            dropped += 1;
            touched.push(None);
            continue;
        }
        let keys: Vec<usize> = op
            .call
            .keys_in(universe)
            .into_iter()
            .filter_map(|key| index.get(key).copied())
            .collect();
        for pair in keys.windows(2) {
            components.union(pair[0], pair[1]);
        }
        // usize::MAX: the partition over no keys.
        touched.push(Some(keys.first().copied().unwrap_or(usize::MAX)));
    }
    let keys: Vec<&[u8]> = universe.iter().map(Vec::as_slice).collect();
    let mut by_root: BTreeMap<usize, Group<'h>> = BTreeMap::new();
    for (position, first) in touched.into_iter().enumerate() {
        let Some(first) = first else {
            continue;
        };
        let root = if first == usize::MAX {
            usize::MAX
        } else {
            components.find(first)
        };
        by_root
            .entry(root)
            .or_insert_with(|| Group {
                keys: Vec::new(),
                ops: Vec::new(),
            })
            .ops
            .push(position);
    }
    for (slot, key) in keys.iter().enumerate() {
        let root = components.find(slot);
        if let Some(partition) = by_root.get_mut(&root) {
            partition.keys.push(key);
        }
    }
    let mut list: Vec<Group<'h>> = by_root.into_values().collect();
    // Stable: equal sizes stay in key order.
    list.sort_by_key(|p| p.ops.len());
    (list, dropped)
}

impl Linearizable for KvCall {
    fn check_with_stats(history: &KvHistory, bounds: &Bounds) -> (Verdict, SearchStats) {
        let started = Instant::now();
        let universe = history.keys();
        let (partitions, dropped) = partitions(history, &universe);

        // Keys only ever appended to by single appends: their contents are
        // never observed.
        let mut observed: BTreeSet<&[u8]> = BTreeSet::new();
        for op in history.operations() {
            if !op.call.is_append() {
                observed.extend(op.call.keys_in(&universe));
            }
        }

        let compiled = partitions.into_iter().map(|partition| {
            let ops: Vec<&KvOperation> = partition
                .ops
                .iter()
                .filter_map(|&i| history.operations().get(i))
                .collect();
            // Unknown operations with the same call (appends to a
            // length-only key: the same length) are interchangeable.
            let intervals = intervals(ops.iter().map(|&op| {
                let class = match &op.call {
                    KvCall::Op(TxnOp::Append { key, value })
                        if !observed.contains(key.as_slice()) =>
                    {
                        ClassKey::Length(key.as_slice(), value.len())
                    }
                    call => ClassKey::Call(call),
                };
                (op, class)
            }));
            let length_only = partition
                .keys
                .iter()
                .map(|key| !observed.contains(key))
                .collect();
            Partition {
                model: KvModel::new(partition.keys.clone(), length_only, ops),
                keys: partition.keys,
                origin: partition.ops,
                intervals,
                initial: KvModel::INITIAL,
            }
        });
        search_partitions(started, bounds, dropped, compiled)
    }
}
