//! The recorded client history of a fault run, and its JSON-lines file.
//!
//! A run is written as a stream of [`Event`]s, one JSON object per line,
//! each stamped with `at_ns`, nanoseconds since the run started:
//!
//! * [`Event::RunStarted`]: the seed and the nodes;
//! * [`Event::Invoke`] / [`Event::Complete`]: a client operation ([`Op`])
//!   being issued and the client learning its [`Outcome`] (`Ok` with the
//!   reply, `Failed` for a definite "not applied", or `Unknown`), with the
//!   request's identity ([`RequestIdentity`]) and the attempt count;
//! * [`Event::Response`]: one attempt's answer as seen on the wire (every
//!   retry of a request gets one), including replies the fault proxy dropped
//!   after the server committed them;
//! * [`Event::SessionExpired`]: a client being told its session expired;
//! * [`Event::FaultStarted`] / [`Event::FaultEnded`]: the nemesis at work;
//! * [`Event::LeaderChanged`]: a leader observed;
//! * [`Event::FinalValue`]: a key's value read after the run, for the
//!   checkers that compare final state with the history.
//!
//! [`RecordWriter`] writes events, [`RecordReader`] reads them back with
//! line numbers on every error, and [`Record::from_events`] folds them into
//! the [`Record`] the checkers take: one [`OpRecord`] per operation, fault
//! windows, and so on. An operation still pending when the stream ends has
//! an unknown outcome. Malformed input is a [`RecordError`], never a panic.
//!
//! Byte strings ([`Bytes`]) are written as JSON strings when they are UTF-8
//! and as `{"hex": "..."}` otherwise, so files stay readable.

pub use crate::history::ClientId;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Identifies one operation within a run (unique per record).
pub type OpId = u64;

/// Identifies a cluster node.
pub type NodeId = u64;

/// Identifies one injected fault within a run (unique per record).
pub type FaultId = u64;

/// A byte string: a key, a value, a token or a reply's encoding.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Bytes {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl From<String> for Bytes {
    fn from(text: String) -> Self {
        Self(text.into_bytes())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl From<&[u8]> for Bytes {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl fmt::Display for Bytes {
    /// UTF-8 text as is; anything else as `0x` and hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) => f.write_str(text),
            Err(_) => {
                f.write_str("0x")?;
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) => write!(f, "{text:?}"),
            Err(_) => write!(f, "{self}"),
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
        })
        .collect()
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match std::str::from_utf8(&self.0) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("hex", &to_hex(&self.0))?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;

        impl<'de> Visitor<'de> for BytesVisitor {
            type Value = Bytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a UTF-8 string or {\"hex\": \"<hex digits>\"}")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Bytes, E> {
                Ok(Bytes::from(text))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Bytes, E> {
                Ok(Bytes::from(text))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
                let mut bytes = None;
                while let Some(field) = map.next_key::<String>()? {
                    if field != "hex" {
                        return Err(de::Error::unknown_field(&field, &["hex"]));
                    }
                    if bytes.is_some() {
                        return Err(de::Error::duplicate_field("hex"));
                    }
                    let digits: String = map.next_value()?;
                    let decoded = from_hex(&digits).ok_or_else(|| {
                        de::Error::invalid_value(de::Unexpected::Str(&digits), &"hex digits")
                    })?;
                    bytes = Some(Bytes(decoded));
                }
                bytes.ok_or_else(|| de::Error::missing_field("hex"))
            }
        }

        deserializer.deserialize_any(BytesVisitor)
    }
}

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
    /// Add `by` to the counter at `key`.
    Incr {
        /// The key.
        key: Bytes,
        /// The increment.
        by: i64,
    },
    /// Set `key` to `new` when it holds `expected` (`None`: absent).
    Cas {
        /// The key.
        key: Bytes,
        /// The value it must hold.
        #[serde(default)]
        expected: Option<Bytes>,
        /// The value written.
        new: Bytes,
    },
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// Read `key`.
    Get {
        /// The key.
        key: Bytes,
    },
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

impl Op {
    /// The key the operation touches, if it touches one.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Self::Append { key, .. }
            | Self::Incr { key, .. }
            | Self::Cas { key, .. }
            | Self::Put { key, .. }
            | Self::Get { key } => Some(key),
            Self::LeaseGrant { .. } | Self::LeaseRevoke { .. } => None,
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
            Self::LeaseGrant { .. } => "lease_grant",
            Self::LeaseRevoke { .. } => "lease_revoke",
        }
    }

    /// Whether `reply` is a reply this operation can get.
    pub fn accepts(&self, reply: &Reply) -> bool {
        matches!(
            (self, reply),
            (_, Reply::Rejected { .. })
                | (Self::Append { .. }, Reply::Append { .. })
                | (Self::Incr { .. }, Reply::Incr { .. })
                | (Self::Cas { .. }, Reply::Cas { .. })
                | (Self::Put { .. }, Reply::Put { .. })
                | (Self::Get { .. }, Reply::Get { .. })
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
            Self::LeaseGrant { name, ttl_ms } => write!(f, "lease-grant {name} {ttl_ms}ms"),
            Self::LeaseRevoke { name } => write!(f, "lease-revoke {name}"),
        }
    }
}

/// A command's typed reply, as the state machine produced it. A
/// deterministic refusal ([`Reply::Rejected`]) is a reply too: it is cached
/// and replayed like any other, and it changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// `Put`: the previous value.
    Put {
        /// The value before, if any.
        #[serde(default)]
        previous: Option<Bytes>,
    },
    /// `Get`: the value read.
    Get {
        /// The value, if present.
        #[serde(default)]
        value: Option<Bytes>,
    },
    /// `Append`: the value's length after the append.
    Append {
        /// The new length in bytes.
        length: u64,
    },
    /// `Incr`: the counter's new value.
    Incr {
        /// The new value.
        value: i64,
    },
    /// `Cas`: whether it swapped and the value after it.
    Cas {
        /// Whether the value matched and was replaced.
        swapped: bool,
        /// The value after the operation.
        #[serde(default)]
        current: Option<Bytes>,
    },
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

    fn problem(&self) -> Option<&'static str> {
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
    fn merge(&mut self, other: &RequestIdentity) -> Result<(), &'static str> {
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

/// The run's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Nanoseconds since the run started (normally 0).
    pub at_ns: u64,
    /// The seed that reproduces the run's schedule.
    pub seed: u64,
    /// The cluster's nodes.
    #[serde(default)]
    pub nodes: Vec<NodeId>,
    /// Free text: the workload, the nemesis, the build.
    #[serde(default)]
    pub description: String,
}

/// A client issuing an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    /// When.
    pub at_ns: u64,
    /// Which client.
    pub client: ClientId,
    /// The operation's id in this run.
    pub op_id: OpId,
    /// The request's identity, as far as known at invocation.
    #[serde(default)]
    pub request: RequestIdentity,
    /// What was asked.
    pub op: Op,
}

/// A client learning an operation's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// When.
    pub at_ns: u64,
    /// Which client.
    pub client: ClientId,
    /// The operation.
    pub op_id: OpId,
    /// How many times the request was sent.
    pub attempts: u32,
    /// What the client was told.
    pub outcome: Outcome,
    /// Identity fields learned after invocation (a seq assigned at send,
    /// say); they must agree with the invocation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestIdentity>,
}

/// One attempt's answer, as the client or the fault proxy saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptResponse {
    /// When the answer arrived (or was dropped).
    pub at_ns: u64,
    /// The client the request came from.
    pub client: ClientId,
    /// The operation, when the recorder knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_id: Option<OpId>,
    /// The request's identity.
    #[serde(default)]
    pub request: RequestIdentity,
    /// Which attempt (1-based).
    pub attempt: u32,
    /// The node that answered, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeId>,
    /// The answer.
    pub answer: Answer,
    /// Set by the fault proxy when it dropped this reply after the server
    /// had committed the request: the client never saw it.
    #[serde(default)]
    pub dropped_after_commit: bool,
}

/// A client being told its session expired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryReport {
    /// When.
    pub at_ns: u64,
    /// The client told.
    pub client: ClientId,
    /// The session.
    pub session: u64,
}

/// A fault beginning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultStart {
    /// When.
    pub at_ns: u64,
    /// The fault's id in this run.
    pub fault_id: FaultId,
    /// What kind of fault.
    pub kind: FaultKind,
    /// The node it hit, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<NodeId>,
    /// Free text: the partition's sides, the delay, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A fault ending (healed, resumed, restarted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultEnd {
    /// When.
    pub at_ns: u64,
    /// The fault's id.
    pub fault_id: FaultId,
}

/// A leader observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderChange {
    /// When.
    pub at_ns: u64,
    /// The new leader, if known (`None`: no leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<NodeId>,
    /// Its term, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The client that observed it, if a client did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer: Option<ClientId>,
}

/// A key's value read after the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalValue {
    /// When it was read.
    pub at_ns: u64,
    /// The key.
    pub key: Bytes,
    /// Its value (`None`: absent).
    #[serde(default)]
    pub value: Option<Bytes>,
}

/// One line of a recorded run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run's parameters.
    RunStarted(RunInfo),
    /// An operation issued.
    Invoke(Invocation),
    /// An operation's outcome learned.
    Complete(Completion),
    /// One attempt's answer.
    Response(AttemptResponse),
    /// A session expiry reported to a client.
    SessionExpired(ExpiryReport),
    /// A fault began.
    FaultStarted(FaultStart),
    /// A fault ended.
    FaultEnded(FaultEnd),
    /// A leader observed.
    LeaderChanged(LeaderChange),
    /// A key's final value.
    FinalValue(FinalValue),
}

impl Event {
    /// The event's time stamp.
    pub fn at_ns(&self) -> u64 {
        match self {
            Self::RunStarted(e) => e.at_ns,
            Self::Invoke(e) => e.at_ns,
            Self::Complete(e) => e.at_ns,
            Self::Response(e) => e.at_ns,
            Self::SessionExpired(e) => e.at_ns,
            Self::FaultStarted(e) => e.at_ns,
            Self::FaultEnded(e) => e.at_ns,
            Self::LeaderChanged(e) => e.at_ns,
            Self::FinalValue(e) => e.at_ns,
        }
    }
}

/// Why a record could not be read, written or folded.
#[derive(Debug, Error)]
pub enum RecordError {
    /// A file could not be opened or created.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The underlying failure.
        source: io::Error,
    },
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// A line is not a valid event.
    #[error("line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// An event could not be encoded.
    #[error("encoding an event: {0}")]
    Encode(serde_json::Error),
    /// The events do not form a consistent run.
    #[error("event {index}: {problem}")]
    Inconsistent {
        /// 0-based position of the offending event in the stream.
        index: usize,
        /// What is wrong.
        problem: Inconsistency,
    },
}

/// How a stream of events contradicts itself.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Inconsistency {
    /// Two invocations share an operation id.
    #[error("operation {0} invoked twice")]
    DuplicateOp(OpId),
    /// A completion names no invoked operation.
    #[error("operation {0} completed but never invoked")]
    CompletedNotInvoked(OpId),
    /// Two completions for one operation.
    #[error("operation {0} completed twice")]
    CompletedTwice(OpId),
    /// A completion precedes its invocation.
    #[error("operation {op_id} completed at {complete_ns} before its invocation at {invoke_ns}")]
    CompletedBeforeInvoked {
        /// The operation.
        op_id: OpId,
        /// Its invocation time.
        invoke_ns: u64,
        /// Its completion time.
        complete_ns: u64,
    },
    /// A completion names another client than the invocation.
    #[error(
        "operation {op_id} invoked by client {invoked_by} but completed by client {completed_by}"
    )]
    ClientMismatch {
        /// The operation.
        op_id: OpId,
        /// The invoking client.
        invoked_by: ClientId,
        /// The completing client.
        completed_by: ClientId,
    },
    /// A completion's request identity contradicts the invocation's.
    #[error("operation {op_id}: the completion's {field} differs from the invocation's")]
    RequestMismatch {
        /// The operation.
        op_id: OpId,
        /// The field that differs.
        field: &'static str,
    },
    /// A request identity that makes no sense.
    #[error("request identity with {0}")]
    BadRequestIdentity(&'static str),
    /// An `Ok` outcome whose reply does not answer the operation.
    #[error("operation {op_id}: a {op} cannot reply {reply}")]
    ReplyMismatch {
        /// The operation.
        op_id: OpId,
        /// The operation's kind.
        op: &'static str,
        /// The reply.
        reply: String,
    },
    /// Two faults share an id.
    #[error("fault {0} started twice")]
    DuplicateFault(FaultId),
    /// A fault's end names no started fault, or ends it twice.
    #[error("fault {0} ended but not running")]
    FaultNotRunning(FaultId),
    /// A fault ended before it started.
    #[error("fault {fault_id} ended at {end_ns} before it started at {start_ns}")]
    FaultEndedBeforeStart {
        /// The fault.
        fault_id: FaultId,
        /// Its start.
        start_ns: u64,
        /// Its end.
        end_ns: u64,
    },
    /// Two `RunStarted` events.
    #[error("the run started twice")]
    RunStartedTwice,
    /// Two different final values for one key.
    #[error("two different final values for key {0}")]
    ConflictingFinalValue(Bytes),
}

/// One operation, folded from its invocation and completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Its id.
    pub id: OpId,
    /// The client that issued it.
    pub client: ClientId,
    /// What was asked.
    pub op: Op,
    /// The request's identity.
    pub request: RequestIdentity,
    /// When it was issued.
    pub invoke_ns: u64,
    /// When the client learned the outcome; `None` when the run ended
    /// before it did.
    pub complete_ns: Option<u64>,
    /// How many times the request was sent.
    pub attempts: u32,
    /// What the client was told.
    pub outcome: Outcome,
}

/// An injected fault with its time window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultWindow {
    /// Its id.
    pub id: FaultId,
    /// Its kind.
    pub kind: FaultKind,
    /// The node it hit, if one.
    pub target: Option<NodeId>,
    /// Free text.
    pub detail: Option<String>,
    /// When it began.
    pub start_ns: u64,
    /// When it ended; `None` when still active at the end of the record.
    pub end_ns: Option<u64>,
}

/// A recorded run, folded for the checkers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The run's parameters, if recorded.
    pub run: Option<RunInfo>,
    /// The operations, by invocation time (ties by id).
    pub ops: Vec<OpRecord>,
    /// Every attempt's answer, in stream order.
    pub responses: Vec<AttemptResponse>,
    /// Session expiries reported to clients, in stream order.
    pub expiries: Vec<ExpiryReport>,
    /// Faults, by start time (ties by id).
    pub faults: Vec<FaultWindow>,
    /// Leaders observed, in stream order.
    pub leader_changes: Vec<LeaderChange>,
    /// Final values read after the run, by key.
    pub final_values: BTreeMap<Bytes, Option<Bytes>>,
}

impl Record {
    /// Folds a stream of events into a record, checking that it is
    /// consistent. Operations never completed get an unknown outcome.
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Result<Self, RecordError> {
        let mut record = Record::default();
        let mut ops: BTreeMap<OpId, (OpRecord, bool)> = BTreeMap::new();
        let mut faults: BTreeMap<FaultId, FaultWindow> = BTreeMap::new();
        for (index, event) in events.into_iter().enumerate() {
            let fail = |problem| RecordError::Inconsistent { index, problem };
            match event {
                Event::RunStarted(info) => {
                    if record.run.is_some() {
                        return Err(fail(Inconsistency::RunStartedTwice));
                    }
                    record.run = Some(info);
                }
                Event::Invoke(inv) => {
                    if let Some(problem) = inv.request.problem() {
                        return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                    }
                    let MapEntry::Vacant(slot) = ops.entry(inv.op_id) else {
                        return Err(fail(Inconsistency::DuplicateOp(inv.op_id)));
                    };
                    slot.insert((
                        OpRecord {
                            id: inv.op_id,
                            client: inv.client,
                            op: inv.op,
                            request: inv.request,
                            invoke_ns: inv.at_ns,
                            complete_ns: None,
                            attempts: 0,
                            outcome: Outcome::Unknown {
                                detail: Some("no completion recorded".to_owned()),
                            },
                        },
                        false,
                    ));
                }
                Event::Complete(done) => {
                    let Some((op, completed)) = ops.get_mut(&done.op_id) else {
                        return Err(fail(Inconsistency::CompletedNotInvoked(done.op_id)));
                    };
                    if *completed {
                        return Err(fail(Inconsistency::CompletedTwice(done.op_id)));
                    }
                    if op.client != done.client {
                        return Err(fail(Inconsistency::ClientMismatch {
                            op_id: done.op_id,
                            invoked_by: op.client,
                            completed_by: done.client,
                        }));
                    }
                    if done.at_ns < op.invoke_ns {
                        return Err(fail(Inconsistency::CompletedBeforeInvoked {
                            op_id: done.op_id,
                            invoke_ns: op.invoke_ns,
                            complete_ns: done.at_ns,
                        }));
                    }
                    if let Some(reply) = done.outcome.reply()
                        && !op.op.accepts(reply)
                    {
                        return Err(fail(Inconsistency::ReplyMismatch {
                            op_id: done.op_id,
                            op: op.op.name(),
                            reply: reply.to_string(),
                        }));
                    }
                    if let Some(request) = &done.request {
                        op.request.merge(request).map_err(|field| {
                            fail(Inconsistency::RequestMismatch {
                                op_id: done.op_id,
                                field,
                            })
                        })?;
                        if let Some(problem) = op.request.problem() {
                            return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                        }
                    }
                    op.complete_ns = Some(done.at_ns);
                    op.attempts = done.attempts;
                    op.outcome = done.outcome;
                    *completed = true;
                }
                Event::Response(response) => {
                    if let Some(problem) = response.request.problem() {
                        return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                    }
                    record.responses.push(response);
                }
                Event::SessionExpired(report) => record.expiries.push(report),
                Event::FaultStarted(start) => {
                    let MapEntry::Vacant(slot) = faults.entry(start.fault_id) else {
                        return Err(fail(Inconsistency::DuplicateFault(start.fault_id)));
                    };
                    slot.insert(FaultWindow {
                        id: start.fault_id,
                        kind: start.kind,
                        target: start.target,
                        detail: start.detail,
                        start_ns: start.at_ns,
                        end_ns: None,
                    });
                }
                Event::FaultEnded(end) => {
                    let Some(window) = faults
                        .get_mut(&end.fault_id)
                        .filter(|window| window.end_ns.is_none())
                    else {
                        return Err(fail(Inconsistency::FaultNotRunning(end.fault_id)));
                    };
                    if end.at_ns < window.start_ns {
                        return Err(fail(Inconsistency::FaultEndedBeforeStart {
                            fault_id: end.fault_id,
                            start_ns: window.start_ns,
                            end_ns: end.at_ns,
                        }));
                    }
                    window.end_ns = Some(end.at_ns);
                }
                Event::LeaderChanged(change) => record.leader_changes.push(change),
                Event::FinalValue(fin) => match record.final_values.entry(fin.key) {
                    MapEntry::Vacant(slot) => {
                        slot.insert(fin.value);
                    }
                    MapEntry::Occupied(slot) => {
                        if *slot.get() != fin.value {
                            return Err(fail(Inconsistency::ConflictingFinalValue(
                                slot.key().clone(),
                            )));
                        }
                    }
                },
            }
        }
        record.ops = ops.into_values().map(|(op, _)| op).collect();
        record.ops.sort_by_key(|op| (op.invoke_ns, op.id));
        record.faults = faults.into_values().collect();
        record
            .faults
            .sort_by_key(|fault| (fault.start_ns, fault.id));
        Ok(record)
    }

    /// Unfolds the record into events, grouped by kind (not interleaved
    /// by time); [`Record::from_events`] gives the record back.
    pub fn to_events(&self) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(run) = &self.run {
            events.push(Event::RunStarted(run.clone()));
        }
        for op in &self.ops {
            events.push(Event::Invoke(Invocation {
                at_ns: op.invoke_ns,
                client: op.client,
                op_id: op.id,
                request: op.request.clone(),
                op: op.op.clone(),
            }));
        }
        for op in &self.ops {
            if let Some(at_ns) = op.complete_ns {
                events.push(Event::Complete(Completion {
                    at_ns,
                    client: op.client,
                    op_id: op.id,
                    attempts: op.attempts,
                    outcome: op.outcome.clone(),
                    request: None,
                }));
            }
        }
        events.extend(self.responses.iter().cloned().map(Event::Response));
        events.extend(self.expiries.iter().cloned().map(Event::SessionExpired));
        for fault in &self.faults {
            events.push(Event::FaultStarted(FaultStart {
                at_ns: fault.start_ns,
                fault_id: fault.id,
                kind: fault.kind,
                target: fault.target,
                detail: fault.detail.clone(),
            }));
            if let Some(at_ns) = fault.end_ns {
                events.push(Event::FaultEnded(FaultEnd {
                    at_ns,
                    fault_id: fault.id,
                }));
            }
        }
        events.extend(
            self.leader_changes
                .iter()
                .cloned()
                .map(Event::LeaderChanged),
        );
        let end = self.end_ns();
        for (key, value) in &self.final_values {
            events.push(Event::FinalValue(FinalValue {
                at_ns: end,
                key: key.clone(),
                value: value.clone(),
            }));
        }
        events
    }

    /// Reads and folds a JSON-lines file.
    pub fn load(path: &Path) -> Result<Self, RecordError> {
        let file = File::open(path).map_err(|source| RecordError::File {
            path: path.to_owned(),
            source,
        })?;
        Self::from_events(read_events(BufReader::new(file))?)
    }

    /// Writes the record as a JSON-lines file.
    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        let mut writer = RecordWriter::create(path)?;
        for event in self.to_events() {
            writer.write(&event)?;
        }
        writer.flush()
    }

    /// The seed of the run, if recorded.
    pub fn seed(&self) -> Option<u64> {
        self.run.as_ref().map(|run| run.seed)
    }

    /// The latest time stamp in the record.
    pub fn end_ns(&self) -> u64 {
        let ops = self
            .ops
            .iter()
            .map(|op| op.complete_ns.unwrap_or(op.invoke_ns));
        let responses = self.responses.iter().map(|r| r.at_ns);
        let expiries = self.expiries.iter().map(|e| e.at_ns);
        let faults = self.faults.iter().map(|f| f.end_ns.unwrap_or(f.start_ns));
        let leaders = self.leader_changes.iter().map(|l| l.at_ns);
        ops.chain(responses)
            .chain(expiries)
            .chain(faults)
            .chain(leaders)
            .max()
            .unwrap_or(0)
    }

    /// The operation with id `id`.
    pub fn op(&self, id: OpId) -> Option<&OpRecord> {
        self.ops.iter().find(|op| op.id == id)
    }
}

/// Writes events as JSON lines. Share it between threads behind a lock.
#[derive(Debug)]
pub struct RecordWriter<W: Write> {
    out: W,
}

impl RecordWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self, RecordError> {
        let file = File::create(path).map_err(|source| RecordError::File {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::new(BufWriter::new(file)))
    }
}

impl<W: Write> RecordWriter<W> {
    /// Writes to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// Writes one event as one line.
    pub fn write(&mut self, event: &Event) -> Result<(), RecordError> {
        let mut line = serde_json::to_vec(event).map_err(RecordError::Encode)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        Ok(())
    }

    /// Flushes buffered lines.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        self.out.flush()?;
        Ok(())
    }

    /// Gives the output back (unflushed lines stay in its buffer).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads events from JSON lines, skipping blank lines.
#[derive(Debug)]
pub struct RecordReader<R: BufRead> {
    input: R,
    line: usize,
    buffer: String,
}

impl<R: BufRead> RecordReader<R> {
    /// Reads from `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: 0,
            buffer: String::new(),
        }
    }
}

impl<R: BufRead> Iterator for RecordReader<R> {
    type Item = Result<Event, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buffer.clear();
            self.line += 1;
            match self.input.read_line(&mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                    return Some(Err(RecordError::Parse {
                        line: self.line,
                        source: serde_json::Error::io(err),
                    }));
                }
                Err(err) => return Some(Err(RecordError::Io(err))),
            }
            let text = self.buffer.trim();
            if text.is_empty() {
                continue;
            }
            return Some(
                serde_json::from_str(text).map_err(|source| RecordError::Parse {
                    line: self.line,
                    source,
                }),
            );
        }
    }
}

/// Reads every event of a JSON-lines stream.
pub fn read_events(input: impl BufRead) -> Result<Vec<Event>, RecordError> {
    RecordReader::new(input).collect()
}

/// Writes events as JSON lines.
pub fn write_events<'a>(
    out: impl Write,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<(), RecordError> {
    let mut writer = RecordWriter::new(out);
    for event in events {
        writer.write(event)?;
    }
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_events() -> Vec<Event> {
        vec![
            Event::RunStarted(RunInfo {
                at_ns: 0,
                seed: 42,
                nodes: vec![1, 2, 3],
                description: "append + incr under kill".to_owned(),
            }),
            Event::Invoke(Invocation {
                at_ns: 10,
                client: 1,
                op_id: 1,
                request: RequestIdentity::session(7, 1),
                op: Op::Append {
                    key: "a".into(),
                    token: "t1".into(),
                },
            }),
            Event::Invoke(Invocation {
                at_ns: 11,
                client: 2,
                op_id: 2,
                request: RequestIdentity::idempotent(vec![0xff, 0x00]),
                op: Op::Cas {
                    key: Bytes(vec![0x80]),
                    expected: None,
                    new: "v".into(),
                },
            }),
            Event::FaultStarted(FaultStart {
                at_ns: 12,
                fault_id: 1,
                kind: FaultKind::DropReplies,
                target: Some(2),
                detail: None,
            }),
            Event::Response(AttemptResponse {
                at_ns: 20,
                client: 1,
                op_id: Some(1),
                request: RequestIdentity::session(7, 1),
                attempt: 1,
                node: Some(1),
                answer: Answer::Applied {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                    log_index: Some(9),
                },
                dropped_after_commit: true,
            }),
            Event::Response(AttemptResponse {
                at_ns: 40,
                client: 1,
                op_id: Some(1),
                request: RequestIdentity::session(7, 1),
                attempt: 2,
                node: Some(1),
                answer: Answer::Replayed {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                    applied_index: Some(9),
                },
                dropped_after_commit: false,
            }),
            Event::Complete(Completion {
                at_ns: 41,
                client: 1,
                op_id: 1,
                attempts: 2,
                outcome: Outcome::Ok {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                },
                request: None,
            }),
            Event::FaultEnded(FaultEnd {
                at_ns: 50,
                fault_id: 1,
            }),
            Event::LeaderChanged(LeaderChange {
                at_ns: 55,
                leader: Some(3),
                term: Some(2),
                observer: Some(2),
            }),
            Event::SessionExpired(ExpiryReport {
                at_ns: 60,
                client: 1,
                session: 7,
            }),
            Event::Complete(Completion {
                at_ns: 70,
                client: 2,
                op_id: 2,
                attempts: 3,
                outcome: Outcome::Unknown {
                    detail: Some("deadline".to_owned()),
                },
                request: None,
            }),
            Event::FinalValue(FinalValue {
                at_ns: 100,
                key: "a".into(),
                value: Some("t1;".into()),
            }),
        ]
    }

    #[test]
    fn events_round_trip_through_json_lines() {
        let events = sample_events();
        let mut out = Vec::new();
        write_events(&mut out, &events).expect("write");
        let text = String::from_utf8(out.clone()).expect("utf-8");
        assert_eq!(text.lines().count(), events.len());
        assert!(text.contains(r#"{"hex":"ff00"}"#), "{text}");
        assert!(text.contains(r#""event":"invoke""#), "{text}");
        let back = read_events(out.as_slice()).expect("read");
        assert_eq!(back, events);
    }

    #[test]
    fn record_round_trips_through_events_and_files() {
        let record = Record::from_events(sample_events()).expect("fold");
        assert_eq!(record.seed(), Some(42));
        assert_eq!(record.ops.len(), 2);
        assert_eq!(record.ops[0].attempts, 2);
        assert_eq!(record.faults[0].end_ns, Some(50));
        assert_eq!(record.end_ns(), 70);
        let again = Record::from_events(record.to_events()).expect("refold");
        assert_eq!(again, record);

        let dir = std::env::temp_dir().join(format!("oncekv-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("run.jsonl");
        record.save(&path).expect("save");
        let loaded = Record::load(&path).expect("load");
        assert_eq!(loaded, record);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pending_operations_are_unknown() {
        let events = sample_events().into_iter().take(3).collect::<Vec<_>>();
        let record = Record::from_events(events).expect("fold");
        assert!(
            record
                .ops
                .iter()
                .all(|op| matches!(op.outcome, Outcome::Unknown { .. }) && op.complete_ns.is_none())
        );
    }

    #[test]
    fn malformed_lines_are_errors_with_line_numbers() {
        let input = "\n{\"event\":\"fault_ended\",\"at_ns\":1,\"fault_id\":1}\n{not json\n";
        let err = read_events(input.as_bytes()).expect_err("must fail");
        assert!(matches!(err, RecordError::Parse { line: 3, .. }), "{err}");

        let unknown = r#"{"event":"teleport","at_ns":1}"#;
        assert!(matches!(
            read_events(unknown.as_bytes()),
            Err(RecordError::Parse { line: 1, .. })
        ));
        let bad_hex = r#"{"event":"final_value","at_ns":1,"key":{"hex":"zz"}}"#;
        assert!(read_events(bad_hex.as_bytes()).is_err());
        let not_utf8: &[u8] = b"{\"event\":\"final_value\",\"at_ns\":1,\"key\":\"\xff\"}\n";
        assert!(read_events(not_utf8).is_err());
    }

    #[test]
    fn unknown_fault_kinds_and_reasons_are_kept_as_other() {
        let line = r#"{"event":"fault_started","at_ns":1,"fault_id":1,"kind":"solar_flare"}"#;
        let events = read_events(line.as_bytes()).expect("read");
        assert!(matches!(
            &events[0],
            Event::FaultStarted(FaultStart {
                kind: FaultKind::Other,
                ..
            })
        ));
    }

    #[test]
    fn inconsistent_streams_are_refused() {
        let invoke = |op_id, at_ns| {
            Event::Invoke(Invocation {
                at_ns,
                client: 1,
                op_id,
                request: RequestIdentity::plain(),
                op: Op::Get { key: "k".into() },
            })
        };
        let complete = |op_id, at_ns, outcome| {
            Event::Complete(Completion {
                at_ns,
                client: 1,
                op_id,
                attempts: 1,
                outcome,
                request: None,
            })
        };
        let ok_get = Outcome::Ok {
            reply: Reply::Get { value: None },
            canonical: None,
        };
        let cases = vec![
            (vec![invoke(1, 0), invoke(1, 1)], "invoked twice"),
            (vec![complete(1, 5, ok_get.clone())], "never invoked"),
            (
                vec![invoke(1, 5), complete(1, 4, ok_get.clone())],
                "before its invocation",
            ),
            (
                vec![
                    invoke(1, 0),
                    complete(1, 1, ok_get.clone()),
                    complete(1, 2, ok_get.clone()),
                ],
                "completed twice",
            ),
            (
                vec![
                    invoke(1, 0),
                    complete(
                        1,
                        1,
                        Outcome::Ok {
                            reply: Reply::Incr { value: 1 },
                            canonical: None,
                        },
                    ),
                ],
                "cannot reply",
            ),
            (
                vec![Event::FaultEnded(FaultEnd {
                    at_ns: 1,
                    fault_id: 9,
                })],
                "not running",
            ),
        ];
        for (events, expected) in cases {
            let err = Record::from_events(events).expect_err(expected);
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn completion_fills_in_the_request_identity() {
        let events = vec![
            Event::Invoke(Invocation {
                at_ns: 0,
                client: 1,
                op_id: 1,
                request: RequestIdentity {
                    session: Some(3),
                    ..RequestIdentity::default()
                },
                op: Op::Incr {
                    key: "c".into(),
                    by: 1,
                },
            }),
            Event::Complete(Completion {
                at_ns: 1,
                client: 1,
                op_id: 1,
                attempts: 1,
                outcome: Outcome::Unknown { detail: None },
                request: Some(RequestIdentity::session(3, 5)),
            }),
        ];
        let record = Record::from_events(events.clone()).expect("fold");
        assert_eq!(
            record.ops[0].request.dedup_key(),
            Some(DedupKey::Session { session: 3, seq: 5 })
        );
        let mut conflicting = events;
        if let Event::Complete(done) = &mut conflicting[1] {
            done.request = Some(RequestIdentity::session(4, 5));
        }
        assert!(Record::from_events(conflicting).is_err());
    }

    #[test]
    fn bytes_display_and_hex() {
        assert_eq!(Bytes::from("abc").to_string(), "abc");
        assert_eq!(Bytes(vec![0xff, 1]).to_string(), "0xff01");
        assert_eq!(from_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("+f"), None);
    }
}
