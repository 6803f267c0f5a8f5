//! [`KvStore`]: the ordered key-value data and the operations on it (PUT,
//! GET, DELETE, APPEND, INCR, CAS, SCAN). It knows nothing of sessions;
//! lease attachment is recorded per key and kept consistent by the caller.
//! It counts the bytes it holds, for the store's quota.

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
    /// What the entries weigh (derived; recounted on restore).
    #[serde(skip)]
    bytes: u64,
}

/// What one stored key weighs against the store's quota: its key, value
/// and lease name plus a fixed allowance for the rest.
pub fn entry_weight_bytes(key: &[u8], stored: &StoredValue) -> u64 {
    let lease = stored.lease.as_ref().map_or(0, String::len);
    ((key.len() + stored.value.len() + lease) as u64)
        .saturating_add(crate::outcome::STORE_ENTRY_OVERHEAD_BYTES)
}

impl KvStore {
    /// What all entries weigh, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Recounts the derived byte count (after decoding).
    pub(crate) fn recount(&mut self) {
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
        self.entries.get(key)
    }

    /// Sets `key`, returning what was there.
    pub fn insert(&mut self, key: Vec<u8>, value: StoredValue) -> Option<StoredValue> {
        self.bytes += entry_weight_bytes(&key, &value);
        let key_bytes = key.clone();
        let previous = self.entries.insert(key, value);
        if let Some(old) = &previous {
            self.bytes -= entry_weight_bytes(&key_bytes, old);
        }
        previous
    }

    /// Removes `key`, returning what was there.
    pub fn remove(&mut self, key: &[u8]) -> Option<StoredValue> {
        let removed = self.entries.remove(key)?;
        self.bytes -= entry_weight_bytes(key, &removed);
        Some(removed)
    }

    /// Appends `suffix` to the value at `key` (absent counts as empty, and
    /// a new key has no lease).
    pub fn append(&mut self, key: &[u8], suffix: &[u8]) {
        match self.entries.get_mut(key) {
            Some(stored) => {
                stored.value.extend_from_slice(suffix);
                self.bytes += suffix.len() as u64;
            }
            None => {
                let stored = StoredValue {
                    value: suffix.to_vec(),
                    lease: None,
                };
                self.insert(key.to_vec(), stored);
            }
        }
    }

    /// Replaces the value at `key`, keeping its lease attachment (a new key
    /// has no lease).
    pub fn set_value(&mut self, key: &[u8], value: Vec<u8>) {
        match self.entries.get_mut(key) {
            Some(stored) => {
                self.bytes = self.bytes - stored.value.len() as u64 + value.len() as u64;
                stored.value = value;
            }
            None => {
                self.insert(key.to_vec(), StoredValue { value, lease: None });
            }
        }
    }

    /// Entries whose key starts with `prefix`, in key order: at most
    /// `limit` of them, and no more once they hold `bytes_max` bytes of keys
    /// and values (the first entry is always returned); and whether more
    /// exist.
    pub fn scan(&self, prefix: &[u8], limit: usize, bytes_max: u64) -> (KvPairs, bool) {
        let mut matching = self
            .entries
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .peekable();
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
            entries.push(((*key).clone(), stored.value.clone()));
            matching.next();
        }
        let more = matching.peek().is_some();
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
