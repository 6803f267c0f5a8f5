//! The peer network, client side: openraft's RPCs to other nodes over the
//! `RaftPeer` gRPC service. Raft messages travel as postcard bytes inside
//! protobuf envelopes; snapshots are streamed in chunks read from their
//! file as they are sent, one chunk in memory at a time (the receiver
//! spools them to disk, see `peer_service`). Every call
//! has a deadline, HTTP/2 keep-alives detect dead connections, and a
//! timed-out connection is dropped and redialled on the next call. A
//! [`PeerDialer`] makes the channels, here and for the etcd calls a
//! follower forwards to its leader's peer port (`grpc::etcd`), so both
//! reach a peer the same way. How a channel reaches a peer is a
//! [`PeerConnector`]: TCP unless one is injected (a simulated network). With peer TLS ([`PeerTls`]), a peer is
//! dialled over `https`, its certificate verified against the peer CA for
//! the name `node-<its id>`, and this node presents its own certificate.
//! With a peer token ([`PeerToken`], `--peer-token-file`), every call
//! (vote, pre-vote, append unary or streamed, snapshot, leadership
//! transfer) carries its credential in the `oncekv-peer-token` metadata,
//! which the receiving node checks before reading the call's messages.
//!
//! Replication is pipelined ([`PeerAppend::Stream`]): the entries of one
//! replication session go over one long-lived `StreamAppend` call, each
//! `AppendEntries` sent as soon as openraft has it, without waiting for
//! the reply to the one before; replies come back in order on the same
//! call. The stream fails (and openraft opens another) when requests are
//! outstanding and no reply came for the call's timeout. A peer that does
//! not know `StreamAppend` (UNIMPLEMENTED) is sent one unary
//! `AppendEntries` per round from then on, as [`PeerAppend::Unary`] does.

use super::commit_notice::CommitNoticesLast;
use super::peer_token::PeerToken;
use super::snapshot_file::SnapshotFile;
use super::type_config::{NodeId, NodeInfo, TypeConfig};
use crate::tls::PeerTls;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::StreamAppendResult;
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
use std::sync::atomic::{AtomicU64, Ordering};
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

/// How this node dials a peer's port: the transport, the source address,
/// TLS and the peer token. Raft's channels are made by it, and so are
/// those a follower forwards etcd calls to its leader over
/// (`grpc::etcd::forward`), so both reach a peer the same way.
#[derive(Clone, Debug, Default)]
pub struct PeerDialer {
    /// The source address of outgoing TCP connections, if set.
    pub source_ip: Option<IpAddr>,
    /// The transport to peers; `None` is TCP.
    pub connector: Option<Arc<dyn PeerConnector>>,
    /// Mutual TLS to peers; `None`: plaintext.
    pub tls: Option<PeerTls>,
    /// The cluster's shared peer secret, sent with every call; `None`:
    /// none sent.
    pub token: Option<PeerToken>,
}

impl PeerDialer {
    /// A channel to node `target`'s peer port at `address`, connected on
    /// first use: over `https` with peer TLS (the peer verified for
    /// `node-<target>`, this node presenting its own certificate), with a
    /// short connect timeout and HTTP/2 keep-alives, through the injected
    /// connector if there is one.
    pub fn channel(
        &self,
        target: NodeId,
        address: &str,
    ) -> Result<Channel, tonic::transport::Error> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.client_config(target))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        Ok(match &self.connector {
            Some(connector) => connector.connect_lazy(endpoint),
            None => endpoint.local_address(self.source_ip).connect_lazy(),
        })
    }

    /// Puts the peer token's credential, if there is one, in `request`'s
    /// metadata.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(token) = &self.token {
            token.attach(request);
        }
    }
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
    /// The cluster's shared peer secret, sent with every call; `None`:
    /// none sent.
    pub token: Option<PeerToken>,
    /// How entries are replicated.
    pub append: PeerAppend,
}

/// How a leader sends entries to a follower.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerAppend {
    /// Pipelined on one long-lived `StreamAppend` call per replication
    /// session (falling back on unary calls to a peer that lacks it).
    #[default]
    Stream,
    /// One unary `AppendEntries` call per round, each waiting for the
    /// reply to the one before.
    Unary,
}

impl PeerNetwork {
    /// How this network dials a peer.
    pub fn dialer(&self) -> PeerDialer {
        PeerDialer {
            source_ip: self.source_ip,
            connector: self.connector.clone(),
            tls: self.tls.clone(),
            token: self.token.clone(),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        PeerClient {
            target,
            address: node.peer_address.clone(),
            dialer: self.dialer(),
            client: None,
            append: self.append,
        }
    }
}

/// A connection to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    address: String,
    dialer: PeerDialer,
    client: Option<RaftPeerClient<Channel>>,
    /// Falls to [`PeerAppend::Unary`] when the peer lacks `StreamAppend`.
    append: PeerAppend,
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
    /// `message` as a call: with the peer token's credential, if any.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        self.dialer.authorize(&mut request);
        request
    }

    fn client(&mut self) -> Result<RaftPeerClient<Channel>, RPCError<TypeConfig>> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = self
            .dialer
            .channel(self.target, &self.address)
            .map_err(|e| unreachable(&e))?;
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
        let mut message = self.request(RaftPayload { data });
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

    /// Opens a `StreamAppend` call carrying `input`; `Ok(None)` if `input`
    /// ended before its first request. A peer that does not know the call
    /// is an error, and is sent unary calls from then on.
    async fn open_append_stream<S>(
        &mut self,
        mut input: S,
        option: &RPCOption,
    ) -> Result<Option<AppendReplies>, RPCError<TypeConfig>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        // The first request is taken before the call is opened: openraft
        // waits out its backoff (after failures) while producing it, so a
        // peer that refuses connections is not redialled in a tight loop,
        // and nothing is opened when there is nothing to send.
        let Some(first) = input.next().await else {
            return Ok(None);
        };
        let input = futures_util::stream::once(std::future::ready(first)).chain(input);
        let sent = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&sent);
        // openraft's request stream waits for new entries for as long as
        // the session lasts; once the replies are dropped (or failed) the
        // requests must end too, or the call would live on, sending.
        let (replies_gone, gone) = tokio::sync::oneshot::channel::<()>();
        // Encoding a request cannot fail for these types; if it did, the
        // stream would end there and the replies to what was sent before
        // still arrive (openraft then resends the rest).
        // Commit notices follow what is ready first: on a leader, the
        // answer to the write that just committed.
        let requests = CommitNoticesLast::new(input)
            .take_until(gone)
            .map(move |request| encode(&request))
            .take_while(|encoded| {
                let ok = encoded.is_ok();
                if let Err(error) = encoded {
                    tracing::error!(%error, "cannot encode an AppendEntries");
                }
                std::future::ready(ok)
            })
            .filter_map(move |encoded| {
                counted.fetch_add(1, Ordering::Relaxed);
                std::future::ready(encoded.ok().map(|data| RaftPayload { data }))
            });
        let requests = self.request(requests);
        let mut client = self.client()?;
        let opened = tokio::time::timeout(option.hard_ttl(), client.stream_append(requests)).await;
        let replies = match opened {
            Ok(Ok(replies)) => replies.into_inner(),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    peer = self.target,
                    "the peer does not know StreamAppend: one AppendEntries call per round from now on"
                );
                self.append = PeerAppend::Unary;
                // The requests went with the refused call: this round
                // fails, and openraft resends them by unary calls.
                return Err(unreachable(&status));
            }
            Ok(Err(status)) => {
                self.client = None;
                return Err(unreachable(&status));
            }
            Err(elapsed) => {
                self.client = None;
                return Err(unreachable(&elapsed));
            }
        };
        Ok(Some(AppendReplies {
            replies,
            sent,
            answered: 0,
            patience: option.hard_ttl(),
            ended: false,
            requests: Some(replies_gone),
        }))
    }
}

/// The replies of one `StreamAppend` call, in the order of its requests.
struct AppendReplies {
    replies: tonic::Streaming<RaftPayload>,
    /// Requests sent so far on the call.
    sent: Arc<AtomicU64>,
    /// Replies received so far.
    answered: u64,
    /// How long requests may go unanswered before the call is given up.
    patience: Duration,
    /// Whether the stream has ended (after an error).
    ended: bool,
    /// Ends the call's requests when dropped (with this, or on an error).
    requests: Option<tokio::sync::oneshot::Sender<()>>,
}

type AppendReply = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

impl AppendReplies {
    /// Ends the stream, and the call's requests.
    fn end(&mut self) {
        self.ended = true;
        self.requests = None;
    }

    /// The next reply, `None` when the call ended cleanly. An error ends
    /// the stream.
    async fn next(&mut self) -> Option<AppendReply> {
        if self.ended {
            return None;
        }
        let reply = loop {
            match tokio::time::timeout(self.patience, self.replies.message()).await {
                Ok(reply) => break reply,
                // Cancel-safe: the message stays in the stream.
                Err(elapsed) if self.sent.load(Ordering::Relaxed) > self.answered => {
                    self.end();
                    return Some(Err(unreachable(&elapsed)));
                }
                Err(_) => {}
            }
        };
        let reply = match reply {
            Ok(Some(reply)) => reply,
            Ok(None) if self.sent.load(Ordering::Relaxed) > self.answered => {
                self.end();
                return Some(Err(network(&std::io::Error::other(
                    "the peer ended the stream with requests unanswered",
                ))));
            }
            Ok(None) => return None,
            Err(status) => {
                self.end();
                return Some(Err(unreachable(&status)));
            }
        };
        self.answered = self.answered.saturating_add(1);
        let decoded: Result<AppendReply, postcard::Error> = decode::<
            Result<StreamAppendResult<TypeConfig>, openraft::error::Fatal<TypeConfig>>,
        >(&reply.data)
        .map(|result| result.map_err(|remote| unreachable(&remote)));
        let reply = decoded.unwrap_or_else(|error| Err(network(&error)));
        if !matches!(reply, Ok(Ok(_))) {
            self.end();
        }
        Some(reply)
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotFile;

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

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, AppendReply>, RPCError<TypeConfig>>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        Box::pin(async move {
            if self.append == PeerAppend::Unary {
                return openraft::network::stream_append_sequential(self, input, option).await;
            }
            match self.open_append_stream(input, &option).await? {
                Some(replies) => {
                    let replies = futures_util::stream::unfold(replies, |mut replies| async move {
                        let reply = replies.next().await?;
                        Some((reply, replies))
                    });
                    Ok(replies.boxed())
                }
                None => Ok(futures_util::stream::empty().boxed()),
            }
        })
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
        snapshot: SnapshotOf<TypeConfig, SnapshotFile>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let stream_error = |e: &(dyn std::error::Error + 'static)| {
            StreamingError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
        };
        let vote = encode(&vote).map_err(|e| stream_error(&e))?;
        let meta = encode(&snapshot.meta).map_err(|e| stream_error(&e))?;
        let data = snapshot.snapshot;
        // Held until the peer's reply (the request stream, and its handle,
        // go once the last chunk is sent, while the peer still restores
        // it): the store sees the snapshot as being sent until then.
        let _sending = data.share();
        let total_bytes = data.len();
        // Chunks are read from the file as the stream is sent (a bounded
        // positional read each), never the whole snapshot at once. A read
        // that fails ends the stream short, which the receiver refuses.
        let pieces = total_bytes.div_ceil(SNAPSHOT_CHUNK_BYTES as u64).max(1);
        let mut first = Some((vote, meta));
        let chunks = (0..pieces).map_while(move |piece| {
            let start = piece.saturating_mul(SNAPSHOT_CHUNK_BYTES as u64);
            let data = match data.read_piece(start, SNAPSHOT_CHUNK_BYTES) {
                Ok(data) => data,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the snapshot being sent");
                    return None;
                }
            };
            let mut chunk = SnapshotChunk {
                data,
                ..SnapshotChunk::default()
            };
            if let Some((vote, meta)) = first.take() {
                chunk.vote = vote;
                chunk.meta = meta;
                chunk.total_bytes = total_bytes;
            }
            Some(chunk)
        });
        let mut message = self.request(tokio_stream::iter(chunks));
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
