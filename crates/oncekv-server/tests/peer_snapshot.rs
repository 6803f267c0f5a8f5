//! Incoming snapshots on a real node: a stream that ends short of the size
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
    let vote = VoteOf::<TypeConfig>::new(1, 2);
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

/// A node serving on loopback, and a peer client of it.
struct TestNode {
    dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), oncekv_server::server::ServeError>>,
    peer: RaftPeerClient<Channel>,
}

impl TestNode {
    async fn start(configure: impl FnOnce(&mut ServerConfig)) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let (clients, client_address) = listener().await;
        let (peers, peer_address) = listener().await;
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

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("node stopped in time")
            .expect("node task")
            .expect("node ran without error");
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
    let mut node = TestNode::start(|_| {}).await;
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
    let mut node = TestNode::start(|config| config.server_limits.snapshot_bytes_max = 64).await;
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
    assert!(status.metadata().get("oncekv-overloaded").is_none());
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
    let mut node = TestNode::start(|_| {}).await;
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
    let mut node = TestNode::start(|config| config.initial_cluster = None).await;
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
    node.stop().await;
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
