//! [`StateMachine`]: applies log entries deterministically. It advances
//! cluster time, expires sessions, idempotency keys and leases, decides
//! deduplication (the only place it is decided), refuses what a full table
//! or budget cannot take (never evicting anything live), enforces users'
//! permissions once authentication is on, and executes commands.
//!
//! This module holds the state, its accessors and [`StateMachine::apply`];
//! the rest is split by concern, each submodule an `impl StateMachine` of
//! its own:
//!
//! - `admission`: the request path of `apply`, in the decision table's
//!   order: sessions and idempotency keys (where deduplication is decided,
//!   and nowhere else), replay, byte budgets, users' quotas and the store's;
//! - `permission`: what a principal may do and see once authentication is
//!   enforced: keys, queries, transactions, sessions and leases it owns;
//! - `execution`: running what was admitted: session control, data
//!   commands, reads, leases, transactions, users and roles, compaction;
//! - `invariants`: the checks of the whole state, after every apply in
//!   debug builds and on restore.

mod admission;
mod execution;
mod invariants;
mod permission;

use crate::auth::AuthTable;
use crate::command::{Entry, Proposal};
use crate::history::Stamp;
use crate::idempotency::IdempotencyKeys;
use crate::ids::{ClusterTime, LogIndex};
use crate::kv::KvStore;
use crate::lease::Leases;
use crate::limits::Limits;
use crate::outcome::Outcome;
use crate::session::SessionTable;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Counts that describe the state, for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Index of the last applied entry, if any.
    pub last_applied: Option<LogIndex>,
    /// Current cluster time.
    pub cluster_time: ClusterTime,
    /// Keys in the store.
    pub keys: u64,
    /// Live sessions.
    pub sessions: u64,
    /// Completion records held by sessions.
    pub completion_records: u64,
    /// Bytes those completion records hold.
    pub completion_record_bytes: u64,
    /// Idempotency keys kept.
    pub idempotency_keys: u64,
    /// Bytes the idempotency records hold.
    pub idempotency_bytes: u64,
    /// Live leases.
    pub leases: u64,
    /// Bytes the store's keys and values weigh against its quota.
    pub store_bytes: u64,
    /// Whether the `NOSPACE` alarm is raised by the store's quota.
    pub no_space_alarm: bool,
}

/// The replicated state and the rules that change it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMachine {
    pub(crate) limits: Limits,
    pub(crate) clock: ClusterTime,
    pub(crate) last_applied: Option<LogIndex>,
    pub(crate) kv: KvStore,
    pub(crate) sessions: SessionTable,
    pub(crate) keys: IdempotencyKeys,
    pub(crate) leases: Leases,
    /// Shared between copies of the state until one changes it, so that
    /// a copy (a read served outside the state's lock, a snapshot) costs
    /// the same whatever the table's size, as the persistent maps do.
    pub(crate) auth: Arc<AuthTable>,
    /// The `NOSPACE` alarm: raised by a write that would take the store
    /// past its byte quota; while raised, writes that grow the store are
    /// refused. Lowered by
    /// [`Command::AlarmDisarm`](crate::Command::AlarmDisarm) and by
    /// clearing any member's ([`Command::AlarmSet`](crate::Command::AlarmSet)).
    pub(crate) no_space_alarm: bool,
    /// The members whose `NOSPACE` alarm was raised by hand
    /// ([`Command::AlarmSet`](crate::Command::AlarmSet)): while any is,
    /// writes that grow the store are refused too.
    pub(crate) alarmed_members: BTreeSet<u64>,
    /// Whether duplicates are answered from their completion records. Off
    /// only in the negative control of the fault checkers (see
    /// [`StateMachine::without_dedup`]); never part of a snapshot.
    pub(crate) dedup: bool,
    /// The id of the cluster the state belongs to, once recorded
    /// ([`StateMachine::record_cluster_id`]); kept in snapshots (after
    /// the body, outside the state digest).
    pub(crate) cluster_id: Option<u64>,
}

impl StateMachine {
    /// An empty state machine with these limits.
    pub fn new(limits: Limits) -> StateMachine {
        StateMachine {
            limits,
            clock: ClusterTime::default(),
            last_applied: None,
            kv: KvStore::default(),
            sessions: SessionTable::default(),
            keys: IdempotencyKeys::default(),
            leases: Leases::default(),
            auth: Arc::default(),
            no_space_alarm: false,
            alarmed_members: BTreeSet::new(),
            dedup: true,
            cluster_id: None,
        }
    }

    /// This machine with deduplication switched off: a retried request is
    /// executed again instead of answered from its completion record. It
    /// breaks exactly-once on purpose and exists only so that the fault
    /// checkers can prove they catch a store without dedup (a negative
    /// control); no real deployment wants it.
    pub fn without_dedup(mut self) -> StateMachine {
        self.dedup = false;
        self
    }

    /// Whether duplicates are answered from completion records (always,
    /// unless built [`without_dedup`](Self::without_dedup)).
    pub fn dedups(&self) -> bool {
        self.dedup
    }

    /// The id of the cluster the state belongs to, if recorded.
    pub fn cluster_id(&self) -> Option<u64> {
        self.cluster_id
    }

    /// Records the id of the cluster the state belongs to. The node calls
    /// it where every replica does, so all of them record the same id at
    /// the same point of the log: when it applies the entry that founded
    /// the cluster (its first membership, at log index 0, which every
    /// founding member writes alike), and when a backup seeds a new
    /// cluster. A member that joins later gets it with the log or in a
    /// snapshot. It changes no reply, nor the state digest.
    pub fn record_cluster_id(&mut self, id: u64) {
        self.cluster_id = Some(id);
    }

    /// The limits it enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The index of the last applied entry, if any.
    pub fn last_applied(&self) -> Option<LogIndex> {
        self.last_applied
    }

    /// The cluster time of the last applied entry.
    pub fn cluster_time(&self) -> ClusterTime {
        self.clock
    }

    /// The session table.
    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    /// The key-value data.
    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    /// The leases.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The kept idempotency keys.
    pub fn idempotency_keys(&self) -> &IdempotencyKeys {
        &self.keys
    }

    /// Users, roles and whether they are enforced.
    pub fn auth(&self) -> &AuthTable {
        &self.auth
    }

    /// Counts that describe the state.
    pub fn stats(&self) -> Stats {
        Stats {
            last_applied: self.last_applied,
            cluster_time: self.clock,
            keys: self.kv.len(),
            sessions: self.sessions.len(),
            completion_records: self.sessions.records_held(),
            completion_record_bytes: self.sessions.records_bytes(),
            idempotency_keys: self.keys.len(),
            idempotency_bytes: self.keys.bytes(),
            leases: self.leases.len(),
            store_bytes: self.kv.bytes(),
            no_space_alarm: self.no_space_alarm,
        }
    }

    /// The members whose `NOSPACE` alarm was raised by hand
    /// ([`Command::AlarmSet`](crate::Command::AlarmSet)).
    pub fn alarmed_members(&self) -> &BTreeSet<u64> {
        &self.alarmed_members
    }

    /// The earliest cluster time after which an entry may expire something
    /// (a session, an idempotency key or a lease): an idle leader proposes
    /// a tick once its clock passes it, so expiry does not wait for other
    /// writes. Never later than the real earliest deadline; at most early
    /// by a session kept alive since it was last filed, which the tick
    /// re-files.
    pub fn next_expiry(&self) -> Option<ClusterTime> {
        [
            self.sessions.next_deadline(),
            self.keys.next_deadline(self.limits.idempotency_key_ttl_ms),
            self.leases.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Applies one entry and returns its outcome.
    ///
    /// # Panics
    ///
    /// If `entry.index` is not beyond the last applied index: applying out
    /// of order means the log is broken, and a diverged replica is worse
    /// than a stopped one.
    pub fn apply(&mut self, entry: &Entry) -> Outcome {
        self.apply_proposal(entry.index, &entry.proposal)
    }

    /// [`apply`](Self::apply) for the parts of an entry: its index and
    /// the proposal it holds, borrowed where the log keeps it.
    ///
    /// # Panics
    ///
    /// As [`apply`](Self::apply).
    pub fn apply_proposal(&mut self, index: LogIndex, proposal: &Proposal) -> Outcome {
        self.advance(index, proposal.time);
        let outcome = self.apply_request(&proposal.request, proposal.principal.as_ref(), index);
        let bounds = self.limits.history_bounds();
        self.kv.history_mut().enforce(bounds, self.clock);
        self.debug_check();
        outcome
    }

    /// Records that an entry with no request (a leader's blank entry or a
    /// membership change) was applied at `index`.
    pub fn apply_empty(&mut self, index: LogIndex) {
        if let Some(last) = self.last_applied {
            assert!(index > last, "entry {} applied after {}", index.0, last.0);
        }
        self.last_applied = Some(index);
    }

    fn advance(&mut self, index: LogIndex, time: ClusterTime) {
        self.apply_empty(index);
        self.clock = self.clock.max(time);
        let now = self.clock;
        self.sessions.expire(now);
        self.keys.expire(now, self.limits.idempotency_key_ttl_ms);
        let at = self.stamp(index);
        for lease in self.leases.expire(now) {
            for key in &lease.keys {
                self.kv.remove(key, at);
            }
        }
    }

    /// The revision and time of changes made by entry `index`.
    fn stamp(&self, index: LogIndex) -> Stamp {
        Stamp {
            revision: index.0,
            time: self.clock,
        }
    }
}
