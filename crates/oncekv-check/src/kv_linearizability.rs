//! The linearizability search for whole KV histories ([`KvHistory`]):
//! could the history have come from one copy of the store, each operation
//! (a transaction included) taking effect at one instant between its
//! invocation and its response?
//!
//! * **Partitions.** Keys are independent unless one operation spans
//!   several: the partitions are the connected components of keys linked
//!   by the operations that touch them (union-find; a prefix touches every
//!   key of the history under it). Each partition is checked alone,
//!   smallest first, with the map of its keys as the model's state; the
//!   whole is linearizable exactly when every partition is. Operations
//!   touching no key of the history (a prefix read under which nothing was
//!   ever written) form a partition of their own, over no keys.
//! * **The search** is [`crate::search`]'s (memoised on the set of
//!   linearized operations and the model's state), with the model of
//!   [`crate::kv_model`].
//! * **Unknown outcomes** may take effect at any time after their call, or
//!   never; unknown ones that cannot write (reads, read-only
//!   transactions) constrain nothing and are dropped up front.
//! * **Bounds.** The same [`Bounds`] as the register search: a wall-clock
//!   budget for the whole history and a cap on the configurations
//!   memoised per partition; hitting either is [`KvVerdict::Unknown`],
//!   never a pass. Besides the memo's configurations, the KV model keeps
//!   each distinct state it reaches (one `u32` per key of the partition,
//!   held twice), at most one per configuration.
//!
//! Everything starts absent: the history is taken to hold every write the
//! store saw.

use crate::history::Key;
use crate::kv_history::{KvCall, KvHistory};
use crate::kv_model::KvModel;
use crate::linearizability::{Bounds, SearchStats};
use crate::record::TxnOp;
use crate::search::{Interval, Outcome, Search};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

/// The outcome of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvVerdict {
    /// Every partition has a linearization.
    Linearizable,
    /// The partition over `keys` has no linearization.
    NotLinearizable {
        /// The partition's keys.
        keys: Vec<Key>,
        /// How far the search got.
        explanation: KvExplanation,
    },
    /// The search hit a bound before deciding.
    Unknown {
        /// Which bound, and where.
        reason: KvUnknownReason,
    },
}

impl KvVerdict {
    /// Whether the history was proved linearizable.
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Self::Linearizable)
    }

    /// Whether the history was proved not linearizable.
    pub fn is_not_linearizable(&self) -> bool {
        matches!(self, Self::NotLinearizable { .. })
    }

    /// Whether the search gave up.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Self::Unknown { .. })
    }

    /// A multi-line account of the verdict that spells out the operations
    /// of `history` it refers to.
    pub fn describe(&self, history: &KvHistory) -> String {
        use std::fmt::Write as _;
        let Self::NotLinearizable { keys, explanation } = self else {
            return self.to_string();
        };
        let mut text = format!("not linearizable on keys {}\n", key_list(keys));
        let ops = history.operations();
        let _ = writeln!(
            text,
            "longest linearizable prefix ({} operations):",
            explanation.longest_prefix.len()
        );
        for &index in &explanation.longest_prefix {
            if let Some(op) = ops.get(index) {
                let _ = writeln!(text, "  #{index}: {op}");
            }
        }
        let _ = writeln!(text, "state after it: {}", explanation.state_text());
        if let Some((index, op)) = explanation
            .blocked
            .and_then(|index| ops.get(index).map(|op| (index, op)))
        {
            let _ = writeln!(text, "then #{index} cannot be placed: {op}");
        }
        text
    }
}

fn key_list(keys: &[Key]) -> String {
    let names: Vec<String> = keys
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    format!("{{{}}}", names.join(", "))
}

impl fmt::Display for KvVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Linearizable => f.write_str("linearizable"),
            Self::NotLinearizable { keys, explanation } => write!(
                f,
                "not linearizable on keys {}: {explanation}",
                key_list(keys)
            ),
            Self::Unknown { reason } => write!(f, "unknown: {reason}"),
        }
    }
}

/// One key's value in a state the search reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The key.
    pub key: Key,
    /// Its value; for a length-only key (see [`crate::kv_model`]), zeros
    /// of its length.
    pub value: Vec<u8>,
    /// Whether only the length is modelled.
    pub length_only: bool,
}

/// What the search learned about a partition that has no linearization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvExplanation {
    /// Positions in [`KvHistory::operations`] of the longest valid
    /// linearization prefix found, in linearization order.
    pub longest_prefix: Vec<usize>,
    /// The present keys after that prefix (the others are absent).
    pub state_after_prefix: Vec<KeyState>,
    /// The completed operation that then had to be linearized next but
    /// could not; `None` only for a partition with nothing to place.
    pub blocked: Option<usize>,
}

impl KvExplanation {
    fn state_text(&self) -> String {
        if self.state_after_prefix.is_empty() {
            return "every key absent".to_owned();
        }
        let parts: Vec<String> = self
            .state_after_prefix
            .iter()
            .map(|k| {
                let key = String::from_utf8_lossy(&k.key);
                if k.length_only {
                    format!("{key}: {} bytes appended", k.value.len())
                } else {
                    format!("{key}: {:?}", String::from_utf8_lossy(&k.value))
                }
            })
            .collect();
        parts.join(", ")
    }
}

impl fmt::Display for KvExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at most {} operations linearize (then {})",
            self.longest_prefix.len(),
            self.state_text()
        )?;
        if let Some(blocked) = self.blocked {
            write!(f, ", after which operation #{blocked} cannot be placed")?;
        }
        Ok(())
    }
}

/// Which bound stopped an undecided search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvUnknownReason {
    /// The wall-clock budget ran out while checking the partition `keys`.
    TimeLimit {
        /// The partition's keys.
        keys: Vec<Key>,
        /// The budget.
        limit: Duration,
    },
    /// The memo table of the partition `keys` reached its cap.
    StateLimit {
        /// The partition's keys.
        keys: Vec<Key>,
        /// The cap.
        max_states: usize,
    },
}

impl fmt::Display for KvUnknownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimeLimit { keys, limit } => write!(
                f,
                "time limit of {limit:?} reached while checking keys {}",
                key_list(keys)
            ),
            Self::StateLimit { keys, max_states } => write!(
                f,
                "state limit of {max_states} reached while checking keys {}",
                key_list(keys)
            ),
        }
    }
}

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

/// One partition: its keys and the history positions of its operations.
struct Partition<'h> {
    keys: Vec<&'h [u8]>,
    ops: Vec<usize>,
}

/// Splits the history's operations into partitions; returns them and how
/// many operations were dropped as constraining nothing.
fn partitions<'h>(
    history: &'h KvHistory,
    universe: &'h BTreeSet<Vec<u8>>,
) -> (Vec<Partition<'h>>, usize) {
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
    let mut by_root: BTreeMap<usize, Partition<'h>> = BTreeMap::new();
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
            .or_insert_with(|| Partition {
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
    let mut list: Vec<Partition<'h>> = by_root.into_values().collect();
    // Stable: equal sizes stay in key order.
    list.sort_by_key(|p| p.ops.len());
    (list, dropped)
}

/// Decides whether `history` is linearizable within `bounds`.
pub fn check(history: &KvHistory, bounds: &Bounds) -> KvVerdict {
    check_with_stats(history, bounds).0
}

/// [`check`], with counters describing the search.
pub fn check_with_stats(history: &KvHistory, bounds: &Bounds) -> (KvVerdict, SearchStats) {
    let started = Instant::now();
    let deadline = started.checked_add(bounds.time_limit);
    let mut stats = SearchStats::default();
    let universe = history.keys();
    let (partitions, dropped) = partitions(history, &universe);
    stats.dropped = dropped;

    // Keys only ever appended to by single appends: their contents are
    // never observed.
    let mut observed: BTreeSet<&[u8]> = BTreeSet::new();
    for op in history.operations() {
        if !op.call.is_append() {
            observed.extend(op.call.keys_in(&universe));
        }
    }

    let mut undecided = None;
    for partition in partitions {
        stats.partitions += 1;
        let owned_keys = || {
            partition
                .keys
                .iter()
                .map(|k| k.to_vec())
                .collect::<Vec<_>>()
        };
        let ops: Vec<_> = partition
            .ops
            .iter()
            .filter_map(|&i| history.operations().get(i))
            .collect();
        // Unknown operations with the same call (appends to a length-only
        // key: the same length) are interchangeable.
        let mut classes: HashMap<ClassKey<'_>, u32> = HashMap::new();
        let intervals: Vec<Interval> = ops
            .iter()
            .map(|op| {
                let class = op.output.is_none().then(|| {
                    let key = match &op.call {
                        KvCall::Op(TxnOp::Append { key, value })
                            if !observed.contains(key.as_slice()) =>
                        {
                            ClassKey::Length(key.as_slice(), value.len())
                        }
                        call => ClassKey::Call(call),
                    };
                    let next = u32::try_from(classes.len()).unwrap_or(u32::MAX - 1);
                    *classes.entry(key).or_insert(next)
                });
                Interval {
                    invoke_ns: op.invoke_ns,
                    complete_ns: op.output.as_ref().and(op.complete_ns),
                    class,
                }
            })
            .collect();
        let length_only = partition
            .keys
            .iter()
            .map(|key| !observed.contains(key))
            .collect();
        let mut model = KvModel::new(partition.keys.clone(), length_only, ops);
        let mut search = Search::new(&intervals);
        let outcome = search.run(&mut model, KvModel::INITIAL, deadline, bounds.max_states);
        let states = search.states();
        stats.states += states;
        stats.max_partition_states = stats.max_partition_states.max(states);
        match outcome {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable(failure) => {
                stats.elapsed = started.elapsed();
                let origin = |local: usize| partition.ops.get(local).copied().unwrap_or(usize::MAX);
                let explanation = KvExplanation {
                    longest_prefix: failure.longest_prefix.iter().map(|&l| origin(l)).collect(),
                    state_after_prefix: model
                        .describe_state(failure.state_after_prefix)
                        .into_iter()
                        .map(|(key, value, length_only)| KeyState {
                            key,
                            value,
                            length_only,
                        })
                        .collect(),
                    blocked: failure.blocked.map(origin),
                };
                let verdict = KvVerdict::NotLinearizable {
                    keys: owned_keys(),
                    explanation,
                };
                return (verdict, stats);
            }
            Outcome::OutOfTime => {
                undecided.get_or_insert(KvUnknownReason::TimeLimit {
                    keys: owned_keys(),
                    limit: bounds.time_limit,
                });
                // Every later partition would stop at its first clock check.
                break;
            }
            Outcome::OutOfStates => {
                undecided.get_or_insert(KvUnknownReason::StateLimit {
                    keys: owned_keys(),
                    max_states: bounds.max_states,
                });
            }
        }
    }
    stats.elapsed = started.elapsed();
    let verdict = match undecided {
        None => KvVerdict::Linearizable,
        Some(reason) => KvVerdict::Unknown { reason },
    };
    (verdict, stats)
}
