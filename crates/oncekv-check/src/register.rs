//! Keyed registers with compare-and-set: their calls, and their instance
//! of the linearizability core.
//!
//! A register [`Call`] reads, writes or compare-and-sets one key; its
//! [`Output`] is what the client was told. A [`History`] of them is what
//! [`crate::jepsen`] reads from the Jepsen etcd logs. For
//! [`crate::linearizability::check`]:
//!
//! * **Partitions.** Registers are independent, so the history is split
//!   per key, smallest first.
//! * **The model.** The state is the register's interned value (0:
//!   absent); unknown reads constrain nothing and are dropped up front.

use crate::history::{History, HistoryCall, HistoryError, Key, Operation, Value};
use crate::linearizability::{
    Bounds, KeyState, Linearizable, Partition, ReadState, SearchStats, Verdict, intervals,
    search_partitions,
};
use crate::search::{Interner, Model};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

/// What a client asked of the register at `key`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Read the current value.
    Read {
        /// The register.
        key: Key,
    },
    /// Overwrite the value.
    Write {
        /// The register.
        key: Key,
        /// The value written.
        value: Value,
    },
    /// Compare-and-set: when the current value equals `expected` (`None`:
    /// the key is absent), replace it with `new`.
    Cas {
        /// The register.
        key: Key,
        /// The value the register must hold for the swap to happen.
        expected: Option<Value>,
        /// The value written when it does.
        new: Value,
    },
}

impl Call {
    /// The register the call touches.
    pub fn key(&self) -> &[u8] {
        match self {
            Self::Read { key } | Self::Write { key, .. } | Self::Cas { key, .. } => key,
        }
    }
}

/// What a client was told when its operation completed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// A read returned this value (`None`: the key was absent).
    Read(Option<Value>),
    /// A write was acknowledged.
    Write,
    /// A compare-and-set completed; `swapped` says whether it replaced the
    /// value. A `false` here is a claim that the comparison failed.
    Cas {
        /// Whether the value was replaced.
        swapped: bool,
    },
}

/// One register operation.
pub type RegisterOperation = Operation<Call, Output>;

impl HistoryCall for Call {
    type Output = Output;

    fn check_output(&self, output: Option<&Output>, index: usize) -> Result<(), HistoryError> {
        match (self, output) {
            (_, None)
            | (Self::Read { .. }, Some(Output::Read(_)))
            | (Self::Write { .. }, Some(Output::Write))
            | (Self::Cas { .. }, Some(Output::Cas { .. })) => Ok(()),
            _ => Err(HistoryError::OutputMismatch { index }),
        }
    }
}

fn fmt_value(f: &mut fmt::Formatter<'_>, value: Option<&[u8]>) -> fmt::Result {
    match value {
        None => f.write_str("nil"),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => write!(f, "{text:?}"),
            Err(_) => {
                f.write_str("0x")?;
                bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        },
    }
}

/// `read on "k"`, `write "1" on "k"`, `cas nil -> "7" on "k"`.
impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { .. } => f.write_str("read")?,
            Self::Write { value, .. } => {
                f.write_str("write ")?;
                fmt_value(f, Some(value))?;
            }
            Self::Cas { expected, new, .. } => {
                f.write_str("cas ")?;
                fmt_value(f, expected.as_deref())?;
                f.write_str(" -> ")?;
                fmt_value(f, Some(new))?;
            }
        }
        f.write_str(" on ")?;
        fmt_value(f, Some(self.key()))
    }
}

/// The value read, `ok`, `swapped` or `not swapped`.
impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(value) => fmt_value(f, value.as_deref()),
            Self::Write => f.write_str("ok"),
            Self::Cas { swapped: true } => f.write_str("swapped"),
            Self::Cas { swapped: false } => f.write_str("not swapped"),
        }
    }
}

impl Linearizable for Call {
    fn check_with_stats(history: &History<Self>, bounds: &Bounds) -> (Verdict, SearchStats) {
        let started = Instant::now();
        let mut dropped = 0;
        let mut by_key: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
        for (index, op) in history.operations().iter().enumerate() {
            if matches!(op.call, Call::Read { .. }) && op.output.is_none() {
                dropped += 1;
                continue;
            }
            by_key.entry(op.call.key()).or_default().push(index);
        }
        let mut partitions: Vec<(&[u8], Vec<usize>)> = by_key.into_iter().collect();
        // Stable: equal sizes stay in key order.
        partitions.sort_by_key(|(_, ops)| ops.len());
        let compiled = partitions
            .into_iter()
            .map(|(key, origin)| compile(history.operations(), key, origin));
        search_partitions(started, bounds, dropped, compiled)
    }
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

/// The register model of one partition: its key, its compiled steps and
/// interned values (state `n` is value id `n - 1`).
struct Register<'h> {
    key: &'h [u8],
    steps: Vec<Step>,
    values: Interner<Value>,
}

impl ReadState for Register<'_> {
    fn read_state(&self, state: u32) -> Vec<KeyState> {
        let value = state
            .checked_sub(1)
            .and_then(|id| self.values.get(id))
            .cloned();
        value
            .map(|value| KeyState {
                key: self.key.to_vec(),
                value,
                length_only: false,
            })
            .into_iter()
            .collect()
    }
}

impl Model for Register<'_> {
    fn step(&mut self, local: usize, state: u32, _choice: u32) -> Option<u32> {
        self.steps.get(local)?.apply(state)
    }
}

/// Compiles the operations of the partition `key` (history positions
/// `origin`) into the register model and their intervals.
fn compile<'h>(
    operations: &'h [RegisterOperation],
    key: &'h [u8],
    origin: Vec<usize>,
) -> Partition<'h, Register<'h>> {
    let mut values = Interner::new();
    // At most two values per operation, and History caps the operation
    // count well below u32::MAX / 2.
    let mut intern = |value: &[u8]| -> State { values.intern(value.to_vec()).saturating_add(1) };
    let ops: Vec<&RegisterOperation> = origin.iter().filter_map(|&i| operations.get(i)).collect();
    let steps: Vec<Step> = ops
        .iter()
        .map(|op| match (&op.call, &op.output) {
            (Call::Read { .. }, Some(Output::Read(value))) => {
                Step::Read(value.as_deref().map_or(ABSENT, &mut intern))
            }
            (Call::Write { value, .. }, _) => Step::Write(intern(value)),
            (Call::Cas { expected, new, .. }, output) => {
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
            (Call::Read { .. }, _) => Step::Read(ABSENT),
        })
        .collect();
    // Unknown operations with the same step are interchangeable.
    let intervals = intervals(ops.iter().copied().zip(steps.iter().copied()));
    Partition {
        keys: vec![key],
        origin,
        intervals,
        model: Register { key, steps, values },
        initial: ABSENT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::{UnknownReason, check, check_with_stats};
    use std::time::Duration;

    const KEY: &[u8] = b"x";

    fn v(value: u32) -> Value {
        value.to_string().into_bytes()
    }

    fn op(
        client: u64,
        call: Call,
        output: Option<Output>,
        at: (u64, Option<u64>),
    ) -> RegisterOperation {
        Operation {
            client,
            call,
            output,
            invoke_ns: at.0,
            complete_ns: at.1,
        }
    }

    fn write_call(value: u32) -> Call {
        Call::Write {
            key: KEY.to_vec(),
            value: v(value),
        }
    }

    fn read_call() -> Call {
        Call::Read { key: KEY.to_vec() }
    }

    fn write(client: u64, value: u32, invoke: u64, complete: u64) -> RegisterOperation {
        op(
            client,
            write_call(value),
            Some(Output::Write),
            (invoke, Some(complete)),
        )
    }

    fn write_unknown(client: u64, value: u32, invoke: u64) -> RegisterOperation {
        op(client, write_call(value), None, (invoke, None))
    }

    fn read(client: u64, value: Option<u32>, invoke: u64, complete: u64) -> RegisterOperation {
        op(
            client,
            read_call(),
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
    ) -> RegisterOperation {
        let call = Call::Cas {
            key: KEY.to_vec(),
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

    fn verdict(ops: Vec<RegisterOperation>) -> Verdict {
        let history = History::new(ops).expect("valid history");
        check(&history, &Bounds::default())
    }

    fn accepted(ops: Vec<RegisterOperation>) {
        let result = verdict(ops);
        assert_eq!(result, Verdict::Linearizable, "{result}");
    }

    fn refused(ops: Vec<RegisterOperation>) {
        let result = verdict(ops);
        assert!(result.is_not_linearizable(), "{result}");
    }

    #[test]
    fn displays_operations() {
        let cas = op(
            1,
            Call::Cas {
                key: KEY.to_vec(),
                expected: None,
                new: b"7".to_vec(),
            },
            Some(Output::Cas { swapped: true }),
            (3, Some(4)),
        );
        assert_eq!(
            cas.to_string(),
            "client 1 cas nil -> \"7\" on \"x\" => swapped [3, 4]"
        );
        let unknown = op(
            1,
            Call::Write {
                key: KEY.to_vec(),
                value: vec![0xff],
            },
            None,
            (3, Some(4)),
        );
        assert_eq!(
            unknown.to_string(),
            "client 1 write 0xff on \"x\" => unknown [3, inf)"
        );
    }

    #[test]
    fn empty_history_is_linearizable() {
        assert_eq!(verdict(vec![]), Verdict::Linearizable);
    }

    #[test]
    fn sequential_write_then_read_is_linearizable() {
        accepted(vec![write(1, 1, 0, 1), read(2, Some(1), 2, 3)]);
    }

    #[test]
    fn stale_read_after_completed_write_is_not_linearizable() {
        let ops = vec![write(1, 1, 0, 1), write(1, 2, 2, 3), read(2, Some(1), 4, 5)];
        let result = verdict(ops.clone());
        let Verdict::NotLinearizable { keys, explanation } = &result else {
            panic!("expected a violation, got {result}");
        };
        assert_eq!(keys, &[KEY.to_vec()]);
        assert_eq!(explanation.longest_prefix, vec![0, 1]);
        assert_eq!(
            explanation.state_after_prefix,
            vec![KeyState {
                key: KEY.to_vec(),
                value: v(2),
                length_only: false,
            }]
        );
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
        refused(vec![write(1, 1, 0, 1), read(2, None, 2, 3)]);
    }

    #[test]
    fn concurrent_write_and_read_may_go_either_way() {
        // The read overlaps the write, so it may see the old or new value.
        let old = vec![write(1, 1, 0, 10), read(2, None, 1, 5)];
        let new = vec![write(1, 1, 0, 10), read(2, Some(1), 1, 5)];
        accepted(old);
        accepted(new);
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
        accepted(fine);
        refused(flip);
    }

    #[test]
    fn unknown_write_may_happen_or_never_happen() {
        // Read later, or never seen at all: either is linearizable.
        let before = [
            write(1, 1, 0, 1),
            write_unknown(2, 2, 2),
            read(3, Some(1), 3, 4),
        ];
        let mut seen = before.to_vec();
        seen.push(read(3, Some(2), 5, 6));
        accepted(seen);
        let mut never = before.to_vec();
        never.push(read(3, Some(1), 100, 101));
        accepted(never);
    }

    #[test]
    fn unknown_write_cannot_take_effect_before_its_invocation() {
        refused(vec![
            write(1, 1, 0, 1),
            read(3, Some(2), 2, 3),
            write_unknown(2, 2, 4),
        ]);
    }

    #[test]
    fn unknown_write_takes_effect_at_most_once() {
        // 2 cannot come back after being overwritten by 3, since the only
        // write of 2 happened once.
        refused(vec![
            write_unknown(1, 2, 0),
            read(2, Some(2), 1, 2),
            write(2, 3, 3, 4),
            read(2, Some(2), 5, 6),
        ]);
    }

    #[test]
    fn cas_from_a_value_never_written_is_not_linearizable() {
        refused(vec![
            write(1, 1, 0, 1),
            cas(2, Some(7), 3, Some(true), (2, 3)),
        ]);
    }

    #[test]
    fn cas_chain_is_linearizable() {
        accepted(vec![
            cas(1, None, 1, Some(true), (0, 1)),
            cas(2, Some(1), 2, Some(true), (2, 3)),
            cas(1, Some(1), 5, Some(false), (4, 5)),
            read(3, Some(2), 6, 7),
        ]);
    }

    #[test]
    fn failed_cas_claims_the_comparison_failed() {
        // The register certainly holds 1, so a failed cas from 1 is wrong.
        refused(vec![
            write(1, 1, 0, 1),
            cas(2, Some(1), 2, Some(false), (2, 3)),
        ]);
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
        accepted(seen);
        refused(impossible);
    }

    #[test]
    fn keys_are_checked_independently() {
        let mut ops = vec![write(1, 1, 0, 1), read(2, Some(1), 2, 3)];
        let mut other = vec![write(3, 1, 0, 1), write(3, 2, 2, 3), read(4, Some(1), 4, 5)];
        for op in &mut other {
            match &mut op.call {
                Call::Read { key } | Call::Write { key, .. } | Call::Cas { key, .. } => {
                    *key = b"y".to_vec();
                }
            }
        }
        ops.append(&mut other);
        let result = verdict(ops);
        assert!(
            matches!(&result, Verdict::NotLinearizable { keys, .. } if keys == &[b"y".to_vec()]),
            "{result}"
        );
    }

    #[test]
    fn unknown_reads_are_dropped() {
        let ops = vec![
            write(1, 1, 0, 1),
            op(2, read_call(), None, (2, None)),
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
        accepted(vec![write(1, 1, 0, 5), read(2, None, 5, 6)]);
    }

    fn many_concurrent_writes(count: u32) -> History<Call> {
        let mut ops: Vec<RegisterOperation> = (0..count)
            .map(|i| write(u64::from(i), i, 0, 1000))
            .collect();
        // A read that only the last-placed write can satisfy, forcing the
        // search through many orders.
        ops.push(read(99, Some(count + 1), 1001, 1002));
        History::new(ops).expect("valid history")
    }

    /// Why the search gives up on twelve concurrent writes within `bounds`.
    fn unknown_within(bounds: Bounds) -> UnknownReason {
        match check(&many_concurrent_writes(12), &bounds) {
            Verdict::Unknown { reason } => reason,
            other => panic!("expected unknown, got {other}"),
        }
    }

    #[test]
    fn state_bound_yields_unknown() {
        let reason = unknown_within(Bounds {
            max_states: 8,
            ..Bounds::default()
        });
        assert!(
            matches!(reason, UnknownReason::StateLimit { max_states: 8, .. }),
            "{reason}"
        );
    }

    #[test]
    fn time_bound_yields_unknown() {
        let reason = unknown_within(Bounds {
            time_limit: Duration::ZERO,
            ..Bounds::default()
        });
        assert!(
            matches!(reason, UnknownReason::TimeLimit { .. }),
            "{reason}"
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
