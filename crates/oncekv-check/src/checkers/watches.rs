//! The watch checker: every watcher was given exactly the committed change
//! sequence of its prefix, in revision order, without gaps or repeats,
//! across its resumes.
//!
//! A watcher that started at revision `s` and was given everything
//! through revision `d` (its last change or progress notice) must have
//! been given exactly the committed changes with revisions in `s..=d`, in
//! revision order: a change missing is a gap, one given twice a repeat,
//! one not committed an invention, and a change with another value or kind
//! a corruption.
//!
//! The committed changes come from two references:
//!
//! * the *reference read*: a watch of the prefix from the healed cluster
//!   after the run, covering the revisions from its start through the last
//!   it was given everything through (whether it got to the end or not);
//!   one that did get to the end must agree with the final values read
//!   after the run (the last change of each key is its final state);
//! * the *acknowledged writes* (`acknowledged`): the changes the recorded
//!   operations place by the log index each answer names, covering every
//!   revision but those where an operation may have changed the prefix
//!   unplaced (an unknown outcome, say); they serve only if they follow
//!   each key from absent to its final value, each change agreeing with
//!   its reply.
//!
//! A revision the read covers is judged by the read, any other by the
//! acknowledged writes; where both cover a revision they must agree. So a
//! read cut short (by a failure, or a history compacted under it) is
//! completed by the record, and a run whose read failed is still judged. A
//! revision a watcher was given that neither covers leaves it
//! `Undecided`, never a pass. A watcher told `Compacted` is wrong when a
//! reference read, after the run, read that revision; when the read too
//! found the history compacted past it, it is right; with no read to tell,
//! it is `Undecided`.

use super::Findings;
use crate::record::{Bytes, Record, WatchEnd, WatchKind, WatchRecord, WatchSeen, WatcherId};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

mod acknowledged;

/// One change, as compared: revision, key, kind, value.
type Change = (u64, Bytes, WatchKind, Option<Bytes>);

fn change(seen: &WatchSeen) -> Change {
    (
        seen.revision,
        seen.key.clone(),
        seen.kind,
        seen.value.clone(),
    )
}

/// A watcher given something other than the committed sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchViolation {
    /// A committed change the watcher should have been given, and was not.
    Missing {
        /// The watcher.
        watcher: WatcherId,
        /// The change's revision.
        revision: u64,
        /// Its key.
        key: Bytes,
    },
    /// A change given more than once.
    Repeated {
        /// The watcher.
        watcher: WatcherId,
        /// The change's revision.
        revision: u64,
        /// Its key.
        key: Bytes,
    },
    /// A change the committed sequence does not hold (or holds otherwise).
    NotCommitted {
        /// The watcher.
        watcher: WatcherId,
        /// The change's revision.
        revision: u64,
        /// Its key.
        key: Bytes,
    },
    /// Changes given out of revision order.
    OutOfOrder {
        /// The watcher.
        watcher: WatcherId,
        /// The revision given after a later one.
        revision: u64,
        /// The later one given before it.
        after: u64,
    },
    /// Told its revision was compacted, though the reference read it.
    FalselyCompacted {
        /// The watcher.
        watcher: WatcherId,
        /// The compacted revision it was told.
        compacted: u64,
    },
    /// The watch failed.
    Failed {
        /// The watcher.
        watcher: WatcherId,
        /// The error.
        detail: String,
    },
    /// The reference read and the acknowledged writes disagree on a
    /// change at a revision both cover.
    ReadDisagrees {
        /// The revision.
        revision: u64,
        /// The key changed (by one of them).
        key: Bytes,
    },
    /// The reference's last change of a key contradicts its final value.
    ReferenceDisagrees {
        /// The key.
        key: Bytes,
        /// Its final value.
        final_value: Option<Bytes>,
        /// What the reference's last change left.
        reference: Option<Bytes>,
    },
}

impl fmt::Display for WatchViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing {
                watcher,
                revision,
                key,
            } => write!(
                f,
                "watcher {watcher} missed the change of {key} at revision {revision}"
            ),
            Self::Repeated {
                watcher,
                revision,
                key,
            } => write!(
                f,
                "watcher {watcher} was given the change of {key} at revision {revision} twice"
            ),
            Self::NotCommitted {
                watcher,
                revision,
                key,
            } => write!(
                f,
                "watcher {watcher} was given a change of {key} at revision {revision} that was not committed so"
            ),
            Self::OutOfOrder {
                watcher,
                revision,
                after,
            } => write!(
                f,
                "watcher {watcher} was given revision {revision} after revision {after}"
            ),
            Self::FalselyCompacted { watcher, compacted } => write!(
                f,
                "watcher {watcher} was told the history is compacted to {compacted}, but it was not"
            ),
            Self::Failed { watcher, detail } => write!(f, "watcher {watcher} failed: {detail}"),
            Self::ReadDisagrees { revision, key } => write!(
                f,
                "the reference read and the acknowledged writes disagree on the change of {key} at revision {revision}"
            ),
            Self::ReferenceDisagrees {
                key,
                final_value,
                reference,
            } => write!(
                f,
                "the committed changes leave {key} = {}, its final value is {}",
                show(reference),
                show(final_value)
            ),
        }
    }
}

fn show(value: &Option<Bytes>) -> String {
    value
        .as_ref()
        .map_or_else(|| "absent".to_owned(), ToString::to_string)
}

/// What the checker could not decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchUndecided {
    /// Revisions the watcher was given that neither the reference read
    /// nor the acknowledged writes cover.
    Uncovered {
        /// The watcher.
        watcher: WatcherId,
        /// Its prefix.
        prefix: Bytes,
        /// The first revision not covered.
        from: u64,
        /// The last.
        through: u64,
    },
    /// Why the acknowledged writes could not stand in where the read did
    /// not reach.
    AcknowledgedRefuted {
        /// The prefix.
        prefix: Bytes,
        /// Why.
        reason: String,
    },
    /// Told its revision was compacted, and no reference read shows
    /// whether it was.
    CompactionUnconfirmed {
        /// The watcher.
        watcher: WatcherId,
        /// The compacted revision it was told.
        compacted: u64,
    },
}

impl fmt::Display for WatchUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uncovered {
                watcher,
                prefix,
                from,
                through,
            } => {
                let range = if *through == u64::MAX {
                    format!("{from} on")
                } else {
                    format!("{from}..={through}")
                };
                write!(
                    f,
                    "watcher {watcher}: revisions {range} of {prefix} are covered neither by the reference read nor by the acknowledged writes"
                )
            }
            Self::AcknowledgedRefuted { prefix, reason } => write!(
                f,
                "the acknowledged writes of {prefix} cannot serve as a reference: {reason}"
            ),
            Self::CompactionUnconfirmed { watcher, compacted } => write!(
                f,
                "watcher {watcher} was told the history is compacted to {compacted}, and no reference read shows whether it was"
            ),
        }
    }
}

/// The watch checker's verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchesVerdict {
    /// Watchers judged (references not counted).
    pub watchers: usize,
    /// Changes they were given.
    pub changes: usize,
    /// Committed changes the references hold.
    pub reference_changes: usize,
    /// Of them, those only the acknowledged writes gave (where no
    /// reference read reached).
    pub acknowledged_changes: usize,
    /// Violations found.
    pub violations: Vec<WatchViolation>,
    /// What could not be decided.
    pub undecided: Vec<WatchUndecided>,
}

impl Findings for WatchesVerdict {
    const CHECKER: &'static str = "watches";
    const PASS: &'static str = "every watcher saw the committed sequence";
    type Violation = WatchViolation;
    type Undecided = WatchUndecided;

    fn violations(&self) -> &[WatchViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[WatchUndecided] {
        &self.undecided
    }

    fn scope(&self) -> String {
        let mut scope = format!(
            "{} watcher(s) given {} change(s), against {} committed change(s)",
            self.watchers, self.changes, self.reference_changes
        );
        if self.acknowledged_changes > 0 {
            scope.push_str(&format!(
                ", {} of them from the acknowledged writes",
                self.acknowledged_changes
            ));
        }
        scope
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        (self.watchers == 0).then_some("no watchers recorded")
    }
}

/// Checks every watcher of `record` against its prefix's references.
pub fn check(record: &Record) -> WatchesVerdict {
    let mut verdict = WatchesVerdict::default();
    let prefixes: BTreeSet<&Bytes> = record.watches.values().map(|w| &w.prefix).collect();
    for prefix in prefixes {
        let reference = Reference::new(record, prefix, &mut verdict);
        let mut uncovered = false;
        for watch in record
            .watches
            .values()
            .filter(|w| !w.reference && w.prefix == *prefix)
        {
            verdict.watchers += 1;
            verdict.changes += watch.events.len();
            uncovered |= check_watcher(watch, &reference, &mut verdict);
        }
        if uncovered {
            for reason in &reference.refuted {
                verdict.undecided.push(WatchUndecided::AcknowledgedRefuted {
                    prefix: prefix.clone(),
                    reason: reason.clone(),
                });
            }
        }
    }
    verdict
}

/// Revision ranges (inclusive), sorted and disjoint once normalized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Revisions(Vec<(u64, u64)>);

impl Revisions {
    /// Adds `from..=through` (call [`Revisions::normalize`] before asking).
    fn insert(&mut self, from: u64, through: u64) {
        if from <= through {
            self.0.push((from, through));
        }
    }

    /// Sorts and merges the ranges.
    fn normalize(&mut self) {
        self.0.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.0.len());
        for &(from, through) in &self.0 {
            match merged.last_mut() {
                Some(last) if from <= last.1.saturating_add(1) => last.1 = last.1.max(through),
                _ => merged.push((from, through)),
            }
        }
        self.0 = merged;
    }

    fn contains(&self, revision: u64) -> bool {
        let after = self.0.partition_point(|(from, _)| *from <= revision);
        after
            .checked_sub(1)
            .and_then(|i| self.0.get(i))
            .is_some_and(|(_, through)| revision <= *through)
    }

    /// The parts of `from..=through` these ranges hold.
    fn within(&self, from: u64, through: u64) -> Vec<(u64, u64)> {
        self.0
            .iter()
            .filter(|(a, b)| *a <= through && *b >= from)
            .map(|(a, b)| ((*a).max(from), (*b).min(through)))
            .collect()
    }

    /// The parts of `from..=through` these ranges do not hold.
    fn gaps(&self, from: u64, through: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut next = from;
        for (a, b) in self.within(from, through) {
            if a > next {
                gaps.push((next, a - 1));
            }
            next = b.saturating_add(1);
            if b == u64::MAX {
                return gaps;
            }
        }
        if next <= through {
            gaps.push((next, through));
        }
        gaps
    }
}

/// The committed changes of one prefix, as far as the references cover.
struct Reference {
    /// What the reference reads cover.
    read: Revisions,
    /// The reference reads, as (start, through).
    reads: Vec<(u64, u64)>,
    /// What the acknowledged writes do not cover (`None`: they do not
    /// serve at all).
    unknown: Option<Revisions>,
    /// The committed changes at covered revisions.
    changes: BTreeMap<u64, Vec<Change>>,
    /// Why the acknowledged writes do not serve.
    refuted: Vec<String>,
}

impl Reference {
    fn new(record: &Record, prefix: &Bytes, verdict: &mut WatchesVerdict) -> Reference {
        let mut reference = Reference {
            read: Revisions::default(),
            reads: Vec::new(),
            unknown: None,
            changes: BTreeMap::new(),
            refuted: Vec::new(),
        };
        for read in record
            .watches
            .values()
            .filter(|w| w.reference && w.prefix == *prefix)
        {
            if read.end == Some(WatchEnd::Stopped) {
                check_reference(read, record, verdict);
            }
            let (start, through) = (read.start_revision, read.delivered_through);
            if through < start {
                continue;
            }
            // A revision an earlier read covers is judged by that one.
            for seen in &read.events {
                if (start..=through).contains(&seen.revision)
                    && !reference.read.contains(seen.revision)
                {
                    reference
                        .changes
                        .entry(seen.revision)
                        .or_default()
                        .push(change(seen));
                }
            }
            reference.reads.push((start, through));
            reference.read.insert(start, through);
            reference.read.normalize();
        }
        let acknowledged = acknowledged::derive(record, prefix);
        if acknowledged.refuted.is_empty() {
            reference.cross_check(&acknowledged, verdict);
            for (revision, changes) in &acknowledged.changes {
                if !reference.read.contains(*revision) && !acknowledged.unknown.contains(*revision)
                {
                    verdict.acknowledged_changes += changes.len();
                    reference
                        .changes
                        .entry(*revision)
                        .or_default()
                        .extend(changes.iter().cloned());
                }
            }
            reference.unknown = Some(acknowledged.unknown);
        } else {
            reference.refuted = acknowledged.refuted;
        }
        verdict.reference_changes += reference.changes.values().map(Vec::len).sum::<usize>();
        reference
    }

    /// The reads' changes against the acknowledged writes wherever both
    /// cover a revision.
    fn cross_check(&self, acknowledged: &acknowledged::Acknowledged, verdict: &mut WatchesVerdict) {
        for &(start, through) in &self.read.0 {
            let both = |revision: &u64| !acknowledged.unknown.contains(*revision);
            let read: BTreeSet<&Change> = self
                .changes
                .range(start..=through)
                .filter(|(revision, _)| both(revision))
                .flat_map(|(_, changes)| changes)
                .collect();
            let placed: BTreeSet<&Change> = acknowledged
                .changes
                .range(start..=through)
                .filter(|(revision, _)| both(revision))
                .flat_map(|(_, changes)| changes)
                .collect();
            for (revision, key, _, _) in read.symmetric_difference(&placed) {
                verdict.violations.push(WatchViolation::ReadDisagrees {
                    revision: *revision,
                    key: key.clone(),
                });
            }
        }
    }

    /// Whether a reference covers `revision`.
    fn covers(&self, revision: u64) -> bool {
        self.read.contains(revision)
            || self
                .unknown
                .as_ref()
                .is_some_and(|unknown| !unknown.contains(revision))
    }

    /// The parts of `from..=through` no reference covers.
    fn uncovered(&self, from: u64, through: u64) -> Vec<(u64, u64)> {
        let unread = self.read.gaps(from, through);
        match &self.unknown {
            None => unread,
            Some(unknown) => unread
                .into_iter()
                .flat_map(|(a, b)| unknown.within(a, b))
                .collect(),
        }
    }
}

/// The reference's final state of each key against the final values.
fn check_reference(reference: &WatchRecord, record: &Record, verdict: &mut WatchesVerdict) {
    let mut last: BTreeMap<&Bytes, Option<Bytes>> = BTreeMap::new();
    for seen in &reference.events {
        let value = match seen.kind {
            WatchKind::Put => Some(seen.value.clone().unwrap_or_default()),
            WatchKind::Delete => None,
        };
        last.insert(&seen.key, value);
    }
    for (key, final_value) in &record.final_values {
        if !key.0.starts_with(&reference.prefix.0) {
            continue;
        }
        // A key the reference never saw change was absent throughout
        // (when the reference started at revision 1).
        let reference_value = match last.get(key) {
            Some(value) => value.clone(),
            None if reference.start_revision <= 1 => None,
            None => continue,
        };
        if reference_value != *final_value {
            verdict.violations.push(WatchViolation::ReferenceDisagrees {
                key: key.clone(),
                final_value: final_value.clone(),
                reference: reference_value,
            });
        }
    }
}

/// Judges one watcher; returns whether it was given revisions no
/// reference covers.
fn check_watcher(watch: &WatchRecord, reference: &Reference, verdict: &mut WatchesVerdict) -> bool {
    let id = watch.watcher;
    match &watch.end {
        Some(WatchEnd::Compacted { compacted }) => {
            let compacted = *compacted;
            if reference
                .reads
                .iter()
                .any(|(start, through)| (*start..=*through).contains(&compacted))
            {
                verdict.violations.push(WatchViolation::FalselyCompacted {
                    watcher: id,
                    compacted,
                });
            } else if !reference.reads.iter().any(|(start, _)| *start > compacted) {
                verdict
                    .undecided
                    .push(WatchUndecided::CompactionUnconfirmed {
                        watcher: id,
                        compacted,
                    });
            }
        }
        Some(WatchEnd::Failed { detail }) => verdict.violations.push(WatchViolation::Failed {
            watcher: id,
            detail: detail.clone(),
        }),
        Some(WatchEnd::Stopped) | None => {}
    }
    // Order, and repeats, as given.
    let mut latest = 0;
    let mut given: BTreeSet<(u64, &Bytes)> = BTreeSet::new();
    for seen in &watch.events {
        if seen.revision < latest {
            verdict.violations.push(WatchViolation::OutOfOrder {
                watcher: id,
                revision: seen.revision,
                after: latest,
            });
        }
        latest = latest.max(seen.revision);
        if !given.insert((seen.revision, &seen.key)) {
            verdict.violations.push(WatchViolation::Repeated {
                watcher: id,
                revision: seen.revision,
                key: seen.key.clone(),
            });
        }
    }
    // Everything given through `through` against the committed changes in
    // `start..=through`, wherever a reference covers them.
    let start = watch.start_revision;
    let through = watch.delivered_through.max(latest);
    let uncovered = if through >= start {
        reference.uncovered(start, through)
    } else {
        Vec::new()
    };
    for &(from, to) in &uncovered {
        verdict.undecided.push(WatchUndecided::Uncovered {
            watcher: id,
            prefix: watch.prefix.clone(),
            from,
            through: to,
        });
    }
    let expected: BTreeSet<&Change> = if through >= start {
        reference
            .changes
            .range(start..=through)
            .flat_map(|(_, changes)| changes)
            .collect()
    } else {
        BTreeSet::new()
    };
    let got: Vec<Change> = watch
        .events
        .iter()
        .filter(|s| s.revision <= through && reference.covers(s.revision))
        .map(change)
        .collect();
    let got: BTreeSet<&Change> = got.iter().collect();
    for (revision, key, _, _) in expected.difference(&got) {
        verdict.violations.push(WatchViolation::Missing {
            watcher: id,
            revision: *revision,
            key: key.clone(),
        });
    }
    for (revision, key, _, _) in got.difference(&expected) {
        verdict.violations.push(WatchViolation::NotCommitted {
            watcher: id,
            revision: *revision,
            key: key.clone(),
        });
    }
    !uncovered.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};

    fn seen(watcher: WatcherId, revision: u64, key: &str, value: &str) -> WatchSeen {
        WatchSeen {
            at_ns: revision,
            watcher,
            revision,
            key: Bytes::from(key),
            kind: WatchKind::Put,
            value: Some(Bytes::from(value)),
        }
    }

    fn watch(watcher: WatcherId, start: u64, reference: bool, revisions: &[u64]) -> WatchRecord {
        WatchRecord {
            watcher,
            prefix: Bytes::from("p/"),
            start_revision: start,
            reference,
            started_ns: 0,
            events: revisions
                .iter()
                .map(|r| seen(watcher, *r, "p/a", &r.to_string()))
                .collect(),
            delivered_through: revisions.iter().copied().max().unwrap_or(0),
            end: Some(WatchEnd::Stopped),
            stopped_ns: Some(100),
        }
    }

    fn record(watches: Vec<WatchRecord>, last: Option<&str>) -> Record {
        let mut record = Record {
            watches: watches.into_iter().map(|w| (w.watcher, w)).collect(),
            ..Record::default()
        };
        record
            .final_values
            .insert(Bytes::from("p/a"), last.map(Bytes::from));
        record
    }

    #[test]
    fn the_committed_sequence_passes() {
        let r = record(
            vec![
                watch(1, 1, false, &[2, 5, 9]),
                watch(2, 4, false, &[5]),
                watch(9, 1, true, &[2, 5, 9, 12]),
            ],
            Some("12"),
        );
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn gaps_repeats_and_disorder_fail() {
        let r = record(
            vec![
                watch(1, 1, false, &[2, 9]),
                watch(2, 1, false, &[2, 5, 5, 9]),
                watch(3, 1, false, &[5, 2, 9]),
                watch(9, 1, true, &[2, 5, 9]),
            ],
            Some("9"),
        );
        let text = check(&r).to_string();
        assert!(text.contains("watcher 1 missed"), "{text}");
        assert!(text.contains("watcher 2 was given the change"), "{text}");
        assert!(
            text.contains("watcher 3 was given revision 2 after"),
            "{text}"
        );
    }

    #[test]
    fn false_compaction_and_a_wrong_reference_fail() {
        let mut compacted = watch(1, 1, false, &[2]);
        compacted.end = Some(WatchEnd::Compacted { compacted: 3 });
        let r = record(vec![compacted, watch(9, 1, true, &[2, 5])], Some("2"));
        let text = check(&r).to_string();
        assert!(text.contains("compacted to 3"), "{text}");
        assert!(text.contains("committed changes leave p/a = 5"), "{text}");
    }

    #[test]
    fn no_reference_is_undecided() {
        let r = record(vec![watch(1, 1, false, &[2])], Some("2"));
        assert_eq!(check(&r).status(), Status::Undecided);
    }

    use crate::record::{Answer, AttemptResponse, Op, OpRecord, Outcome, Reply, RequestIdentity};

    /// `INCR p/a by 1` as op `id` on session 1, answered `value` at
    /// `index` when given (`None`: no answer recorded); told the reply
    /// when `ok`, else of an unknown outcome.
    fn incr(
        id: u64,
        value: i64,
        index: Option<u64>,
        ok: bool,
    ) -> (OpRecord, Option<AttemptResponse>) {
        let reply = Reply::Incr { value };
        let request = RequestIdentity::session(1, id);
        let op = OpRecord {
            id,
            client: 1,
            op: Op::Incr {
                key: Bytes::from("p/a"),
                by: 1,
            },
            request: request.clone(),
            invoke_ns: id * 100,
            complete_ns: Some(id * 100 + 50),
            attempts: 1,
            outcome: if ok {
                Outcome::Ok {
                    reply: reply.clone(),
                    canonical: None,
                }
            } else {
                Outcome::Unknown { detail: None }
            },
        };
        let response = index.map(|index| AttemptResponse {
            at_ns: id * 100 + 40,
            client: 1,
            op_id: Some(id),
            request,
            attempt: 1,
            node: None,
            answer: Answer::Applied {
                reply,
                canonical: None,
                log_index: Some(index),
            },
            dropped_after_commit: !ok,
            batch: 1,
        });
        (op, response)
    }

    /// Four increments of `p/a` (values 1..=4) acknowledged at revisions 3,
    /// 5, 8 and 9, with its final value, and `watches`.
    fn acknowledged_run(watches: Vec<WatchRecord>) -> Record {
        let mut r = record(watches, Some("4"));
        for (id, (value, index)) in [(1, 3), (2, 5), (3, 8), (4, 9)].into_iter().enumerate() {
            let (op, response) = incr(id as u64 + 1, value, Some(index), true);
            r.ops.push(op);
            r.responses.extend(response);
        }
        r
    }

    /// A watcher given the changes at `revisions` of the run above.
    fn given(watcher: WatcherId, start: u64, revisions: &[u64]) -> WatchRecord {
        let value = |revision| match revision {
            3 => "1",
            5 => "2",
            8 => "3",
            9 => "4",
            _ => "?",
        };
        let mut w = watch(watcher, start, false, &[]);
        w.events = revisions
            .iter()
            .map(|r| seen(watcher, *r, "p/a", value(*r)))
            .collect();
        w.delivered_through = 12;
        w
    }

    #[test]
    fn without_a_reference_read_the_acknowledged_writes_judge() {
        let r = acknowledged_run(vec![given(1, 1, &[3, 5, 8, 9]), given(2, 6, &[8, 9])]);
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.acknowledged_changes, 4);

        let gap = acknowledged_run(vec![given(1, 1, &[3, 8, 9])]);
        let text = check(&gap).to_string();
        assert!(
            text.contains("watcher 1 missed the change of p/a at revision 5"),
            "{text}"
        );

        let repeat = acknowledged_run(vec![given(1, 1, &[3, 5, 5, 8, 9])]);
        let text = check(&repeat).to_string();
        assert!(text.contains("at revision 5 twice"), "{text}");
    }

    #[test]
    fn a_reference_read_cut_short_is_completed_by_the_acknowledged_writes() {
        // The read got through revision 6 only, and failed.
        let mut read = given(9, 1, &[3, 5]);
        read.reference = true;
        read.delivered_through = 6;
        read.end = Some(WatchEnd::Failed {
            detail: "cut short".into(),
        });
        let r = acknowledged_run(vec![read.clone(), given(1, 1, &[3, 5, 8, 9])]);
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.acknowledged_changes, 2);

        let gap = acknowledged_run(vec![read.clone(), given(1, 1, &[3, 5, 9])]);
        let text = check(&gap).to_string();
        assert!(
            text.contains("watcher 1 missed the change of p/a at revision 8"),
            "{text}"
        );

        // Where both cover a revision, they must agree.
        let mut wrong = read;
        wrong.events[1].value = Some(Bytes::from("7"));
        let text = check(&acknowledged_run(vec![wrong])).to_string();
        assert!(
            text.contains("disagree on the change of p/a at revision 5"),
            "{text}"
        );
    }

    #[test]
    fn what_the_record_does_not_place_is_undecided() {
        // A fifth increment of unknown outcome, never answered: it may have
        // run anywhere after revision 9 (the highest index answered before
        // it), so the final value says nothing either.
        let mut r = acknowledged_run(vec![given(1, 1, &[3, 5, 8, 9, 11])]);
        r.ops.push(incr(5, 5, None, false).0);
        r.final_values
            .insert(Bytes::from("p/a"), Some(Bytes::from("5")));
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
        assert!(
            verdict.to_string().contains("revisions 10..=12"),
            "{verdict}"
        );
        // A gap before it is still a gap.
        let mut gap = acknowledged_run(vec![given(1, 1, &[3, 8, 9, 11])]);
        gap.ops.push(incr(5, 5, None, false).0);
        gap.final_values
            .insert(Bytes::from("p/a"), Some(Bytes::from("5")));
        assert_eq!(check(&gap).status(), Status::Fail);
        // Answered (the reply was dropped after commit), it is placed.
        let mut placed = acknowledged_run(vec![given(1, 1, &[3, 5, 8, 9, 11])]);
        let (op, response) = incr(5, 5, Some(11), false);
        placed.ops.push(op);
        placed.responses.extend(response);
        placed
            .final_values
            .insert(Bytes::from("p/a"), Some(Bytes::from("5")));
        let mut watcher = given(1, 1, &[3, 5, 8, 9]);
        watcher.events.push(seen(1, 11, "p/a", "5"));
        placed.watches.insert(1, watcher);
        let verdict = check(&placed);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
    }

    #[test]
    fn an_etcd_txn_under_a_key_of_its_own_is_placed_by_its_answer() {
        use crate::record::{Compare, CompareOp, CompareTarget, KeyRange, Txn, TxnOp, TxnOpResult};
        // The fifth write, as the etcd workload records a guarded update:
        // a plain operation whose answer was recorded under an
        // idempotency key attributed to it, a Txn reply without
        // per-operation results; the client was told them.
        let mut r = acknowledged_run(vec![]);
        let update = Txn {
            compares: vec![Compare {
                range: KeyRange::Key(Bytes::from("p/a")),
                op: CompareOp::Equal,
                target: CompareTarget::Value(Bytes::from("4")),
            }],
            success: vec![TxnOp::Put {
                key: Bytes::from("p/a"),
                value: Bytes::from("5"),
            }],
            failure: vec![TxnOp::Get {
                key: Bytes::from("p/a"),
            }],
        };
        let (mut op, response) = incr(5, 5, Some(11), true);
        op.op = Op::Txn(update);
        op.request = RequestIdentity::plain();
        op.outcome = Outcome::Ok {
            reply: Reply::Txn {
                succeeded: true,
                results: vec![TxnOpResult::Put {
                    previous: Some(Bytes::from("4")),
                }],
            },
            canonical: None,
        };
        let mut response = response.expect("an answer");
        response.request = RequestIdentity::idempotent(b"e-c1-5-1".to_vec());
        response.answer = Answer::Applied {
            reply: Reply::Txn {
                succeeded: true,
                results: Vec::new(),
            },
            canonical: None,
            log_index: Some(11),
        };
        r.ops.push(op);
        r.responses.push(response);
        r.final_values
            .insert(Bytes::from("p/a"), Some(Bytes::from("5")));
        let mut watcher = given(1, 1, &[3, 5, 8, 9]);
        watcher.events.push(seen(1, 11, "p/a", "5"));
        r.watches.insert(1, watcher);
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert_eq!(verdict.acknowledged_changes, 5);
        // Missing it is caught.
        r.watches.insert(1, given(1, 1, &[3, 5, 8, 9]));
        let text = check(&r).to_string();
        assert!(text.contains("at revision 11"), "{text}");
    }

    #[test]
    fn an_unknown_transfer_whose_token_is_not_in_its_ledger_never_ran() {
        use crate::record::{Txn, TxnOp};
        let transfer = |token: &str| {
            let mut op = incr(5, 5, None, false).0;
            op.op = Op::Txn(Txn {
                compares: Vec::new(),
                success: vec![
                    TxnOp::Incr {
                        key: Bytes::from("p/a"),
                        by: 1,
                    },
                    TxnOp::Append {
                        key: Bytes::from("ledger"),
                        value: Bytes::from(token),
                    },
                ],
                failure: Vec::new(),
            });
            op
        };
        let mut r = acknowledged_run(vec![given(1, 1, &[3, 5, 8, 9])]);
        r.ops.push(transfer("t5;"));
        r.final_values
            .insert(Bytes::from("ledger"), Some(Bytes::from("t1;t2;")));
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        // In the ledger, it ran somewhere after revision 9.
        r.final_values
            .insert(Bytes::from("ledger"), Some(Bytes::from("t1;t5;")));
        assert_eq!(check(&r).status(), Status::Undecided);
    }

    #[test]
    fn acknowledged_writes_that_miss_a_change_do_not_serve() {
        // The final value counts an increment the record does not hold.
        let mut r = acknowledged_run(vec![given(1, 1, &[3, 5, 8, 9])]);
        r.final_values
            .insert(Bytes::from("p/a"), Some(Bytes::from("5")));
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
        assert!(
            verdict.to_string().contains("its final value is 5"),
            "{verdict}"
        );
        // An increment missing between two others breaks the count.
        let mut r = acknowledged_run(vec![given(1, 1, &[3, 8, 9])]);
        r.ops.remove(1);
        r.responses.remove(1);
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
        assert!(verdict.to_string().contains("counted from 2"), "{verdict}");
    }

    #[test]
    fn a_compaction_the_reference_read_also_met_is_right() {
        let mut compacted = given(1, 1, &[]);
        compacted.delivered_through = 0;
        compacted.end = Some(WatchEnd::Compacted { compacted: 4 });
        let mut read = given(9, 6, &[8, 9]);
        read.reference = true;
        let r = acknowledged_run(vec![compacted.clone(), read]);
        let verdict = check(&r);
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        // With no read to tell, it is undecided.
        let r = acknowledged_run(vec![compacted]);
        assert_eq!(check(&r).status(), Status::Undecided);
    }
}
