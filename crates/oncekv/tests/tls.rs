//! TLS on both ports, against real node processes with certificates made
//! at test time (`oncekv_server::certs`, what `oncekv certs` runs):
//!
//! - a cluster serving TLS on its client and peer ports elects a leader,
//!   serves a session, answers a retry `Replayed`, and still does after
//!   its leader is killed; `oncekv` talks to it over `https://`;
//! - a plaintext client of the TLS client port is refused with words;
//! - with `--client-ca-file`, a client without a certificate, or with one
//!   of another CA, is refused, and one with the CA's certificate served;
//! - the CLI names a wrong CA ("unknown issuer") and a host the node's
//!   certificate does not name ("host name mismatch");
//! - the security guide's recipe: the admin's certificate sets up
//!   authentication; a user's certificate logs in as that user, and stops
//!   working when the user is deleted;
//! - on the peer port: a plaintext connection, a certificate of another
//!   CA, a non-member's certificate (`node-9`) and a member's certificate
//!   speaking for another member (`node-2` sending as node 3) are all
//!   refused, while `node-2` sending as node 2 is served.

mod support;

use oncekv_proto::v1::RaftPayload;
use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_server::certs;
use oncekv_state::{Command, Outcome, Reply};
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use support::{Cluster, FAST, TestSession, exclusive, free_port};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const BINARY: &str = env!("CARGO_BIN_EXE_oncekv");
const ELECTION: Duration = Duration::from_secs(20);

/// Runs `oncekv` with `args`; gives its exit code and what it printed.
fn oncekv(args: &[&str]) -> (Option<i32>, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = std::process::Command::new(BINARY)
        .args(args)
        .env_remove("ONCEKV_CACERT")
        .env_remove("ONCEKV_CERT")
        .env_remove("ONCEKV_KEY")
        .env_remove("ONCEKV_ENDPOINTS")
        .env_remove("ONCEKV_USER")
        .output()
        .expect("run oncekv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.code(), text)
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Runs `oncekv ARGS` against `address` over TLS (CA `ca`) presenting
/// `who`'s client certificate.
fn as_holder(
    address: &str,
    ca: &Path,
    who: &certs::CertFiles,
    args: &[&str],
) -> (Option<i32>, String) {
    oncekv(
        &[
            &["--endpoints", address, "--cacert", path(ca)][..],
            &["--cert", path(&who.cert), "--key", path(&who.key)],
            &["--timeout", "20s"],
            args,
        ]
        .concat(),
    )
}

fn append(value: &str) -> Command {
    Command::Append {
        key: b"log".to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_sessions_and_replays_retries_across_a_leader_kill() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start_tls(3, FAST, false);
    let leader = cluster.leader(ELECTION).await;
    let session = TestSession::open(&cluster, 60_000, 8).await;
    let first = session.request(1, 1, append("a;"));
    let applied = cluster.outcome(&first, ELECTION).await;
    assert!(
        matches!(applied, Outcome::Applied(Reply::Append { .. })),
        "{applied:?}"
    );
    let retry = session.request(1, 2, append("a;"));
    let replayed = cluster.outcome(&retry, ELECTION).await;
    assert!(matches!(replayed, Outcome::Replayed { .. }), "{replayed:?}");

    // The peers replicate over mutual TLS: the new leader has the record.
    cluster.node(leader).kill();
    let after = cluster
        .outcome(&session.request(1, 3, append("a;")), ELECTION)
        .await;
    assert!(matches!(after, Outcome::Replayed { .. }), "{after:?}");
    let next = cluster
        .outcome(&session.request(2, 1, append("b;")), ELECTION)
        .await;
    assert!(matches!(next, Outcome::Applied(_)), "{next:?}");

    // The command line over https://, and the client library over the
    // cluster's connector.
    let ca = certs::ca_files(&cluster.certs_dir().expect("certificates")).cert;
    let endpoints: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != leader)
        .map(|node| format!("https://{}", node.client))
        .collect();
    let (code, text) = oncekv(&[
        "--endpoints",
        &endpoints.join(","),
        "--cacert",
        path(&ca),
        "--timeout",
        "20s",
        "get",
        "log",
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("a;b;"), "{text}");
    let endpoints: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != leader)
        .map(|node| node.client.clone())
        .collect();
    let client =
        oncekv_client::Client::connect(endpoints, cluster.client_options()).expect("a client");
    let reply = client
        .execute_once(
            Command::Incr {
                key: b"n".to_vec(),
                by: 1,
            },
            Some(b"tls-incr".to_vec()),
        )
        .await
        .expect("applied over TLS");
    assert!(matches!(reply.reply, Reply::Incr { value: 1 }), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_refused_with_words_for_what_is_wrong() {
    let _one = exclusive().await;
    let cluster = Cluster::start_tls(1, FAST, true);
    cluster.leader(ELECTION).await;
    let dir = cluster.certs_dir().expect("certificates");
    let ca = certs::ca_files(&dir).cert;
    let mine = certs::client_files(&dir, oncekv_harness::cluster::HARNESS_USER);
    let address = cluster.nodes[0].client.clone();
    let short = ["--timeout", "4s"];

    // A plaintext client of the TLS port.
    let (code, text) = oncekv(&[&["--endpoints", &address][..], &short, &["get", "k"]].concat());
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("TLS"), "a plaintext client is told: {text}");

    // No client certificate, while the node requires one.
    let (code, text) = oncekv(
        &[
            &["--endpoints", &address, "--cacert", path(&ca)][..],
            &short,
            &["get", "k"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("requires a client certificate"), "{text}");

    // A client certificate of another CA.
    let other = tempfile::tempdir().expect("tempdir");
    certs::create_ca(other.path(), certs::CA_DAYS_DEFAULT).expect("another CA");
    let stranger = certs::create_client(other.path(), "mallory", certs::LEAF_DAYS_DEFAULT)
        .expect("a stranger's certificate");
    let (code, text) = oncekv(
        &[
            &["--endpoints", &address, "--cacert", path(&ca)][..],
            &["--cert", path(&stranger.cert), "--key", path(&stranger.key)],
            &short,
            &["get", "k"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("refused the client certificate"), "{text}");

    // The CA's client certificate is served.
    let (code, text) = oncekv(
        &[
            &["--endpoints", &format!("https://{address}")][..],
            &["--cacert", path(&ca)],
            &["--cert", path(&mine.cert), "--key", path(&mine.key)],
            &["--timeout", "20s", "put", "k", "v"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{text}");

    // A wrong CA: the node's certificate is of an unknown issuer.
    let other_ca = certs::ca_files(other.path()).cert;
    let (code, text) = oncekv(
        &[
            &["--endpoints", &address, "--cacert", path(&other_ca)][..],
            &["--cert", path(&mine.cert), "--key", path(&mine.key)],
            &short,
            &["get", "k"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("unknown issuer"), "{text}");
    assert!(text.contains("wrong CA"), "{text}");

    // A host the node's certificate does not name (it names 127.0.0.1).
    let port = address.rsplit_once(':').expect("host:port").1;
    let (code, text) = oncekv(
        &[
            &["--endpoints", &format!("localhost:{port}")][..],
            &["--cacert", path(&ca)],
            &["--cert", path(&mine.cert), "--key", path(&mine.key)],
            &short,
            &["get", "k"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("host name mismatch"), "{text}");
}

/// The recipe of docs/security.md on a cluster that requires client
/// certificates: the admin's certificate (CN=root) sets authentication
/// up, then logs in as root; a user's certificate logs in as that user,
/// within its grants; deleting the user stops its certificate at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_certificate_sets_up_authentication_and_a_deleted_user_s_certificate_is_refused()
{
    let _one = exclusive().await;
    let cluster = Cluster::start_tls(1, FAST, true);
    cluster.leader(ELECTION).await;
    let dir = cluster.certs_dir().expect("certificates");
    let ca = certs::ca_files(&dir).cert;
    let root = certs::create_client(&dir, "root", certs::LEAF_DAYS_DEFAULT).expect("root's");
    let alice = certs::create_client(&dir, "alice", certs::LEAF_DAYS_DEFAULT).expect("alice's");
    let address = cluster.nodes[0].client.clone();
    let run = |who: &certs::CertFiles, args: &[&str]| as_holder(&address, &ca, who, args);
    let ok = |(code, text): (Option<i32>, String)| assert_eq!(code, Some(0), "{text}");
    ok(run(&root, &["user", "add", "root", "--no-password"]));
    ok(run(&root, &["user", "grant-role", "root", "admin"]));
    ok(run(&root, &["role", "add", "app"]));
    ok(run(
        &root,
        &["role", "grant", "app", "readwrite", "app/", "--prefix"],
    ));
    ok(run(&root, &["user", "add", "alice", "--no-password"]));
    ok(run(&root, &["user", "grant-role", "alice", "app"]));
    ok(run(&root, &["auth", "enable"]));

    ok(run(&alice, &["put", "app/x", "1"]));
    let (code, text) = run(&alice, &["put", "other", "1"]);
    assert_eq!(code, Some(13), "outside alice's grants: {text}");
    let (code, text) = run(&alice, &["user", "list"]);
    assert_eq!(code, Some(13), "alice is no admin: {text}");
    ok(run(&root, &["user", "list"]));

    ok(run(&root, &["user", "delete", "alice"]));
    let (code, text) = run(&alice, &["get", "app/x"]);
    assert_eq!(code, Some(13), "a deleted user's certificate: {text}");
}

/// A client certificate can be revoked, by file or serial number: every
/// call over a connection that presents it is then refused (exit 13,
/// naming the revocation), with authentication enforced or not, while
/// other certificates work on; taken off the list, it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused_until_it_is_taken_off_the_list() {
    let _one = exclusive().await;
    let cluster = Cluster::start_tls(1, FAST, true);
    cluster.leader(ELECTION).await;
    let dir = cluster.certs_dir().expect("certificates");
    let ca = certs::ca_files(&dir).cert;
    let alice = certs::create_client(&dir, "alice", certs::LEAF_DAYS_DEFAULT).expect("alice's");
    let bob = certs::create_client(&dir, "bob", certs::LEAF_DAYS_DEFAULT).expect("bob's");
    let address = cluster.nodes[0].client.clone();
    let run = |who: &certs::CertFiles, args: &[&str]| as_holder(&address, &ca, who, args);
    let ok = |(code, text): (Option<i32>, String)| {
        assert_eq!(code, Some(0), "{text}");
        text
    };
    ok(run(&alice, &["put", "x", "1"]));
    ok(run(&bob, &["auth", "revoke-cert", path(&alice.cert)]));
    let serial = oncekv_server::tls::certificate_file_serial(&alice.cert).expect("a serial");
    let hex = oncekv_state::serial_hex(&serial);
    let listed = ok(run(&bob, &["auth", "revoked-certs"]));
    assert_eq!(listed.trim(), hex, "the list names alice's certificate");
    let (code, text) = run(&alice, &["get", "x"]);
    assert_eq!(code, Some(13), "a revoked certificate: {text}");
    assert!(text.contains("revoked"), "{text}");
    assert_eq!(ok(run(&bob, &["get", "x"])).trim(), "1");
    let (code, text) = run(&bob, &["auth", "revoke-cert", "--serial", "xyz"]);
    assert_eq!(code, Some(1), "not hex: {text}");
    assert!(text.contains("not a hexadecimal number"), "{text}");

    // Taken off the list by its serial number (as openssl prints it).
    let printed = format!("serial={hex}");
    ok(run(&bob, &["auth", "unrevoke-cert", "--serial", &printed]));
    assert_eq!(ok(run(&alice, &["get", "x"])).trim(), "1");

    // Enforced authentication does not let a revoked certificate back in.
    ok(run(&bob, &["user", "add", "bob", "--no-password"]));
    ok(run(&bob, &["user", "grant-role", "bob", "admin"]));
    ok(run(&bob, &["user", "add", "alice", "--no-password"]));
    ok(run(&bob, &["user", "grant-role", "alice", "admin"]));
    ok(run(&bob, &["auth", "enable"]));
    ok(run(&alice, &["get", "x"]));
    ok(run(&bob, &["auth", "revoke-cert", "--serial", &hex]));
    let (code, text) = run(&alice, &["get", "x"]);
    assert_eq!(code, Some(13), "a revoked admin's certificate: {text}");
    let (code, text) = run(&alice, &["auth", "unrevoke-cert", "--serial", &hex]);
    assert_eq!(code, Some(13), "it cannot take itself off: {text}");
    assert_eq!(ok(run(&bob, &["get", "x"])).trim(), "1");
}

/// A vote request as the peer port reads it (postcard): `VoteKind::Vote`
/// of `VoteRequest{vote: Vote{term, node, committed: false},
/// last_log_id: None, a transfer: false}`.
fn vote_from(node: u8) -> RaftPayload {
    RaftPayload {
        data: vec![0, 1, node, 0, 0, 0],
    }
}

/// A peer client of `address` over TLS, trusting `ca`, presenting
/// `identity` (a node's certificate and key), verifying the server as
/// `node-1`.
async fn peer_client(
    address: &str,
    ca: &Path,
    identity: &certs::CertFiles,
) -> Result<RaftPeerClient<tonic::transport::Channel>, tonic::transport::Error> {
    let read = |path: &Path| std::fs::read(path).expect("a certificate file");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .identity(Identity::from_pem(
            read(&identity.cert),
            read(&identity.key),
        ))
        .domain_name("node-1");
    let channel = Endpoint::from_shared(format!("https://{address}"))
        .expect("an address")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(RaftPeerClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_serves_only_members_speaking_for_themselves() {
    let _one = exclusive().await;
    let cluster = Cluster::start_tls(3, FAST, false);
    cluster.leader(ELECTION).await;
    let dir = cluster.certs_dir().expect("certificates");
    let ca = certs::ca_files(&dir).cert;
    let peer = cluster.nodes[0].peer.clone();

    // Plaintext: no TLS handshake, no Raft.
    let plain = async {
        let channel = Endpoint::from_shared(format!("http://{peer}"))
            .expect("an address")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|error| error.to_string())?;
        RaftPeerClient::new(channel)
            .vote(vote_from(2))
            .await
            .map_err(|status| status.to_string())
    };
    assert!(plain.await.is_err(), "a plaintext peer was served");

    // A node certificate of another CA: the handshake fails.
    let other = tempfile::tempdir().expect("tempdir");
    certs::create_ca(other.path(), certs::CA_DAYS_DEFAULT).expect("another CA");
    let foreign = certs::create_node(other.path(), 2, &[], certs::LEAF_DAYS_DEFAULT)
        .expect("a foreign node-2");
    let refused = match peer_client(&peer, &ca, &foreign).await {
        Err(error) => Err(error.to_string()),
        Ok(mut client) => client
            .vote(vote_from(2))
            .await
            .map_err(|status| status.to_string()),
    };
    assert!(refused.is_err(), "a certificate of another CA was served");

    // node-9, of the cluster's CA but not a member, asking for a vote.
    let nine = certs::create_node(&dir, 9, &[], certs::LEAF_DAYS_DEFAULT).expect("node-9");
    let mut client = peer_client(&peer, &ca, &nine)
        .await
        .expect("a TLS connection");
    let status = client.vote(vote_from(9)).await.expect_err("not a member");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("not a member"), "{status:?}");

    // node-2's certificate speaking as node 3.
    let two = certs::node_files(&dir, 2);
    let mut client = peer_client(&peer, &ca, &two)
        .await
        .expect("a TLS connection");
    let status = client.vote(vote_from(3)).await.expect_err("not node 3");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("node-3"), "{status:?}");
    // As itself, node 2 is answered (an old term's vote: not granted).
    client
        .vote(vote_from(2))
        .await
        .expect("node 2 speaking for itself is served");

    let logs = cluster.logs();
    assert!(
        logs.contains("peer message refused"),
        "the refusals are logged"
    );
    // The cluster still serves.
    cluster.leader(ELECTION).await;
}

/// With peer TLS on, `member add` first shakes hands with the new node as
/// `node-<id>`: a node whose certificate names another id is refused
/// before it joins, and one with its own is added as a voter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_add_needs_the_new_node_to_present_its_own_certificate() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start_tls(1, FAST, false);
    cluster.leader(ELECTION).await;
    let certs_dir = cluster.certs_dir().expect("a TLS cluster");
    let node2 = certs::create_node(&certs_dir, 2, &["127.0.0.1".to_string()], 30)
        .expect("node 2's certificate");
    let ca = certs::ca_files(&certs_dir).cert;
    let (client, peer) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let data = cluster.dir.path().join("joiner");
    let mut joiner = std::process::Command::new(BINARY)
        .args(["serve", "--id", "2", "--join", "--data-dir", path(&data)])
        .args(["--listen-client", &client, "--listen-peer", &peer])
        .args([
            "--cert-file",
            path(&node2.cert),
            "--key-file",
            path(&node2.key),
        ])
        .args([
            "--peer-cert-file",
            path(&node2.cert),
            "--peer-key-file",
            path(&node2.key),
        ])
        .args(["--peer-ca-file", path(&ca)])
        .args(FAST)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the joiner");
    let endpoint = cluster.node(1).client.clone();
    let member = |args: &[&str]| {
        let mut all = vec!["member"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[
            "--endpoints",
            &endpoint,
            "--cacert",
            path(&ca),
            "--timeout",
            "20s",
        ]);
        oncekv(&all)
    };
    // Once the joiner listens, it presents node-2's certificate: it cannot
    // join as node 3.
    let deadline = std::time::Instant::now() + ELECTION;
    while std::net::TcpStream::connect(&peer).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the joiner never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, text) = member(&["add", "3", "--peer", &peer, "--client", &client]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("node-3") && text.contains("not valid for"),
        "refused for its certificate: {text}"
    );
    let (_, listed) = member(&["list"]);
    assert!(
        !listed.contains(&peer),
        "the refused node was not added: {listed}"
    );
    // As node 2 it joins (the handshake may wait for the joiner to listen).
    let deadline = std::time::Instant::now() + ELECTION;
    loop {
        let (code, text) = member(&["add", "2", "--peer", &peer, "--client", &client]);
        if code == Some(0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 2 not added: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, listed) = member(&["list"]);
    assert_eq!(code, Some(0), "{listed}");
    assert!(listed.contains(&peer), "{listed}");
    let _ = joiner.kill();
    let _ = joiner.wait();
}
