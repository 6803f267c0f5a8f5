//! Property tests of [`StateMachine::answer_unlogged`]: a plain request
//! that changes nothing (a read, a transaction that only reads, nested
//! ones included) is answered from the state exactly as applying it from
//! the log would answer it (the same reply, the same refusal of a reply
//! past its bound, the same permission refusal), and changes nothing; any
//! other request (one that may write, or one on a session or under an
//! idempotency key) gets no answer there, so it is proposed.

use oncekv_state::{
    ADMIN_ROLE, Access, AuthCommand, ClusterTime, Command, Compare, CompareOp, CompareTarget,
    Entry, IdempotencyKey, KeyRange, KeyScope, Limits, LogIndex, Origin, Outcome, Permission,
    Principal, Proposal, Query, Reply, Request, RequestHeader, RequestId, Secret, Seq, SessionId,
    StateMachine, TokenKey, Txn, TxnOp,
};
use proptest::prelude::*;

/// Small enough that a few reads pass a reply's bound (twice this).
const SCAN_BYTES_MAX: u64 = 96;

fn key(n: u8) -> Vec<u8> {
    // Keys under "a" and under "b": the reader may read only those
    // under "a".
    let prefix = if n.is_multiple_of(2) { "a" } else { "b" };
    format!("{prefix}{n}").into_bytes()
}

fn read_op() -> impl Strategy<Value = TxnOp> {
    prop_oneof![
        (0u8..6).prop_map(|n| TxnOp::Get { key: key(n) }),
        (prop_oneof![Just("a"), Just("b"), Just("")], 0u32..4).prop_map(|(prefix, limit)| {
            TxnOp::Scan {
                prefix: prefix.as_bytes().to_vec(),
                limit,
            }
        }),
        (0u8..6, 0u32..3).prop_map(|(n, limit)| TxnOp::Range {
            range: KeyRange::from_key(key(n)),
            limit,
        }),
        (0u8..6, 0u32..3, 0u64..30).prop_map(|(n, limit, revision)| TxnOp::RangeAt {
            range: KeyRange::from_key(key(n)),
            limit,
            revision,
        }),
    ]
}

fn write_op() -> impl Strategy<Value = TxnOp> {
    prop_oneof![
        (0u8..6, 0usize..40).prop_map(|(n, len)| TxnOp::Put {
            key: key(n),
            value: vec![b'w'; len],
            lease: None,
        }),
        (0u8..6).prop_map(|n| TxnOp::Delete { key: key(n) }),
    ]
}

fn compare() -> impl Strategy<Value = Compare> {
    (0u8..6, 0u64..3, any::<bool>()).prop_map(|(n, version, prefix)| Compare {
        key: if prefix { b"a".to_vec() } else { key(n) },
        scope: if prefix {
            KeyScope::Prefix
        } else {
            KeyScope::Key
        },
        target: CompareTarget::Version(version),
        op: CompareOp::Greater,
    })
}

/// A transaction of reads (and, if `writes`, of writes too), with a
/// transaction of the same kind nested in it at most once.
fn txn(writes: bool) -> impl Strategy<Value = Txn> {
    let op = move || {
        if writes {
            prop_oneof![2 => read_op(), 1 => write_op()].boxed()
        } else {
            read_op().boxed()
        }
    };
    let flat = move || {
        (
            prop::collection::vec(compare(), 0..3),
            prop::collection::vec(op(), 0..5),
            prop::collection::vec(op(), 0..5),
        )
            .prop_map(|(compare, success, failure)| Txn {
                compare,
                success,
                failure,
            })
    };
    (flat(), prop::option::of(flat())).prop_map(|(mut outer, nested)| {
        if let Some(nested) = nested {
            outer.success.push(TxnOp::Txn(nested));
        }
        outer
    })
}

/// A command that changes nothing: a read, or a transaction of reads.
fn read_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        1 => (0u8..6).prop_map(|n| Command::Read(Query::Get { key: key(n) })),
        1 => (0u32..4).prop_map(|limit| Command::Read(Query::Scan {
            prefix: b"a".to_vec(),
            limit,
        })),
        3 => txn(false).prop_map(Command::Txn),
    ]
}

struct Replica {
    machine: StateMachine,
    index: u64,
}

impl Replica {
    fn entry(&self, principal: Option<Principal>, request: Request) -> Entry {
        Entry {
            index: LogIndex(self.index + 1),
            // The time does not move: nothing expires between the two
            // answers compared.
            proposal: Proposal {
                time: ClusterTime(1),
                principal,
                request,
            },
        }
    }

    fn apply(&mut self, principal: Option<Principal>, command: Command) -> Outcome {
        let entry = self.entry(principal, Request::plain(command));
        self.index += 1;
        self.machine.apply(&entry)
    }
}

/// root (admin) and a reader who may read only the keys under "a", with
/// authentication enforced if `enforced`.
fn replica(enforced: bool) -> Replica {
    let limits = Limits {
        scan_bytes_max: SCAN_BYTES_MAX,
        ..Limits::default()
    };
    let mut replica = Replica {
        machine: StateMachine::new(limits),
        index: 0,
    };
    let mut setup = vec![
        AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: Some("$argon2id$x".into()),
        },
        AuthCommand::UserAdd {
            name: "reader".into(),
            password_hash: Some("$argon2id$x".into()),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
        AuthCommand::RoleAdd {
            name: "read-a".into(),
        },
        AuthCommand::RoleGrant {
            role: "read-a".into(),
            permission: Permission {
                access: Access::Read,
                key: b"a".to_vec(),
                prefix: true,
            },
        },
        AuthCommand::UserGrantRole {
            user: "reader".into(),
            role: "read-a".into(),
        },
    ];
    if enforced {
        setup.push(AuthCommand::Enable {
            token_key: TokenKey([5; 32]),
        });
    }
    for change in setup {
        let outcome = replica.apply(None, Command::Auth(change));
        assert_eq!(outcome, Outcome::Applied(Reply::AuthChanged));
    }
    replica
}

fn principal(i: usize) -> Option<Principal> {
    ["root", "reader"]
        .get(i)
        .map(|name| Principal(name.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_plain_read_is_answered_as_applying_it_would(
        enforced in any::<bool>(),
        values in prop::collection::vec((0u8..6, 0usize..60), 0..8),
        who in 0usize..3,
        read in read_command(),
    ) {
        let mut replica = replica(enforced);
        for (n, len) in values {
            let put = Command::Put { key: key(n), value: vec![b'v'; len].into(), lease: None };
            let outcome = replica.apply(principal(0), put);
            prop_assert!(matches!(outcome, Outcome::Applied(Reply::Put { .. })), "{outcome:?}");
        }
        let request = Request::plain(read);
        prop_assert!(!request.needs_log());
        let before = replica.machine.clone();
        let answered = replica.machine.answer_unlogged(&request, principal(who).as_ref());
        prop_assert_eq!(&replica.machine, &before, "answering changed the state");
        let entry = replica.entry(principal(who), request);
        let applied = replica.machine.clone().apply(&entry);
        prop_assert_eq!(answered, Some(applied));
    }

    #[test]
    fn anything_that_may_write_or_is_deduplicated_is_proposed(
        txn in txn(true),
        read in read_command(),
        seq in 1u64..4,
    ) {
        let replica = replica(false);
        let writes = Request::plain(Command::Txn(txn.clone()));
        prop_assert_eq!(writes.needs_log(), !txn.only_reads());
        if !txn.only_reads() {
            prop_assert_eq!(replica.machine.answer_unlogged(&writes, None), None);
        }
        let keyed = Request {
            origin: Origin::Key(IdempotencyKey(format!("key-{seq}").into_bytes())),
            command: read,
        };
        prop_assert!(keyed.needs_log());
        prop_assert_eq!(replica.machine.answer_unlogged(&keyed, None), None);
        let on_session = Request {
            origin: Origin::Session(RequestHeader {
                id: RequestId { session: SessionId(1), seq: Seq(seq) },
                secret: Secret(7),
                first_incomplete: Seq(1),
                attempt: 1,
            }),
            command: keyed.command,
        };
        prop_assert!(on_session.needs_log());
        prop_assert_eq!(replica.machine.answer_unlogged(&on_session, None), None);
    }
}

#[test]
fn a_transaction_of_reads_past_the_bound_is_refused_without_a_change() {
    let mut replica = replica(false);
    replica.apply(
        None,
        Command::Put {
            key: key(0),
            value: vec![b'v'; 60].into(),
            lease: None,
        },
    );
    let reads = Txn {
        success: vec![TxnOp::Get { key: key(0) }; 8],
        ..Txn::default()
    };
    let request = Request::plain(Command::Txn(reads));
    match replica.machine.answer_unlogged(&request, None) {
        Some(Outcome::Applied(Reply::Rejected(refused))) => {
            assert!(
                refused
                    .to_string()
                    .contains("a transaction's reply may hold"),
                "{refused}"
            );
        }
        other => panic!("eight reads of 60 bytes pass a bound of 192: {other:?}"),
    }
}
