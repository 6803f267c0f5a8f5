//! The adapter's conversions of etcd's requests, reachable without a node:
//! what each handler makes of its decoded message before it proposes,
//! reads or watches anything (the node's command, query or watch, or a
//! refusal from the errors table), and how the node's reply to it becomes
//! etcd's response. For the fuzz target `etcd_request`
//! (`crates/oncekv-fuzz`), which decodes arbitrary bytes as etcd's
//! messages, runs them through `convert`, checks what is proposed with
//! `Limits::check_request` and applies it to a state machine. Not an API.
//!
//! Each arm takes the handler's steps in the handler's order, with the
//! handler's own functions; only what needs a running node is given
//! instead (the limits, the users and roles, the ID a grant without one
//! gets) or left out (routing to the leader, credentials and the admin
//! check, watch IDs, the read a `prev_kv` delete of a range makes first,
//! membership changes themselves). A change to a handler's checks belongs
//! here too.

use super::auth::{
    ROOT, check_password, holdable, key_or_prefix, permission_from_wire, role_name_across,
    role_permissions,
};
use super::cluster::member_addresses;
use super::errors::EtcdError;
use super::kv::{Keys, Planned, RangeParts, check_put, lease_of, range_response, rejected};
use super::lease::lease_name;
use super::revision_from_wire;
use crate::raft::type_config::NodeInfo;
use oncekv_proto::etcd::etcdserverpb::alarm_request::AlarmAction;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    AlarmRequest, AlarmType, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, AuthenticateRequest, CompactionRequest, DeleteRangeRequest,
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, MemberAddRequest, PutRequest,
    RangeRequest, RequestOp, ResponseOp, TxnRequest, WatchRequest, request_op, response_op,
};
use oncekv_state::{
    ADMIN_ROLE, AuthCommand, AuthTable, Command, KeyScope, Limits, Outcome, Query, Rejection, Reply,
};
use tonic::Status;

/// An etcd request, decoded, as its handler receives it.
#[derive(Clone, Debug)]
pub enum EtcdRequest {
    /// `KV.Range`.
    Range(RangeRequest),
    /// `KV.Put`.
    Put(PutRequest),
    /// `KV.DeleteRange`.
    DeleteRange(DeleteRangeRequest),
    /// `KV.Txn`.
    Txn(TxnRequest),
    /// `KV.Compact`.
    Compaction(CompactionRequest),
    /// `Lease.LeaseGrant`.
    LeaseGrant(LeaseGrantRequest),
    /// `Lease.LeaseRevoke`.
    LeaseRevoke(LeaseRevokeRequest),
    /// One message of a `Lease.LeaseKeepAlive` stream.
    LeaseKeepAlive(LeaseKeepAliveRequest),
    /// One message of a `Watch.Watch` stream.
    Watch(WatchRequest),
    /// `Maintenance.Alarm`.
    Alarm(AlarmRequest),
    /// `Cluster.MemberAdd`.
    MemberAdd(MemberAddRequest),
    /// `Auth.Authenticate`.
    Authenticate(AuthenticateRequest),
    /// `Auth.UserAdd`.
    UserAdd(AuthUserAddRequest),
    /// `Auth.UserDelete`.
    UserDelete(AuthUserDeleteRequest),
    /// `Auth.UserChangePassword`.
    UserChangePassword(AuthUserChangePasswordRequest),
    /// `Auth.UserGrantRole`.
    UserGrantRole(AuthUserGrantRoleRequest),
    /// `Auth.UserRevokeRole`.
    UserRevokeRole(AuthUserRevokeRoleRequest),
    /// `Auth.RoleAdd`.
    RoleAdd(AuthRoleAddRequest),
    /// `Auth.RoleDelete`.
    RoleDelete(AuthRoleDeleteRequest),
    /// `Auth.RoleGrantPermission`.
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    /// `Auth.RoleRevokePermission`.
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
}

/// What the adapter makes of a request it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Converted {
    /// Proposed as this command (the node checks it with
    /// `Limits::check_request` first).
    Write(Command),
    /// Read as this query from the applied state.
    Read(Query),
    /// A watch of `key` in `scope` from `start_revision` (0: now).
    Watch {
        /// The first key watched.
        key: Vec<u8>,
        /// Which keys from it.
        scope: KeyScope,
        /// The revision to start from.
        start_revision: u64,
    },
    /// A login: the node checks the name and password as given.
    Login {
        /// The user.
        name: String,
        /// The password.
        password: String,
    },
    /// A new member at these addresses.
    Member(NodeInfo),
    /// Answered without a command: a watch cancel or progress request,
    /// an alarm listing, adding the built-in root role.
    Answered,
}

/// How the handler answers the node's reply.
enum Answer {
    /// The reply is not looked at.
    Nothing,
    /// A Range's response.
    Range(RangeParts),
    /// A rejection is the error; any other reply, the response.
    Rejected,
    /// A transaction's responses.
    Txn(Planned),
    /// One operation run as a transaction, whose single response must be
    /// a put's (`true`) or a delete's.
    OneOp(Planned, bool),
    /// `LeaseGranted`.
    LeaseGranted,
    /// `LeaseRevoked`.
    LeaseRevoked,
    /// `LeaseKeptAlive`, or a lease not found (TTL 0).
    LeaseKeptAlive,
    /// `AuthChanged`; a rejection as the function says.
    AuthChanged(fn(&Rejection) -> EtcdError),
}

/// A request as the adapter takes it: what it becomes, and how the reply
/// to that is answered.
pub struct Plan {
    converted: Converted,
    answer: Answer,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("converted", &self.converted)
            .finish_non_exhaustive()
    }
}

impl Plan {
    fn new(converted: Converted, answer: Answer) -> Plan {
        Plan { converted, answer }
    }

    fn write(command: Command, answer: Answer) -> Plan {
        Plan::new(Converted::Write(command), answer)
    }

    /// What the request becomes.
    pub fn converted(&self) -> &Converted {
        &self.converted
    }

    /// The handler's answer to the outcome of its write: the response
    /// built from the reply of an applied or replayed command, or the
    /// refusal from the errors table.
    pub fn answer(&self, outcome: Outcome) -> Result<(), Status> {
        match outcome {
            Outcome::Applied(reply) | Outcome::Replayed { reply, .. } => self.respond(reply),
            other => Err(EtcdError::of_outcome(&other).into()),
        }
    }

    /// The handler's answer to `reply` (to its command, or to its read):
    /// the response is built and dropped; an error is the status the call
    /// would end with. A reply the plan does not expect is answered
    /// INVALID_ARGUMENT, "oncekv: unexpected reply ..." (or "... too few
    /// results", "... without its response", "no ... response").
    pub fn respond(&self, reply: Reply) -> Result<(), Status> {
        let unexpected = |reply: Reply| EtcdError::Invalid(format!("unexpected reply {reply:?}"));
        let result = match &self.answer {
            Answer::Nothing => Ok(()),
            Answer::Range(parts) => range_response(reply, parts).map(drop),
            Answer::Rejected => rejected(reply).map(drop),
            Answer::Txn(planned) => planned.responses(reply).map(drop),
            Answer::OneOp(planned, put) => one_response(planned, reply, *put),
            Answer::LeaseGranted => match reply {
                Reply::LeaseGranted { .. } => Ok(()),
                Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection)),
                other => Err(unexpected(other)),
            },
            Answer::LeaseRevoked => match reply {
                Reply::LeaseRevoked { .. } => Ok(()),
                Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection)),
                other => Err(unexpected(other)),
            },
            Answer::LeaseKeptAlive => match reply {
                Reply::LeaseKeptAlive { .. } | Reply::Rejected(Rejection::LeaseNotFound { .. }) => {
                    Ok(())
                }
                Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection)),
                other => Err(unexpected(other)),
            },
            Answer::AuthChanged(refused) => match reply {
                Reply::AuthChanged => Ok(()),
                Reply::Rejected(rejection) => Err(refused(&rejection)),
                other => Err(unexpected(other)),
            },
        };
        result.map_err(Status::from)
    }
}

/// The response of one operation run as a transaction (as `one_op`
/// answers it), which must be a put's or a delete's.
fn one_response(planned: &Planned, reply: Reply, put: bool) -> Result<(), EtcdError> {
    let (_, mut responses) = planned.responses(reply)?;
    let response = match responses.pop() {
        Some(ResponseOp {
            response: Some(response),
        }) => response,
        _ => {
            return Err(EtcdError::Invalid(
                "a transaction without its response".to_string(),
            ));
        }
    };
    match (response, put) {
        (response_op::Response::ResponsePut(_), true)
        | (response_op::Response::ResponseDeleteRange(_), false) => Ok(()),
        (_, true) => Err(EtcdError::Invalid("no put response".to_string())),
        (_, false) => Err(EtcdError::Invalid("no delete response".to_string())),
    }
}

/// One operation as a transaction of the node's, as `one_op` plans it.
fn one_op(op: request_op::Request, put: bool) -> Result<Plan, EtcdError> {
    let planned = Planned::of(&TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp { request: Some(op) }],
        failure: Vec::new(),
    })?;
    Ok(Plan::write(
        Command::Txn(planned.txn.clone()),
        Answer::OneOp(planned, put),
    ))
}

/// What the handler of `request` makes of it before it proposes, reads or
/// watches anything: a [`Plan`], or the status the call ends with. The
/// lease TTL bounds are `limits`'; `users` are the users and roles the
/// checks that read them see; a grant that asks for no lease ID gets
/// `chosen_lease_id` (the handler draws one, always positive).
pub fn convert(
    request: &EtcdRequest,
    limits: &Limits,
    users: &AuthTable,
    chosen_lease_id: i64,
) -> Result<Plan, Status> {
    convert_request(request, limits, users, chosen_lease_id).map_err(Status::from)
}

fn convert_request(
    request: &EtcdRequest,
    limits: &Limits,
    users: &AuthTable,
    chosen_lease_id: i64,
) -> Result<Plan, EtcdError> {
    let auth = |change: AuthCommand| {
        Ok(Plan::write(
            Command::Auth(change),
            Answer::AuthChanged(EtcdError::of_rejection),
        ))
    };
    match request {
        EtcdRequest::Range(range) => {
            let parts = RangeParts::of(range)?;
            Ok(Plan::new(
                Converted::Read(parts.query()),
                Answer::Range(parts),
            ))
        }
        EtcdRequest::Put(put) => {
            check_put(put)?;
            if put.prev_kv || put.ignore_value || put.ignore_lease {
                return one_op(request_op::Request::RequestPut(put.clone()), true);
            }
            let command = Command::Put {
                key: put.key.clone(),
                value: put.value.clone().into(),
                lease: lease_of(put),
            };
            Ok(Plan::write(command, Answer::Rejected))
        }
        EtcdRequest::DeleteRange(delete) => {
            if delete.prev_kv {
                // (Of a prefix or range, the handler reads the keys first.)
                Keys::of(&delete.key, &delete.range_end)?;
            }
            one_op(
                request_op::Request::RequestDeleteRange(delete.clone()),
                false,
            )
        }
        EtcdRequest::Txn(txn) => {
            let planned = Planned::of(txn)?;
            Ok(Plan::write(
                Command::Txn(planned.txn.clone()),
                Answer::Txn(planned),
            ))
        }
        EtcdRequest::Compaction(compact) => Ok(Plan::write(
            Command::Compact {
                revision: revision_from_wire(compact.revision),
            },
            Answer::Rejected,
        )),
        EtcdRequest::LeaseGrant(grant) => {
            let id = if grant.id > 0 {
                grant.id
            } else if grant.id == 0 {
                chosen_lease_id
            } else {
                return Err(EtcdError::Invalid(format!(
                    "lease ID {} is negative",
                    grant.id
                )));
            };
            let (min_ms, max_ms) = (limits.lease_ttl_ms_min, limits.lease_ttl_ms_max);
            let asked_ms = u64::try_from(grant.ttl).unwrap_or(0).saturating_mul(1000);
            if asked_ms > max_ms {
                return Err(EtcdError::LeaseTtlTooLarge);
            }
            let command = Command::LeaseGrant {
                name: lease_name(id),
                ttl_ms: asked_ms.max(min_ms),
            };
            Ok(Plan::write(command, Answer::LeaseGranted))
        }
        EtcdRequest::LeaseRevoke(revoke) => Ok(Plan::write(
            Command::LeaseRevoke {
                name: lease_name(revoke.id),
            },
            Answer::LeaseRevoked,
        )),
        EtcdRequest::LeaseKeepAlive(keep) => Ok(Plan::write(
            Command::LeaseKeepAlive {
                name: lease_name(keep.id),
            },
            Answer::LeaseKeptAlive,
        )),
        EtcdRequest::Watch(watch) => match &watch.request_union {
            Some(RequestUnion::CreateRequest(create)) => {
                let mut create = create.clone();
                if create.key.is_empty() {
                    create.key = vec![0];
                }
                if let Ok(Keys::Range(range)) = Keys::of(&create.key, &create.range_end)
                    && range.is_empty()
                {
                    return Err(EtcdError::EmptyWatchRange);
                }
                let (key, scope) = Keys::of(&create.key, &create.range_end)?.scoped();
                Ok(Plan::new(
                    Converted::Watch {
                        key,
                        scope,
                        start_revision: revision_from_wire(create.start_revision),
                    },
                    Answer::Nothing,
                ))
            }
            Some(RequestUnion::CancelRequest(_) | RequestUnion::ProgressRequest(_)) | None => {
                Ok(Plan::new(Converted::Answered, Answer::Nothing))
            }
        },
        EtcdRequest::Alarm(alarm) => match (alarm.action(), alarm.alarm()) {
            (AlarmAction::Get, _) | (_, AlarmType::None) => {
                Ok(Plan::new(Converted::Answered, Answer::Nothing))
            }
            (AlarmAction::Activate, AlarmType::Corrupt) => Err(EtcdError::Unsupported(
                "raising a CORRUPT alarm".to_string(),
            )),
            (AlarmAction::Deactivate, AlarmType::Corrupt) => {
                Ok(Plan::new(Converted::Answered, Answer::Nothing))
            }
            (action, AlarmType::Nospace) => Ok(Plan::write(
                Command::AlarmSet {
                    member: alarm.member_id,
                    raise: action == AlarmAction::Activate,
                },
                Answer::Nothing,
            )),
        },
        EtcdRequest::MemberAdd(add) => Ok(Plan::new(
            Converted::Member(member_addresses(&add.peer_ur_ls)?),
            Answer::Nothing,
        )),
        EtcdRequest::Authenticate(login) => Ok(Plan::new(
            Converted::Login {
                name: login.name.clone(),
                password: login.password.clone(),
            },
            Answer::Nothing,
        )),
        EtcdRequest::UserAdd(asked) => {
            if asked.name.is_empty() {
                return Err(EtcdError::UserEmpty);
            }
            let no_password = asked.options.is_some_and(|options| options.no_password);
            let password_hash = if no_password {
                None
            } else {
                check_password(&asked.password)?;
                Some(asked.password.clone())
            };
            auth(AuthCommand::UserAdd {
                name: asked.name.clone(),
                password_hash,
            })
        }
        EtcdRequest::UserDelete(asked) => {
            if asked.name == ROOT && users.is_enabled() {
                return Err(EtcdError::InvalidAuthMgmt);
            }
            let name = holdable(&asked.name)
                .ok_or(EtcdError::UserNotFound)?
                .to_string();
            auth(AuthCommand::UserDelete { name })
        }
        EtcdRequest::UserChangePassword(asked) => {
            let name = holdable(&asked.name)
                .ok_or(EtcdError::UserNotFound)?
                .to_string();
            check_password(&asked.password)?;
            auth(AuthCommand::UserPasswd {
                name,
                password_hash: Some(asked.password.clone()),
            })
        }
        EtcdRequest::UserGrantRole(asked) => {
            let user = holdable(&asked.user)
                .filter(|user| users.user(user).is_some())
                .ok_or(EtcdError::UserNotFound)?
                .to_string();
            let role = holdable(role_name_across(&asked.role))
                .ok_or(EtcdError::RoleNotFound)?
                .to_string();
            auth(AuthCommand::UserGrantRole { user, role })
        }
        EtcdRequest::UserRevokeRole(asked) => {
            if asked.name == ROOT && asked.role == ROOT && users.is_enabled() {
                return Err(EtcdError::InvalidAuthMgmt);
            }
            let user = holdable(&asked.name)
                .ok_or(EtcdError::UserNotFound)?
                .to_string();
            let role = holdable(role_name_across(&asked.role))
                .ok_or(EtcdError::RoleNotGranted)?
                .to_string();
            Ok(Plan::write(
                Command::Auth(AuthCommand::UserRevokeRole { user, role }),
                Answer::AuthChanged(|rejection| match rejection {
                    Rejection::RoleNotFound { .. } => EtcdError::RoleNotGranted,
                    other => EtcdError::of_rejection(other),
                }),
            ))
        }
        EtcdRequest::RoleAdd(asked) => {
            if asked.name.is_empty() {
                return Err(EtcdError::RoleEmpty);
            }
            if asked.name == ROOT {
                return Ok(Plan::new(Converted::Answered, Answer::Nothing));
            }
            auth(AuthCommand::RoleAdd {
                name: role_name_across(&asked.name).to_string(),
            })
        }
        EtcdRequest::RoleDelete(asked) => {
            if asked.role == ROOT {
                return Err(EtcdError::InvalidAuthMgmt);
            }
            let name = holdable(role_name_across(&asked.role))
                .ok_or(EtcdError::RoleNotFound)?
                .to_string();
            auth(AuthCommand::RoleDelete { name })
        }
        EtcdRequest::RoleGrantPermission(asked) => {
            let permission = asked.perm.as_ref().ok_or(EtcdError::PermissionNotGiven)?;
            let role = holdable(role_name_across(&asked.name))
                .ok_or(EtcdError::RoleNotFound)?
                .to_string();
            let permission = permission_from_wire(permission)?;
            auth(AuthCommand::RoleGrant { role, permission })
        }
        EtcdRequest::RoleRevokePermission(asked) => {
            let role = holdable(role_name_across(&asked.role))
                .filter(|role| role_permissions(users, role).is_some())
                .ok_or(EtcdError::RoleNotFound)?
                .to_string();
            if role == ADMIN_ROLE {
                return Err(EtcdError::PermissionNotGranted);
            }
            let (key, prefix) = key_or_prefix(&asked.key, &asked.range_end)
                .map_err(|_| EtcdError::PermissionNotGranted)?;
            auth(AuthCommand::RoleRevoke { role, key, prefix })
        }
    }
}
