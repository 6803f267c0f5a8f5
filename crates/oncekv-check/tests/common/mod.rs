//! What the test binaries share: a deterministic generator and the
//! brute-force reference the searches are cross-checked against, and the
//! assertions on checker verdicts. Each binary uses only part of it.
#![allow(dead_code)]

use oncekv_check::checkers::{CheckerVerdict, Status};
use oncekv_check::{Bounds, History, Linearizable, Operation, check};
use std::fmt::{Debug, Display};

/// A small deterministic generator (SplitMix64), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Whether `chosen` can be ordered, respecting real time, so that each
/// operation `fits` the state the ones before it left (`fits` applies it).
fn orderings<C, R, S: Clone>(
    chosen: &[&Operation<C, R>],
    used: &mut Vec<bool>,
    state: &S,
    fits: &impl Fn(&Operation<C, R>, &mut S) -> bool,
) -> bool {
    if used.iter().all(|&u| u) {
        return true;
    }
    let end = |op: &Operation<C, R>| match (&op.output, op.complete_ns) {
        (Some(_), Some(at)) => at,
        _ => u64::MAX,
    };
    for next in 0..chosen.len() {
        if used[next] {
            continue;
        }
        // Nothing still unplaced may have completed before `next` began.
        let blocked = (0..chosen.len())
            .any(|other| !used[other] && end(chosen[other]) < chosen[next].invoke_ns);
        if blocked {
            continue;
        }
        let mut after = state.clone();
        if !fits(chosen[next], &mut after) {
            continue;
        }
        used[next] = true;
        let found = orderings(chosen, used, &after, fits);
        used[next] = false;
        if found {
            return true;
        }
    }
    false
}

/// The brute-force reference: whether some subset of the unknown-outcome
/// operations, with every completed one, has an order respecting real
/// time in which each operation `fits` (applied to a state that starts as
/// `initial`).
pub fn reference<C, R, S: Clone>(
    ops: &[Operation<C, R>],
    initial: &S,
    fits: impl Fn(&Operation<C, R>, &mut S) -> bool,
) -> bool {
    let unknown: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].output.is_none())
        .collect();
    (0u32..1 << unknown.len()).any(|subset| {
        let chosen: Vec<&Operation<C, R>> = ops
            .iter()
            .enumerate()
            .filter(|(i, op)| {
                op.output.is_some()
                    || unknown
                        .iter()
                        .position(|u| u == i)
                        .is_some_and(|bit| subset & (1 << bit) != 0)
            })
            .map(|(_, op)| op)
            .collect();
        orderings(&chosen, &mut vec![false; chosen.len()], initial, &fits)
    })
}

/// Checks `rounds` histories made by `history` (given the round) with the
/// default bounds, asserting that the search decides each as `reference`
/// does; returns how many were linearizable and how many not.
pub fn agree<C>(
    rounds: usize,
    mut history: impl FnMut(usize) -> History<C>,
    reference: impl Fn(&History<C>) -> bool,
) -> (usize, usize)
where
    C: Linearizable + Debug,
    C::Output: Debug,
{
    let (mut good, mut bad) = (0, 0);
    for round in 0..rounds {
        let history = history(round);
        let expected = reference(&history);
        let verdict = check(&history, &Bounds::default());
        assert!(
            !verdict.is_unknown(),
            "round {round}: undecided on a tiny history: {verdict}"
        );
        assert_eq!(
            verdict.is_linearizable(),
            expected,
            "round {round}: reference says {expected}, search says {}\n{:#?}",
            verdict.describe(&history),
            history.operations()
        );
        if expected {
            good += 1;
        } else {
            bad += 1;
        }
    }
    (good, bad)
}

/// Asserts that a checker concluded `status`, showing its explanation
/// otherwise.
pub fn assert_status(verdict: &(impl CheckerVerdict + Display), status: Status) {
    assert_eq!(verdict.status(), status, "{verdict}");
}
