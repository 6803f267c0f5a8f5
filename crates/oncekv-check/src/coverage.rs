//! Coverage of a fault run, and the run's overall verdict.
//!
//! A run whose checkers all pass proves little if the dangerous paths were
//! never taken. [`Coverage::of`] counts them in a record: replies the fault
//! proxy dropped after the server committed, retries answered `Replayed`,
//! leader changes, session expiries, faults by kind, and operations by
//! outcome. [`CoverageRequirements`] sets the minimum for each (all
//! configurable, with defaults that demand every path at least once), and
//! [`assess`] combines the checkers' statuses with the coverage into a
//! [`RunVerdict`]:
//!
//! * any checker failed: **Fail**;
//! * otherwise any checker undecided, no checker at all, or a requirement
//!   not met: **Inconclusive**;
//! * otherwise **Pass**.

use crate::checkers::session_expiry::known_expiries;
use crate::checkers::{CheckerSummary, Status};
use crate::record::{Answer, FaultKind, OutcomeClass, Record};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What a run exercised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Operations recorded.
    pub operations: u64,
    /// Operations by outcome class.
    pub by_outcome: BTreeMap<OutcomeClass, u64>,
    /// Operations sent more than once.
    pub retried_operations: u64,
    /// Sends beyond the first, summed over operations.
    pub retries: u64,
    /// Replies dropped by the fault proxy after the server committed.
    pub replies_dropped_after_commit: u64,
    /// Attempts that travelled in a batch of two requests or more.
    #[serde(default)]
    pub batched_attempts: u64,
    /// Of the replies dropped after commit, those in a batch.
    #[serde(default)]
    pub batch_replies_dropped_after_commit: u64,
    /// Attempts answered `Replayed`.
    pub replayed: u64,
    /// Leader changes observed (the first leader seen is not a change).
    pub leader_changes: u64,
    /// Sessions known to have expired.
    pub session_expiries: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
}

impl Coverage {
    /// Counts what `record` exercised.
    pub fn of(record: &Record) -> Self {
        let mut coverage = Coverage {
            operations: record.ops.len() as u64,
            ..Coverage::default()
        };
        for op in &record.ops {
            *coverage.by_outcome.entry(op.outcome.class()).or_default() += 1;
            if op.attempts > 1 {
                coverage.retried_operations += 1;
                coverage.retries += u64::from(op.attempts - 1);
            }
        }
        for response in &record.responses {
            if response.dropped_after_commit {
                coverage.replies_dropped_after_commit += 1;
            }
            if response.batch > 1 {
                coverage.batched_attempts += 1;
                if response.dropped_after_commit {
                    coverage.batch_replies_dropped_after_commit += 1;
                }
            }
            if matches!(response.answer, Answer::Replayed { .. }) {
                coverage.replayed += 1;
            }
        }
        coverage.leader_changes = count_leader_changes(record);
        coverage.session_expiries = known_expiries(record).len() as u64;
        for fault in &record.faults {
            *coverage.faults.entry(fault.kind).or_default() += 1;
        }
        coverage
    }

    /// Operations with outcome `class`.
    pub fn outcome(&self, class: OutcomeClass) -> u64 {
        self.by_outcome.get(&class).copied().unwrap_or(0)
    }

    /// Faults of `kind`.
    pub fn faults_of(&self, kind: FaultKind) -> u64 {
        self.faults.get(&kind).copied().unwrap_or(0)
    }
}

/// Leader changes. With terms, each distinct term with a leader beyond the
/// first counts once (however many clients saw it); without, each
/// observation, in time order, naming another leader than the one before
/// counts. The larger count wins.
fn count_leader_changes(record: &Record) -> u64 {
    let terms: BTreeSet<u64> = record
        .leader_changes
        .iter()
        .filter(|c| c.leader.is_some())
        .filter_map(|c| c.term)
        .collect();
    let termed = terms.len().saturating_sub(1) as u64;
    let mut untermed: Vec<_> = record
        .leader_changes
        .iter()
        .filter(|c| c.term.is_none())
        .filter_map(|c| c.leader.map(|leader| (c.at_ns, leader)))
        .collect();
    untermed.sort_by_key(|&(at_ns, _)| at_ns);
    let transitions = untermed
        .windows(2)
        .filter(|pair| matches!(pair, [(_, a), (_, b)] if a != b))
        .count() as u64;
    termed.max(transitions)
}

/// The least a run must exercise to count as a pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CoverageRequirements {
    /// Acknowledged operations (`Ok`, rejections excluded).
    pub min_acknowledged: u64,
    /// Replies dropped after commit.
    pub min_replies_dropped_after_commit: u64,
    /// Attempts in a batch.
    pub min_batched_attempts: u64,
    /// Replies dropped after commit in a batch.
    pub min_batch_replies_dropped_after_commit: u64,
    /// Retries answered `Replayed`.
    pub min_replayed: u64,
    /// Leader changes.
    pub min_leader_changes: u64,
    /// Session expiries.
    pub min_session_expiries: u64,
    /// Faults, by kind.
    pub min_faults: BTreeMap<FaultKind, u64>,
}

impl Default for CoverageRequirements {
    /// At least one acknowledged operation, one reply dropped after
    /// commit, one replay, one leader change and one session expiry; no
    /// particular fault kind, and no batch (a client may send none).
    fn default() -> Self {
        Self {
            min_acknowledged: 1,
            min_replies_dropped_after_commit: 1,
            min_batched_attempts: 0,
            min_batch_replies_dropped_after_commit: 0,
            min_replayed: 1,
            min_leader_changes: 1,
            min_session_expiries: 1,
            min_faults: BTreeMap::new(),
        }
    }
}

impl CoverageRequirements {
    /// Requires nothing.
    pub fn none() -> Self {
        Self {
            min_acknowledged: 0,
            min_replies_dropped_after_commit: 0,
            min_batched_attempts: 0,
            min_batch_replies_dropped_after_commit: 0,
            min_replayed: 0,
            min_leader_changes: 0,
            min_session_expiries: 0,
            min_faults: BTreeMap::new(),
        }
    }

    /// Every requirement that `coverage` does not meet.
    pub fn shortfalls(&self, coverage: &Coverage) -> Vec<Shortfall> {
        let mut short = Vec::new();
        let mut need = |what: String, required: u64, observed: u64| {
            if observed < required {
                short.push(Shortfall {
                    what,
                    required,
                    observed,
                });
            }
        };
        need(
            "acknowledged operations".to_owned(),
            self.min_acknowledged,
            coverage.outcome(OutcomeClass::Ok),
        );
        need(
            "replies dropped after commit".to_owned(),
            self.min_replies_dropped_after_commit,
            coverage.replies_dropped_after_commit,
        );
        need(
            "attempts in a batch".to_owned(),
            self.min_batched_attempts,
            coverage.batched_attempts,
        );
        need(
            "batch replies dropped after commit".to_owned(),
            self.min_batch_replies_dropped_after_commit,
            coverage.batch_replies_dropped_after_commit,
        );
        need(
            "retries answered Replayed".to_owned(),
            self.min_replayed,
            coverage.replayed,
        );
        need(
            "leader changes".to_owned(),
            self.min_leader_changes,
            coverage.leader_changes,
        );
        need(
            "session expiries".to_owned(),
            self.min_session_expiries,
            coverage.session_expiries,
        );
        for (&kind, &required) in &self.min_faults {
            need(format!("{kind} faults"), required, coverage.faults_of(kind));
        }
        short
    }
}

/// A requirement not met.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortfall {
    /// What was counted.
    pub what: String,
    /// The minimum.
    pub required: u64,
    /// What the run reached.
    pub observed: u64,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} observed, {} required",
            self.what, self.observed, self.required
        )
    }
}

/// The verdict of a whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunVerdict {
    /// Every checker passed and the required coverage was reached.
    Pass,
    /// A checker found a violation.
    Fail,
    /// No violation, but something was undecided or not exercised
    /// enough: not a pass.
    Inconclusive,
}

impl RunVerdict {
    /// The uppercase name shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Inconclusive => "INCONCLUSIVE",
        }
    }
}

impl fmt::Display for RunVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The run's verdict with its reasons.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessment {
    /// The verdict.
    pub verdict: RunVerdict,
    /// Why, one line each (empty for a pass).
    pub reasons: Vec<String>,
    /// Requirements not met.
    pub shortfalls: Vec<Shortfall>,
}

/// Combines checker statuses and coverage into the run's verdict.
pub fn assess(
    checks: &[CheckerSummary],
    coverage: &Coverage,
    required: &CoverageRequirements,
) -> Assessment {
    let shortfalls = required.shortfalls(coverage);
    let failed: Vec<&CheckerSummary> = checks.iter().filter(|c| c.status == Status::Fail).collect();
    let undecided: Vec<&CheckerSummary> = checks
        .iter()
        .filter(|c| c.status == Status::Undecided)
        .collect();
    let mut reasons: Vec<String> = failed
        .iter()
        .map(|c| format!("{} failed: {}", c.checker, c.headline))
        .collect();
    reasons.extend(
        undecided
            .iter()
            .map(|c| format!("{} undecided: {}", c.checker, c.headline)),
    );
    if checks.is_empty() {
        reasons.push("no checker ran".to_owned());
    }
    reasons.extend(
        shortfalls
            .iter()
            .map(|s| format!("coverage not reached: {s}")),
    );
    let verdict = if !failed.is_empty() {
        RunVerdict::Fail
    } else if reasons.is_empty() {
        RunVerdict::Pass
    } else {
        RunVerdict::Inconclusive
    };
    Assessment {
        verdict,
        reasons,
        shortfalls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{
        AttemptResponse, ExpiryReport, FaultWindow, LeaderChange, Op, OpRecord, Outcome, Reply,
        RequestIdentity,
    };

    fn summary(checker: &str, status: Status) -> CheckerSummary {
        CheckerSummary {
            checker: checker.to_owned(),
            status,
            headline: format!("{checker} says {status}"),
            details: Vec::new(),
        }
    }

    fn exercised() -> Record {
        let reply = Reply::Append { length: 2 };
        Record {
            ops: vec![OpRecord {
                id: 1,
                client: 1,
                op: Op::Append {
                    key: "k".into(),
                    token: "a".into(),
                },
                request: RequestIdentity::session(1, 1),
                invoke_ns: 0,
                complete_ns: Some(10),
                attempts: 3,
                outcome: Outcome::Ok {
                    reply: reply.clone(),
                    canonical: None,
                },
            }],
            responses: vec![
                AttemptResponse {
                    at_ns: 2,
                    client: 1,
                    op_id: Some(1),
                    request: RequestIdentity::session(1, 1),
                    attempt: 1,
                    node: Some(1),
                    answer: Answer::Applied {
                        reply: reply.clone(),
                        canonical: None,
                        log_index: Some(5),
                    },
                    dropped_after_commit: true,
                    batch: 1,
                },
                AttemptResponse {
                    at_ns: 9,
                    client: 1,
                    op_id: Some(1),
                    request: RequestIdentity::session(1, 1),
                    attempt: 3,
                    node: Some(2),
                    answer: Answer::Replayed {
                        reply,
                        canonical: None,
                        applied_index: Some(5),
                    },
                    dropped_after_commit: false,
                    batch: 1,
                },
            ],
            expiries: vec![ExpiryReport {
                at_ns: 20,
                client: 1,
                session: 1,
            }],
            faults: vec![FaultWindow {
                id: 1,
                kind: FaultKind::Kill,
                target: Some(1),
                detail: None,
                start_ns: 3,
                end_ns: Some(8),
            }],
            leader_changes: vec![
                LeaderChange {
                    at_ns: 0,
                    leader: Some(1),
                    term: Some(1),
                    observer: None,
                },
                LeaderChange {
                    at_ns: 6,
                    leader: Some(2),
                    term: Some(2),
                    observer: Some(1),
                },
                LeaderChange {
                    at_ns: 7,
                    leader: Some(2),
                    term: Some(2),
                    observer: Some(2),
                },
            ],
            ..Record::default()
        }
    }

    #[test]
    fn counts_the_dangerous_paths() {
        let coverage = Coverage::of(&exercised());
        assert_eq!(coverage.operations, 1);
        assert_eq!(coverage.outcome(OutcomeClass::Ok), 1);
        assert_eq!(coverage.retried_operations, 1);
        assert_eq!(coverage.retries, 2);
        assert_eq!(coverage.replies_dropped_after_commit, 1);
        assert_eq!(coverage.replayed, 1);
        assert_eq!(coverage.leader_changes, 1);
        assert_eq!(coverage.session_expiries, 1);
        assert_eq!(coverage.faults_of(FaultKind::Kill), 1);
        assert!(
            CoverageRequirements::default()
                .shortfalls(&coverage)
                .is_empty()
        );
    }

    #[test]
    fn leader_changes_without_terms_count_transitions() {
        let mut record = Record::default();
        for (at_ns, leader) in [(0, 1), (1, 1), (2, 2), (3, 2), (4, 3)] {
            record.leader_changes.push(LeaderChange {
                at_ns,
                leader: Some(leader),
                term: None,
                observer: None,
            });
        }
        assert_eq!(Coverage::of(&record).leader_changes, 2);
    }

    #[test]
    fn verdicts_combine_checkers_and_coverage() {
        let coverage = Coverage::of(&exercised());
        let required = CoverageRequirements::default();
        let pass = assess(
            &[summary("a", Status::Pass), summary("b", Status::Pass)],
            &coverage,
            &required,
        );
        assert_eq!(pass.verdict, RunVerdict::Pass);
        assert!(pass.reasons.is_empty());

        let fail = assess(
            &[summary("a", Status::Fail), summary("b", Status::Undecided)],
            &coverage,
            &required,
        );
        assert_eq!(fail.verdict, RunVerdict::Fail);
        assert_eq!(fail.reasons.len(), 2);

        let undecided = assess(&[summary("a", Status::Undecided)], &coverage, &required);
        assert_eq!(undecided.verdict, RunVerdict::Inconclusive);

        assert_eq!(
            assess(&[], &coverage, &required).verdict,
            RunVerdict::Inconclusive
        );
    }

    #[test]
    fn passing_checkers_without_coverage_are_inconclusive_never_pass() {
        let quiet = Coverage::of(&Record::default());
        let mut required = CoverageRequirements::none();
        required.min_faults.insert(FaultKind::Partition, 2);
        let verdict = assess(&[summary("a", Status::Pass)], &quiet, &required);
        assert_eq!(verdict.verdict, RunVerdict::Inconclusive);
        assert_eq!(
            verdict.shortfalls,
            vec![Shortfall {
                what: "partition faults".to_owned(),
                required: 2,
                observed: 0,
            }]
        );
        let verdict = assess(
            &[summary("a", Status::Pass)],
            &quiet,
            &CoverageRequirements::default(),
        );
        assert_eq!(verdict.verdict, RunVerdict::Inconclusive);
        assert_eq!(verdict.shortfalls.len(), 5);
        assert_eq!(
            assess(
                &[summary("a", Status::Pass)],
                &quiet,
                &CoverageRequirements::none()
            )
            .verdict,
            RunVerdict::Pass
        );
    }

    #[test]
    fn requirements_read_from_json() {
        let required: CoverageRequirements =
            serde_json::from_str(r#"{"min_replayed": 3, "min_faults": {"kill": 2}}"#)
                .expect("parse");
        assert_eq!(required.min_replayed, 3);
        assert_eq!(required.min_leader_changes, 1);
        assert_eq!(required.min_faults.get(&FaultKind::Kill), Some(&2));
        let text = serde_json::to_string(&required).expect("encode");
        let back: CoverageRequirements = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, required);
    }
}
