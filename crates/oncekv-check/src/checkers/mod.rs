//! The checkers of a recorded fault run, one property per module, and the
//! verdict shape they share.
//!
//! Each checker takes a [`Record`](crate::record::Record) (and, where it
//! compares with final state, the final values) and returns its own typed
//! verdict listing every violation it found. Every verdict implements
//! [`CheckerVerdict`]: a [`Status`] (`Pass`, `Fail`, or `Undecided` when the
//! checker could not decide, which is never a pass) and a human
//! explanation, which [`CheckerVerdict::summary`] bundles for the report
//! and which is also how every verdict displays. A verdict that lists its
//! findings (violations, then undecided items) gets all of this from them
//! through one helper here (`Findings`).
//!
//! * [`exactly_once`]: appended tokens in the final values against the
//!   append operations and their outcomes;
//! * [`replies`]: every answer to one request is byte-identical, and a
//!   request ran at most once;
//! * [`counters`]: counters equal acknowledged increments plus a subset of
//!   unknown ones; session counters return exactly `1..=N`;
//! * [`session_expiry`]: nothing applies on a session after its client was
//!   told it expired;
//! * [`linearizable_kv`]: every key operation (GET, PUT, DELETE, APPEND,
//!   INCR, CAS, transactions) through the linearizability core
//!   ([`crate::linearizability`]);
//! * [`transfers`]: money moved by transactions is conserved and every
//!   transfer applied exactly once;
//! * [`watches`]: every watcher was given the committed change sequence,
//!   gap-free and repeat-free across resumes.

pub mod counters;
pub mod exactly_once;
pub mod linearizable_kv;
pub mod replies;
pub mod session_expiry;
pub mod transfers;
pub mod watches;

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a checker concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The property holds on everything checked.
    Pass,
    /// The property is violated.
    Fail,
    /// The checker could not decide (missing data, a search bound); never
    /// to be read as a pass.
    Undecided,
}

impl Status {
    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Undecided => "undecided",
        }
    }

    /// `Fail` if any violation, else `Undecided` if anything was left
    /// undecided, else `Pass`.
    pub fn from_counts(violations: usize, undecided: usize) -> Self {
        if violations > 0 {
            Self::Fail
        } else if undecided > 0 {
            Self::Undecided
        } else {
            Self::Pass
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A checker's verdict reduced to what the report shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerSummary {
    /// The checker's name.
    pub checker: String,
    /// Its conclusion.
    pub status: Status,
    /// One line saying what was checked and concluded.
    pub headline: String,
    /// The violations and undecided items, one per line (bounded).
    pub details: Vec<String>,
}

/// Implemented by every checker's verdict.
pub trait CheckerVerdict {
    /// The checker's name, as in the report.
    fn checker(&self) -> &'static str;

    /// The conclusion.
    fn status(&self) -> Status;

    /// One line saying what was checked and concluded.
    fn headline(&self) -> String;

    /// Every violation, then every undecided item, one line each.
    fn details(&self) -> Vec<String>;

    /// The headline followed by the details (at most
    /// [`MAX_DETAIL_LINES`]).
    fn explanation(&self) -> String {
        let mut text = self.headline();
        for line in bounded(self.details()) {
            text.push_str("\n  ");
            text.push_str(&line);
        }
        text
    }

    /// The verdict for the report.
    fn summary(&self) -> CheckerSummary {
        CheckerSummary {
            checker: self.checker().to_owned(),
            status: self.status(),
            headline: self.headline(),
            details: bounded(self.details()),
        }
    }
}

/// A verdict that lists its findings: every violation, then every item it
/// could not decide. Its [`CheckerVerdict`] follows from them: `Fail` on
/// any violation, else `Undecided` on any undecided item, else `Pass`; the
/// headline is the conclusion's wording followed by the scope, and the
/// details the findings, one line each.
pub(crate) trait Findings {
    /// The checker's name, as in the report.
    const CHECKER: &'static str;
    /// Said before the scope on a pass.
    const PASS: &'static str;
    /// One violation.
    type Violation: fmt::Display;
    /// One undecided item.
    type Undecided: fmt::Display;

    /// Every violation found.
    fn violations(&self) -> &[Self::Violation];

    /// Everything left undecided.
    fn undecided(&self) -> &[Self::Undecided];

    /// What was checked, for the headline.
    fn scope(&self) -> String;

    /// Said alone, instead of the scope, on a pass with nothing to check.
    fn nothing_checked(&self) -> Option<&'static str>;

    /// Said before the scope when undecided.
    fn undecided_wording(&self) -> String {
        "undecided, no violation".to_owned()
    }
}

impl<T: Findings> CheckerVerdict for T {
    fn checker(&self) -> &'static str {
        T::CHECKER
    }

    fn status(&self) -> Status {
        Status::from_counts(self.violations().len(), self.undecided().len())
    }

    fn headline(&self) -> String {
        let status = self.status();
        if let (Status::Pass, Some(nothing)) = (status, self.nothing_checked()) {
            return nothing.to_owned();
        }
        let conclusion = match status {
            Status::Pass => T::PASS.to_owned(),
            Status::Fail => format!("{} violation(s)", self.violations().len()),
            Status::Undecided => self.undecided_wording(),
        };
        format!("{conclusion}: {}", self.scope())
    }

    fn details(&self) -> Vec<String> {
        self.violations()
            .iter()
            .map(ToString::to_string)
            .chain(self.undecided().iter().map(ToString::to_string))
            .collect()
    }
}

/// Every verdict displays as its [`CheckerVerdict::explanation`].
macro_rules! display_explanation {
    ($($verdict:ty),+ $(,)?) => {$(
        impl fmt::Display for $verdict {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.explanation())
            }
        }
    )+};
}

display_explanation!(
    counters::CountersVerdict,
    exactly_once::ExactlyOnceVerdict,
    linearizable_kv::KvCheckVerdict,
    replies::RepliesVerdict,
    session_expiry::SessionExpiryVerdict,
    transfers::TransfersVerdict,
    watches::WatchesVerdict,
);

/// A run time stamp for explanations: seconds since the run started, to
/// the microsecond (`t=7.357709s`).
pub fn at(ns: u64) -> String {
    format!(
        "t={}.{:06}s",
        ns / 1_000_000_000,
        (ns % 1_000_000_000) / 1_000
    )
}

/// The most detail lines an explanation or summary carries.
pub const MAX_DETAIL_LINES: usize = 50;

fn bounded(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > MAX_DETAIL_LINES {
        let more = lines.len() - MAX_DETAIL_LINES;
        lines.truncate(MAX_DETAIL_LINES);
        lines.push(format!("... and {more} more"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Many(usize);

    impl CheckerVerdict for Many {
        fn checker(&self) -> &'static str {
            "many"
        }
        fn status(&self) -> Status {
            Status::from_counts(self.0, 0)
        }
        fn headline(&self) -> String {
            format!("{} problems", self.0)
        }
        fn details(&self) -> Vec<String> {
            (0..self.0).map(|i| format!("problem {i}")).collect()
        }
    }

    #[test]
    fn time_stamps_read_as_seconds() {
        assert_eq!(at(7_357_709_195), "t=7.357709s");
        assert_eq!(at(999), "t=0.000000s");
    }

    #[test]
    fn status_precedence() {
        assert_eq!(Status::from_counts(1, 1), Status::Fail);
        assert_eq!(Status::from_counts(0, 1), Status::Undecided);
        assert_eq!(Status::from_counts(0, 0), Status::Pass);
    }

    #[test]
    fn details_are_bounded() {
        let summary = Many(MAX_DETAIL_LINES + 7).summary();
        assert_eq!(summary.status, Status::Fail);
        assert_eq!(summary.details.len(), MAX_DETAIL_LINES + 1);
        assert_eq!(
            summary.details.last().map(String::as_str),
            Some("... and 7 more")
        );
        assert!(Many(2).explanation().ends_with("\n  problem 1"));
    }
}
