//! The acknowledged writes of a prefix: the change sequence the record
//! itself vouches for, the watch checker's reference wherever no reference
//! read reaches.
//!
//! A revision is the log index of the entry that made the change, and
//! every answer the fault proxies saw names the index its request ran at
//! (an `Applied` answer's entry, a `Replayed` answer's original one). So a
//! recorded operation that ran, with its reply and its index, places its
//! changes exactly: a transaction's INCR at its result, a PUT at its value,
//! an APPEND at the previous value and its suffix, a DELETE that found a
//! value. What an operation may have changed without the record placing
//! it leaves a range of revisions *unknown*:
//!
//! * ran (its reply says so) but no answer names an index: somewhere
//!   after the highest index answered before it was invoked and before the
//!   lowest index of an operation invoked after it completed;
//! * outcome unknown and no answer shows it ran: from that same lower
//!   bound on, unless an APPEND of it is missing from the final value of a
//!   key only ever appended to (then it never ran);
//! * answers naming several indexes (it ran more than once: the replies
//!   checker's violation): between the lowest and the highest;
//! * a change whose value the record does not give (a plain APPEND's
//!   delimiter, an APPEND after an unknown value), or a prefix deletion
//!   overlapping the prefix: that revision, or everything from it on.
//!
//! This holds only if the record holds every write to the prefix (the
//! run's accounts are written by its transfers alone, from absent), so it
//! is checked, and the acknowledged writes serve only if they pass: each
//! change follows its key's previous value as its reply says (an INCR's
//! result is the previous value plus its amount, an APPEND's length the
//! previous length plus its suffix, a PUT's or DELETE's previous value and
//! a CAS's compared value are the previous value), and the last value of
//! every key whose value is known at the end is its final value read after
//! the run (at least one final value of the prefix must have been read).
//! An unrecorded write breaks one of these, unless it leaves no trace in
//! any later reply or final value.

use super::{Change, Revisions};
use crate::record::{
    Bytes, KeyRange, Op, OpRecord, Outcome, Record, Reply, Txn, TxnOp, TxnOpResult,
};
use crate::record::{DedupKey, OpId, WatchKind};
use std::collections::{BTreeMap, BTreeSet};

/// What the acknowledged writes say about one prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Acknowledged {
    /// The changes the record places, by revision.
    pub changes: BTreeMap<u64, Vec<Change>>,
    /// The revisions where a change may lie that the record does not
    /// place (or whose value it does not give).
    pub unknown: Revisions,
    /// Why they cannot serve as a reference (empty: they can).
    pub refuted: Vec<String>,
}

/// How an operation's run is placed.
enum Placement<'a> {
    /// It changed nothing under the prefix.
    Nothing,
    /// It ran at this index with this reply.
    At(u64, &'a Reply),
    /// It may have changed keys under the prefix anywhere in this range.
    Somewhere(u64, u64),
}

/// What one write of an operation did to its key.
#[derive(Clone, Debug)]
enum Effect {
    /// Set it to this value.
    Set(Bytes),
    /// Removed it.
    Delete,
    /// Appended this suffix, reaching this length.
    Append(Bytes, u64),
    /// Left it as it was (a CAS that did not swap, a DELETE of nothing).
    Keep,
    /// Changed it in a way the record does not give.
    Opaque,
}

/// What a write's reply says the key held before it.
#[derive(Clone, Debug)]
enum Before {
    /// Nothing.
    Any,
    /// Exactly this value.
    Value(Option<Bytes>),
    /// A counter of this value (absent counts as 0).
    Counter(i64),
}

/// One write of an operation to a key under the prefix.
#[derive(Clone, Debug)]
struct Write {
    key: Bytes,
    effect: Effect,
    before: Before,
}

/// The writes an operation may make under the prefix, in any branch.
enum Reach {
    /// These keys.
    Keys(BTreeSet<Bytes>),
    /// Keys it does not name (a prefix deletion).
    Any,
}

/// Derives the acknowledged writes of `prefix` from `record`.
pub(super) fn derive(record: &Record, prefix: &Bytes) -> Acknowledged {
    let evidence = Evidence::new(record);
    let append_only = AppendOnly::new(record);
    let mut placed: BTreeMap<u64, Vec<Write>> = BTreeMap::new();
    // (from, through, keys; None: any key)
    let mut uncertain: Vec<(u64, u64, Option<BTreeSet<Bytes>>)> = Vec::new();
    let mut acknowledged = Acknowledged::default();
    for op in &record.ops {
        let reach = match reach(&op.op, prefix) {
            Some(reach) => reach,
            None => continue,
        };
        match evidence.placement(op, record, &append_only) {
            Placement::Nothing => {}
            // A prefix deletion: the keys it removed are not named.
            Placement::At(index, _) if matches!(reach, Reach::Any) => {
                uncertain.push((index, index, None));
            }
            Placement::At(index, reply) => match writes(&op.op, reply, prefix) {
                Some(writes) => placed.entry(index).or_default().extend(writes),
                None => {
                    // A reply that does not fit the operation.
                    acknowledged.unknown.insert(index, index);
                    uncertain.push((index, index, keys_of(&reach)));
                }
            },
            Placement::Somewhere(from, through) if through < from => {
                acknowledged.refuted.push(format!(
                    "operation {} ran, but the indexes answered around it leave it no revision",
                    op.id
                ));
            }
            Placement::Somewhere(from, through) => {
                acknowledged.unknown.insert(from, through);
                uncertain.push((from, through, keys_of(&reach)));
            }
        }
    }
    walk(record, prefix, placed, uncertain, &mut acknowledged);
    acknowledged
}

fn keys_of(reach: &Reach) -> Option<BTreeSet<Bytes>> {
    match reach {
        Reach::Keys(keys) => Some(keys.clone()),
        Reach::Any => None,
    }
}

/// A key's value as the walk knows it.
#[derive(Clone, Debug)]
struct KeyState {
    /// `None`: unknown.
    value: Option<Option<Bytes>>,
    /// The last revision an unplaced change of the key may lie at.
    uncertain_through: u64,
}

impl Default for KeyState {
    fn default() -> Self {
        // Keys under the prefix start absent.
        KeyState {
            value: Some(None),
            uncertain_through: 0,
        }
    }
}

/// Walks the placed writes in revision order: records each change, checks
/// it follows its key's previous value, and checks the last values against
/// the final values.
fn walk(
    record: &Record,
    prefix: &Bytes,
    placed: BTreeMap<u64, Vec<Write>>,
    mut uncertain: Vec<(u64, u64, Option<BTreeSet<Bytes>>)>,
    acknowledged: &mut Acknowledged,
) {
    uncertain.sort_by_key(|(from, _, _)| *from);
    let mut pending = uncertain.into_iter().peekable();
    let mut states: BTreeMap<Bytes, KeyState> = BTreeMap::new();
    // From here on nothing is known of any key.
    let mut all_unknown_from = u64::MAX;
    let mut apply_uncertain = |upto: u64,
                               states: &mut BTreeMap<Bytes, KeyState>,
                               all_unknown_from: &mut u64,
                               unknown: &mut Revisions| {
        while let Some((from, through, keys)) = pending.next_if(|(from, _, _)| *from <= upto) {
            match keys {
                Some(keys) => {
                    for key in keys {
                        let state = states.entry(key).or_default();
                        state.value = None;
                        state.uncertain_through = state.uncertain_through.max(through);
                    }
                }
                None => {
                    *all_unknown_from = (*all_unknown_from).min(from);
                    unknown.insert(from, u64::MAX);
                }
            }
        }
    };
    for (revision, writes) in placed {
        apply_uncertain(
            revision,
            &mut states,
            &mut all_unknown_from,
            &mut acknowledged.unknown,
        );
        if revision >= all_unknown_from {
            break;
        }
        for write in writes {
            let state = states.entry(write.key.clone()).or_default();
            if let Some(previous) = &state.value
                && let Some(problem) = contradiction(&write, previous.as_ref())
            {
                acknowledged.refuted.push(format!(
                    "the acknowledged change of {} at revision {revision} {problem}",
                    write.key
                ));
            }
            let after = match &write.effect {
                Effect::Set(value) => Some(Some(value.clone())),
                Effect::Delete => Some(None),
                Effect::Append(suffix, _) => state.value.as_ref().map(|previous| {
                    let mut value = previous.clone().unwrap_or_default().0;
                    value.extend_from_slice(&suffix.0);
                    Some(Bytes(value))
                }),
                Effect::Keep => state.value.clone(),
                Effect::Opaque => None,
            };
            if !matches!(write.effect, Effect::Keep) {
                match &after {
                    Some(value) => {
                        let kind = match value {
                            Some(_) => WatchKind::Put,
                            None => WatchKind::Delete,
                        };
                        acknowledged.changes.entry(revision).or_default().push((
                            revision,
                            write.key.clone(),
                            kind,
                            value.clone(),
                        ));
                    }
                    None => acknowledged.unknown.insert(revision, revision),
                }
            }
            // An unplaced change may still come after this one.
            state.value = if revision <= state.uncertain_through {
                None
            } else {
                after
            };
        }
    }
    apply_uncertain(
        u64::MAX,
        &mut states,
        &mut all_unknown_from,
        &mut acknowledged.unknown,
    );
    acknowledged.unknown.normalize();
    let finals: Vec<(&Bytes, &Option<Bytes>)> = record
        .final_values
        .iter()
        .filter(|(key, _)| key.0.starts_with(&prefix.0))
        .collect();
    if finals.is_empty() {
        acknowledged.refuted.push(format!(
            "no final value under {prefix} was read to anchor them"
        ));
    }
    if all_unknown_from != u64::MAX {
        return;
    }
    for (key, final_value) in finals {
        let last = match states.get(key) {
            Some(KeyState {
                value: Some(value), ..
            }) => value.clone(),
            Some(KeyState { value: None, .. }) => continue,
            None => None,
        };
        if last != *final_value {
            acknowledged.refuted.push(format!(
                "they leave {key} = {}, its final value is {}",
                show(&last),
                show(final_value)
            ));
        }
    }
}

fn show(value: &Option<Bytes>) -> String {
    value
        .as_ref()
        .map_or_else(|| "absent".to_owned(), ToString::to_string)
}

/// How `write` contradicts its key's `previous` value, if it does.
fn contradiction(write: &Write, previous: Option<&Bytes>) -> Option<String> {
    if let Effect::Append(suffix, length) = &write.effect {
        let before = previous.map_or(0, Bytes::len) as u64;
        if before.checked_add(suffix.len() as u64) != Some(*length) {
            return Some(format!(
                "reached length {length}, but the value before was {before} byte(s) long"
            ));
        }
    }
    match &write.before {
        Before::Any => None,
        Before::Value(expected) if expected.as_ref() == previous => None,
        Before::Value(expected) => Some(format!(
            "found {}, but the value before was {}",
            show(expected),
            show(&previous.cloned())
        )),
        Before::Counter(expected) => {
            let found = match previous {
                None => Some(0),
                Some(value) => std::str::from_utf8(&value.0)
                    .ok()
                    .and_then(|text| text.parse::<i64>().ok()),
            };
            (found != Some(*expected)).then(|| {
                format!(
                    "counted from {expected}, but the value before was {}",
                    show(&previous.cloned())
                )
            })
        }
    }
}

fn under(key: &Bytes, prefix: &Bytes) -> bool {
    key.0.starts_with(&prefix.0)
}

/// Whether some key from `start` up to `end` (or on) is under `prefix`.
fn range_reaches(start: &Bytes, end: Option<&Bytes>, prefix: &Bytes) -> bool {
    // The keys under the prefix run from it up to its successor: the
    // prefix with its last byte below 0xff incremented (none: to the end).
    let mut successor = prefix.0.clone();
    while successor.last() == Some(&0xff) {
        successor.pop();
    }
    let successor = match successor.pop() {
        Some(last) => {
            successor.push(last.saturating_add(1));
            Some(successor)
        }
        None => None,
    };
    let starts_before_prefix_ends = successor.is_none_or(|successor| start.0 < successor);
    let ends_after_prefix_starts = end.is_none_or(|end| prefix.0 < end.0);
    starts_before_prefix_ends && ends_after_prefix_starts
}

/// Adds the keys under `prefix` that `txn` may write, in any branch (its
/// nested transactions' included), to `keys`; whether it may write any key
/// there (a deleted prefix or range reaching into it).
fn txn_reaches_any(txn: &Txn, prefix: &Bytes, keys: &mut BTreeSet<Bytes>) -> bool {
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            TxnOp::Put { key, .. }
            | TxnOp::Delete { key }
            | TxnOp::Append { key, .. }
            | TxnOp::Incr { key, .. }
            | TxnOp::Cas { key, .. }
            | TxnOp::PutExisting { key, .. } => {
                if under(key, prefix) {
                    keys.insert(key.clone());
                }
            }
            TxnOp::DeletePrefix { prefix: deleted } => {
                if deleted.0.starts_with(&prefix.0) || prefix.0.starts_with(&deleted.0) {
                    return true;
                }
            }
            TxnOp::DeleteRange { start, end } => {
                if range_reaches(start, end.as_ref(), prefix) {
                    return true;
                }
            }
            TxnOp::Txn { txn } => {
                if txn_reaches_any(txn, prefix, keys) {
                    return true;
                }
            }
            TxnOp::Get { .. } | TxnOp::GetPrefix { .. } | TxnOp::GetRange { .. } => {}
        }
    }
    false
}

/// The keys under `prefix` that `op` may write, in any branch (`None`: it
/// writes none).
fn reach(op: &Op, prefix: &Bytes) -> Option<Reach> {
    let mut keys = BTreeSet::new();
    match op {
        Op::Append { key, .. }
        | Op::Incr { key, .. }
        | Op::Cas { key, .. }
        | Op::Put { key, .. }
        | Op::Delete { key } => {
            if under(key, prefix) {
                keys.insert(key.clone());
            }
        }
        Op::Txn(txn) => {
            if txn_reaches_any(txn, prefix, &mut keys) {
                return Some(Reach::Any);
            }
        }
        Op::Get { .. } | Op::LeaseGrant { .. } | Op::LeaseRevoke { .. } => {}
    }
    (!keys.is_empty()).then_some(Reach::Keys(keys))
}

/// The writes under `prefix` of `op` answered `reply`; `None` when the
/// reply does not fit the operation.
fn writes(op: &Op, reply: &Reply, prefix: &Bytes) -> Option<Vec<Write>> {
    let write = |key: &Bytes, effect, before| Write {
        key: key.clone(),
        effect,
        before,
    };
    let all = match (op, reply) {
        (_, Reply::Rejected { .. }) => Vec::new(),
        (Op::Put { key, value }, Reply::Put { previous }) => vec![write(
            key,
            Effect::Set(value.clone()),
            Before::Value(previous.clone()),
        )],
        (Op::Delete { key }, Reply::Delete { previous }) => vec![deletion(key, previous)],
        (Op::Incr { key, by }, Reply::Incr { value }) => vec![increment(key, *by, *value)?],
        (Op::Cas { key, expected, new }, Reply::Cas { swapped, current }) => {
            vec![swap(key, expected, new, *swapped, current)]
        }
        // The delimiter a plain APPEND adds is the workload's: the record
        // does not give the value.
        (Op::Append { key, .. }, Reply::Append { .. }) => {
            vec![write(key, Effect::Opaque, Before::Any)]
        }
        (Op::Txn(txn), Reply::Txn { succeeded, results }) => {
            branch_writes(txn, *succeeded, results)?
        }
        (Op::Get { .. } | Op::LeaseGrant { .. } | Op::LeaseRevoke { .. }, _) => Vec::new(),
        _ => return None,
    };
    Some(all.into_iter().filter(|w| under(&w.key, prefix)).collect())
}

/// The writes of the branch of `txn` that ran (`succeeded`) and answered
/// `results`, nested transactions' included; `None` when the results do
/// not fit the branch.
fn branch_writes(txn: &Txn, succeeded: bool, results: &[TxnOpResult]) -> Option<Vec<Write>> {
    let write = |key: &Bytes, effect, before| Write {
        key: key.clone(),
        effect,
        before,
    };
    let branch = txn.branch(succeeded);
    if branch.len() != results.len() {
        return None;
    }
    let mut all = Vec::new();
    for (op, result) in branch.iter().zip(results) {
        all.push(match (op, result) {
            (TxnOp::Put { key, value }, TxnOpResult::Put { previous }) => write(
                key,
                Effect::Set(value.clone()),
                Before::Value(previous.clone()),
            ),
            (TxnOp::Delete { key }, TxnOpResult::Delete { previous }) => deletion(key, previous),
            (TxnOp::Append { key, value }, TxnOpResult::Append { length }) => {
                write(key, Effect::Append(value.clone(), *length), Before::Any)
            }
            (TxnOp::Incr { key, by }, TxnOpResult::Incr { value }) => increment(key, *by, *value)?,
            (TxnOp::Cas { key, expected, new }, TxnOpResult::Cas { swapped, current }) => {
                swap(key, expected, new, *swapped, current)
            }
            (TxnOp::PutExisting { key, value }, TxnOpResult::Put { previous }) => {
                // A kept value is the one before.
                let effect = match value.clone().or_else(|| previous.clone()) {
                    Some(value) => Effect::Set(value),
                    None => Effect::Opaque,
                };
                write(key, effect, Before::Value(previous.clone()))
            }
            (TxnOp::Txn { txn }, TxnOpResult::Txn { succeeded, results }) => {
                all.extend(branch_writes(txn, *succeeded, results)?);
                continue;
            }
            (TxnOp::Get { .. }, TxnOpResult::Get { .. })
            | (TxnOp::GetPrefix { .. } | TxnOp::GetRange { .. }, TxnOpResult::GetPrefix { .. })
            | (
                TxnOp::DeletePrefix { .. } | TxnOp::DeleteRange { .. },
                TxnOpResult::DeletePrefix { .. },
            ) => continue,
            _ => return None,
        });
    }
    Some(all)
}

fn deletion(key: &Bytes, previous: &Option<Bytes>) -> Write {
    Write {
        key: key.clone(),
        // Deleting an absent key changes nothing.
        effect: if previous.is_some() {
            Effect::Delete
        } else {
            Effect::Keep
        },
        before: Before::Value(previous.clone()),
    }
}

fn increment(key: &Bytes, by: i64, value: i64) -> Option<Write> {
    Some(Write {
        key: key.clone(),
        effect: Effect::Set(Bytes::from(value.to_string())),
        before: Before::Counter(value.checked_sub(by)?),
    })
}

fn swap(
    key: &Bytes,
    expected: &Option<Bytes>,
    new: &Bytes,
    swapped: bool,
    current: &Option<Bytes>,
) -> Write {
    if swapped {
        Write {
            key: key.clone(),
            effect: Effect::Set(new.clone()),
            before: Before::Value(expected.clone()),
        }
    } else {
        Write {
            key: key.clone(),
            effect: Effect::Keep,
            before: Before::Value(current.clone()),
        }
    }
}

/// The answers of the run, by the request they answer, and what they say
/// of when things ran.
struct Evidence<'a> {
    /// Answers with a reply, by dedup key.
    by_request: BTreeMap<DedupKey, Vec<(Option<u64>, &'a Reply)>>,
    /// Answers with a reply, by operation, where the recorder knew it.
    by_op: BTreeMap<OpId, Vec<(Option<u64>, &'a Reply)>>,
    /// (answered at, the highest index answered by then), by time.
    highest_answered: Vec<(u64, u64)>,
    /// (invoked at, the lowest index of an operation invoked then or
    /// later), by time.
    lowest_invoked: Vec<(u64, u64)>,
}

impl<'a> Evidence<'a> {
    fn new(record: &'a Record) -> Self {
        let mut by_request: BTreeMap<DedupKey, Vec<(Option<u64>, &Reply)>> = BTreeMap::new();
        let mut by_op: BTreeMap<OpId, Vec<(Option<u64>, &Reply)>> = BTreeMap::new();
        let mut answered: Vec<(u64, u64)> = Vec::new();
        for response in &record.responses {
            let index = response.answer.applied_index();
            if let Some(index) = index {
                answered.push((response.at_ns, index));
            }
            let Some((reply, _)) = response.answer.reply() else {
                continue;
            };
            // By the request's own key; and by the operation it was
            // attributed to, for an operation recorded without one (an
            // etcd write under an idempotency key of its own).
            if let Some(key) = response.request.dedup_key() {
                by_request.entry(key).or_default().push((index, reply));
            }
            if let Some(op) = response.op_id {
                by_op.entry(op).or_default().push((index, reply));
            }
        }
        answered.sort_unstable();
        let mut highest = 0;
        let highest_answered = answered
            .into_iter()
            .map(|(at, index)| {
                highest = highest.max(index);
                (at, highest)
            })
            .collect();
        let mut evidence = Evidence {
            by_request,
            by_op,
            highest_answered,
            lowest_invoked: Vec::new(),
        };
        let mut invoked: Vec<(u64, u64)> = record
            .ops
            .iter()
            .filter_map(|op| {
                let indexes = evidence.indexes(op);
                (indexes.len() == 1)
                    .then(|| indexes.first().map(|index| (op.invoke_ns, *index)))
                    .flatten()
            })
            .collect();
        invoked.sort_unstable();
        let mut lowest = u64::MAX;
        for entry in invoked.iter_mut().rev() {
            lowest = lowest.min(entry.1);
            entry.1 = lowest;
        }
        evidence.lowest_invoked = invoked;
        evidence
    }

    /// The answers with a reply to `op`'s request.
    fn answers(&self, op: &OpRecord) -> &[(Option<u64>, &'a Reply)] {
        let found = match op.request.dedup_key() {
            Some(key) => self.by_request.get(&key),
            None => self.by_op.get(&op.id),
        };
        found.map_or(&[], Vec::as_slice)
    }

    /// The indexes answers name for `op`.
    fn indexes(&self, op: &OpRecord) -> BTreeSet<u64> {
        self.answers(op)
            .iter()
            .filter_map(|(index, _)| *index)
            .collect()
    }

    /// The highest index answered before `at` (0: none): anything invoked
    /// at `at` runs at a higher one.
    fn answered_before(&self, at: u64) -> u64 {
        let before = self
            .highest_answered
            .partition_point(|(when, _)| *when < at);
        before
            .checked_sub(1)
            .and_then(|i| self.highest_answered.get(i))
            .map_or(0, |(_, index)| *index)
    }

    /// The lowest index of an operation invoked after `at` (`u64::MAX`:
    /// none): anything that completed at `at` ran at a lower one.
    fn invoked_after(&self, at: u64) -> u64 {
        let after = self.lowest_invoked.partition_point(|(when, _)| *when <= at);
        self.lowest_invoked
            .get(after)
            .map_or(u64::MAX, |(_, index)| *index)
    }

    /// Where `op` ran, as far as the record tells.
    fn placement(
        &self,
        op: &'a OpRecord,
        record: &Record,
        append_only: &AppendOnly,
    ) -> Placement<'a> {
        let answers = self.answers(op);
        let indexes = self.indexes(op);
        let from = self.answered_before(op.invoke_ns).saturating_add(1);
        if let (Some(first), Some(last)) = (indexes.first(), indexes.last()) {
            if first != last {
                return Placement::Somewhere(*first, *last);
            }
            // The client's own reply, when it was told one: every answer
            // names this one run, and the client's says most (the proxy's
            // record of an etcd Txn answer carries no per-operation
            // results); else the answer's.
            let answered = answers.iter().find(|(index, _)| *index == Some(*first));
            let reply = match (&op.outcome, answered) {
                (Outcome::Ok { reply, .. }, Some(_)) => Some(reply),
                (_, answered) => answered.map(|(_, reply)| *reply),
            };
            if let Some(reply) = reply {
                return Placement::At(*first, reply);
            }
        }
        // No answer names an index.
        let reply = answers
            .first()
            .map(|(_, reply)| *reply)
            .or_else(|| op.outcome.reply());
        match (reply, &op.outcome) {
            (Some(reply), _) if reply.is_rejection() => Placement::Nothing,
            (Some(_), Outcome::Ok { .. }) => {
                let through = op
                    .complete_ns
                    .map_or(u64::MAX, |at| self.invoked_after(at))
                    .saturating_sub(1);
                Placement::Somewhere(from, through)
            }
            (Some(_), _) => Placement::Somewhere(from, u64::MAX),
            (None, Outcome::Failed { .. }) => Placement::Nothing,
            (None, _) if append_only.never_ran(&op.op, record) => Placement::Nothing,
            (None, _) => Placement::Somewhere(from, u64::MAX),
        }
    }
}

/// The keys the record changes only by appending.
struct AppendOnly {
    appended: BTreeSet<Bytes>,
    otherwise: BTreeSet<Bytes>,
    deleted: Vec<KeyRange>,
}

impl AppendOnly {
    /// Notes what `txn` may write, in either branch, nested transactions'
    /// included.
    fn add_txn(&mut self, txn: &Txn) {
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                TxnOp::Append { key, .. } => {
                    self.appended.insert(key.clone());
                }
                TxnOp::Put { key, .. }
                | TxnOp::Delete { key }
                | TxnOp::Incr { key, .. }
                | TxnOp::Cas { key, .. }
                | TxnOp::PutExisting { key, .. } => {
                    self.otherwise.insert(key.clone());
                }
                TxnOp::DeletePrefix { prefix } => {
                    self.deleted.push(KeyRange::Prefix(prefix.clone()));
                }
                TxnOp::DeleteRange { start, end } => {
                    self.deleted.push(KeyRange::Range {
                        start: start.clone(),
                        end: end.clone(),
                    });
                }
                TxnOp::Txn { txn } => self.add_txn(txn),
                TxnOp::Get { .. } | TxnOp::GetPrefix { .. } | TxnOp::GetRange { .. } => {}
            }
        }
    }

    fn new(record: &Record) -> Self {
        let mut only = AppendOnly {
            appended: BTreeSet::new(),
            otherwise: BTreeSet::new(),
            deleted: Vec::new(),
        };
        for op in &record.ops {
            match &op.op {
                Op::Append { key, .. } => {
                    only.appended.insert(key.clone());
                }
                Op::Incr { key, .. }
                | Op::Cas { key, .. }
                | Op::Put { key, .. }
                | Op::Delete { key } => {
                    only.otherwise.insert(key.clone());
                }
                Op::Txn(txn) => only.add_txn(txn),
                Op::Get { .. } | Op::LeaseGrant { .. } | Op::LeaseRevoke { .. } => {}
            }
        }
        only
    }

    fn holds(&self, key: &Bytes) -> bool {
        self.appended.contains(key)
            && !self.otherwise.contains(key)
            && !self.deleted.iter().any(|range| range.contains(&key.0))
    }

    /// Whether `suffix` appended to `key` is missing from its final value,
    /// though nothing but appends ever changed it: then it was never
    /// appended.
    fn missing(&self, key: &Bytes, suffix: &[u8], record: &Record) -> bool {
        if suffix.is_empty() || !self.holds(key) {
            return false;
        }
        match record.final_values.get(key) {
            Some(Some(value)) => !value.0.windows(suffix.len()).any(|w| w == suffix),
            Some(None) => true,
            None => false,
        }
    }

    /// Whether `op` (of unknown outcome) certainly never ran: every branch
    /// that writes appends to such a key something its final value lacks.
    /// (A branch that writes nothing changes nothing either way.)
    fn never_ran(&self, op: &Op, record: &Record) -> bool {
        match op {
            Op::Append { key, token } => self.missing(key, &token.0, record),
            Op::Txn(txn) => [&txn.success, &txn.failure].into_iter().all(|branch| {
                branch.iter().all(TxnOp::is_read)
                    || branch.iter().any(|op| match op {
                        TxnOp::Append { key, value } => self.missing(key, &value.0, record),
                        _ => false,
                    })
            }),
            _ => false,
        }
    }
}
