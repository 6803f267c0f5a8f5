//! [`KvStore`]: the ordered key-value data and the operations on it (PUT,
//! GET, DELETE, APPEND, INCR, CAS, SCAN). It knows nothing of sessions;
//! lease attachment is recorded per key and kept consistent by the caller.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Key-value pairs, in key order.
pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A stored value and the lease it is attached to, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredValue {
    /// The bytes.
    pub value: Vec<u8>,
    /// The lease that owns the key, if any.
    pub lease: Option<String>,
}

/// The key-value data, ordered by key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvStore {
    entries: BTreeMap<Vec<u8>, StoredValue>,
}

impl KvStore {
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
        self.entries.get(key)
    }

    /// Sets `key`, returning what was there.
    pub fn insert(&mut self, key: Vec<u8>, value: StoredValue) -> Option<StoredValue> {
        self.entries.insert(key, value)
    }

    /// Removes `key`, returning what was there.
    pub fn remove(&mut self, key: &[u8]) -> Option<StoredValue> {
        self.entries.remove(key)
    }

    /// Mutable access to the value at `key`.
    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut StoredValue> {
        self.entries.get_mut(key)
    }

    /// Up to `limit` entries whose key starts with `prefix`, in key order,
    /// and whether more exist.
    pub fn scan(&self, prefix: &[u8], limit: usize) -> (KvPairs, bool) {
        let mut matching = self
            .entries
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix));
        let entries: Vec<_> = matching
            .by_ref()
            .take(limit)
            .map(|(key, stored)| (key.clone(), stored.value.clone()))
            .collect();
        let more = matching.next().is_some();
        (entries, more)
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &StoredValue)> {
        self.entries.iter()
    }
}

/// Parses a stored counter: absent is 0, otherwise an ASCII decimal `i64`.
pub fn parse_counter(value: Option<&[u8]>) -> Option<i64> {
    match value {
        None => Some(0),
        Some(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
    }
}
