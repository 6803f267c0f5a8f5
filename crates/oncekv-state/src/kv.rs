//! [`KvStore`]: the ordered key-value data, each key with its revisions
//! ([`KeyMeta`]), the operations on it (PUT, GET, DELETE, APPEND, INCR,
//! CAS, SCAN, reads of a key range with their count, at the current
//! revision or a past one) and the [`History`]
//! of its changes. Every change goes through [`KvStore::write`], which
//! stamps the revision and records the event. It knows nothing of
//! sessions; lease attachment is recorded per key and kept consistent by
//! the caller. It counts the bytes it holds, for the store's quota.

use crate::history::{Event, History, Stamp};
use crate::key_range::KeyRange;
use crate::overhead::STORE_ENTRY_OVERHEAD_BYTES;
use crate::refusal::Rejection;
use crate::value::{KeyMeta, SharedBytes, StoredValue};
use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A key, its value and its revisions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Its revisions.
    pub meta: KeyMeta,
}

/// Key-value pairs with their revisions, in key order.
pub type KvPairs = Vec<KeyValue>;

/// A point to undo changes back to ([`KvStore::undo_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UndoPoint {
    events: u64,
    revision: u64,
}

/// The key-value data, ordered by key, and its recent history. The map
/// shares structure and each value is shared ([`Arc`]) with the history's
/// events, so a copy of the store (for a snapshot, taken under the state
/// lock) costs the same whatever its size, and a write stores its value
/// once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvStore {
    #[serde(deserialize_with = "crate::decode::ord_map")]
    entries: OrdMap<Vec<u8>, Arc<StoredValue>>,
    /// The revision of the last change (0 before any).
    revision: u64,
    history: History,
    /// What the entries weigh (derived; recounted on restore).
    #[serde(skip)]
    bytes: u64,
}

/// What one stored key weighs against the store's quota: its key, value
/// and lease name plus a fixed allowance for the rest.
pub fn entry_weight_bytes(key: &[u8], stored: &StoredValue) -> u64 {
    weight_bytes(key, &stored.value, stored.lease.as_ref())
}

/// What an entry of `key`, `value` and `lease` would weigh
/// ([`entry_weight_bytes`]), without building it.
pub(crate) fn weight_bytes(key: &[u8], value: &[u8], lease: Option<&String>) -> u64 {
    let lease = lease.map_or(0, String::len);
    ((key.len() + value.len() + lease) as u64).saturating_add(STORE_ENTRY_OVERHEAD_BYTES)
}

impl KvStore {
    /// What all entries weigh, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Recounts the derived byte count (after decoding).
    pub(crate) fn recount(&mut self) {
        self.history.recount();
        self.bytes = self
            .entries
            .iter()
            .map(|(key, stored)| entry_weight_bytes(key, stored))
            .sum();
    }

    /// How many keys are stored.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.entries.contains_key(key)
    }

    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Option<&StoredValue> {
        self.entries.get(key).map(|stored| &**stored)
    }

    /// The revision of the last change (0 before any).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The history of recent changes.
    pub fn history(&self) -> &History {
        &self.history
    }

    pub(crate) fn history_mut(&mut self) -> &mut History {
        &mut self.history
    }

    /// Sets `key` to `value` (`None` deletes it) at `at`, keeping or
    /// setting its lease as given; stamps its revisions, records the event
    /// and returns what was there. The one way the data changes.
    pub fn write(
        &mut self,
        key: &[u8],
        value: Option<(SharedBytes, Option<String>)>,
        at: Stamp,
    ) -> Option<Arc<StoredValue>> {
        let previous = match self.entries.remove(key) {
            Some(old) => {
                self.bytes -= entry_weight_bytes(key, &old);
                Some(old)
            }
            None => None,
        };
        if previous.is_none() && value.is_none() {
            return None;
        }
        let stored = value.map(|(value, lease)| {
            let meta = match &previous {
                Some(old) => KeyMeta {
                    create_revision: old.meta.create_revision,
                    mod_revision: at.revision,
                    version: old.meta.version.saturating_add(1),
                },
                None => KeyMeta {
                    create_revision: at.revision,
                    mod_revision: at.revision,
                    version: 1,
                },
            };
            Arc::new(StoredValue { value, lease, meta })
        });
        if let Some(stored) = &stored {
            self.bytes += entry_weight_bytes(key, stored);
            self.entries.insert(key.to_vec(), Arc::clone(stored));
        }
        self.revision = self.revision.max(at.revision);
        self.history.record(Event {
            revision: at.revision,
            time: at.time,
            key: key.to_vec(),
            value: stored,
            previous: previous.clone(),
        });
        previous
    }

    /// Where the store is now, to undo later changes back to (while the
    /// history is not compacted in between).
    pub(crate) fn undo_point(&self) -> UndoPoint {
        UndoPoint {
            events: self.history.len(),
            revision: self.revision,
        }
    }

    /// Undoes every change made since `point`, newest first, and returns
    /// them (so the caller can undo what it derived from them).
    pub(crate) fn undo_to(&mut self, point: UndoPoint) -> Vec<Event> {
        let mut undone = Vec::new();
        while self.history.len() > point.events {
            let Some(event) = self.history.pop_newest() else {
                break;
            };
            if let Some(now) = self.entries.remove(&event.key) {
                self.bytes -= entry_weight_bytes(&event.key, &now);
            }
            if let Some(before) = &event.previous {
                self.bytes += entry_weight_bytes(&event.key, before);
                self.entries.insert(event.key.clone(), before.clone());
            }
            undone.push(event);
        }
        self.revision = point.revision;
        undone
    }

    /// The entries whose key starts with `prefix`, in key order.
    pub fn iter_prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a StoredValue)> + 'a {
        self.entries
            .range(prefix.to_vec()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(key, stored)| (key, &**stored))
    }

    /// The entries in `range`, in key order.
    pub fn iter_range<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a StoredValue)> + 'a {
        // An empty range starts at or beyond its end: nothing passes it.
        self.entries
            .range(range.start.clone()..)
            .take_while(move |(key, _)| range.is_below_end(key))
            .map(|(key, stored)| (key, &**stored))
    }

    /// Entries in `range`, in key order, paged as [`scan`](Self::scan)
    /// pages them; whether more exist; and how many the range holds.
    pub fn scan_range(&self, range: &KeyRange, limit: usize, bytes_max: u64) -> RangePage {
        let matching = || {
            self.iter_range(range)
                .map(|(key, stored)| (key.as_slice(), stored))
        };
        let (entries, more) = page(matching(), limit, bytes_max);
        let count = if more {
            matching().count() as u64
        } else {
            entries.len() as u64
        };
        RangePage {
            entries,
            more,
            count,
        }
    }

    /// Like [`scan_range`](Self::scan_range), of the store as it was at
    /// `revision`.
    pub fn scan_range_at(
        &self,
        range: &KeyRange,
        revision: u64,
        limit: usize,
        bytes_max: u64,
    ) -> RangePage {
        let past = self
            .history
            .before_changes_after(revision, |key| range.contains(key));
        if past.is_empty() {
            return self.scan_range(range, limit, bytes_max);
        }
        let matching = || then_and_now(self.iter_range(range), &past);
        let (entries, more) = page(matching(), limit, bytes_max);
        let count = if more {
            matching().count() as u64
        } else {
            entries.len() as u64
        };
        RangePage {
            entries,
            more,
            count,
        }
    }

    /// Removes `key` at `at`, returning what was there.
    pub fn remove(&mut self, key: &[u8], at: Stamp) -> Option<Arc<StoredValue>> {
        self.write(key, None, at)
    }

    /// Replaces the value at `key`, keeping its lease attachment (a new key
    /// has no lease).
    pub fn set_value(&mut self, key: &[u8], value: SharedBytes, at: Stamp) {
        let lease = self
            .entries
            .get(key)
            .and_then(|stored| stored.lease.clone());
        self.write(key, Some((value, lease)), at);
    }

    /// Appends `suffix` to the value at `key` (absent counts as empty, and
    /// a new key has no lease).
    pub fn append(&mut self, key: &[u8], suffix: &[u8], at: Stamp) {
        let mut value = self
            .entries
            .get(key)
            .map(|stored| stored.value.to_vec())
            .unwrap_or_default();
        value.extend_from_slice(suffix);
        self.set_value(key, value.into(), at);
    }

    /// The value at `key` as it was at `revision` (after every change at
    /// or below it), if the history still reaches back that far.
    pub fn get_at(&self, key: &[u8], revision: u64) -> Option<StoredValue> {
        let past = self
            .history
            .before_changes_after(revision, |changed| changed == key);
        match past.get(key) {
            Some(before) => before.cloned(),
            None => self.get(key).cloned(),
        }
    }

    /// Checks that `revision` can be read: not compacted, not beyond
    /// `current` (the last applied index).
    pub fn check_readable(&self, revision: u64, current: u64) -> Result<(), Rejection> {
        self.history.check_readable(revision, current)
    }

    /// Entries whose key starts with `prefix`, in key order: at most
    /// `limit` of them, and no more once they hold `bytes_max` bytes of keys
    /// and values (the first entry is always returned); and whether more
    /// exist.
    pub fn scan(&self, prefix: &[u8], limit: usize, bytes_max: u64) -> (KvPairs, bool) {
        let matching = self
            .iter_prefix(prefix)
            .map(|(key, stored)| (key.as_slice(), stored));
        page(matching, limit, bytes_max)
    }

    /// Like [`scan`](Self::scan), of the store as it was at `revision`.
    pub fn scan_at(
        &self,
        prefix: &[u8],
        revision: u64,
        limit: usize,
        bytes_max: u64,
    ) -> (KvPairs, bool) {
        let past = self
            .history
            .before_changes_after(revision, |key| key.starts_with(prefix));
        if past.is_empty() {
            return self.scan(prefix, limit, bytes_max);
        }
        let mut view: BTreeMap<&[u8], &StoredValue> = self
            .iter_prefix(prefix)
            .map(|(key, stored)| (key.as_slice(), stored))
            .collect();
        for (key, before) in past {
            match before {
                Some(stored) => view.insert(key, stored),
                None => view.remove(key),
            };
        }
        page(view.into_iter(), limit, bytes_max)
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &StoredValue)> {
        self.entries.iter().map(|(key, stored)| (key, &**stored))
    }
}

/// A page of a range read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangePage {
    /// The entries, in key order.
    pub entries: KvPairs,
    /// Whether more keys are in the range beyond them.
    pub more: bool,
    /// How many keys the range holds.
    pub count: u64,
}

/// The entries of `now` (in key order) as they were when each key changed
/// later had the value `past` gives it (`None`: absent), in key order:
/// a merge of the two, `past` winning for the keys it names.
fn then_and_now<'a>(
    now: impl Iterator<Item = (&'a Vec<u8>, &'a StoredValue)>,
    past: &'a BTreeMap<&'a [u8], Option<&'a StoredValue>>,
) -> impl Iterator<Item = (&'a [u8], &'a StoredValue)> {
    let mut now = now.map(|(key, stored)| (key.as_slice(), stored)).peekable();
    let mut past = past.iter().peekable();
    std::iter::from_fn(move || {
        loop {
            let from_past = match (now.peek(), past.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((current, _)), Some((changed, _))) => **changed <= *current,
            };
            if !from_past {
                return now.next();
            }
            let (changed, before) = past.next()?;
            if now.peek().is_some_and(|(current, _)| current == changed) {
                now.next();
            }
            if let Some(before) = before {
                return Some((*changed, *before));
            }
        }
    })
}

/// At most `limit` of `matching`, and no more once they hold `bytes_max`
/// bytes of keys and values (the first is always taken); and whether more
/// remain.
fn page<'a>(
    matching: impl Iterator<Item = (&'a [u8], &'a StoredValue)>,
    limit: usize,
    bytes_max: u64,
) -> (KvPairs, bool) {
    let mut matching = matching.peekable();
    let mut entries = Vec::new();
    let mut bytes = 0u64;
    while let Some((key, stored)) = matching.peek() {
        let weight = (key.len() + stored.value.len()) as u64;
        if entries.len() >= limit
            || (!entries.is_empty() && bytes.saturating_add(weight) > bytes_max)
        {
            break;
        }
        bytes = bytes.saturating_add(weight);
        entries.push(KeyValue {
            key: key.to_vec(),
            value: stored.value.to_vec(),
            meta: stored.meta,
        });
        matching.next();
    }
    (entries, matching.peek().is_some())
}

/// Parses a stored counter: absent is 0, otherwise an ASCII decimal `i64`.
pub fn parse_counter(value: Option<&[u8]>) -> Option<i64> {
    match value {
        None => Some(0),
        Some(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
    }
}
