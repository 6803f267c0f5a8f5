//! The pure, deterministic exactly-once state machine of oncekv.
//!
//! Every replica applies the same log [`Entry`]s (each a leader's
//! [`Proposal`] at its index) through [`StateMachine::apply`] and gets the
//! same [`Outcome`]s and the same snapshot bytes. Deduplication is decided
//! here and nowhere else: requests on a session are applied once per
//! [`RequestId`] and their [`CompletionRecord`] answers every retry;
//! one-shot requests do the same under an [`IdempotencyKey`]. Once
//! authentication is enabled ([`AuthTable`]), each entry's [`Principal`]
//! must hold a permission on every key it touches, and sessions and keys
//! belong to their principal.
//!
//! This crate does no I/O of its own (a snapshot is written to, and read
//! from, a `std::io` writer or reader its caller gives), reads no clock
//! and draws no random numbers: its
//! only time is the [`ClusterTime`] carried in each entry, and every
//! replicated collection is ordered, so iteration is deterministic.
//!
//! The modules are layered: each imports (`crate::...`) only modules of the
//! layers below its own, never one of its own layer or above, so no two
//! modules depend on each other. Lowest first:
//!
//! 1. `ids`, `invariant`, `decode`, `key_range`, `value`, `refusal`, `overhead`
//! 2. `quota`, `history`, `auth`, `txn`
//! 3. `kv`, `command`
//! 4. `outcome`, `digest`, `limits`
//! 5. `lease`, `session`, `stream`
//! 6. `idempotency`
//! 7. `machine` (and its submodules)
//! 8. `snapshot`
//!
//! `tests/tidy.rs` reads this list and fails on an import of a module of
//! the same or a higher layer, and on a module the list leaves out (unit
//! tests, from `#[cfg(test)]` on, may import any module).
//!
//! ```
//! use oncekv_state::*;
//!
//! let mut machine = StateMachine::new(Limits::default());
//! let secret = Secret(7);
//! let open = Command::OpenSession { ttl_ms: 60_000, window: 1, secret };
//! let proposal = Proposal { time: ClusterTime(0), principal: None, request: Request::plain(open) };
//! let entry = Entry { index: LogIndex(1), proposal };
//! let Outcome::Applied(Reply::SessionOpened { session, .. }) = machine.apply(&entry) else {
//!     panic!("session not opened");
//! };
//! let header = RequestHeader {
//!     id: RequestId { session, seq: Seq(1) },
//!     secret,
//!     first_incomplete: Seq(1),
//!     attempt: 1,
//! };
//! let incr = Request {
//!     origin: Origin::Session(header),
//!     command: Command::Incr { key: b"c".to_vec(), by: 1 },
//! };
//! let at = |index, time, request| Entry {
//!     index: LogIndex(index),
//!     proposal: Proposal { time: ClusterTime(time), principal: None, request },
//! };
//! let first = machine.apply(&at(2, 5, incr.clone()));
//! let retry = machine.apply(&at(3, 9, incr));
//! assert_eq!(first, Outcome::Applied(Reply::Incr { value: 1 }));
//! assert_eq!(retry, Outcome::Replayed { reply: Reply::Incr { value: 1 }, applied_index: LogIndex(2) });
//! ```

mod auth;
mod command;
mod decode;
mod digest;
mod history;
mod idempotency;
mod ids;
mod invariant;
mod key_range;
mod kv;
mod lease;
mod limits;
mod machine;
mod outcome;
mod overhead;
mod quota;
mod refusal;
mod session;
mod snapshot;
mod stream;
mod txn;
mod value;

pub use auth::{
    ADMIN_ROLE, AUTH_BYTES_MAX, Access, AuthCommand, AuthTable, AuthView, NAME_BYTES_MAX,
    PASSWORD_HASH_BYTES_MAX, Permission, REVOKED_CERTIFICATES_MAX, Role, SERIAL_BYTES_MAX, User,
    UserView, check_name, serial_hex,
};
pub use command::{Command, Entry, Origin, Proposal, Query, Request, RequestHeader};
pub use digest::command_digest;
pub use history::{EVENT_OVERHEAD_BYTES, Event, History, HistoryBounds, Stamp};
pub use idempotency::{IdempotencyKeys, KeyBudget, KeyRecord};
pub use ids::{
    ClusterTime, IdempotencyKey, LogIndex, Principal, RequestId, Secret, SecretHash, Seq,
    SessionId, TokenKey,
};
pub use invariant::{BrokenInvariant, Table};
pub use key_range::{KeyRange, KeyScope, prefix_end};
pub use kv::{KeyValue, KvPairs, KvStore, RangePage, entry_weight_bytes};
pub use lease::{Lease, Leases};
pub use limits::{
    ALARMED_MEMBERS_MAX, InvalidRequest, Limits, WINDOW_DEFAULT, WINDOW_MAX_ABSOLUTE,
};
pub use machine::{StateMachine, Stats};
pub use outcome::{LeaseInfo, Outcome, Reply};
pub use overhead::{ENTRY_OVERHEAD_BYTES, KEY_ENTRY_OVERHEAD_BYTES, STORE_ENTRY_OVERHEAD_BYTES};
pub use quota::{Holder, InvalidQuotas, Usage, UsageByOwner, UserQuotas};
pub use refusal::{Malformed, Overload, Rejection};
pub use session::{
    CompletionRecord, NotExecuted, RecordBudget, Session, SessionBudget, SessionTable,
};
pub use snapshot::{FORMAT_VERSION, SnapshotError};
pub use txn::{
    Compare, CompareOp, CompareTarget, TXN_DEPTH_MAX, TXN_TREE_OPS_FACTOR, Txn, TxnOp, Update,
};
pub use value::{KeyMeta, SharedBytes, StoredValue};
