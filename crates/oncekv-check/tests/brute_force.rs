//! Cross-checks the search against a brute-force reference on many small
//! random histories: the reference tries every subset of the unknown-outcome
//! operations and every ordering that respects real time, applying each to a
//! plain map of registers.

mod common;

use common::{Rng, agree};
use oncekv_check::{Call, History, Operation, Output, RegisterOperation, Value};
use std::collections::BTreeMap;

impl Rng {
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
fn apply(op: &RegisterOperation, registers: &mut Registers) -> bool {
    let current = registers.get(op.call.key()).cloned();
    match (&op.call, &op.output) {
        (Call::Read { .. }, Some(Output::Read(seen))) => *seen == current,
        (Call::Read { .. }, _) => true,
        (Call::Write { key, value }, _) => {
            registers.insert(key.clone(), value.clone());
            true
        }
        (Call::Cas { key, expected, new }, output) => {
            let matches = *expected == current;
            if matches {
                registers.insert(key.clone(), new.clone());
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

fn reference(history: &History<Call>) -> bool {
    common::reference(history.operations(), &Registers::new(), apply)
}

/// A random history; when `honest`, outputs come from actually executing
/// the operations at random points inside their intervals, so the history
/// is linearizable unless later corrupted.
fn random_history(rng: &mut Rng, honest: bool) -> History<Call> {
    let count = 1 + rng.below(7) as usize;
    let keys = 1 + rng.below(2);
    let mut ops = Vec::new();
    let mut points = Vec::new();
    for client in 0..count as u64 {
        let invoke = rng.below(12);
        let complete = invoke + rng.below(6);
        // Drawn in a fixed order: the call's values, its output, its
        // linearization point, its key.
        let kind = rng.below(3);
        let expected = (kind == 2).then(|| rng.maybe_value());
        let value = (kind != 0).then(|| rng.value());
        let output = match kind {
            0 => Output::Read(rng.maybe_value()),
            1 => Output::Write,
            _ => Output::Cas {
                swapped: rng.chance(50),
            },
        };
        // Linearization point, scaled so ties inside an interval resolve.
        points.push((invoke * 8 + rng.below((complete - invoke) * 8 + 1), client));
        let key = rng.below(keys).to_string().into_bytes();
        let call = match (expected, value) {
            (Some(expected), Some(new)) => Call::Cas { key, expected, new },
            (None, Some(value)) => Call::Write { key, value },
            _ => Call::Read { key },
        };
        ops.push(Operation {
            client,
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
            let current = registers.get(op.call.key()).cloned();
            match &op.call {
                Call::Read { .. } => op.output = Some(Output::Read(current)),
                Call::Write { key, value } => {
                    registers.insert(key.clone(), value.clone());
                }
                Call::Cas { key, expected, new } => {
                    let swapped = *expected == current;
                    if swapped {
                        registers.insert(key.clone(), new.clone());
                    }
                    op.output = Some(Output::Cas { swapped });
                }
            }
        }
        if rng.chance(30) {
            let victim = rng.below(count as u64) as usize;
            ops[victim].output = match &ops[victim].call {
                Call::Read { .. } => Some(Output::Read(rng.maybe_value())),
                Call::Write { .. } => Some(Output::Write),
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
    let (good, bad) = agree(
        4000,
        |round| random_history(&mut rng, round % 2 == 0),
        reference,
    );
    // Both outcomes must be well represented for the comparison to mean
    // anything.
    assert!(good > 1000 && bad > 1000, "{good} linearizable, {bad} not");
}
