//! The peer network, server side: the `RaftPeer` gRPC service, handing
//! other nodes' Raft messages to this node's consensus.

use super::network::{VoteKind, decode, encode};
use super::type_config::{Raft, TypeConfig};
use oncekv_proto::v1::raft_peer_server::RaftPeer;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use openraft::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use serde::Serialize;
use tonic::{Request, Response, Status, Streaming};

/// Memory reserved up front for an incoming snapshot at most: the size a
/// peer announces is not trusted for more.
const SNAPSHOT_RESERVE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Serves Raft messages from peers.
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService").finish_non_exhaustive()
    }
}

impl PeerService {
    /// A service over this node's Raft.
    pub fn new(raft: Raft) -> PeerService {
        PeerService { raft }
    }
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftPayload>, Status> {
    let data = encode(result).map_err(|e| Status::internal(format!("encoding reply: {e}")))?;
    Ok(Response::new(RaftPayload { data }))
}

fn bad_message(error: postcard::Error) -> Status {
    Status::invalid_argument(format!("undecodable raft message: {error}"))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let request = decode(&request.into_inner().data).map_err(bad_message)?;
        reply(&self.raft.append_entries(request).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let result = match decode(&request.into_inner().data).map_err(bad_message)? {
            VoteKind::Vote(vote) => self.raft.vote(vote).await,
            VoteKind::PreVote(vote) => self.raft.pre_vote(vote).await,
        };
        reply(&result)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let request = decode(&request.into_inner().data).map_err(bad_message)?;
        reply(&self.raft.handle_transfer_leader(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        let mut chunks = request.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let vote: VoteOf<TypeConfig> = decode(&first.vote).map_err(bad_message)?;
        let meta: SnapshotMetaOf<TypeConfig> = decode(&first.meta).map_err(bad_message)?;
        let total = first.total_bytes;
        let mut data = first.data;
        data.reserve(
            usize::try_from(total)
                .unwrap_or(0)
                .min(SNAPSHOT_RESERVE_BYTES_MAX),
        );
        while let Some(chunk) = chunks.message().await? {
            data.extend_from_slice(&chunk.data);
            if data.len() as u64 > total {
                return Err(Status::invalid_argument(format!(
                    "snapshot stream carries more than the {total} bytes it announced"
                )));
            }
        }
        if data.len() as u64 != total {
            return Err(Status::invalid_argument(format!(
                "snapshot stream ended after {} of {total} bytes",
                data.len()
            )));
        }
        let snapshot = SnapshotOf::<TypeConfig, Vec<u8>> {
            meta,
            snapshot: data,
        };
        reply(&self.raft.install_full_snapshot(vote, snapshot).await)
    }
}
