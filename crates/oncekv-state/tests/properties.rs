//! Property tests of the state machine: determinism across replicas,
//! snapshot/restore transparency, replays that change nothing, and
//! exactly-once appends under random duplicate and reordered delivery;
//! the history reconstructs every revision it still covers (key ranges
//! included, paged and counted), its events replayed rebuild the store,
//! a refused transaction changes nothing, and a transaction with nested
//! ones runs as the flat transaction of the path it takes.

use oncekv_state::{
    ClusterTime, Command, Compare, CompareOp, CompareTarget, Entry, IdempotencyKey, KeyRange,
    KeyScope, KeyValue, Limits, LogIndex, Origin, Outcome, Proposal, Query, Reply, Request,
    RequestHeader, RequestId, Secret, Seq, SessionId, StateMachine, Txn, TxnOp, Update,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn limits() -> Limits {
    Limits {
        sessions_max: 3,
        idempotency_keys_max: 3,
        kv_keys_max: 6,
        leases_max: 2,
        value_bytes_max: 64,
        idempotency_key_ttl_ms: 3_000,
        history_events_max: 12,
        history_retention_ms: 2_000,
        ..Limits::default()
    }
}

/// A step of a random log, before it is turned into entries.
#[derive(Clone, Debug)]
enum Step {
    Open {
        ttl_ms: u64,
        window: u32,
    },
    Advance(u64),
    Request {
        origin: OriginChoice,
        command: Command,
    },
}

#[derive(Clone, Debug)]
enum OriginChoice {
    Plain,
    Session {
        slot: usize,
        seq: u64,
        ack_back: u64,
        good_secret: bool,
    },
    Key(u8),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"a".to_vec()),
        Just(b"b".to_vec()),
        Just(b"c".to_vec()),
        Just(b"n".to_vec())
    ]
}

/// A range over the keys [`key`] draws, from any of them (or the empty
/// key) to any of them or to the end: some backwards, so empty.
fn key_range() -> impl Strategy<Value = KeyRange> {
    let start = prop_oneof![Just(Vec::new()), key()];
    (start, prop::option::of(key())).prop_map(|(start, end)| KeyRange { start, end })
}

fn command() -> impl Strategy<Value = Command> {
    let lease = prop_oneof![Just("l1".to_string()), Just("l2".to_string())];
    prop_oneof![
        (
            key(),
            prop::collection::vec(any::<u8>(), 0..4),
            prop::option::of(lease.clone())
        )
            .prop_map(|(key, value, lease)| Command::Put {
                key,
                value: value.into(),
                lease
            }),
        key().prop_map(|key| Command::Delete { key }),
        (key(), prop::collection::vec(b'a'..=b'z', 1..8))
            .prop_map(|(key, value)| Command::Append { key, value }),
        (key(), -3i64..5).prop_map(|(key, by)| Command::Incr { key, by }),
        (
            key(),
            prop::option::of(Just(b"1".to_vec())),
            Just(b"x".to_vec())
        )
            .prop_map(|(key, expected, new)| Command::Cas { key, expected, new }),
        (lease.clone(), 200u64..2_000)
            .prop_map(|(name, ttl_ms)| Command::LeaseGrant { name, ttl_ms }),
        lease
            .clone()
            .prop_map(|name| Command::LeaseKeepAlive { name }),
        lease.prop_map(|name| Command::LeaseRevoke { name }),
        key().prop_map(|key| Command::Read(Query::Get { key })),
        Just(Command::Read(Query::Scan {
            prefix: vec![],
            limit: 0
        })),
        Just(Command::Tick),
        txn().prop_map(Command::Txn),
        (0u64..40).prop_map(|revision| Command::Compact { revision }),
        (key(), 0u64..40).prop_map(|(key, revision)| Command::Read(Query::At {
            revision,
            query: Box::new(Query::Get { key })
        })),
        (key_range(), 0u32..3)
            .prop_map(|(range, limit)| Command::Read(Query::Range { range, limit })),
        (key_range(), 0u32..3, 0u64..40).prop_map(|(range, limit, revision)| Command::Read(
            Query::At {
                revision,
                query: Box::new(Query::Range { range, limit })
            }
        )),
    ]
}

fn txn_op() -> impl Strategy<Value = TxnOp> {
    prop_oneof![
        (
            key(),
            prop::collection::vec(b'0'..=b'9', 1..3),
            prop::option::of(Just("l1".to_string()))
        )
            .prop_map(|(key, value, lease)| TxnOp::Put { key, value, lease }),
        key().prop_map(|key| TxnOp::Delete { key }),
        Just(TxnOp::DeletePrefix {
            prefix: b"b".to_vec()
        }),
        key().prop_map(|key| TxnOp::Get { key }),
        (key_range(), 0u32..3).prop_map(|(range, limit)| TxnOp::Range { range, limit }),
        // Past, present, future and (after a compaction) compacted.
        (key_range(), 0u32..3, 0u64..40).prop_map(|(range, limit, revision)| TxnOp::RangeAt {
            range,
            limit,
            revision
        }),
        key_range().prop_map(|range| TxnOp::DeleteRange { range }),
        (
            key(),
            prop::option::of(prop::collection::vec(b'0'..=b'9', 1..3)),
            prop::option::of(prop::option::of(Just("l1".to_string())))
        )
            .prop_map(|(key, value, lease)| TxnOp::PutExisting {
                key,
                value: value.map_or(Update::Keep, Update::Set),
                lease: lease.map_or(Update::Keep, Update::Set),
            }),
        (key(), -3i64..5).prop_map(|(key, by)| TxnOp::Incr { key, by }),
        (key(), prop::collection::vec(b'a'..=b'z', 1..4))
            .prop_map(|(key, value)| TxnOp::Append { key, value }),
    ]
}

fn txn() -> impl Strategy<Value = Txn> {
    txn_nesting(0, 1, 4)
}

/// Transactions of `compares_min..3` compares, whose operations are nested
/// transactions `nested` times in `nested + weight` (up to three levels).
fn txn_nesting(compares_min: usize, nested: u32, weight: u32) -> impl Strategy<Value = Txn> {
    let target = prop_oneof![
        Just(CompareTarget::Value(b"1".to_vec())),
        (0u64..3).prop_map(CompareTarget::Version),
        (0u64..20).prop_map(CompareTarget::ModRevision),
        any::<bool>().prop_map(CompareTarget::Exists),
        prop::option::of(Just("l1".to_string())).prop_map(CompareTarget::Lease),
    ];
    let op = prop_oneof![
        Just(CompareOp::Equal),
        Just(CompareOp::NotEqual),
        Just(CompareOp::Less),
        Just(CompareOp::Greater)
    ];
    let scope = prop_oneof![
        Just(KeyScope::Key),
        Just(KeyScope::Prefix),
        prop::option::of(key()).prop_map(|end| KeyScope::Range { end }),
    ];
    let compare = (key(), scope, target, op)
        .prop_map(|(key, scope, target, op)| Compare {
            key,
            scope,
            target,
            op,
        })
        .boxed();
    let flat = (
        prop::collection::vec(compare.clone(), compares_min..3),
        prop::collection::vec(txn_op(), 0..4),
        prop::collection::vec(txn_op(), 0..4),
    )
        .prop_map(|(compare, success, failure)| Txn {
            compare,
            success,
            failure,
        });
    // Transactions nested in either branch, up to three levels more.
    flat.prop_recursive(3, 24, 4, move |inner| {
        let op = prop_oneof![weight => txn_op(), nested => inner.prop_map(TxnOp::Txn)].boxed();
        (
            prop::collection::vec(compare.clone(), compares_min..3),
            prop::collection::vec(op.clone(), 0..4),
            prop::collection::vec(op, 0..4),
        )
            .prop_map(|(compare, success, failure)| Txn {
                compare,
                success,
                failure,
            })
    })
}

/// Transactions whose nested ones compare what the operations before them
/// in their branch change: writes of a few keys, and compares of whether
/// one exists, its version and its value, nested up to two levels more.
fn sensitive_txn() -> impl Strategy<Value = Txn> {
    let write = prop_oneof![
        key().prop_map(|key| TxnOp::put(key, "1")),
        key().prop_map(TxnOp::delete),
        key().prop_map(|key| TxnOp::incr(key, 1)),
        key().prop_map(TxnOp::get),
    ]
    .boxed();
    let compare = prop_oneof![
        key().prop_map(Compare::exists),
        key().prop_map(Compare::absent),
        (key(), 0u64..3).prop_map(|(key, v)| Compare::version(key, CompareOp::Equal, v)),
        key().prop_map(|key| Compare::value(key, CompareOp::Equal, "1")),
        Just(Compare::exists("").over_prefix()),
    ]
    .boxed();
    let leaf = (
        prop::collection::vec(compare.clone(), 1..3),
        prop::collection::vec(write.clone(), 0..3),
        prop::collection::vec(write.clone(), 0..3),
    )
        .prop_map(|(compare, success, failure)| Txn {
            compare,
            success,
            failure,
        });
    leaf.prop_recursive(2, 16, 4, move |inner| {
        let op = prop_oneof![write.clone(), inner.prop_map(TxnOp::Txn)].boxed();
        (
            prop::collection::vec(compare.clone(), 0..3),
            prop::collection::vec(op.clone(), 1..4),
            prop::collection::vec(op, 1..4),
        )
            .prop_map(|(compare, success, failure)| Txn {
                compare,
                success,
                failure,
            })
    })
}

/// Whether `compare` holds in `machine`'s state, asked of a copy as a
/// transaction of that compare alone at `index`.
fn holds_alone(machine: &StateMachine, compare: &Compare, index: LogIndex) -> bool {
    let mut probe = machine.clone();
    let txn = Txn {
        compare: vec![compare.clone()],
        ..Txn::default()
    };
    match probe.apply(&Entry {
        index,
        proposal: Proposal {
            time: machine.cluster_time(),
            principal: None,
            request: Request::plain(Command::Txn(txn)),
        },
    }) {
        Outcome::Applied(Reply::Txn { succeeded, .. }) => succeeded,
        other => panic!("a compare alone: {other:?}"),
    }
}

/// The operations `txn` runs on `machine`'s state, nested transactions
/// replaced by the operations of the branch each takes, every compare
/// asked of the state before any of them runs; and the branch taken at
/// each transaction on the way, in order.
fn flattened(
    machine: &StateMachine,
    txn: &Txn,
    index: LogIndex,
    ops: &mut Vec<TxnOp>,
    path: &mut Vec<bool>,
) {
    let succeeded = txn
        .compare
        .iter()
        .all(|compare| holds_alone(machine, compare, index));
    path.push(succeeded);
    for op in if succeeded {
        &txn.success
    } else {
        &txn.failure
    } {
        match op {
            TxnOp::Txn(nested) => flattened(machine, nested, index, ops, path),
            op => ops.push(op.clone()),
        }
    }
}

/// A transaction's reply with the replies of nested transactions replaced
/// by their results, and the branch each reports, in order.
fn flattened_reply(reply: &Reply, results: &mut Vec<Reply>, path: &mut Vec<bool>) {
    let Reply::Txn {
        succeeded,
        results: own,
    } = reply
    else {
        panic!("not a transaction's reply: {reply:?}");
    };
    path.push(*succeeded);
    for result in own {
        match result {
            Reply::Txn { .. } => flattened_reply(result, results, path),
            result => results.push(result.clone()),
        }
    }
}

fn origin() -> impl Strategy<Value = OriginChoice> {
    prop_oneof![
        1 => Just(OriginChoice::Plain),
        4 => (0usize..4, 1u64..10, 0u64..4, prop::bool::weighted(0.9)).prop_map(
            |(slot, seq, ack_back, good_secret)| OriginChoice::Session { slot, seq, ack_back, good_secret }
        ),
        2 => (0u8..5).prop_map(OriginChoice::Key),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (200u64..3_000, 1u32..5).prop_map(|(ttl_ms, window)| Step::Open { ttl_ms, window }),
        2 => (0u64..800).prop_map(Step::Advance),
        10 => (origin(), command()).prop_map(|(origin, command)| Step::Request { origin, command }),
    ]
}

/// Turns steps into log entries. Session slots name the sessions opened so
/// far (a slot with no session names one that never existed).
fn entries(steps: &[Step]) -> Vec<Entry> {
    let mut opened: Vec<(SessionId, Secret)> = Vec::new();
    let mut time = 0;
    let mut out = Vec::new();
    for step in steps {
        let index = LogIndex(out.len() as u64 + 1);
        let request = match step {
            Step::Advance(ms) => {
                time += ms;
                continue;
            }
            Step::Open { ttl_ms, window } => {
                let secret = Secret(u128::from(index.0) * 7919);
                opened.push((SessionId(index.0), secret));
                Request::plain(Command::OpenSession {
                    ttl_ms: *ttl_ms,
                    window: *window,
                    secret,
                })
            }
            Step::Request { origin, command } => {
                let origin = match origin {
                    OriginChoice::Plain => Origin::Plain,
                    OriginChoice::Key(k) => Origin::Key(IdempotencyKey(vec![b'k', *k])),
                    OriginChoice::Session {
                        slot,
                        seq,
                        ack_back,
                        good_secret,
                    } => {
                        let (session, secret) = opened
                            .get(*slot)
                            .copied()
                            .unwrap_or((SessionId(9_999), Secret(1)));
                        Origin::Session(RequestHeader {
                            id: RequestId {
                                session,
                                seq: Seq(*seq),
                            },
                            secret: if *good_secret { secret } else { Secret(3) },
                            first_incomplete: Seq(seq.saturating_sub(*ack_back).max(1)),
                            attempt: 1,
                        })
                    }
                };
                Request {
                    origin,
                    command: command.clone(),
                }
            }
        };
        out.push(Entry {
            index,
            proposal: Proposal {
                time: ClusterTime(time),
                principal: None,
                request,
            },
        });
    }
    out
}

fn run(entries: &[Entry]) -> (Vec<Outcome>, StateMachine) {
    let mut machine = StateMachine::new(limits());
    let outcomes = entries.iter().map(|entry| machine.apply(entry)).collect();
    (outcomes, machine)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn replicas_applying_the_same_log_agree(steps in prop::collection::vec(step(), 1..80)) {
        let log = entries(&steps);
        let (outcomes_a, a) = run(&log);
        let (outcomes_b, b) = run(&log);
        prop_assert_eq!(outcomes_a, outcomes_b);
        prop_assert_eq!(a.snapshot(), b.snapshot());
        prop_assert!(a.check_invariants().is_ok());
    }

    #[test]
    fn snapshot_restore_continue_equals_continue(
        steps in prop::collection::vec(step(), 1..80),
        cut in 0usize..80,
    ) {
        let log = entries(&steps);
        let cut = cut.min(log.len());
        let (outcomes, straight) = run(&log);
        let (_, mut first_part) = run(&log[..cut]);
        let bytes = first_part.snapshot();
        let mut restored = StateMachine::restore(&limits(), &bytes).expect("restore");
        prop_assert_eq!(&restored, &first_part);
        let rest: Vec<Outcome> = log[cut..].iter().map(|entry| restored.apply(entry)).collect();
        prop_assert_eq!(&rest[..], &outcomes[cut..]);
        prop_assert_eq!(restored.snapshot(), straight.snapshot());
        // The original keeps working after being snapshotted, too.
        for entry in &log[cut..] {
            first_part.apply(entry);
        }
        prop_assert_eq!(first_part.snapshot(), straight.snapshot());
    }

    /// A copy of the state (what a snapshot is built from, while applies go
    /// on) shares structure with the original: neither may see the other's
    /// later changes.
    #[test]
    fn a_copy_is_unchanged_by_the_original_and_the_original_by_the_copy(
        steps in prop::collection::vec(step(), 1..80),
        cut in 0usize..80,
    ) {
        let log = entries(&steps);
        let cut = cut.min(log.len());
        let (_, straight) = run(&log);
        let (_, mut original) = run(&log[..cut]);
        let at_cut = original.snapshot();
        let mut copy = original.clone();
        for entry in &log[cut..] {
            original.apply(entry);
        }
        prop_assert_eq!(copy.snapshot(), at_cut.clone());
        prop_assert!(copy.check_invariants().is_ok());
        prop_assert_eq!(original.snapshot(), straight.snapshot());
        // And the other way round: the copy moving on leaves a second copy
        // where it was.
        let second = copy.clone();
        for entry in &log[cut..] {
            copy.apply(entry);
        }
        prop_assert_eq!(second.snapshot(), at_cut);
        prop_assert_eq!(copy.snapshot(), straight.snapshot());
    }

    #[test]
    fn a_request_that_does_not_execute_changes_no_data(
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let log = entries(&steps);
        let mut machine = StateMachine::new(limits());
        for entry in &log {
            let mut ticked = machine.clone();
            ticked.apply(&Entry { index: entry.index, proposal: Proposal { request: Request::plain(Command::Tick), ..entry.proposal.clone() } });
            let outcome = machine.apply(entry);
            if !matches!(outcome, Outcome::Applied(_)) {
                prop_assert_eq!(machine.kv(), ticked.kv(), "{:?} changed data", outcome);
                prop_assert_eq!(machine.leases(), ticked.leases());
            }
        }
    }

    /// Floods of sessions and keys against small tables and byte budgets:
    /// a request that was applied under a session is never applied again,
    /// and one applied under a key is not applied again within the key's
    /// time-to-live. Full tables refuse; they never evict anything live.
    #[test]
    fn no_flood_makes_an_accepted_request_run_twice(
        steps in prop::collection::vec(step(), 1..120),
        tight_bytes in any::<bool>(),
    ) {
        // Tight budgets refuse by bytes first; loose ones by count.
        let bytes = |tight: u64| if tight_bytes { tight } else { 1 << 20 };
        let limits = Limits {
            session_record_bytes_max: bytes(200),
            record_bytes_max: bytes(400),
            idempotency_bytes_max: bytes(300),
            store_bytes_max: 500,
            ..limits()
        };
        let ttl_ms = limits.idempotency_key_ttl_ms;
        let mut machine = StateMachine::new(limits);
        let mut by_session: BTreeMap<RequestId, LogIndex> = BTreeMap::new();
        let mut by_key: BTreeMap<Vec<u8>, (u64, LogIndex)> = BTreeMap::new();
        for entry in entries(&steps) {
            let outcome = machine.apply(&entry);
            let Outcome::Applied(_) = outcome else { continue };
            match &entry.proposal.request.origin {
                Origin::Session(header) => {
                    let first = by_session.insert(header.id, entry.index);
                    prop_assert!(first.is_none(), "{} applied at {:?} and again at {:?}", header.id, first, entry.index);
                }
                Origin::Key(key) => {
                    if let Some((at, index)) = by_key.insert(key.0.clone(), (entry.proposal.time.0, entry.index)) {
                        prop_assert!(entry.proposal.time.0 > at + ttl_ms, "key {:?} applied at {:?} and again at {:?} within its ttl", key, index, entry.index);
                    }
                }
                Origin::Plain => {}
            }
            prop_assert!(machine.check_invariants().is_ok());
        }
    }

    #[test]
    fn restore_rejects_any_corruption(
        steps in prop::collection::vec(step(), 1..40),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let (_, machine) = run(&entries(&steps));
        let mut bytes = machine.snapshot();
        let at = position.index(bytes.len());
        bytes[at] ^= flip;
        prop_assert!(StateMachine::restore(&limits(), &bytes).is_err());
        let whole = machine.snapshot();
        prop_assert!(StateMachine::restore(&limits(), &whole[..at]).is_err());
    }
}

/// One client of the append workload: a session with a window, tokens to
/// append, and the requests in flight.
struct AppendClient {
    session: SessionId,
    secret: Secret,
    window: u64,
    next_seq: u64,
    /// seq -> (command, acknowledged by the client?)
    sent: BTreeMap<u64, Command>,
    done: BTreeMap<u64, bool>,
}

impl AppendClient {
    fn first_incomplete(&self) -> u64 {
        (1..self.next_seq)
            .find(|seq| !self.done.get(seq).copied().unwrap_or(false))
            .unwrap_or(self.next_seq)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Unique-token appends delivered with random duplicates and reorders
    /// (within the window): every token lands exactly once.
    #[test]
    fn every_token_appends_exactly_once(
        windows in prop::collection::vec(1u64..6, 1..4),
        choices in prop::collection::vec((0usize..4, 0u8..4, any::<prop::sample::Index>()), 1..300),
    ) {
        let mut machine = StateMachine::new(Limits { value_bytes_max: 1 << 20, ..Limits::default() });
        let mut index = 0;
        let mut apply = |machine: &mut StateMachine, request: Request| {
            index += 1;
            machine.apply(&Entry { index: LogIndex(index), proposal: Proposal { time: ClusterTime(index), principal: None, request } })
        };
        let mut clients: Vec<AppendClient> = Vec::new();
        for (i, window) in windows.iter().enumerate() {
            let secret = Secret(i as u128 + 100);
            let open = Command::OpenSession { ttl_ms: 60_000, window: *window as u32, secret };
            let Outcome::Applied(Reply::SessionOpened { session, .. }) = apply(&mut machine, Request::plain(open)) else {
                panic!("session not opened");
            };
            clients.push(AppendClient { session, secret, window: *window, next_seq: 1, sent: BTreeMap::new(), done: BTreeMap::new() });
        }
        let mut applied_tokens = Vec::new();
        for (which, action, pick) in choices {
            let client = &mut clients[which % windows.len()];
            let in_flight: Vec<u64> = client.sent.keys().copied().filter(|s| !client.done[s]).collect();
            match action {
                // Issue a new request if the window allows.
                0 if client.next_seq < client.first_incomplete() + client.window => {
                    let seq = client.next_seq;
                    let token = format!("<{}.{}>", client.session.0, seq);
                    client.sent.insert(seq, Command::Append { key: b"log".to_vec(), value: token.into_bytes() });
                    client.done.insert(seq, false);
                    client.next_seq += 1;
                }
                // Deliver (possibly again) some request: the client hears the
                // reply only sometimes (action 1), or the reply is lost (2).
                1 | 2 if !in_flight.is_empty() || !client.sent.is_empty() => {
                    let all: Vec<u64> = client.sent.keys().copied().collect();
                    let seq = if in_flight.is_empty() { all[pick.index(all.len())] } else { in_flight[pick.index(in_flight.len())] };
                    let header = RequestHeader {
                        id: RequestId { session: client.session, seq: Seq(seq) },
                        secret: client.secret,
                        first_incomplete: Seq(client.first_incomplete().min(seq)),
                        attempt: 1,
                    };
                    let command = client.sent[&seq].clone();
                    let outcome = apply(&mut machine, Request { origin: Origin::Session(header), command: command.clone() });
                    match &outcome {
                        Outcome::Applied(_) => {
                            let Command::Append { value, .. } = command else { unreachable!() };
                            applied_tokens.push(value);
                        }
                        Outcome::Replayed { .. } | Outcome::Stale { .. } => {}
                        other => panic!("unexpected outcome {other:?}"),
                    }
                    if action == 1 && matches!(outcome, Outcome::Applied(_) | Outcome::Replayed { .. }) {
                        client.done.insert(seq, true);
                    }
                }
                _ => {}
            }
        }
        let Reply::Get { value, .. } = machine.read(&Query::Get { key: b"log".to_vec() }) else { unreachable!() };
        let log = String::from_utf8(value.unwrap_or_default()).expect("utf8");
        let mut seen = std::collections::BTreeSet::new();
        for token in &applied_tokens {
            let token = String::from_utf8(token.clone()).expect("utf8");
            prop_assert!(seen.insert(token.clone()), "token {} applied twice", token);
            prop_assert_eq!(log.matches(token.as_str()).count(), 1, "token {} in {}", token, log);
        }
        for client in &clients {
            for (seq, done) in &client.done {
                if *done {
                    let token = format!("<{}.{}>", client.session.0, seq);
                    prop_assert_eq!(log.matches(token.as_str()).count(), 1, "acknowledged {} missing", token);
                }
            }
        }
        prop_assert_eq!(log.matches('<').count(), applied_tokens.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// A transaction with nested ones runs as etcd runs it: every compare
    /// on the path it takes is decided on the state before any operation
    /// runs, then the operations of the branches taken run in order, as
    /// one flat transaction of them would (same replies, same store, same
    /// revisions); a refusal changes nothing. A transaction refused for
    /// writing a key twice across branches that cannot both run is the
    /// one difference: its flat path may run.
    #[test]
    fn a_nested_transaction_runs_as_the_flat_transaction_of_its_path(
        steps in prop::collection::vec(step(), 0..40),
        txn in prop_oneof![txn_nesting(1, 2, 3), sensitive_txn()],
    ) {
        let log = entries(&steps);
        let (_, before) = run(&log);
        let index = LogIndex(log.last().map_or(0, |entry| entry.index.0) + 1);
        let mut ops = Vec::new();
        let mut path = Vec::new();
        flattened(&before, &txn, index, &mut ops, &mut path);
        let at = |txn: Txn| Entry {
            index,
            proposal: Proposal {
                time: before.cluster_time(),
                principal: None,
                request: Request::plain(Command::Txn(txn)),
            },
        };
        let mut nested = before.clone();
        let nested_outcome = nested.apply(&at(txn.clone()));
        let mut flat = before.clone();
        let flat_outcome = flat.apply(&at(Txn { success: ops, ..Txn::default() }));
        match (&nested_outcome, &flat_outcome) {
            (
                Outcome::Applied(reply @ Reply::Txn { .. }),
                Outcome::Applied(Reply::Txn { succeeded: true, results: expected }),
            ) => {
                let mut results = Vec::new();
                let mut taken = Vec::new();
                flattened_reply(reply, &mut results, &mut taken);
                prop_assert_eq!(&taken, &path);
                prop_assert_eq!(&results, expected);
                prop_assert_eq!(contents(&nested), contents(&flat));
                prop_assert_eq!(nested.leases(), flat.leases());
                prop_assert_eq!(nested.kv().history(), flat.kv().history());
            }
            (Outcome::Applied(Reply::Rejected(oncekv_state::Rejection::TxnConflict { .. })), _) => {
                prop_assert_eq!(contents(&nested), contents(&before));
            }
            (Outcome::Applied(Reply::Rejected(refused)), Outcome::Applied(Reply::Rejected(expected))) => {
                prop_assert_eq!(refused, expected);
                prop_assert_eq!(contents(&nested), contents(&before));
                prop_assert_eq!(nested.leases(), before.leases());
            }
            (nested, flat) => prop_assert!(false, "nested {:?}, flat {:?}", nested, flat),
        }
    }
}

/// The store's whole contents, with revisions.
fn contents(machine: &StateMachine) -> Vec<KeyValue> {
    machine
        .kv()
        .iter()
        .map(|(key, stored)| KeyValue {
            key: key.clone(),
            value: stored.value.to_vec(),
            meta: stored.meta,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The store's contents recorded after every entry are what a read at
    /// that revision returns while the history covers it (a read of a key
    /// range: the recorded keys in it, paged by its limit and counted); the events from
    /// the compacted revision on, replayed onto the contents there, give
    /// today's store; and a refused transaction leaves the store and the
    /// leases as a tick would.
    #[test]
    fn the_history_reconstructs_every_revision_it_covers(
        steps in prop::collection::vec(step(), 1..80),
        ranges in prop::collection::vec(key_range(), 1..4),
    ) {
        let log = entries(&steps);
        let mut machine = StateMachine::new(limits());
        let mut recorded: BTreeMap<u64, Vec<KeyValue>> = BTreeMap::new();
        recorded.insert(0, Vec::new());
        for entry in &log {
            let mut twin = machine.clone();
            twin.apply(&Entry { index: entry.index, proposal: Proposal { request: Request::plain(Command::Tick), ..entry.proposal.clone() } });
            let outcome = machine.apply(entry);
            if let (Command::Txn(_), Outcome::Applied(Reply::Rejected(_))) = (&entry.proposal.request.command, &outcome) {
                prop_assert_eq!(twin.kv(), machine.kv());
                prop_assert_eq!(twin.leases(), machine.leases());
            }
            recorded.insert(entry.index.0, contents(&machine));
        }
        let history = machine.kv().history();
        let compacted = history.compacted();
        for (revision, expected) in recorded.range(compacted..) {
            let (past, more) = machine.kv().scan_at(b"", *revision, usize::MAX, u64::MAX);
            prop_assert!(!more);
            prop_assert_eq!(&past, expected, "at revision {}", revision);
            for range in &ranges {
                let within: Vec<KeyValue> =
                    expected.iter().filter(|kv| range.contains(&kv.key)).cloned().collect();
                for limit in [1, 2, usize::MAX] {
                    let page = machine.kv().scan_range_at(range, *revision, limit, u64::MAX);
                    let shown = within.len().min(limit);
                    prop_assert_eq!(&page.entries[..], &within[..shown], "{:?} at {}", range, revision);
                    prop_assert_eq!(page.more, within.len() > limit);
                    prop_assert_eq!(page.count, within.len() as u64);
                }
            }
        }
        let mut replayed: BTreeMap<Vec<u8>, KeyValue> = recorded
            .range(..=compacted)
            .next_back()
            .map(|(_, state)| state.iter().map(|kv| (kv.key.clone(), kv.clone())).collect())
            .unwrap_or_default();
        for event in history.since(compacted + 1).expect("not compacted") {
            let before = replayed.get(&event.key).map(|kv| (kv.value.clone(), kv.meta));
            let previous = event.previous.as_ref().map(|p| (p.value.to_vec(), p.meta));
            prop_assert_eq!(before, previous, "event at {} says what was there", event.revision);
            match &event.value {
                Some(stored) => {
                    let kv = KeyValue { key: event.key.clone(), value: stored.value.to_vec(), meta: stored.meta };
                    replayed.insert(event.key.clone(), kv);
                }
                None => {
                    replayed.remove(&event.key);
                }
            }
        }
        let replayed: Vec<KeyValue> = replayed.into_values().collect();
        prop_assert_eq!(replayed, contents(&machine));
    }
}
