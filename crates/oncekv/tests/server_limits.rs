//! The server limits of `oncekv serve`, against real processes: requests
//! beyond the in-flight cap are shed with the typed refusal (and a client
//! retries even a plain mutation after it), connections beyond the cap
//! are refused the same way while the others are served, a peer snapshot announcing
//! more than the cap is refused without the node's memory growing (and
//! one under it, from a member, is spooled to disk, not memory), and a malformed message
//! is INVALID_ARGUMENT on both ports.

mod support;

use oncekv_client::{Client, ClientOptions};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk, StatusRequest};
use oncekv_server::raft::peer_token::{PEER_TOKEN_METADATA, PeerToken};
use oncekv_state::{Command, Reply};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{Cluster, FAST, exclusive, free_port};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use oncekv_proto::OVERLOADED_METADATA as OVERLOADED;

/// A vote (term 1, node 2) and an empty snapshot description as postcard
/// bytes; `crates/oncekv-server/tests/peer_service.rs` checks that they
/// decode as such.
const VOTE: [u8; 3] = [1, 2, 0];
const META: [u8; 5] = [0; 5];

/// A committed vote of `term` for leader `leader` as postcard bytes (the
/// term and the id as varints, then `committed`), as VOTE is spelled.
fn committed_vote(term: u64, leader: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for mut value in [term, leader] {
        while value >= 0x80 {
            bytes.push((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        bytes.push(value as u8);
    }
    bytes.push(1);
    bytes
}

async fn channel(address: &str) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2));
    tokio::time::timeout(Duration::from_secs(5), endpoint.connect())
        .await
        .expect("connected in time")
        .expect("connect")
}

/// A codec for calls that send no message and never read one: the request
/// stream stays open, so the call holds its slot on the server.
#[derive(Clone, Copy, Debug, Default)]
struct Silent;

impl Codec for Silent {
    type Encode = ();
    type Decode = ();
    type Encoder = Silent;
    type Decoder = Silent;

    fn encoder(&mut self) -> Silent {
        Silent
    }

    fn decoder(&mut self) -> Silent {
        Silent
    }
}

impl Encoder for Silent {
    type Item = ();
    type Error = Status;

    fn encode(&mut self, _item: (), _dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        Ok(())
    }
}

impl Decoder for Silent {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, _src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        Err(Status::internal("this test never reads a message"))
    }
}

/// A `Status` call whose request message never comes: it holds an
/// in-flight slot until it is dropped, or comes back refused.
fn hold_a_slot(channel: Channel) -> tokio::task::JoinHandle<Status> {
    tokio::spawn(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        if let Err(error) = grpc.ready().await {
            return Status::unavailable(error.to_string());
        }
        let path = http::uri::PathAndQuery::from_static("/oncekv.v1.Kv/Status");
        let never = tonic::codegen::tokio_stream::pending::<()>();
        match grpc
            .client_streaming(tonic::Request::new(never), path, Silent)
            .await
        {
            Ok(_) => Status::ok("answered"),
            Err(status) => status,
        }
    })
}

/// Whether `status` is the typed refusal of a shed request.
fn is_shed(status: &Status, what: &str) -> bool {
    status.code() == Code::ResourceExhausted
        && status
            .metadata()
            .get(OVERLOADED)
            .and_then(|value| value.to_str().ok())
            == Some(what)
}

/// The value of the Prometheus sample named `name` whose labels include
/// every one of `labels` (`key="value"`), 0 if there is none yet.
async fn metric(address: &str, name: &str, labels: &[&str]) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `check` every 20 ms until it holds, for at most `timeout`.
async fn until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status_of(channel: &Channel) -> Result<(), Status> {
    KvClient::new(channel.clone())
        .status(StatusRequest {})
        .await
        .map(|_| ())
}

#[tokio::test]
async fn requests_beyond_the_in_flight_cap_are_shed_and_the_node_keeps_serving() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut flags = FAST.to_vec();
    flags.extend(["--client-max-in-flight", "4", "--listen-metrics", &metrics]);
    let cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(20)).await;
    let address = cluster.nodes[0].client.clone();
    let connection = channel(&address).await;

    // Twice the cap of calls that never end: the cap's worth are taken in
    // and held, the rest are refused at once, typed.
    let mut holders: Vec<_> = (0..8).map(|_| hold_a_slot(connection.clone())).collect();
    until(Duration::from_secs(10), "4 calls refused", || {
        let finished = holders.iter().filter(|h| h.is_finished()).count();
        async move { finished >= 4 }
    })
    .await;
    let mut held = Vec::new();
    for holder in holders.drain(..) {
        if holder.is_finished() {
            let status = holder.await.expect("holder task");
            assert!(is_shed(&status, "in-flight"), "{status:?}");
        } else {
            held.push(holder);
        }
    }
    assert_eq!(held.len(), 4, "the cap's worth of calls are held");

    // While it is full, every request is refused at once with the typed
    // refusal, on this connection and on a new one.
    let other = channel(&address).await;
    for channel in [&connection, &other] {
        let status = tokio::time::timeout(Duration::from_secs(5), status_of(channel))
            .await
            .expect("refused at once")
            .expect_err("the node is full");
        assert!(is_shed(&status, "in-flight"), "{status:?}");
        assert!(status.message().contains("retry later"), "{status:?}");
    }
    let shed = ["listener=\"client\"", "limit=\"in-flight\""];
    let shed_before = metric(&metrics, "oncekv_requests_shed_total", &shed).await;
    assert!(
        shed_before >= 6.0,
        "shed requests are counted: {shed_before}"
    );

    // A plain PUT (retried only when it was definitely not sent) is shed,
    // retried after backoff, and applies once the slots are free.
    let client = Client::connect([address.clone()], ClientOptions::default()).expect("client");
    let put = tokio::spawn(async move {
        client
            .execute_plain(Command::Put {
                key: b"k".to_vec(),
                value: b"after the shedding".to_vec().into(),
                lease: None,
            })
            .await
    });
    until(Duration::from_secs(10), "the PUT to be shed", || {
        let metrics = metrics.clone();
        async move { metric(&metrics, "oncekv_requests_shed_total", &shed).await > shed_before }
    })
    .await;
    for holder in &held {
        holder.abort();
    }
    let completed = tokio::time::timeout(Duration::from_secs(20), put)
        .await
        .expect("PUT answered in time")
        .expect("PUT task")
        .expect("a shed PUT is retried and applies");
    assert!(completed.attempts >= 2, "{completed:?}");
    assert!(!completed.replayed, "{completed:?}");
    assert_eq!(completed.reply, Reply::Put { previous: None });

    // The node keeps serving, on the old connection too.
    for _ in 0..10 {
        status_of(&connection).await.expect("served after shedding");
    }
    assert_eq!(
        cluster.nodes[0].local_value(b"k").await.as_deref(),
        Some(&b"after the shedding"[..])
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_and_the_others_served() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut flags = FAST.to_vec();
    flags.extend([
        "--client-max-connections",
        "3",
        "--listen-metrics",
        &metrics,
    ]);
    let cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(20)).await;
    // `leader()` connected and went away: wait until the node counts none.
    let open = ["listener=\"client\""];
    until(Duration::from_secs(10), "no open client connection", || {
        let metrics = metrics.clone();
        async move { metric(&metrics, "oncekv_connections_open", &open).await == 0.0 }
    })
    .await;
    let address = cluster.nodes[0].client.clone();

    let mut kept = Vec::new();
    for _ in 0..3 {
        let connection = channel(&address).await;
        status_of(&connection).await.expect("within the cap");
        kept.push(connection);
    }
    // A fourth is refused: its request is answered at once with the typed
    // refusal, unhandled.
    for _ in 0..3 {
        let refused = async {
            let connection = Endpoint::from_shared(format!("http://{address}"))
                .expect("endpoint")
                .connect()
                .await
                .map_err(|error| Status::unavailable(error.to_string()))?;
            status_of(&connection).await
        };
        let status = tokio::time::timeout(Duration::from_secs(5), refused)
            .await
            .expect("refused at once, not left waiting")
            .expect_err("a connection over the cap was served");
        assert!(is_shed(&status, "connections"), "{status:?}");
    }
    let refused = metric(
        &metrics,
        "oncekv_connections_refused_total",
        &["listener=\"client\""],
    )
    .await;
    assert!(refused >= 3.0, "refusals are counted: {refused}");
    assert!(
        cluster.logs().contains("connection refused"),
        "refusals are logged\n{}",
        cluster.logs()
    );

    // The connections it has are served all along.
    for connection in &kept {
        for _ in 0..5 {
            status_of(connection).await.expect("kept connection served");
        }
    }
    // A plain PUT (retried only when it was definitely not sent) is
    // refused while the node is full, retried after backoff, and applies
    // once a connection closes and makes room.
    let client = Client::connect([address.clone()], ClientOptions::default()).expect("client");
    let put = tokio::spawn(async move {
        client
            .execute_plain(Command::Put {
                key: b"k".to_vec(),
                value: b"after the refusals".to_vec().into(),
                lease: None,
            })
            .await
    });
    let shed = ["listener=\"client\"", "limit=\"connections\""];
    until(Duration::from_secs(10), "the PUT to be refused", || {
        let metrics = metrics.clone();
        async move { metric(&metrics, "oncekv_requests_shed_total", &shed).await > 3.0 }
    })
    .await;
    kept.pop();
    let completed = tokio::time::timeout(Duration::from_secs(20), put)
        .await
        .expect("PUT answered in time")
        .expect("PUT task")
        .expect("a refused PUT is retried and applies");
    assert!(completed.attempts >= 2, "{completed:?}");
    assert_eq!(completed.reply, Reply::Put { previous: None });
}

/// The resident memory of process `pid`, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

const MIB: usize = 1024 * 1024;

fn chunk(first: bool, total_bytes: u64) -> SnapshotChunk {
    chunk_under(&VOTE, first, total_bytes)
}

/// A chunk of 1 MiB; the first carries `vote`, an empty snapshot
/// description and the size announced.
fn chunk_under(vote: &[u8], first: bool, total_bytes: u64) -> SnapshotChunk {
    SnapshotChunk {
        vote: if first { vote.to_vec() } else { Vec::new() },
        meta: if first { META.to_vec() } else { Vec::new() },
        data: vec![0x5a; MIB],
        total_bytes: if first { total_bytes } else { 0 },
    }
}

fn spool_files(data_dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    std::fs::read_dir(data_dir.join("snapshot-incoming"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| {
                    let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    (entry.path(), size)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_snapshot_over_the_cap_is_refused_and_one_under_it_is_spooled_not_held() {
    let _one = exclusive().await;
    // Two nodes: a follower spools a snapshot only from a member of its
    // cluster (here, one claiming to come from its leader).
    let cluster = Cluster::start(2, &["--max-snapshot-bytes", "268435456"]);
    let leader = cluster.leader(Duration::from_secs(20)).await;
    let node = cluster
        .nodes
        .iter()
        .find(|node| node.id != leader)
        .expect("a follower");
    let term = cluster
        .nodes
        .iter()
        .find(|node| node.id == leader)
        .expect("the leader")
        .status()
        .await
        .expect("the leader's status")
        .term;
    let vote = committed_vote(term, leader);
    let pid = node.child.as_ref().expect("running").id();
    let peer = RaftPeerClient::new(channel(&node.peer).await);
    let token = peer_token(&cluster);
    let before = resident_bytes(pid);

    // Three senders at once each announce 100 GiB and push 64 MiB: each is
    // refused at its first message.
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let mut peer = peer.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let chunks = (0..64).map(|i| chunk(i == 0, 100 << 30));
                peer.install_snapshot(with_token(tokio_stream_iter(chunks), token.as_ref()))
                    .await
            })
        })
        .collect();
    for sender in senders {
        let status = tokio::time::timeout(Duration::from_secs(10), sender)
            .await
            .expect("refused in time")
            .expect("sender task")
            .expect_err("over the cap");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("over this node's limit"),
            "{status:?}"
        );
        assert!(status.metadata().get(OVERLOADED).is_none(), "{status:?}");
    }
    let after = resident_bytes(pid);
    assert!(
        after < before + 32 * MIB as u64,
        "memory grew from {before} to {after} bytes"
    );
    assert!(cluster.logs().contains("over this node's limit"));

    // A snapshot under the cap is received into its spool file: 96 MiB of
    // a 200 MiB snapshot reach the disk while memory stays flat.
    let (send, receive) = tokio::sync::mpsc::channel::<SnapshotChunk>(2);
    let mut sender = peer.clone();
    let spool_token = token.clone();
    let call = tokio::spawn(async move {
        sender
            .install_snapshot(with_token(
                tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receive),
                spool_token.as_ref(),
            ))
            .await
    });
    for i in 0..96 {
        let chunk = chunk_under(&vote, i == 0, 200 << 20);
        tokio::time::timeout(Duration::from_secs(10), send.send(chunk))
            .await
            .expect("the node takes chunks")
            .expect("stream open");
    }
    until(Duration::from_secs(20), "96 MiB in the spool file", || {
        let files = spool_files(&node.data_dir);
        async move { files.len() == 1 && files[0].1 == 96 * MIB as u64 }
    })
    .await;
    let spooling = resident_bytes(pid);
    assert!(
        spooling < before + 32 * MIB as u64,
        "memory grew from {before} to {spooling} bytes while 96 MiB were spooled"
    );
    // The sender stops short: refused, and the spool file is removed.
    drop(send);
    let status = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("answered in time")
        .expect("sender task")
        .expect_err("short of what it announced");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("ended after 100663296 of 209715200 bytes"),
        "{status:?}"
    );
    until(Duration::from_secs(10), "the spool file to go", || {
        let files = spool_files(&node.data_dir);
        async move { files.is_empty() }
    })
    .await;
    node.status().await.expect("the node keeps serving");
}

fn tokio_stream_iter<I: IntoIterator>(items: I) -> tonic::codegen::tokio_stream::Iter<I::IntoIter> {
    tonic::codegen::tokio_stream::iter(items)
}

/// Sends one raw gRPC request body (frame header included) to `path` and
/// returns the status the server answered in its headers.
/// `message` as a peer call carrying `token`'s credential, as a member's
/// calls do: what these tests send must pass that check first.
fn with_token<T>(message: T, token: Option<&PeerToken>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        token.attach(&mut request);
    }
    request
}

/// The cluster's peer token, if it has one.
fn peer_token(cluster: &Cluster) -> Option<PeerToken> {
    cluster
        .peer_token_file()
        .map(|file| PeerToken::load(file).expect("the cluster's peer token"))
}

/// A raw gRPC call of `body` to `path` at `address`, with `token`'s
/// credential if given.
async fn raw_call(address: &str, path: &str, body: &str, token: Option<&PeerToken>) -> Status {
    use tonic::codegen::Service;
    let mut channel = channel(address).await;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .expect("ready");
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header(PEER_TOKEN_METADATA, token.credential().as_encoded_bytes());
    }
    let request = request
        .body(tonic::body::Body::new(body.to_string()))
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(10), channel.call(request))
        .await
        .expect("answered in time")
        .expect("response");
    Status::from_header_map(response.headers()).expect("a refusal carries its status in headers")
}

#[tokio::test]
async fn a_malformed_message_is_invalid_argument_on_both_ports() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(20)).await;
    let node = &cluster.nodes[0];
    // gRPC frames: a flag byte, a big-endian length, the message.
    let cases = [
        // Field 1 announces 127 bytes; 1 follows.
        ("not protobuf", "\u{0}\u{0}\u{0}\u{0}\u{3}\u{a}\u{7f}\u{1}"),
        // Wire type 7 does not exist.
        ("bad wire type", "\u{0}\u{0}\u{0}\u{0}\u{1}\u{f}"),
        // The frame announces 100 bytes; the body ends after 1.
        ("frame cut short", "\u{0}\u{0}\u{0}\u{0}\u{64}\u{a}"),
        // Compression flag 2 does not exist.
        ("bad frame flag", "\u{2}\u{0}\u{0}\u{0}\u{0}"),
    ];
    let token = peer_token(&cluster);
    for (address, path, token) in [
        (&node.client, "/oncekv.v1.Kv/Execute", None),
        (&node.client, "/oncekv.v1.Kv/Read", None),
        (
            &node.peer,
            "/oncekv.v1.RaftPeer/AppendEntries",
            token.as_ref(),
        ),
        (
            &node.peer,
            "/oncekv.v1.RaftPeer/InstallSnapshot",
            token.as_ref(),
        ),
    ] {
        for (what, body) in cases {
            let status = raw_call(address, path, body, token).await;
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{what} to {path}: {status:?}"
            );
        }
    }
    // A well-formed envelope whose Raft message does not decode.
    let mut peer = RaftPeerClient::new(channel(&node.peer).await);
    let status = peer
        .append_entries(with_token(
            RaftPayload {
                data: vec![0xff; 16],
            },
            token.as_ref(),
        ))
        .await
        .expect_err("undecodable");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // And the node keeps serving.
    node.status()
        .await
        .expect("served after malformed messages");
}

/// The client call timeout does not cut off etcd's Lock, which waits for
/// its turn as long as its caller does (etcd's clients wait for minutes):
/// a second holder waits well past the timeout, then gets the lock once
/// the first unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waits_for_its_turn_past_the_call_timeout() {
    use oncekv_proto::etcd::v3lockpb::lock_client::LockClient;
    use oncekv_proto::etcd::v3lockpb::{LockRequest, UnlockRequest};
    let _one = exclusive().await;
    let mut flags = FAST.to_vec();
    flags.extend(["--client-call-timeout", "1s"]);
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    let channel = channel(&cluster.node(1).client).await;
    let request = || LockRequest {
        name: b"jobs".to_vec(),
        lease: 0,
    };
    let mut holder = LockClient::new(channel.clone());
    let first = holder.lock(request()).await.expect("the first lock");
    let mut waiter = LockClient::new(channel.clone());
    let second = tokio::spawn(async move { waiter.lock(request()).await });
    // Time passes, three call timeouts' worth: the wait goes on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!second.is_finished(), "{:?}", second.await);
    holder
        .unlock(UnlockRequest {
            key: first.into_inner().key,
        })
        .await
        .expect("unlock");
    let second = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second lock within 20 s")
        .expect("the waiter's task")
        .expect("the second lock");
    assert!(second.into_inner().key.starts_with(b"jobs/"));
}
