//! `etcdserverpb.Maintenance` onto the node: Status from the node's
//! consensus progress and store counters (what `etcdctl endpoint status`
//! shows). Like the native status, it needs the admin role while
//! authentication is enforced.

use super::errors::error_of;
use super::{EtcdApi, credentials_of};
use oncekv_proto::etcd::etcdserverpb::maintenance_server::Maintenance;
use oncekv_proto::etcd::etcdserverpb::{StatusRequest, StatusResponse};
use tonic::{Response, Status};

/// The etcd version the node reports: the release whose API (as far as it
/// reaches) the node serves. Clients gate features on it.
pub const ETCD_VERSION: &str = "3.4.0";

#[tonic::async_trait]
impl Maintenance for EtcdApi {
    async fn status(
        &self,
        request: tonic::Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "the status")
            .map_err(|error| Status::from(error_of(error)))?;
        let status = self.node.status();
        let (raft, state) = (status.raft, status.state);
        let leadership = self.node.consensus().leadership();
        let applied = raft.applied_index.unwrap_or(0);
        let store_bytes = i64::try_from(state.store_bytes).unwrap_or(i64::MAX);
        let quota = self
            .node
            .consensus()
            .with_state(|s| s.limits().store_bytes_max);
        let is_learner = raft
            .members
            .iter()
            .any(|member| member.id == raft.id && !member.voter);
        let errors = if state.no_space_alarm {
            vec![format!("memberID:{} alarm:NOSPACE ", raft.id)]
        } else {
            Vec::new()
        };
        Ok(Response::new(StatusResponse {
            header: Some(self.header(applied)),
            version: ETCD_VERSION.to_string(),
            db_size: store_bytes,
            leader: leadership.leader_id.unwrap_or(0),
            raft_index: raft.commit_index.unwrap_or(0),
            raft_term: leadership.term,
            raft_applied_index: applied,
            errors,
            db_size_in_use: store_bytes,
            is_learner,
            storage_version: String::new(),
            db_size_quota: i64::try_from(quota).unwrap_or(i64::MAX),
            downgrade_info: None,
        }))
    }
}
