//! The proof kit of oncekv: what a fault run recorded, and whether it kept
//! the exactly-once contract. Pure: it reads and judges histories, and
//! depends on nothing but serde, serde_json and thiserror (the runs that
//! record them are `oncekv-harness`'s).
//!
//! * [`record`]: the recorded client history of a fault run (operations
//!   with their request identity, attempts and outcome; every attempt's
//!   answer; session expiries, faults, leader changes; final values), as
//!   JSON lines with a reader and a writer.
//! * [`checkers`]: one checker per property, each returning a typed
//!   verdict with an explanation: [`checkers::exactly_once`] (appended
//!   tokens), [`checkers::replies`] (retries get the original reply),
//!   [`checkers::counters`] (acknowledged plus a subset of unknown
//!   increments), [`checkers::session_expiry`] (nothing applies after
//!   expiry), [`checkers::linearizable_kv`] (every key operation),
//!   [`checkers::transfers`] (money conserved) and [`checkers::watches`]
//!   (watchers saw the committed changes).
//! * [`coverage`]: whether the dangerous paths were exercised, and the
//!   run's overall verdict: a checker failure is `Fail`; anything
//!   undecided or under-exercised is `Inconclusive`, never `Pass`.
//! * [`report`]: the summary for a terminal and a self-contained HTML page
//!   with a timeline.
//! * [`verify`]: runs all of the above on a record.
//!
//! Underneath is one linearizability core, generic over the call: a
//! [`History`] of operations of one kind ([`history`]), the bounded,
//! memoised search ([`search`]: Wing–Gong/Lowe/Porcupine, Unknown rather
//! than a false pass) and one [`Verdict`] ([`linearizability`]). Two kinds
//! of operation are its instances: keyed registers ([`register`], which
//! [`jepsen`] reads from the Jepsen etcd register logs to validate the
//! search against recorded histories) and whole key-value histories
//! ([`kv_history`]: get, put, delete, append, incr, cas, prefixes,
//! multi-key transactions), decided against the store's sequential model
//! ([`kv_model`]) in partitions linked by transactions
//! ([`kv_linearizability`]).
//!
//! ```
//! use oncekv_check::{check, Bounds, Call, History, Operation, Output, Verdict};
//!
//! let key = b"k".to_vec();
//! let op = |client, call, output, invoke_ns, complete_ns| Operation {
//!     client,
//!     call,
//!     output: Some(output),
//!     invoke_ns,
//!     complete_ns: Some(complete_ns),
//! };
//! let read = || Call::Read { key: key.clone() };
//! let write = Call::Write { key: key.clone(), value: b"1".to_vec() };
//! let history = History::new(vec![
//!     op(1, write, Output::Write, 0, 10),
//!     op(2, read(), Output::Read(Some(b"1".to_vec())), 20, 30),
//!     op(2, read(), Output::Read(None), 40, 50),
//! ])?;
//! let verdict = check(&history, &Bounds::default());
//! assert!(matches!(verdict, Verdict::NotLinearizable { .. }));
//! # Ok::<(), oncekv_check::HistoryError>(())
//! ```
//!
//! A fault run, from its recorded file to its verdict:
//!
//! ```
//! use oncekv_check::coverage::{CoverageRequirements, RunVerdict};
//! use oncekv_check::record::{read_events, Record};
//! use oncekv_check::verify::{verify, VerifyConfig};
//!
//! let lines = r#"
//! {"event":"run_started","at_ns":0,"seed":7}
//! {"event":"invoke","at_ns":10,"client":1,"op_id":1,"request":{"session":3,"seq":1},"op":{"type":"append","key":"k","token":"a"}}
//! {"event":"complete","at_ns":20,"client":1,"op_id":1,"attempts":1,"outcome":{"status":"ok","reply":{"type":"append","length":2}}}
//! {"event":"final_value","at_ns":30,"key":"k","value":"a;a;"}
//! "#;
//! let record = Record::from_events(read_events(lines.as_bytes())?)?;
//! let config = VerifyConfig {
//!     coverage: CoverageRequirements::none(),
//!     ..VerifyConfig::default()
//! };
//! let verification = verify(&record, &config);
//! assert_eq!(verification.report.verdict(), RunVerdict::Fail);
//! assert!(verification.report.to_text().contains("duplicated: token a"));
//! # Ok::<(), oncekv_check::record::RecordError>(())
//! ```

pub mod checkers;
pub mod coverage;
pub mod history;
pub mod jepsen;
pub mod kv_history;
pub mod kv_linearizability;
pub mod kv_model;
pub mod linearizability;
pub mod record;
pub mod register;
pub mod report;
pub mod search;
pub mod verify;

pub use history::{ClientId, History, HistoryCall, HistoryError, Key, Operation, Value};
pub use linearizability::{
    Bounds, Explanation, KeyState, Linearizable, SearchStats, UnknownReason, Verdict, check,
    check_with_stats,
};
pub use register::{Call, Output, RegisterOperation};
