//! Property tests of lease ownership: under random grants, keep-alives,
//! revokes, puts attaching keys (plain and in transactions) and lease
//! lists of random principals, a lease is its granter's: once
//! authentication is enforced, anyone else but an admin is refused
//! ([`Outcome::PermissionDenied`], changing nothing) and sees only the
//! leases they may use; with authentication off, nothing is refused.
//! Every outcome is the one an independent model of the owners predicts,
//! and the owners survive a snapshot.

use oncekv_state::{
    ADMIN_ROLE, Access, AuthCommand, ClusterTime, Command, Entry, Limits, LogIndex, Outcome,
    Permission, Principal, Proposal, Query, Rejection, Reply, Request, StateMachine, TokenKey, Txn,
    TxnOp, Update,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// root (admin), alice and bob (both may write every key), and past them
/// nobody.
const USERS: [&str; 3] = ["root", "alice", "bob"];

fn principal(i: usize) -> Option<Principal> {
    USERS.get(i).map(|name| Principal(name.to_string()))
}

/// Long enough that nothing expires during a case.
const TTL_MS: u64 = 60 * 60 * 1000;

#[derive(Clone, Debug)]
enum Action {
    Grant(u8),
    KeepAlive(u8),
    Revoke(u8),
    /// A put of key `.0` attached to lease `.1`.
    Put(u8, u8),
    /// The same put inside a transaction.
    TxnPut(u8, u8),
    /// A put keeping key `.0`'s value, attaching it to lease `.1`.
    PutExisting(u8, u8),
    /// A lease list through the log.
    List,
}

fn lease(n: u8) -> String {
    format!("l{n}")
}

fn key(n: u8) -> Vec<u8> {
    format!("k{n}").into_bytes()
}

impl Action {
    fn command(&self) -> Command {
        let put = |k: u8, l: u8| TxnOp::Put {
            key: key(k),
            value: b"v".to_vec(),
            lease: Some(lease(l)),
        };
        let txn = |op: TxnOp| {
            Command::Txn(Txn {
                compare: Vec::new(),
                success: vec![op],
                failure: Vec::new(),
            })
        };
        match *self {
            Action::Grant(l) => Command::LeaseGrant {
                name: lease(l),
                ttl_ms: TTL_MS,
            },
            Action::KeepAlive(l) => Command::LeaseKeepAlive { name: lease(l) },
            Action::Revoke(l) => Command::LeaseRevoke { name: lease(l) },
            Action::Put(k, l) => Command::Put {
                key: key(k),
                value: b"v".to_vec().into(),
                lease: Some(lease(l)),
            },
            Action::TxnPut(k, l) => txn(put(k, l)),
            Action::PutExisting(k, l) => txn(TxnOp::PutExisting {
                key: key(k),
                value: Update::Keep,
                lease: Update::Set(Some(lease(l))),
            }),
            Action::List => Command::Read(Query::LeaseList),
        }
    }

    /// The lease it uses, if any.
    fn lease(&self) -> Option<String> {
        match *self {
            Action::Grant(l)
            | Action::KeepAlive(l)
            | Action::Revoke(l)
            | Action::Put(_, l)
            | Action::TxnPut(_, l)
            | Action::PutExisting(_, l) => Some(lease(l)),
            Action::List => None,
        }
    }
}

fn action() -> impl Strategy<Value = Action> {
    let l = 0u8..3;
    let k = 0u8..2;
    prop_oneof![
        3 => l.clone().prop_map(Action::Grant),
        2 => l.clone().prop_map(Action::KeepAlive),
        1 => l.clone().prop_map(Action::Revoke),
        2 => (k.clone(), l.clone()).prop_map(|(k, l)| Action::Put(k, l)),
        1 => (k.clone(), l.clone()).prop_map(|(k, l)| Action::TxnPut(k, l)),
        1 => (k, l).prop_map(|(k, l)| Action::PutExisting(k, l)),
        1 => Just(Action::List),
    ]
}

/// The leases as the test sees them: name -> owner.
#[derive(Default)]
struct Model {
    enforced: bool,
    owners: BTreeMap<String, Option<Principal>>,
}

impl Model {
    /// Whether `who` may use a lease owned by `owner`, by the rule in
    /// words: anyone's while not enforced or without an owner, else the
    /// owner's and root's.
    fn may_use(&self, who: Option<&Principal>, owner: Option<&Principal>) -> bool {
        !self.enforced || owner.is_none() || who == owner || who.is_some_and(|who| who.0 == "root")
    }

    /// Whether `who` is refused `action` (nobody always, once enforced).
    fn denied(&self, who: Option<&Principal>, action: &Action) -> bool {
        if self.enforced && who.is_none() {
            return true;
        }
        match action.lease().and_then(|name| self.owners.get(&name)) {
            Some(owner) => !self.may_use(who, owner.as_ref()),
            None => false,
        }
    }

    /// The leases `who` sees listed.
    fn listed(&self, who: Option<&Principal>) -> Vec<String> {
        self.owners
            .iter()
            .filter(|(_, owner)| self.may_use(who, owner.as_ref()))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

struct Replica {
    machine: StateMachine,
    index: u64,
}

impl Replica {
    fn apply(&mut self, principal: Option<Principal>, command: Command) -> Outcome {
        self.index += 1;
        self.machine.apply(&Entry {
            index: LogIndex(self.index),
            proposal: Proposal {
                time: ClusterTime(self.index),
                principal,
                request: Request::plain(command),
            },
        })
    }
}

/// A machine with root (admin), alice and bob (readwrite on every key),
/// authentication enforced if `enforced`.
fn replica(enforced: bool) -> Replica {
    let mut replica = Replica {
        machine: StateMachine::new(Limits::default()),
        index: 0,
    };
    let mut setup = Vec::new();
    for user in USERS {
        setup.push(AuthCommand::UserAdd {
            name: user.into(),
            password_hash: Some("$argon2id$x".into()),
        });
    }
    setup.extend([
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
        AuthCommand::RoleAdd { name: "rw".into() },
        AuthCommand::RoleGrant {
            role: "rw".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: Vec::new(),
                prefix: true,
            },
        },
    ]);
    for user in ["alice", "bob"] {
        setup.push(AuthCommand::UserGrantRole {
            user: user.into(),
            role: "rw".into(),
        });
    }
    if enforced {
        setup.push(AuthCommand::Enable {
            token_key: TokenKey([3; 32]),
        });
    }
    for change in setup {
        let outcome = replica.apply(None, Command::Auth(change));
        assert_eq!(outcome, Outcome::Applied(Reply::AuthChanged));
    }
    replica
}

fn names(reply: &Reply) -> Vec<String> {
    match reply {
        Reply::Leases { leases } => leases.iter().map(|l| l.name.clone()).collect(),
        other => panic!("not a lease list: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_lease_is_its_granters_and_an_admins(
        enforced in any::<bool>(),
        steps in prop::collection::vec((0usize..4, action()), 1..50),
    ) {
        let mut replica = replica(enforced);
        let mut model = Model { enforced, ..Model::default() };
        for (who, action) in steps {
            let who = principal(who);
            let denied = model.denied(who.as_ref(), &action);
            let before = (replica.machine.leases().clone(), replica.machine.kv().clone());
            let outcome = replica.apply(who.clone(), action.command());
            if denied {
                prop_assert!(
                    matches!(outcome, Outcome::PermissionDenied { .. }),
                    "{action:?} of {who:?} answered {outcome:?}"
                );
                let after = (replica.machine.leases().clone(), replica.machine.kv().clone());
                prop_assert_eq!(&before, &after, "a refusal changed the state");
                continue;
            }
            let Outcome::Applied(reply) = &outcome else {
                return Err(TestCaseError::fail(format!("{action:?} of {who:?} answered {outcome:?}")));
            };
            let exists = action.lease().is_some_and(|name| model.owners.contains_key(&name));
            match &action {
                Action::Grant(l) if exists => prop_assert_eq!(
                    reply,
                    &Reply::Rejected(Rejection::LeaseExists { name: lease(*l) })
                ),
                Action::Grant(l) => {
                    prop_assert!(matches!(reply, Reply::LeaseGranted { .. }), "{reply:?}");
                    model.owners.insert(lease(*l), who.clone());
                    let granted = replica.machine.leases().get(&lease(*l)).expect("granted");
                    prop_assert_eq!(granted.owner.as_ref(), who.as_ref());
                }
                Action::KeepAlive(_) => prop_assert_eq!(
                    matches!(reply, Reply::LeaseKeptAlive { .. }),
                    exists,
                    "{:?}", reply
                ),
                Action::Revoke(l) => {
                    prop_assert_eq!(matches!(reply, Reply::LeaseRevoked { .. }), exists, "{:?}", reply);
                    model.owners.remove(&lease(*l));
                }
                Action::Put(k, l) | Action::TxnPut(k, l) => {
                    let attached = replica.machine.kv().get(&key(*k))
                        .is_some_and(|stored| stored.lease == Some(lease(*l)));
                    prop_assert_eq!(attached, exists, "{:?}", reply);
                }
                Action::PutExisting(..) => {}
                Action::List => {
                    prop_assert_eq!(names(reply), model.listed(who.as_ref()));
                }
            }
            // The list as a read served without a log entry shows the same.
            if who.is_some() || !enforced {
                let read = replica.machine.read_as(who.as_ref(), &Query::LeaseList);
                prop_assert_eq!(names(&read), model.listed(who.as_ref()));
            }
            prop_assert!(replica.machine.check_invariants().is_ok());
        }
        let restored = StateMachine::restore(replica.machine.limits(), &replica.machine.snapshot())
            .expect("the snapshot restores");
        prop_assert_eq!(restored.leases(), replica.machine.leases());
        prop_assert_eq!(restored.state_digest(), replica.machine.state_digest());
    }
}

/// The finding this guards against: another user grants the name a
/// holder's lease will have, with a short TTL, first. Owned, the squatted
/// lease cannot be renewed, revoked, attached to or seen by the holder;
/// and the holder's own lease is none of the squatter's.
#[test]
fn a_squatted_lease_is_of_no_use_to_anyone_else() {
    let mut replica = replica(true);
    let alice = principal(1);
    let bob = principal(2);
    let grant = |name: &str, ttl_ms| Command::LeaseGrant {
        name: name.into(),
        ttl_ms,
    };
    let put = |name: &str| Command::Put {
        key: b"jobs/a".to_vec(),
        value: Vec::new().into(),
        lease: Some(name.into()),
    };
    assert!(matches!(
        replica.apply(bob.clone(), grant("squat", 100)),
        Outcome::Applied(Reply::LeaseGranted { .. })
    ));
    for command in [
        grant("squat", TTL_MS),
        Command::LeaseKeepAlive {
            name: "squat".into(),
        },
        Command::LeaseRevoke {
            name: "squat".into(),
        },
        put("squat"),
    ] {
        let outcome = replica.apply(alice.clone(), command.clone());
        let Outcome::PermissionDenied { reason } = outcome else {
            panic!("{command:?}: {outcome:?}");
        };
        assert!(reason.contains("\"squat\""), "{reason}");
    }
    let listed = replica.apply(alice.clone(), Command::Read(Query::LeaseList));
    assert_eq!(
        listed,
        Outcome::Applied(Reply::Leases { leases: Vec::new() })
    );

    assert!(matches!(
        replica.apply(alice.clone(), grant("mine", TTL_MS)),
        Outcome::Applied(Reply::LeaseGranted { .. })
    ));
    assert!(matches!(
        replica.apply(alice.clone(), put("mine")),
        Outcome::Applied(Reply::Put { .. })
    ));
    for command in [
        Command::LeaseKeepAlive {
            name: "mine".into(),
        },
        Command::LeaseRevoke {
            name: "mine".into(),
        },
    ] {
        let outcome = replica.apply(bob.clone(), command.clone());
        assert!(
            matches!(outcome, Outcome::PermissionDenied { .. }),
            "{command:?}: {outcome:?}"
        );
    }
    // An admin manages any lease.
    let root = principal(0);
    let Outcome::Applied(Reply::Leases { leases }) =
        replica.apply(root.clone(), Command::Read(Query::LeaseList))
    else {
        panic!("root lists");
    };
    assert_eq!(leases.len(), 2);
    assert!(matches!(
        replica.apply(
            root.clone(),
            Command::LeaseRevoke {
                name: "squat".into()
            }
        ),
        Outcome::Applied(Reply::LeaseRevoked { .. })
    ));
    assert!(matches!(
        replica.apply(
            root,
            Command::LeaseRevoke {
                name: "mine".into()
            }
        ),
        Outcome::Applied(Reply::LeaseRevoked {
            keys_deleted: 1,
            ..
        })
    ));
    assert!(replica.machine.kv().get(b"jobs/a").is_none());
}
