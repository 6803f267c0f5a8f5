//! Cross-checks the search against a brute-force reference on many small
//! random histories: the reference tries every subset of the unknown-outcome
//! operations and every ordering that respects real time, applying each to a
//! plain map of registers.

use oncekv_check::{Bounds, Call, History, Operation, Output, Value, check};
use std::collections::BTreeMap;

/// A small deterministic generator (SplitMix64), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn value(&mut self) -> Value {
        (1 + self.below(3)).to_string().into_bytes()
    }

    fn maybe_value(&mut self) -> Option<Value> {
        if self.chance(25) {
            None
        } else {
            Some(self.value())
        }
    }
}

type Registers = BTreeMap<Vec<u8>, Value>;

/// Applies `op` to `registers` as the reference model sees it; `false` when
/// its known output contradicts the state.
fn apply(op: &Operation, registers: &mut Registers) -> bool {
    let current = registers.get(&op.key).cloned();
    match (&op.call, &op.output) {
        (Call::Read, Some(Output::Read(seen))) => *seen == current,
        (Call::Read, _) => true,
        (Call::Write(value), _) => {
            registers.insert(op.key.clone(), value.clone());
            true
        }
        (Call::Cas { expected, new }, output) => {
            let matches = *expected == current;
            if matches {
                registers.insert(op.key.clone(), new.clone());
            }
            match output {
                Some(Output::Cas { swapped }) => *swapped == matches,
                // An unknown compare-and-set that ran did whatever its
                // comparison said.
                _ => true,
            }
        }
    }
}

/// Whether `a` must precede `b` in real time.
fn precedes(a: &Operation, b: &Operation) -> bool {
    match (&a.output, a.complete_ns) {
        (Some(_), Some(done)) => done < b.invoke_ns,
        _ => false,
    }
}

fn orderings(ops: &[&Operation], used: &mut Vec<bool>, registers: &Registers) -> bool {
    if used.iter().all(|&u| u) {
        return true;
    }
    for next in 0..ops.len() {
        if used[next] {
            continue;
        }
        // Every unused operation that must precede `next` blocks it.
        let blocked = (0..ops.len()).any(|other| !used[other] && precedes(ops[other], ops[next]));
        if blocked {
            continue;
        }
        let mut after = registers.clone();
        if apply(ops[next], &mut after) {
            used[next] = true;
            let found = orderings(ops, used, &after);
            used[next] = false;
            if found {
                return true;
            }
        }
    }
    false
}

fn reference(history: &History) -> bool {
    let ops = history.operations();
    let unknown: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].output.is_none())
        .collect();
    (0u32..1 << unknown.len()).any(|subset| {
        let chosen: Vec<&Operation> = ops
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
        orderings(&chosen, &mut vec![false; chosen.len()], &Registers::new())
    })
}

/// A random history; when `honest`, outputs come from actually executing
/// the operations at random points inside their intervals, so the history
/// is linearizable unless later corrupted.
fn random_history(rng: &mut Rng, honest: bool) -> History {
    let count = 1 + rng.below(7) as usize;
    let keys = 1 + rng.below(2);
    let mut ops = Vec::new();
    let mut points = Vec::new();
    for client in 0..count as u64 {
        let invoke = rng.below(12);
        let complete = invoke + rng.below(6);
        let call = match rng.below(3) {
            0 => Call::Read,
            1 => Call::Write(rng.value()),
            _ => Call::Cas {
                expected: rng.maybe_value(),
                new: rng.value(),
            },
        };
        let output = match &call {
            Call::Read => Output::Read(rng.maybe_value()),
            Call::Write(_) => Output::Write,
            Call::Cas { .. } => Output::Cas {
                swapped: rng.chance(50),
            },
        };
        // Linearization point, scaled so ties inside an interval resolve.
        points.push((invoke * 8 + rng.below((complete - invoke) * 8 + 1), client));
        ops.push(Operation {
            client,
            key: rng.below(keys).to_string().into_bytes(),
            call,
            output: Some(output),
            invoke_ns: invoke,
            complete_ns: Some(complete),
        });
    }
    if honest {
        points.sort_unstable();
        let mut registers = Registers::new();
        for &(_, client) in &points {
            let op = &mut ops[client as usize];
            let current = registers.get(&op.key).cloned();
            match &op.call {
                Call::Read => op.output = Some(Output::Read(current)),
                Call::Write(value) => {
                    registers.insert(op.key.clone(), value.clone());
                }
                Call::Cas { expected, new } => {
                    let swapped = *expected == current;
                    if swapped {
                        registers.insert(op.key.clone(), new.clone());
                    }
                    op.output = Some(Output::Cas { swapped });
                }
            }
        }
        if rng.chance(30) {
            let victim = rng.below(count as u64) as usize;
            ops[victim].output = match &ops[victim].call {
                Call::Read => Some(Output::Read(rng.maybe_value())),
                Call::Write(_) => Some(Output::Write),
                Call::Cas { .. } => Some(Output::Cas {
                    swapped: rng.chance(50),
                }),
            };
        }
    }
    // Some outcomes become unknown.
    for op in &mut ops {
        if rng.chance(20) {
            op.output = None;
            if rng.chance(50) {
                op.complete_ns = None;
            }
        }
    }
    History::new(ops).unwrap_or_else(|err| panic!("generated an invalid history: {err}"))
}

#[test]
fn search_agrees_with_brute_force() {
    let mut rng = Rng(0x5eed);
    let (mut good, mut bad) = (0, 0);
    for round in 0..4000 {
        let history = random_history(&mut rng, round % 2 == 0);
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
    // Both outcomes must be well represented for the comparison to mean
    // anything.
    assert!(good > 1000 && bad > 1000, "{good} linearizable, {bad} not");
}
