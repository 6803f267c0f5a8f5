//! Execution: running a command that was admitted, against the state:
//! session control, the data commands and their checks (key and value
//! sizes, the store's key count), reads at the current or a past revision,
//! leases (granted to their owner, kept alive, revoked with their keys),
//! the alarm, users and roles, compaction of the history, and
//! transactions: compares decided first, operations run in order, all
//! undone if one is refused, the reply bounded.

use crate::auth::AuthCommand;
use crate::command::{Command, Query};
use crate::history::Stamp;
use crate::ids::{LogIndex, Principal, SessionId};
use crate::key_range::KeyScope;
use crate::kv::parse_counter;
use crate::limits::ALARMED_MEMBERS_MAX;
use crate::machine::StateMachine;
use crate::outcome::{Outcome, Reply};
use crate::overhead::ENTRY_OVERHEAD_BYTES;
use crate::refusal::Rejection;
use crate::session::SessionBudget;
use crate::txn::{Txn, TxnOp};
use std::sync::Arc;

impl StateMachine {
    /// Runs any command: session control yields an outcome of its own, the
    /// rest a reply.
    pub(super) fn run(
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
                let holder = self.holder(principal);
                let budget = SessionBudget {
                    total_max: holder.total_max(&limits.quotas, limits.sessions_max),
                    user_max: holder.share(&limits.quotas, limits.sessions_max),
                };
                let owner = principal.cloned();
                if let Err(full) = self
                    .sessions
                    .open(session, *secret, owner, *ttl_ms, *window, now, budget)
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
                let was_raised = std::mem::replace(&mut self.no_space_alarm, false)
                    | !self.alarmed_members.is_empty();
                self.alarmed_members.clear();
                Outcome::Applied(Reply::AlarmDisarmed { was_raised })
            }
            Command::AlarmSet { member, raise } => {
                let changed = if *raise {
                    let full = self.alarmed_members.len() as u64 >= ALARMED_MEMBERS_MAX;
                    if full && !self.alarmed_members.contains(member) {
                        return Outcome::Applied(Reply::Rejected(Rejection::TooManyAlarms {
                            max: ALARMED_MEMBERS_MAX,
                        }));
                    }
                    self.alarmed_members.insert(*member)
                } else {
                    let quota = std::mem::replace(&mut self.no_space_alarm, false);
                    self.alarmed_members.remove(member) | quota
                };
                Outcome::Applied(Reply::AlarmSet { changed })
            }
            Command::Auth(change) => match change
                .check(self.limits.key_bytes_max)
                .and_then(|()| Arc::make_mut(&mut self.auth).apply(change, index))
            {
                Ok(()) => Outcome::Applied(match change {
                    AuthCommand::UserDelete { name } => {
                        self.free_user(name);
                        Reply::AuthChanged
                    }
                    AuthCommand::UserPurge { name } => {
                        let (sessions, keys) = self.free_user(name);
                        Reply::UserPurged { sessions, keys }
                    }
                    _ => Reply::AuthChanged,
                }),
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
                    previous: previous.map(|p| p.value.to_vec()),
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
                self.kv
                    .set_value(key, value.to_string().into_bytes().into(), at);
                Ok(Reply::Incr { value })
            }
            Command::Cas { key, expected, new } => {
                self.check_key(key)?;
                self.check_value(new.len())?;
                let current = self.kv.get(key).map(|stored| stored.value.as_slice());
                if current != expected.as_deref() {
                    return Ok(Reply::Cas {
                        swapped: false,
                        current: current.map(<[u8]>::to_vec),
                    });
                }
                self.check_room_for(key)?;
                self.kv.set_value(key, new.as_slice().into(), at);
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
            | Command::AlarmSet { .. }
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
                    value: stored.map(|stored| stored.value.to_vec()),
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
                self.read_at(*revision, current, query)
            }
        }
    }

    /// Answers `query` as the store was at `revision`, where `current` is
    /// the latest revision that may be read: refused if `revision` is
    /// compacted or after `current`.
    pub(super) fn read_at(&self, revision: u64, current: u64, query: &Query) -> Reply {
        if let Err(rejection) = self.kv.check_readable(revision, current) {
            return Reply::Rejected(rejection);
        }
        match query {
            Query::Get { key } => {
                if let Err(rejection) = self.check_key(key) {
                    return Reply::Rejected(rejection);
                }
                let stored = self.kv.get_at(key, revision);
                Reply::Get {
                    meta: stored.as_ref().map(|stored| stored.meta),
                    value: stored.map(|stored| stored.value.to_vec()),
                }
            }
            Query::Scan { prefix, limit } => {
                let max = self.limits.scan_limit_max;
                let limit = if *limit == 0 { max } else { (*limit).min(max) };
                let bytes_max = self.limits.scan_bytes_max;
                let (entries, more) = self.kv.scan_at(prefix, revision, limit as usize, bytes_max);
                Reply::Scan { entries, more }
            }
            Query::Range { range, limit } => {
                let (limit, bytes_max) = self.scan_bounds(*limit);
                let page = self.kv.scan_range_at(range, revision, limit, bytes_max);
                Reply::Range {
                    entries: page.entries,
                    more: page.more,
                    count: page.count,
                }
            }
            _ => Reply::Rejected(Rejection::NotVersioned),
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
        reply.take(ENTRY_OVERHEAD_BYTES)?;
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
                // The store as it was before this entry: the entry's own
                // revision is the transaction's, which a read inside it
                // may not name (on etcd, a range at a transaction's own
                // revision is in the future).
                TxnOp::RangeAt {
                    range,
                    limit,
                    revision,
                } => Ok(self.read_at(
                    *revision,
                    index.0.saturating_sub(1),
                    &Query::Range {
                        range: range.clone(),
                        limit: *limit,
                    },
                )),
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
    pub(super) fn put_existing(
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
            value: value.clone().or_current(stored.value.to_vec()).into(),
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
        Some(stored.value.to_vec())
    }
}

fn check_ttl(ttl_ms: u64, min_ms: u64, max_ms: u64) -> Option<Rejection> {
    crate::limits::check_ttl(ttl_ms, min_ms, max_ms).err()
}

/// What a transaction's reply holds so far, against
/// [`Limits::reply_bytes_max`](crate::Limits::reply_bytes_max): every
/// operation's reply is counted as it is made, so no node builds a reply
/// past the bound.
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
