//! Target `peer_message`: other nodes' Raft messages, decoded from the
//! fuzzer's bytes as the protobuf messages of the `RaftPeer` service
//! (`crates/oncekv-proto/proto/oncekv/v1/raft.proto`) and sent over gRPC to
//! a real node running in this process: `oncekv_server::server::serve` of
//! a one-node cluster (node 1) with its data in a temporary directory (on
//! `/dev/shm` when there is one), on loopback TCP. The node lives across
//! inputs (one tokio runtime in a `OnceLock`), so inputs build on the state
//! earlier ones left: terms, votes, log entries, snapshots.
//!
//! Input: up to 8 messages, each `[kind u8][length u16][bytes]`. By `kind
//! % 5`: 0 `AppendEntries`, 1 `Vote` (vote or pre-vote), 2
//! `TransferLeader`, each a `RaftPayload` decoded from the bytes (whose
//! `data` is the postcard encoding of openraft's request); 3
//! `InstallSnapshot`, a stream of up to 16 `SnapshotChunk`s decoded one
//! after the other from the bytes, each length-delimited; 4
//! `StreamAppend`, a stream of up to 16 `RaftPayload`s decoded so, whose
//! replies are all read. Bytes that do not decode as protobuf send
//! nothing, as a gRPC server would refuse them.
//!
//! Checked:
//!
//! - nothing panics, on any thread of the node (a panic hook records
//!   them; under libFuzzer any panic aborts anyway). openraft asserts what
//!   a protocol-following peer sends; the peer service refuses messages
//!   that break it (`oncekv_server::raft::peer_checks`), and the
//!   reproducers of the assertions this target found before it did are in
//!   `corpus/peer_message/crash-*`;
//! - every call is answered within 10 s, with a reply or a gRPC status;
//! - after each input a client write (a plain PUT through the `Kv`
//!   service) is answered within 10 s with an outcome or a typed refusal
//!   (not the leader, unavailable, invalid); a transport error is allowed
//!   only when the node stopped itself with a typed error
//!   (`ServeError`), never when its task panicked or it stopped silently.
//!
//! The node cannot reach anyone (its peer connector refuses every
//! connection), so messages naming other members or addresses never leave
//! the process. Messages may legitimately take the node's leadership
//! (a higher term) or its membership away: the node is then restarted
//! fresh once it has served no write for 3 s, or once it stopped
//! itself; [`stats`] counts both (and `ONCEKV_FUZZ_VERBOSE` prints why).

use crate::input::Input;
use hyper_util::rt::TokioIo;
use oncekv_proto::v1::execute_response::Result as Answer;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{self, RaftPayload, SnapshotChunk};
use oncekv_server::raft::consensus::ConsensusOptions;
use oncekv_server::raft::network::PeerConnector;
use oncekv_server::server::{ServeError, ServerConfig, serve};
use oncekv_server::transport::tcp_incoming;
use prost::Message as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tonic::transport::{Channel, Endpoint, Uri};

/// Most messages one input sends.
const MESSAGES_MAX: usize = 8;
/// Most chunks in one snapshot stream.
const CHUNKS_MAX: usize = 16;
/// How long any call may take to be answered.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long a node may go without applying a client write before it is
/// replaced with a fresh one.
const STUCK_AFTER: Duration = Duration::from_secs(3);
/// How long a fresh node may take to apply its first write.
const START_WITHIN: Duration = Duration::from_secs(30);
/// The name of the node runtime's threads.
const NODE_THREADS: &str = "oncekv-fuzz-node";

/// One `RaftPeer` call.
#[derive(Debug)]
enum PeerCall {
    AppendEntries(RaftPayload),
    Vote(RaftPayload),
    TransferLeader(RaftPayload),
    InstallSnapshot(Vec<SnapshotChunk>),
    StreamAppend(Vec<RaftPayload>),
}

/// Up to [`CHUNKS_MAX`] length-delimited protobuf messages, one after the
/// other, up to the first that does not decode.
fn delimited<M: prost::Message + Default>(mut rest: &[u8]) -> Vec<M> {
    let mut messages = Vec::new();
    while !rest.is_empty() && messages.len() < CHUNKS_MAX {
        match M::decode_length_delimited(&mut rest) {
            Ok(message) => messages.push(message),
            Err(_) => break,
        }
    }
    messages
}

fn calls(data: &[u8]) -> Vec<PeerCall> {
    let mut input = Input::new(data);
    let mut calls = Vec::new();
    while calls.len() < MESSAGES_MAX {
        let Some(kind) = input.byte() else {
            break;
        };
        let length = input.u16().unwrap_or(0);
        let bytes = input.take(usize::from(length));
        let payload = || RaftPayload::decode(bytes).ok();
        let call = match kind % 5 {
            0 => payload().map(PeerCall::AppendEntries),
            1 => payload().map(PeerCall::Vote),
            2 => payload().map(PeerCall::TransferLeader),
            3 => Some(PeerCall::InstallSnapshot(delimited(bytes))),
            _ => Some(PeerCall::StreamAppend(delimited(bytes))),
        };
        calls.extend(call);
    }
    calls
}

/// What the peer target has seen so far in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Inputs run.
    pub inputs: u64,
    /// Peer calls answered with a reply.
    pub calls_answered: u64,
    /// Peer calls answered with a gRPC status (refused).
    pub calls_refused: u64,
    /// Client writes applied.
    pub writes_applied: u64,
    /// Client writes refused with a typed answer (not the leader,
    /// unavailable, invalid).
    pub writes_refused: u64,
    /// Nodes started.
    pub nodes_started: u64,
    /// Nodes replaced after serving no write for a while.
    pub nodes_stuck: u64,
    /// Nodes that stopped themselves with a typed error.
    pub nodes_stopped: u64,
}

/// What the peer target has seen so far in this process.
pub fn stats() -> PeerStats {
    HARNESS
        .get()
        .map_or_else(PeerStats::default, |harness| *lock(&harness.stats))
}

/// Refuses every connection: the fuzzed node has no real peers, and
/// addresses from fuzzed membership must never be dialled.
#[derive(Debug)]
struct NoPeers;

impl PeerConnector for NoPeers {
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(tower::service_fn(|_: Uri| async {
            Err::<TokioIo<TcpStream>, _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the fuzzed node has no peers",
            ))
        }))
    }
}

/// A node running on the harness runtime.
struct LiveNode {
    /// Its data directory, removed when it is replaced.
    _dir: tempfile::TempDir,
    peer: RaftPeerClient<Channel>,
    kv: KvClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
    /// When it last applied a client write.
    last_applied: Instant,
    writes: u64,
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    node: Mutex<Option<LiveNode>>,
    stats: Mutex<PeerStats>,
}

static HARNESS: OnceLock<Harness> = OnceLock::new();
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn harness() -> &'static Harness {
    HARNESS.get_or_init(|| {
        record_node_panics();
        Harness {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(NODE_THREADS)
                .enable_all()
                .build()
                .expect("a tokio runtime"),
            node: Mutex::new(None),
            stats: Mutex::new(PeerStats::default()),
        }
    })
}

/// Records panics on the node's threads (runtime workers and blocking
/// threads, the log writer), then lets the previous hook run.
fn record_node_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or_default();
        if name.starts_with(NODE_THREADS) || name == "oncekv-log-writer" {
            lock(&PANICS).push(format!("thread {name}: {info}"));
        }
        previous(info);
    }));
}

fn check_no_panic() {
    let panics = lock(&PANICS);
    if let Some(first) = panics.first() {
        panic!(
            "the node panicked ({} panics), first: {first}",
            panics.len()
        );
    }
}

/// Runs one input; panics when a property breaks.
pub fn peer_message(data: &[u8]) {
    let calls = calls(data);
    let harness = harness();
    let mut node = lock(&harness.node);
    harness.runtime.block_on(run(harness, &mut node, calls));
    check_no_panic();
}

async fn run(harness: &Harness, slot: &mut Option<LiveNode>, calls: Vec<PeerCall>) {
    let mut node = match slot.take() {
        Some(node) => node,
        None => start(harness).await,
    };
    lock(&harness.stats).inputs += 1;
    for call in calls {
        let answered = timeout(ANSWER_WITHIN, send(&mut node.peer, call))
            .await
            .unwrap_or_else(|_| panic!("a peer call was not answered within {ANSWER_WITHIN:?}"));
        let mut stats = lock(&harness.stats);
        match answered {
            Ok(()) => stats.calls_answered += 1,
            Err(_) => stats.calls_refused += 1,
        }
    }
    let written = timeout(ANSWER_WITHIN, write(&mut node))
        .await
        .unwrap_or_else(|_| panic!("a client write was not answered within {ANSWER_WITHIN:?}"));
    let replace = match written {
        Ok(true) => {
            node.last_applied = Instant::now();
            lock(&harness.stats).writes_applied += 1;
            false
        }
        Ok(false) => {
            lock(&harness.stats).writes_refused += 1;
            let stuck = node.last_applied.elapsed() > STUCK_AFTER;
            if stuck {
                if std::env::var_os("ONCEKV_FUZZ_VERBOSE").is_some() {
                    eprintln!(
                        "peer_message: no write applied for {STUCK_AFTER:?}: replacing the node"
                    );
                }
                lock(&harness.stats).nodes_stuck += 1;
            }
            stuck
        }
        Err(status) => {
            // Only a node that stopped itself with a typed error may fail
            // to answer.
            let ended = timeout(ANSWER_WITHIN, &mut node.task)
                .await
                .unwrap_or_else(|_| {
                    panic!("a client write failed ({status}) while the node still runs")
                });
            match ended {
                Ok(Err(typed)) => {
                    if std::env::var_os("ONCEKV_FUZZ_VERBOSE").is_some() {
                        eprintln!("peer_message: the node stopped itself: {typed}");
                    }
                    lock(&harness.stats).nodes_stopped += 1;
                }
                Ok(Ok(())) => panic!("the node stopped without being asked to"),
                Err(join) => panic!("the node task failed: {join}"),
            }
            node.stop = None;
            true
        }
    };
    if replace {
        stop(node).await;
        *slot = Some(start(harness).await);
    } else {
        *slot = Some(node);
    }
}

async fn send(peer: &mut RaftPeerClient<Channel>, call: PeerCall) -> Result<(), tonic::Status> {
    match call {
        PeerCall::AppendEntries(payload) => peer.append_entries(payload).await.map(drop),
        PeerCall::Vote(payload) => peer.vote(payload).await.map(drop),
        PeerCall::TransferLeader(payload) => peer.transfer_leader(payload).await.map(drop),
        PeerCall::InstallSnapshot(chunks) => peer
            .install_snapshot(tokio_stream::iter(chunks))
            .await
            .map(drop),
        PeerCall::StreamAppend(payloads) => {
            let mut replies = peer
                .stream_append(tokio_stream::iter(payloads))
                .await?
                .into_inner();
            while replies.message().await?.is_some() {}
            Ok(())
        }
    }
}

/// A plain PUT through the client service: `Ok(true)` if applied,
/// `Ok(false)` if refused with a typed answer.
async fn write(node: &mut LiveNode) -> Result<bool, tonic::Status> {
    node.writes += 1;
    let request = v1::ExecuteRequest {
        origin: None,
        command: Some(v1::Command {
            kind: Some(v1::command::Kind::Put(v1::Put {
                key: b"fuzz/liveness".to_vec(),
                value: node.writes.to_le_bytes().to_vec(),
                lease: None,
            })),
        }),
    };
    let response = node.kv.execute(request).await?.into_inner();
    match response.result {
        Some(Answer::Outcome(_)) => Ok(true),
        Some(Answer::Failure(_)) => Ok(false),
        None => panic!("an execute response without a result: {response:?}"),
    }
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let address = listener.local_addr().expect("local address").to_string();
    (listener, address)
}

/// Starts a fresh one-node cluster and waits until it applies a write.
async fn start(harness: &Harness) -> LiveNode {
    let dir = crate::scratch_dir("oncekv-fuzz-peer");
    let (clients, client_address) = listener().await;
    let (peers, peer_address) = listener().await;
    let mut config = ServerConfig::single_node(dir.path(), &client_address, &peer_address);
    config.consensus = ConsensusOptions {
        heartbeat_ms: 20,
        election_timeout_min_ms: 60,
        election_timeout_max_ms: 120,
        snapshot_after_entries: 200,
        log_entries_kept_after_snapshot: 50,
        ..ConsensusOptions::default()
    };
    config.node.propose_timeout = Duration::from_secs(2);
    config.peer_connector = Some(Arc::new(NoPeers));
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
        .expect("connect to the node's peer service");
    let kv = KvClient::connect(format!("http://{client_address}"))
        .await
        .expect("connect to the node's client service");
    let mut node = LiveNode {
        _dir: dir,
        peer,
        kv,
        stop: Some(stop),
        task,
        last_applied: Instant::now(),
        writes: 0,
    };
    let deadline = Instant::now() + START_WITHIN;
    loop {
        match write(&mut node).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(status) => panic!("a fresh node failed a client write: {status}"),
        }
        assert!(
            Instant::now() < deadline,
            "a fresh node applied no write within {START_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.last_applied = Instant::now();
    lock(&harness.stats).nodes_started += 1;
    node
}

/// Stops a node (if it still runs) and removes its data.
async fn stop(mut node: LiveNode) {
    if let Some(stop) = node.stop.take() {
        let _ = stop.send(());
        match timeout(ANSWER_WITHIN, &mut node.task).await {
            Ok(Ok(_)) => {}
            Ok(Err(join)) => panic!("the node task failed: {join}"),
            Err(_) => panic!("the node did not stop within {ANSWER_WITHIN:?}"),
        }
    }
}
