//! What applying a request yields: the [`Outcome`] of deduplication and, when
//! the command ran (or ran before), its [`Reply`]. Deterministic application
//! answers, including refusals ([`Rejection`]), are replies and are cached;
//! session-level refusals are outcomes and are not.

use crate::ids::{ClusterTime, LogIndex, Secret, Seq, SessionId};
use serde::{Deserialize, Serialize};

/// The result of applying one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The command ran now; on a session or key its reply is recorded.
    Applied(Reply),
    /// The command ran before: this is its original reply, first applied at
    /// `applied_index`. Nothing changed.
    Replayed {
        /// The original reply.
        reply: Reply,
        /// Where it was first applied.
        applied_index: LogIndex,
    },
    /// The session is unknown: expired, closed, evicted or never opened.
    SessionExpired,
    /// The secret does not match the session's.
    Unauthorized,
    /// The sequence number is below the acknowledged watermark; its record
    /// was freed.
    Stale {
        /// The session's current watermark.
        floor: Seq,
    },
    /// A record exists for this dedup key, but for a different command.
    RequestMismatch,
    /// The sequence number is beyond the session's in-flight window.
    SequenceGap {
        /// The lowest sequence number not yet executed.
        expected: Seq,
    },
    /// The request's header or origin is not well formed.
    Malformed(Malformed),
    /// A bounded table or budget is full of live entries: not executed, not
    /// recorded, nothing evicted. Retry later (with the same sequence number
    /// or key).
    Overloaded(Overload),
    /// Authentication is enforced and the request's principal may not do
    /// this (a key outside its grants, an admin command, another principal's
    /// session): not executed, not recorded.
    PermissionDenied {
        /// What was refused, in words.
        reason: String,
    },
}

impl Outcome {
    /// The reply, if the command ran now or before.
    pub fn reply(&self) -> Option<&Reply> {
        match self {
            Outcome::Applied(reply) | Outcome::Replayed { reply, .. } => Some(reply),
            _ => None,
        }
    }

    /// A short lowercase name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Applied(_) => "applied",
            Outcome::Replayed { .. } => "replayed",
            Outcome::SessionExpired => "session_expired",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Stale { .. } => "stale",
            Outcome::RequestMismatch => "request_mismatch",
            Outcome::SequenceGap { .. } => "sequence_gap",
            Outcome::Malformed(_) => "malformed",
            Outcome::Overloaded(_) => "overloaded",
            Outcome::PermissionDenied { .. } => "permission_denied",
        }
    }
}

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
            | Overload::NoSpace { max } => max,
        }
    }
}

/// The response of a command that ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A session was opened.
    SessionOpened {
        /// Its id (the index of the opening entry).
        session: SessionId,
        /// Its secret.
        secret: Secret,
        /// Its idle time-to-live.
        ttl_ms: u64,
        /// Its in-flight window.
        window: u32,
    },
    /// A session was kept alive.
    SessionKeptAlive {
        /// Its idle time-to-live.
        ttl_ms: u64,
    },
    /// A session was closed.
    SessionClosed,
    /// Cluster time advanced.
    Ticked,
    /// A key was set.
    Put {
        /// Its value before.
        previous: Option<Vec<u8>>,
    },
    /// A key was read.
    Get {
        /// Its value, if present.
        value: Option<Vec<u8>>,
        /// Its revisions, if present.
        meta: Option<crate::kv::KeyMeta>,
    },
    /// A key was removed.
    Delete {
        /// Its value before.
        previous: Option<Vec<u8>>,
    },
    /// Bytes were appended.
    Append {
        /// The new length of the value in bytes.
        length: u64,
    },
    /// A counter was incremented.
    Incr {
        /// Its new value.
        value: i64,
    },
    /// A compare-and-set ran.
    Cas {
        /// Whether the value matched and was replaced.
        swapped: bool,
        /// The value after the operation.
        current: Option<Vec<u8>>,
    },
    /// A prefix scan.
    Scan {
        /// Matching keys and values, in key order.
        entries: crate::kv::KvPairs,
        /// Whether more matching keys exist beyond the limit.
        more: bool,
    },
    /// A range read.
    Range {
        /// The keys in the range and their values, in key order, within
        /// the limit.
        entries: crate::kv::KvPairs,
        /// Whether more keys are in the range beyond the limit.
        more: bool,
        /// How many keys the range holds in all.
        count: u64,
    },
    /// A lease was granted.
    LeaseGranted {
        /// Its name.
        name: String,
        /// Its time-to-live.
        ttl_ms: u64,
        /// Cluster time at which it expires unless kept alive.
        expires_at: ClusterTime,
    },
    /// A lease was kept alive.
    LeaseKeptAlive {
        /// Its name.
        name: String,
        /// Cluster time at which it now expires.
        expires_at: ClusterTime,
    },
    /// A lease was revoked.
    LeaseRevoked {
        /// Its name.
        name: String,
        /// How many attached keys were deleted.
        keys_deleted: u64,
    },
    /// The live leases, by name.
    Leases {
        /// The leases.
        leases: Vec<LeaseInfo>,
    },
    /// The `NOSPACE` alarm was disarmed.
    AlarmDisarmed {
        /// Whether it was raised.
        was_raised: bool,
    },
    /// Users, roles or enforcement changed.
    AuthChanged,
    /// A transaction ran.
    Txn {
        /// Whether every compare held (so `success` ran, else `failure`).
        succeeded: bool,
        /// One reply per operation of the branch that ran.
        results: Vec<Reply>,
    },
    /// The keys under a prefix were removed (in a transaction).
    DeletePrefix {
        /// How many.
        deleted: u64,
    },
    /// The history was compacted.
    Compacted {
        /// The compacted revision now.
        revision: u64,
    },
    /// Whether authentication is enforced, the users and the roles.
    Auth(crate::auth::AuthView),
    /// A deterministic application-level "no": nothing changed, and the
    /// answer is cached like any other reply.
    Rejected(Rejection),
}

/// What the byte budgets count for a completion record beyond its reply's
/// variable-length contents (its slot, allocation and fields): a fixed
/// allowance, so the count is the same on every replica and platform.
/// Measured by `cargo bench -p oncekv-state --bench memory` (82 bytes of
/// heap for an INCR record; docs/benchmarks.md).
pub const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// What the store's quota counts for a stored key beyond its key, value and
/// lease name (tree node, allocations): measured 174-202 bytes of memory
/// for a 16-byte key and value.
pub const STORE_ENTRY_OVERHEAD_BYTES: u64 = 160;

/// What the idempotency budget counts for a kept key beyond three copies
/// of the key (the table, its age index and the record each hold one) and
/// its record: measured 359-405 bytes for a 16-byte key and an INCR reply.
pub const KEY_ENTRY_OVERHEAD_BYTES: u64 = 256;

impl Reply {
    /// The bytes this reply holds, as the byte budgets count them: its
    /// variable-length contents plus [`ENTRY_OVERHEAD_BYTES`].
    pub fn weight_bytes(&self) -> u64 {
        let len = |bytes: &Option<Vec<u8>>| bytes.as_ref().map_or(0, Vec::len) as u64;
        let contents = match self {
            Reply::Put { previous } | Reply::Delete { previous } => len(previous),
            Reply::Get { value, .. } => len(value) + 24,
            Reply::Cas { current, .. } => len(current),
            Reply::Scan { entries, .. } | Reply::Range { entries, .. } => entries
                .iter()
                .map(|kv| (kv.key.len() + kv.value.len()) as u64 + 40)
                .sum(),
            Reply::Txn { results, .. } => results.iter().map(Reply::weight_bytes).sum(),
            Reply::LeaseGranted { name, .. }
            | Reply::LeaseKeptAlive { name, .. }
            | Reply::LeaseRevoked { name, .. } => name.len() as u64,
            Reply::Leases { leases } => leases.iter().map(|l| l.name.len() as u64 + 32).sum(),
            Reply::Rejected(rejection) => rejection.weight_bytes(),
            Reply::Auth(view) => auth_view_bytes(view),
            Reply::SessionOpened { .. }
            | Reply::SessionKeptAlive { .. }
            | Reply::SessionClosed
            | Reply::Ticked
            | Reply::Append { .. }
            | Reply::Incr { .. }
            | Reply::AlarmDisarmed { .. }
            | Reply::AuthChanged
            | Reply::DeletePrefix { .. }
            | Reply::Compacted { .. } => 0,
        };
        contents.saturating_add(ENTRY_OVERHEAD_BYTES)
    }
}

fn auth_view_bytes(view: &crate::auth::AuthView) -> u64 {
    let users: usize = view
        .users
        .iter()
        .map(|u| u.name.len() + u.roles.iter().map(String::len).sum::<usize>() + 16)
        .sum();
    let roles: usize = view
        .roles
        .iter()
        .map(|(name, permissions)| {
            name.len() + permissions.iter().map(|p| p.key.len() + 16).sum::<usize>()
        })
        .sum();
    (users + roles) as u64
}

/// A lease as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// Its name.
    pub name: String,
    /// Its time-to-live.
    pub ttl_ms: u64,
    /// Cluster time at which it expires unless kept alive.
    pub expires_at: ClusterTime,
    /// How many keys are attached.
    pub keys: u64,
}

impl Rejection {
    fn weight_bytes(&self) -> u64 {
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
}
