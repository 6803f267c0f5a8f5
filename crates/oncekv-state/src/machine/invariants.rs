//! The invariants of the whole replicated state: each table's own, and
//! those between tables (the store's key count and bytes, keys attached
//! to leases that own them). Checked after every apply in debug builds
//! and on restoring a snapshot.

use crate::invariant::{BrokenInvariant, Table};
use crate::kv::entry_weight_bytes;
use crate::machine::StateMachine;
use std::collections::BTreeMap;

impl StateMachine {
    pub(super) fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(broken) = self.check_invariants() {
            panic!(
                "state machine invariant broken after entry {:?}: {broken}",
                self.last_applied
            );
        }
    }

    /// Checks every invariant of the replicated state.
    pub fn check_invariants(&self) -> Result<(), BrokenInvariant> {
        let limits = &self.limits;
        let now = self.clock;
        self.sessions.check_invariants(now, limits.sessions_max)?;
        self.keys.check_invariants(
            now,
            limits.idempotency_key_ttl_ms,
            limits.idempotency_keys_max,
        )?;
        self.leases.check_invariants(now, limits.leases_max)?;
        self.kv
            .history()
            .check_invariants()
            .map_err(|detail| BrokenInvariant::new(Table::Store, detail))?;
        self.auth
            .check_invariants()
            .map_err(|detail| BrokenInvariant::new(Table::Auth, detail))?;
        if self.kv.len() > limits.kv_keys_max {
            return Err(BrokenInvariant::new(
                Table::Store,
                format!("{} keys exceed {}", self.kv.len(), limits.kv_keys_max),
            ));
        }
        let weighed: u64 = self
            .kv
            .iter()
            .map(|(key, stored)| entry_weight_bytes(key, stored))
            .sum();
        if weighed != self.kv.bytes() {
            return Err(BrokenInvariant::new(
                Table::Store,
                format!("{} bytes counted, {weighed} stored", self.kv.bytes()),
            ));
        }
        let mut attached: BTreeMap<&str, usize> = BTreeMap::new();
        for (key, stored) in self.kv.iter() {
            if let Some(name) = &stored.lease {
                let owned = self
                    .leases
                    .get(name)
                    .is_some_and(|lease| lease.keys.contains(key));
                if !owned {
                    return Err(BrokenInvariant::new(
                        Table::Store,
                        format!("key {key:?} attached to lease {name:?} not owning it"),
                    ));
                }
                *attached.entry(name).or_default() += 1;
            }
        }
        for lease in self.leases.iter() {
            if attached.get(lease.name.as_str()).copied().unwrap_or(0) != lease.keys.len() {
                return Err(BrokenInvariant::new(
                    Table::Leases,
                    format!("lease {:?} lists keys it does not own", lease.name),
                ));
            }
        }
        Ok(())
    }
}
