//! [`IdempotencyKeys`]: completion records of one-shot requests, filed under
//! client-chosen keys, kept for a cluster-time TTL and bounded in number
//! and bytes. A kept key is never evicted: when the table is full, a
//! request under a new key is refused until the oldest keys expire. Keys
//! are scoped by the principal that sent them: another principal's request
//! under the same bytes is another key.

use crate::ids::{ClusterTime, IdempotencyKey, LogIndex, Principal};
use crate::invariant::{BrokenInvariant, Table};
use crate::overhead::KEY_ENTRY_OVERHEAD_BYTES;
use crate::quota::UsageByOwner;
use crate::refusal::Overload;
use crate::session::{CompletionRecord, NotExecuted};
use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A completion record filed under an idempotency key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Who sent the request (`None` while authentication is off).
    pub owner: Option<Principal>,
    /// The key.
    pub key: IdempotencyKey,
    /// The recorded response.
    pub record: CompletionRecord,
    /// Cluster time at which it was recorded.
    pub recorded_at: ClusterTime,
}

impl KeyRecord {
    /// The bytes it holds, as the byte budget counts them.
    pub fn weight_bytes(&self) -> u64 {
        let owner = self.owner.as_ref().map_or(0, |p| p.0.len());
        ((self.key.0.len() + owner) as u64)
            .saturating_mul(3)
            .saturating_add(self.record.weight_bytes())
            .saturating_add(KEY_ENTRY_OVERHEAD_BYTES)
    }
}

impl KeyRecord {
    fn scoped(&self) -> ScopedKey {
        (self.owner.clone(), self.key.clone())
    }
}

/// A key as filed: its owner and its bytes.
type ScopedKey = (Option<Principal>, IdempotencyKey);

/// The kept idempotency keys, with an index by age. The index and the byte
/// count are derived. The maps share structure and the records are shared
/// ([`Arc`]), so a copy of the table (for a snapshot) costs the same
/// whatever its size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdempotencyKeys {
    records: OrdMap<ScopedKey, Arc<KeyRecord>>,
    by_age: OrdMap<(ClusterTime, LogIndex), ScopedKey>,
    bytes: u64,
    /// Keys and bytes per owner (derived).
    owners: UsageByOwner,
}

/// The bounds a record under a new key is admitted under.
#[derive(Clone, Copy, Debug)]
pub struct KeyBudget {
    /// Most keys kept (for a non-admin, less the admin reserve).
    pub keys_max: u64,
    /// Most bytes kept (for a non-admin, less the admin reserve).
    pub bytes_max: u64,
    /// The most keys and bytes the sender may keep (`None` for an admin,
    /// or while authentication is off).
    pub user_max: Option<(u64, u64)>,
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
        self.records.values().map(|record| &**record)
    }

    /// How many keys are kept.
    pub fn len(&self) -> u64 {
        self.records.len() as u64
    }

    /// When the oldest kept key expires, given the keys' `ttl_ms`.
    pub fn next_deadline(&self, ttl_ms: u64) -> Option<ClusterTime> {
        self.by_age
            .get_min()
            .map(|((recorded_at, _), _)| recorded_at.plus_ms(ttl_ms))
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The bytes all kept records hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What each owner keeps: its keys (`count`) and their bytes.
    pub fn usage(&self) -> &UsageByOwner {
        &self.owners
    }

    fn insert(&mut self, record: KeyRecord) {
        let age = (record.recorded_at, record.record.applied_index);
        self.bytes += record.weight_bytes();
        self.owners
            .add(record.owner.as_ref(), 1, record.weight_bytes());
        self.by_age.insert(age, record.scoped());
        if let Some(old) = self.records.insert(record.scoped(), Arc::new(record)) {
            self.forget(&old);
        }
    }

    /// Takes a removed record out of the counts.
    fn forget(&mut self, old: &KeyRecord) {
        self.bytes -= old.weight_bytes();
        self.owners.sub(old.owner.as_ref(), 1, old.weight_bytes());
    }

    fn remove_oldest(&mut self) -> Option<ScopedKey> {
        let age = self.by_age.get_min()?.0;
        let key = self.by_age.remove(&age)?;
        if let Some(old) = self.records.remove(&key) {
            self.forget(&old);
        }
        Some(key)
    }

    /// Forgets every key `owner` keeps and returns how many.
    pub fn remove_owned_by(&mut self, owner: &Principal) -> u64 {
        let owned: Vec<ScopedKey> = self
            .records
            .keys()
            .filter(|(by, _)| by.as_ref() == Some(owner))
            .cloned()
            .collect();
        for scoped in &owned {
            if let Some(old) = self.records.remove(scoped) {
                self.by_age
                    .remove(&(old.recorded_at, old.record.applied_index));
                self.forget(&old);
            }
        }
        owned.len() as u64
    }

    /// What to answer a request of `owner` under `key` that was already
    /// applied: its record, or a mismatch when the key was used for another
    /// command. `None` when the key is not kept.
    pub fn lookup(
        &self,
        owner: Option<&Principal>,
        key: &IdempotencyKey,
        digest: u64,
    ) -> Option<NotExecuted> {
        let kept = self.records.get(&(owner.cloned(), key.clone()))?;
        Some(if kept.record.digest == digest {
            NotExecuted::Replay(kept.record.clone())
        } else {
            NotExecuted::Refused(crate::outcome::Outcome::RequestMismatch)
        })
    }

    /// Whether a record of `owner` under a new key fits: `Err` names the
    /// bound that is full, the owner's share first. Nothing is evicted to
    /// make room.
    pub fn check_room(&self, owner: Option<&Principal>, budget: KeyBudget) -> Result<(), Overload> {
        if let (Some((keys_max, bytes_max)), Some(owner)) = (budget.user_max, owner) {
            let usage = self.owners.of(owner);
            if usage.count >= keys_max {
                return Err(Overload::UserIdempotencyKeys { max: keys_max });
            }
            if usage.bytes >= bytes_max {
                return Err(Overload::UserIdempotencyBytes { max: bytes_max });
            }
        }
        if self.len() >= budget.keys_max {
            return Err(Overload::IdempotencyKeys {
                max: budget.keys_max,
            });
        }
        if self.bytes >= budget.bytes_max {
            return Err(Overload::IdempotencyBytes {
                max: budget.bytes_max,
            });
        }
        Ok(())
    }

    /// Records a response of `owner` under `key` (after
    /// [`IdempotencyKeys::check_room`] found room for it).
    pub fn record(
        &mut self,
        owner: Option<Principal>,
        key: IdempotencyKey,
        record: CompletionRecord,
        now: ClusterTime,
    ) {
        // Only a machine without dedup records a key twice.
        if let Some(old) = self.records.remove(&(owner.clone(), key.clone())) {
            self.forget(&old);
            self.by_age
                .remove(&(old.recorded_at, old.record.applied_index));
        }
        self.insert(KeyRecord {
            owner,
            key,
            record,
            recorded_at: now,
        });
    }

    /// Forgets every key recorded more than `ttl_ms` before `now`.
    pub fn expire(&mut self, now: ClusterTime, ttl_ms: u64) -> u64 {
        let mut expired = 0;
        while let Some(&((recorded_at, _), _)) = self.by_age.get_min() {
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
    ) -> Result<(), BrokenInvariant> {
        if self.len() > keys_max {
            return Err(BrokenInvariant::new(
                Table::IdempotencyKeys,
                format!("{} idempotency keys exceed {keys_max}", self.len()),
            ));
        }
        let bytes: u64 = self.records.values().map(|kept| kept.weight_bytes()).sum();
        let mut owners = UsageByOwner::default();
        for kept in self.records.values() {
            owners.add(kept.owner.as_ref(), 1, kept.weight_bytes());
        }
        if bytes != self.bytes || owners != self.owners {
            return Err(BrokenInvariant::new(
                Table::IdempotencyKeys,
                "idempotency key bytes out of step",
            ));
        }
        if self.by_age.len() != self.records.len() {
            return Err(BrokenInvariant::new(
                Table::IdempotencyKeys,
                "idempotency key index out of step",
            ));
        }
        for (scoped, kept) in &self.records {
            let key = &kept.key;
            if *scoped != kept.scoped() || !key.is_well_formed() {
                return Err(BrokenInvariant::new(
                    Table::IdempotencyKeys,
                    format!("idempotency key {key:?} filed wrongly"),
                ));
            }
            let age = (kept.recorded_at, kept.record.applied_index);
            if self.by_age.get(&age) != Some(scoped) {
                return Err(BrokenInvariant::new(
                    Table::IdempotencyKeys,
                    format!("idempotency key {key:?} missing from its index"),
                ));
            }
            if kept.recorded_at > now || kept.recorded_at.plus_ms(ttl_ms) < now {
                return Err(BrokenInvariant::new(
                    Table::IdempotencyKeys,
                    format!("idempotency key {key:?} kept outside its ttl"),
                ));
            }
        }
        Ok(())
    }
}
