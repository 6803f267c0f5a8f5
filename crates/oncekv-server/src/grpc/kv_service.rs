//! [`KvService`]: maps `Kv` RPCs onto the [`Node`], and the node's answers
//! and errors onto typed responses.

use crate::node::Node;
use crate::raft::consensus::WriteError;
use oncekv_proto::convert::{self, outcome_to_wire, reply_to_wire};
use oncekv_proto::v1::kv_server::Kv;
use oncekv_proto::v1::{
    AddMemberRequest, ExecuteRequest, ExecuteResponse, Invalid, Member, Members,
    MembershipResponse, NotLeader, ReadRequest, ReadResponse, RemoveMemberRequest,
    StateDigestRequest, StateDigestResponse, StatusRequest, StatusResponse, Unavailable,
    execute_response, membership_response, read_response,
};
use tonic::{Request, Response, Status};

/// The client service of one node.
#[derive(Clone, Debug)]
pub struct KvService {
    node: Node,
}

impl KvService {
    /// A service over `node`.
    pub fn new(node: Node) -> KvService {
        KvService { node }
    }

    fn not_leader(
        &self,
        leader_id: Option<u64>,
        leader: Option<crate::raft::type_config::NodeInfo>,
    ) -> NotLeader {
        let leader_client_address = leader
            .map(|info| info.client_address)
            .or_else(|| leader_id.and_then(|id| self.node.client_address_of(id)))
            .unwrap_or_default();
        NotLeader {
            leader_id,
            leader_client_address,
        }
    }

    fn members(&self) -> Vec<Member> {
        self.node
            .status()
            .raft
            .members
            .into_iter()
            .map(|member| Member {
                id: member.id,
                peer_address: member.info.peer_address,
                client_address: member.info.client_address,
                voter: member.voter,
            })
            .collect()
    }
}

enum Failure {
    NotLeader(NotLeader),
    Unavailable(Unavailable),
    Invalid(Invalid),
}

impl KvService {
    /// What a failed write or read answers, or the gRPC status of a shed
    /// request.
    fn failure(&self, error: WriteError) -> Result<Failure, Status> {
        Ok(match error {
            WriteError::NotLeader { leader_id, leader } => {
                Failure::NotLeader(self.not_leader(leader_id, leader))
            }
            WriteError::Unavailable(reason) => Failure::Unavailable(Unavailable { reason }),
            WriteError::Invalid(why) => Failure::Invalid(Invalid {
                reason: why.to_string(),
            }),
            WriteError::Overloaded(what) => {
                let message = format!("overloaded ({what}): not proposed, retry later");
                return Err(crate::transport::overloaded(what, message));
            }
        })
    }
}

fn invalid(error: convert::ConvertError) -> Invalid {
    Invalid {
        reason: error.to_string(),
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        let request = match convert::request_from_wire(request.into_inner()) {
            Ok(request) => request,
            Err(error) => {
                let result = execute_response::Result::Invalid(invalid(error));
                return Ok(Response::new(ExecuteResponse {
                    result: Some(result),
                    log_index: 0,
                }));
            }
        };
        let (result, log_index) = match self.node.execute(request).await {
            Ok(executed) => (
                execute_response::Result::Outcome(outcome_to_wire(&executed.outcome)),
                executed.index.0,
            ),
            Err(error) => match self.failure(error)? {
                Failure::NotLeader(hint) => (execute_response::Result::NotLeader(hint), 0),
                Failure::Unavailable(why) => (execute_response::Result::Unavailable(why), 0),
                Failure::Invalid(why) => (execute_response::Result::Invalid(why), 0),
            },
        };
        Ok(Response::new(ExecuteResponse {
            result: Some(result),
            log_index,
        }))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let request = request.into_inner();
        let query = match request.query.map(convert::query_from_wire) {
            Some(Ok(query)) => query,
            Some(Err(error)) => {
                let result = read_response::Result::Invalid(invalid(error));
                return Ok(Response::new(ReadResponse {
                    result: Some(result),
                }));
            }
            None => {
                let result = read_response::Result::Invalid(Invalid {
                    reason: "missing field query".into(),
                });
                return Ok(Response::new(ReadResponse {
                    result: Some(result),
                }));
            }
        };
        let result = match self.node.read(&query, request.serializable).await {
            Ok(reply) => read_response::Result::Reply(reply_to_wire(&reply)),
            Err(error) => match self.failure(error)? {
                Failure::NotLeader(hint) => read_response::Result::NotLeader(hint),
                Failure::Unavailable(why) => read_response::Result::Unavailable(why),
                Failure::Invalid(why) => read_response::Result::Invalid(why),
            },
        };
        Ok(Response::new(ReadResponse {
            result: Some(result),
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let status = self.node.status();
        let raft = &status.raft;
        let leader_client_address = raft
            .leadership
            .leader_id
            .and_then(|id| self.node.client_address_of(id))
            .unwrap_or_default();
        Ok(Response::new(StatusResponse {
            id: raft.id,
            leader_id: raft.leadership.leader_id,
            term: raft.leadership.term,
            is_leader: raft.leadership.is_leader,
            last_log_index: raft.last_log_index,
            commit_index: raft.commit_index,
            applied_index: raft.applied_index,
            snapshot_index: raft.snapshot_index,
            cluster_time_ms: status.state.cluster_time.0,
            members: self.members(),
            sessions: status.state.sessions,
            completion_records: status.state.completion_records,
            idempotency_keys: status.state.idempotency_keys,
            leases: status.state.leases,
            keys: status.state.keys,
            leader_client_address,
            completion_record_bytes: status.state.completion_record_bytes,
            idempotency_bytes: status.state.idempotency_bytes,
            store_bytes: status.state.store_bytes,
            alarms: if status.state.no_space_alarm {
                vec!["NOSPACE".to_string()]
            } else {
                Vec::new()
            },
        }))
    }

    async fn state_digest(
        &self,
        _request: Request<StateDigestRequest>,
    ) -> Result<Response<StateDigestResponse>, Status> {
        let (applied_index, digest) = self.node.state_digest().await;
        Ok(Response::new(StateDigestResponse {
            applied_index: applied_index.map(|index| index.0),
            digest,
        }))
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let request = request.into_inner();
        if request.peer_address.is_empty() || request.client_address.is_empty() {
            let reason = "a member needs a peer address and a client address".to_string();
            let result = membership_response::Result::Invalid(Invalid { reason });
            return Ok(Response::new(MembershipResponse {
                result: Some(result),
            }));
        }
        let info = crate::raft::type_config::NodeInfo {
            peer_address: request.peer_address,
            client_address: request.client_address,
        };
        let result = self.node.add_member(request.id, info).await;
        Ok(Response::new(self.membership_result(result)?))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let result = self.node.remove_member(request.into_inner().id).await;
        Ok(Response::new(self.membership_result(result)?))
    }
}

impl KvService {
    fn membership_result(
        &self,
        result: Result<(), WriteError>,
    ) -> Result<MembershipResponse, Status> {
        let result = match result {
            Ok(()) => membership_response::Result::Members(Members {
                members: self.members(),
            }),
            Err(error) => match self.failure(error)? {
                Failure::NotLeader(hint) => membership_response::Result::NotLeader(hint),
                Failure::Unavailable(why) => membership_response::Result::Unavailable(why),
                Failure::Invalid(why) => membership_response::Result::Invalid(why),
            },
        };
        Ok(MembershipResponse {
            result: Some(result),
        })
    }
}
