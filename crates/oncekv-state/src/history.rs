//! [`History`]: the store's recent changes, one [`Event`] per key changed,
//! in revision order. It answers reads of the past (`get --revision R`) and
//! feeds watches. It is bounded in events, bytes and cluster time: the
//! oldest revisions are compacted (dropped whole) when a bound is passed,
//! or on request, and a read or watch below the compacted revision is
//! refused as `Compacted`. A revision is the log index of the entry that
//! made the change, so it is the same on every replica.
//!
//! Events are shared ([`Arc`]) in a vector that shares structure: a copy of
//! the history (for a snapshot, taken under the state lock) costs the same
//! whatever its length, and copies no key or value.

use crate::ids::ClusterTime;
use crate::refusal::Rejection;
use crate::value::StoredValue;
use imbl::Vector;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the history counts for an event beyond its key and values.
pub const EVENT_OVERHEAD_BYTES: u64 = 96;

/// The revision and cluster time a change is made at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The log index of the entry making the change.
    pub revision: u64,
    /// Its cluster time.
    pub time: ClusterTime,
}

/// One change of one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The revision of the change.
    pub revision: u64,
    /// The cluster time of the change.
    pub time: ClusterTime,
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The key after the change; `None` for a delete (shared with the
    /// store).
    pub value: Option<Arc<StoredValue>>,
    /// The key before the change; `None` if it was absent.
    pub previous: Option<Arc<StoredValue>>,
}

impl Event {
    /// Whether the change deleted the key.
    pub fn is_delete(&self) -> bool {
        self.value.is_none()
    }

    /// What the event weighs against the history's byte bound.
    pub fn weight_bytes(&self) -> u64 {
        let stored = |s: &Option<Arc<StoredValue>>| {
            s.as_ref().map_or(0, |s| {
                s.value.len() + s.lease.as_ref().map_or(0, String::len)
            })
        };
        ((self.key.len() + stored(&self.value) + stored(&self.previous)) as u64)
            .saturating_add(EVENT_OVERHEAD_BYTES)
    }
}

/// The bounds of the history (part of [`Limits`](crate::Limits)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryBounds {
    /// Most events kept.
    pub events_max: u64,
    /// Most bytes of events kept.
    pub bytes_max: u64,
    /// Longest time an event is kept, in cluster time.
    pub retention_ms: u64,
}

/// Recent changes of the store, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(deserialize_with = "crate::decode::vector")]
    events: Vector<Arc<Event>>,
    /// Every event at or below this revision has been dropped.
    compacted: u64,
    /// What the events weigh (derived; recounted on restore).
    #[serde(skip)]
    bytes: u64,
}

impl History {
    /// The compacted revision: reads at revisions below it, and watches
    /// from revisions at or below it, are refused.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Events kept.
    pub fn len(&self) -> u64 {
        self.events.len() as u64
    }

    /// Whether no event is kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Bytes the kept events weigh.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Recounts the derived byte count (after decoding).
    pub(crate) fn recount(&mut self) {
        self.bytes = self.events.iter().map(|event| event.weight_bytes()).sum();
    }

    /// Records a change (revisions never decrease).
    pub(crate) fn record(&mut self, event: Event) {
        self.bytes = self.bytes.saturating_add(event.weight_bytes());
        self.events.push_back(Arc::new(event));
    }

    /// Drops every event at or below `revision`.
    pub(crate) fn compact(&mut self, revision: u64) {
        while let Some(oldest) = self.events.front() {
            if oldest.revision > revision {
                break;
            }
            self.drop_oldest();
        }
        self.compacted = self.compacted.max(revision);
    }

    /// Drops the oldest revisions (whole) while a bound is passed.
    pub(crate) fn enforce(&mut self, bounds: HistoryBounds, now: ClusterTime) {
        while let Some(oldest) = self.events.front() {
            let expired = oldest.time.plus_ms(bounds.retention_ms) < now;
            if !expired && self.len() <= bounds.events_max && self.bytes <= bounds.bytes_max {
                break;
            }
            let revision = oldest.revision;
            self.compact(revision);
        }
    }

    /// Removes and returns the newest event (to undo it).
    pub(crate) fn pop_newest(&mut self) -> Option<Event> {
        let event = self.events.pop_back()?;
        self.bytes = self.bytes.saturating_sub(event.weight_bytes());
        Some(Arc::unwrap_or_clone(event))
    }

    fn drop_oldest(&mut self) {
        if let Some(event) = self.events.pop_front() {
            self.bytes = self.bytes.saturating_sub(event.weight_bytes());
        }
    }

    /// Events with revision `from` or later, oldest first: `Compacted` if
    /// some of them were dropped.
    pub fn since(&self, from: u64) -> Result<impl Iterator<Item = &Event>, Rejection> {
        if from <= self.compacted {
            return Err(Rejection::Compacted {
                revision: from,
                compacted: self.compacted,
            });
        }
        Ok(self.after(move |event| event.revision < from))
    }

    /// Whether the state at `revision` can still be reconstructed.
    pub fn check_readable(&self, revision: u64, current: u64) -> Result<(), Rejection> {
        if revision < self.compacted {
            return Err(Rejection::Compacted {
                revision,
                compacted: self.compacted,
            });
        }
        if revision > current {
            return Err(Rejection::FutureRevision { revision, current });
        }
        Ok(())
    }

    /// For each key changed after `revision` that `select` accepts, what it
    /// was at `revision` (the state before its first later change).
    pub(crate) fn before_changes_after(
        &self,
        revision: u64,
        select: impl Fn(&[u8]) -> bool,
    ) -> BTreeMap<&[u8], Option<&StoredValue>> {
        let mut past = BTreeMap::new();
        for event in self.after(move |event| event.revision <= revision) {
            if select(&event.key) {
                past.entry(event.key.as_slice())
                    .or_insert(event.previous.as_deref());
            }
        }
        past
    }

    /// The events after the first run of those `before` accepts (events
    /// are in revision order, so `before` tests a revision bound), oldest
    /// first.
    fn after(&self, before: impl Fn(&Event) -> bool) -> impl Iterator<Item = &Event> {
        let start = self
            .events
            .binary_search_by(|event| {
                if before(event) {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Greater
                }
            })
            .unwrap_or_else(|start| start);
        self.events
            .focus()
            .narrow(start..)
            .into_iter()
            .map(|event| &**event)
    }

    /// Every event, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().map(|event| &**event)
    }

    /// Checks that revisions do not decrease, nothing kept is compacted,
    /// and the byte count is right.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut last = self.compacted;
        for event in &self.events {
            if event.revision <= self.compacted || event.revision < last {
                return Err(format!(
                    "event at revision {} out of order (compacted {}, previous {last})",
                    event.revision, self.compacted
                ));
            }
            last = event.revision;
        }
        let weighed: u64 = self.events.iter().map(|event| event.weight_bytes()).sum();
        if weighed != self.bytes {
            return Err(format!("{} bytes counted, {weighed} kept", self.bytes));
        }
        Ok(())
    }
}
