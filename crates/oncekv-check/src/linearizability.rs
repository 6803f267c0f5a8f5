//! The linearizability core: one check, one verdict type and one driver
//! of the search, for every kind of operation.
//!
//! [`check`] decides whether a [`History`] could have come from one copy
//! of the store, each operation taking effect at one instant between its
//! invocation and its response. It follows the Wing–Gong algorithm as
//! refined by Lowe and by Porcupine:
//!
//! * **P-compositionality.** Each kind of call ([`Linearizable`]: the
//!   register [`Call`](crate::register::Call), the
//!   [`KvCall`](crate::kv_history::KvCall)) splits its history
//!   into independent partitions and compiles each into a model; the
//!   driver here checks them alone, smallest first, and the whole is
//!   linearizable exactly when every partition is.
//! * **The search.** Each partition goes through [`crate::search`] (entry
//!   list, depth-first walk, memo table of configurations).
//! * **Unknown outcomes.** An operation whose outcome is unknown may be
//!   linearized at any point after its call, or never; the kinds drop up
//!   front the unknown ones that cannot write, as they constrain nothing.
//!
//! The search is bounded by a wall-clock budget for the whole history and
//! by the number of configurations memoised per partition ([`Bounds`]); a
//! search that hits either bound reports [`Verdict::Unknown`], never a
//! pass.

use crate::history::{History, HistoryCall, Key, Operation};
use crate::search::{Interval, Model, Outcome, Search};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Limits on one call to [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Wall-clock budget for the whole history, all partitions together.
    pub time_limit: Duration,
    /// Most configurations memoised for one partition. Each costs
    /// `8 * (2 + ⌈n / 64⌉)` bytes for a partition of `n` operations, plus
    /// about 8 bytes of table slots (and, for the KV model, each distinct
    /// state it reaches: one `u32` per key of the partition, held twice).
    pub max_states: usize,
}

impl Default for Bounds {
    /// Ten seconds and four million configurations.
    fn default() -> Self {
        Self {
            time_limit: Duration::from_secs(10),
            max_states: 1 << 22,
        }
    }
}

/// The outcome of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every partition has a linearization.
    Linearizable,
    /// The partition over `keys` has no linearization.
    NotLinearizable {
        /// The partition's keys.
        keys: Vec<Key>,
        /// How far the search got.
        explanation: Explanation,
    },
    /// The search hit a bound before deciding.
    Unknown {
        /// Which bound, and where.
        reason: UnknownReason,
    },
}

impl Verdict {
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
    pub fn describe<C: HistoryCall>(&self, history: &History<C>) -> String {
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

impl fmt::Display for Verdict {
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

/// What the search learned about a partition that has no linearization:
/// the longest sequence it could build, and the operation that then had to
/// come next but could not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// Positions in [`History::operations`] of the longest valid
    /// linearization prefix found, in linearization order.
    pub longest_prefix: Vec<usize>,
    /// The present keys after that prefix (the others are absent).
    pub state_after_prefix: Vec<KeyState>,
    /// The completed operation whose response forced it to be linearized
    /// next, although neither it nor any other pending operation could take
    /// effect in a way that led on; `None` only for a partition with nothing
    /// to place.
    pub blocked: Option<usize>,
}

impl Explanation {
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

impl fmt::Display for Explanation {
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
pub enum UnknownReason {
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

impl fmt::Display for UnknownReason {
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

/// Counters from one call to [`check_with_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Partitions searched.
    pub partitions: usize,
    /// Configurations memoised, summed over the partitions searched.
    pub states: usize,
    /// The largest memo table of any one partition.
    pub max_partition_states: usize,
    /// Operations dropped because they constrain nothing (unknown
    /// outcomes that cannot write).
    pub dropped: usize,
    /// Wall-clock time spent.
    pub elapsed: Duration,
}

/// A kind of call the search decides: how a history of them splits into
/// partitions, and the model each is searched against.
pub trait Linearizable: HistoryCall {
    /// Decides `history` within `bounds`, with counters describing the
    /// search.
    fn check_with_stats(history: &History<Self>, bounds: &Bounds) -> (Verdict, SearchStats);
}

/// Decides whether `history` is linearizable within `bounds`.
pub fn check<C: Linearizable>(history: &History<C>, bounds: &Bounds) -> Verdict {
    check_with_stats(history, bounds).0
}

/// [`check`], with counters describing the search.
pub fn check_with_stats<C: Linearizable>(
    history: &History<C>,
    bounds: &Bounds,
) -> (Verdict, SearchStats) {
    C::check_with_stats(history, bounds)
}

/// A partition's model as the verdict reads it: the present keys of a
/// state the search reached.
pub(crate) trait ReadState {
    /// The present keys of `state` and their values.
    fn read_state(&self, state: u32) -> Vec<KeyState>;
}

/// One partition, compiled for the search.
pub(crate) struct Partition<'h, M> {
    /// Its keys, sorted.
    pub keys: Vec<&'h [u8]>,
    /// The history position of each of its operations (local index =
    /// position here).
    pub origin: Vec<usize>,
    /// The operations' intervals, by local index.
    pub intervals: Vec<Interval>,
    /// What the operations do.
    pub model: M,
    /// The state everything starts in.
    pub initial: u32,
}

/// The intervals of a partition's operations, in order, each given with
/// its class key: unknown-outcome operations with equal keys are
/// interchangeable (the model gives them the same effect in every state).
pub(crate) fn intervals<'o, C, R, K>(
    ops: impl IntoIterator<Item = (&'o Operation<C, R>, K)>,
) -> Vec<Interval>
where
    C: 'o,
    R: 'o,
    K: Eq + Hash,
{
    let mut classes: HashMap<K, u32> = HashMap::new();
    ops.into_iter()
        .map(|(op, key)| {
            let class = (!op.is_complete()).then(|| {
                let next = u32::try_from(classes.len()).unwrap_or(u32::MAX - 1);
                *classes.entry(key).or_insert(next)
            });
            Interval {
                invoke_ns: op.invoke_ns,
                complete_ns: op.known_complete_ns(),
                class,
            }
        })
        .collect()
}

/// Searches `partitions` in order (smallest first) within `bounds`, the
/// budget counted from `started`; `dropped` operations were left out as
/// constraining nothing. The first partition proved not linearizable is
/// the verdict; a time limit stops the rest (each would stop at its first
/// clock check), a state limit only its partition.
pub(crate) fn search_partitions<'h, M: Model + ReadState>(
    started: Instant,
    bounds: &Bounds,
    dropped: usize,
    partitions: impl IntoIterator<Item = Partition<'h, M>>,
) -> (Verdict, SearchStats) {
    let deadline = started.checked_add(bounds.time_limit);
    let mut stats = SearchStats {
        dropped,
        ..SearchStats::default()
    };
    let mut undecided = None;
    for mut partition in partitions {
        stats.partitions += 1;
        let mut search = Search::new(&partition.intervals);
        let outcome = search.run(
            &mut partition.model,
            partition.initial,
            deadline,
            bounds.max_states,
        );
        let states = search.states();
        stats.states += states;
        stats.max_partition_states = stats.max_partition_states.max(states);
        let keys = || partition.keys.iter().map(|k| k.to_vec()).collect();
        match outcome {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable(failure) => {
                stats.elapsed = started.elapsed();
                let origin =
                    |local: usize| partition.origin.get(local).copied().unwrap_or(usize::MAX);
                let explanation = Explanation {
                    longest_prefix: failure.longest_prefix.iter().map(|&l| origin(l)).collect(),
                    state_after_prefix: partition.model.read_state(failure.state_after_prefix),
                    blocked: failure.blocked.map(origin),
                };
                let verdict = Verdict::NotLinearizable {
                    keys: keys(),
                    explanation,
                };
                return (verdict, stats);
            }
            Outcome::OutOfTime => {
                undecided.get_or_insert(UnknownReason::TimeLimit {
                    keys: keys(),
                    limit: bounds.time_limit,
                });
                break;
            }
            Outcome::OutOfStates => {
                undecided.get_or_insert(UnknownReason::StateLimit {
                    keys: keys(),
                    max_states: bounds.max_states,
                });
            }
        }
    }
    stats.elapsed = started.elapsed();
    let verdict = match undecided {
        None => Verdict::Linearizable,
        Some(reason) => Verdict::Unknown { reason },
    };
    (verdict, stats)
}
