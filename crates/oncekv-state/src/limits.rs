//! [`Limits`]: every bound the state machine enforces. They are a cluster
//! setting: every replica must apply with the same limits, and a snapshot
//! records them so a mismatch is caught on restore.

use crate::command::{Command, Origin, Query, Request};
use crate::key_range::KeyScope;
use crate::quota::UserQuotas;
use crate::refusal::{Malformed, Rejection};
use crate::txn::{Txn, TxnOp, Update};
use serde::{Deserialize, Serialize};

/// The bounds on requests and replicated collections.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest key, in bytes.
    pub key_bytes_max: usize,
    /// Largest value, in bytes (also after an APPEND).
    pub value_bytes_max: usize,
    /// Most keys in the store.
    pub kv_keys_max: u64,
    /// Most bytes of keys and values in the store (the backend quota): a
    /// write that would pass it raises the `NOSPACE` alarm, and while the
    /// alarm is raised writes that grow the store are refused.
    pub store_bytes_max: u64,
    /// Most scan results in one reply.
    pub scan_limit_max: u32,
    /// Most bytes of keys and values in one scan reply (a scan that reaches
    /// it stops with `more = true`; a first entry is always returned).
    pub scan_bytes_max: u64,
    /// Most live sessions; opening one more is refused (`Overloaded`) until
    /// one expires or closes. A live session is never evicted.
    pub sessions_max: u64,
    /// Most bytes of completion records one session may hold before a new
    /// request on it is refused (`Overloaded`) until it acknowledges replies.
    pub session_record_bytes_max: u64,
    /// Most bytes of completion records all sessions hold together.
    pub record_bytes_max: u64,
    /// Largest in-flight window a session may ask for.
    pub window_max: u32,
    /// Shortest session time-to-live.
    pub session_ttl_ms_min: u64,
    /// Longest session time-to-live.
    pub session_ttl_ms_max: u64,
    /// Most idempotency keys kept; a request under a new key is refused
    /// (`Overloaded`) until one expires. A kept key is never evicted.
    pub idempotency_keys_max: u64,
    /// Most bytes of keys and replies kept under idempotency keys.
    pub idempotency_bytes_max: u64,
    /// How long an idempotency key's record is kept, in cluster time.
    pub idempotency_key_ttl_ms: u64,
    /// Most live leases.
    pub leases_max: u64,
    /// Longest lease name, in bytes.
    pub lease_name_bytes_max: usize,
    /// Shortest lease time-to-live.
    pub lease_ttl_ms_min: u64,
    /// Longest lease time-to-live.
    pub lease_ttl_ms_max: u64,
    /// Most changes the history keeps for reads of the past and watches
    /// (the oldest revisions are compacted past it).
    pub history_events_max: u64,
    /// Most bytes of keys and values the history keeps.
    pub history_bytes_max: u64,
    /// Longest time a change stays in the history, in cluster time.
    pub history_retention_ms: u64,
    /// Most compares, and most operations per branch, in a transaction
    /// (a nested one gets what its enclosing one leaves, as in etcd; see
    /// `Txn::check_shape`).
    pub txn_ops_max: u32,
    /// The per-user shares of the session, record and idempotency-key
    /// budgets. Written in snapshots as a field of its own, after the
    /// state (format 6), so earlier formats' limits still decode.
    #[serde(skip)]
    pub quotas: UserQuotas,
}

impl Limits {
    /// Most bytes one transaction's reply holds, as the byte budgets count
    /// them ([`crate::Reply::weight_bytes`]): two scans' worth (4 MiB by
    /// default, the client message size). Derived from `scan_bytes_max`
    /// so that it is the same on every replica and in every snapshot.
    pub fn reply_bytes_max(&self) -> u64 {
        self.scan_bytes_max.saturating_mul(2)
    }
}

/// The most members an alarm may be raised for at once
/// ([`crate::Command::AlarmSet`]): well above any cluster's size, so that
/// the set of alarms, kept in every snapshot, stays small whatever member
/// ids a caller names. The same on every replica, as the log replays it.
pub const ALARMED_MEMBERS_MAX: u64 = 64;

/// The default in-flight window of a session (as RIFL).
pub const WINDOW_DEFAULT: u32 = 128;

impl Default for Limits {
    fn default() -> Self {
        const DAY_MS: u64 = 24 * 60 * 60 * 1000;
        const MIB: u64 = 1024 * 1024;
        Limits {
            key_bytes_max: 4 * 1024,
            value_bytes_max: 1024 * 1024,
            kv_keys_max: 10_000_000,
            store_bytes_max: 512 * MIB,
            scan_limit_max: 1000,
            scan_bytes_max: 2 * MIB,
            sessions_max: 100_000,
            session_record_bytes_max: 8 * MIB,
            record_bytes_max: 128 * MIB,
            window_max: 1024,
            session_ttl_ms_min: 100,
            session_ttl_ms_max: DAY_MS,
            idempotency_keys_max: 1_000_000,
            idempotency_bytes_max: 128 * MIB,
            idempotency_key_ttl_ms: 10 * 60 * 1000,
            leases_max: 100_000,
            lease_name_bytes_max: 256,
            lease_ttl_ms_min: 100,
            lease_ttl_ms_max: DAY_MS,
            history_events_max: 100_000,
            history_bytes_max: 64 * MIB,
            history_retention_ms: 60 * 60 * 1000,
            txn_ops_max: 128,
            quotas: UserQuotas::default(),
        }
    }
}

/// The largest window any configuration may allow.
pub const WINDOW_MAX_ABSOLUTE: u32 = 1024;

/// Why a request is refused before it is proposed: what the state machine
/// would refuse whatever the state, checked on arrival so that a refusal
/// costs no log entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// The request's framing.
    #[error(transparent)]
    Malformed(#[from] Malformed),
    /// The command's sizes or ranges.
    #[error(transparent)]
    Rejected(#[from] Rejection),
}

impl Limits {
    /// The history's bounds.
    pub fn history_bounds(&self) -> crate::history::HistoryBounds {
        crate::history::HistoryBounds {
            events_max: self.history_events_max,
            bytes_max: self.history_bytes_max,
            retention_ms: self.history_retention_ms,
        }
    }

    /// Checks what can be checked without state: the header's framing, the
    /// idempotency key's length, where session control may be sent, key,
    /// value and lease-name sizes, time-to-live and window ranges. The
    /// state machine checks all of it again at apply.
    pub fn check_request(&self, request: &Request) -> Result<(), InvalidRequest> {
        let command = &request.command;
        match &request.origin {
            Origin::Plain => {}
            Origin::Session(header) => {
                if command.is_session_control() {
                    return Err(control_not_allowed(command).into());
                }
                if header.id.seq.0 == 0 {
                    return Err(Malformed::SeqZero.into());
                }
                if header.first_incomplete > header.id.seq {
                    return Err(Malformed::FirstIncompleteAhead {
                        seq: header.id.seq.0,
                        first_incomplete: header.first_incomplete.0,
                    }
                    .into());
                }
            }
            Origin::Key(key) => {
                if !key.is_well_formed() {
                    return Err(Malformed::IdempotencyKeyLength { bytes: key.0.len() }.into());
                }
                if matches!(command, Command::Tick) {
                    return Err(control_not_allowed(command).into());
                }
            }
        }
        self.check_command(command)?;
        Ok(())
    }

    fn check_command(&self, command: &Command) -> Result<(), Rejection> {
        match command {
            Command::OpenSession { ttl_ms, window, .. } => {
                check_ttl(*ttl_ms, self.session_ttl_ms_min, self.session_ttl_ms_max)?;
                let max = self.window_max.min(WINDOW_MAX_ABSOLUTE);
                if !(1..=max).contains(window) {
                    return Err(Rejection::WindowOutOfRange {
                        window: *window,
                        max,
                    });
                }
            }
            Command::Put { key, value, lease } => {
                self.check_key(key)?;
                self.check_value(value.len())?;
                if let Some(name) = lease {
                    self.check_lease_name(name)?;
                }
            }
            Command::Append { key, value } => {
                self.check_key(key)?;
                self.check_value(value.len())?;
            }
            Command::Cas { key, new, .. } => {
                self.check_key(key)?;
                self.check_value(new.len())?;
            }
            Command::Delete { key }
            | Command::Incr { key, .. }
            | Command::Read(Query::Get { key }) => self.check_key(key)?,
            Command::Read(Query::At { query, .. }) => match &**query {
                Query::Get { key } => self.check_key(key)?,
                Query::Scan { .. } | Query::Range { .. } => {}
                _ => return Err(Rejection::NotVersioned),
            },
            Command::Txn(txn) => {
                txn.check_shape(self.txn_ops_max as usize)?;
                self.check_txn_sizes(txn)?;
            }
            Command::LeaseGrant { name, ttl_ms } => {
                self.check_lease_name(name)?;
                check_ttl(*ttl_ms, self.lease_ttl_ms_min, self.lease_ttl_ms_max)?;
            }
            Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::Tick
            | Command::LeaseKeepAlive { .. }
            | Command::LeaseRevoke { .. }
            | Command::Read(
                Query::Scan { .. } | Query::Range { .. } | Query::LeaseList | Query::Auth,
            )
            | Command::AlarmDisarm
            | Command::AlarmSet { .. }
            | Command::Compact { .. } => {}
            Command::Auth(change) => change.check(self.key_bytes_max)?,
        }
        Ok(())
    }

    /// The sizes of a transaction's keys, values and lease names, its
    /// nested transactions' included (their nesting and counts are
    /// [`Txn::check_shape`]'s, checked first, so this recursion is bounded).
    fn check_txn_sizes(&self, txn: &Txn) -> Result<(), Rejection> {
        for compare in &txn.compare {
            if compare.scope == KeyScope::Key {
                self.check_key(&compare.key)?;
            }
        }
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                TxnOp::PutExisting { key, value, lease } => {
                    self.check_key(key)?;
                    if let Update::Set(value) = value {
                        self.check_value(value.len())?;
                    }
                    if let Update::Set(Some(name)) = lease {
                        self.check_lease_name(name)?;
                    }
                }
                TxnOp::Txn(nested) => self.check_txn_sizes(nested)?,
                op => {
                    if let Some(command) = op.as_command() {
                        self.check_command(&command)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A key must be 1..=`key_bytes_max` bytes.
    pub fn check_key(&self, key: &[u8]) -> Result<(), Rejection> {
        let max = self.key_bytes_max;
        if key.is_empty() || key.len() > max {
            return Err(Rejection::KeyLength {
                bytes: key.len(),
                max,
            });
        }
        Ok(())
    }

    /// A value (or an appended result) may hold `value_bytes_max` bytes.
    pub fn check_value(&self, bytes: usize) -> Result<(), Rejection> {
        let max = self.value_bytes_max;
        if bytes > max {
            return Err(Rejection::ValueTooLarge { bytes, max });
        }
        Ok(())
    }

    /// A lease name must be 1..=`lease_name_bytes_max` bytes.
    pub fn check_lease_name(&self, name: &str) -> Result<(), Rejection> {
        let max = self.lease_name_bytes_max;
        if name.is_empty() || name.len() > max {
            return Err(Rejection::LeaseNameLength {
                bytes: name.len(),
                max,
            });
        }
        Ok(())
    }
}

/// A time-to-live must lie within `min_ms..=max_ms`.
pub(crate) fn check_ttl(ttl_ms: u64, min_ms: u64, max_ms: u64) -> Result<(), Rejection> {
    if (min_ms..=max_ms).contains(&ttl_ms) {
        return Ok(());
    }
    Err(Rejection::TtlOutOfRange {
        ttl_ms,
        min_ms,
        max_ms,
    })
}

/// The refusal of a session control command sent on a session or key.
pub(crate) fn control_not_allowed(command: &Command) -> Malformed {
    Malformed::ControlNotAllowed {
        command: command.name().to_string(),
    }
}
