//! Cheap refusals first, against real node processes on loopback: what a
//! node refuses, it refuses before the work an attacker would make it do.
//!
//! - A batch of two million tiny requests (a 4 MiB message) is refused
//!   with the 256-request cap while it is decoded: the node's peak memory
//!   does not grow by the decoded requests (it grew by hundreds of MiB when
//!   every request was decoded before the count was checked). A message
//!   over the size limit is refused on its frame header, its body unsent.
//! - A snapshot stream from a node that is not a member (or one naming the
//!   receiving node as its leader) is refused on its first message, while
//!   the stream is still open: no spool file is ever written (one was, for
//!   the whole stream, before the membership check).
//! - Failed logins are limited per user name: after a few, the name is
//!   refused "too many failed logins ..., retry after N s"
//!   (RESOURCE_EXHAUSTED) on the native and the etcd API, its correct
//!   password included, while another user's correct login from the same
//!   address succeeds.
//! - Failed logins are limited per address: a flood of wrong logins from
//!   127.0.0.2 is refused naming that address, while a correct login from
//!   127.0.0.1 succeeds.
//! - An unknown user costs what a wrong password costs: the same answer,
//!   a password check each (the node's check counter), and the same
//!   number of failures before the limit.

mod support;

use oncekv_client::{Client, ClientOptions, Command, Reply};
use oncekv_proto::etcd::etcdserverpb::AuthenticateRequest as EtcdAuthenticateRequest;
use oncekv_proto::etcd::etcdserverpb::auth_client::AuthClient as EtcdAuthClient;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::{AuthenticateRequest, SnapshotChunk, authenticate_response};
use oncekv_server::login_guard::{SOURCE_FAILURES_BURST, USER_FAILURES_BURST};
use oncekv_server::raft::peer_token::PeerToken;
use oncekv_state::{ADMIN_ROLE, AuthCommand, TokenKey};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{Cluster, FAST, exclusive, free_port};
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

const ELECTION: Duration = Duration::from_secs(20);
const MIB: u64 = 1024 * 1024;

/// A channel to `address`, from `source` if given (else the system's
/// choice, 127.0.0.1 on loopback).
async fn channel_from(address: &str, source: Option<IpAddr>) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .local_address(source)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(10), endpoint.connect())
        .await
        .expect("connected in time")
        .expect("connect")
}

async fn channel(address: &str) -> Channel {
    channel_from(address, None).await
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

// ---------------------------------------------------------------- batches

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A gRPC frame (flag, big-endian length) of an `ExecuteBatchRequest`
/// of `count` empty requests (field 1, length 0: two bytes each). Every
/// byte is ASCII, so it travels as a `String` body.
fn batch_frame(count: usize) -> String {
    let length = u32::try_from(2 * count).expect("fits a frame");
    let mut frame = vec![0u8];
    frame.extend(length.to_be_bytes());
    frame.extend([0x0a, 0x00].repeat(count));
    String::from_utf8(frame).expect("ASCII")
}

/// A raw gRPC call of `body` to `path` at `address`: the status the node
/// answered in its headers (a refusal before or by the handler), or
/// `None` when it answered a message.
async fn raw_call(address: String, path: &'static str, body: String) -> Option<Status> {
    use tonic::codegen::Service;
    let mut channel = channel(&address).await;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .expect("ready");
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(body))
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(120), channel.call(request))
        .await
        .expect("answered in time")
        .expect("response");
    Status::from_header_map(response.headers())
}

#[tokio::test]
async fn a_batch_past_its_cap_is_refused_while_it_is_decoded() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    let node = &cluster.nodes[0];
    let pid = node.pid().expect("running");
    const PATH: &str = "/oncekv.v1.Kv/ExecuteBatch";

    // The cap's worth is a batch (each request answered on its own: these
    // carry no command).
    let at_cap = raw_call(node.client.clone(), PATH, batch_frame(256)).await;
    assert!(at_cap.is_none(), "256 requests are a batch: {at_cap:?}");

    // Two calls at once of two million requests each (4,000,000 bytes,
    // under the 4 MiB message limit): refused by the count, naming the
    // cap, and without decoding the requests.
    let before = peak_resident_bytes(pid);
    let body = batch_frame(2_000_000);
    let calls: Vec<_> = (0..2)
        .map(|_| tokio::spawn(raw_call(node.client.clone(), PATH, body.clone())))
        .collect();
    for call in calls {
        let status = call
            .await
            .expect("call task")
            .expect("refused, not answered");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("at most 256 requests"),
            "{status:?}"
        );
        assert!(
            status.message().contains("ExecuteBatchRequest.requests"),
            "refused while decoding: {status:?}"
        );
    }
    let after = peak_resident_bytes(pid);
    assert!(
        after < before + 96 * MIB,
        "the node's peak memory grew from {before} to {after} bytes: the requests were decoded"
    );
    // One more than the cap is refused the same way.
    let status = raw_call(node.client.clone(), PATH, batch_frame(257))
        .await
        .expect("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("at most 256 requests"),
        "{status:?}"
    );

    // A frame announcing more than the message limit is refused on its
    // header: the body never comes, and the answer does not wait for it.
    let mut header = vec![0u8];
    header.extend((64u32 << 20).to_be_bytes());
    let header = String::from_utf8(header).expect("ASCII");
    let status = raw_call(node.client.clone(), PATH, header)
        .await
        .expect("refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");

    node.status().await.expect("the node keeps serving");
}

// -------------------------------------------------------------- snapshots

/// An empty snapshot description as postcard bytes (see
/// `crates/oncekv-server/tests/peer_service.rs`).
const META: [u8; 5] = [0; 5];

fn spool_files(data_dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(data_dir.join("snapshot-incoming"))
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_snapshot_from_a_non_member_is_refused_before_anything_is_spooled() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    let node = &cluster.nodes[0];
    let token = cluster
        .peer_token_file()
        .map(|file| PeerToken::load(file).expect("the cluster's peer token"));
    let peer = RaftPeerClient::new(channel(&node.peer).await);
    // Committed votes as postcard bytes (term, leader id, committed):
    // from node 99, not a member, of term 0 (older than the node's own, so
    // not a leader it must follow); and from node 1, the receiving node
    // itself, of term 1.
    for (vote, code, expected) in [
        (
            [0u8, 99, 1],
            Code::PermissionDenied,
            "node 99 is not a member",
        ),
        ([1u8, 1, 1], Code::InvalidArgument, "names this node"),
    ] {
        let (send, receive) = tokio::sync::mpsc::channel::<SnapshotChunk>(4);
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receive));
        if let Some(token) = &token {
            token.attach(&mut request);
        }
        let mut sender = peer.clone();
        let call = tokio::spawn(async move { sender.install_snapshot(request).await });
        // A first chunk of 1 MiB of a 2 MiB snapshot; the stream stays
        // open, as a sender's would while it sends the rest.
        let first = SnapshotChunk {
            vote: vote.to_vec(),
            meta: META.to_vec(),
            data: vec![0x5a; MIB as usize],
            total_bytes: 2 * MIB,
        };
        send.send(first).await.expect("stream open");
        // Whichever comes first: the answer, or a spool file.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !call.is_finished() {
            let files = spool_files(&node.data_dir);
            assert!(
                files.is_empty(),
                "vote {vote:?}: spooled before the sender was judged: {files:?}"
            );
            assert!(Instant::now() < deadline, "vote {vote:?}: no answer");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = call
            .await
            .expect("call task")
            .expect_err("refused on its first message");
        assert_eq!(status.code(), code, "vote {vote:?}: {status:?}");
        assert!(
            status.message().contains(expected),
            "vote {vote:?}: {status:?}"
        );
        assert!(spool_files(&node.data_dir).is_empty());
        drop(send);
    }
    let logs = cluster.logs();
    assert!(
        logs.contains("not a member"),
        "the refusal is logged\n{logs}"
    );
    assert!(
        logs.contains("names this node"),
        "the refusal is logged\n{logs}"
    );
    node.status().await.expect("the node keeps serving");
}

// ----------------------------------------------------------------- logins

/// 127.0.0.2: another address of the loopback interface.
const AWAY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// What a login got.
#[derive(Debug)]
enum Login {
    /// A token.
    Token,
    /// Refused on its credentials: the reason.
    Wrong(String),
    /// Refused before its password was checked.
    Refused(Status),
}

/// A native login of `user` at `address`, from `source` if given.
async fn login(address: &str, source: Option<IpAddr>, user: &str, password: &str) -> Login {
    let mut client = KvClient::new(channel_from(address, source).await);
    let request = AuthenticateRequest {
        user: user.to_string(),
        password: password.to_string(),
    };
    match client.authenticate(request).await {
        Ok(response) => match response.into_inner().result {
            Some(authenticate_response::Result::Token(_)) => Login::Token,
            Some(authenticate_response::Result::Failure(failure)) => {
                Login::Wrong(format!("{failure:?}"))
            }
            None => panic!("an empty answer"),
        },
        Err(status) => Login::Refused(status),
    }
}

/// An etcd login of `user` at `address`.
async fn etcd_login(address: &str, user: &str, password: &str) -> Result<String, Status> {
    let mut client = EtcdAuthClient::new(channel(address).await);
    let request = EtcdAuthenticateRequest {
        name: user.to_string(),
        password: password.to_string(),
    };
    client
        .authenticate(request)
        .await
        .map(|response| response.into_inner().token)
}

/// Whether `status` is the refusal of a name or address that failed too
/// often: RESOURCE_EXHAUSTED, saying when to retry, not load shed.
fn is_rate_limited(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted
        && status.message().contains("too many failed logins")
        && status.message().contains("retry after")
        && status
            .metadata()
            .get(oncekv_proto::OVERLOADED_METADATA)
            .is_none()
}

/// Wrong logins of `user` from `source` until one is refused before its
/// password is checked: how many failed first, and the refusal. Every
/// failure is answered `reason` if given.
async fn fail_until_refused(
    address: &str,
    source: Option<IpAddr>,
    user: &str,
    mut reason: Option<String>,
) -> (u32, Status, String) {
    let mut failures = 0;
    loop {
        assert!(
            failures < 100,
            "{user}: {failures} failed logins, none refused"
        );
        match login(address, source, user, "not the password").await {
            Login::Wrong(why) => {
                let first = reason.get_or_insert_with(|| why.clone());
                assert_eq!(&why, first, "{user}: every failure is answered alike");
                failures += 1;
            }
            Login::Refused(status) => {
                return (failures, status, reason.unwrap_or_default());
            }
            Login::Token => panic!("{user}: a wrong password logged in"),
        }
    }
}

async fn change(client: &Client, change: AuthCommand) {
    let done = client
        .execute_once(Command::Auth(change.clone()), None)
        .await
        .unwrap_or_else(|e| panic!("{change:?}: {e}"));
    assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
}

/// A one-node cluster with users root (admin), alice, bob and carol
/// (passwords `<name>-pw`) and dave (no password: certificates only), and
/// authentication enforced; `extra` flags for `serve`.
async fn secured(extra: &[&str]) -> Cluster {
    let mut flags = FAST.to_vec();
    flags.extend(extra);
    let cluster = Cluster::start(1, &flags);
    cluster.leader(ELECTION).await;
    let endpoints = vec![cluster.nodes[0].client.clone()];
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..cluster.client_options()
    };
    let anyone = Client::connect(endpoints, options).expect("a client");
    let user = |name: &str| AuthCommand::UserAdd {
        name: name.into(),
        password_hash: Some(format!("{name}-pw")),
    };
    for command in [
        user("root"),
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
        user("alice"),
        user("bob"),
        user("carol"),
        AuthCommand::UserAdd {
            name: "dave".into(),
            password_hash: None,
        },
        AuthCommand::Enable {
            token_key: TokenKey([0; 32]),
        },
    ] {
        change(&anyone, command).await;
    }
    cluster
}

#[tokio::test]
async fn failed_logins_are_limited_per_user_name_and_other_users_still_log_in() {
    let _one = exclusive().await;
    let cluster = secured(&[]).await;
    let address = cluster.nodes[0].client.clone();
    assert!(matches!(
        login(&address, None, "alice", "alice-pw").await,
        Login::Token
    ));

    let (failures, refused, _) = fail_until_refused(&address, None, "alice", None).await;
    assert!(
        (USER_FAILURES_BURST..=USER_FAILURES_BURST + 1).contains(&failures),
        "refused after {failures} failures"
    );
    assert!(is_rate_limited(&refused), "{refused:?}");
    assert!(refused.message().contains("this user name"), "{refused:?}");
    // Refused before the password is checked: the right one too.
    match login(&address, None, "alice", "alice-pw").await {
        Login::Refused(status) => assert!(is_rate_limited(&status), "{status:?}"),
        other => panic!("alice's correct password while limited: {other:?}"),
    }
    let etcd = etcd_login(&address, "alice", "alice-pw")
        .await
        .expect_err("limited on etcd's API too");
    assert!(is_rate_limited(&etcd), "{etcd:?}");
    assert!(etcd.message().starts_with("etcdserver: "), "{etcd:?}");

    // Another user, from the same address, logs in on both APIs.
    assert!(matches!(
        login(&address, None, "bob", "bob-pw").await,
        Login::Token
    ));
    let token = etcd_login(&address, "bob", "bob-pw")
        .await
        .expect("bob logs in on etcd's API");
    assert!(!token.is_empty());
    assert!(
        cluster.logs().contains("too many failed logins"),
        "the refusal is logged\n{}",
        cluster.logs()
    );
}

#[tokio::test]
async fn failed_logins_are_limited_per_address_and_other_addresses_still_log_in() {
    let _one = exclusive().await;
    let cluster = secured(&[]).await;
    let address = cluster.nodes[0].client.clone();
    // A flood of wrong logins from 127.0.0.2, each of another name (so no
    // name reaches its own limit), all at once.
    let attempts = 2 * SOURCE_FAILURES_BURST;
    let flood: Vec<_> = (0..attempts)
        .map(|i| {
            let address = address.clone();
            tokio::spawn(async move {
                login(&address, Some(AWAY), &format!("intruder-{i}"), "guess").await
            })
        })
        .collect();
    let (mut failed, mut refused) = (0, 0);
    for attempt in flood {
        match attempt.await.expect("login task") {
            Login::Wrong(_) => failed += 1,
            Login::Refused(status) => {
                assert!(is_rate_limited(&status), "{status:?}");
                assert!(status.message().contains("from 127.0.0.2"), "{status:?}");
                refused += 1;
            }
            Login::Token => panic!("a guess logged in"),
        }
    }
    assert!(
        refused >= 1 && failed <= SOURCE_FAILURES_BURST + 1,
        "{failed} failed, {refused} refused of {attempts}"
    );
    // The address stays refused for a while, whoever it names.
    match login(&address, Some(AWAY), "bob", "bob-pw").await {
        Login::Refused(status) => assert!(is_rate_limited(&status), "{status:?}"),
        other => panic!("a login from the limited address: {other:?}"),
    }
    // Another address logs in.
    assert!(matches!(
        login(&address, None, "root", "root-pw").await,
        Login::Token
    ));
}

/// The value of the Prometheus counter `name` at `address` (0 if absent).
async fn counter(address: &str, name: &str) -> f64 {
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
        .filter(|line| line.starts_with(name))
        .filter(|line| line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn an_unknown_user_costs_and_is_answered_as_a_wrong_password() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let cluster = secured(&["--listen-metrics", &metrics]).await;
    let address = cluster.nodes[0].client.clone();
    const CHECKS: &str = "oncekv_password_verifications_total";

    // Each failed login, whoever it names, checks a password once.
    let mut answers = Vec::new();
    for (user, what) in [
        ("carol", "a wrong password"),
        ("nobody", "an unknown user"),
        ("dave", "a user without a password"),
    ] {
        let before = counter(&metrics, CHECKS).await;
        match login(&address, None, user, "not the password").await {
            Login::Wrong(reason) => answers.push((what, reason)),
            other => panic!("{what}: {other:?}"),
        }
        until(Duration::from_secs(10), "the check to be counted", || {
            let metrics = metrics.clone();
            async move { counter(&metrics, CHECKS).await >= before + 1.0 }
        })
        .await;
        assert_eq!(
            counter(&metrics, CHECKS).await,
            before + 1.0,
            "{what}: one password check"
        );
    }
    // And each is answered alike.
    let (_, first) = &answers[0];
    for (what, reason) in &answers {
        assert_eq!(reason, first, "{what}");
    }
    // The same failures lead to the limit.
    let (carol, _, _) = fail_until_refused(&address, None, "carol", Some(first.clone())).await;
    let (nobody, _, _) = fail_until_refused(&address, None, "nobody", Some(first.clone())).await;
    assert_eq!(carol, nobody, "failures before the limit");
}
