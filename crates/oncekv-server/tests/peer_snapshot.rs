//! A snapshot stream that ends short of the size it announced (a sender
//! that stopped half-way) is refused by a real node, never installed.

use oncekv_proto::v1::SnapshotChunk;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_server::raft::type_config::TypeConfig;
use oncekv_server::server::{ServerConfig, serve};
use oncekv_server::transport::tcp_incoming;
use openraft::alias::{SnapshotMetaOf, VoteOf};
use std::time::Duration;

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

#[tokio::test]
async fn a_snapshot_stream_that_ends_short_or_runs_long_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (clients, client_address) = listener().await;
    let (peers, peer_address) = listener().await;
    let config = ServerConfig::single_node(dir.path(), &client_address, &peer_address);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(serve(
        config,
        tcp_incoming(clients),
        tcp_incoming(peers),
        async move {
            let _ = stopped.await;
        },
    ));

    let endpoint = format!("http://{peer_address}");
    let mut peer = RaftPeerClient::connect(endpoint).await.expect("connect");
    for (chunks, expected) in [
        (
            vec![first_chunk(b"01234", 100), next_chunk(b"56789")],
            "snapshot stream ended after 10 of 100 bytes",
        ),
        (
            vec![first_chunk(b"01234", 8), next_chunk(b"56789")],
            "snapshot stream carries more than the 8 bytes it announced",
        ),
    ] {
        let status = tokio::time::timeout(
            Duration::from_secs(10),
            peer.install_snapshot(tokio_stream::iter(chunks)),
        )
        .await
        .expect("answered in time")
        .expect_err("a broken snapshot stream must be refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(status.message().contains(expected), "{status}");
    }

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), node)
        .await
        .expect("node stopped in time")
        .expect("node task")
        .expect("node ran without error");
}
