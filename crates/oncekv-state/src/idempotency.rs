//! [`IdempotencyKeys`]: completion records of one-shot requests, filed under
//! client-chosen keys, kept for a cluster-time TTL and bounded in number
//! (the oldest record is evicted first, ties by log index).

use crate::ids::{ClusterTime, IdempotencyKey, LogIndex};
use crate::outcome::Outcome;
use crate::session::CompletionRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A completion record filed under an idempotency key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key.
    pub key: IdempotencyKey,
    /// The recorded response.
    pub record: CompletionRecord,
    /// Cluster time at which it was recorded.
    pub recorded_at: ClusterTime,
}

/// The kept idempotency keys, with an index by age. The index is derived.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdempotencyKeys {
    records: BTreeMap<IdempotencyKey, KeyRecord>,
    by_age: BTreeMap<(ClusterTime, LogIndex), IdempotencyKey>,
}

impl IdempotencyKeys {
    /// Rebuilds the table from its records.
    pub fn from_records(records: impl IntoIterator<Item = KeyRecord>) -> IdempotencyKeys {
        let mut keys = IdempotencyKeys::default();
        for record in records {
            keys.insert(record);
        }
        keys
    }

    /// Every record, by key.
    pub fn iter(&self) -> impl Iterator<Item = &KeyRecord> {
        self.records.values()
    }

    /// How many keys are kept.
    pub fn len(&self) -> u64 {
        self.records.len() as u64
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn insert(&mut self, record: KeyRecord) {
        let age = (record.recorded_at, record.record.applied_index);
        self.by_age.insert(age, record.key.clone());
        self.records.insert(record.key.clone(), record);
    }

    fn remove_oldest(&mut self) -> Option<IdempotencyKey> {
        let (_, key) = self.by_age.pop_first()?;
        self.records.remove(&key);
        Some(key)
    }

    /// The outcome for a request under `key` that was already applied: its
    /// replay, or a mismatch when the key was used for another command.
    pub fn lookup(&self, key: &IdempotencyKey, digest: u64) -> Option<Outcome> {
        let kept = self.records.get(key)?;
        Some(if kept.record.digest == digest {
            Outcome::Replayed {
                reply: kept.record.reply.clone(),
                applied_index: kept.record.applied_index,
            }
        } else {
            Outcome::RequestMismatch
        })
    }

    /// Records a response under `key`, evicting the oldest records while more
    /// than `keys_max` would be kept.
    pub fn record(
        &mut self,
        key: IdempotencyKey,
        record: CompletionRecord,
        now: ClusterTime,
        keys_max: u64,
    ) {
        // Only a machine without dedup records a key twice.
        if let Some(old) = self.records.remove(&key) {
            self.by_age
                .remove(&(old.recorded_at, old.record.applied_index));
        }
        while self.len() >= keys_max.max(1) {
            if self.remove_oldest().is_none() {
                break;
            }
        }
        self.insert(KeyRecord {
            key,
            record,
            recorded_at: now,
        });
    }

    /// Forgets every key recorded more than `ttl_ms` before `now`.
    pub fn expire(&mut self, now: ClusterTime, ttl_ms: u64) -> u64 {
        let mut expired = 0;
        while let Some((&(recorded_at, _), _)) = self.by_age.first_key_value() {
            if recorded_at.plus_ms(ttl_ms) >= now {
                break;
            }
            self.remove_oldest();
            expired += 1;
        }
        expired
    }

    /// Checks the table's invariants.
    pub fn check_invariants(
        &self,
        now: ClusterTime,
        ttl_ms: u64,
        keys_max: u64,
    ) -> Result<(), String> {
        if self.len() > keys_max.max(1) {
            return Err(format!("{} idempotency keys exceed {keys_max}", self.len()));
        }
        if self.by_age.len() != self.records.len() {
            return Err("idempotency key index out of step".into());
        }
        for (key, kept) in &self.records {
            if *key != kept.key || !key.is_well_formed() {
                return Err(format!("idempotency key {key:?} filed wrongly"));
            }
            let age = (kept.recorded_at, kept.record.applied_index);
            if self.by_age.get(&age) != Some(key) {
                return Err(format!("idempotency key {key:?} missing from its index"));
            }
            if kept.recorded_at > now || kept.recorded_at.plus_ms(ttl_ms) < now {
                return Err(format!("idempotency key {key:?} kept outside its ttl"));
            }
        }
        Ok(())
    }
}
