//! Identifiers and scalar values shared by every part of the state machine:
//! log positions, cluster time, session ids, sequence numbers, secrets and
//! idempotency keys.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Position of an entry in the replicated log (1-based; 0 means "none yet").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct LogIndex(pub u64);

/// Milliseconds of cluster time: the leader's monotonic clock, carried in
/// every entry, never decreasing from one applied entry to the next.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ClusterTime(pub u64);

impl ClusterTime {
    /// This time plus `ms` milliseconds, saturating.
    pub fn plus_ms(self, ms: u64) -> ClusterTime {
        ClusterTime(self.0.saturating_add(ms))
    }
}

/// A session's id: the log index of the entry that opened it, so ids are
/// unique and never reused.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct SessionId(pub u64);

/// A request's sequence number within its session, starting at 1.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Seq(pub u64);

impl Seq {
    /// The next sequence number, saturating.
    pub fn next(self) -> Seq {
        Seq(self.0.saturating_add(1))
    }
}

/// The dedup key of a request on a session, and nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId {
    /// The session the request belongs to.
    pub session: SessionId,
    /// Its sequence number in that session.
    pub seq: Seq,
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.session.0, self.seq.0)
    }
}

/// The 128-bit secret drawn by the leader when a session opens; every request
/// on the session must present it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Secret(pub u128);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// What the session table keeps instead of the secret: its SHA-256, so a
    /// snapshot does not hand out live secrets.
    pub fn hash(&self) -> SecretHash {
        use sha2::Digest as _;
        SecretHash(sha2::Sha256::digest(self.0.to_be_bytes()).into())
    }
}

/// The SHA-256 of a session's [`Secret`]: what the state keeps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SecretHash(pub [u8; 32]);

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

/// Who sent a request, as the node that received it authenticated it: a
/// user's name. Requests carry none while authentication is off.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Principal(pub String);

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key that signs login tokens: drawn by the leader into the entry that
/// enables authentication, so every replica checks tokens alike.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenKey(pub [u8; 32]);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// A client-chosen key (1..=128 bytes) that makes a one-shot request
/// idempotent without a session.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdempotencyKey(pub Vec<u8>);

impl IdempotencyKey {
    /// Shortest allowed key, in bytes.
    pub const BYTES_MIN: usize = 1;
    /// Longest allowed key, in bytes.
    pub const BYTES_MAX: usize = 128;

    /// Whether the key's length is within `BYTES_MIN..=BYTES_MAX`.
    pub fn is_well_formed(&self) -> bool {
        (Self::BYTES_MIN..=Self::BYTES_MAX).contains(&self.0.len())
    }
}
