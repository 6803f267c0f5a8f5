//! What applying a request yields: the [`Outcome`] of deduplication and, when
//! the command ran (or ran before), its [`Reply`]. Deterministic application
//! answers, including refusals ([`Rejection`]), are replies and are cached;
//! session-level refusals are outcomes and are not.

use crate::auth::AuthView;
use crate::ids::{ClusterTime, LogIndex, Secret, Seq, SessionId};
use crate::kv::KvPairs;
use crate::overhead::ENTRY_OVERHEAD_BYTES;
use crate::refusal::{Malformed, Overload, Rejection};
use crate::value::KeyMeta;
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
        meta: Option<KeyMeta>,
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
        entries: KvPairs,
        /// Whether more matching keys exist beyond the limit.
        more: bool,
    },
    /// A range read.
    Range {
        /// The keys in the range and their values, in key order, within
        /// the limit.
        entries: KvPairs,
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
    Auth(AuthView),
    /// A deterministic application-level "no": nothing changed, and the
    /// answer is cached like any other reply.
    Rejected(Rejection),
    /// A user's sessions were closed and its idempotency keys forgotten
    /// (the last variant: postcard numbers every earlier one as before).
    UserPurged {
        /// How many sessions were closed.
        sessions: u64,
        /// How many idempotency keys were forgotten.
        keys: u64,
    },
    /// A member's `NOSPACE` alarm was raised or cleared by hand
    /// ([`Command::AlarmSet`](crate::Command::AlarmSet)).
    AlarmSet {
        /// Whether that changed it (raising a raised one, or clearing one
        /// that was not, does not; clearing the quota's alarm does).
        changed: bool,
    },
}

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
            | Reply::AlarmSet { .. }
            | Reply::AuthChanged
            | Reply::UserPurged { .. }
            | Reply::DeletePrefix { .. }
            | Reply::Compacted { .. } => 0,
        };
        contents.saturating_add(ENTRY_OVERHEAD_BYTES)
    }
}

fn auth_view_bytes(view: &AuthView) -> u64 {
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
