//! Linearizability checking for oncekv's register workloads.
//!
//! Histories of reads, writes and compare-and-sets on keyed registers,
//! recorded by test clients with real-time intervals and possibly unknown
//! outcomes, are modelled in [`history`]; [`linearizability`] decides
//! whether such a history could have come from atomic registers, within a
//! time and memory budget; [`jepsen`] reads the Jepsen etcd register log
//! format, used to validate the checker against recorded histories.
//!
//! ```
//! use oncekv_check::{check, Bounds, Call, History, Operation, Output, Verdict};
//!
//! let op = |client, call, output, invoke_ns, complete_ns| Operation {
//!     client,
//!     key: b"k".to_vec(),
//!     call,
//!     output: Some(output),
//!     invoke_ns,
//!     complete_ns: Some(complete_ns),
//! };
//! let history = History::new(vec![
//!     op(1, Call::Write(b"1".to_vec()), Output::Write, 0, 10),
//!     op(2, Call::Read, Output::Read(Some(b"1".to_vec())), 20, 30),
//!     op(2, Call::Read, Output::Read(None), 40, 50),
//! ])?;
//! let verdict = check(&history, &Bounds::default());
//! assert!(matches!(verdict, Verdict::NotLinearizable { .. }));
//! # Ok::<(), oncekv_check::HistoryError>(())
//! ```

pub mod history;
pub mod jepsen;
pub mod linearizability;

pub use history::{Call, ClientId, History, HistoryError, Key, Operation, Output, Value};
pub use linearizability::{
    Bounds, Explanation, SearchStats, UnknownReason, Verdict, check, check_with_stats,
};
