//! [`Limits`]: every bound the state machine enforces. They are a cluster
//! setting: every replica must apply with the same limits, and a snapshot
//! records them so a mismatch is caught on restore.

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
    /// Most scan results in one reply.
    pub scan_limit_max: u32,
    /// Most live sessions; opening one more evicts the least recently active.
    pub sessions_max: u64,
    /// Largest in-flight window a session may ask for.
    pub window_max: u32,
    /// Shortest session time-to-live.
    pub session_ttl_ms_min: u64,
    /// Longest session time-to-live.
    pub session_ttl_ms_max: u64,
    /// Most idempotency keys kept; recording one more evicts the oldest.
    pub idempotency_keys_max: u64,
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
}

/// The default in-flight window of a session (as RIFL).
pub const WINDOW_DEFAULT: u32 = 128;

impl Default for Limits {
    fn default() -> Self {
        const DAY_MS: u64 = 24 * 60 * 60 * 1000;
        Limits {
            key_bytes_max: 4 * 1024,
            value_bytes_max: 1024 * 1024,
            kv_keys_max: 10_000_000,
            scan_limit_max: 1000,
            sessions_max: 100_000,
            window_max: 1024,
            session_ttl_ms_min: 100,
            session_ttl_ms_max: DAY_MS,
            idempotency_keys_max: 100_000,
            idempotency_key_ttl_ms: 10 * 60 * 1000,
            leases_max: 100_000,
            lease_name_bytes_max: 256,
            lease_ttl_ms_min: 100,
            lease_ttl_ms_max: DAY_MS,
        }
    }
}

/// The largest window any configuration may allow.
pub const WINDOW_MAX_ABSOLUTE: u32 = 1024;
