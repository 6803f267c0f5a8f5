//! Property tests of permissions: under random requests of random
//! principals, interleaved with grants and revocations, a refused request
//! changes nothing, what runs was allowed when it ran, and a retry under an
//! idempotency key is answered from its record whoever's grants changed
//! since (and never from another principal's record).

use oncekv_state::{
    ADMIN_ROLE, Access, AuthCommand, ClusterTime, Command, Entry, IdempotencyKey, Limits, LogIndex,
    Origin, Outcome, Permission, Principal, Proposal, Query, Request, StateMachine, TokenKey,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const USERS: [&str; 4] = ["root", "alice", "bob", "mallory"];

fn principal(i: usize) -> Option<Principal> {
    USERS.get(i).map(|name| Principal(name.to_string()))
}

/// What a step does.
#[derive(Clone, Debug)]
enum Step {
    /// A request of principal `who` (`None` past the users: nobody).
    Request {
        who: usize,
        key: Option<u8>,
        command: Command,
    },
    /// root grants `role` `access` on a key or prefix, or revokes it.
    Change(AuthCommand),
    /// The request that first applied under the `n`th kept key, again.
    Retry(usize),
}

/// The grants as the test sees them: role -> (key, prefix) -> access.
#[derive(Default)]
struct Model {
    grants: BTreeMap<String, BTreeMap<(Vec<u8>, bool), Access>>,
}

impl Model {
    fn change(&mut self, change: &AuthCommand) {
        match change {
            AuthCommand::RoleGrant { role, permission } => {
                self.grants.entry(role.clone()).or_default().insert(
                    (permission.key.clone(), permission.prefix),
                    permission.access,
                );
            }
            AuthCommand::RoleRevoke { role, key, prefix } => {
                if let Some(grants) = self.grants.get_mut(role) {
                    grants.remove(&(key.clone(), *prefix));
                }
            }
            _ => {}
        }
    }

    /// Whether `who` may run `command`, computed independently of the
    /// state machine: what each command needs, from the grants.
    fn allows(&self, who: Option<&Principal>, command: &Command) -> bool {
        let Some(who) = who else { return false };
        if who.0 == "root" {
            return true;
        }
        let role = match who.0.as_str() {
            "alice" => "ra",
            "bob" => "rb",
            _ => return false,
        };
        let grants = self.grants.get(role);
        let has = |test: &dyn Fn(&[u8], bool) -> bool, need: Access| {
            let mut read = false;
            let mut write = false;
            for ((key, prefix), access) in grants.into_iter().flatten() {
                if test(key, *prefix) {
                    read |= matches!(access, Access::Read | Access::ReadWrite);
                    write |= matches!(access, Access::Write | Access::ReadWrite);
                }
            }
            match need {
                Access::Read => read,
                Access::Write => write,
                Access::ReadWrite => read && write,
            }
        };
        let on_key = |k: &[u8]| {
            let k = k.to_vec();
            move |key: &[u8], prefix: bool| {
                if prefix { k.starts_with(key) } else { k == key }
            }
        };
        match command {
            Command::Put { key, .. } | Command::Delete { key } | Command::Append { key, .. } => {
                has(&on_key(key), Access::Write)
            }
            Command::Incr { key, .. } => has(&on_key(key), Access::ReadWrite),
            Command::Read(Query::Get { key }) => has(&on_key(key), Access::Read),
            Command::Read(Query::Scan { prefix, .. }) => {
                let p = prefix.clone();
                has(
                    &move |key: &[u8], is_prefix: bool| is_prefix && p.starts_with(key),
                    Access::Read,
                )
            }
            _ => false,
        }
    }
}

fn data_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"a/1".to_vec()),
        Just(b"a/2".to_vec()),
        Just(b"b/1".to_vec()),
        Just(b"c".to_vec())
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (data_key(), prop::collection::vec(b'a'..=b'z', 1..3)).prop_map(|(key, value)| {
            Command::Put {
                key,
                value: value.into(),
                lease: None,
            }
        }),
        data_key().prop_map(|key| Command::Delete { key }),
        data_key().prop_map(|key| Command::Incr { key, by: 1 }),
        (data_key(), prop::collection::vec(b'a'..=b'z', 1..3))
            .prop_map(|(key, value)| Command::Append { key, value }),
        data_key().prop_map(|key| Command::Read(Query::Get { key })),
        Just(Command::Read(Query::Scan {
            prefix: b"a/".to_vec(),
            limit: 0
        })),
        Just(Command::AlarmDisarm),
        Just(Command::Auth(AuthCommand::RoleAdd {
            name: "sneaky".into()
        })),
    ]
}

fn access() -> impl Strategy<Value = Access> {
    prop_oneof![
        Just(Access::Read),
        Just(Access::Write),
        Just(Access::ReadWrite)
    ]
}

fn change() -> impl Strategy<Value = AuthCommand> {
    let role = prop_oneof![Just("ra".to_string()), Just("rb".to_string())];
    let target = prop_oneof![
        Just((b"a/".to_vec(), true)),
        Just((b"b/1".to_vec(), false)),
        Just((Vec::new(), true))
    ];
    prop_oneof![
        (role.clone(), access(), target.clone()).prop_map(|(role, access, (key, prefix))| {
            AuthCommand::RoleGrant {
                role,
                permission: Permission {
                    access,
                    key,
                    prefix,
                },
            }
        }),
        (role, target).prop_map(|(role, (key, prefix))| AuthCommand::RoleRevoke {
            role,
            key,
            prefix
        }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0usize..5, prop::option::of(0u8..3), command())
            .prop_map(|(who, key, command)| Step::Request { who, key, command }),
        2 => change().prop_map(Step::Change),
        2 => (0usize..8).prop_map(Step::Retry),
    ]
}

struct Replica {
    machine: StateMachine,
    index: u64,
}

impl Replica {
    fn apply(&mut self, principal: Option<Principal>, request: Request) -> Outcome {
        self.index += 1;
        self.machine.apply(&Entry {
            index: LogIndex(self.index),
            proposal: Proposal {
                time: ClusterTime(self.index),
                principal,
                request,
            },
        })
    }
}

/// A machine with root (admin), alice (role ra), bob (role rb) and
/// mallory (no role), authentication enforced.
fn secured() -> Replica {
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
        AuthCommand::RoleAdd { name: "ra".into() },
        AuthCommand::RoleAdd { name: "rb".into() },
        AuthCommand::UserGrantRole {
            user: "alice".into(),
            role: "ra".into(),
        },
        AuthCommand::UserGrantRole {
            user: "bob".into(),
            role: "rb".into(),
        },
        AuthCommand::Enable {
            token_key: TokenKey([1; 32]),
        },
    ]);
    for change in setup {
        let outcome = replica.apply(None, Request::plain(Command::Auth(change)));
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    }
    replica
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn refusals_change_nothing_and_what_runs_was_allowed(steps in prop::collection::vec(step(), 1..60)) {
        let mut replica = secured();
        let mut model = Model::default();
        let mut kept: Vec<(Option<Principal>, u8, Command)> = Vec::new();
        // The first answer under each (principal, key).
        let mut first: BTreeMap<(Option<Principal>, u8), (Command, Outcome)> = BTreeMap::new();
        for step in steps {
            match step {
                Step::Change(change) => {
                    let root = principal(0);
                    let outcome = replica.apply(root, Request::plain(Command::Auth(change.clone())));
                    if outcome == Outcome::Applied(oncekv_state::Reply::AuthChanged) {
                        model.change(&change);
                    }
                }
                Step::Retry(n) => {
                    let Some((who, k, command)) = kept.get(n).cloned() else { continue };
                    let origin = Origin::Key(IdempotencyKey(vec![b'k', k]));
                    let outcome = replica.apply(who.clone(), Request { origin, command: command.clone() });
                    prop_assert!(
                        matches!(outcome, Outcome::Replayed { .. }),
                        "a retry of {command:?} by {who:?} under key {k} answered {outcome:?}"
                    );
                }
                Step::Request { who, key, command } => {
                    let who = principal(who);
                    let allowed = model.allows(who.as_ref(), &command);
                    let before = (replica.machine.kv().clone(), replica.machine.auth().clone());
                    let origin = match key {
                        Some(k) => Origin::Key(IdempotencyKey(vec![b'k', k])),
                        None => Origin::Plain,
                    };
                    let outcome = replica.apply(who.clone(), Request { origin, command: command.clone() });
                    match &outcome {
                        Outcome::PermissionDenied { .. } => {
                            prop_assert!(!allowed, "{command:?} of {who:?} was allowed");
                            let after = (replica.machine.kv().clone(), replica.machine.auth().clone());
                            prop_assert_eq!(&before, &after, "a refused request changed the state");
                        }
                        Outcome::Applied(_) => {
                            prop_assert!(allowed, "{:?} of {:?} ran without permission", command, who);
                        }
                        Outcome::Replayed { .. } => {
                            // Only the same principal's earlier request
                            // under the same key is replayed.
                            let k = key.expect("only keyed requests replay");
                            let (original, answered) = first
                                .get(&(who.clone(), k))
                                .expect("a replay of this principal's own key");
                            prop_assert_eq!(original, &command);
                            prop_assert!(matches!(answered, Outcome::Applied(_)));
                        }
                        _ => {}
                    }
                    if let Some(k) = key
                        && matches!(outcome, Outcome::Applied(_))
                    {
                        if !first.contains_key(&(who.clone(), k)) {
                            kept.push((who.clone(), k, command.clone()));
                        }
                        first.entry((who, k)).or_insert((command, outcome));
                    }
                }
            }
            prop_assert!(replica.machine.check_invariants().is_ok());
        }
        // Replicas that apply the same log agree: restore the snapshot and
        // compare.
        let restored = StateMachine::restore(replica.machine.limits(), &replica.machine.snapshot())
            .expect("the snapshot restores");
        prop_assert_eq!(restored.state_digest(), replica.machine.state_digest());
    }
}
