//! [`BrokenInvariant`]: what `check_invariants()` reports when the state
//! is not what the rules allow: which table, and what is wrong with it.
//! Inside `apply` it is a crash; from a restored snapshot, a refusal.

use std::fmt;

/// The part of the state an invariant is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Sessions and their completion records.
    Sessions,
    /// Idempotency keys and their records.
    IdempotencyKeys,
    /// Leases.
    Leases,
    /// The key-value data.
    Store,
    /// Users and roles.
    Auth,
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Table::Sessions => "sessions",
            Table::IdempotencyKeys => "idempotency keys",
            Table::Leases => "leases",
            Table::Store => "store",
            Table::Auth => "auth",
        })
    }
}

/// A broken invariant of the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{table}: {detail}")]
pub struct BrokenInvariant {
    /// Where.
    pub table: Table,
    /// What is wrong.
    pub detail: String,
}

impl BrokenInvariant {
    pub(crate) fn new(table: Table, detail: impl Into<String>) -> BrokenInvariant {
        BrokenInvariant {
            table,
            detail: detail.into(),
        }
    }
}
