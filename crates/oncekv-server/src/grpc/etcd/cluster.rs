//! `etcdserverpb.Cluster` onto the node's membership: MemberList (what
//! etcd's clients use to find every endpoint). A member's etcd ID is its
//! node id, its name `node-<id>`, its URLs its advertised addresses.
//! Changing membership through etcd's API is not served yet (`oncekv
//! member` does it).

use super::EtcdApi;
use oncekv_proto::etcd::etcdserverpb::cluster_server::Cluster;
use oncekv_proto::etcd::etcdserverpb::{Member, MemberListRequest, MemberListResponse};
use tonic::{Response, Status};

#[tonic::async_trait]
impl Cluster for EtcdApi {
    async fn member_list(
        &self,
        request: tonic::Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        // Who may see the members is who may see the status.
        self.principal(&request, false)?;
        let scheme = if self.client_tls { "https" } else { "http" };
        let raft = self.node.status().raft;
        let members = raft
            .members
            .iter()
            .map(|member| Member {
                id: member.id,
                name: format!("node-{}", member.id),
                peer_ur_ls: vec![format!("{scheme}://{}", member.info.peer_address)],
                client_ur_ls: vec![format!("{scheme}://{}", member.info.client_address)],
                is_learner: !member.voter,
            })
            .collect();
        Ok(Response::new(MemberListResponse {
            header: Some(self.header(raft.applied_index.unwrap_or(0))),
            members,
        }))
    }
}
