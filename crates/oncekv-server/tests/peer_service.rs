//! The peer service of a real node. Forged or broken Raft messages (a vote
//! of an impossible term, an append under an uncommitted vote or this
//! node's own, entries out of order, a snapshot beyond its vote) are
//! refused before consensus sees them, and so are well-formed messages
//! from a node that is not a member (PERMISSION_DENIED); the node keeps
//! serving and restarts cleanly. A `StreamAppend` is answered in order up
//! to its first refused request, which ends it. Incoming snapshots: a stream that ends short of the size
//! it announced (a sender that stopped half-way) or runs past it is
//! refused, never installed; a size over the node's cap is refused at once;
//! bytes that do not restore to the index they claim are refused before
//! consensus sees them; the chunks are spooled to `snapshot-incoming/` and
//! the spool file is gone after a refusal, a sender that went away, and an
//! install.

use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use oncekv_server::raft::type_config::TypeConfig;
use oncekv_server::server::{ServerConfig, serve};
use oncekv_server::transport::tcp_incoming;
use oncekv_state::{Limits, LogIndex, StateMachine};
use openraft::alias::{SnapshotMetaOf, VoteOf};
use openraft::raft::SnapshotResponse;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    (listener, address)
}

/// A first chunk: a well-formed vote and snapshot description, `data`,
/// and the size announced for the whole snapshot.
fn first_chunk(data: &[u8], total_bytes: u64) -> SnapshotChunk {
    let vote = VoteOf::<TypeConfig>::new_committed(1, 2);
    let meta = SnapshotMetaOf::<TypeConfig>::default();
    SnapshotChunk {
        vote: postcard::to_allocvec(&vote).expect("vote"),
        meta: postcard::to_allocvec(&meta).expect("meta"),
        data: data.to_vec(),
        total_bytes,
    }
}

fn next_chunk(data: &[u8]) -> SnapshotChunk {
    SnapshotChunk {
        data: data.to_vec(),
        ..SnapshotChunk::default()
    }
}

/// How the snapshot tests below configure their node: waiting to join (it
/// knows no membership yet), so it takes a snapshot from leader 2 of their
/// first chunks; a member of a cluster refuses a sender that is not one
/// before spooling anything.
fn waiting_to_join(config: &mut ServerConfig) {
    config.initial_cluster = None;
}

/// A node serving on loopback, and a peer client of it.
struct TestNode {
    dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), oncekv_server::server::ServeError>>,
    peer: RaftPeerClient<Channel>,
    client_address: String,
    peer_address: String,
}

impl TestNode {
    async fn start(configure: impl FnOnce(&mut ServerConfig)) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let (clients, client_address) = listener().await;
        let (peers, peer_address) = listener().await;
        TestNode::start_on(
            dir,
            (clients, client_address),
            (peers, peer_address),
            configure,
        )
        .await
    }

    /// The node again, on its data and addresses.
    async fn restart(self) -> TestNode {
        let (client_address, peer_address) =
            (self.client_address.clone(), self.peer_address.clone());
        let dir = self.stop().await;
        let bind = |address: String| async move {
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .expect("rebind");
            (listener, address)
        };
        let clients = bind(client_address).await;
        let peers = bind(peer_address).await;
        TestNode::start_on(dir, clients, peers, |_| {}).await
    }

    async fn start_on(
        dir: tempfile::TempDir,
        (clients, client_address): (tokio::net::TcpListener, String),
        (peers, peer_address): (tokio::net::TcpListener, String),
        configure: impl FnOnce(&mut ServerConfig),
    ) -> TestNode {
        let mut config = ServerConfig::single_node(dir.path(), &client_address, &peer_address);
        configure(&mut config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            config,
            tcp_incoming(clients),
            tcp_incoming(peers),
            async move {
                let _ = stopped.await;
            },
        ));
        let peer = RaftPeerClient::connect(format!("http://{peer_address}"))
            .await
            .expect("connect");
        TestNode {
            dir,
            stop,
            task,
            peer,
            client_address,
            peer_address,
        }
    }

    fn spool(&self) -> PathBuf {
        self.dir.path().join("snapshot-incoming")
    }

    async fn install(&mut self, chunks: Vec<SnapshotChunk>) -> Result<RaftPayload, tonic::Status> {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.peer.install_snapshot(tokio_stream::iter(chunks)),
        )
        .await
        .expect("answered in time")
        .map(tonic::Response::into_inner)
    }

    async fn stop(self) -> tempfile::TempDir {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("node stopped in time")
            .expect("node task")
            .expect("node ran without error");
        self.dir
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("spool directory")
        .map(|entry| entry.expect("entry").path())
        .collect()
}

/// Waits until the spool directory is empty (its files are removed when a
/// handler ends, which may be just after the answer was sent).
async fn spool_empties(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let files = files_in(dir);
        if files.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "spool files left: {files:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_snapshot_stream_that_ends_short_or_runs_long_is_refused() {
    let mut node = TestNode::start(waiting_to_join).await;
    for (chunks, expected) in [
        (
            vec![first_chunk(b"01234", 100), next_chunk(b"56789")],
            "snapshot stream ended after 10 of 100 bytes",
        ),
        (
            vec![first_chunk(b"01234", 8), next_chunk(b"56789")],
            "snapshot stream carries more than the 8 bytes it announced",
        ),
        (
            vec![first_chunk(b"0123456789", 4)],
            "snapshot stream carries more than the 4 bytes it announced",
        ),
    ] {
        let status = node
            .install(chunks)
            .await
            .expect_err("a broken snapshot stream must be refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(status.message().contains(expected), "{status}");
    }
    spool_empties(&node.spool()).await;
    node.stop().await;
}

#[tokio::test]
async fn a_snapshot_over_the_cap_is_refused_at_once() {
    let mut node = TestNode::start(|config| {
        waiting_to_join(config);
        config.server_limits.snapshot_bytes_max = 64;
    })
    .await;
    let status = node
        .install(vec![first_chunk(b"0123", u64::MAX), next_chunk(b"4567")])
        .await
        .expect_err("over the cap");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    assert!(
        status
            .message()
            .contains("over this node's limit of 64 bytes"),
        "{status}"
    );
    // Too large is not "busy": the sender must not just try again.
    assert!(
        status
            .metadata()
            .get(oncekv_proto::OVERLOADED_METADATA)
            .is_none()
    );
    // At the cap is accepted (and then refused only for ending short).
    let status = node
        .install(vec![first_chunk(b"0123", 64)])
        .await
        .expect_err("short");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    spool_empties(&node.spool()).await;
    node.stop().await;
}

#[tokio::test]
async fn chunks_are_spooled_to_disk_and_removed_when_the_sender_goes_away() {
    let mut node = TestNode::start(waiting_to_join).await;
    let (send, receive) = tokio::sync::mpsc::channel::<SnapshotChunk>(4);
    let mut peer = node.peer.clone();
    let call = tokio::spawn(async move {
        peer.install_snapshot(tokio_stream::wrappers::ReceiverStream::new(receive))
            .await
    });
    let piece = vec![7u8; 64 * 1024];
    send.send(first_chunk(&piece, 1 << 20)).await.expect("send");
    send.send(next_chunk(&piece)).await.expect("send");
    // Both chunks reach the spool file.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sizes: Vec<u64> = files_in(&node.spool())
            .iter()
            .map(|file| std::fs::metadata(file).map(|m| m.len()).unwrap_or(0))
            .collect();
        if sizes == [2 * 64 * 1024] {
            break;
        }
        assert!(Instant::now() < deadline, "spool holds {sizes:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The sender goes away mid-stream: the file goes too.
    call.abort();
    drop(send);
    spool_empties(&node.spool()).await;
    // And the node still takes snapshots.
    let status = node
        .install(vec![first_chunk(b"01", 3)])
        .await
        .expect_err("short");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    node.stop().await;
}

/// A whole snapshot of `data` claiming to end at `index`, from leader 2 of
/// term 1, cut in pieces of 3 bytes so it takes several chunks.
fn snapshot_stream(data: &[u8], index: u64) -> Vec<SnapshotChunk> {
    let meta = SnapshotMetaOf::<TypeConfig> {
        last_log_id: Some(openraft::testing::log_id::<TypeConfig>(1, 2, index)),
        ..SnapshotMetaOf::<TypeConfig>::default()
    };
    let vote = VoteOf::<TypeConfig>::new_committed(1, 2);
    let mut chunks: Vec<SnapshotChunk> = data.chunks(3).map(next_chunk).collect();
    chunks[0].vote = postcard::to_allocvec(&vote).expect("vote");
    chunks[0].meta = postcard::to_allocvec(&meta).expect("meta");
    chunks[0].total_bytes = data.len() as u64;
    chunks
}

#[tokio::test]
async fn a_complete_snapshot_is_installed_and_its_spool_file_removed() {
    // A node waiting to join: any leader's snapshot is newer than its state.
    let mut node = TestNode::start(waiting_to_join).await;
    let mut machine = StateMachine::new(Limits::default());
    machine.apply_empty(LogIndex(5));
    let data = machine.snapshot();

    // Bytes that do not restore, or restore to another index than claimed,
    // are refused before consensus sees them (its failed install would
    // stop the node).
    for (chunks, expected) in [
        (
            snapshot_stream(b"not a snapshot at all", 5),
            "does not restore",
        ),
        (
            snapshot_stream(&data, 6),
            "restores to index Some(5), not the Some(6) it claims",
        ),
    ] {
        let status = node.install(chunks).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(status.message().contains(expected), "{status}");
        assert!(!node.task.is_finished(), "the node stopped");
    }

    let vote = VoteOf::<TypeConfig>::new_committed(1, 2);
    let reply = node
        .install(snapshot_stream(&data, 5))
        .await
        .expect("installed");
    let result: Result<SnapshotResponse<TypeConfig>, openraft::error::Fatal<TypeConfig>> =
        postcard::from_bytes(&reply.data).expect("reply decodes");
    let response = result.expect("no fatal error");
    assert_eq!(response.vote, vote);
    assert!(
        node.dir.path().join("state").join("snapshot.bin").exists(),
        "the installed snapshot is persisted"
    );
    spool_empties(&node.spool()).await;
    let dir = node.stop().await;
    let state_dir = dir.path().join("state");
    // The spool file was moved into place with its metadata appended: the
    // store resumes from it.
    let store = oncekv_server::raft::state_machine_store::StateMachineStore::open(
        &state_dir,
        Limits::default(),
    )
    .expect("the store reopens from the installed snapshot");
    assert_eq!(
        store.shared().lock().machine.last_applied(),
        Some(LogIndex(5))
    );
}

/// `crates/oncekv/tests/server_limits.rs` talks to a node process without
/// openraft or postcard and sends these bytes as a vote and a snapshot
/// description: this keeps them what they stand for.
#[test]
fn the_hand_encoded_vote_and_meta_of_the_process_tests_decode() {
    let vote: VoteOf<TypeConfig> = postcard::from_bytes(&[1, 2, 0]).expect("vote");
    assert_eq!(vote, VoteOf::<TypeConfig>::new(1, 2));
    let meta: SnapshotMetaOf<TypeConfig> = postcard::from_bytes(&[0; 5]).expect("meta");
    assert_eq!(meta, SnapshotMetaOf::<TypeConfig>::default());
}

/// `crates/oncekv/tests/peer_auth.rs` forges peer messages by hand (it
/// has neither openraft nor postcard): a vote request of term 2^63 - 1
/// from node 2, claiming a log of term 2^62 and a leadership transfer (so
/// a node that admitted it would grant it, lease or not), and an append
/// claiming leader 2. This keeps the bytes what they stand for.
#[test]
fn the_hand_encoded_forgeries_of_the_peer_auth_tests_decode() {
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum Kind {
        Vote(VoteRequest<TypeConfig>),
    }
    let forged_term: u64 = (1 << 63) - 1;
    let mut vote = vec![0];
    vote.extend([0xff; 8]);
    vote.extend([0x7f, 2, 0, 1]);
    vote.extend([0x80; 8]);
    vote.extend([0x40, 2, 1, 1]);
    let Kind::Vote(decoded) = postcard::from_bytes::<Kind>(&vote).expect("a vote request");
    let mut expected = VoteRequest::<TypeConfig>::new(
        VoteOf::<TypeConfig>::new(forged_term, 2),
        Some(log_id(1 << 62, 2, 1)),
    );
    expected.leadership_transfer = true;
    assert_eq!(decoded, expected);
    let append: AppendEntriesRequest<TypeConfig> =
        postcard::from_bytes(&[100, 2, 1, 0, 0, 0]).expect("an append");
    assert_eq!(append.vote, VoteOf::<TypeConfig>::new_committed(100, 2));
    assert!(append.prev_log_id.is_none() && append.entries.is_empty());
    assert!(append.leader_commit.is_none());
}

/// The shape of a vote message on the peer port (the node's own type is
/// private to it; postcard encodes both alike).
#[derive(serde::Serialize)]
enum VoteKind {
    Vote(openraft::raft::VoteRequest<TypeConfig>),
}

impl TestNode {
    /// Waits until the node leads, then applies a PUT through its client
    /// port: it serves.
    async fn serves(&self) {
        use oncekv_proto::v1::kv_client::KvClient;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut client = loop {
            if let Ok(client) = KvClient::connect(format!("http://{}", self.client_address)).await {
                break client;
            }
            assert!(Instant::now() < deadline, "client port never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let put = oncekv_state::Request::plain(oncekv_state::Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        });
        let wire = oncekv_proto::convert::request_to_wire(&put).expect("encodes");
        loop {
            let answer = client
                .execute(wire.clone())
                .await
                .expect("answered")
                .into_inner();
            if let Some(oncekv_proto::v1::execute_response::Result::Outcome(_)) = answer.result {
                return;
            }
            assert!(Instant::now() < deadline, "no write applied: {answer:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl TestNode {
    /// Sends `request` as a unary `AppendEntries`; returns openraft's answer.
    async fn unary_append(
        &mut self,
        request: openraft::raft::AppendEntriesRequest<TypeConfig>,
    ) -> Result<
        openraft::raft::AppendEntriesResponse<TypeConfig>,
        openraft::error::RaftError<TypeConfig>,
    > {
        let reply = self
            .peer
            .append_entries(payload(&request))
            .await
            .expect("an append answered")
            .into_inner();
        postcard::from_bytes(&reply.data).expect("decodes")
    }
}

use openraft::entry::RaftEntry as _;
use openraft::vote::RaftLeaderId as _;

fn payload<T: serde::Serialize>(message: &T) -> RaftPayload {
    RaftPayload {
        data: postcard::to_allocvec(message).expect("encodes"),
    }
}

fn log_id(term: u64, node: u64, index: u64) -> openraft::alias::LogIdOf<TypeConfig> {
    openraft::alias::LogIdOf::<TypeConfig>::new(
        openraft::vote::leader_id_adv::LeaderId::new(term, node),
        index,
    )
}

fn append(
    vote: VoteOf<TypeConfig>,
    prev: Option<u64>,
    indexes: &[u64],
) -> openraft::raft::AppendEntriesRequest<TypeConfig> {
    openraft::raft::AppendEntriesRequest {
        vote,
        prev_log_id: prev.map(|index| log_id(1, 2, index)),
        entries: indexes
            .iter()
            .map(|&index| openraft::alias::EntryOf::<TypeConfig>::new_blank(log_id(1, 2, index)))
            .collect(),
        leader_commit: None,
    }
}

fn assert_refused(result: Result<tonic::Response<RaftPayload>, tonic::Status>, what: &str) {
    match result {
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        ),
        Ok(_) => panic!("{what}: accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_raft_messages_are_refused_and_the_node_serves_and_restarts() {
    let mut node = TestNode::start(|_| {}).await;
    node.serves().await;
    let request = openraft::raft::VoteRequest::<TypeConfig>::new(
        VoteOf::<TypeConfig>::new(u64::MAX, 999),
        None,
    );
    assert_refused(
        node.peer.vote(payload(&VoteKind::Vote(request))).await,
        "a vote of term u64::MAX",
    );
    let committed = VoteOf::<TypeConfig>::new_committed(1, 2);
    for (what, forged) in [
        (
            "an append under an uncommitted vote",
            append(VoteOf::<TypeConfig>::new(7, 2), None, &[0]),
        ),
        (
            "an append under this node's own vote",
            append(VoteOf::<TypeConfig>::new_committed(7, 1), None, &[0]),
        ),
        (
            "entries that do not follow prev_log_id",
            append(committed, Some(3), &[5, 6]),
        ),
        (
            "an entry of a later leader than the vote",
            append(VoteOf::<TypeConfig>::new_committed(0, 2), None, &[0]),
        ),
    ] {
        assert_refused(node.peer.append_entries(payload(&forged)).await, what);
    }
    let mut beyond = first_chunk(&[], 0);
    let meta = SnapshotMetaOf::<TypeConfig> {
        last_log_id: Some(log_id(9, 2, 1_000)),
        ..SnapshotMetaOf::<TypeConfig>::default()
    };
    beyond.meta = postcard::to_allocvec(&meta).expect("meta");
    let refused = node.install(vec![beyond]).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    node.serves().await;
    let again = node.restart().await;
    again.serves().await;
    again.stop().await;
}

/// A `StreamAppend` of a fresh node (it knows no membership, so node 2
/// may lead it): the requests before a forged one are answered, in order;
/// the forged one ends the call with INVALID_ARGUMENT, and what follows it
/// is not applied; the node takes appends afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_appends_is_answered_in_order_up_to_a_forged_one() {
    let mut node = TestNode::start(|config| config.initial_cluster = None).await;
    let leader = VoteOf::<TypeConfig>::new_committed(1, 2);
    let requests = vec![
        payload(&append(leader, None, &[0])),
        payload(&append(leader, Some(0), &[1, 2])),
        payload(&append(leader, Some(3), &[5])),
        payload(&append(leader, Some(2), &[3])),
    ];
    let mut replies = node
        .peer
        .stream_append(tokio_stream::iter(requests))
        .await
        .expect("a stream")
        .into_inner();
    for index in [0, 2] {
        let reply = replies.message().await.expect("a reply").expect("open");
        let result: Result<
            openraft::raft::StreamAppendResult<TypeConfig>,
            openraft::error::Fatal<TypeConfig>,
        > = postcard::from_bytes(&reply.data).expect("decodes");
        match result {
            Ok(Ok(Some(flushed))) => assert_eq!(flushed, log_id(1, 2, index)),
            other => panic!("the append up to {index}: {other:?}"),
        }
    }
    let refused = replies.message().await.expect_err("the forged request");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("index 5"), "{refused:?}");
    // Index 3 came after the forged request: the node does not hold it
    // (an append after it conflicts), and takes it now.
    let after_three = node.unary_append(append(leader, Some(3), &[])).await;
    assert!(
        matches!(
            after_three,
            Ok(openraft::raft::AppendEntriesResponse::Conflict)
        ),
        "{after_three:?}"
    );
    let three = node.unary_append(append(leader, Some(2), &[3])).await;
    assert!(
        matches!(three, Ok(openraft::raft::AppendEntriesResponse::Success)),
        "{three:?}"
    );
    node.stop().await;
}

/// A `StreamAppend` whose second request rewrites what the first commits
/// (a later leader's entry at a committed index) is refused, though the
/// node may not have taken the first when the second is read: openraft
/// would otherwise be handed a rewrite of its committed log (a debug
/// assertion, and in a release build committed history overwritten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_append_that_rewrites_what_an_earlier_one_commits_is_refused() {
    use openraft::alias::EntryOf;
    let mut node = TestNode::start(|config| config.initial_cluster = None).await;
    let leader = VoteOf::<TypeConfig>::new_committed(1, 2);
    let mut first = append(leader, None, &[0, 1, 2]);
    first.leader_commit = Some(log_id(1, 2, 2));
    let rewrite = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new_committed(2, 3),
        prev_log_id: Some(log_id(2, 3, 1)),
        entries: vec![EntryOf::<TypeConfig>::new_blank(log_id(2, 3, 2))],
        leader_commit: None,
    };
    let mut replies = node
        .peer
        .stream_append(tokio_stream::iter(vec![payload(&first), payload(&rewrite)]))
        .await
        .expect("a stream")
        .into_inner();
    let reply = replies.message().await.expect("a reply").expect("open");
    let result: Result<
        openraft::raft::StreamAppendResult<TypeConfig>,
        openraft::error::Fatal<TypeConfig>,
    > = postcard::from_bytes(&reply.data).expect("decodes");
    assert!(
        matches!(result, Ok(Ok(Some(flushed))) if flushed == log_id(1, 2, 2)),
        "{result:?}"
    );
    let refused = replies.message().await.expect_err("the rewrite");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("contradicts"), "{refused:?}");
    // The node goes on taking its leader's appends.
    let mut next = append(leader, Some(2), &[3]);
    next.leader_commit = Some(log_id(1, 2, 3));
    let result = node.unary_append(next).await;
    assert!(
        matches!(result, Ok(openraft::raft::AppendEntriesResponse::Success)),
        "{result:?}"
    );
    node.stop().await;
}

/// The same for two unary appends sent at once: whichever the node takes
/// first, it never hands openraft the rewrite of what the other commits
/// (the second is admitted only once openraft answered the first, and
/// against what the first commits). Either the leader's append is taken
/// and the rewrite refused, or the later leader's rewrite comes first and
/// is taken (nothing was committed yet) and the earlier leader's append
/// is answered with the higher vote; the node goes on serving. Over
/// several fresh nodes, as the order the calls arrive in varies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unary_appends_never_rewrite_what_one_commits() {
    use openraft::alias::EntryOf;
    type Answer = Result<
        openraft::raft::AppendEntriesResponse<TypeConfig>,
        openraft::error::RaftError<TypeConfig>,
    >;
    let decode = |answer: tonic::Response<RaftPayload>| -> Answer {
        postcard::from_bytes(&answer.into_inner().data).expect("decodes")
    };
    for _ in 0..8 {
        let mut node = TestNode::start(|config| config.initial_cluster = None).await;
        let leader = VoteOf::<TypeConfig>::new_committed(1, 2);
        let later = VoteOf::<TypeConfig>::new_committed(2, 3);
        let mut first = append(leader, None, &[0, 1, 2]);
        first.leader_commit = Some(log_id(1, 2, 2));
        let rewrite = openraft::raft::AppendEntriesRequest::<TypeConfig> {
            vote: later,
            prev_log_id: Some(log_id(2, 3, 1)),
            entries: vec![EntryOf::<TypeConfig>::new_blank(log_id(2, 3, 2))],
            leader_commit: None,
        };
        let (mut one, mut other) = (node.peer.clone(), node.peer.clone());
        let (first_answer, rewrite_answer) = tokio::join!(
            one.append_entries(payload(&first)),
            other.append_entries(payload(&rewrite)),
        );
        let first_answer = decode(first_answer.expect("the leader's append is admitted"));
        match rewrite_answer {
            Err(refused) => {
                assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
                assert!(refused.message().contains("contradicts"), "{refused:?}");
                assert!(
                    matches!(
                        first_answer,
                        Ok(openraft::raft::AppendEntriesResponse::Success)
                    ),
                    "{first_answer:?}"
                );
            }
            Ok(taken) => {
                let taken = decode(taken);
                assert!(taken.is_ok(), "{taken:?}");
                assert!(
                    matches!(first_answer, Ok(openraft::raft::AppendEntriesResponse::HigherVote(vote)) if vote == later),
                    "the rewrite came first, so the earlier leader's append is refused: {first_answer:?}"
                );
            }
        }
        // Still serving: openraft answers (a panic in it would be Fatal).
        let mut next = append(leader, Some(2), &[3]);
        next.leader_commit = Some(log_id(1, 2, 3));
        let result = node.unary_append(next).await;
        assert!(result.is_ok(), "{result:?}");
        node.stop().await;
    }
}

fn assert_denied(result: Result<tonic::Response<RaftPayload>, tonic::Status>, what: &str) {
    match result {
        Err(status) => {
            assert_eq!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{what}: {status:?}"
            );
            assert!(
                status.message().contains("not a member"),
                "{what}: {status:?}"
            );
        }
        Ok(_) => panic!("{what}: accepted"),
    }
}

/// Well-formed messages from node 999, which is not a member of the
/// node's cluster (it is alone in it): a vote and a pre-vote (of a term far
/// ahead), an append and a snapshot (under a vote older than the node's:
/// a removed leader's) are refused PERMISSION_DENIED before consensus sees
/// them, and a snapshot whose vote does not decode INVALID_ARGUMENT; the
/// node keeps serving and restarts cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_a_non_member_are_refused_and_the_node_serves_and_restarts() {
    #[derive(serde::Serialize)]
    enum AnyVote {
        #[allow(dead_code)]
        Vote(openraft::raft::VoteRequest<TypeConfig>),
        PreVote(openraft::raft::VoteRequest<TypeConfig>),
    }
    let mut node = TestNode::start(|_| {}).await;
    node.serves().await;
    let stranger = VoteOf::<TypeConfig>::new(1_000, 999);
    let vote =
        openraft::raft::VoteRequest::<TypeConfig>::new(stranger, Some(log_id(999, 999, 1_000_000)));
    assert_denied(
        node.peer.vote(payload(&VoteKind::Vote(vote.clone()))).await,
        "a vote from a non-member",
    );
    assert_denied(
        node.peer.vote(payload(&AnyVote::PreVote(vote))).await,
        "a pre-vote from a non-member",
    );
    let leader = VoteOf::<TypeConfig>::new_committed(0, 999);
    let mut forged = append(leader, None, &[]);
    forged.leader_commit = Some(log_id(0, 999, 1_000_000));
    assert_denied(
        node.peer.append_entries(payload(&forged)).await,
        "an append from a non-member",
    );
    let mut snapshot = first_chunk(&[], 0);
    snapshot.vote = postcard::to_allocvec(&leader).expect("vote");
    let refused = node.install(vec![snapshot]).await;
    assert_denied(
        refused.map(tonic::Response::new),
        "a snapshot from a non-member",
    );
    let mut garbage = first_chunk(b"garbage", 7);
    garbage.vote = vec![0xff; 9];
    let refused = node.install(vec![garbage]).await.expect_err("undecodable");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("undecodable snapshot vote"),
        "{refused:?}"
    );
    spool_empties(&node.spool()).await;
    node.serves().await;
    let again = node.restart().await;
    again.serves().await;
    again.stop().await;
}
