//! Target `etcd_request`: etcd's v3 requests through the etcd adapter's
//! conversions (`oncekv_server::grpc::etcd::fuzzing`: each handler's steps
//! before it proposes, reads or watches anything), then what the node
//! does with the result, minus consensus: `Limits::check_request` and
//! `StateMachine::apply` of what is proposed, `StateMachine::read` of
//! what is read, on a machine with [`limits`] (small ones, with room for
//! etcd's lease names); and the handler's answer to the reply.
//!
//! The input is a sequence of messages, each `[kind u8][time step
//! u8][length u16][protobuf bytes]`. `kind` modulo [`KINDS`] picks the
//! message the bytes decode as (see [`decode`]: Range, Put, DeleteRange,
//! Txn, Compaction, LeaseGrant, LeaseRevoke, LeaseKeepAlive, Watch,
//! Alarm, MemberAdd, Authenticate and the user and role changes); the
//! entry of a message that proposes is stamped `time step * 32` ms after
//! the one before (leases expire along the way). Bytes that do not decode
//! are skipped, as the gRPC server refuses them.
//!
//! Checked for every message that decodes:
//!
//! - nothing panics: decoding, conversion, checks, apply, read, answer;
//! - a refusal is a status from the adapter's errors table (a known code,
//!   etcd's or oncekv's text), never OK or INTERNAL;
//! - a command `check_request` refuses is answered with a status from
//!   the table too (as the node answers it), and is not executed when
//!   applied anyway (an auth change it refuses is not applied: the state
//!   machine does not check those again, see `propose`); one it accepts
//!   survives the log's encoding (postcard) unchanged;
//! - `check_invariants()` holds after every apply;
//! - the reply to what was proposed or read is one the handler expects:
//!   it answers a response or a refusal of the node, never "unexpected
//!   reply", "too few results", "without its response";
//! - a watch covers a range that holds keys, and its covering read is
//!   allowed and reads.

use crate::input::Input;
use oncekv_proto::etcd::etcdserverpb::{
    AlarmRequest, AuthRoleAddRequest, AuthRoleDeleteRequest, AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest, AuthUserAddRequest, AuthUserChangePasswordRequest,
    AuthUserDeleteRequest, AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest,
    AuthenticateRequest, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest,
    LeaseKeepAliveRequest, LeaseRevokeRequest, MemberAddRequest, PutRequest, RangeRequest,
    TxnRequest, WatchRequest,
};
use oncekv_server::grpc::etcd::fuzzing::{Converted, EtcdRequest, Plan, convert};
use oncekv_server::grpc::etcd::status_of;
use oncekv_server::raft::consensus::WriteError;
use oncekv_state::{
    ClusterTime, Entry, KeyScope, Limits, LogIndex, Origin, Outcome, Proposal, Query, Reply,
    Request, StateMachine,
};
use prost::Message;
use tonic::{Code, Status};

/// How many kinds of message an input can carry.
pub const KINDS: u8 = 21;

/// Cluster time between two entries per unit of an input's time step.
const TIME_STEP_MS: u64 = 32;

/// The bytes of the node's name of an etcd lease (`etcd-` and 16 hex
/// digits).
const ETCD_LEASE_NAME_BYTES: usize = 21;

/// The limits the target runs under: [`small_limits`](crate::small_limits),
/// so that a few requests reach every bound, with room for etcd's lease
/// names (which the small limits' 8 bytes would all refuse) and for the
/// reads etcd's transactions make (a `prev_kv` is a read: under the small
/// limits' reply bound of 192 bytes one read fills a transaction's reply).
pub fn limits() -> Limits {
    Limits {
        lease_name_bytes_max: ETCD_LEASE_NAME_BYTES,
        scan_bytes_max: 512,
        ..crate::small_limits()
    }
}

/// `bytes` decoded as the message of `kind` (modulo [`KINDS`]).
pub fn decode(kind: u8, bytes: &[u8]) -> Option<EtcdRequest> {
    fn of<M: Message + Default>(bytes: &[u8], wrap: fn(M) -> EtcdRequest) -> Option<EtcdRequest> {
        M::decode(bytes).ok().map(wrap)
    }
    match kind % KINDS {
        0 => of::<RangeRequest>(bytes, EtcdRequest::Range),
        1 => of::<PutRequest>(bytes, EtcdRequest::Put),
        2 => of::<DeleteRangeRequest>(bytes, EtcdRequest::DeleteRange),
        3 => of::<TxnRequest>(bytes, EtcdRequest::Txn),
        4 => of::<CompactionRequest>(bytes, EtcdRequest::Compaction),
        5 => of::<LeaseGrantRequest>(bytes, EtcdRequest::LeaseGrant),
        6 => of::<LeaseRevokeRequest>(bytes, EtcdRequest::LeaseRevoke),
        7 => of::<LeaseKeepAliveRequest>(bytes, EtcdRequest::LeaseKeepAlive),
        8 => of::<WatchRequest>(bytes, EtcdRequest::Watch),
        9 => of::<AlarmRequest>(bytes, EtcdRequest::Alarm),
        10 => of::<MemberAddRequest>(bytes, EtcdRequest::MemberAdd),
        11 => of::<AuthenticateRequest>(bytes, EtcdRequest::Authenticate),
        12 => of::<AuthUserAddRequest>(bytes, EtcdRequest::UserAdd),
        13 => of::<AuthUserDeleteRequest>(bytes, EtcdRequest::UserDelete),
        14 => of::<AuthUserChangePasswordRequest>(bytes, EtcdRequest::UserChangePassword),
        15 => of::<AuthUserGrantRoleRequest>(bytes, EtcdRequest::UserGrantRole),
        16 => of::<AuthUserRevokeRoleRequest>(bytes, EtcdRequest::UserRevokeRole),
        17 => of::<AuthRoleAddRequest>(bytes, EtcdRequest::RoleAdd),
        18 => of::<AuthRoleDeleteRequest>(bytes, EtcdRequest::RoleDelete),
        19 => of::<AuthRoleGrantPermissionRequest>(bytes, EtcdRequest::RoleGrantPermission),
        _ => of::<AuthRoleRevokePermissionRequest>(bytes, EtcdRequest::RoleRevokePermission),
    }
}

/// The kind byte of `request`'s message ([`decode`]'s inverse).
pub fn kind_of(request: &EtcdRequest) -> u8 {
    match request {
        EtcdRequest::Range(_) => 0,
        EtcdRequest::Put(_) => 1,
        EtcdRequest::DeleteRange(_) => 2,
        EtcdRequest::Txn(_) => 3,
        EtcdRequest::Compaction(_) => 4,
        EtcdRequest::LeaseGrant(_) => 5,
        EtcdRequest::LeaseRevoke(_) => 6,
        EtcdRequest::LeaseKeepAlive(_) => 7,
        EtcdRequest::Watch(_) => 8,
        EtcdRequest::Alarm(_) => 9,
        EtcdRequest::MemberAdd(_) => 10,
        EtcdRequest::Authenticate(_) => 11,
        EtcdRequest::UserAdd(_) => 12,
        EtcdRequest::UserDelete(_) => 13,
        EtcdRequest::UserChangePassword(_) => 14,
        EtcdRequest::UserGrantRole(_) => 15,
        EtcdRequest::UserRevokeRole(_) => 16,
        EtcdRequest::RoleAdd(_) => 17,
        EtcdRequest::RoleDelete(_) => 18,
        EtcdRequest::RoleGrantPermission(_) => 19,
        EtcdRequest::RoleRevokePermission(_) => 20,
    }
}

/// What one input did, for the smoke run's check that seeds reach deep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Messages that decoded.
    pub decoded: u64,
    /// Messages the adapter refused.
    pub refused: u64,
    /// Commands that passed `check_request` and were applied.
    pub applied: u64,
    /// Reads made.
    pub read: u64,
}

/// Runs one input; panics when a property breaks.
pub fn etcd_request(data: &[u8]) {
    reached(data);
}

/// Runs one input and returns what it reached; panics when a property
/// breaks.
pub fn reached(data: &[u8]) -> Reached {
    let limits = limits();
    let mut machine = StateMachine::new(limits.clone());
    let mut input = Input::new(data);
    let mut reached = Reached::default();
    let mut index = 0u64;
    let mut time = 0u64;
    while !input.is_empty() {
        let kind = input.byte().unwrap_or(0);
        let step = input.byte().unwrap_or(0);
        let length = input.u16().unwrap_or(0);
        let bytes = input.take(usize::from(length));
        let Some(request) = decode(kind, bytes) else {
            continue;
        };
        reached.decoded += 1;
        // The ID a grant without one gets: positive, as the handler's.
        let chosen = i64::try_from(index + 1).unwrap_or(i64::MAX);
        let plan = match convert(&request, &limits, machine.auth(), chosen) {
            Ok(plan) => plan,
            Err(status) => {
                check_typed(&status, &request);
                reached.refused += 1;
                continue;
            }
        };
        match plan.converted().clone() {
            Converted::Write(command) => {
                time += u64::from(step) * TIME_STEP_MS;
                index += 1;
                let request = Request {
                    origin: Origin::Plain,
                    command,
                };
                let applied = propose(&mut machine, &plan, request, index, time);
                reached.applied += u64::from(applied);
            }
            Converted::Read(query) => {
                let reply = machine.read(&query);
                check_answer(&plan, plan.respond(reply), &request);
                reached.read += 1;
            }
            Converted::Watch {
                key,
                scope,
                start_revision: _,
            } => {
                check_watch(&machine, &key, &scope);
                reached.read += 1;
            }
            Converted::Member(info) => {
                assert!(
                    !info.peer_address.is_empty() && !info.client_address.is_empty(),
                    "a member without an address: {info:?}"
                );
            }
            Converted::Login { .. } | Converted::Answered => {}
        }
    }
    reached
}

/// What the node does with a command: `check_request`, then (here,
/// whatever it said, to see the state machine refuse it too) apply;
/// returns whether it passed the check.
fn propose(
    machine: &mut StateMachine,
    plan: &Plan,
    request: Request,
    index: u64,
    time: u64,
) -> bool {
    let refusal = machine.limits().check_request(&request).err();
    if let Some(refusal) = &refusal {
        let status = status_of(WriteError::Invalid(refusal.clone()));
        check_typed(&status, &request);
    } else {
        let encoded = postcard::to_allocvec(&request)
            .unwrap_or_else(|e| panic!("{request:?} does not encode for the log: {e}"));
        let decoded: Request = postcard::from_bytes(&encoded)
            .unwrap_or_else(|e| panic!("{request:?} does not decode from the log: {e}"));
        assert_eq!(decoded, request, "the log's encoding changed the request");
    }
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
    match refusal {
        Some(refusal) => {
            assert!(
                !executed(&outcome),
                "{entry:?} was refused before proposing ({refusal}) but executed: {outcome:?}"
            );
            false
        }
        None => {
            check_answer(plan, plan.answer(outcome), &entry.proposal.request);
            true
        }
    }
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

/// The handler's answer to a reply is a response or a refusal from the
/// table, never a sign that the plan and the reply disagree.
fn check_answer(plan: &Plan, answer: Result<(), Status>, request: &dyn std::fmt::Debug) {
    let Err(status) = answer else {
        return;
    };
    check_typed(&status, request);
    let mismatch = [
        "unexpected reply",
        "too few results",
        "without its response",
        "no put response",
        "no delete response",
    ];
    assert!(
        !mismatch.iter().any(|text| status.message().contains(text)),
        "the reply to {plan:?} is not what its handler expects: {status:?}"
    );
}

/// A status from the errors table: a code the table uses, and its text.
fn check_typed(status: &Status, request: &dyn std::fmt::Debug) {
    let known = [
        Code::InvalidArgument,
        Code::OutOfRange,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::NotFound,
        Code::PermissionDenied,
        Code::Unauthenticated,
        Code::Unimplemented,
        Code::Unavailable,
        Code::Unknown,
    ];
    assert!(
        known.contains(&status.code()),
        "{request:?} answered with code {:?}: {status:?}",
        status.code()
    );
    let texts = ["etcdserver: ", "oncekv: ", "mvcc: "];
    assert!(
        texts
            .iter()
            .any(|prefix| status.message().starts_with(prefix)),
        "{request:?} answered with a text not from the table: {status:?}"
    );
}

/// A watch the adapter starts covers keys, and its covering read is
/// allowed (authentication is off) and reads.
fn check_watch(machine: &StateMachine, key: &[u8], scope: &KeyScope) {
    let range = scope.range_from(key);
    assert!(
        !range.is_empty(),
        "a watch of {key:?} in {scope:?} covers no key"
    );
    let covered = Query::covering(key, scope);
    if let Err(denied) = machine.check_query(None, &covered) {
        panic!("the read covering a watch of {key:?} in {scope:?} is denied: {denied}");
    }
    let _ = machine.read(&covered);
}
