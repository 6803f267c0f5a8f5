//! [`Leases`]: named leases with a cluster-time TTL, their owner and the
//! keys attached to each. The caller deletes an ended lease's keys from the
//! store in the same apply.
//!
//! A lease's owner is the principal of the entry that granted it (`None`
//! while authentication was off, and for a lease restored from a snapshot
//! taken before leases had owners): once authentication is enforced, only
//! its owner or an admin may renew, revoke, list or attach keys to it
//! ([`crate::AuthTable::may_use_lease`]); a lease without an owner is
//! anyone's, as every lease was before.

use crate::ids::{ClusterTime, LogIndex, Principal};
use crate::invariant::{BrokenInvariant, Table};
use crate::outcome::LeaseInfo;
use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

/// One lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Its name.
    pub name: String,
    /// Time after the last grant or keep-alive at which it expires.
    pub ttl_ms: u64,
    /// Cluster time at which it expires unless kept alive.
    pub expires_at: ClusterTime,
    /// Where it was granted.
    pub granted_index: LogIndex,
    /// Who granted it: the entry's authenticated principal (`None` while
    /// authentication was off, or granted before leases had owners).
    pub owner: Option<Principal>,
    /// The keys attached to it (derived from the store on restore).
    #[serde(skip)]
    pub keys: OrdSet<Vec<u8>>,
}

impl Lease {
    /// The lease as listed.
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo {
            name: self.name.clone(),
            ttl_ms: self.ttl_ms,
            expires_at: self.expires_at,
            keys: self.keys.len() as u64,
        }
    }
}

/// All live leases by name, with an index by expiry (derived). The maps
/// and each lease's key set share structure, so a copy (for a snapshot)
/// costs the same whatever the number of leases and attached keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    leases: OrdMap<String, Lease>,
    by_expiry: OrdSet<(ClusterTime, String)>,
}

impl Leases {
    /// Rebuilds the table from its leases.
    pub fn from_leases(leases: impl IntoIterator<Item = Lease>) -> Leases {
        let mut table = Leases::default();
        for lease in leases {
            table.insert(lease);
        }
        table
    }

    /// Every lease, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// How many leases are live.
    pub fn len(&self) -> u64 {
        self.leases.len() as u64
    }

    /// The earliest expiry deadline of a live lease.
    pub fn next_deadline(&self) -> Option<ClusterTime> {
        self.by_expiry.get_min().map(|(deadline, _)| *deadline)
    }

    /// Whether none is live.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The lease of this name.
    pub fn get(&self, name: &str) -> Option<&Lease> {
        self.leases.get(name)
    }

    fn insert(&mut self, lease: Lease) {
        self.by_expiry
            .insert((lease.expires_at, lease.name.clone()));
        self.leases.insert(lease.name.clone(), lease);
    }

    /// Grants a new lease owned by `owner` (the caller checked that the
    /// name is free).
    pub fn grant(
        &mut self,
        name: String,
        ttl_ms: u64,
        now: ClusterTime,
        index: LogIndex,
        owner: Option<Principal>,
    ) {
        self.insert(Lease {
            name,
            ttl_ms,
            expires_at: now.plus_ms(ttl_ms),
            granted_index: index,
            owner,
            keys: OrdSet::new(),
        });
    }

    /// Renews a lease; returns its new expiry, or `None` if it is unknown.
    pub fn keep_alive(&mut self, name: &str, now: ClusterTime) -> Option<ClusterTime> {
        let mut lease = self.remove(name)?;
        lease.expires_at = now.plus_ms(lease.ttl_ms);
        let expires_at = lease.expires_at;
        self.insert(lease);
        Some(expires_at)
    }

    /// Removes a lease, returning it with its attached keys.
    pub fn remove(&mut self, name: &str) -> Option<Lease> {
        let lease = self.leases.remove(name)?;
        self.by_expiry
            .remove(&(lease.expires_at, lease.name.clone()));
        Some(lease)
    }

    /// Attaches `key` to lease `name` (which must exist).
    pub fn attach(&mut self, name: &str, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(name) {
            lease.keys.insert(key.to_vec());
        }
    }

    /// Detaches `key` from lease `name`.
    pub fn detach(&mut self, name: &str, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(name) {
            lease.keys.remove(key);
        }
    }

    /// Removes and returns every lease whose expiry is before `now`.
    pub fn expire(&mut self, now: ClusterTime) -> Vec<Lease> {
        let mut expired = Vec::new();
        while let Some((expires_at, name)) = self.by_expiry.get_min().cloned() {
            if expires_at >= now {
                break;
            }
            if let Some(lease) = self.remove(&name) {
                expired.push(lease);
            }
        }
        expired
    }

    /// Checks the table's invariants (key attachment is checked by the
    /// state machine, which also sees the store).
    pub fn check_invariants(
        &self,
        now: ClusterTime,
        leases_max: u64,
    ) -> Result<(), BrokenInvariant> {
        if self.len() > leases_max {
            return Err(BrokenInvariant::new(
                Table::Leases,
                format!("{} leases exceed {leases_max}", self.len()),
            ));
        }
        if self.by_expiry.len() != self.leases.len() {
            return Err(BrokenInvariant::new(
                Table::Leases,
                "lease index out of step",
            ));
        }
        for (name, lease) in &self.leases {
            if *name != lease.name || !self.by_expiry.contains(&(lease.expires_at, name.clone())) {
                return Err(BrokenInvariant::new(
                    Table::Leases,
                    format!("lease {name:?} filed wrongly"),
                ));
            }
            if lease.expires_at < now {
                return Err(BrokenInvariant::new(
                    Table::Leases,
                    format!("lease {name:?} outlived its ttl"),
                ));
            }
        }
        Ok(())
    }
}
