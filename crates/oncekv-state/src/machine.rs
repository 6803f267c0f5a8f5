//! [`StateMachine`]: applies log entries deterministically. It advances
//! cluster time, expires sessions, idempotency keys and leases, decides
//! deduplication (the only place it is decided), refuses what a full table
//! or budget cannot take (never evicting anything live), enforces users'
//! permissions once authentication is on, and executes commands.
//!
//! Leases have owners: a grant records the entry's principal as the
//! lease's owner, and once authentication is enforced only the owner or an
//! admin may grant its name again, renew it, revoke it, attach a key to it
//! (a put naming it, in a transaction too) or see it listed; anyone else is
//! refused with [`Outcome::PermissionDenied`], decided at apply from the
//! replicated state, so every replica decides alike.

use crate::auth::{Access, AuthTable};
use crate::command::{Command, Entry, Origin, Query, Request};
use crate::digest::command_digest;
use crate::history::Stamp;
use crate::idempotency::IdempotencyKeys;
use crate::ids::{ClusterTime, LogIndex, Principal, SessionId};
use crate::invariant::{BrokenInvariant, Table};
use crate::key_range::{KeyRange, KeyScope};
use crate::kv::{KvStore, entry_weight_bytes, parse_counter};
use crate::lease::Leases;
use crate::limits::Limits;
use crate::outcome::{Malformed, Outcome, Overload, Rejection, Reply};
use crate::session::{CompletionRecord, NotExecuted, RecordBudget, SessionTable};
use crate::txn::{Txn, TxnOp};
use std::collections::BTreeMap;

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
    /// Whether the `NOSPACE` alarm is raised.
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
    pub(crate) auth: AuthTable,
    /// The `NOSPACE` alarm: raised by a write that would take the store
    /// past its byte quota; while raised, writes that grow the store are
    /// refused. Lowered only by [`Command::AlarmDisarm`].
    pub(crate) no_space_alarm: bool,
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
            auth: AuthTable::default(),
            no_space_alarm: false,
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

    /// Whether anything would expire with the passage of time (so an idle
    /// leader should keep ticking).
    pub fn has_expiring_state(&self) -> bool {
        !self.sessions.is_empty() || !self.keys.is_empty() || !self.leases.is_empty()
    }

    /// Applies one entry and returns its outcome.
    ///
    /// # Panics
    ///
    /// If `entry.index` is not beyond the last applied index: applying out
    /// of order means the log is broken, and a diverged replica is worse
    /// than a stopped one.
    pub fn apply(&mut self, entry: &Entry) -> Outcome {
        self.advance(entry.index, entry.time);
        let outcome = self.apply_request(&entry.request, entry.principal.as_ref(), entry.index);
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

    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(broken) = self.check_invariants() {
            panic!(
                "state machine invariant broken after entry {:?}: {broken}",
                self.last_applied
            );
        }
    }

    fn apply_request(
        &mut self,
        request: &Request,
        principal: Option<&Principal>,
        index: LogIndex,
    ) -> Outcome {
        let command = &request.command;
        match &request.origin {
            Origin::Plain => {
                if let Err(reason) = self.check_permission(principal, command) {
                    return Outcome::PermissionDenied { reason };
                }
                match self.space_refusal(command) {
                    Some(refused) => refused,
                    None => self.run(command, principal, index),
                }
            }
            Origin::Session(header) => {
                if command.is_session_control() {
                    return control_not_allowed(command);
                }
                if !self.owns_session(header.id.session, principal) {
                    return Outcome::Unauthorized;
                }
                let digest = command_digest(command);
                let budget = RecordBudget {
                    session_bytes_max: self.limits.session_record_bytes_max,
                    total_bytes_max: self.limits.record_bytes_max,
                };
                match self.sessions.admit(header, digest, self.clock, budget) {
                    Ok(()) => {}
                    Err(NotExecuted::Replay(_)) if !self.dedup => {}
                    Err(NotExecuted::Replay(record)) => {
                        return self.replay(record, command, principal);
                    }
                    Err(NotExecuted::Refused(outcome)) => return outcome,
                }
                if let Err(reason) = self.check_permission(principal, command) {
                    return Outcome::PermissionDenied { reason };
                }
                if let Some(refused) = self.space_refusal(command) {
                    return refused;
                }
                let outcome = self.run(command, principal, index);
                if let Outcome::Applied(reply) = &outcome {
                    let record = record_of(command, reply, index, digest);
                    self.sessions.complete(header, record);
                }
                outcome
            }
            Origin::Key(key) => {
                if !key.is_well_formed() {
                    return Outcome::Malformed(Malformed::IdempotencyKeyLength {
                        bytes: key.0.len(),
                    });
                }
                if matches!(command, Command::Tick) {
                    return control_not_allowed(command);
                }
                let digest = command_digest(command);
                match self.keys.lookup(principal, key, digest) {
                    Some(NotExecuted::Replay(_)) if !self.dedup => {}
                    Some(NotExecuted::Replay(record)) => {
                        return self.replay(record, command, principal);
                    }
                    Some(NotExecuted::Refused(outcome)) => return outcome,
                    None => {}
                }
                if let Err(reason) = self.check_permission(principal, command) {
                    return Outcome::PermissionDenied { reason };
                }
                let limits = &self.limits;
                if let Err(full) = self
                    .keys
                    .check_room(limits.idempotency_keys_max, limits.idempotency_bytes_max)
                {
                    return Outcome::Overloaded(full);
                }
                if let Some(refused) = self.space_refusal(command) {
                    return refused;
                }
                let outcome = self.run(command, principal, index);
                if let Outcome::Applied(reply) = &outcome {
                    let record = record_of(command, reply, index, digest);
                    self.keys
                        .record(principal.cloned(), key.clone(), record, self.clock);
                }
                outcome
            }
        }
    }

    /// Whether `principal` may use session `id`: always while authentication
    /// is off; otherwise only its owner (an unknown session is left to
    /// admission, which answers `SessionExpired`).
    fn owns_session(&self, id: SessionId, principal: Option<&Principal>) -> bool {
        !self.auth.is_enabled()
            || self
                .sessions
                .get(id)
                .is_none_or(|session| session.owner() == principal)
    }

    /// Whether `principal` may run `command` now (always while
    /// authentication is off): `Err` says what is refused. A session's
    /// ownership is checked separately ([`Outcome::Unauthorized`]).
    pub fn check_permission(
        &self,
        principal: Option<&Principal>,
        command: &Command,
    ) -> Result<(), String> {
        let auth = &self.auth;
        if !auth.is_enabled() || matches!(command, Command::Tick) {
            return Ok(());
        }
        let Some(user) = principal.filter(|p| auth.user(&p.0).is_some()) else {
            return Err("authentication is enabled: log in as a user".to_string());
        };
        let key = |key: &[u8], need: Access| {
            if auth.allows_key(Some(user), key, need) {
                Ok(())
            } else {
                Err(format!(
                    "user {:?} has no {need} permission on key {:?}",
                    user.0,
                    String::from_utf8_lossy(key)
                ))
            }
        };
        let admin = |what: &str| {
            if auth.is_admin(Some(user)) {
                Ok(())
            } else {
                Err(format!(
                    "{what} needs the admin role; user {:?} lacks it",
                    user.0
                ))
            }
        };
        match command {
            Command::Put { key: k, lease, .. } => {
                key(k, Access::Write)?;
                match lease {
                    Some(name) => self.check_lease_owner(user, name),
                    None => Ok(()),
                }
            }
            Command::Delete { key: k } | Command::Append { key: k, .. } => key(k, Access::Write),
            Command::Incr { key: k, .. } | Command::Cas { key: k, .. } => key(k, Access::ReadWrite),
            Command::LeaseGrant { name, .. } | Command::LeaseKeepAlive { name } => {
                self.check_lease_owner(user, name)
            }
            Command::LeaseRevoke { name } => match self.leases.get(name) {
                Some(lease) => {
                    self.check_lease_owner(user, name)?;
                    lease.keys.iter().try_for_each(|k| key(k, Access::Write))
                }
                None => Ok(()),
            },
            Command::Read(query) => self.check_query(principal, query),
            Command::Txn(txn) => self.check_txn(principal, txn),
            Command::AlarmDisarm => admin("disarming an alarm"),
            Command::Compact { .. } => admin("compacting the history"),
            Command::Auth(_) => admin("changing users, roles or authentication"),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::Tick => Ok(()),
        }
    }

    /// Whether `user` may use lease `name` (grant its name again, renew or
    /// revoke it, attach a key to it): `Err` says why not. An unknown lease
    /// is left to execution (granted, or `LeaseNotFound`).
    fn check_lease_owner(&self, user: &Principal, name: &str) -> Result<(), String> {
        match self.leases.get(name) {
            Some(lease) if !self.auth.may_use_lease(Some(user), lease.owner.as_ref()) => {
                Err(format!(
                    "lease {name:?} is not user {:?}'s: only its owner or an admin may use it",
                    user.0
                ))
            }
            _ => Ok(()),
        }
    }

    /// [`read`](Self::read) as `principal` may see it: once authentication
    /// is enforced, a lease list names only the leases `principal` may use
    /// (its own and those without an owner; every lease for an admin).
    pub fn read_as(&self, principal: Option<&Principal>, query: &Query) -> Reply {
        self.leases_visible_to(principal, self.read(query))
    }

    /// A lease list as `principal` may see it ([`read_as`](Self::read_as));
    /// any other reply as it is.
    fn leases_visible_to(&self, principal: Option<&Principal>, reply: Reply) -> Reply {
        match reply {
            Reply::Leases { leases } if self.auth.is_enabled() => Reply::Leases {
                leases: leases
                    .into_iter()
                    .filter(|info| {
                        self.leases.get(&info.name).is_some_and(|lease| {
                            self.auth.may_use_lease(principal, lease.owner.as_ref())
                        })
                    })
                    .collect(),
            },
            reply => reply,
        }
    }

    /// Whether `principal` may read `query` now (always while
    /// authentication is off): `Err` says what is refused.
    pub fn check_query(&self, principal: Option<&Principal>, query: &Query) -> Result<(), String> {
        let auth = &self.auth;
        if !auth.is_enabled() {
            return Ok(());
        }
        let Some(user) = principal.filter(|p| auth.user(&p.0).is_some()) else {
            return Err("authentication is enabled: log in as a user".to_string());
        };
        let allowed = match query {
            Query::Get { key } => auth.allows_key(Some(user), key, Access::Read),
            Query::Scan { prefix, .. } => auth.allows_prefix(Some(user), prefix, Access::Read),
            Query::Range { range, .. } => auth.allows_range(Some(user), range, Access::Read),
            Query::LeaseList => true,
            Query::Auth => auth.is_admin(Some(user)),
            Query::At { query, .. } => return self.check_query(principal, query),
        };
        if allowed {
            return Ok(());
        }
        Err(match query {
            Query::Get { key } => format!(
                "user {:?} has no read permission on key {:?}",
                user.0,
                String::from_utf8_lossy(key)
            ),
            Query::Scan { prefix, .. } => format!(
                "user {:?} has no read permission on every key under prefix {:?}",
                user.0,
                String::from_utf8_lossy(prefix)
            ),
            Query::Range { range, .. } => format!(
                "user {:?} has no read permission on every key in the range {}",
                user.0,
                range_words(range)
            ),
            Query::LeaseList | Query::Auth | Query::At { .. } => format!(
                "listing users and roles needs the admin role; user {:?} lacks it",
                user.0
            ),
        })
    }

    /// Whether `principal` may run `txn`: read on every compared key,
    /// prefix or range, and each operation of both branches as its own
    /// command (write on every key under a deleted prefix or in a deleted
    /// range; a put of an existing key as a put), those of nested
    /// transactions too.
    fn check_txn(&self, principal: Option<&Principal>, txn: &Txn) -> Result<(), String> {
        for compare in &txn.compare {
            let query = Query::covering(&compare.key, &compare.scope);
            self.check_query(principal, &query)?;
        }
        let user = principal.filter(|p| self.auth.user(&p.0).is_some());
        let user_name = user.map_or("", |u| u.0.as_str());
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                TxnOp::DeletePrefix { prefix } => {
                    if !self.auth.allows_prefix(user, prefix, Access::Write) {
                        return Err(format!(
                            "user {user_name:?} has no write permission on every key under prefix {:?}",
                            String::from_utf8_lossy(prefix)
                        ));
                    }
                }
                TxnOp::DeleteRange { range } => {
                    if !self.auth.allows_range(user, range, Access::Write) {
                        return Err(format!(
                            "user {user_name:?} has no write permission on every key in the range {}",
                            range_words(range)
                        ));
                    }
                }
                TxnOp::PutExisting { key, lease, .. } => {
                    // A put keeping the key's lease attaches it to no new
                    // lease; one setting a lease attaches it to that one.
                    let put = match lease {
                        crate::txn::Update::Set(Some(name)) => Command::Put {
                            key: key.clone(),
                            value: Vec::new(),
                            lease: Some(name.clone()),
                        },
                        _ => put_of(key),
                    };
                    self.check_permission(principal, &put)?;
                }
                TxnOp::Txn(nested) => self.check_txn(principal, nested)?,
                other => {
                    if let Some(command) = other.as_command() {
                        self.check_permission(principal, &command)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A reply as `principal` may see it: the previous value a PUT or DELETE
    /// returns is left out without read permission on the key.
    fn visible_to(&self, principal: Option<&Principal>, command: &Command, reply: Reply) -> Reply {
        let readable = |key: &[u8]| {
            !self.auth.is_enabled() || self.auth.allows_key(principal, key, Access::Read)
        };
        match (command, reply) {
            (Command::Put { key, .. }, Reply::Put { .. }) if !readable(key) => {
                Reply::Put { previous: None }
            }
            (Command::Delete { key }, Reply::Delete { .. }) if !readable(key) => {
                Reply::Delete { previous: None }
            }
            (Command::Txn(txn), reply @ Reply::Txn { .. }) => {
                self.txn_visible_to(principal, txn, reply)
            }
            (Command::Read(Query::LeaseList), reply) => self.leases_visible_to(principal, reply),
            (_, reply) => reply,
        }
    }

    /// A transaction's reply as `principal` may see it, each operation's
    /// result as its own command's (a nested transaction's likewise).
    fn txn_visible_to(&self, principal: Option<&Principal>, txn: &Txn, reply: Reply) -> Reply {
        let Reply::Txn { succeeded, results } = reply else {
            return reply;
        };
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let results = ops
            .iter()
            .zip(results)
            .map(|(op, result)| match (op, op.as_command()) {
                (TxnOp::PutExisting { key, .. }, _) => {
                    self.visible_to(principal, &put_of(key), result)
                }
                (TxnOp::Txn(nested), _) => self.txn_visible_to(principal, nested, result),
                (_, Some(command)) => self.visible_to(principal, &command, result),
                (_, None) => result,
            })
            .collect();
        Reply::Txn { succeeded, results }
    }

    /// The answer to a request that ran before: its recorded reply, or for
    /// a read (whose value is not kept) the read answered again now. A
    /// record without a reply is a read's, so a command that is not a read
    /// whose digest matches it anyway (a collision) is another request.
    fn replay(
        &self,
        record: CompletionRecord,
        command: &Command,
        principal: Option<&Principal>,
    ) -> Outcome {
        let reply = match (record.reply, command) {
            (Some(reply), _) => reply,
            (None, Command::Read(query)) => self.read_as(principal, query),
            (None, _) => return Outcome::RequestMismatch,
        };
        Outcome::Replayed {
            reply,
            applied_index: record.applied_index,
        }
    }

    /// The `NOSPACE` refusal of a command that would grow the store while
    /// the alarm is raised, or take it past its quota (which raises the
    /// alarm); `None` when the command may run.
    fn space_refusal(&mut self, command: &Command) -> Option<Outcome> {
        if !command.grows_store() {
            return None;
        }
        let max = self.limits.store_bytes_max;
        let refused = Some(Outcome::Overloaded(Overload::NoSpace { max }));
        if self.no_space_alarm {
            return refused;
        }
        if self.kv.bytes().saturating_add(self.growth_bytes(command)) > max {
            self.no_space_alarm = true;
            return refused;
        }
        None
    }

    /// The most bytes a command can add to the store (an upper bound,
    /// computed before running it).
    fn growth_bytes(&self, command: &Command) -> u64 {
        let stored = |key: &[u8]| self.kv.get(key).map_or(0, |s| entry_weight_bytes(key, s));
        match command {
            Command::Put { key, value, lease } => {
                crate::kv::weight_bytes(key, value, lease.as_ref()).saturating_sub(stored(key))
            }
            Command::Append { key, value } => {
                let fresh = if self.kv.contains(key) {
                    0
                } else {
                    key.len() as u64 + crate::outcome::STORE_ENTRY_OVERHEAD_BYTES
                };
                value.len() as u64 + fresh
            }
            Command::Incr { key, .. } => {
                // An i64 in decimal takes at most 20 bytes.
                20 + key.len() as u64 + crate::outcome::STORE_ENTRY_OVERHEAD_BYTES
            }
            Command::Cas { key, new, .. } => {
                new.len() as u64 + key.len() as u64 + crate::outcome::STORE_ENTRY_OVERHEAD_BYTES
            }
            Command::Txn(txn) => self.txn_growth_bytes(txn),
            _ => 0,
        }
    }

    /// The most bytes a transaction can add to the store: the larger of
    /// its branches' (a nested transaction's counted the same way).
    fn txn_growth_bytes(&self, txn: &Txn) -> u64 {
        let op_growth = |op: &TxnOp| match op {
            TxnOp::PutExisting { key, value, lease } => self
                .put_existing(key, value, lease)
                .map_or(0, |put| self.growth_bytes(&put)),
            TxnOp::Txn(nested) => self.txn_growth_bytes(nested),
            other => other
                .as_command()
                .map_or(0, |command| self.growth_bytes(&command)),
        };
        let branch =
            |ops: &[TxnOp]| -> u64 { ops.iter().map(op_growth).fold(0u64, u64::saturating_add) };
        branch(&txn.success).max(branch(&txn.failure))
    }

    /// Runs any command: session control yields an outcome of its own, the
    /// rest a reply.
    fn run(
        &mut self,
        command: &Command,
        principal: Option<&Principal>,
        index: LogIndex,
    ) -> Outcome {
        let now = self.clock;
        match command {
            Command::OpenSession {
                ttl_ms,
                window,
                secret,
            } => {
                let limits = &self.limits;
                if let Some(rejection) = check_ttl(
                    *ttl_ms,
                    limits.session_ttl_ms_min,
                    limits.session_ttl_ms_max,
                ) {
                    return Outcome::Applied(Reply::Rejected(rejection));
                }
                let max = limits.window_max.min(crate::limits::WINDOW_MAX_ABSOLUTE);
                if !(1..=max).contains(window) {
                    let rejection = Rejection::WindowOutOfRange {
                        window: *window,
                        max,
                    };
                    return Outcome::Applied(Reply::Rejected(rejection));
                }
                let session = SessionId(index.0);
                let sessions_max = limits.sessions_max;
                let owner = principal.cloned();
                if let Err(full) =
                    self.sessions
                        .open(session, *secret, owner, *ttl_ms, *window, now, sessions_max)
                {
                    return Outcome::Overloaded(full);
                }
                Outcome::Applied(Reply::SessionOpened {
                    session,
                    secret: *secret,
                    ttl_ms: *ttl_ms,
                    window: *window,
                })
            }
            Command::KeepAlive { session, secret } => {
                if !self.owns_session(*session, principal) {
                    return Outcome::Unauthorized;
                }
                match self.sessions.authenticate(*session, *secret, now) {
                    Ok(live) => Outcome::Applied(Reply::SessionKeptAlive {
                        ttl_ms: live.ttl_ms(),
                    }),
                    Err(outcome) => outcome,
                }
            }
            Command::CloseSession { session, secret } => {
                if !self.owns_session(*session, principal) {
                    return Outcome::Unauthorized;
                }
                if let Err(outcome) = self.sessions.authenticate(*session, *secret, now) {
                    return outcome;
                }
                self.sessions.close(*session);
                Outcome::Applied(Reply::SessionClosed)
            }
            Command::Tick => Outcome::Applied(Reply::Ticked),
            Command::LeaseGrant { name, ttl_ms } => Outcome::Applied(
                self.grant_lease(name, *ttl_ms, principal, index)
                    .unwrap_or_else(Reply::Rejected),
            ),
            Command::AlarmDisarm => {
                let was_raised = std::mem::replace(&mut self.no_space_alarm, false);
                Outcome::Applied(Reply::AlarmDisarmed { was_raised })
            }
            Command::Auth(change) => match self.auth.apply(change, index) {
                Ok(()) => Outcome::Applied(Reply::AuthChanged),
                Err(rejection) => Outcome::Applied(Reply::Rejected(rejection)),
            },
            Command::Compact { revision } => {
                let current = self.last_applied.map_or(0, |i| i.0);
                let history = self.kv.history_mut();
                // As etcd: compacting at or below what is compacted
                // already is refused (once anything is).
                let compacted = history.compacted();
                if compacted > 0 && *revision <= compacted {
                    let rejection = Rejection::Compacted {
                        revision: *revision,
                        compacted,
                    };
                    return Outcome::Applied(Reply::Rejected(rejection));
                }
                if *revision > current {
                    let rejection = Rejection::FutureRevision {
                        revision: *revision,
                        current,
                    };
                    return Outcome::Applied(Reply::Rejected(rejection));
                }
                history.compact(*revision);
                Outcome::Applied(Reply::Compacted {
                    revision: history.compacted(),
                })
            }
            _ => {
                let reply = self.execute(command, index);
                Outcome::Applied(self.visible_to(principal, command, reply))
            }
        }
    }

    /// Executes a data or lease command.
    fn execute(&mut self, command: &Command, index: LogIndex) -> Reply {
        match self.try_execute(command, index) {
            Ok(reply) => reply,
            Err(rejection) => Reply::Rejected(rejection),
        }
    }

    fn try_execute(&mut self, command: &Command, index: LogIndex) -> Result<Reply, Rejection> {
        let now = self.clock;
        let at = self.stamp(index);
        match command {
            Command::Put { key, value, lease } => {
                self.check_key(key)?;
                self.check_value(value.len())?;
                if let Some(name) = lease
                    && self.leases.get(name).is_none()
                {
                    return Err(Rejection::LeaseNotFound { name: name.clone() });
                }
                self.check_room_for(key)?;
                let previous = self.kv.write(key, Some((value.clone(), lease.clone())), at);
                if let Some(old) = previous.as_ref().and_then(|p| p.lease.as_ref()) {
                    self.leases.detach(old, key);
                }
                if let Some(name) = lease {
                    self.leases.attach(name, key);
                }
                Ok(Reply::Put {
                    previous: previous.map(|p| p.value.clone()),
                })
            }
            Command::Delete { key } => {
                self.check_key(key)?;
                Ok(Reply::Delete {
                    previous: self.remove_key(key, at),
                })
            }
            Command::Append { key, value } => {
                self.check_key(key)?;
                let current = self.kv.get(key).map_or(0, |stored| stored.value.len());
                let length = current.saturating_add(value.len());
                self.check_value(length)?;
                self.check_room_for(key)?;
                self.kv.append(key, value, at);
                Ok(Reply::Append {
                    length: length as u64,
                })
            }
            Command::Incr { key, by } => {
                self.check_key(key)?;
                let current = self.kv.get(key).map(|stored| stored.value.as_slice());
                let current = parse_counter(current).ok_or(Rejection::NotAnInteger)?;
                let value = current.checked_add(*by).ok_or(Rejection::Overflow)?;
                self.check_room_for(key)?;
                self.kv.set_value(key, value.to_string().into_bytes(), at);
                Ok(Reply::Incr { value })
            }
            Command::Cas { key, expected, new } => {
                self.check_key(key)?;
                self.check_value(new.len())?;
                let current = self.kv.get(key).map(|stored| &stored.value);
                if current != expected.as_ref() {
                    return Ok(Reply::Cas {
                        swapped: false,
                        current: current.cloned(),
                    });
                }
                self.check_room_for(key)?;
                self.kv.set_value(key, new.clone(), at);
                Ok(Reply::Cas {
                    swapped: true,
                    current: Some(new.clone()),
                })
            }
            Command::LeaseKeepAlive { name } => {
                let expires_at = self
                    .leases
                    .keep_alive(name, now)
                    .ok_or_else(|| Rejection::LeaseNotFound { name: name.clone() })?;
                Ok(Reply::LeaseKeptAlive {
                    name: name.clone(),
                    expires_at,
                })
            }
            Command::LeaseRevoke { name } => {
                let lease = self
                    .leases
                    .remove(name)
                    .ok_or_else(|| Rejection::LeaseNotFound { name: name.clone() })?;
                for key in &lease.keys {
                    self.kv.remove(key, at);
                }
                Ok(Reply::LeaseRevoked {
                    name: name.clone(),
                    keys_deleted: lease.keys.len() as u64,
                })
            }
            Command::Read(query) => Ok(self.read(query)),
            Command::Txn(txn) => self.run_txn(txn, index),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::Tick
            | Command::AlarmDisarm
            | Command::Auth(_)
            | Command::Compact { .. } => unreachable!("control commands are run, not executed"),
            // Run with the principal that will own it (`grant_lease`).
            Command::LeaseGrant { .. } => unreachable!("a lease grant is run, not executed"),
        }
    }

    /// Grants lease `name` for `ttl_ms`, owned by `owner` (the entry's
    /// principal).
    fn grant_lease(
        &mut self,
        name: &str,
        ttl_ms: u64,
        owner: Option<&Principal>,
        index: LogIndex,
    ) -> Result<Reply, Rejection> {
        let now = self.clock;
        self.check_lease_name(name)?;
        let limits = &self.limits;
        if let Some(rejection) = check_ttl(ttl_ms, limits.lease_ttl_ms_min, limits.lease_ttl_ms_max)
        {
            return Err(rejection);
        }
        if self.leases.get(name).is_some() {
            return Err(Rejection::LeaseExists {
                name: name.to_string(),
            });
        }
        if self.leases.len() >= limits.leases_max {
            return Err(Rejection::TooManyLeases {
                max: limits.leases_max,
            });
        }
        self.leases
            .grant(name.to_string(), ttl_ms, now, index, owner.cloned());
        Ok(Reply::LeaseGranted {
            name: name.to_string(),
            ttl_ms,
            expires_at: now.plus_ms(ttl_ms),
        })
    }

    /// Answers a query from the current state (for reads served by
    /// read-index, without a log entry).
    pub fn read(&self, query: &Query) -> Reply {
        match query {
            Query::Get { key } => {
                if let Err(rejection) = self.check_key(key) {
                    return Reply::Rejected(rejection);
                }
                let stored = self.kv.get(key);
                Reply::Get {
                    value: stored.map(|stored| stored.value.clone()),
                    meta: stored.map(|stored| stored.meta),
                }
            }
            Query::Scan { prefix, limit } => {
                let max = self.limits.scan_limit_max;
                let limit = if *limit == 0 { max } else { (*limit).min(max) };
                let bytes_max = self.limits.scan_bytes_max;
                let (entries, more) = self.kv.scan(prefix, limit as usize, bytes_max);
                Reply::Scan { entries, more }
            }
            Query::Range { range, limit } => {
                let (limit, bytes_max) = self.scan_bounds(*limit);
                let page = self.kv.scan_range(range, limit, bytes_max);
                Reply::Range {
                    entries: page.entries,
                    more: page.more,
                    count: page.count,
                }
            }
            Query::LeaseList => Reply::Leases {
                leases: self.leases.iter().map(|lease| lease.info()).collect(),
            },
            Query::Auth => Reply::Auth(self.auth.view()),
            Query::At { revision, query } => {
                let current = self.last_applied.map_or(0, |i| i.0);
                if let Err(rejection) = self.kv.check_readable(*revision, current) {
                    return Reply::Rejected(rejection);
                }
                match &**query {
                    Query::Get { key } => {
                        if let Err(rejection) = self.check_key(key) {
                            return Reply::Rejected(rejection);
                        }
                        let stored = self.kv.get_at(key, *revision);
                        Reply::Get {
                            meta: stored.as_ref().map(|stored| stored.meta),
                            value: stored.map(|stored| stored.value),
                        }
                    }
                    Query::Scan { prefix, limit } => {
                        let max = self.limits.scan_limit_max;
                        let limit = if *limit == 0 { max } else { (*limit).min(max) };
                        let bytes_max = self.limits.scan_bytes_max;
                        let (entries, more) =
                            self.kv
                                .scan_at(prefix, *revision, limit as usize, bytes_max);
                        Reply::Scan { entries, more }
                    }
                    Query::Range { range, limit } => {
                        let (limit, bytes_max) = self.scan_bounds(*limit);
                        let page = self.kv.scan_range_at(range, *revision, limit, bytes_max);
                        Reply::Range {
                            entries: page.entries,
                            more: page.more,
                            count: page.count,
                        }
                    }
                    _ => Reply::Rejected(Rejection::NotVersioned),
                }
            }
        }
    }

    /// Runs a transaction: evaluates its compares, and those of the
    /// transactions nested in the branches it takes (all against the state
    /// before any operation runs, as etcd does), then runs the chosen
    /// branch's operations in order, each seeing the earlier ones' writes.
    /// If one is refused, every change the transaction made is undone and
    /// the whole transaction answers that refusal.
    fn run_txn(&mut self, txn: &Txn, index: LogIndex) -> Result<Reply, Rejection> {
        txn.check_shape(self.limits.txn_ops_max as usize)?;
        self.check_compare_keys(txn)?;
        let mut path = Vec::new();
        self.decide_path(txn, &mut path);
        let undo = self.kv.undo_point();
        let mut path = path.into_iter();
        let mut reply = ReplyBudget {
            bytes: 0,
            max: self.limits.reply_bytes_max(),
        };
        match self.run_branch(txn, &mut path, index, &mut reply) {
            Ok(reply) => Ok(reply),
            Err(rejection) => {
                self.undo_to(undo);
                Err(rejection)
            }
        }
    }

    /// Checks the key of every one-key compare of `txn` and of the
    /// transactions nested in it.
    fn check_compare_keys(&self, txn: &Txn) -> Result<(), Rejection> {
        for compare in txn.compare.iter().filter(|c| c.scope == KeyScope::Key) {
            self.check_key(&compare.key)?;
        }
        txn.nested()
            .try_for_each(|nested| self.check_compare_keys(nested))
    }

    /// Whether each compare of `txn` holds now.
    fn compares_hold(&self, txn: &Txn) -> bool {
        txn.compare.iter().all(|compare| match &compare.scope {
            KeyScope::Key => crate::txn::holds_for(compare, self.kv.get(&compare.key)),
            KeyScope::Prefix => {
                let under = self.kv.iter_prefix(&compare.key).map(|(_, stored)| stored);
                crate::txn::holds_for_each(compare, under)
            }
            KeyScope::Range { .. } => {
                let range = compare.scope.range_from(&compare.key);
                let within = self.kv.iter_range(&range).map(|(_, stored)| stored);
                crate::txn::holds_for_each(compare, within)
            }
        })
    }

    /// The path taken through `txn` (etcd's `compareToPath`): whether its
    /// compares hold, then, for each transaction nested in the branch that
    /// holds, in order, its own path; all decided on the state as it is.
    fn decide_path(&self, txn: &Txn, path: &mut Vec<bool>) {
        let succeeded = self.compares_hold(txn);
        path.push(succeeded);
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            if let TxnOp::Txn(nested) = op {
                self.decide_path(nested, path);
            }
        }
    }

    /// Runs the branch of `txn` the next decision of `path` names, and the
    /// nested transactions in it by the decisions after it, counting what
    /// each operation's reply holds against `reply`. Undoing a refusal is
    /// the caller's.
    fn run_branch(
        &mut self,
        txn: &Txn,
        path: &mut std::vec::IntoIter<bool>,
        index: LogIndex,
        reply: &mut ReplyBudget,
    ) -> Result<Reply, Rejection> {
        reply.take(crate::outcome::ENTRY_OVERHEAD_BYTES)?;
        let succeeded = path
            .next()
            .expect("a decision for every transaction on the path");
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let result = match op {
                TxnOp::DeletePrefix { prefix } => {
                    let keys: Vec<Vec<u8>> = self
                        .kv
                        .iter_prefix(prefix)
                        .map(|(key, _)| key.clone())
                        .collect();
                    Ok(self.remove_keys(&keys, index))
                }
                TxnOp::DeleteRange { range } => {
                    let keys: Vec<Vec<u8>> = self
                        .kv
                        .iter_range(range)
                        .map(|(key, _)| key.clone())
                        .collect();
                    Ok(self.remove_keys(&keys, index))
                }
                TxnOp::PutExisting { key, value, lease } => self
                    .put_existing(key, value, lease)
                    .and_then(|put| self.try_execute(&put, index)),
                TxnOp::Txn(nested) => self.run_branch(nested, path, index, reply),
                other => match other.as_command() {
                    Some(command) => self.try_execute(&command, index),
                    None => unreachable!("every other operation runs as a command"),
                },
            };
            match result {
                Ok(Reply::Rejected(rejection)) | Err(rejection) => return Err(rejection),
                // A nested transaction counted its own operations.
                Ok(nested @ Reply::Txn { .. }) => results.push(nested),
                Ok(one) => {
                    reply.take(one.weight_bytes())?;
                    results.push(one);
                }
            }
        }
        Ok(Reply::Txn { succeeded, results })
    }

    /// Removes `keys` at `index`'s revision; answers how many.
    fn remove_keys(&mut self, keys: &[Vec<u8>], index: LogIndex) -> Reply {
        let at = self.stamp(index);
        for key in keys {
            self.remove_key(key, at);
        }
        Reply::DeletePrefix {
            deleted: keys.len() as u64,
        }
    }

    /// The put a [`TxnOp::PutExisting`] of `key` makes now: the value and
    /// lease it sets, or those the key has; refused if the key is absent.
    fn put_existing(
        &self,
        key: &[u8],
        value: &crate::txn::Update<Vec<u8>>,
        lease: &crate::txn::Update<Option<String>>,
    ) -> Result<Command, Rejection> {
        self.check_key(key)?;
        let stored = self.kv.get(key).ok_or_else(|| Rejection::KeyNotFound {
            key: String::from_utf8_lossy(key).into_owned(),
        })?;
        Ok(Command::Put {
            key: key.to_vec(),
            value: value.clone().or_current(stored.value.clone()),
            lease: lease.clone().or_current(stored.lease.clone()),
        })
    }

    /// The entries and bytes a scan of `limit` (0: the maximum) returns at
    /// most.
    fn scan_bounds(&self, limit: u32) -> (usize, u64) {
        let max = self.limits.scan_limit_max;
        let limit = if limit == 0 { max } else { limit.min(max) };
        (limit as usize, self.limits.scan_bytes_max)
    }

    /// Undoes every change since `point`, newest first, with the lease
    /// attachments they made.
    fn undo_to(&mut self, point: crate::kv::UndoPoint) {
        for event in self.kv.undo_to(point) {
            if let Some(lease) = event.value.as_ref().and_then(|v| v.lease.as_ref()) {
                self.leases.detach(lease, &event.key);
            }
            if let Some(lease) = event.previous.as_ref().and_then(|v| v.lease.as_ref()) {
                self.leases.attach(lease, &event.key);
            }
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Rejection> {
        self.limits.check_key(key)
    }

    fn check_value(&self, bytes: usize) -> Result<(), Rejection> {
        self.limits.check_value(bytes)
    }

    fn check_lease_name(&self, name: &str) -> Result<(), Rejection> {
        self.limits.check_lease_name(name)
    }

    fn check_room_for(&self, key: &[u8]) -> Result<(), Rejection> {
        let max = self.limits.kv_keys_max;
        if !self.kv.contains(key) && self.kv.len() >= max {
            return Err(Rejection::TooManyKeys { max });
        }
        Ok(())
    }

    fn remove_key(&mut self, key: &[u8], at: Stamp) -> Option<Vec<u8>> {
        let stored = self.kv.remove(key, at)?;
        if let Some(lease) = &stored.lease {
            self.leases.detach(lease, key);
        }
        Some(stored.value.clone())
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

/// The completion record of a request that ran: its reply, except for a
/// read, whose value is not kept.
fn record_of(command: &Command, reply: &Reply, index: LogIndex, digest: u64) -> CompletionRecord {
    CompletionRecord {
        reply: (!matches!(command, Command::Read(_))).then(|| reply.clone()),
        applied_index: index,
        digest,
    }
}

/// A put of `key`, for the permission and visibility rules of puts.
fn put_of(key: &[u8]) -> Command {
    Command::Put {
        key: key.to_vec(),
        value: Vec::new(),
        lease: None,
    }
}

/// A range in words: `[start, end)`, or `[start, ...)` without an end.
fn range_words(range: &KeyRange) -> String {
    let start = String::from_utf8_lossy(&range.start);
    match &range.end {
        Some(end) => format!("[{start:?}, {:?})", String::from_utf8_lossy(end)),
        None => format!("[{start:?}, ...)"),
    }
}

fn control_not_allowed(command: &Command) -> Outcome {
    Outcome::Malformed(crate::limits::control_not_allowed(command))
}

fn check_ttl(ttl_ms: u64, min_ms: u64, max_ms: u64) -> Option<Rejection> {
    crate::limits::check_ttl(ttl_ms, min_ms, max_ms).err()
}

/// What a transaction's reply holds so far, against
/// [`Limits::reply_bytes_max`]: every operation's reply is counted as it
/// is made, so no node builds a reply past the bound.
struct ReplyBudget {
    bytes: u64,
    max: u64,
}

impl ReplyBudget {
    /// Counts `bytes` more; refuses once the reply would pass the bound.
    fn take(&mut self, bytes: u64) -> Result<(), Rejection> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max {
            return Err(Rejection::ReplyTooLarge {
                bytes: self.bytes,
                max: self.max,
            });
        }
        Ok(())
    }
}
