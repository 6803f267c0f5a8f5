//! Target `client_request`: client wire requests through the whole path a
//! node takes them on, minus consensus: protobuf decoding
//! (`oncekv_proto::v1::ExecuteRequest`), `convert::request_from_wire`,
//! `Limits::check_request`, then `StateMachine::apply` on a machine with
//! [`small_limits`](crate::small_limits), so that a few requests reach every
//! bound.
//!
//! The input is a sequence of messages, each `[time step u8][length
//! u8][protobuf bytes]`: the entry carrying a message is stamped
//! `time step * 32` ms after the one before (sessions, idempotency keys and
//! leases expire along the way). Sessions opened here get the secret
//! [`SESSION_SECRET`], so later messages can use them.
//!
//! Checked after every message that converts:
//!
//! - nothing panics (decoding, conversion, checks, apply);
//! - `check_invariants()` holds;
//! - a request that `check_request` refuses (and the node would never
//!   propose) is not executed when applied anyway: its outcome is a
//!   refusal or a `Rejected` reply;
//! - the request goes back to the wire (and through protobuf) unchanged,
//!   and so does the outcome;
//! - memory accounting: `stats()` byte counts are what the collections
//!   hold, the store stays within its quota, all sessions' completion
//!   records and the idempotency records within their budgets plus one
//!   record, each session's within its budget plus two records (the
//!   lowest awaited request is let through a full session budget), and
//!   no table holds more entries than its limit.

use crate::input::Input;
use oncekv_proto::convert;
use oncekv_proto::v1;
use oncekv_state::{
    ClusterTime, Command, ENTRY_OVERHEAD_BYTES, Entry, IdempotencyKey, Limits, LogIndex, Outcome,
    Proposal, Reply, Request, Secret, StateMachine, entry_weight_bytes,
};
use prost::Message;

/// The secret every session opened by this target gets (the leader would
/// draw one at random).
pub const SESSION_SECRET: Secret = Secret(1);

/// Cluster time between two entries per unit of an input's time step.
const TIME_STEP_MS: u64 = 32;

/// Runs one input; panics when a property breaks.
pub fn client_request(data: &[u8]) {
    applied_requests(data);
}

/// Runs one input and returns how many requests it applied (those that
/// decoded and converted); panics when a property breaks.
pub fn applied_requests(data: &[u8]) -> u64 {
    let limits = crate::small_limits();
    let mut machine = StateMachine::new(limits.clone());
    let mut input = Input::new(data);
    let mut index = 0u64;
    let mut time = 0u64;
    let mut longest_name = 0usize;
    while !input.is_empty() {
        let step = input.byte().unwrap_or(0);
        let length = input.byte().unwrap_or(0);
        let message = input.take(usize::from(length));
        time += u64::from(step) * TIME_STEP_MS;
        let Ok(wire) = v1::ExecuteRequest::decode(message) else {
            continue;
        };
        let Ok(mut request) = convert::request_from_wire(wire) else {
            continue;
        };
        stamp_secret(&mut request);
        check_request_round_trip(&request);
        longest_name = longest_name.max(lease_name_bytes(&request.command));
        let refusal = limits.check_request(&request).err();
        index += 1;
        let entry = Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(time),
                principal: None,
                request,
            },
        };
        let outcome = machine.apply(&entry);
        if let Err(broken) = machine.check_invariants() {
            panic!("invariant broken after {entry:?} -> {outcome:?}: {broken}");
        }
        if let Some(refusal) = refusal {
            assert!(
                !executed(&outcome),
                "{entry:?} was refused before proposing ({refusal}) but executed: {outcome:?}"
            );
        }
        check_outcome_round_trip(&outcome);
        check_budgets(&machine, &limits, longest_name);
    }
    index
}

/// Whether an outcome says the command ran (a reply other than a
/// rejection, first time or replayed).
fn executed(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Applied(reply) | Outcome::Replayed { reply, .. } => {
            !matches!(reply, Reply::Rejected(_))
        }
        _ => false,
    }
}

/// The length of a lease name the command carries: `LeaseKeepAlive` and
/// `LeaseRevoke` names are not length-checked, and a `LeaseNotFound`
/// reply (which is recorded) holds the name.
fn lease_name_bytes(command: &Command) -> usize {
    match command {
        Command::LeaseGrant { name, .. }
        | Command::LeaseKeepAlive { name }
        | Command::LeaseRevoke { name } => name.len(),
        Command::Put {
            lease: Some(name), ..
        } => name.len(),
        _ => 0,
    }
}

/// What the leader does when it proposes a session open: it draws the
/// secret (here always [`SESSION_SECRET`], so later messages can use it).
fn stamp_secret(request: &mut Request) {
    if let oncekv_state::Command::OpenSession { secret, .. } = &mut request.command {
        *secret = SESSION_SECRET;
    }
}

fn check_request_round_trip(request: &Request) {
    let wire = convert::request_to_wire(request)
        .unwrap_or_else(|e| panic!("{request:?} came from the wire but does not go back: {e}"));
    let decoded = v1::ExecuteRequest::decode(wire.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("{wire:?} does not decode after encoding: {e}"));
    assert_eq!(decoded, wire, "protobuf round trip changed the request");
    let mut back = convert::request_from_wire(decoded)
        .unwrap_or_else(|e| panic!("{request:?} does not convert back: {e}"));
    stamp_secret(&mut back);
    assert_eq!(&back, request, "wire round trip changed the request");
}

fn check_outcome_round_trip(outcome: &Outcome) {
    let wire = convert::outcome_to_wire(outcome);
    let decoded = v1::Outcome::decode(wire.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("{wire:?} does not decode after encoding: {e}"));
    let back = convert::outcome_from_wire(decoded)
        .unwrap_or_else(|e| panic!("{outcome:?} does not convert back from the wire: {e}"));
    assert_eq!(&back, outcome, "wire round trip changed the outcome");
}

/// The byte counts and table sizes stay within the limits (see the module
/// doc for the allowances).
fn check_budgets(machine: &StateMachine, limits: &Limits, longest_name: usize) {
    let stats = machine.stats();
    // The heaviest reply a record can hold: a value (previous or current)
    // or a lease name, plus the fixed allowance.
    let contents = limits
        .value_bytes_max
        .max(limits.lease_name_bytes_max)
        .max(longest_name);
    let one_record = ENTRY_OVERHEAD_BYTES + contents as u64;
    let one_key_record = IdempotencyKey::BYTES_MAX as u64 + one_record + ENTRY_OVERHEAD_BYTES;

    let store: u64 = machine
        .kv()
        .iter()
        .map(|(key, stored)| entry_weight_bytes(key, stored))
        .sum();
    assert_eq!(stats.store_bytes, store, "store byte count out of step");
    assert!(
        stats.store_bytes <= limits.store_bytes_max,
        "store holds {} bytes over its quota {}",
        stats.store_bytes,
        limits.store_bytes_max
    );

    let mut records = 0;
    for session in machine.sessions().iter() {
        records += session.records_bytes();
        assert!(
            session.records_bytes() <= limits.session_record_bytes_max + 2 * one_record,
            "session {:?} holds {} record bytes, budget {} plus two records of at most {one_record}",
            session.id(),
            session.records_bytes(),
            limits.session_record_bytes_max
        );
    }
    assert_eq!(
        stats.completion_record_bytes, records,
        "completion record bytes out of step"
    );
    assert!(
        stats.completion_record_bytes <= limits.record_bytes_max + one_record,
        "sessions hold {} record bytes, budget {} plus one record of at most {one_record}",
        stats.completion_record_bytes,
        limits.record_bytes_max
    );
    assert!(
        stats.idempotency_bytes <= limits.idempotency_bytes_max + one_key_record,
        "idempotency records hold {} bytes, budget {} plus one record of at most {one_key_record}",
        stats.idempotency_bytes,
        limits.idempotency_bytes_max
    );

    assert!(stats.keys <= limits.kv_keys_max, "{stats:?}");
    assert!(stats.sessions <= limits.sessions_max, "{stats:?}");
    assert!(
        stats.idempotency_keys <= limits.idempotency_keys_max,
        "{stats:?}"
    );
    assert!(stats.leases <= limits.leases_max, "{stats:?}");
}
