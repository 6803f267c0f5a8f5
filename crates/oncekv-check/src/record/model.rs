//! What a history says about an operation: the [`Op`] a client asked for,
//! the [`Reply`] it got, its final [`Outcome`] (and [`FailReason`]), how
//! the request identifies itself to deduplication ([`RequestIdentity`],
//! [`DedupKey`]), the [`FaultKind`]s injected and each attempt's wire
//! [`Answer`]. The variants [`Op`] and [`Reply`] share with a
//! transaction's operations and results are declared in `key_variants`.

use super::key_variants::{key_operation_enum, key_result_enum};
use super::*;

key_operation_enum! {
    /// What a client asked for.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Op {
        /// Append `token` and the workload's delimiter to `key`.
        Append {
            /// The key.
            key: Bytes,
            /// The unique token, without its delimiter.
            token: Bytes,
        },
        /// An atomic transaction over several keys.
        Txn(Txn),
        /// Create the lease `name`.
        LeaseGrant {
            /// The lease's name.
            name: String,
            /// Its time-to-live.
            ttl_ms: u64,
        },
        /// End the lease `name`.
        LeaseRevoke {
            /// The lease's name.
            name: String,
        },
    }
}

impl Op {
    /// The key the operation touches, if it touches one.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Self::Append { key, .. }
            | Self::Incr { key, .. }
            | Self::Cas { key, .. }
            | Self::Put { key, .. }
            | Self::Get { key }
            | Self::Delete { key } => Some(key),
            // A transaction touches many keys; the KV checker reads them
            // from its compares and operations.
            Self::Txn(_) | Self::LeaseGrant { .. } | Self::LeaseRevoke { .. } => None,
        }
    }

    /// A short lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Append { .. } => "append",
            Self::Incr { .. } => "incr",
            Self::Cas { .. } => "cas",
            Self::Put { .. } => "put",
            Self::Get { .. } => "get",
            Self::Delete { .. } => "delete",
            Self::Txn(_) => "txn",
            Self::LeaseGrant { .. } => "lease_grant",
            Self::LeaseRevoke { .. } => "lease_revoke",
        }
    }

    /// Whether `reply` is a reply this operation can get.
    pub fn accepts(&self, reply: &Reply) -> bool {
        if let (Self::Txn(txn), Reply::Txn { succeeded, results }) = (self, reply) {
            let branch = txn.branch(*succeeded);
            return branch.len() == results.len()
                && branch
                    .iter()
                    .zip(results)
                    .all(|(op, result)| op.accepts(result));
        }
        matches!(
            (self, reply),
            (_, Reply::Rejected { .. })
                | (Self::Append { .. }, Reply::Append { .. })
                | (Self::Incr { .. }, Reply::Incr { .. })
                | (Self::Cas { .. }, Reply::Cas { .. })
                | (Self::Put { .. }, Reply::Put { .. })
                | (Self::Get { .. }, Reply::Get { .. })
                | (Self::Delete { .. }, Reply::Delete { .. })
                | (Self::LeaseGrant { .. }, Reply::LeaseGranted { .. })
                | (Self::LeaseRevoke { .. }, Reply::LeaseRevoked { .. })
        )
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Append { key, token } => write!(f, "append {key} {token}"),
            Self::Incr { key, by } => write!(f, "incr {key} {by}"),
            Self::Cas { key, expected, new } => match expected {
                Some(expected) => write!(f, "cas {key} {expected} -> {new}"),
                None => write!(f, "cas {key} absent -> {new}"),
            },
            Self::Put { key, value } => write!(f, "put {key} {value}"),
            Self::Get { key } => write!(f, "get {key}"),
            Self::Delete { key } => write!(f, "delete {key}"),
            Self::Txn(txn) => write!(f, "{txn}"),
            Self::LeaseGrant { name, ttl_ms } => write!(f, "lease-grant {name} {ttl_ms}ms"),
            Self::LeaseRevoke { name } => write!(f, "lease-revoke {name}"),
        }
    }
}

key_result_enum! {
    /// A command's typed reply, as the state machine produced it. A
    /// deterministic refusal ([`Reply::Rejected`]) is a reply too: it is
    /// cached and replayed like any other, and it changed nothing.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum Reply {
        /// `LeaseGrant`: the lease granted.
        LeaseGranted {
            /// Its name.
            name: String,
            /// Its time-to-live.
            ttl_ms: u64,
            /// Cluster time (ms) at which it expires unless kept alive.
            expires_at_ms: u64,
        },
        /// `LeaseRevoke`: the lease revoked.
        LeaseRevoked {
            /// Its name.
            name: String,
            /// How many attached keys were deleted.
            keys_deleted: u64,
        },
        /// A deterministic application-level "no" (`LeaseExists`, INCR on a
        /// non-integer, a value over the limit, ...): nothing changed.
        Rejected {
            /// The refusal, as the client library names it.
            reason: String,
        },
    }
}

impl Reply {
    /// Whether this is a deterministic refusal, which changed nothing.
    pub fn is_rejection(&self) -> bool {
        matches!(self, Self::Rejected { .. })
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |value: &Option<Bytes>| {
            value
                .as_ref()
                .map_or_else(|| "absent".to_owned(), ToString::to_string)
        };
        match self {
            Self::Put { previous } => write!(f, "put (previous {})", opt(previous)),
            Self::Get { value } => write!(f, "value {}", opt(value)),
            Self::Delete { previous } => write!(f, "deleted (previous {})", opt(previous)),
            Self::Txn { succeeded, results } => {
                let branch = if *succeeded { "succeeded" } else { "failed" };
                write!(f, "txn {branch} ({} results)", results.len())
            }
            Self::Append { length } => write!(f, "length {length}"),
            Self::Incr { value } => write!(f, "value {value}"),
            Self::Cas { swapped, current } => {
                let verb = if *swapped { "swapped" } else { "not swapped" };
                write!(f, "{verb} (now {})", opt(current))
            }
            Self::LeaseGranted {
                name,
                ttl_ms,
                expires_at_ms,
            } => write!(
                f,
                "lease {name} granted ({ttl_ms}ms, expires at {expires_at_ms})"
            ),
            Self::LeaseRevoked { name, keys_deleted } => {
                write!(f, "lease {name} revoked ({keys_deleted} keys deleted)")
            }
            Self::Rejected { reason } => write!(f, "rejected: {reason}"),
        }
    }
}

/// Why a request definitely did not apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// The session was unknown, expired, closed or evicted.
    SessionExpired,
    /// The session secret was wrong.
    Unauthorized,
    /// The sequence number was below the acknowledged watermark.
    Stale,
    /// The sequence number was beyond the session's window.
    SequenceGap,
    /// The dedup key was used before for another command.
    RequestMismatch,
    /// The request's framing was refused.
    Malformed,
    /// The request was refused before it was proposed.
    Invalid,
    /// No node was reachable before anything was sent.
    Unreachable,
    /// A full table or budget refused it (not executed, not recorded).
    Overloaded,
    /// A node that is not the leader refused it without proposing it.
    NotLeader,
    /// Authentication is enforced and the caller named no valid user, or
    /// its user may not do this.
    PermissionDenied,
    /// Any other definite refusal.
    #[serde(other)]
    Other,
}

impl FailReason {
    /// The snake_case name used in files.
    pub fn name(self) -> &'static str {
        match self {
            Self::SessionExpired => "session_expired",
            Self::Unauthorized => "unauthorized",
            Self::Stale => "stale",
            Self::SequenceGap => "sequence_gap",
            Self::RequestMismatch => "request_mismatch",
            Self::Malformed => "malformed",
            Self::Invalid => "invalid",
            Self::Unreachable => "unreachable",
            Self::Overloaded => "overloaded",
            Self::NotLeader => "not_leader",
            Self::PermissionDenied => "permission_denied",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the client was finally told about an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// A reply: the command ran (now or before, for a retry).
    Ok {
        /// The reply.
        reply: Reply,
        /// The reply's canonical encoding, when the recorder has it; two
        /// answers to one request must then be byte-identical.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        canonical: Option<Bytes>,
    },
    /// Definitely not applied.
    Failed {
        /// Why.
        reason: FailReason,
        /// The client's message, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// May or may not have applied, and may still apply.
    Unknown {
        /// The client's message, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
}

impl Outcome {
    /// The reply of an `Ok` outcome.
    pub fn reply(&self) -> Option<&Reply> {
        match self {
            Self::Ok { reply, .. } => Some(reply),
            _ => None,
        }
    }

    /// The class of the outcome, for counting.
    pub fn class(&self) -> OutcomeClass {
        match self {
            Self::Ok {
                reply: Reply::Rejected { .. },
                ..
            } => OutcomeClass::Rejected,
            Self::Ok { .. } => OutcomeClass::Ok,
            Self::Failed { .. } => OutcomeClass::Failed,
            Self::Unknown { .. } => OutcomeClass::Unknown,
        }
    }

    /// Whether the command definitely changed nothing: a definite failure
    /// or a deterministic rejection.
    pub fn definitely_not_applied(&self) -> bool {
        matches!(self.class(), OutcomeClass::Failed | OutcomeClass::Rejected)
    }
}

/// Outcomes grouped for counting and colouring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Applied, with a reply.
    Ok,
    /// Applied as a deterministic "no": changed nothing.
    Rejected,
    /// Definitely not applied.
    Failed,
    /// Not known.
    Unknown,
}

impl OutcomeClass {
    /// Every class, in display order.
    pub const ALL: [OutcomeClass; 4] = [Self::Ok, Self::Rejected, Self::Failed, Self::Unknown];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for OutcomeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a request identifies itself to the deduplication layer. A session
/// request has `session` and `seq`; a one-shot request an
/// `idempotency_key`; a plain request none of them. `session` without
/// `seq` is a session request not yet numbered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestIdentity {
    /// The session's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    /// The request's sequence number in the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The request's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<Bytes>,
}

impl RequestIdentity {
    /// A session request.
    pub fn session(session: u64, seq: u64) -> Self {
        Self {
            session: Some(session),
            seq: Some(seq),
            idempotency_key: None,
        }
    }

    /// A one-shot request under an idempotency key.
    pub fn idempotent(key: impl Into<Bytes>) -> Self {
        Self {
            session: None,
            seq: None,
            idempotency_key: Some(key.into()),
        }
    }

    /// A plain request, deduplicated by nothing.
    pub fn plain() -> Self {
        Self::default()
    }

    /// The key the state machine deduplicates this request by, if any.
    pub fn dedup_key(&self) -> Option<DedupKey> {
        match (self.session, self.seq, &self.idempotency_key) {
            (Some(session), Some(seq), None) => Some(DedupKey::Session { session, seq }),
            (None, None, Some(key)) => Some(DedupKey::Idempotency(key.clone())),
            _ => None,
        }
    }

    pub(super) fn problem(&self) -> Option<&'static str> {
        if self.seq.is_some() && self.session.is_none() {
            return Some("a seq without a session");
        }
        if self.idempotency_key.is_some() && (self.session.is_some() || self.seq.is_some()) {
            return Some("both a session and an idempotency key");
        }
        None
    }

    /// Fills the fields `self` lacks from `other`; `Err` names a field on
    /// which both are set and differ.
    pub(super) fn merge(&mut self, other: &RequestIdentity) -> Result<(), &'static str> {
        fn merge_field<T: Clone + PartialEq>(
            mine: &mut Option<T>,
            theirs: &Option<T>,
            name: &'static str,
        ) -> Result<(), &'static str> {
            match (mine.as_ref(), theirs) {
                (Some(a), Some(b)) if a != b => Err(name),
                (None, Some(b)) => {
                    *mine = Some(b.clone());
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        merge_field(&mut self.session, &other.session, "session")?;
        merge_field(&mut self.seq, &other.seq, "seq")?;
        merge_field(
            &mut self.idempotency_key,
            &other.idempotency_key,
            "idempotency_key",
        )
    }
}

impl fmt::Display for RequestIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dedup_key() {
            Some(key) => write!(f, "{key}"),
            None => match self.session {
                Some(session) => write!(f, "session {session} (unnumbered)"),
                None => f.write_str("plain"),
            },
        }
    }
}

/// The state machine's dedup key of a request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DedupKey {
    /// `RequestId{session, seq}`.
    Session {
        /// The session.
        session: u64,
        /// The sequence number.
        seq: u64,
    },
    /// An idempotency key.
    Idempotency(Bytes),
}

impl fmt::Display for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session { session, seq } => write!(f, "request {session}:{seq}"),
            Self::Idempotency(key) => write!(f, "idempotency key {key}"),
        }
    }
}

/// The kind of an injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// A node killed (SIGKILL).
    Kill,
    /// A node paused (SIGSTOP until SIGCONT).
    Pause,
    /// A node restarted.
    Restart,
    /// A node cut off from its peers.
    Partition,
    /// Replies dropped by the proxy after the server committed.
    DropReplies,
    /// Messages delayed.
    Delay,
    /// Leadership moved on purpose.
    LeaderTransfer,
    /// Client connections reset by the proxy.
    Reset,
    /// Disk syncs made to fail on a node.
    FsyncFailure,
    /// Network links failing at random, breaking connections.
    MessageLoss,
    /// Sessions and idempotency keys flooded in, outside the history.
    Flood,
    /// Any other fault.
    #[serde(other)]
    Other,
}

impl FaultKind {
    /// The snake_case name used in files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Restart => "restart",
            Self::Partition => "partition",
            Self::DropReplies => "drop_replies",
            Self::Delay => "delay",
            Self::LeaderTransfer => "leader_transfer",
            Self::Reset => "reset",
            Self::FsyncFailure => "fsync_failure",
            Self::MessageLoss => "message_loss",
            Self::Flood => "flood",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one attempt of a request got back on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Answer {
    /// The command ran on this attempt's entry (or, for a retry that met
    /// its request still in flight on the leader, on that entry).
    Applied {
        /// Its reply.
        reply: Reply,
        /// The reply's canonical encoding, if recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        canonical: Option<Bytes>,
        /// The log index of the entry that ran it, if reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log_index: Option<u64>,
    },
    /// The command had run before; this is the original reply.
    Replayed {
        /// The original reply.
        reply: Reply,
        /// Its canonical encoding, if recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        canonical: Option<Bytes>,
        /// The log index it was first applied at, if reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        applied_index: Option<u64>,
    },
    /// A definite refusal: not applied on this attempt.
    Refused {
        /// Why.
        reason: FailReason,
    },
    /// A transient error (not leader, timeout, unavailable, ...): says
    /// nothing about whether the command ran.
    Transient {
        /// The error.
        detail: String,
    },
}

impl Answer {
    /// The reply and its canonical bytes, for `Applied` and `Replayed`.
    pub fn reply(&self) -> Option<(&Reply, Option<&Bytes>)> {
        match self {
            Self::Applied {
                reply, canonical, ..
            }
            | Self::Replayed {
                reply, canonical, ..
            } => Some((reply, canonical.as_ref())),
            _ => None,
        }
    }

    /// The log index the command ran at, when reported: an `Applied`
    /// answer's entry or a `Replayed` answer's original entry.
    pub fn applied_index(&self) -> Option<u64> {
        match self {
            Self::Applied { log_index, .. } => *log_index,
            Self::Replayed { applied_index, .. } => *applied_index,
            _ => None,
        }
    }
}
