//! The leader's side of replication (`oncekv_server::raft::network`)
//! against scripted peers on loopback: entries are pipelined on one
//! `StreamAppend` call (a peer that answers only once it has several
//! requests gets them all without waiting), a call whose requests go
//! unanswered fails within its timeout instead of hanging (or at once if
//! the peer ends it), and a peer that
//! does not know `StreamAppend` is sent unary `AppendEntries` from then on.

use futures_util::StreamExt;
use oncekv_proto::v1::RaftPayload;
use oncekv_proto::v1::SnapshotChunk;
use oncekv_proto::v1::raft_peer_server::{RaftPeer, RaftPeerServer};
use oncekv_server::raft::network::{PeerAppend, PeerNetwork};
use oncekv_server::raft::type_config::{NodeInfo, TypeConfig};
use oncekv_server::transport::tcp_incoming;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::entry::RaftEntry as _;
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use openraft::vote::RaftLeaderId as _;
use openraft::{RaftNetworkFactory, RaftNetworkV2};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::{Request, Response, Status, Streaming};

/// How a scripted peer answers.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// Knows no `StreamAppend` (an older node); answers unary calls.
    Old,
    /// On a stream, answers nothing until it holds this many requests,
    /// then each in order.
    AnswerAfter(usize),
    /// Reads a stream's requests and never answers.
    Silent,
    /// Reads a stream's requests and ends it without answering.
    HangUp,
}

struct ScriptedPeer {
    script: Script,
    unary_calls: Arc<AtomicU64>,
}

fn log_id(index: u64) -> LogIdOf<TypeConfig> {
    LogIdOf::<TypeConfig>::new(openraft::vote::leader_id_adv::LeaderId::new(1, 1), index)
}

fn request(index: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: VoteOf::<TypeConfig>::new_committed(1, 1),
        prev_log_id: index.checked_sub(1).map(log_id),
        entries: vec![openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(
            index,
        ))],
        leader_commit: None,
    }
}

/// The reply a follower gives once `request` is flushed.
fn flushed(request: &AppendEntriesRequest<TypeConfig>) -> RaftPayload {
    let last = request.entries.last().map(|entry| entry.log_id);
    let result: Result<StreamAppendResult<TypeConfig>, openraft::error::Fatal<TypeConfig>> =
        Ok(Ok(last));
    RaftPayload {
        data: postcard::to_allocvec(&result).expect("encode"),
    }
}

type Replies = Pin<Box<dyn futures_util::Stream<Item = Result<RaftPayload, Status>> + Send>>;

#[tonic::async_trait]
impl RaftPeer for ScriptedPeer {
    async fn append_entries(
        &self,
        _request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.unary_calls.fetch_add(1, Ordering::SeqCst);
        let result: Result<
            AppendEntriesResponse<TypeConfig>,
            openraft::error::RaftError<TypeConfig>,
        > = Ok(AppendEntriesResponse::Success);
        Ok(Response::new(RaftPayload {
            data: postcard::to_allocvec(&result).expect("encode"),
        }))
    }

    type StreamAppendStream = Replies;

    async fn stream_append(
        &self,
        request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<Replies>, Status> {
        let mut incoming = request.into_inner();
        let (replies, answers) = tokio::sync::mpsc::channel(64);
        let script = self.script;
        match script {
            Script::Old => return Err(Status::unimplemented("an older peer")),
            Script::AnswerAfter(held) => {
                tokio::spawn(async move {
                    let mut waiting = Vec::new();
                    while let Ok(Some(payload)) = incoming.message().await {
                        let request: AppendEntriesRequest<TypeConfig> =
                            postcard::from_bytes(&payload.data).expect("an AppendEntries");
                        waiting.push(request);
                        if waiting.len() >= held {
                            for request in waiting.drain(..) {
                                let _ = replies.send(Ok(flushed(&request))).await;
                            }
                        }
                    }
                });
            }
            Script::Silent => {
                tokio::spawn(async move {
                    let _open = replies;
                    while let Ok(Some(_)) = incoming.message().await {}
                    std::future::pending::<()>().await;
                });
            }
            Script::HangUp => {
                tokio::spawn(async move {
                    while let Ok(Some(_)) = incoming.message().await {}
                    drop(replies);
                });
            }
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(answers),
        )))
    }

    async fn vote(&self, _request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn transfer_leader(
        &self,
        _request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn install_snapshot(
        &self,
        _request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

/// Serves a [`ScriptedPeer`] on a free loopback port; gives a client of
/// it (as node 1's network to node 2) and its count of unary calls.
async fn peer(script: Script) -> (impl RaftNetworkV2<TypeConfig>, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let unary_calls = Arc::new(AtomicU64::new(0));
    let service = ScriptedPeer {
        script,
        unary_calls: Arc::clone(&unary_calls),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RaftPeerServer::new(service))
            .serve_with_incoming(tcp_incoming(listener)),
    );
    let mut network = PeerNetwork {
        append: PeerAppend::Stream,
        ..PeerNetwork::default()
    };
    let node = NodeInfo {
        peer_address: address,
        client_address: "127.0.0.1:1".to_string(),
    };
    (network.new_client(2, &node).await, unary_calls)
}

const PATIENCE: Duration = Duration::from_millis(500);

/// Sends requests for `indexes` on one `stream_append`; gives the replies
/// (or the error that opened none).
async fn send(
    network: &mut impl RaftNetworkV2<TypeConfig>,
    indexes: &[u64],
) -> Result<
    Vec<Result<StreamAppendResult<TypeConfig>, String>>,
    openraft::error::RPCError<TypeConfig>,
> {
    let input = futures_util::stream::iter(
        indexes
            .iter()
            .map(|&index| request(index))
            .collect::<Vec<_>>(),
    );
    let replies = network
        .stream_append(input, RPCOption::new(PATIENCE))
        .await?;
    let replies = tokio::time::timeout(
        Duration::from_secs(20),
        replies
            .map(|reply| reply.map_err(|error| error.to_string()))
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the replies end");
    Ok(replies)
}

fn flushed_at(index: u64) -> Result<StreamAppendResult<TypeConfig>, String> {
    Ok(Ok(Some(log_id(index))))
}

#[tokio::test]
async fn entries_are_pipelined_without_waiting_for_each_reply() {
    let (mut network, unary_calls) = peer(Script::AnswerAfter(3)).await;
    // One request at a time would wait for a reply the peer gives only
    // once it holds three: the call would time out instead.
    let replies = send(&mut network, &[1, 2, 3]).await.expect("a stream");
    assert_eq!(replies, vec![flushed_at(1), flushed_at(2), flushed_at(3)]);
    assert_eq!(unary_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn requests_left_unanswered_fail_the_stream_within_its_timeout() {
    let (mut network, _) = peer(Script::Silent).await;
    // `send` bounds the wait for the replies' end: a stream that kept
    // waiting would fail it; this one ends with the call's own timeout.
    let replies = send(&mut network, &[1]).await.expect("a stream");
    assert_eq!(replies.len(), 1, "{replies:?}");
    let error = replies[0].as_ref().expect_err("no reply came");
    assert!(error.contains("elapsed"), "{error}");
}

#[tokio::test]
async fn a_stream_ended_with_requests_unanswered_is_an_error() {
    let (mut network, _) = peer(Script::HangUp).await;
    let replies = send(&mut network, &[1, 2]).await.expect("a stream");
    assert_eq!(replies.len(), 1, "{replies:?}");
    let error = replies[0].as_ref().expect_err("no reply came");
    assert!(error.contains("unanswered"), "{error}");
}

#[tokio::test]
async fn a_peer_without_streams_is_sent_unary_calls() {
    let (mut network, unary_calls) = peer(Script::Old).await;
    let refused = send(&mut network, &[1]).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(unary_calls.load(Ordering::SeqCst), 0);
    let replies = send(&mut network, &[1, 2]).await.expect("unary rounds");
    assert_eq!(replies, vec![flushed_at(1), flushed_at(2)]);
    assert_eq!(unary_calls.load(Ordering::SeqCst), 2);
}
