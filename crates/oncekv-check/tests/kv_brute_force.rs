//! Cross-checks the KV search against a brute-force reference on many
//! small random histories (gets, puts, deletes, appends, incrs, cas, prefix
//! and range reads and deletes, puts of existing keys, and transactions
//! over several keys): the reference
//! tries every subset of the unknown-outcome operations and every ordering
//! that respects real time, running each on a plain map with its own,
//! independent implementation of the store's semantics.
//!
//! Compares on values and existence are decided exactly by both, so the
//! verdicts must agree. Version compares are not modelled by the checker
//! (it lets them go either way); the reference tracks real versions, so
//! there the checker must accept whatever the reference accepts.

mod common;

use common::{Rng, agree};
use oncekv_check::kv_history::{KvCall, KvHistory, KvOperation, KvOutput};
use oncekv_check::record::{
    Bytes, Compare, CompareOp, CompareTarget, KeyRange, KeyValue, Txn, TxnOp, TxnOpResult,
};
use oncekv_check::{Bounds, check};
use std::collections::BTreeMap;

impl Rng {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    fn key(&mut self) -> Bytes {
        Bytes::from(self.pick(&["a", "b", "p/1", "p/2"]))
    }

    fn value(&mut self) -> Bytes {
        Bytes::from(self.pick(&["1", "2", "x"]))
    }

    fn maybe_value(&mut self) -> Option<Bytes> {
        if self.chance(30) {
            None
        } else {
            Some(self.value())
        }
    }

    /// A range over the keys [`key`](Self::key) draws: some empty, some
    /// without an end.
    fn span(&mut self) -> (Bytes, Option<Bytes>) {
        let start = Bytes::from(self.pick(&["a", "b", "p/", "p/2"]));
        let end = match self.below(4) {
            0 => None,
            _ => Some(Bytes::from(self.pick(&["b", "p/2", "q"]))),
        };
        (start, end)
    }

    fn single(&mut self) -> TxnOp {
        match self.below(12) {
            0 | 1 => TxnOp::Get { key: self.key() },
            2 => TxnOp::Put {
                key: self.key(),
                value: self.value(),
            },
            3 => TxnOp::Delete { key: self.key() },
            4 => TxnOp::Append {
                key: self.key(),
                value: self.value(),
            },
            5 => TxnOp::Incr {
                key: self.key(),
                by: 1 + self.below(2) as i64,
            },
            6 => TxnOp::Cas {
                key: self.key(),
                expected: self.maybe_value(),
                new: self.value(),
            },
            7 => TxnOp::GetPrefix {
                prefix: Bytes::from("p/"),
            },
            8 => TxnOp::DeletePrefix {
                prefix: Bytes::from("p/"),
            },
            9 => {
                let (start, end) = self.span();
                TxnOp::GetRange { start, end }
            }
            10 => {
                let (start, end) = self.span();
                TxnOp::DeleteRange { start, end }
            }
            _ => TxnOp::PutExisting {
                key: self.key(),
                value: self.maybe_value(),
            },
        }
    }

    fn compare(&mut self, versions: bool) -> Compare {
        let range = match self.below(10) {
            0 | 1 => KeyRange::Prefix(Bytes::from("p/")),
            2 | 3 => {
                let (start, end) = self.span();
                KeyRange::Range { start, end }
            }
            _ => KeyRange::Key(self.key()),
        };
        let op = match self.below(4) {
            0 => CompareOp::Equal,
            1 => CompareOp::NotEqual,
            2 => CompareOp::Less,
            _ => CompareOp::Greater,
        };
        let target = match self.below(if versions { 3 } else { 2 }) {
            0 => CompareTarget::Value(self.value()),
            1 => CompareTarget::Exists(self.chance(50)),
            _ => CompareTarget::Version(self.below(3)),
        };
        Compare { range, op, target }
    }

    fn call(&mut self, versions: bool) -> KvCall {
        if self.chance(65) {
            return KvCall::Op(self.single());
        }
        let compares = (0..self.below(3)).map(|_| self.compare(versions)).collect();
        let success = (0..1 + self.below(2)).map(|_| self.single()).collect();
        let failure = (0..self.below(2)).map(|_| self.single()).collect();
        KvCall::Txn(Txn {
            compares,
            success,
            failure,
        })
    }
}

/// The reference store: each key's value and version (writes since it was
/// created).
type Store = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

fn write(store: &mut Store, key: &Bytes, value: Vec<u8>) {
    let version = store.get(key.as_slice()).map_or(0, |(_, v)| *v);
    store.insert(key.0.clone(), (value, version + 1));
}

/// Runs `op`; `None` when the store refuses it (incr of a non-number or an
/// overflow).
fn run_op(op: &TxnOp, store: &mut Store) -> Option<TxnOpResult> {
    let get = |store: &Store, key: &Bytes| store.get(key.as_slice()).map(|(v, _)| Bytes(v.clone()));
    let within = |store: &Store, range: &KeyRange| -> Vec<Vec<u8>> {
        store
            .keys()
            .filter(|k| range.contains(k))
            .cloned()
            .collect()
    };
    let under = |store: &Store, prefix: &Bytes| within(store, &KeyRange::Prefix(prefix.clone()));
    let span = |start: &Bytes, end: &Option<Bytes>| KeyRange::Range {
        start: start.clone(),
        end: end.clone(),
    };
    let entries = |store: &Store, keys: Vec<Vec<u8>>| -> Vec<KeyValue> {
        keys.into_iter()
            .map(|key| KeyValue {
                value: get(store, &Bytes(key.clone())).unwrap_or_default(),
                key: Bytes(key),
            })
            .collect()
    };
    Some(match op {
        TxnOp::Get { key } => TxnOpResult::Get {
            value: get(store, key),
        },
        TxnOp::Put { key, value } => {
            let previous = get(store, key);
            write(store, key, value.0.clone());
            TxnOpResult::Put { previous }
        }
        TxnOp::Delete { key } => TxnOpResult::Delete {
            previous: store.remove(key.as_slice()).map(|(v, _)| Bytes(v)),
        },
        TxnOp::Append { key, value } => {
            let mut bytes = get(store, key).map(|b| b.0).unwrap_or_default();
            bytes.extend_from_slice(value.as_slice());
            let length = bytes.len() as u64;
            write(store, key, bytes);
            TxnOpResult::Append { length }
        }
        TxnOp::Incr { key, by } => {
            let current: i64 = match get(store, key) {
                None => 0,
                Some(bytes) => String::from_utf8(bytes.0).ok()?.parse().ok()?,
            };
            let value = current.checked_add(*by)?;
            write(store, key, value.to_string().into_bytes());
            TxnOpResult::Incr { value }
        }
        TxnOp::Cas { key, expected, new } => {
            let current = get(store, key);
            if current == *expected {
                write(store, key, new.0.clone());
                TxnOpResult::Cas {
                    swapped: true,
                    current: Some(new.clone()),
                }
            } else {
                TxnOpResult::Cas {
                    swapped: false,
                    current,
                }
            }
        }
        TxnOp::GetPrefix { prefix } => TxnOpResult::GetPrefix {
            entries: entries(store, under(store, prefix)),
        },
        TxnOp::GetRange { start, end } => TxnOpResult::GetPrefix {
            entries: entries(store, within(store, &span(start, end))),
        },
        TxnOp::DeletePrefix { prefix } => {
            let keys = under(store, prefix);
            for key in &keys {
                store.remove(key);
            }
            TxnOpResult::DeletePrefix {
                deleted: keys.len() as u64,
            }
        }
        TxnOp::DeleteRange { start, end } => {
            let keys = within(store, &span(start, end));
            for key in &keys {
                store.remove(key);
            }
            TxnOpResult::DeletePrefix {
                deleted: keys.len() as u64,
            }
        }
        TxnOp::PutExisting { key, value } => {
            // Refused when the key is absent.
            let previous = get(store, key)?;
            let value = value.clone().unwrap_or_else(|| previous.clone());
            write(store, key, value.0);
            TxnOpResult::Put {
                previous: Some(previous),
            }
        }
        // Not generated: the model does not replay nested transactions.
        TxnOp::Txn { .. } => return None,
    })
}

fn relates(op: CompareOp, ordering: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        CompareOp::Equal => ordering == Equal,
        CompareOp::NotEqual => ordering != Equal,
        CompareOp::Less => ordering == Less,
        CompareOp::Greater => ordering == Greater,
    }
}

/// One key's compare (`None`: absent), etcd-style: a value compare on an
/// absent key is false, its version is 0.
fn compare_one(compare: &Compare, entry: Option<&(Vec<u8>, u64)>) -> bool {
    match (&compare.target, entry) {
        (CompareTarget::Value(_), None) => false,
        (CompareTarget::Value(operand), Some((value, _))) => {
            relates(compare.op, value.as_slice().cmp(operand.as_slice()))
        }
        (CompareTarget::Exists(operand), entry) => {
            relates(compare.op, entry.is_some().cmp(operand))
        }
        (CompareTarget::Version(operand), entry) => {
            relates(compare.op, entry.map_or(0, |(_, v)| *v).cmp(operand))
        }
        (
            CompareTarget::CreateRevision(_)
            | CompareTarget::ModRevision(_)
            | CompareTarget::Lease(_),
            _,
        ) => unreachable!("not generated"),
    }
}

fn compare_holds(compare: &Compare, store: &Store) -> bool {
    match &compare.range {
        KeyRange::Key(key) => compare_one(compare, store.get(key.as_slice())),
        KeyRange::Prefix(_) | KeyRange::Range { .. } => {
            let present: Vec<&(Vec<u8>, u64)> = store
                .iter()
                .filter(|(k, _)| compare.range.contains(k))
                .map(|(_, e)| e)
                .collect();
            match &compare.target {
                CompareTarget::Exists(operand) => {
                    relates(compare.op, (!present.is_empty()).cmp(operand))
                }
                _ if present.is_empty() => compare_one(compare, None),
                _ => present.iter().all(|e| compare_one(compare, Some(e))),
            }
        }
    }
}

/// Runs `call`; `None` when refused (nothing changes).
fn run_call(call: &KvCall, store: &mut Store) -> Option<KvOutput> {
    match call {
        KvCall::Op(op) => run_op(op, store).map(KvOutput::Op),
        KvCall::Txn(txn) => {
            let succeeded = txn.compares.iter().all(|c| compare_holds(c, store));
            let mut scratch = store.clone();
            let results = txn
                .branch(succeeded)
                .iter()
                .map(|op| run_op(op, &mut scratch))
                .collect::<Option<Vec<_>>>()?;
            *store = scratch;
            Some(KvOutput::Txn { succeeded, results })
        }
    }
}

/// Whether `op`, run on `store`, gives its output (any, when unknown).
fn fits(op: &KvOperation, store: &mut Store) -> bool {
    match (&op.output, run_call(&op.call, store)) {
        (None, result) => result.is_some(),
        (Some(expected), Some(actual)) => *expected == actual,
        (Some(_), None) => false,
    }
}

fn reference(history: &KvHistory) -> bool {
    common::reference(history.operations(), &Store::new(), fits)
}

/// A random history; when `honest`, outputs come from running the
/// operations at random points inside their intervals, so the history is
/// linearizable unless later corrupted.
fn random_history(rng: &mut Rng, honest: bool, versions: bool) -> KvHistory {
    let count = 1 + rng.below(6) as usize;
    let mut ops = Vec::new();
    let mut points = Vec::new();
    for client in 0..count as u64 {
        let invoke = rng.below(12);
        let complete = invoke + rng.below(6);
        points.push((invoke * 8 + rng.below((complete - invoke) * 8 + 1), client));
        // Repeated calls exercise the search's interchangeable classes.
        let call = match ops.len() as u64 {
            0 => rng.call(versions),
            earlier if rng.chance(35) => {
                let KvOperation { call, .. } = &ops[rng.below(earlier) as usize];
                call.clone()
            }
            _ => rng.call(versions),
        };
        ops.push(KvOperation {
            client,
            call,
            output: None,
            invoke_ns: invoke,
            complete_ns: Some(complete),
        });
    }
    // Outputs from a sequential run in linearization-point order (honest)
    // or in an order that ignores real time (often impossible).
    if !honest {
        points = ops.iter().map(|op| (rng.below(100), op.client)).collect();
    }
    points.sort_unstable();
    let mut store = Store::new();
    let mut refused = vec![false; count];
    for &(_, client) in &points {
        let op = &mut ops[client as usize];
        match run_call(&op.call, &mut store) {
            Some(output) => op.output = Some(output),
            None => refused[client as usize] = true,
        }
    }
    if rng.chance(if honest { 30 } else { 60 }) {
        // Corrupt one output a little.
        let victim = rng.below(count as u64) as usize;
        if let Some(KvOutput::Op(result)) = &mut ops[victim].output {
            match result {
                TxnOpResult::Get { value } => *value = rng.maybe_value(),
                TxnOpResult::Append { length } => *length += 1,
                TxnOpResult::Incr { value } => *value += 1,
                TxnOpResult::Put { previous } | TxnOpResult::Delete { previous } => {
                    *previous = rng.maybe_value();
                }
                TxnOpResult::Cas { swapped, .. } => *swapped = !*swapped,
                TxnOpResult::DeletePrefix { deleted } => *deleted += 1,
                TxnOpResult::GetPrefix { entries } => {
                    entries.pop();
                }
                TxnOpResult::Txn { succeeded, .. } => *succeeded = !*succeeded,
            }
        }
        if let Some(KvOutput::Txn { results, .. }) = &mut ops[victim].output
            && let Some(TxnOpResult::Get { value }) = results.first_mut()
        {
            *value = rng.maybe_value();
        }
    }
    // Refused operations are dropped, as the record checker drops them.
    let mut kept = Vec::new();
    for (i, mut op) in ops.into_iter().enumerate() {
        if refused[i] {
            continue;
        }
        if rng.chance(30) {
            op.output = None;
            if rng.chance(50) {
                op.complete_ns = None;
            }
        }
        kept.push(op);
    }
    KvHistory::new(kept).unwrap_or_else(|err| panic!("generated an invalid history: {err}"))
}

#[test]
fn kv_search_agrees_with_brute_force() {
    let mut rng = Rng(0x6b76);
    let (good, bad) = agree(
        6000,
        |round| random_history(&mut rng, round % 2 == 0, false),
        reference,
    );
    // Both outcomes must be well represented for the comparison to mean
    // anything.
    assert!(good > 2000 && bad > 1000, "{good} linearizable, {bad} not");
}

#[test]
fn kv_search_accepts_whatever_the_versioned_reference_accepts() {
    let mut rng = Rng(0x7665);
    let mut accepted = 0;
    for round in 0..1500 {
        let history = random_history(&mut rng, round % 2 == 0, true);
        let verdict = check(&history, &Bounds::default());
        assert!(!verdict.is_unknown(), "round {round}: {verdict}");
        if reference(&history) {
            accepted += 1;
            assert!(
                verdict.is_linearizable(),
                "round {round}: the reference found an order, the search says {}\n{:#?}",
                verdict.describe(&history),
                history.operations()
            );
        }
    }
    assert!(accepted > 300, "{accepted}");
}
