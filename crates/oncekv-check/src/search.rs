//! The Wing–Gong/Lowe/Porcupine search itself, independent of what the
//! operations do: the entry list, the depth-first walk, the memo table and
//! the bounds. A `Model` says what each operation does to a state; the
//! search only ever sees states as `u32` ids the model hands out (the
//! register model uses interned values, the KV model interned key maps).
//!
//! * **Entry list.** A partition becomes a doubly linked list of call and
//!   return entries in real-time order (calls before returns on equal
//!   times). The walk tries, at a call, to linearize that operation next
//!   (the model must accept it); on success both of its entries are
//!   *lifted* out of the list and the walk restarts from the head. Reaching
//!   a return entry means the operation it closes should have been
//!   linearized already, so the search backtracks: it pops the last choice,
//!   *unlifts* its entries and moves past it.
//! * **Choices.** An operation may have several possible effects (an
//!   unknown-outcome transaction whose condition the model cannot decide
//!   may run either branch); each is tried in turn before moving on.
//! * **Memoisation.** Each configuration reached, the set of linearized
//!   operations (a bitset of `u64` words) with the model's state id, is
//!   kept in a compact open-addressing table keyed by an incrementally
//!   updated Zobrist hash; a configuration seen before is never explored
//!   again.
//! * **Unknown outcomes.** An operation whose outcome is unknown gets its
//!   return entry at +∞. Once the walk meets a +∞ return entry every
//!   completed operation has been placed, and the rest are taken not to
//!   have happened.
//! * **Interchangeable operations.** Unknown-outcome operations the model
//!   puts in one class (identical calls: say, many unknown `incr c 1`) are
//!   interchangeable, so only the earliest-invoked one not yet linearized
//!   is ever tried: a linearization using any `m` of them can use the `m`
//!   invoked first, in invocation order, at the same places (the `i`-th
//!   place comes after at least `i + 1` invocations of the class). This
//!   turns the `2^k` subsets of `k` such operations into `k + 1`.
//!
//! The walk checks the clock every 1024 steps and stops at
//! the memo table's cap; the callers turn either into "unknown".

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// What the operations of a partition do, for the search. States are ids
/// the model hands out; the same state must always get the same id (the
/// memo table compares ids).
pub(crate) trait Model {
    /// How many alternative effects operation `local` may have (at least
    /// one).
    fn choices(&self, _local: usize) -> u32 {
        1
    }

    /// The state after operation `local` takes effect in `state` with
    /// alternative `choice`, or `None` when it cannot (its known output
    /// contradicts the state, or, for an unknown outcome, it would change
    /// nothing, which is the same as leaving it out).
    fn step(&mut self, local: usize, state: u32, choice: u32) -> Option<u32>;
}

/// The real-time interval of one operation: its invocation, and its
/// completion when the outcome is known (`None`: unknown, return at +∞).
/// `class`, for an unknown outcome only, groups operations the model says
/// have the same effect in every state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Interval {
    pub invoke_ns: u64,
    pub complete_ns: Option<u64>,
    pub class: Option<u32>,
}

/// No class.
const NO_CLASS: u32 = u32::MAX;

/// Why a partition has no linearization: the longest prefix found (local
/// operation indices, in order), the state after it, and the completed
/// operation that then had to come next but could not.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub longest_prefix: Vec<usize>,
    pub state_after_prefix: u32,
    pub blocked: Option<usize>,
}

pub(crate) enum Outcome {
    Linearizable,
    NotLinearizable(Failure),
    OutOfTime,
    OutOfStates,
}

/// The entry list sentinels.
const HEAD: u32 = 0;

/// How many search steps run between clock checks.
pub(crate) const CLOCK_INTERVAL: u32 = 1 << 10;

/// One saved choice: the call entry linearized, the state before it and
/// which alternative was taken.
#[derive(Clone, Copy, Debug)]
struct Frame {
    entry: u32,
    state: u32,
    choice: u32,
}

/// The search over one partition.
pub(crate) struct Search {
    /// Whether the local operation's outcome is unknown.
    unknown: Vec<bool>,
    /// Zobrist keys, by local index.
    zobrist: Vec<u64>,
    /// The class of each local operation (`NO_CLASS`: none), its rank in
    /// invocation order within the class, and how many of each class are
    /// linearized (always the lowest ranks).
    class: Vec<u32>,
    rank: Vec<u32>,
    taken: Vec<u32>,
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
    /// The search over operations with these intervals (local index =
    /// position in `intervals`).
    pub(crate) fn new(intervals: &[Interval]) -> Self {
        let count = intervals.len();
        // Events: (return at +inf, time, is return, local op).
        let mut events: Vec<(bool, u64, bool, u32)> = Vec::with_capacity(2 * count);
        let mut unknown = Vec::with_capacity(count);
        for (local, interval) in intervals.iter().enumerate() {
            let local = local_u32(local);
            events.push((false, interval.invoke_ns, false, local));
            match interval.complete_ns {
                Some(at) => events.push((false, at, true, local)),
                None => events.push((true, 0, true, local)),
            }
            unknown.push(interval.complete_ns.is_none());
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

        // Classes, renumbered densely, with ranks in call-entry order.
        let mut dense: HashMap<u32, u32> = HashMap::new();
        let mut class = vec![NO_CLASS; count];
        let mut rank = vec![0; count];
        let mut taken: Vec<u32> = Vec::new();
        for &(_, _, is_return, local) in &events {
            let local = local as usize;
            let Some(interval) = intervals.get(local) else {
                continue;
            };
            let (false, Some(given), None) = (is_return, interval.class, interval.complete_ns)
            else {
                continue;
            };
            let next = local_u32(dense.len());
            let id = *dense.entry(given).or_insert(next);
            if id as usize == taken.len() {
                taken.push(0);
            }
            class[local] = id;
            // `taken` counts members while ranking, then restarts at 0.
            rank[local] = taken[id as usize];
            taken[id as usize] += 1;
        }
        taken.iter_mut().for_each(|t| *t = 0);

        Self {
            unknown,
            zobrist,
            class,
            rank,
            taken,
            next,
            prev,
            op_of,
            is_call,
            partner,
            tail,
            memo: Memo::new(count.div_ceil(64)),
        }
    }

    /// How many configurations are memoised.
    pub(crate) fn states(&self) -> usize {
        self.memo.len()
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

    /// Searches from `initial` for a linearization.
    pub(crate) fn run<M: Model>(
        &mut self,
        model: &mut M,
        initial: u32,
        deadline: Option<Instant>,
        max_states: usize,
    ) -> Outcome {
        let mut bits = vec![0u64; self.memo.words];
        let mut hash = 0u64;
        let mut state = initial;
        let mut stack: Vec<Frame> = Vec::with_capacity(self.unknown.len());
        let mut best: Option<Failure> = None;
        let mut clock = 0u32;

        let mut entry = self.next[HEAD as usize];
        let mut choice = 0u32;
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
                let class = self.class[local];
                if class != NO_CLASS && self.rank[local] != self.taken[class as usize] {
                    // An earlier-invoked interchangeable operation is not
                    // linearized yet: it goes first.
                    entry = self.next[entry as usize];
                    choice = 0;
                    continue;
                }
                let choices = model.choices(local);
                let mut advanced = false;
                while choice < choices {
                    if let Some(new_state) = model.step(local, state, choice) {
                        let (word, bit) = (local / 64, 1u64 << (local % 64));
                        bits[word] |= bit;
                        hash ^= self.zobrist[local];
                        match self.memo.insert(&bits, new_state, hash, max_states) {
                            Insert::New => {
                                stack.push(Frame {
                                    entry,
                                    state,
                                    choice,
                                });
                                state = new_state;
                                self.lift(entry);
                                if class != NO_CLASS {
                                    self.taken[class as usize] += 1;
                                }
                                advanced = true;
                                break;
                            }
                            Insert::Seen => {}
                            Insert::Full => return Outcome::OutOfStates,
                        }
                        bits[word] &= !bit;
                        hash ^= self.zobrist[local];
                    }
                    choice += 1;
                }
                entry = if advanced {
                    self.next[HEAD as usize]
                } else {
                    self.next[entry as usize]
                };
                choice = 0;
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
                best = Some(Failure {
                    longest_prefix: stack
                        .iter()
                        .map(|frame| self.op_of[frame.entry as usize] as usize)
                        .collect(),
                    state_after_prefix: state,
                    blocked: Some(local),
                });
            }
            let Some(frame) = stack.pop() else {
                return Outcome::NotLinearizable(best.unwrap_or(Failure {
                    longest_prefix: Vec::new(),
                    state_after_prefix: initial,
                    blocked: None,
                }));
            };
            let undone = self.op_of[frame.entry as usize] as usize;
            if let Some(taken) = self.taken.get_mut(self.class[undone] as usize) {
                *taken = taken.saturating_sub(1);
            }
            bits[undone / 64] &= !(1u64 << (undone % 64));
            hash ^= self.zobrist[undone];
            state = frame.state;
            self.unlift(frame.entry);
            // Try the popped operation's next alternative, then move on.
            entry = frame.entry;
            choice = frame.choice + 1;
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

fn mix_state(hash: u64, state: u32) -> u64 {
    let mut z = hash ^ u64::from(state).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 32)
}

/// Values or states numbered in order of first appearance: how models
/// hand out the ids the search compares.
pub(crate) struct Interner<T> {
    items: Vec<T>,
    ids: HashMap<T, u32>,
}

impl<T: Clone + Eq + Hash> Interner<T> {
    pub(crate) fn new() -> Self {
        Self {
            items: Vec::new(),
            ids: HashMap::new(),
        }
    }

    pub(crate) fn intern(&mut self, item: T) -> u32 {
        if let Some(&id) = self.ids.get(&item) {
            return id;
        }
        let id = u32::try_from(self.items.len()).unwrap_or(u32::MAX);
        self.items.push(item.clone());
        self.ids.insert(item, id);
        id
    }

    pub(crate) fn get(&self, id: u32) -> Option<&T> {
        self.items.get(usize::try_from(id).ok()?)
    }
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

    fn insert(&mut self, bits: &[u64], state: u32, bits_hash: u64, max_states: usize) -> Insert {
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
