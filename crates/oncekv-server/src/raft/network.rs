//! The peer network, client side: openraft's RPCs to other nodes over the
//! `RaftPeer` gRPC service. Raft messages travel as postcard bytes inside
//! protobuf envelopes; snapshots are streamed in chunks cut as they are
//! sent (the receiver spools them to disk, see `peer_service`). Every call
//! has a deadline, HTTP/2 keep-alives detect dead connections, and a
//! timed-out connection is dropped and redialled on the next call. How a
//! channel reaches a peer is a [`PeerConnector`]: TCP unless one is
//! injected (a simulated network). With peer TLS ([`PeerTls`]), a peer is
//! dialled over `https`, its certificate verified against the peer CA for
//! the name `node-<its id>`, and this node presents its own certificate.

use super::type_config::{NodeId, NodeInfo, TypeConfig};
use crate::tls::PeerTls;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{RaftNetworkFactory, RaftNetworkV2};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Snapshot data is sent in pieces of this size.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest peer message accepted or sent.
pub const PEER_MESSAGE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// A vote request, or a pre-vote (which must not disturb the receiver).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) enum VoteKind {
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
}

/// Opens the channel of a peer endpoint (address, timeouts and keep-alives
/// already set) over some transport.
pub trait PeerConnector: Send + Sync + std::fmt::Debug {
    /// A channel to `endpoint`, connected on first use.
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel;
}

/// Makes clients to peers.
#[derive(Clone, Debug, Default)]
pub struct PeerNetwork {
    /// The source address of outgoing TCP connections, if set.
    pub source_ip: Option<IpAddr>,
    /// The transport to peers; `None` is TCP.
    pub connector: Option<Arc<dyn PeerConnector>>,
    /// Mutual TLS to peers; `None`: plaintext.
    pub tls: Option<PeerTls>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        PeerClient {
            target,
            address: node.peer_address.clone(),
            source_ip: self.source_ip,
            connector: self.connector.clone(),
            tls: self.tls.clone(),
            client: None,
        }
    }
}

/// A connection to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    address: String,
    source_ip: Option<IpAddr>,
    connector: Option<Arc<dyn PeerConnector>>,
    tls: Option<PeerTls>,
    client: Option<RaftPeerClient<Channel>>,
}

fn unreachable(error: &(impl std::error::Error + 'static)) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(error))
}

fn network(error: &(impl std::error::Error + 'static)) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(error))
}

/// Encodes a Raft message for the wire.
pub(crate) fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(message)
}

/// Decodes a Raft message from the wire.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

impl PeerClient {
    fn client(&mut self) -> Result<RaftPeerClient<Channel>, RPCError<TypeConfig>> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.address))
            .map_err(|e| unreachable(&e))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.client_config(self.target))
                .map_err(|e| unreachable(&e))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let channel = match &self.connector {
            Some(connector) => connector.connect_lazy(endpoint),
            None => endpoint.local_address(self.source_ip).connect_lazy(),
        };
        let client = RaftPeerClient::new(channel)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Sends one request and decodes the remote `Result<Response, E>`.
    async fn call<Req, Resp, E, F, Fut>(
        &mut self,
        request: &Req,
        option: &RPCOption,
        send: F,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned + std::error::Error + 'static,
        F: FnOnce(RaftPeerClient<Channel>, tonic::Request<RaftPayload>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<RaftPayload>, tonic::Status>>,
    {
        let data = encode(request).map_err(|e| network(&e))?;
        let mut message = tonic::Request::new(RaftPayload { data });
        message.set_timeout(option.hard_ttl());
        let client = self.client()?;
        let reply = match send(client, message).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                // A deadline or transport failure may leave the connection
                // wedged: dial afresh next time.
                tracing::debug!(peer = self.target, %status, "peer call failed");
                self.client = None;
                return Err(unreachable(&status));
            }
        };
        let result: Result<Resp, E> = decode(&reply.data).map_err(|e| network(&e))?;
        result.map_err(|remote| unreachable(&remote))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, openraft::error::RaftError<TypeConfig>, _, _>(
            &request,
            &option,
            |mut client, message| async move { client.append_entries(message).await },
        )
        .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, openraft::error::RaftError<TypeConfig>, _, _>(
            &VoteKind::Vote(request),
            &option,
            |mut client, message| async move { client.vote(message).await },
        )
        .await
    }

    async fn pre_vote(
        &mut self,
        request: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, openraft::error::RaftError<TypeConfig>, _, _>(
            &VoteKind::PreVote(request),
            &option,
            |mut client, message| async move { client.vote(message).await },
        )
        .await
    }

    async fn transfer_leader(
        &mut self,
        request: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, openraft::error::Fatal<TypeConfig>, _, _>(
            &request,
            &option,
            |mut client, message| async move { client.transfer_leader(message).await },
        )
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let stream_error = |e: &(dyn std::error::Error + 'static)| {
            StreamingError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
        };
        let vote = encode(&vote).map_err(|e| stream_error(&e))?;
        let meta = encode(&snapshot.meta).map_err(|e| stream_error(&e))?;
        let data = snapshot.snapshot;
        let total_bytes = u64::try_from(data.len()).map_err(|e| stream_error(&e))?;
        // Chunks are cut as the stream is sent, not copied out up front.
        let pieces = data.len().div_ceil(SNAPSHOT_CHUNK_BYTES).max(1);
        let mut first = Some((vote, meta));
        let chunks = (0..pieces).map(move |piece| {
            let start = piece.saturating_mul(SNAPSHOT_CHUNK_BYTES).min(data.len());
            let end = start.saturating_add(SNAPSHOT_CHUNK_BYTES).min(data.len());
            let mut chunk = SnapshotChunk {
                data: data[start..end].to_vec(),
                ..SnapshotChunk::default()
            };
            if let Some((vote, meta)) = first.take() {
                chunk.vote = vote;
                chunk.meta = meta;
                chunk.total_bytes = total_bytes;
            }
            chunk
        });
        let mut message = tonic::Request::new(tokio_stream::iter(chunks));
        message.set_timeout(option.hard_ttl().max(Duration::from_secs(30)));
        let mut client = self.client().map_err(|e| stream_error(&e))?;
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = client.install_snapshot(message) => reply,
        };
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                self.client = None;
                return Err(stream_error(&status));
            }
        };
        let result: Result<SnapshotResponse<TypeConfig>, openraft::error::Fatal<TypeConfig>> =
            decode(&reply.data).map_err(|e| stream_error(&e))?;
        result.map_err(|remote| stream_error(&remote))
    }
}
