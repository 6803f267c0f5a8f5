//! Runs every checker on a record and assembles the run's report.
//!
//! [`verify`] is the one call a fault-run driver needs after the run: it
//! takes the folded [`Record`] (whose final values the workload read after
//! the run) and a [`VerifyConfig`], runs the seven checkers, counts
//! coverage, and returns the typed verdicts together with the [`Report`]
//! and its overall [`RunVerdict`](crate::coverage::RunVerdict).
//!
//! Linearizability is judged by [`linearizable_kv`] over every key
//! operation (a register history is part of the KV history).

use crate::checkers::counters::{self, CountersOptions, CountersVerdict};
use crate::checkers::exactly_once::{self, ExactlyOnceVerdict, TokenFormat};
use crate::checkers::linearizable_kv::{self, KvCheckVerdict};
use crate::checkers::replies::{self, RepliesVerdict};
use crate::checkers::session_expiry::{self, SessionExpiryVerdict};
use crate::checkers::transfers::{self, TransfersVerdict};
use crate::checkers::watches::{self, WatchesVerdict};
use crate::checkers::{CheckerSummary, CheckerVerdict};
use crate::coverage::CoverageRequirements;
use crate::linearizability::Bounds;
use crate::record::Record;
use crate::report::Report;

/// Everything [`verify`] can be told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyConfig {
    /// How appended tokens are delimited.
    pub tokens: TokenFormat,
    /// Bounds of the counters' subset-sum search.
    pub counters: CountersOptions,
    /// Bounds of the KV linearizability search.
    pub linearizability: Bounds,
    /// What the run must exercise to pass.
    pub coverage: CoverageRequirements,
}

/// Every checker's verdict and the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    /// Appends applied exactly once.
    pub exactly_once: ExactlyOnceVerdict,
    /// Retries answered with the original reply.
    pub replies: RepliesVerdict,
    /// Counters add up.
    pub counters: CountersVerdict,
    /// Nothing ran after its session expired.
    pub session_expiry: SessionExpiryVerdict,
    /// Key operations are linearizable.
    pub kv: KvCheckVerdict,
    /// Transfers are conserved and applied exactly once.
    pub transfers: TransfersVerdict,
    /// Watchers saw the committed change sequence.
    pub watches: WatchesVerdict,
    /// The summary of it all, with coverage and the overall verdict.
    pub report: Report,
}

impl Verification {
    /// The checkers' summaries, in report order.
    pub fn summaries(&self) -> Vec<CheckerSummary> {
        vec![
            self.exactly_once.summary(),
            self.replies.summary(),
            self.counters.summary(),
            self.session_expiry.summary(),
            self.kv.summary(),
            self.transfers.summary(),
            self.watches.summary(),
        ]
    }
}

/// Runs every checker on `record` against its final values.
pub fn verify(record: &Record, config: &VerifyConfig) -> Verification {
    let finals = &record.final_values;
    let exactly_once = exactly_once::check(record, finals, config.tokens);
    let replies = replies::check(record);
    let counters = counters::check(record, finals, &config.counters);
    let session_expiry = session_expiry::check(record, finals, config.tokens);
    let kv = linearizable_kv::check(record, config.tokens, &config.linearizability);
    let transfers = transfers::check(record, finals, config.tokens);
    let watches = watches::check(record);
    let checks = vec![
        exactly_once.summary(),
        replies.summary(),
        counters.summary(),
        session_expiry.summary(),
        kv.summary(),
        transfers.summary(),
        watches.summary(),
    ];
    let report = Report::new(record, checks, &config.coverage);
    Verification {
        exactly_once,
        replies,
        counters,
        session_expiry,
        kv,
        transfers,
        watches,
        report,
    }
}
