//! Key ranges against a model: over any store of a few keys, a range read
//! returns the keys in the range in order with their count, a range delete
//! removes exactly them, a compare over a range holds exactly when it holds
//! for every key in it (or, with none, for an absent key), and the
//! permission to read a range is what one grant covering it gives.

use oncekv_state::{
    Access, AuthCommand, ClusterTime, Command, Compare, CompareOp, Entry, KeyRange, KeyScope,
    Limits, LogIndex, Outcome, Permission, Principal, Proposal, Query, Reply, Request,
    StateMachine, TokenKey, Txn, TxnOp,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Keys drawn from a small alphabet, so ranges catch some of them.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(b'a'), Just(b'b'), Just(0u8), Just(0xff)],
        1..4,
    )
}

fn key_range() -> impl Strategy<Value = KeyRange> {
    let start = prop_oneof![1 => Just(Vec::new()), 6 => key()];
    (start, prop::option::of(key())).prop_map(|(start, end)| KeyRange { start, end })
}

/// A machine holding `contents`, one put per entry; returns the next index.
fn machine_with(contents: &BTreeMap<Vec<u8>, Vec<u8>>) -> (StateMachine, u64) {
    let mut machine = StateMachine::new(Limits::default());
    let mut index = 0;
    for (key, value) in contents {
        index += 1;
        let put = Command::Put {
            key: key.clone(),
            value: value.clone().into(),
            lease: None,
        };
        apply(&mut machine, index, put);
    }
    (machine, index + 1)
}

fn apply(machine: &mut StateMachine, index: u64, command: Command) -> Outcome {
    machine.apply(&Entry {
        index: LogIndex(index),
        proposal: Proposal {
            time: ClusterTime(0),
            principal: None,
            request: Request::plain(command),
        },
    })
}

fn contents() -> impl Strategy<Value = BTreeMap<Vec<u8>, Vec<u8>>> {
    prop::collection::btree_map(key(), prop::collection::vec(b'0'..=b'2', 1..2), 0..12)
}

proptest! {
    #[test]
    fn a_range_read_returns_the_keys_in_it_with_their_count(
        contents in contents(),
        range in key_range(),
        limit in 0u32..4,
    ) {
        let (machine, _) = machine_with(&contents);
        let within: Vec<(&Vec<u8>, &Vec<u8>)> =
            contents.iter().filter(|(key, _)| range.contains(key)).collect();
        let reply = machine.read(&Query::Range { range: range.clone(), limit });
        let Reply::Range { entries, more, count } = reply else {
            return Err(TestCaseError::fail(format!("{reply:?}")));
        };
        let shown = if limit == 0 { within.len() } else { within.len().min(limit as usize) };
        let read: Vec<(&Vec<u8>, &Vec<u8>)> = entries.iter().map(|kv| (&kv.key, &kv.value)).collect();
        prop_assert_eq!(&read[..], &within[..shown]);
        prop_assert_eq!(more, within.len() > shown);
        prop_assert_eq!(count, within.len() as u64);
    }

    #[test]
    fn a_range_delete_removes_exactly_the_keys_in_it(
        contents in contents(),
        range in key_range(),
    ) {
        let (mut machine, index) = machine_with(&contents);
        let txn = Txn::new().on_success(TxnOp::DeleteRange { range: range.clone() });
        let outcome = apply(&mut machine, index, Command::Txn(txn));
        let deleted = contents.keys().filter(|key| range.contains(key)).count() as u64;
        prop_assert_eq!(
            outcome,
            Outcome::Applied(Reply::Txn { succeeded: true, results: vec![Reply::DeletePrefix { deleted }] })
        );
        let left: Vec<&Vec<u8>> = machine.kv().iter().map(|(key, _)| key).collect();
        let expected: Vec<&Vec<u8>> = contents.keys().filter(|key| !range.contains(key)).collect();
        prop_assert_eq!(left, expected);
        // Every removed key changed at this one revision.
        let events = machine.kv().history().since(index).expect("not compacted").count() as u64;
        prop_assert_eq!(events, deleted);
    }

    #[test]
    fn a_range_compare_holds_when_it_holds_for_every_key_in_the_range(
        contents in contents(),
        range in key_range(),
        value in prop::collection::vec(b'0'..=b'2', 1..2),
        op in prop_oneof![
            Just(CompareOp::Equal),
            Just(CompareOp::NotEqual),
            Just(CompareOp::Less),
            Just(CompareOp::Greater)
        ],
    ) {
        let (mut machine, index) = machine_with(&contents);
        let compare = Compare::value(range.start.clone(), op, value.clone()).over_range(range.end.clone());
        let holds = |stored: &Vec<u8>| match op {
            CompareOp::Equal => *stored == value,
            CompareOp::NotEqual => *stored != value,
            CompareOp::Less => *stored < value,
            CompareOp::Greater => *stored > value,
        };
        let within: Vec<&Vec<u8>> =
            contents.iter().filter(|(key, _)| range.contains(key)).map(|(_, v)| v).collect();
        // A value compare over no key is false, as on an absent key.
        let expected = !within.is_empty() && within.into_iter().all(holds);
        let txn = Txn::new().compare(compare);
        let outcome = apply(&mut machine, index, Command::Txn(txn));
        prop_assert_eq!(outcome, Outcome::Applied(Reply::Txn { succeeded: expected, results: vec![] }));
    }

    #[test]
    fn a_range_is_readable_when_one_grant_covers_it(
        granted in key(),
        prefix in any::<bool>(),
        range in key_range(),
        keys in prop::collection::vec(key(), 0..6),
    ) {
        let mut machine = StateMachine::new(Limits::default());
        let commands = [
            AuthCommand::UserAdd { name: "root".into(), password_hash: Some("$argon2id$x".into()) },
            AuthCommand::UserGrantRole { user: "root".into(), role: "admin".into() },
            AuthCommand::UserAdd { name: "u".into(), password_hash: Some("$argon2id$x".into()) },
            AuthCommand::RoleAdd { name: "r".into() },
            AuthCommand::RoleGrant {
                role: "r".into(),
                permission: Permission { access: Access::Read, key: granted.clone(), prefix },
            },
            AuthCommand::UserGrantRole { user: "u".into(), role: "r".into() },
            AuthCommand::Enable { token_key: TokenKey([1; 32]) },
        ];
        for (index, command) in commands.into_iter().enumerate() {
            let outcome = apply(&mut machine, index as u64 + 1, Command::Auth(command));
            prop_assert_eq!(outcome, Outcome::Applied(Reply::AuthChanged));
        }
        let user = Principal("u".into());
        let query = Query::Range { range: range.clone(), limit: 0 };
        let allowed = machine.check_query(Some(&user), &query).is_ok();
        let covered = |key: &Vec<u8>| {
            if prefix { key.starts_with(&granted) } else { *key == granted }
        };
        if allowed {
            // Whatever key falls in the range is one the grant covers.
            for key in keys.iter().filter(|key| range.contains(key)) {
                prop_assert!(covered(key), "{:?} read through {:?}", key, range);
            }
        }
        // The grant's own range, and the one key, are readable.
        let own = if prefix { KeyRange::prefix(granted.clone()) } else { KeyRange::one(granted.clone()) };
        let own = Query::Range { range: own, limit: 0 };
        prop_assert!(machine.check_query(Some(&user), &own).is_ok());
        let scope = if prefix { KeyScope::Prefix } else { KeyScope::Key };
        prop_assert!(machine.check_query(Some(&user), &Query::covering(&granted, &scope)).is_ok());
    }
}
