//! Refusals, each decided from replicated state so every replica refuses
//! alike: a command's deterministic [`Rejection`] (a reply, cached like any
//! other), and the outcomes that leave a request unexecuted and unrecorded:
//! its framing [`Malformed`], or a bounded table or budget full
//! ([`Overload`]).

use serde::{Deserialize, Serialize};

/// Why a request's framing is refused (never cached, never executed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Malformed {
    /// Sequence numbers start at 1.
    #[error("sequence number 0 is not valid; sequence numbers start at 1")]
    SeqZero,
    /// The acknowledged watermark may not exceed the request's own seq.
    #[error("first_incomplete {first_incomplete} exceeds the request's own seq {seq}")]
    FirstIncompleteAhead {
        /// The request's seq.
        seq: u64,
        /// The watermark it carried.
        first_incomplete: u64,
    },
    /// Idempotency keys are 1..=128 bytes.
    #[error("idempotency key must be 1..=128 bytes, got {bytes}")]
    IdempotencyKeyLength {
        /// The key's length.
        bytes: usize,
    },
    /// Session control commands are not sent on a session or under a key.
    #[error("{command} cannot be sent on a session or under an idempotency key")]
    ControlNotAllowed {
        /// The command's name.
        command: String,
    },
}

/// Which bound refused a request (never cached, never executed; retry
/// later). Decided from replicated state, so every replica refuses alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Overload {
    /// The session table is full of live sessions.
    #[error("too many live sessions ({max}); retry when one expires or closes")]
    Sessions {
        /// The limit.
        max: u64,
    },
    /// The idempotency key table is full of unexpired keys.
    #[error("too many idempotency keys kept ({max}); retry when one expires")]
    IdempotencyKeys {
        /// The limit.
        max: u64,
    },
    /// Replies kept under idempotency keys fill their byte budget.
    #[error("idempotency records fill their budget of {max} bytes; retry when one expires")]
    IdempotencyBytes {
        /// The budget.
        max: u64,
    },
    /// This session's unacknowledged completion records fill its budget.
    #[error(
        "this session's completion records fill its budget of {max} bytes; \
         acknowledge replies (complete lower sequence numbers) to free them"
    )]
    SessionRecordBytes {
        /// The budget.
        max: u64,
    },
    /// Completion records of all sessions fill their budget.
    #[error("completion records of all sessions fill their budget of {max} bytes")]
    RecordBytes {
        /// The budget.
        max: u64,
    },
    /// The store is over its byte quota: the `NOSPACE` alarm is raised.
    #[error(
        "no space: the store would pass its quota of {max} bytes (alarm NOSPACE); \
         delete keys, then disarm the alarm"
    )]
    NoSpace {
        /// The quota.
        max: u64,
    },
    /// This user holds its share of the live sessions.
    #[error("this user holds its share of live sessions ({max}); close one or let one expire")]
    UserSessions {
        /// The share.
        max: u64,
    },
    /// This user's sessions' completion records fill its share.
    #[error(
        "this user's completion records fill its share of {max} bytes; \
         acknowledge replies or close sessions to free them"
    )]
    UserRecordBytes {
        /// The share.
        max: u64,
    },
    /// This user holds its share of the kept idempotency keys.
    #[error("this user holds its share of idempotency keys ({max}); retry when one expires")]
    UserIdempotencyKeys {
        /// The share.
        max: u64,
    },
    /// Replies kept under this user's idempotency keys fill its share.
    #[error(
        "this user's idempotency records fill its share of {max} bytes; retry when one expires"
    )]
    UserIdempotencyBytes {
        /// The share.
        max: u64,
    },
}

impl Overload {
    /// A short lowercase name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Overload::Sessions { .. } => "sessions",
            Overload::IdempotencyKeys { .. } => "idempotency_keys",
            Overload::IdempotencyBytes { .. } => "idempotency_bytes",
            Overload::SessionRecordBytes { .. } => "session_record_bytes",
            Overload::RecordBytes { .. } => "record_bytes",
            Overload::NoSpace { .. } => "no_space",
            Overload::UserSessions { .. } => "user_sessions",
            Overload::UserRecordBytes { .. } => "user_record_bytes",
            Overload::UserIdempotencyKeys { .. } => "user_idempotency_keys",
            Overload::UserIdempotencyBytes { .. } => "user_idempotency_bytes",
        }
    }

    /// The limit that was reached.
    pub fn max(&self) -> u64 {
        match *self {
            Overload::Sessions { max }
            | Overload::IdempotencyKeys { max }
            | Overload::IdempotencyBytes { max }
            | Overload::SessionRecordBytes { max }
            | Overload::RecordBytes { max }
            | Overload::NoSpace { max }
            | Overload::UserSessions { max }
            | Overload::UserRecordBytes { max }
            | Overload::UserIdempotencyKeys { max }
            | Overload::UserIdempotencyBytes { max } => max,
        }
    }
}

/// A deterministic refusal of a command, decided from replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    /// The stored value is not a decimal `i64`.
    #[error("the value is not a decimal integer")]
    NotAnInteger,
    /// The increment would overflow `i64`.
    #[error("the increment overflows a 64-bit integer")]
    Overflow,
    /// A lease of that name exists.
    #[error("lease {name:?} already exists")]
    LeaseExists {
        /// The name.
        name: String,
    },
    /// No lease of that name exists.
    #[error("lease {name:?} not found")]
    LeaseNotFound {
        /// The name.
        name: String,
    },
    /// A key is empty or longer than allowed.
    #[error("key must be 1..={max} bytes, got {bytes}")]
    KeyLength {
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A value (or an appended result) is larger than allowed.
    #[error("value of {bytes} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A lease name is empty or longer than allowed.
    #[error("lease name must be 1..={max} bytes, got {bytes}")]
    LeaseNameLength {
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A time-to-live outside the allowed range.
    #[error("ttl of {ttl_ms} ms is outside {min_ms}..={max_ms} ms")]
    TtlOutOfRange {
        /// The requested ttl.
        ttl_ms: u64,
        /// The smallest allowed.
        min_ms: u64,
        /// The largest allowed.
        max_ms: u64,
    },
    /// A session window outside `1..=max`.
    #[error("window {window} is outside 1..={max}")]
    WindowOutOfRange {
        /// The requested window.
        window: u32,
        /// The largest allowed.
        max: u32,
    },
    /// The store holds its maximum number of keys.
    #[error("the store is full ({max} keys)")]
    TooManyKeys {
        /// The limit.
        max: u64,
    },
    /// The maximum number of leases exist.
    #[error("too many leases ({max})")]
    TooManyLeases {
        /// The limit.
        max: u64,
    },
    /// A user of that name exists.
    #[error("user {name:?} already exists")]
    UserExists {
        /// The name.
        name: String,
    },
    /// No user of that name exists.
    #[error("user {name:?} not found")]
    UserNotFound {
        /// The name.
        name: String,
    },
    /// A role of that name exists (`admin` is built in).
    #[error("role {name:?} already exists")]
    RoleExists {
        /// The name.
        name: String,
    },
    /// No role of that name exists (or the user does not hold it).
    #[error("role {name:?} not found")]
    RoleNotFound {
        /// The name.
        name: String,
    },
    /// Authentication cannot be enforced without a user holding `admin`,
    /// and while enforced the last such user cannot lose it.
    #[error(
        "no user would hold the admin role: add one (user add, user grant-role NAME admin) first"
    )]
    NoAdmin,
    /// The built-in `admin` role allows everything and cannot change.
    #[error("the admin role is built in: it allows everything and cannot be changed or deleted")]
    BuiltInRole,
    /// The role grants nothing on that key or prefix.
    #[error("the role has no permission on that key or prefix")]
    PermissionNotFound,
    /// The maximum number of users exist.
    #[error("too many users ({max})")]
    TooManyUsers {
        /// The limit.
        max: u64,
    },
    /// The maximum number of roles exist (or a user holds its maximum).
    #[error("too many roles ({max})")]
    TooManyRoles {
        /// The limit.
        max: u64,
    },
    /// A role grants its maximum number of permissions.
    #[error("too many permissions in the role ({max})")]
    TooManyPermissions {
        /// The limit.
        max: u64,
    },
    /// Users and roles would hold more bytes than their budget.
    #[error("users and roles would hold more than {max} bytes")]
    AuthBytes {
        /// The budget.
        max: u64,
    },
    /// A malformed name, password hash or permission.
    #[error("{reason}")]
    InvalidAuth {
        /// What is wrong.
        reason: String,
    },
    /// The history no longer reaches back to that revision.
    #[error("revision {revision} is compacted (history starts after revision {compacted})")]
    Compacted {
        /// The revision asked for.
        revision: u64,
        /// The compacted revision.
        compacted: u64,
    },
    /// The revision is beyond the last applied one.
    #[error("revision {revision} is in the future (the store is at {current})")]
    FutureRevision {
        /// The revision asked for.
        revision: u64,
        /// The last applied index.
        current: u64,
    },
    /// Only a get or a scan can read a past revision.
    #[error("only a get or a scan can read a past revision")]
    NotVersioned,
    /// A transaction has more compares or operations than allowed.
    #[error("a transaction may hold {max} compares and {max} operations per branch, got {ops}")]
    TxnTooLarge {
        /// The count found.
        ops: u64,
        /// The limit.
        max: u64,
    },
    /// A transaction branch writes a key twice (or under a prefix or in a
    /// range it deletes).
    #[error("a transaction writes key {key:?} twice, or under a prefix or in a range it deletes")]
    TxnConflict {
        /// The key (lossy UTF-8).
        key: String,
    },
    /// An update of a key that must exist found it absent.
    #[error("key {key:?} not found")]
    KeyNotFound {
        /// The key (lossy UTF-8).
        key: String,
    },
    /// A transaction with the transactions nested in it has more levels,
    /// or more compares and operations in all, than allowed.
    #[error(
        "a transaction with those nested in it may have {depth_max} levels and {ops_max} compares and operations in all, got {depth} and {ops}"
    )]
    TxnTreeTooLarge {
        /// Its levels (1: no nested transaction).
        depth: u64,
        /// Its compares and operations, nested ones included.
        ops: u64,
        /// The most levels allowed.
        depth_max: u64,
        /// The most compares and operations allowed in all.
        ops_max: u64,
    },
    /// A transaction's reply would hold more than a reply may (its reads,
    /// scans and previous values together, as the byte budgets count
    /// them); nothing it did is kept.
    #[error(
        "a transaction's reply may hold {max} bytes, this one reached {bytes}: read less in one transaction"
    )]
    ReplyTooLarge {
        /// The bytes counted when the bound was passed.
        bytes: u64,
        /// The bound ([`crate::Limits::reply_bytes_max`]).
        max: u64,
    },
    /// Raising an alarm for one more member would pass the number of
    /// members an alarm may be raised for at once.
    #[error("alarms are raised for {max} members already: clear one first")]
    TooManyAlarms {
        /// The bound ([`crate::ALARMED_MEMBERS_MAX`]).
        max: u64,
    },
}

impl Rejection {
    pub(crate) fn weight_bytes(&self) -> u64 {
        match self {
            Rejection::LeaseExists { name }
            | Rejection::LeaseNotFound { name }
            | Rejection::UserExists { name }
            | Rejection::UserNotFound { name }
            | Rejection::RoleExists { name }
            | Rejection::RoleNotFound { name } => name.len() as u64,
            Rejection::InvalidAuth { reason } => reason.len() as u64,
            Rejection::TxnConflict { key } | Rejection::KeyNotFound { key } => key.len() as u64,
            _ => 0,
        }
    }
}
