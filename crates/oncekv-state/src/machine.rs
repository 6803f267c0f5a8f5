//! [`StateMachine`]: applies log entries deterministically. It advances
//! cluster time, expires sessions, idempotency keys and leases, decides
//! deduplication (the only place it is decided) and executes commands.

use crate::command::{Command, Entry, Origin, Query, Request};
use crate::digest::command_digest;
use crate::idempotency::IdempotencyKeys;
use crate::ids::{ClusterTime, LogIndex, SessionId};
use crate::kv::{KvStore, StoredValue, parse_counter};
use crate::lease::Leases;
use crate::limits::Limits;
use crate::outcome::{Malformed, Outcome, Rejection, Reply};
use crate::session::{CompletionRecord, SessionTable};
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
    /// Idempotency keys kept.
    pub idempotency_keys: u64,
    /// Live leases.
    pub leases: u64,
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
    /// Whether duplicates are answered from their completion records. Off
    /// only in the negative control of the fault checkers (see
    /// [`StateMachine::without_dedup`]); never part of a snapshot.
    pub(crate) dedup: bool,
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
            dedup: true,
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

    /// Counts that describe the state.
    pub fn stats(&self) -> Stats {
        Stats {
            last_applied: self.last_applied,
            cluster_time: self.clock,
            keys: self.kv.len(),
            sessions: self.sessions.len(),
            completion_records: self.sessions.records_held(),
            idempotency_keys: self.keys.len(),
            leases: self.leases.len(),
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
        let outcome = self.apply_request(&entry.request, entry.index);
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
        for lease in self.leases.expire(now) {
            for key in &lease.keys {
                self.kv.remove(key);
            }
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

    fn apply_request(&mut self, request: &Request, index: LogIndex) -> Outcome {
        let command = &request.command;
        match &request.origin {
            Origin::Plain => self.run(command, index),
            Origin::Session(header) => {
                if command.is_session_control() {
                    return control_not_allowed(command);
                }
                let digest = command_digest(command);
                match self.sessions.admit(header, digest, self.clock) {
                    Ok(()) => {}
                    Err(Outcome::Replayed { .. }) if !self.dedup => {}
                    Err(outcome) => return outcome,
                }
                let reply = self.execute(command, index);
                let record = CompletionRecord {
                    reply: reply.clone(),
                    applied_index: index,
                    digest,
                };
                self.sessions.complete(header, record);
                Outcome::Applied(reply)
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
                match self.keys.lookup(key, digest) {
                    Some(Outcome::Replayed { .. }) if !self.dedup => {}
                    Some(outcome) => return outcome,
                    None => {}
                }
                let outcome = self.run(command, index);
                if let Outcome::Applied(reply) = &outcome {
                    let record = CompletionRecord {
                        reply: reply.clone(),
                        applied_index: index,
                        digest,
                    };
                    let keys_max = self.limits.idempotency_keys_max;
                    self.keys.record(key.clone(), record, self.clock, keys_max);
                }
                outcome
            }
        }
    }

    /// Runs any command: session control yields an outcome of its own, the
    /// rest a reply.
    fn run(&mut self, command: &Command, index: LogIndex) -> Outcome {
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
                let sessions_max = limits.sessions_max.max(1);
                self.sessions
                    .open(session, *secret, *ttl_ms, *window, now, sessions_max);
                Outcome::Applied(Reply::SessionOpened {
                    session,
                    secret: *secret,
                    ttl_ms: *ttl_ms,
                    window: *window,
                })
            }
            Command::KeepAlive { session, secret } => {
                match self.sessions.authenticate(*session, *secret, now) {
                    Ok(live) => Outcome::Applied(Reply::SessionKeptAlive {
                        ttl_ms: live.ttl_ms(),
                    }),
                    Err(outcome) => outcome,
                }
            }
            Command::CloseSession { session, secret } => {
                if let Err(outcome) = self.sessions.authenticate(*session, *secret, now) {
                    return outcome;
                }
                self.sessions.close(*session);
                Outcome::Applied(Reply::SessionClosed)
            }
            Command::Tick => Outcome::Applied(Reply::Ticked),
            _ => Outcome::Applied(self.execute(command, index)),
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
                let stored = StoredValue {
                    value: value.clone(),
                    lease: lease.clone(),
                };
                let previous = self.kv.insert(key.clone(), stored);
                if let Some(StoredValue {
                    lease: Some(old), ..
                }) = &previous
                {
                    self.leases.detach(old, key);
                }
                if let Some(name) = lease {
                    self.leases.attach(name, key);
                }
                Ok(Reply::Put {
                    previous: previous.map(|p| p.value),
                })
            }
            Command::Delete { key } => {
                self.check_key(key)?;
                Ok(Reply::Delete {
                    previous: self.remove_key(key),
                })
            }
            Command::Append { key, value } => {
                self.check_key(key)?;
                let current = self.kv.get(key).map_or(0, |stored| stored.value.len());
                let length = current.saturating_add(value.len());
                self.check_value(length)?;
                self.check_room_for(key)?;
                match self.kv.get_mut(key) {
                    Some(stored) => stored.value.extend_from_slice(value),
                    None => {
                        let stored = StoredValue {
                            value: value.clone(),
                            lease: None,
                        };
                        self.kv.insert(key.clone(), stored);
                    }
                }
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
                self.set_value(key, value.to_string().into_bytes());
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
                self.set_value(key, new.clone());
                Ok(Reply::Cas {
                    swapped: true,
                    current: Some(new.clone()),
                })
            }
            Command::LeaseGrant { name, ttl_ms } => {
                self.check_lease_name(name)?;
                let limits = &self.limits;
                if let Some(rejection) =
                    check_ttl(*ttl_ms, limits.lease_ttl_ms_min, limits.lease_ttl_ms_max)
                {
                    return Err(rejection);
                }
                if self.leases.get(name).is_some() {
                    return Err(Rejection::LeaseExists { name: name.clone() });
                }
                if self.leases.len() >= limits.leases_max {
                    return Err(Rejection::TooManyLeases {
                        max: limits.leases_max,
                    });
                }
                self.leases.grant(name.clone(), *ttl_ms, now, index);
                Ok(Reply::LeaseGranted {
                    name: name.clone(),
                    ttl_ms: *ttl_ms,
                    expires_at: now.plus_ms(*ttl_ms),
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
                    self.kv.remove(key);
                }
                Ok(Reply::LeaseRevoked {
                    name: name.clone(),
                    keys_deleted: lease.keys.len() as u64,
                })
            }
            Command::Read(query) => Ok(self.read(query)),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::Tick => unreachable!("session control is run, not executed"),
        }
    }

    /// Answers a query from the current state (for reads served by
    /// read-index, without a log entry).
    pub fn read(&self, query: &Query) -> Reply {
        match query {
            Query::Get { key } => {
                if let Err(rejection) = self.check_key(key) {
                    return Reply::Rejected(rejection);
                }
                Reply::Get {
                    value: self.kv.get(key).map(|stored| stored.value.clone()),
                }
            }
            Query::Scan { prefix, limit } => {
                let max = self.limits.scan_limit_max;
                let limit = if *limit == 0 { max } else { (*limit).min(max) };
                let (entries, more) = self.kv.scan(prefix, limit as usize);
                Reply::Scan { entries, more }
            }
            Query::LeaseList => Reply::Leases {
                leases: self.leases.iter().map(|lease| lease.info()).collect(),
            },
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Rejection> {
        let max = self.limits.key_bytes_max;
        if key.is_empty() || key.len() > max {
            return Err(Rejection::KeyLength {
                bytes: key.len(),
                max,
            });
        }
        Ok(())
    }

    fn check_value(&self, bytes: usize) -> Result<(), Rejection> {
        let max = self.limits.value_bytes_max;
        if bytes > max {
            return Err(Rejection::ValueTooLarge { bytes, max });
        }
        Ok(())
    }

    fn check_lease_name(&self, name: &str) -> Result<(), Rejection> {
        let max = self.limits.lease_name_bytes_max;
        if name.is_empty() || name.len() > max {
            return Err(Rejection::LeaseNameLength {
                bytes: name.len(),
                max,
            });
        }
        Ok(())
    }

    fn check_room_for(&self, key: &[u8]) -> Result<(), Rejection> {
        let max = self.limits.kv_keys_max;
        if !self.kv.contains(key) && self.kv.len() >= max {
            return Err(Rejection::TooManyKeys { max });
        }
        Ok(())
    }

    /// Sets a value, keeping the key's lease attachment.
    fn set_value(&mut self, key: &[u8], value: Vec<u8>) {
        match self.kv.get_mut(key) {
            Some(stored) => stored.value = value,
            None => {
                self.kv
                    .insert(key.to_vec(), StoredValue { value, lease: None });
            }
        }
    }

    fn remove_key(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let stored = self.kv.remove(key)?;
        if let Some(lease) = &stored.lease {
            self.leases.detach(lease, key);
        }
        Some(stored.value)
    }

    /// Checks every invariant of the replicated state.
    pub fn check_invariants(&self) -> Result<(), String> {
        let limits = &self.limits;
        let now = self.clock;
        self.sessions
            .check_invariants(now, limits.sessions_max.max(1))?;
        self.keys.check_invariants(
            now,
            limits.idempotency_key_ttl_ms,
            limits.idempotency_keys_max,
        )?;
        self.leases.check_invariants(now, limits.leases_max)?;
        if self.kv.len() > limits.kv_keys_max {
            return Err(format!(
                "{} keys exceed {}",
                self.kv.len(),
                limits.kv_keys_max
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
                    return Err(format!(
                        "key {key:?} attached to lease {name:?} not owning it"
                    ));
                }
                *attached.entry(name).or_default() += 1;
            }
        }
        for lease in self.leases.iter() {
            if attached.get(lease.name.as_str()).copied().unwrap_or(0) != lease.keys.len() {
                return Err(format!("lease {:?} lists keys it does not own", lease.name));
            }
        }
        Ok(())
    }
}

fn control_not_allowed(command: &Command) -> Outcome {
    Outcome::Malformed(Malformed::ControlNotAllowed {
        command: command.name().to_string(),
    })
}

fn check_ttl(ttl_ms: u64, min_ms: u64, max_ms: u64) -> Option<Rejection> {
    (!(min_ms..=max_ms).contains(&ttl_ms)).then_some(Rejection::TtlOutOfRange {
        ttl_ms,
        min_ms,
        max_ms,
    })
}
