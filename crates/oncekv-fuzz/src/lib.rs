//! Fuzz target bodies for oncekv, each a plain function of the fuzzer's
//! bytes, so that the same body runs under libFuzzer (the `fuzz/` crate at
//! the repository root, `cargo +nightly fuzz run <target>`) and in the smoke
//! run of the ordinary `cargo test` (`tests/smoke.rs`: the seed corpus in
//! `corpus/<target>/`, then pseudo-random inputs from a fixed seed).
//!
//! - [`peer_message()`]: `RaftPeer` messages (vote, append entries, transfer
//!   leader, snapshot streams) decoded from the bytes and sent to a real
//!   node in this process; it must never panic and must keep answering
//!   client writes (with an outcome or a typed refusal).
//! - [`snapshot_restore()`]: `StateMachine::restore` of arbitrary bodies
//!   behind a valid header and checksum; `Ok` or a typed error, and a
//!   restored machine holds its invariants, snapshots to bytes that restore
//!   to the same machine, and applies commands.
//! - [`segment_recovery()`]: arbitrary segment files and vote files opened by
//!   `SegmentLog`; `Ok` or a typed error, in bounded time, and a log that
//!   opens reads back, reopens the same and takes an append.
//! - [`client_request()`]: `ExecuteRequest`s decoded from the bytes, converted,
//!   checked and applied to a state machine with small limits; invariants
//!   and byte budgets hold after every apply.
//! - [`batch_request()`]: `ExecuteBatchRequest` decoded by its hand-written
//!   decoding and by the one prost generates for the same message; they
//!   agree up to the cap of 256 requests, past it the hand-written one
//!   refuses as it counts, and what it accepts encodes as the generated one.
//! - [`etcd_request()`]: etcd's requests decoded from the bytes, converted
//!   by the etcd adapter, checked and applied (or read) on a state machine
//!   with small limits, and answered; a refusal is a status from the
//!   adapter's errors table, what `check_request` refuses never runs, and
//!   the handlers expect the replies they get.
//!
//! A broken property is a panic, which libFuzzer reports as a crash and the
//! smoke run as a failed test.

pub mod batch_request;
pub mod client_request;
pub mod etcd_request;
mod input;
pub mod peer_message;
pub mod segment_recovery;
pub mod snapshot_restore;

pub use batch_request::batch_request;
pub use client_request::client_request;
pub use etcd_request::etcd_request;
pub use peer_message::peer_message;
pub use segment_recovery::segment_recovery;
pub use snapshot_restore::snapshot_restore;

use oncekv_state::Limits;

/// Small limits, so that a few requests reach every bound: keys, values,
/// sessions, windows, record and idempotency budgets, the store quota,
/// leases, time-to-live ranges, the history, transactions and the
/// per-user shares.
pub fn small_limits() -> Limits {
    Limits {
        key_bytes_max: 16,
        value_bytes_max: 64,
        kv_keys_max: 12,
        store_bytes_max: 1024,
        scan_limit_max: 4,
        scan_bytes_max: 96,
        sessions_max: 3,
        session_record_bytes_max: 256,
        record_bytes_max: 512,
        window_max: 4,
        session_ttl_ms_min: 100,
        session_ttl_ms_max: 10_000,
        idempotency_keys_max: 4,
        idempotency_bytes_max: 512,
        idempotency_key_ttl_ms: 5_000,
        leases_max: 3,
        lease_name_bytes_max: 8,
        lease_ttl_ms_min: 100,
        lease_ttl_ms_max: 10_000,
        history_events_max: 16,
        history_bytes_max: 2048,
        history_retention_ms: 5_000,
        txn_ops_max: 4,
        quotas: oncekv_state::UserQuotas {
            user_share_percent: 50,
            admin_reserve_percent: 25,
        },
    }
}

/// A fresh temporary directory, on `/dev/shm` when there is one (a tmpfs:
/// fsyncs cost nothing there), named after `prefix` and this process. The
/// first call removes such directories left by processes that are gone
/// (a fuzzer exits without dropping what its targets keep across inputs).
pub(crate) fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    static CLEANED: std::sync::Once = std::sync::Once::new();
    let shm = std::path::Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    CLEANED.call_once(|| remove_stale_scratch(&parent));
    tempfile::Builder::new()
        .prefix(&format!("{prefix}-{}-", std::process::id()))
        .tempdir_in(&parent)
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory")
}

/// Removes `oncekv-fuzz-*-<pid>-*` directories in `parent` whose process
/// no longer runs.
fn remove_stale_scratch(parent: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("oncekv-fuzz-")) else {
            continue;
        };
        let pid = rest.split('-').find_map(|part| part.parse::<u32>().ok());
        let gone = pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
