//! The counter checker for INCR workloads.
//!
//! Counters start absent (0) and are only INCRemented. After the run each
//! counter's final value must equal the sum of its acknowledged increments
//! plus the sum of **some subset** of the increments whose outcome is
//! unknown; definitely failed and rejected increments count for nothing.
//! Deciding that is a bounded subset-sum over the unknown increments
//! grouped by size: with one size (say, every INCR is by 1) it is a range
//! check; otherwise a search over reachable sums, pruned by what the
//! remaining groups can still add, gives up with `Undecided` (never a
//! pass) past [`CountersOptions::max_distinct_unknown`] distinct sizes or
//! [`CountersOptions::max_steps`] steps. Range and divisibility arguments
//! can still prove a failure without the search.
//!
//! Where every increment is positive, the values returned to acknowledged
//! INCRs are pairwise distinct and lie between the increment itself and
//! the final value. Where every increment is 1 and every INCR got a
//! definite answer (session clients that retry to the end), the returned
//! values are exactly `1..=N` for `N` acknowledged increments: no gap, no
//! repeat.

use super::Findings;
use crate::record::{Bytes, Op, OpId, OpRecord, OutcomeClass, Record, Reply};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

/// Bounds on the subset-sum search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountersOptions {
    /// Most distinct unknown increment sizes searched over, per key.
    pub max_distinct_unknown: usize,
    /// Most search steps (candidate sums considered), per key.
    pub max_steps: u64,
}

impl Default for CountersOptions {
    /// 64 distinct sizes, 2^24 steps.
    fn default() -> Self {
        Self {
            max_distinct_unknown: 64,
            max_steps: 1 << 24,
        }
    }
}

/// Whether a target is a sum of a sub-multiset of increments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubsetSum {
    /// Some subset sums to the target.
    Reachable,
    /// No subset sums to the target; the reason says why.
    Unreachable(String),
    /// More distinct sizes than allowed.
    TooManyDistinct {
        /// Distinct sizes.
        distinct: usize,
    },
    /// The step budget ran out.
    StepLimit,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn div_floor(a: i128, b: i128) -> i128 {
    a.div_euclid(b)
}

fn div_ceil(a: i128, b: i128) -> i128 {
    -(-a).div_euclid(b)
}

/// Decides whether `target` is the sum of some sub-multiset of `groups`
/// (increment size → how many), within `options`.
pub fn subset_sum(
    target: i128,
    groups: &BTreeMap<i64, u64>,
    options: &CountersOptions,
) -> SubsetSum {
    let groups: Vec<(i128, i128)> = groups
        .iter()
        .filter(|&(&size, &count)| size != 0 && count > 0)
        .map(|(&size, &count)| (i128::from(size), i128::from(count)))
        .collect();
    let span = |groups: &[(i128, i128)]| {
        groups
            .iter()
            .fold((0i128, 0i128), |(lo, hi), &(size, count)| {
                let total = size.saturating_mul(count);
                if total < 0 {
                    (lo.saturating_add(total), hi)
                } else {
                    (lo, hi.saturating_add(total))
                }
            })
    };
    let (lo, hi) = span(&groups);
    if target < lo || target > hi {
        return SubsetSum::Unreachable(format!(
            "the unknown increments can add only between {lo} and {hi}, not {target}"
        ));
    }
    let divisor = groups.iter().fold(0, |g, &(size, _)| gcd(g, size));
    if divisor > 1 && target % divisor != 0 {
        return SubsetSum::Unreachable(format!(
            "every unknown increment is a multiple of {divisor}, {target} is not"
        ));
    }
    match groups.as_slice() {
        [] => {
            return if target == 0 {
                SubsetSum::Reachable
            } else {
                SubsetSum::Unreachable(format!("there is no unknown increment to make up {target}"))
            };
        }
        // Within range and a multiple of the one size: reachable.
        [_] => return SubsetSum::Reachable,
        _ => {}
    }
    if groups.len() > options.max_distinct_unknown {
        return SubsetSum::TooManyDistinct {
            distinct: groups.len(),
        };
    }
    // What groups i.. can still add, for pruning.
    let suffix: Vec<(i128, i128)> = (0..=groups.len())
        .map(|i| span(groups.get(i..).unwrap_or(&[])))
        .collect();
    let mut steps: u64 = 0;
    let mut sums: HashSet<i128> = HashSet::from([0]);
    for (i, &(size, count)) in groups.iter().enumerate() {
        let (rest_lo, rest_hi) = suffix.get(i + 1).copied().unwrap_or((0, 0));
        // After this group the partial sum must lie in [low, high].
        let (low, high) = (target - rest_hi, target - rest_lo);
        let mut next = HashSet::new();
        for &sum in &sums {
            let (k_min, k_max) = if size > 0 {
                (div_ceil(low - sum, size), div_floor(high - sum, size))
            } else {
                let up = -size;
                (div_ceil(sum - high, up), div_floor(sum - low, up))
            };
            let (k_min, k_max) = (k_min.max(0), k_max.min(count));
            let mut k = k_min;
            while k <= k_max {
                steps += 1;
                if steps > options.max_steps {
                    return SubsetSum::StepLimit;
                }
                next.insert(sum + k * size);
                k += 1;
            }
        }
        if next.is_empty() {
            break;
        }
        sums = next;
    }
    if sums.contains(&target) {
        SubsetSum::Reachable
    } else {
        SubsetSum::Unreachable(format!(
            "no subset of the unknown increments adds up to {target}"
        ))
    }
}

/// One way a counter contradicts its history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterViolation {
    /// The final value is not a decimal integer.
    NotAnInteger {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
    },
    /// The final value is not acknowledged increments plus a subset of
    /// unknown ones.
    Unreachable {
        /// The key.
        key: Bytes,
        /// The final value.
        final_value: i64,
        /// The sum of acknowledged increments.
        acknowledged_sum: i128,
        /// Unknown increments by size.
        unknown: BTreeMap<i64, u64>,
        /// Why no subset fits.
        why: String,
    },
    /// Two acknowledged increments returned the same value.
    RepeatedValue {
        /// The key.
        key: Bytes,
        /// The value.
        value: i64,
        /// The operations that returned it.
        ops: Vec<OpId>,
    },
    /// A returned value outside what the increments allow.
    ValueOutOfRange {
        /// The key.
        key: Bytes,
        /// The value returned.
        value: i64,
        /// The operation.
        op: OpId,
        /// The smallest it may be (its own increment).
        min: i64,
        /// The largest it may be (the final value).
        max: i64,
    },
    /// A session counter's returned values are not exactly `1..=N`.
    SequenceBroken {
        /// The key.
        key: Bytes,
        /// `N`: the acknowledged increments.
        acknowledged: usize,
        /// Values of `1..=N` nobody got (the first few).
        missing: Vec<i64>,
        /// Values returned more than once.
        repeated: Vec<i64>,
        /// Values outside `1..=N`.
        outside: Vec<i64>,
    },
}

fn list(values: &[i64]) -> String {
    const SHOWN: usize = 10;
    let mut text: Vec<String> = values.iter().take(SHOWN).map(ToString::to_string).collect();
    if values.len() > SHOWN {
        text.push(format!("... ({} in all)", values.len()));
    }
    text.join(", ")
}

impl fmt::Display for CounterViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAnInteger { key, value } => {
                write!(f, "counter {key} ends as {value:?}, not an integer")
            }
            Self::Unreachable {
                key,
                final_value,
                acknowledged_sum,
                unknown,
                why,
            } => {
                let unknown: Vec<String> = unknown
                    .iter()
                    .map(|(size, count)| format!("{count}x{size}"))
                    .collect();
                write!(
                    f,
                    "counter {key} ends at {final_value}: acknowledged increments add {acknowledged_sum}, unknown ones [{}]; {why}",
                    unknown.join(", ")
                )
            }
            Self::RepeatedValue { key, value, ops } => {
                let ops: Vec<String> = ops.iter().map(|id| format!("#{id}")).collect();
                write!(
                    f,
                    "counter {key}: value {value} returned to {} increments ({})",
                    ops.len(),
                    ops.join(", ")
                )
            }
            Self::ValueOutOfRange {
                key,
                value,
                op,
                min,
                max,
            } => write!(
                f,
                "counter {key}: op #{op} returned {value}, outside {min}..={max}"
            ),
            Self::SequenceBroken {
                key,
                acknowledged,
                missing,
                repeated,
                outside,
            } => {
                write!(
                    f,
                    "counter {key}: {acknowledged} acknowledged increments did not return exactly 1..={acknowledged}"
                )?;
                if !missing.is_empty() {
                    write!(f, "; missing {}", list(missing))?;
                }
                if !repeated.is_empty() {
                    write!(f, "; repeated {}", list(repeated))?;
                }
                if !outside.is_empty() {
                    write!(f, "; outside {}", list(outside))?;
                }
                Ok(())
            }
        }
    }
}

/// Why a counter was left undecided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterUndecided {
    /// The counter's final value was not read.
    NoFinalValue {
        /// The key.
        key: Bytes,
    },
    /// The key was also written by something other than INCR.
    MixedKey {
        /// The key.
        key: Bytes,
        /// The other operations' kinds.
        others: Vec<&'static str>,
    },
    /// Too many distinct unknown increment sizes to search.
    TooManyDistinct {
        /// The key.
        key: Bytes,
        /// Distinct sizes.
        distinct: usize,
        /// The limit.
        limit: usize,
    },
    /// The search ran out of steps.
    StepLimit {
        /// The key.
        key: Bytes,
        /// The limit.
        limit: u64,
    },
}

impl fmt::Display for CounterUndecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoFinalValue { key } => {
                write!(
                    f,
                    "could not decide counter {key}: its final value was not read"
                )
            }
            Self::MixedKey { key, others } => write!(
                f,
                "could not decide counter {key}: it was also written by {}",
                others.join(", ")
            ),
            Self::TooManyDistinct {
                key,
                distinct,
                limit,
            } => write!(
                f,
                "could not decide counter {key}: {distinct} distinct unknown increments, more than the {limit} searched"
            ),
            Self::StepLimit { key, limit } => write!(
                f,
                "could not decide counter {key}: the subset-sum search stopped after {limit} steps"
            ),
        }
    }
}

/// What was checked on one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSummary {
    /// The key.
    pub key: Bytes,
    /// Its final value, when read and an integer.
    pub final_value: Option<i64>,
    /// Acknowledged increments.
    pub acknowledged: usize,
    /// Their sum.
    pub acknowledged_sum: i128,
    /// Increments with an unknown outcome.
    pub unknown: usize,
    /// Whether the `1..=N` sequence check applied.
    pub sequence_checked: bool,
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountersVerdict {
    /// Every counter key, checked or not.
    pub counters: Vec<CounterSummary>,
    /// Everything that contradicts the history.
    pub violations: Vec<CounterViolation>,
    /// Counters that could not be decided.
    pub undecided: Vec<CounterUndecided>,
}

impl Findings for CountersVerdict {
    const CHECKER: &'static str = "counters";
    const PASS: &'static str = "every counter adds up";
    type Violation = CounterViolation;
    type Undecided = CounterUndecided;

    fn violations(&self) -> &[CounterViolation] {
        &self.violations
    }

    fn undecided(&self) -> &[CounterUndecided] {
        &self.undecided
    }

    fn scope(&self) -> String {
        let acknowledged: usize = self.counters.iter().map(|c| c.acknowledged).sum();
        let unknown: usize = self.counters.iter().map(|c| c.unknown).sum();
        let sequences = self.counters.iter().filter(|c| c.sequence_checked).count();
        format!(
            "{} counter(s), {acknowledged} acknowledged and {unknown} unknown increment(s), {sequences} checked as 1..=N",
            self.counters.len()
        )
    }

    fn nothing_checked(&self) -> Option<&'static str> {
        self.counters.is_empty().then_some("no increments recorded")
    }

    fn undecided_wording(&self) -> String {
        format!(
            "{} counter(s) undecided, no violation",
            self.undecided.len()
        )
    }
}

/// Checks every INCR key of `record` against `final_values`.
pub fn check(
    record: &Record,
    final_values: &BTreeMap<Bytes, Option<Bytes>>,
    options: &CountersOptions,
) -> CountersVerdict {
    let mut incrs: BTreeMap<&Bytes, Vec<(&OpRecord, i64)>> = BTreeMap::new();
    let mut writers: BTreeMap<&Bytes, BTreeSet<&'static str>> = BTreeMap::new();
    for op in &record.ops {
        match &op.op {
            Op::Incr { key, by } => incrs.entry(key).or_default().push((op, *by)),
            Op::Get { .. } => {}
            other => {
                if let Some(key) = other.key() {
                    writers.entry(key).or_default().insert(other.name());
                }
            }
        }
    }
    let mut verdict = CountersVerdict::default();
    for (key, ops) in incrs {
        check_key(key, &ops, final_values, &writers, options, &mut verdict);
    }
    verdict
}

fn check_key(
    key: &Bytes,
    ops: &[(&OpRecord, i64)],
    final_values: &BTreeMap<Bytes, Option<Bytes>>,
    writers: &BTreeMap<&Bytes, BTreeSet<&'static str>>,
    options: &CountersOptions,
    verdict: &mut CountersVerdict,
) {
    let acked: Vec<(&OpRecord, i64)> = ops
        .iter()
        .filter(|(op, _)| op.outcome.class() == OutcomeClass::Ok)
        .copied()
        .collect();
    let mut unknown: BTreeMap<i64, u64> = BTreeMap::new();
    for (op, by) in ops {
        if op.outcome.class() == OutcomeClass::Unknown {
            *unknown.entry(*by).or_default() += 1;
        }
    }
    let unknown_count = ops
        .iter()
        .filter(|(op, _)| op.outcome.class() == OutcomeClass::Unknown)
        .count();
    let acknowledged_sum: i128 = acked.iter().map(|&(_, by)| i128::from(by)).sum();
    let mut summary = CounterSummary {
        key: key.clone(),
        final_value: None,
        acknowledged: acked.len(),
        acknowledged_sum,
        unknown: unknown_count,
        sequence_checked: false,
    };

    if let Some(others) = writers.get(key) {
        verdict.undecided.push(CounterUndecided::MixedKey {
            key: key.clone(),
            others: others.iter().copied().collect(),
        });
        verdict.counters.push(summary);
        return;
    }
    let Some(final_value) = final_values.get(key) else {
        verdict
            .undecided
            .push(CounterUndecided::NoFinalValue { key: key.clone() });
        verdict.counters.push(summary);
        return;
    };
    let final_value = match final_value {
        None => 0,
        Some(bytes) => match std::str::from_utf8(bytes.as_slice())
            .ok()
            .and_then(|text| text.parse::<i64>().ok())
        {
            Some(value) => value,
            None => {
                verdict.violations.push(CounterViolation::NotAnInteger {
                    key: key.clone(),
                    value: bytes.clone(),
                });
                verdict.counters.push(summary);
                return;
            }
        },
    };
    summary.final_value = Some(final_value);

    let target = i128::from(final_value) - acknowledged_sum;
    match subset_sum(target, &unknown, options) {
        SubsetSum::Reachable => {}
        SubsetSum::Unreachable(why) => verdict.violations.push(CounterViolation::Unreachable {
            key: key.clone(),
            final_value,
            acknowledged_sum,
            unknown: unknown.clone(),
            why,
        }),
        SubsetSum::TooManyDistinct { distinct } => {
            verdict.undecided.push(CounterUndecided::TooManyDistinct {
                key: key.clone(),
                distinct,
                limit: options.max_distinct_unknown,
            });
        }
        SubsetSum::StepLimit => verdict.undecided.push(CounterUndecided::StepLimit {
            key: key.clone(),
            limit: options.max_steps,
        }),
    }

    let returned: Vec<(OpId, i64, i64)> = acked
        .iter()
        .filter_map(|&(op, by)| match op.outcome.reply() {
            Some(Reply::Incr { value }) => Some((op.id, *value, by)),
            _ => None,
        })
        .collect();
    let sequence = ops
        .iter()
        .all(|&(op, by)| by == 1 && op.outcome.class() != OutcomeClass::Unknown)
        && !acked.is_empty();
    if sequence {
        summary.sequence_checked = true;
        check_sequence(key, acked.len(), &returned, verdict);
    } else if ops.iter().all(|&(_, by)| by > 0) {
        check_positive(key, final_value, &returned, verdict);
    }
    verdict.counters.push(summary);
}

fn check_sequence(
    key: &Bytes,
    acknowledged: usize,
    returned: &[(OpId, i64, i64)],
    verdict: &mut CountersVerdict,
) {
    let n = i64::try_from(acknowledged).unwrap_or(i64::MAX);
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for &(_, value, _) in returned {
        *seen.entry(value).or_default() += 1;
    }
    let repeated: Vec<i64> = seen
        .iter()
        .filter(|&(_, &times)| times > 1)
        .map(|(&value, _)| value)
        .collect();
    let outside: Vec<i64> = seen
        .keys()
        .copied()
        .filter(|value| !(1..=n).contains(value))
        .collect();
    // Every returned value inside 1..=N covers one; the rest are missing.
    let mut missing = Vec::new();
    let mut expected = 1;
    for &value in seen.keys().filter(|value| (1..=n).contains(*value)) {
        missing.extend((expected..value).take(16));
        expected = value + 1;
    }
    missing.extend((expected..=n).take(16));
    missing.truncate(16);
    if !(missing.is_empty() && repeated.is_empty() && outside.is_empty()) {
        verdict.violations.push(CounterViolation::SequenceBroken {
            key: key.clone(),
            acknowledged,
            missing,
            repeated,
            outside,
        });
    }
}

fn check_positive(
    key: &Bytes,
    final_value: i64,
    returned: &[(OpId, i64, i64)],
    verdict: &mut CountersVerdict,
) {
    let mut by_value: BTreeMap<i64, Vec<OpId>> = BTreeMap::new();
    for &(op, value, by) in returned {
        by_value.entry(value).or_default().push(op);
        if value < by || value > final_value {
            verdict.violations.push(CounterViolation::ValueOutOfRange {
                key: key.clone(),
                value,
                op,
                min: by,
                max: final_value,
            });
        }
    }
    for (value, ops) in by_value {
        if ops.len() > 1 {
            verdict.violations.push(CounterViolation::RepeatedValue {
                key: key.clone(),
                value,
                ops,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{CheckerVerdict, Status};
    use crate::record::{FailReason, Outcome, RequestIdentity};

    fn incr(id: OpId, by: i64, outcome: Outcome) -> OpRecord {
        OpRecord {
            id,
            client: id % 3,
            op: Op::Incr {
                key: "c".into(),
                by,
            },
            request: RequestIdentity::session(1, id),
            invoke_ns: id * 10,
            complete_ns: Some(id * 10 + 5),
            attempts: 1,
            outcome,
        }
    }

    fn ok(value: i64) -> Outcome {
        Outcome::Ok {
            reply: Reply::Incr { value },
            canonical: None,
        }
    }

    fn unknown() -> Outcome {
        Outcome::Unknown { detail: None }
    }

    fn failed() -> Outcome {
        Outcome::Failed {
            reason: FailReason::SessionExpired,
            detail: None,
        }
    }

    fn run(ops: Vec<OpRecord>, final_value: Option<&str>) -> CountersVerdict {
        let record = Record {
            ops,
            ..Record::default()
        };
        let finals = BTreeMap::from([(Bytes::from("c"), final_value.map(Bytes::from))]);
        check(&record, &finals, &CountersOptions::default())
    }

    fn groups(pairs: &[(i64, u64)]) -> BTreeMap<i64, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn subset_sum_decides_small_cases() {
        let opts = CountersOptions::default();
        assert_eq!(subset_sum(0, &groups(&[]), &opts), SubsetSum::Reachable);
        assert!(matches!(
            subset_sum(1, &groups(&[]), &opts),
            SubsetSum::Unreachable(_)
        ));
        // Unit increments: a range check.
        assert_eq!(
            subset_sum(3, &groups(&[(1, 5)]), &opts),
            SubsetSum::Reachable
        );
        assert!(matches!(
            subset_sum(6, &groups(&[(1, 5)]), &opts),
            SubsetSum::Unreachable(_)
        ));
        assert!(matches!(
            subset_sum(-1, &groups(&[(1, 5)]), &opts),
            SubsetSum::Unreachable(_)
        ));
        // 3 and 5: 8 = 3 + 5, 11 = 3+3+5, but 7 is not reachable with one 5.
        let g = groups(&[(3, 2), (5, 1)]);
        assert_eq!(subset_sum(8, &g, &opts), SubsetSum::Reachable);
        assert_eq!(subset_sum(11, &g, &opts), SubsetSum::Reachable);
        assert!(matches!(
            subset_sum(7, &g, &opts),
            SubsetSum::Unreachable(_)
        ));
        // Mixed signs.
        let g = groups(&[(-4, 1), (3, 3)]);
        assert_eq!(subset_sum(5, &g, &opts), SubsetSum::Reachable);
        assert_eq!(subset_sum(-1, &g, &opts), SubsetSum::Reachable);
        assert!(matches!(
            subset_sum(4, &g, &opts),
            SubsetSum::Unreachable(_)
        ));
        // Divisibility proves failure without searching.
        assert!(matches!(
            subset_sum(5, &groups(&[(2, 100), (4, 100)]), &opts),
            SubsetSum::Unreachable(_)
        ));
    }

    #[test]
    fn subset_sum_agrees_with_enumeration() {
        let opts = CountersOptions::default();
        let g = groups(&[(2, 2), (5, 1), (-3, 2), (7, 1)]);
        let items: Vec<i64> = g
            .iter()
            .flat_map(|(&size, &count)| std::iter::repeat_n(size, count as usize))
            .collect();
        let mut reachable = BTreeSet::new();
        for mask in 0u32..(1 << items.len()) {
            let sum: i64 = (0..items.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| items[i])
                .sum();
            reachable.insert(sum);
        }
        for target in -10..=25 {
            let got = subset_sum(i128::from(target), &g, &opts);
            assert_eq!(
                got == SubsetSum::Reachable,
                reachable.contains(&target),
                "target {target}: {got:?}"
            );
        }
    }

    #[test]
    fn subset_sum_gives_up_instead_of_passing() {
        let many: BTreeMap<i64, u64> = (1..=70).map(|size| (size * 1000 + 1, 1)).collect();
        let target: i128 = many.keys().take(35).map(|&v| i128::from(v)).sum();
        assert_eq!(
            subset_sum(target, &many, &CountersOptions::default()),
            SubsetSum::TooManyDistinct { distinct: 70 }
        );
        let few: BTreeMap<i64, u64> = (1..=20).map(|size| (size * 1000 + 1, 1)).collect();
        let target: i128 = few.keys().take(10).map(|&v| i128::from(v)).sum();
        let tight = CountersOptions {
            max_steps: 100,
            ..CountersOptions::default()
        };
        assert_eq!(subset_sum(target, &few, &tight), SubsetSum::StepLimit);
        assert_eq!(
            subset_sum(target, &few, &CountersOptions::default()),
            SubsetSum::Reachable
        );
    }

    #[test]
    fn acknowledged_plus_some_unknown_passes() {
        let ops = vec![
            incr(1, 1, ok(1)),
            incr(2, 1, unknown()),
            incr(3, 1, ok(3)),
            incr(4, 1, failed()),
            incr(5, 1, unknown()),
        ];
        // 2 acknowledged, up to 2 unknown: 2, 3 and 4 are fine.
        for fin in ["3", "4"] {
            let verdict = run(ops.clone(), Some(fin));
            assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        }
        let verdict = run(ops.clone(), Some("5"));
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [CounterViolation::Unreachable { final_value: 5, .. }]
            ),
            "{verdict}"
        );
        // 2 would mean the increment that returned 3 saw a value nobody made.
        let verdict = run(ops, Some("2"));
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, CounterViolation::ValueOutOfRange { value: 3, .. })),
            "{verdict}"
        );
    }

    #[test]
    fn a_lost_increment_fails() {
        let ops = vec![incr(1, 5, ok(5)), incr(2, 5, ok(10))];
        let verdict = run(ops, Some("5"));
        assert_eq!(verdict.status(), Status::Fail, "{verdict}");
    }

    #[test]
    fn a_double_applied_increment_fails() {
        let ops = vec![incr(1, 2, ok(2)), incr(2, 3, ok(5)), incr(3, 4, unknown())];
        assert_eq!(run(ops.clone(), Some("5")).status(), Status::Pass);
        assert_eq!(run(ops.clone(), Some("9")).status(), Status::Pass);
        let verdict = run(ops, Some("8"));
        assert_eq!(verdict.status(), Status::Fail, "{verdict}");
    }

    #[test]
    fn session_counters_return_exactly_one_to_n() {
        let good = vec![
            incr(1, 1, ok(2)),
            incr(2, 1, ok(1)),
            incr(3, 1, failed()),
            incr(4, 1, ok(3)),
        ];
        let verdict = run(good.clone(), Some("3"));
        assert_eq!(verdict.status(), Status::Pass, "{verdict}");
        assert!(verdict.counters[0].sequence_checked);

        let mut repeat = good.clone();
        repeat[0].outcome = ok(1);
        let verdict = run(repeat, Some("3"));
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [CounterViolation::SequenceBroken { missing, repeated, .. }]
                    if missing == &vec![2] && repeated == &vec![1]
            ),
            "{verdict}"
        );

        let mut gap = good;
        gap[3].outcome = ok(4);
        let verdict = run(gap, Some("3"));
        assert!(
            matches!(
                verdict.violations.as_slice(),
                [CounterViolation::SequenceBroken { missing, outside, .. }]
                    if missing == &vec![3] && outside == &vec![4]
            ),
            "{verdict}"
        );
    }

    #[test]
    fn repeated_values_fail_for_positive_increments() {
        let ops = vec![incr(1, 2, ok(2)), incr(2, 2, ok(2)), incr(3, 2, unknown())];
        let verdict = run(ops, Some("4"));
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| matches!(v, CounterViolation::RepeatedValue { value: 2, .. })),
            "{verdict}"
        );
    }

    #[test]
    fn unreadable_or_unread_counters() {
        let ops = vec![incr(1, 1, ok(1))];
        let verdict = run(ops.clone(), Some("one"));
        assert!(matches!(
            verdict.violations.as_slice(),
            [CounterViolation::NotAnInteger { .. }]
        ));
        let record = Record {
            ops: ops.clone(),
            ..Record::default()
        };
        let verdict = check(&record, &BTreeMap::new(), &CountersOptions::default());
        assert_eq!(verdict.status(), Status::Undecided);
        // Absent counts as zero: the acknowledged increment is lost.
        assert_eq!(run(ops, None).status(), Status::Fail);
    }

    #[test]
    fn too_many_distinct_unknown_increments_is_undecided() {
        let mut ops = vec![incr(1, 1, ok(1))];
        ops.extend((2..80).map(|id| incr(id, (id as i64) * 1000 + 1, unknown())));
        let verdict = run(ops, Some("2001"));
        assert_eq!(verdict.status(), Status::Undecided, "{verdict}");
        assert!(matches!(
            verdict.undecided.as_slice(),
            [CounterUndecided::TooManyDistinct { .. }]
        ));
    }
}
