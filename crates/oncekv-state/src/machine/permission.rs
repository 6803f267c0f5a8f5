//! Permissions, once authentication is enforced (everything is allowed
//! while it is off): whether an entry's principal may run a command, read
//! a query or run a transaction (each of its operations as its own
//! command), whether it may use a session (only its owner) or a lease,
//! and what of a reply it may see (a previous value without read
//! permission on its key, a lease it may not use).
//!
//! Leases have owners: a grant records the entry's principal as the
//! lease's owner, and once authentication is enforced only the owner or an
//! admin may grant its name again, renew it, revoke it, attach a key to it
//! (a put naming it, in a transaction too) or see it listed; anyone else is
//! refused with [`Outcome::PermissionDenied`](crate::Outcome::PermissionDenied),
//! decided at apply from the replicated state, so every replica decides
//! alike.

use crate::auth::Access;
use crate::command::{Command, Query};
use crate::ids::{Principal, SessionId};
use crate::key_range::KeyRange;
use crate::machine::StateMachine;
use crate::outcome::Reply;
use crate::txn::{Txn, TxnOp};

impl StateMachine {
    /// Whether `principal` may use session `id`: always while authentication
    /// is off; otherwise only its owner (an unknown session is left to
    /// admission, which answers `SessionExpired`).
    pub(super) fn owns_session(&self, id: SessionId, principal: Option<&Principal>) -> bool {
        !self.auth.is_enabled()
            || self
                .sessions
                .get(id)
                .is_none_or(|session| session.owner() == principal)
    }

    /// Whether `principal` may run `command` now (always while
    /// authentication is off): `Err` says what is refused. A session's
    /// ownership is checked separately
    /// ([`Outcome::Unauthorized`](crate::Outcome::Unauthorized)).
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
            Command::AlarmSet { .. } => admin("raising or clearing an alarm"),
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
                            value: Default::default(),
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
    pub(super) fn visible_to(
        &self,
        principal: Option<&Principal>,
        command: &Command,
        reply: Reply,
    ) -> Reply {
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
}

/// A put of `key`, for the permission and visibility rules of puts.
fn put_of(key: &[u8]) -> Command {
    Command::Put {
        key: key.to_vec(),
        value: Default::default(),
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
