//! The watch checker: every watcher was given exactly the committed change
//! sequence of its prefix, in revision order, without gaps or repeats,
//! across its resumes.
//!
//! The ground truth is the run's *reference* watcher of the same prefix:
//! one read after the faults healed, from a start revision at or before
//! the watcher's, until a progress notice past the last applied index. A
//! watcher that started at revision `s` and was given everything through
//! revision `d` (its last change or progress notice) must have been given
//! exactly the reference's changes with revisions in `s..=d`, in the same
//! order: a change missing is a gap, one given twice a repeat, one not in
//! the reference an invention, and a change with another value or kind a
//! corruption. A watcher told `Compacted` is wrong when the reference,
//! which started no later, read those revisions afterwards. The reference
//! itself must agree with the final values read after the run (the last
//! change of each key is its final state).
//!
//! No reference for a prefix that was watched leaves the checker
//! `Undecided`, never a pass.

use super::{CheckerVerdict, Status};
use crate::record::{Bytes, Record, WatchEnd, WatchKind, WatchRecord, WatchSeen, WatcherId};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

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
    /// No complete reference of the watcher's prefix from its start.
    NoReference {
        /// The watcher.
        watcher: WatcherId,
        /// Its prefix.
        prefix: Bytes,
    },
    /// The watcher was given revisions past the reference's end.
    PastReference {
        /// The watcher.
        watcher: WatcherId,
        /// Its last revision.
        delivered_through: u64,
        /// The reference's.
        reference_through: u64,
    },
}

impl fmt::Display for WatchUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoReference { watcher, prefix } => write!(
                f,
                "watcher {watcher}: no complete reference read of {prefix} to judge it by"
            ),
            Self::PastReference {
                watcher,
                delivered_through,
                reference_through,
            } => write!(
                f,
                "watcher {watcher} reached revision {delivered_through}, the reference only {reference_through}"
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
    /// Changes in the references.
    pub reference_changes: usize,
    /// Violations found.
    pub violations: Vec<WatchViolation>,
    /// What could not be decided.
    pub undecided: Vec<WatchUndecided>,
}

impl CheckerVerdict for WatchesVerdict {
    fn checker(&self) -> &'static str {
        "watches"
    }

    fn status(&self) -> Status {
        Status::from_counts(self.violations.len(), self.undecided.len())
    }

    fn headline(&self) -> String {
        let scope = format!(
            "{} watcher(s) given {} change(s), against {} committed change(s)",
            self.watchers, self.changes, self.reference_changes
        );
        match self.status() {
            Status::Pass if self.watchers == 0 => "no watchers recorded".to_owned(),
            Status::Pass => format!("every watcher saw the committed sequence: {scope}"),
            Status::Fail => format!("{} violation(s): {scope}", self.violations.len()),
            Status::Undecided => format!("undecided, no violation: {scope}"),
        }
    }

    fn details(&self) -> Vec<String> {
        self.violations
            .iter()
            .map(ToString::to_string)
            .chain(self.undecided.iter().map(ToString::to_string))
            .collect()
    }
}

impl fmt::Display for WatchesVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explanation())
    }
}

/// Checks every watcher of `record` against its prefix's reference.
pub fn check(record: &Record) -> WatchesVerdict {
    let mut verdict = WatchesVerdict::default();
    let references: Vec<&WatchRecord> = record
        .watches
        .values()
        .filter(|w| w.reference && w.end == Some(WatchEnd::Stopped))
        .collect();
    for reference in &references {
        verdict.reference_changes += reference.events.len();
        check_reference(reference, record, &mut verdict);
    }
    for watch in record.watches.values().filter(|w| !w.reference) {
        verdict.watchers += 1;
        verdict.changes += watch.events.len();
        let reference = references
            .iter()
            .filter(|r| r.prefix == watch.prefix && r.start_revision <= watch.start_revision)
            .max_by_key(|r| r.delivered_through);
        let Some(reference) = reference else {
            verdict.undecided.push(WatchUndecided::NoReference {
                watcher: watch.watcher,
                prefix: watch.prefix.clone(),
            });
            continue;
        };
        check_watcher(watch, reference, &mut verdict);
    }
    verdict
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

fn check_watcher(watch: &WatchRecord, reference: &WatchRecord, verdict: &mut WatchesVerdict) {
    let id = watch.watcher;
    match &watch.end {
        Some(WatchEnd::Compacted { compacted }) => {
            verdict.violations.push(WatchViolation::FalselyCompacted {
                watcher: id,
                compacted: *compacted,
            })
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
    // Everything given through `through` against the reference's changes
    // in `start..=through`.
    let delivered = watch.delivered_through.max(latest);
    let through = delivered.min(reference.delivered_through);
    if delivered > reference.delivered_through {
        verdict.undecided.push(WatchUndecided::PastReference {
            watcher: id,
            delivered_through: delivered,
            reference_through: reference.delivered_through,
        });
    }
    let expected: BTreeSet<Change> = reference
        .events
        .iter()
        .filter(|s| s.revision >= watch.start_revision && s.revision <= through)
        .map(change)
        .collect();
    let got: BTreeSet<Change> = watch
        .events
        .iter()
        .filter(|s| s.revision <= through)
        .map(change)
        .collect();
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
