//! Peers prove who they are, by default, against real node processes on
//! loopback:
//!
//! - `oncekv serve` of a node of several (`--initial-cluster` naming
//!   others, or `--join`) with neither peer TLS nor `--peer-token-file`
//!   refuses to start, naming both and `--insecure-peers`; with
//!   `--insecure-peers` it starts, and warns;
//! - in a cluster sharing a peer token (the harness's default), a forged
//!   vote request of term 2^63 - 1 and a forged append claiming member 2,
//!   and every other peer call (streamed appends, snapshots, leadership
//!   transfers, even bytes that decode as nothing), sent without the token
//!   or with a wrong one, are refused UNAUTHENTICATED; with the token, the
//!   forged term is still refused (INVALID_ARGUMENT); and the cluster
//!   commits writes afterwards;
//! - in a cluster started with `--insecure-peers`, the forged vote of term
//!   2^63 - 1 sent to every node is refused, and after every node is
//!   restarted the cluster elects a leader and commits a write. (Before
//!   terms were judged relative to the node's own, such a vote was granted
//!   and stored, and no election could ever win again.)
//!
//! The forged messages are hand-encoded postcard bytes; the test
//! `the_hand_encoded_forgeries_of_the_peer_auth_tests_decode`
//! (`crates/oncekv-server/tests/peer_service.rs`) keeps them what they
//! stand for.

mod support;

use oncekv_harness::cluster::Cluster as HarnessCluster;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use oncekv_server::raft::peer_token::PeerToken;
use oncekv_state::{Command, IdempotencyKey, Origin, Outcome, Request};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};
use support::{Cluster, FAST, exclusive, free_port};
use tonic::transport::{Channel, Endpoint};

const BINARY: &str = env!("CARGO_BIN_EXE_oncekv");
const ELECTION: Duration = Duration::from_secs(20);

/// A vote request (`VoteKind::Vote`) as the peer port reads it: the vote
/// of term 2^63 - 1 for node 2 (uncommitted), the candidate's last log id
/// of term 2^62, node 2, index 1 (ahead of any real log), and
/// `leadership_transfer: true` (a voter's lease does not stop it).
fn forged_vote() -> RaftPayload {
    let mut data = vec![0];
    data.extend([0xff; 8]);
    data.extend([0x7f, 2, 0, 1]);
    data.extend([0x80; 8]);
    data.extend([0x40, 2, 1, 1]);
    RaftPayload { data }
}

/// An `AppendEntries` claiming a committed vote of term 100 for leader 2
/// (a heartbeat: no entries).
fn forged_append() -> RaftPayload {
    RaftPayload {
        data: vec![100, 2, 1, 0, 0, 0],
    }
}

/// A plaintext peer client of the node whose peer port is `address`.
async fn peer_client(address: &str) -> RaftPeerClient<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .expect("an address")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10));
    let channel = tokio::time::timeout(Duration::from_secs(5), endpoint.connect())
        .await
        .expect("connected in time")
        .expect("connect to the peer port");
    RaftPeerClient::new(channel)
}

/// `message` as a call, carrying `token`'s credential if given.
fn call<T>(message: T, token: Option<&PeerToken>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        token.attach(&mut request);
    }
    request
}

/// A write under a fresh idempotency key.
fn write(key: &str) -> Request {
    Request {
        origin: Origin::Key(IdempotencyKey(
            format!("peer-auth-{key}-{}", std::process::id()).into_bytes(),
        )),
        command: Command::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        },
    }
}

/// The cluster commits a write (through whichever node leads).
async fn commits(cluster: &HarnessCluster, key: &str) {
    let outcome = cluster.outcome(&write(key), ELECTION).await;
    assert!(
        matches!(outcome, Outcome::Applied(_) | Outcome::Replayed { .. }),
        "{outcome:?}\n{}",
        cluster.logs()
    );
}

/// Sends the forged vote to `address` until it is answered with
/// something other than "restarted less than an election timeout ago"
/// (a node refuses every vote that long); gives that answer.
async fn vote_answer(
    address: &str,
    token: Option<&PeerToken>,
) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
    let mut client = peer_client(address).await;
    let deadline = Instant::now() + ELECTION;
    loop {
        let answer = client.vote(call(forged_vote(), token)).await;
        match &answer {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return answer,
        }
    }
}

fn assert_unauthenticated<T: std::fmt::Debug>(answer: Result<T, tonic::Status>, what: &str) {
    match answer {
        Err(status) => {
            assert_eq!(
                status.code(),
                tonic::Code::Unauthenticated,
                "{what}: {status:?}"
            );
            assert!(
                status.message().contains("peer token")
                    && status.message().contains("--peer-token-file"),
                "{what}: {status:?}"
            );
        }
        Ok(answer) => panic!("{what}: served: {answer:?}"),
    }
}

fn assert_term_refused<T: std::fmt::Debug>(answer: Result<T, tonic::Status>, what: &str) {
    match answer {
        Err(status) => {
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{what}: {status:?}"
            );
            assert!(
                status.message().contains("implausibly far ahead"),
                "{what}: {status:?}"
            );
        }
        Ok(answer) => panic!("{what}: served: {answer:?}"),
    }
}

/// Runs `oncekv serve ARGS` until it exits; its exit code and stderr.
fn serve(args: &[&str]) -> (Option<i32>, String) {
    let output = Process::new(BINARY)
        .arg("serve")
        .args(args)
        .env_remove("ONCEKV_PEER_TOKEN_FILE")
        .env_remove("ONCEKV_PEER_CERT_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run oncekv serve");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_node_of_several_needs_peer_authentication_or_insecure_peers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");
    let (client, peer) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let other = format!("127.0.0.1:{}/127.0.0.1:{}", free_port(), free_port());
    let cluster = format!("1={peer}/{client},2={other}");
    let base = [
        "--id",
        "1",
        "--data-dir",
        data,
        "--listen-client",
        &client,
        "--listen-peer",
        &peer,
    ];
    let documented = |stderr: &str| {
        for named in [
            "--peer-token-file",
            "--peer-cert-file",
            "--insecure-peers",
            "create-token",
        ] {
            assert!(stderr.contains(named), "{named} not named: {stderr}");
        }
    };

    // Two members, neither TLS nor a token: a usage error, before anything
    // is created.
    let (code, stderr) = serve(&[&base[..], &["--initial-cluster", &cluster]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("node 1 is one of several") && stderr.contains("nothing authenticates"),
        "{stderr}"
    );
    documented(&stderr);
    assert!(
        !dir.path().join("data").exists(),
        "refused before the data directory is made"
    );
    // A node joining: the same.
    let (code, stderr) = serve(&[&base[..], &["--join"]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--join"), "{stderr}");
    documented(&stderr);

    // A token file too short to be a secret, or empty: refused, saying so.
    let token = dir.path().join("token");
    std::fs::write(&token, "not-a-secret\n").expect("write");
    let token_arg = token.to_str().expect("a UTF-8 path");
    let with_token = [
        &base[..],
        &[
            "--initial-cluster",
            &cluster,
            "--peer-token-file",
            token_arg,
        ],
    ]
    .concat();
    let (code, stderr) = serve(&with_token);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("at least 32"), "{stderr}");
    std::fs::write(&token, " \n").expect("write");
    let (code, stderr) = serve(&with_token);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is empty"), "{stderr}");

    // --insecure-peers: it starts (its client port answers) and warns.
    let log_path = dir.path().join("insecure.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut child = Process::new(BINARY)
        .arg("serve")
        .args(base)
        .args([
            "--initial-cluster",
            &cluster,
            "--insecure-peers",
            "--log",
            "info",
        ])
        .env_remove("ONCEKV_PEER_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn oncekv serve");
    let deadline = Instant::now() + ELECTION;
    let started = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Ok(Some(status)) = child.try_wait() {
            panic!("--insecure-peers: exited {status}: {text}");
        }
        if text.contains("node serving") {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log_path).expect("the log");
    assert!(started, "never served: {text}");
    assert!(
        text.contains("WARNING: --insecure-peers") && text.contains("not authenticated"),
        "{text}"
    );

    // A node alone needs neither (the README's one-command start).
    let alone = dir.path().join("alone");
    let mut child = Process::new(BINARY)
        .args(["serve", "--data-dir"])
        .arg(&alone)
        .args(["--listen-client", &client, "--listen-peer", &peer])
        .env_remove("ONCEKV_PEER_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn oncekv serve");
    let deadline = Instant::now() + ELECTION;
    let served = loop {
        if child.try_wait().ok().flatten().is_some() {
            break false;
        }
        if std::net::TcpStream::connect(&client).is_ok() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(served, "a node alone did not start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_no_peer_call_is_served_and_the_cluster_commits_on() {
    let _one = exclusive().await;
    let cluster = Cluster::start(3, FAST);
    cluster.leader(ELECTION).await;
    commits(&cluster, "before").await;
    let token = PeerToken::load(cluster.peer_token_file().expect("a token cluster"))
        .expect("the cluster's token");
    let wrong = PeerToken::from_secret(b"a secret of 32 bytes or more, but not theirs");
    for node in &cluster.nodes {
        let mut client = peer_client(&node.peer).await;
        for (credential, how) in [
            (None, "without a token"),
            (Some(&wrong), "with a wrong token"),
        ] {
            let what = |call: &str| format!("node {}: {call} {how}", node.id);
            assert_unauthenticated(
                client.vote(call(forged_vote(), credential)).await,
                &what("a forged vote of term 2^63 - 1"),
            );
            assert_unauthenticated(
                client
                    .append_entries(call(forged_append(), credential))
                    .await,
                &what("a forged append claiming leader 2"),
            );
            assert_unauthenticated(
                client
                    .stream_append(call(tokio_stream::iter(vec![forged_append()]), credential))
                    .await,
                &what("a forged stream of appends"),
            );
            let chunk = SnapshotChunk {
                vote: vec![100, 2, 1],
                meta: vec![0; 5],
                data: vec![0; 1024],
                total_bytes: 1024,
            };
            assert_unauthenticated(
                client
                    .install_snapshot(call(tokio_stream::iter(vec![chunk]), credential))
                    .await,
                &what("a forged snapshot"),
            );
            // Judged on the headers alone: bytes that decode as nothing
            // get the same answer, not INVALID_ARGUMENT.
            assert_unauthenticated(
                client
                    .transfer_leader(call(
                        RaftPayload {
                            data: vec![0xff; 16],
                        },
                        credential,
                    ))
                    .await,
                &what("a leadership transfer of undecodable bytes"),
            );
        }
        // With the token, the forged term is refused on its own merits:
        // far ahead of the node's term.
        assert_term_refused(
            vote_answer(&node.peer, Some(&token)).await,
            &format!("node {}: the forged vote with the token", node.id),
        );
    }
    for node in &cluster.nodes {
        let log = std::fs::read_to_string(node.log_file()).expect("the node's log");
        assert!(
            log.contains("peer message refused") && log.contains("wrong peer token"),
            "node {}: the refusals are logged: {log}",
            node.id
        );
    }
    // Nothing moved: the cluster commits on.
    cluster.leader(ELECTION).await;
    commits(&cluster, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_term_cannot_stop_an_insecure_cluster_electing_even_after_restarts() {
    let _one = exclusive().await;
    let mut options = oncekv_harness::testing::options(BINARY, 3, FAST);
    options.insecure_peers = true;
    let mut cluster = HarnessCluster::start(&options).expect("a cluster");
    cluster.leader(ELECTION).await;
    commits(&cluster, "before").await;
    assert!(cluster.peer_token_file().is_none());
    for node in &cluster.nodes {
        let log = std::fs::read_to_string(node.log_file()).expect("the node's log");
        assert!(
            log.contains("WARNING: --insecure-peers"),
            "node {}: {log}",
            node.id
        );
    }
    let peers: Vec<(u64, String)> = cluster
        .nodes
        .iter()
        .map(|node| (node.id, node.peer.clone()))
        .collect();
    for (id, peer) in &peers {
        // Without a token required, it reaches the checks: refused there.
        assert_term_refused(
            vote_answer(peer, None).await,
            &format!("node {id}: the forged vote of term 2^63 - 1"),
        );
    }
    commits(&cluster, "forged").await;
    cluster.stop_all();
    cluster.start_all().expect("restart every node");
    let leader = cluster.leader(ELECTION).await;
    commits(&cluster, "restarted").await;
    // The new leader's term is an ordinary one.
    let status = cluster
        .nodes
        .iter()
        .find(|node| node.id == leader)
        .expect("the leader")
        .status()
        .await
        .expect("status");
    assert!(status.term < 1_000, "term {}", status.term);
}
