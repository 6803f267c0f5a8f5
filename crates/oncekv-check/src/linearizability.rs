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
//! * **Entry list.** A partition becomes a doubly linked list of call and
//!   return entries in real-time order (calls before returns on equal
//!   times). A depth-first search walks it: at a call it tries to linearize
//!   that operation next (the register model must accept its output); on
//!   success both of its entries are *lifted* out of the list and the walk
//!   restarts from the head. Reaching a return entry means the operation it
//!   closes should have been linearized already, so the search backtracks:
//!   it pops the last choice, *unlifts* its entries and moves past it.
//! * **Memoisation.** Each configuration reached, the set of linearized
//!   operations (a bitset of `u64` words) with the register's value, is
//!   kept in a compact open-addressing table keyed by an incrementally
//!   updated Zobrist hash; a configuration seen before is never explored
//!   again.
//! * **Unknown outcomes.** An operation whose outcome is unknown gets its
//!   return entry at +∞. It may be linearized at any point after its call,
//!   or never: once the walk meets a +∞ return entry every completed
//!   operation has been placed, and the rest are taken not to have happened.
//!   Unknown reads constrain nothing and are dropped up front.
//!
//! The search is bounded by a wall-clock budget and by the number of
//! memoised configurations ([`Bounds`]); a search that hits either bound
//! reports [`Verdict::Unknown`], never a pass.

use crate::history::{Call, History, Key, Operation, Output, Value};
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
        let mut search = Search::new(history.operations(), indices);
        let outcome = search.run(deadline, bounds.max_states);
        let states = search.memo.len();
        stats.states += states;
        stats.max_partition_states = stats.max_partition_states.max(states);
        match outcome {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable(explanation) => {
                stats.elapsed = started.elapsed();
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
#[derive(Clone, Copy, Debug)]
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

enum Outcome {
    Linearizable,
    NotLinearizable(Explanation),
    OutOfTime,
    OutOfStates,
}

/// The entry list sentinels.
const HEAD: u32 = 0;

/// How many search steps run between clock checks.
const CLOCK_INTERVAL: u32 = 1 << 10;

/// One saved choice: the call entry linearized and the state before it.
#[derive(Clone, Copy, Debug)]
struct Frame {
    entry: u32,
    state: State,
}

/// The search over one partition.
struct Search {
    /// History positions of the partition's operations (local index →
    /// history index).
    origin: Vec<usize>,
    /// Compiled operations, by local index.
    steps: Vec<Step>,
    /// Interned values (state `n` is `values[n - 1]`).
    values: Vec<Value>,
    /// Whether the local operation's outcome is unknown.
    unknown: Vec<bool>,
    /// Zobrist keys, by local index.
    zobrist: Vec<u64>,
    /// Entry list: `next`/`prev` links, the local operation of each entry,
    /// whether it is a call, and a call's return entry. Entry 0 is the
    /// head, the last one the tail.
    next: Vec<u32>,
    prev: Vec<u32>,
    op_of: Vec<u32>,
    is_call: Vec<bool>,
    partner: Vec<u32>,
    tail: u32,
    memo: Memo,
}

impl Search {
    fn new(operations: &[Operation], origin: Vec<usize>) -> Self {
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
        let mut unknown = Vec::with_capacity(origin.len());
        for &index in &origin {
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
            unknown.push(op.output.is_none());
        }

        let count = steps.len();
        // Events: (return at +inf, time, is return, local op).
        let mut events: Vec<(bool, u64, bool, u32)> = Vec::with_capacity(2 * count);
        for (local, &index) in origin.iter().enumerate() {
            let Some(op) = operations.get(index) else {
                continue;
            };
            let local = local_u32(local);
            events.push((false, op.invoke_ns, false, local));
            match (op.output.is_some(), op.complete_ns) {
                (true, Some(at)) => events.push((false, at, true, local)),
                _ => events.push((true, 0, true, local)),
            }
        }
        events.sort_unstable();

        let entries = events.len() + 2;
        let tail = local_u32(entries - 1);
        let mut next = Vec::with_capacity(entries);
        let mut prev = Vec::with_capacity(entries);
        let mut op_of = vec![0; entries];
        let mut is_call = vec![false; entries];
        let mut partner = vec![0; entries];
        let mut return_entry = vec![0; count];
        for entry in 0..entries {
            next.push(local_u32(entry + 1).min(tail));
            prev.push(local_u32(entry.saturating_sub(1)));
        }
        for (position, &(_, _, is_return, local)) in events.iter().enumerate() {
            let entry = position + 1;
            op_of[entry] = local;
            is_call[entry] = !is_return;
            if is_return {
                return_entry[local as usize] = local_u32(entry);
            }
        }
        for entry in 1..entries - 1 {
            if is_call[entry] {
                partner[entry] = return_entry[op_of[entry] as usize];
            }
        }

        let mut seed = 0x6f6e_6365_6b76_u64 ^ (count as u64).rotate_left(32);
        let zobrist = (0..count).map(|_| splitmix64(&mut seed)).collect();

        Self {
            origin,
            steps,
            values,
            unknown,
            zobrist,
            next,
            prev,
            op_of,
            is_call,
            partner,
            tail,
            memo: Memo::new(count.div_ceil(64)),
        }
    }

    fn lift(&mut self, call: u32) {
        let ret = self.partner[call as usize];
        for entry in [call, ret] {
            let (p, n) = (self.prev[entry as usize], self.next[entry as usize]);
            self.next[p as usize] = n;
            self.prev[n as usize] = p;
        }
    }

    fn unlift(&mut self, call: u32) {
        let ret = self.partner[call as usize];
        for entry in [ret, call] {
            let (p, n) = (self.prev[entry as usize], self.next[entry as usize]);
            self.next[p as usize] = entry;
            self.prev[n as usize] = entry;
        }
    }

    fn value_of(&self, state: State) -> Option<Value> {
        let index = usize::try_from(state).ok()?.checked_sub(1)?;
        self.values.get(index).cloned()
    }

    fn run(&mut self, deadline: Option<Instant>, max_states: usize) -> Outcome {
        let mut bits = vec![0u64; self.memo.words];
        let mut hash = 0u64;
        let mut state = ABSENT;
        let mut stack: Vec<Frame> = Vec::with_capacity(self.steps.len());
        let mut best: Option<Explanation> = None;
        let mut clock = 0u32;

        let mut entry = self.next[HEAD as usize];
        loop {
            if entry == self.tail {
                return Outcome::Linearizable;
            }
            if clock == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return Outcome::OutOfTime;
            }
            clock = (clock + 1) % CLOCK_INTERVAL;

            let local = self.op_of[entry as usize] as usize;
            if self.is_call[entry as usize] {
                if let Some(new_state) = self.steps[local].apply(state) {
                    let (word, bit) = (local / 64, 1u64 << (local % 64));
                    bits[word] |= bit;
                    hash ^= self.zobrist[local];
                    match self.memo.insert(&bits, new_state, hash, max_states) {
                        Insert::New => {
                            stack.push(Frame { entry, state });
                            state = new_state;
                            self.lift(entry);
                            entry = self.next[HEAD as usize];
                            continue;
                        }
                        Insert::Seen => {}
                        Insert::Full => return Outcome::OutOfStates,
                    }
                    bits[word] &= !bit;
                    hash ^= self.zobrist[local];
                }
                entry = self.next[entry as usize];
                continue;
            }

            if self.unknown[local] {
                // Every completed operation is placed; the unknown ones left
                // over are taken never to have happened.
                return Outcome::Linearizable;
            }
            if best
                .as_ref()
                .is_none_or(|b| stack.len() > b.longest_prefix.len())
            {
                best = Some(Explanation {
                    longest_prefix: stack
                        .iter()
                        .map(|frame| self.origin[self.op_of[frame.entry as usize] as usize])
                        .collect(),
                    value_after_prefix: self.value_of(state),
                    blocked: Some(self.origin[local]),
                });
            }
            let Some(frame) = stack.pop() else {
                return Outcome::NotLinearizable(best.unwrap_or(Explanation {
                    longest_prefix: Vec::new(),
                    value_after_prefix: None,
                    blocked: None,
                }));
            };
            let undone = self.op_of[frame.entry as usize] as usize;
            bits[undone / 64] &= !(1u64 << (undone % 64));
            hash ^= self.zobrist[undone];
            state = frame.state;
            self.unlift(frame.entry);
            entry = self.next[frame.entry as usize];
        }
    }
}

fn local_u32(index: usize) -> u32 {
    // Partitions hold at most History::MAX_OPERATIONS operations, so their
    // entry indices fit.
    u32::try_from(index).unwrap_or(u32::MAX)
}

fn splitmix64(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn mix_state(hash: u64, state: State) -> u64 {
    let mut z = hash ^ u64::from(state).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 32)
}

enum Insert {
    New,
    Seen,
    Full,
}

/// The set of visited configurations: an open-addressing hash table of
/// indices into a flat arena of records `[hash, state, bitset words...]`.
struct Memo {
    words: usize,
    stride: usize,
    records: Vec<u64>,
    /// 0 is empty; otherwise record index + 1.
    slots: Vec<u32>,
    len: usize,
}

impl Memo {
    fn new(words: usize) -> Self {
        Self {
            words,
            stride: words + 2,
            records: Vec::new(),
            slots: vec![0; 1 << 10],
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn insert(&mut self, bits: &[u64], state: State, bits_hash: u64, max_states: usize) -> Insert {
        let hash = mix_state(bits_hash, state);
        let mask = self.slots.len() - 1;
        let mut slot = (hash as usize) & mask;
        loop {
            let occupant = self.slots[slot];
            if occupant == 0 {
                break;
            }
            let start = (occupant as usize - 1) * self.stride;
            let record = &self.records[start..start + self.stride];
            if record[0] == hash && record[1] == u64::from(state) && &record[2..] == bits {
                return Insert::Seen;
            }
            slot = (slot + 1) & mask;
        }
        if self.len >= max_states || self.len >= u32::MAX as usize - 1 {
            return Insert::Full;
        }
        self.records.push(hash);
        self.records.push(u64::from(state));
        self.records.extend_from_slice(bits);
        self.len += 1;
        self.slots[slot] = local_u32(self.len);
        if self.len * 2 > self.slots.len() {
            self.grow();
        }
        Insert::New
    }

    fn grow(&mut self) {
        let size = self.slots.len() * 2;
        let mask = size - 1;
        let mut slots = vec![0u32; size];
        for index in 0..self.len {
            let hash = self.records[index * self.stride];
            let mut slot = (hash as usize) & mask;
            while slots[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            slots[slot] = local_u32(index + 1);
        }
        self.slots = slots;
    }
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

    #[test]
    fn memo_grows_past_its_initial_table() {
        let mut memo = Memo::new(1);
        for i in 0..5000u64 {
            let bits = [i];
            assert!(matches!(
                memo.insert(&bits, 3, i.wrapping_mul(31), usize::MAX),
                Insert::New
            ));
        }
        for i in 0..5000u64 {
            let bits = [i];
            assert!(matches!(
                memo.insert(&bits, 3, i.wrapping_mul(31), usize::MAX),
                Insert::Seen
            ));
        }
        assert_eq!(memo.len(), 5000);
    }
}
