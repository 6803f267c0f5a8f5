//! The fixed allowances the byte budgets and the store's quota count for
//! an entry beyond its variable-length contents (slots, tree nodes,
//! allocations), so the count is the same on every replica and platform.

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
