//! The linearizability search for keyed registers with compare-and-set.
//!
//! [`check`] decides whether a [`History`] could have come from a single
//! copy of every register, each operation taking effect at one instant
//! between its invocation and its response. It follows the Wing–Gong
//! algorithm as refined by Lowe and by Porcupine:
//!
//! * **P-compositionality.** Registers are independent, so the history is
//!   split per key and each partition is checked alone, smallest first; the
//!   whole is linearizable exactly when every partition is.
//! * **The search.** Each partition goes through [`crate::search`] (entry
//!   list, depth-first walk, memo table of configurations) with the
//!   register model below: the state is the register's interned value.
//! * **Unknown outcomes.** An operation whose outcome is unknown may be
//!   linearized at any point after its call, or never. Unknown reads
//!   constrain nothing and are dropped up front.
//!
//! The search is bounded by a wall-clock budget and by the number of
//! memoised configurations ([`Bounds`]); a search that hits either bound
//! reports [`Verdict::Unknown`], never a pass.

use crate::history::{Call, History, Key, Operation, Output, Value};
use crate::search::{Interval, Model, Outcome, Search};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

/// Limits on one call to [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Wall-clock budget for the whole history, all partitions together.
    pub time_limit: Duration,
    /// Most configurations memoised for one partition. Each costs
    /// `8 * (2 + ⌈n / 64⌉)` bytes for a partition of `n` operations, plus
    /// about 8 bytes of table slots.
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
    /// The register at `key` has no linearization.
    NotLinearizable {
        /// The register whose operations cannot be ordered.
        key: Key,
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
    pub fn describe(&self, history: &History) -> String {
        match self {
            Self::NotLinearizable { key, explanation } => {
                let mut text =
                    format!("not linearizable on key {}\n", String::from_utf8_lossy(key));
                explanation.write_details(&mut text, history);
                text
            }
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Linearizable => f.write_str("linearizable"),
            Self::NotLinearizable { key, explanation } => write!(
                f,
                "not linearizable on key {}: {explanation}",
                String::from_utf8_lossy(key)
            ),
            Self::Unknown { reason } => write!(f, "unknown: {reason}"),
        }
    }
}

/// What the search learned about a register that has no linearization:
/// the longest sequence it could build, and the operation that then had to
/// come next but could not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// Positions in [`History::operations`] of the longest valid
    /// linearization prefix found, in linearization order.
    pub longest_prefix: Vec<usize>,
    /// The register's value after that prefix (`None`: absent).
    pub value_after_prefix: Option<Value>,
    /// The completed operation whose response forced it to be linearized
    /// next, although neither it nor any other pending operation could take
    /// effect in a way that led on; `None` only for a partition with nothing
    /// to place.
    pub blocked: Option<usize>,
}

impl Explanation {
    fn write_details(&self, text: &mut String, history: &History) {
        use std::fmt::Write as _;
        let ops = history.operations();
        let _ = writeln!(
            text,
            "longest linearizable prefix ({} operations):",
            self.longest_prefix.len()
        );
        for &index in &self.longest_prefix {
            if let Some(op) = ops.get(index) {
                let _ = writeln!(text, "  #{index}: {op}");
            }
        }
        let value = self.value_after_prefix.as_deref().map_or_else(
            || "nil".to_owned(),
            |v| String::from_utf8_lossy(v).into_owned(),
        );
        let _ = writeln!(text, "value after it: {value}");
        if let Some((index, op)) = self
            .blocked
            .and_then(|index| ops.get(index).map(|op| (index, op)))
        {
            let _ = writeln!(text, "then #{index} cannot be placed: {op}");
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at most {} operations linearize (value then {})",
            self.longest_prefix.len(),
            self.value_after_prefix
                .as_deref()
                .map_or_else(|| "nil".into(), String::from_utf8_lossy)
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
    /// The wall-clock budget ran out while checking `key`.
    TimeLimit {
        /// The register being checked.
        key: Key,
        /// The budget.
        limit: Duration,
    },
    /// The memo table for `key` reached its cap.
    StateLimit {
        /// The register being checked.
        key: Key,
        /// The cap.
        max_states: usize,
    },
}

impl fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimeLimit { key, limit } => write!(
                f,
                "time limit of {limit:?} reached while checking key {}",
                String::from_utf8_lossy(key)
            ),
            Self::StateLimit { key, max_states } => write!(
                f,
                "state limit of {max_states} reached while checking key {}",
                String::from_utf8_lossy(key)
            ),
        }
    }
}

/// Counters from one call to [`check_with_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Partitions (keys) searched.
    pub partitions: usize,
    /// Configurations memoised, summed over the partitions searched.
    pub states: usize,
    /// The largest memo table of any one partition.
    pub max_partition_states: usize,
    /// Operations dropped because they constrain nothing (unknown reads).
    pub dropped: usize,
    /// Wall-clock time spent.
    pub elapsed: Duration,
}

/// Decides whether `history` is linearizable within `bounds`.
pub fn check(history: &History, bounds: &Bounds) -> Verdict {
    check_with_stats(history, bounds).0
}

/// [`check`], with counters describing the search.
pub fn check_with_stats(history: &History, bounds: &Bounds) -> (Verdict, SearchStats) {
    let started = Instant::now();
    let deadline = started.checked_add(bounds.time_limit);
    let mut stats = SearchStats::default();

    let mut by_key: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    for (index, op) in history.operations().iter().enumerate() {
        if matches!(op.call, Call::Read) && op.output.is_none() {
            stats.dropped += 1;
            continue;
        }
        by_key.entry(op.key.as_slice()).or_default().push(index);
    }
    let mut partitions: Vec<(&[u8], Vec<usize>)> = by_key.into_iter().collect();
    // Stable: equal sizes stay in key order.
    partitions.sort_by_key(|(_, ops)| ops.len());

    let mut undecided = None;
    for (key, indices) in partitions {
        stats.partitions += 1;
        let (mut model, intervals) = compile(history.operations(), &indices);
        let mut search = Search::new(&intervals);
        let outcome = search.run(&mut model, ABSENT, deadline, bounds.max_states);
        let states = search.states();
        stats.states += states;
        stats.max_partition_states = stats.max_partition_states.max(states);
        match outcome {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable(failure) => {
                stats.elapsed = started.elapsed();
                let origin = |local: usize| indices.get(local).copied().unwrap_or(usize::MAX);
                let explanation = Explanation {
                    longest_prefix: failure.longest_prefix.iter().map(|&l| origin(l)).collect(),
                    value_after_prefix: model.value_of(failure.state_after_prefix),
                    blocked: failure.blocked.map(origin),
                };
                let verdict = Verdict::NotLinearizable {
                    key: key.to_vec(),
                    explanation,
                };
                return (verdict, stats);
            }
            Outcome::OutOfTime => {
                undecided.get_or_insert(UnknownReason::TimeLimit {
                    key: key.to_vec(),
                    limit: bounds.time_limit,
                });
                // Every later partition would stop at its first clock check.
                break;
            }
            Outcome::OutOfStates => {
                undecided.get_or_insert(UnknownReason::StateLimit {
                    key: key.to_vec(),
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

/// The register value encoding used inside the search: 0 is "absent", and
/// `n > 0` is the `n`-th distinct value of the partition.
type State = u32;

const ABSENT: State = 0;

/// An operation compiled against the partition's interned values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// A read that returned this value.
    Read(State),
    /// A write, acknowledged or of unknown outcome.
    Write(State),
    /// A compare-and-set that swapped.
    CasSwapped { expected: State, new: State },
    /// A compare-and-set that reported a failed comparison.
    CasKept { expected: State },
    /// A compare-and-set of unknown outcome; linearizing it only makes
    /// sense where it swaps, since a no-op is the same as leaving it out.
    CasMaybe { expected: State, new: State },
}

impl Step {
    fn apply(self, state: State) -> Option<State> {
        match self {
            Self::Read(value) => (state == value).then_some(state),
            Self::Write(value) => Some(value),
            Self::CasSwapped { expected, new } | Self::CasMaybe { expected, new } => {
                (state == expected).then_some(new)
            }
            Self::CasKept { expected } => (state != expected).then_some(state),
        }
    }
}

/// The register model of one partition: its compiled steps and interned
/// values (state `n` is `values[n - 1]`).
struct Register {
    steps: Vec<Step>,
    values: Vec<Value>,
}

impl Register {
    fn value_of(&self, state: State) -> Option<Value> {
        let index = usize::try_from(state).ok()?.checked_sub(1)?;
        self.values.get(index).cloned()
    }
}

impl Model for Register {
    fn step(&mut self, local: usize, state: u32, _choice: u32) -> Option<u32> {
        self.steps.get(local)?.apply(state)
    }
}

/// Compiles the operations of one partition (history positions
/// `origin`) into the register model and their intervals.
fn compile(operations: &[Operation], origin: &[usize]) -> (Register, Vec<Interval>) {
    let mut interned: HashMap<Value, State> = HashMap::new();
    let mut values: Vec<Value> = Vec::new();
    let mut intern = |value: &[u8]| -> State {
        if let Some(&state) = interned.get(value) {
            return state;
        }
        values.push(value.to_vec());
        // At most two values per operation, and History caps the
        // operation count well below u32::MAX / 2.
        let state = State::try_from(values.len()).unwrap_or(State::MAX);
        interned.insert(value.to_vec(), state);
        state
    };
    let mut steps = Vec::with_capacity(origin.len());
    let mut intervals = Vec::with_capacity(origin.len());
    // Unknown operations with the same step are interchangeable.
    let mut classes: HashMap<Step, u32> = HashMap::new();
    for &index in origin {
        let Some(op) = operations.get(index) else {
            continue;
        };
        let step = match (&op.call, &op.output) {
            (Call::Read, Some(Output::Read(value))) => {
                Step::Read(value.as_deref().map_or(ABSENT, &mut intern))
            }
            (Call::Write(value), _) => Step::Write(intern(value)),
            (Call::Cas { expected, new }, output) => {
                let expected = expected.as_deref().map_or(ABSENT, &mut intern);
                let new = intern(new);
                match output {
                    Some(Output::Cas { swapped: false }) => Step::CasKept { expected },
                    None => Step::CasMaybe { expected, new },
                    _ => Step::CasSwapped { expected, new },
                }
            }
            // Unknown reads are filtered out by the caller and History
            // rules out mismatched outputs; treat anything else as a
            // read of absent so the search stays total.
            (Call::Read, _) => Step::Read(ABSENT),
        };
        steps.push(step);
        let class = op.output.is_none().then(|| {
            let next = u32::try_from(classes.len()).unwrap_or(u32::MAX - 1);
            *classes.entry(step).or_insert(next)
        });
        intervals.push(Interval {
            invoke_ns: op.invoke_ns,
            complete_ns: op.output.as_ref().and(op.complete_ns),
            class,
        });
    }
    (Register { steps, values }, intervals)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"x";

    fn v(value: u32) -> Value {
        value.to_string().into_bytes()
    }

    fn op(client: u64, call: Call, output: Option<Output>, at: (u64, Option<u64>)) -> Operation {
        Operation {
            client,
            key: KEY.to_vec(),
            call,
            output,
            invoke_ns: at.0,
            complete_ns: at.1,
        }
    }

    fn write(client: u64, value: u32, invoke: u64, complete: u64) -> Operation {
        op(
            client,
            Call::Write(v(value)),
            Some(Output::Write),
            (invoke, Some(complete)),
        )
    }

    fn write_unknown(client: u64, value: u32, invoke: u64) -> Operation {
        op(client, Call::Write(v(value)), None, (invoke, None))
    }

    fn read(client: u64, value: Option<u32>, invoke: u64, complete: u64) -> Operation {
        op(
            client,
            Call::Read,
            Some(Output::Read(value.map(v))),
            (invoke, Some(complete)),
        )
    }

    fn cas(
        client: u64,
        from: Option<u32>,
        to: u32,
        swapped: Option<bool>,
        at: (u64, u64),
    ) -> Operation {
        let call = Call::Cas {
            expected: from.map(v),
            new: v(to),
        };
        match swapped {
            Some(swapped) => op(
                client,
                call,
                Some(Output::Cas { swapped }),
                (at.0, Some(at.1)),
            ),
            None => op(client, call, None, (at.0, None)),
        }
    }

    fn verdict(ops: Vec<Operation>) -> Verdict {
        let history = History::new(ops).expect("valid history");
        check(&history, &Bounds::default())
    }

    #[test]
    fn empty_history_is_linearizable() {
        assert_eq!(verdict(vec![]), Verdict::Linearizable);
    }

    #[test]
    fn sequential_write_then_read_is_linearizable() {
        let ops = vec![write(1, 1, 0, 1), read(2, Some(1), 2, 3)];
        assert_eq!(verdict(ops), Verdict::Linearizable);
    }

    #[test]
    fn stale_read_after_completed_write_is_not_linearizable() {
        let ops = vec![write(1, 1, 0, 1), write(1, 2, 2, 3), read(2, Some(1), 4, 5)];
        let result = verdict(ops.clone());
        let Verdict::NotLinearizable { key, explanation } = &result else {
            panic!("expected a violation, got {result}");
        };
        assert_eq!(key, KEY);
        assert_eq!(explanation.longest_prefix, vec![0, 1]);
        assert_eq!(explanation.value_after_prefix, Some(v(2)));
        assert_eq!(explanation.blocked, Some(2));
        let history = History::new(ops).expect("valid history");
        let text = result.describe(&history);
        assert!(
            text.contains("then #2 cannot be placed: client 2 read on \"x\" => \"1\""),
            "{text}"
        );
    }

    #[test]
    fn read_of_absent_after_write_is_not_linearizable() {
        let ops = vec![write(1, 1, 0, 1), read(2, None, 2, 3)];
        assert!(verdict(ops).is_not_linearizable());
    }

    #[test]
    fn concurrent_write_and_read_may_go_either_way() {
        // The read overlaps the write, so it may see the old or new value.
        let old = vec![write(1, 1, 0, 10), read(2, None, 1, 5)];
        let new = vec![write(1, 1, 0, 10), read(2, Some(1), 1, 5)];
        assert_eq!(verdict(old), Verdict::Linearizable);
        assert_eq!(verdict(new), Verdict::Linearizable);
    }

    #[test]
    fn reads_must_agree_on_the_order_of_concurrent_writes() {
        // Two overlapping writes; two later sequential reads see 1 then 2
        // (fine), but 2 then 1 is impossible once both writes completed.
        let fine = vec![
            write(1, 1, 0, 10),
            write(2, 2, 0, 10),
            read(3, Some(2), 11, 12),
            read(3, Some(2), 13, 14),
        ];
        let flip = vec![
            write(1, 1, 0, 10),
            write(2, 2, 0, 10),
            read(3, Some(2), 11, 12),
            read(3, Some(1), 13, 14),
        ];
        assert_eq!(verdict(fine), Verdict::Linearizable);
        assert!(verdict(flip).is_not_linearizable());
    }

    #[test]
    fn unknown_write_seen_by_a_later_read_is_linearizable() {
        let ops = vec![
            write(1, 1, 0, 1),
            write_unknown(2, 2, 2),
            read(3, Some(1), 3, 4),
            read(3, Some(2), 5, 6),
        ];
        assert_eq!(verdict(ops), Verdict::Linearizable);
    }

    #[test]
    fn unknown_write_may_never_happen() {
        let ops = vec![
            write(1, 1, 0, 1),
            write_unknown(2, 2, 2),
            read(3, Some(1), 3, 4),
            read(3, Some(1), 100, 101),
        ];
        assert_eq!(verdict(ops), Verdict::Linearizable);
    }

    #[test]
    fn unknown_write_cannot_take_effect_before_its_invocation() {
        let ops = vec![
            write(1, 1, 0, 1),
            read(3, Some(2), 2, 3),
            write_unknown(2, 2, 4),
        ];
        assert!(verdict(ops).is_not_linearizable());
    }

    #[test]
    fn unknown_write_takes_effect_at_most_once() {
        // 2 cannot come back after being overwritten by 3, since the only
        // write of 2 happened once.
        let ops = vec![
            write_unknown(1, 2, 0),
            read(2, Some(2), 1, 2),
            write(2, 3, 3, 4),
            read(2, Some(2), 5, 6),
        ];
        assert!(verdict(ops).is_not_linearizable());
    }

    #[test]
    fn cas_from_a_value_never_written_is_not_linearizable() {
        let ops = vec![write(1, 1, 0, 1), cas(2, Some(7), 3, Some(true), (2, 3))];
        assert!(verdict(ops).is_not_linearizable());
    }

    #[test]
    fn cas_chain_is_linearizable() {
        let ops = vec![
            cas(1, None, 1, Some(true), (0, 1)),
            cas(2, Some(1), 2, Some(true), (2, 3)),
            cas(1, Some(1), 5, Some(false), (4, 5)),
            read(3, Some(2), 6, 7),
        ];
        assert_eq!(verdict(ops), Verdict::Linearizable);
    }

    #[test]
    fn failed_cas_claims_the_comparison_failed() {
        // The register certainly holds 1, so a failed cas from 1 is wrong.
        let ops = vec![write(1, 1, 0, 1), cas(2, Some(1), 2, Some(false), (2, 3))];
        assert!(verdict(ops).is_not_linearizable());
    }

    #[test]
    fn unknown_cas_takes_effect_only_when_it_matches() {
        let seen = vec![
            write(1, 1, 0, 1),
            cas(2, Some(1), 2, None, (2, 0)),
            read(3, Some(2), 3, 4),
        ];
        let impossible = vec![
            write(1, 1, 0, 1),
            cas(2, Some(5), 2, None, (2, 0)),
            read(3, Some(2), 3, 4),
        ];
        assert_eq!(verdict(seen), Verdict::Linearizable);
        assert!(verdict(impossible).is_not_linearizable());
    }

    #[test]
    fn keys_are_checked_independently() {
        let mut ops = vec![write(1, 1, 0, 1), read(2, Some(1), 2, 3)];
        let mut other = vec![write(3, 1, 0, 1), write(3, 2, 2, 3), read(4, Some(1), 4, 5)];
        for op in &mut other {
            op.key = b"y".to_vec();
        }
        ops.append(&mut other);
        let result = verdict(ops);
        assert!(
            matches!(&result, Verdict::NotLinearizable { key, .. } if key == b"y"),
            "{result}"
        );
    }

    #[test]
    fn unknown_reads_are_dropped() {
        let ops = vec![
            write(1, 1, 0, 1),
            op(2, Call::Read, None, (2, None)),
            read(3, Some(1), 3, 4),
        ];
        let history = History::new(ops).expect("valid history");
        let (result, stats) = check_with_stats(&history, &Bounds::default());
        assert_eq!(result, Verdict::Linearizable);
        assert_eq!(stats.dropped, 1);
    }

    #[test]
    fn equal_times_count_as_concurrent() {
        // The read starts at the instant the write completes: it may still
        // see the old value.
        let ops = vec![write(1, 1, 0, 5), read(2, None, 5, 6)];
        assert_eq!(verdict(ops), Verdict::Linearizable);
    }

    fn many_concurrent_writes(count: u32) -> History {
        let mut ops: Vec<Operation> = (0..count)
            .map(|i| write(u64::from(i), i, 0, 1000))
            .collect();
        // A read that only the last-placed write can satisfy, forcing the
        // search through many orders.
        ops.push(read(99, Some(count + 1), 1001, 1002));
        History::new(ops).expect("valid history")
    }

    #[test]
    fn state_bound_yields_unknown() {
        let history = many_concurrent_writes(12);
        let bounds = Bounds {
            max_states: 8,
            ..Bounds::default()
        };
        let result = check(&history, &bounds);
        assert!(
            matches!(
                &result,
                Verdict::Unknown {
                    reason: UnknownReason::StateLimit { max_states: 8, .. }
                }
            ),
            "{result}"
        );
    }

    #[test]
    fn time_bound_yields_unknown() {
        let history = many_concurrent_writes(12);
        let bounds = Bounds {
            time_limit: Duration::ZERO,
            ..Bounds::default()
        };
        let result = check(&history, &bounds);
        assert!(
            matches!(
                &result,
                Verdict::Unknown {
                    reason: UnknownReason::TimeLimit { .. }
                }
            ),
            "{result}"
        );
    }

    #[test]
    fn memo_prunes_orderings_of_concurrent_writes() {
        // Without memoisation this would walk 12! orderings.
        let history = many_concurrent_writes(12);
        let (result, stats) = check_with_stats(&history, &Bounds::default());
        assert!(result.is_not_linearizable(), "{result}");
        assert!(stats.states < 1 << 16, "{stats:?}");
    }
}
