//! Admission and replay: the path of a request through
//! [`StateMachine::apply`], in the order of the decision table in
//! ARCHITECTURE.md. A request on a session is admitted by the session
//! table, one under an idempotency key looked up in the key table:
//! deduplication is decided here and nowhere else (`tests/tidy.rs`). A
//! retry is answered from its completion record; a new request is checked
//! for permission, charged to its holder's budgets (a user's share, or the
//! whole less the admin reserve) and to the store's quota (`NOSPACE`)
//! before it runs, and what ran is recorded.

use crate::command::{Command, Origin, Request};
use crate::digest::command_digest;
use crate::idempotency::KeyBudget;
use crate::ids::{LogIndex, Principal};
use crate::kv::entry_weight_bytes;
use crate::machine::StateMachine;
use crate::outcome::{Outcome, Reply};
use crate::overhead::STORE_ENTRY_OVERHEAD_BYTES;
use crate::quota::Holder;
use crate::refusal::{Malformed, Overload};
use crate::session::{CompletionRecord, NotExecuted, RecordBudget};
use crate::txn::{Txn, TxnOp};

impl StateMachine {
    /// What applying `request` would answer now, for a request that needs
    /// no log entry: one without deduplication ([`Origin::Plain`]) whose
    /// command changes nothing ([`Command::changes_nothing`]: a read, or a
    /// transaction that only reads). It takes the path a plain request
    /// takes through [`apply`](Self::apply) (the permission check, the
    /// store's quota, execution under the reply bound), on a copy of this
    /// state that shares its maps, so nothing here changes; a leader that
    /// has confirmed it leads answers it so, and refuses a reply past the
    /// bound before proposing anything. `None` for any other request: it
    /// must be applied from the log.
    pub fn answer_unlogged(
        &self,
        request: &Request,
        principal: Option<&Principal>,
    ) -> Option<Outcome> {
        if request.needs_log() {
            return None;
        }
        // Run as the next entry would be: a read at a past revision inside
        // a transaction reads up to the revision before its entry's, which
        // is the last applied one.
        let next = self
            .last_applied
            .map_or(1, |index| index.0.saturating_add(1));
        Some(
            self.clone()
                .apply_request(request, principal, LogIndex(next)),
        )
    }

    pub(super) fn apply_request(
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
                let (limits, holder) = (&self.limits, self.holder(principal));
                let budget = RecordBudget {
                    session_bytes_max: limits.session_record_bytes_max,
                    total_bytes_max: holder.total_max(&limits.quotas, limits.record_bytes_max),
                    user_bytes_max: holder.share(&limits.quotas, limits.record_bytes_max),
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
                let (limits, holder) = (&self.limits, self.holder(principal));
                let quotas = &limits.quotas;
                let (keys_max, bytes_max) =
                    (limits.idempotency_keys_max, limits.idempotency_bytes_max);
                let budget = KeyBudget {
                    keys_max: holder.total_max(quotas, keys_max),
                    bytes_max: holder.total_max(quotas, bytes_max),
                    user_max: holder
                        .share(quotas, keys_max)
                        .zip(holder.share(quotas, bytes_max)),
                };
                if let Err(full) = self.keys.check_room(principal, budget) {
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

    /// Whom `principal`'s requests are charged to: the whole budgets for an
    /// admin (anyone while authentication is off), a user's share within
    /// the budgets less the admin reserve otherwise.
    pub(super) fn holder<'a>(&self, principal: Option<&'a Principal>) -> Holder<'a> {
        if self.auth.is_admin(principal) {
            Holder::Admin
        } else {
            Holder::User(principal)
        }
    }

    /// Closes the sessions `name` opened and forgets its idempotency keys:
    /// what deleting or purging a user frees. Returns how many of each.
    pub(super) fn free_user(&mut self, name: &str) -> (u64, u64) {
        let user = Principal(name.to_string());
        let sessions = self.sessions.owned_by(&user);
        for id in &sessions {
            self.sessions.close(*id);
        }
        let keys = self.keys.remove_owned_by(&user);
        (sessions.len() as u64, keys)
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
        if self.no_space_alarm || !self.alarmed_members.is_empty() {
            return refused;
        }
        let fits = |growth: u64| self.kv.bytes().saturating_add(growth) <= max;
        // Far from the quota (nearly always), a bound that looks nothing
        // up decides: the same answer, one lookup of the key fewer.
        if growth_bound(command).is_some_and(fits) {
            return None;
        }
        if !fits(self.growth_bytes(command)) {
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
                    key.len() as u64 + STORE_ENTRY_OVERHEAD_BYTES
                };
                value.len() as u64 + fresh
            }
            Command::Incr { key, .. } => {
                // An i64 in decimal takes at most 20 bytes.
                20 + key.len() as u64 + STORE_ENTRY_OVERHEAD_BYTES
            }
            Command::Cas { key, new, .. } => {
                new.len() as u64 + key.len() as u64 + STORE_ENTRY_OVERHEAD_BYTES
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
}

/// An upper bound of [`StateMachine::growth_bytes`] that needs no lookup
/// in the store; `None` for a command whose bound would need one.
fn growth_bound(command: &Command) -> Option<u64> {
    match command {
        Command::Put { key, value, lease } => {
            Some(crate::kv::weight_bytes(key, value, lease.as_ref()))
        }
        Command::Append { key, value } => Some(
            (value.len() as u64)
                .saturating_add(key.len() as u64)
                .saturating_add(STORE_ENTRY_OVERHEAD_BYTES),
        ),
        _ => None,
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

fn control_not_allowed(command: &Command) -> Outcome {
    Outcome::Malformed(crate::limits::control_not_allowed(command))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Entry, Proposal};
    use crate::ids::ClusterTime;
    use crate::limits::Limits;

    fn put(key: &str, value_bytes: usize) -> Command {
        Command::Put {
            key: key.as_bytes().to_vec(),
            value: vec![b'v'; value_bytes].into(),
            lease: None,
        }
    }

    fn append(key: &str, value_bytes: usize) -> Command {
        Command::Append {
            key: key.as_bytes().to_vec(),
            value: vec![b'a'; value_bytes],
        }
    }

    /// The bound that spares the lookup is never below the exact growth,
    /// for new keys and stored ones, larger and smaller values: the
    /// quota's answer cannot change by taking it.
    #[test]
    fn the_growth_bound_never_undercounts() {
        let mut machine = StateMachine::new(Limits::default());
        for (index, command) in [put("big", 100), put("small", 3), append("log", 10)]
            .into_iter()
            .enumerate()
        {
            let entry = Entry {
                index: LogIndex(index as u64 + 1),
                proposal: Proposal {
                    time: ClusterTime(0),
                    principal: None,
                    request: Request::plain(command),
                },
            };
            assert!(matches!(machine.apply(&entry), Outcome::Applied(_)));
        }
        for command in [
            put("big", 10),
            put("big", 100),
            put("big", 500),
            put("small", 50),
            put("fresh", 7),
            append("log", 4),
            append("fresh", 4),
        ] {
            let bound = growth_bound(&command).expect("a put or append has a bound");
            let exact = machine.growth_bytes(&command);
            assert!(
                bound >= exact,
                "{command:?}: bound {bound} < growth {exact}"
            );
        }
        assert_eq!(
            growth_bound(&Command::Incr {
                key: b"n".to_vec(),
                by: 1
            }),
            None
        );
    }
}
