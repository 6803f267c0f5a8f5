//! A follower forwards the etcd calls only the leader carries out to the
//! leader's peer port, whatever its client port uses, against real node
//! processes this test starts, with etcd's Rust client (`etcd-client`)
//! connected to one follower only:
//!
//! - with TLS on both ports and client certificates required: a put, a
//!   linearizable get, a transaction, a lease granted and revoked, the
//!   member list, a lock taken and released and an election campaign go
//!   through the follower and are seen on the leader; the users set up
//!   through the follower keep the identity of their client certificate
//!   (denied outside their role's grants, allowed within), even when the
//!   caller claims another user in the forwarding metadata;
//! - the peer port serves etcd's services only to a member forwarding a
//!   call as itself: not over plaintext, not without the forwarding mark,
//!   not to a client certificate, a non-member's or another node's;
//! - with a peer token: a client that puts the forwarding marks on its
//!   own call to a follower is not believed (its call is forwarded and
//!   applied as any other, and a claimed certificate user is not taken),
//!   and the peer port wants the token first.
//!
//! Waits are on conditions, each bounded.

#![cfg(feature = "etcd")]

mod support;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, LockOptions,
    Permission, TlsOptions, Txn, TxnOp, UserAddOptions,
};
use oncekv_proto::etcd::etcdserverpb::PutRequest;
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::{
    FORWARDED_BY_METADATA, FORWARDED_CERTIFICATE_USER_METADATA, FORWARDED_FOR_METADATA,
};
use oncekv_server::certs;
use oncekv_server::raft::peer_token::PeerToken;
use std::path::Path;
use std::time::Duration;
use support::{FAST, eventually, exclusive};
use tonic::metadata::BinaryMetadataValue;
use tonic::transport::{Channel, Endpoint};

/// The longest any one step may take before the test fails.
const STEP: Duration = Duration::from_secs(20);

/// Whether a call was answered "no leader" or "not leader": nothing was
/// sent, and the call may be made again once the cluster has a leader.
trait Leaderless {
    fn leaderless(&self) -> bool;
}

impl Leaderless for tonic::Status {
    fn leaderless(&self) -> bool {
        self.code() == tonic::Code::Unavailable
            && matches!(
                self.message(),
                "etcdserver: no leader" | "etcdserver: not leader"
            )
    }
}

impl Leaderless for etcd_client::Error {
    fn leaderless(&self) -> bool {
        matches!(self, etcd_client::Error::GRpcStatus(status) if status.leaderless())
    }
}

/// `call`'s answer once a leader carries it out: a call answered "no
/// leader" (an election, which a loaded machine may start at any moment)
/// is made again, for at most [`STEP`].
async fn led<T, E, F, Fut>(mut call: F) -> Result<T, E>
where
    E: Leaderless,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        match call().await {
            Err(error) if error.leaderless() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => return answer,
        }
    }
}

/// `$call` on a clone of `$client` (named `$c` in it), through [`led`].
macro_rules! led {
    ($client:expr, |$c:ident| $call:expr) => {
        led(|| {
            let mut $c = $client.clone();
            async move { $call.await }
        })
        .await
    };
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("a certificate file")
}

/// An etcd client of the node at `address` over TLS, trusting the
/// cluster's CA in `dir` and presenting `who`'s certificate.
async fn tls_client(address: &str, dir: &Path, who: &certs::CertFiles) -> Client {
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(&certs::ca_files(dir).cert)))
        .identity(Identity::from_pem(read(&who.cert), read(&who.key)));
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_timeout(STEP)
        .with_connect_timeout(STEP);
    Client::connect([format!("https://{address}")], Some(options))
        .await
        .expect("connect etcd-client over TLS")
}

/// A plaintext etcd client of the node at `address`.
async fn plain_client(address: &str) -> Client {
    Client::connect([format!("http://{address}")], None)
        .await
        .expect("connect etcd-client")
}

/// Waits until `client`'s node carries out a write (a follower: once it
/// knows the leader and reaches it).
async fn until_it_writes(client: &Client) {
    eventually(STEP, "a write through the follower", || {
        let mut client = client.clone();
        async move { client.put("warm-up", "1", None).await.ok().map(drop) }
    })
    .await;
}

/// The value of `key` in the applied state of `client`'s node (a
/// serializable read: what that node holds, not what it asks the leader).
async fn held(client: &mut Client, key: &str) -> Option<Vec<u8>> {
    client
        .get(key, Some(GetOptions::new().with_serializable()))
        .await
        .expect("a serializable get")
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec())
}

/// Waits until `client`'s node holds `expected` under `key` ([`held`]:
/// after a leader change it may still be applying what it committed).
async fn until_seen(client: &Client, key: &str, expected: Option<&[u8]>) {
    eventually(STEP, &format!("{key} = {expected:?} on the leader"), || {
        let mut client = client.clone();
        async move { (held(&mut client, key).await.as_deref() == expected).then_some(()) }
    })
    .await;
}

/// The gRPC code of an etcd-client error.
fn code_of(error: etcd_client::Error) -> tonic::Code {
    match error {
        etcd_client::Error::GRpcStatus(status) => status.code(),
        other => panic!("not a gRPC status: {other}"),
    }
}

/// A raw KV client over a TLS channel to `address`, trusting the CA in
/// `dir`, verifying the server as `server_name`, presenting `who`.
async fn raw_tls_kv(
    address: &str,
    dir: &Path,
    who: &certs::CertFiles,
    server_name: Option<&str>,
) -> KvClient<Channel> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(
            &certs::ca_files(dir).cert,
        )))
        .identity(tonic::transport::Identity::from_pem(
            read(&who.cert),
            read(&who.key),
        ));
    if let Some(name) = server_name {
        tls = tls.domain_name(name);
    }
    let channel = Endpoint::from_shared(format!("https://{address}"))
        .expect("an address")
        .tls_config(tls)
        .expect("a TLS configuration")
        .connect_timeout(STEP)
        .timeout(STEP)
        .connect()
        .await
        .expect("a TLS connection");
    KvClient::new(channel)
}

/// A raw KV client over plaintext to `address`.
async fn raw_plain_kv(address: &str) -> KvClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("an address")
        .connect_timeout(STEP)
        .timeout(STEP)
        .connect()
        .await
        .expect("a connection");
    KvClient::new(channel)
}

/// A put of `key` = `value` marked as forwarded by node `by` for
/// 192.0.2.1 (and, if `user`, for that client certificate's user).
fn marked_put(key: &str, value: &str, by: u64, user: Option<&str>) -> tonic::Request<PutRequest> {
    let mut request = tonic::Request::new(PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..PutRequest::default()
    });
    let metadata = request.metadata_mut();
    metadata.insert(
        FORWARDED_BY_METADATA,
        by.to_string().parse().expect("ascii"),
    );
    metadata.insert(FORWARDED_FOR_METADATA, "192.0.2.1".parse().expect("ascii"));
    if let Some(user) = user {
        metadata.insert_bin(
            FORWARDED_CERTIFICATE_USER_METADATA,
            BinaryMetadataValue::from_bytes(user.as_bytes()),
        );
    }
    request
}

/// A put of `key` = `value` with nothing added.
fn put(key: &str, value: &str) -> tonic::Request<PutRequest> {
    tonic::Request::new(PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..PutRequest::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_on_tls_forwards_every_leader_call_and_keeps_the_caller_s_certificate() {
    let _one = exclusive().await;
    let mut cluster = support::start_tls(3, FAST, true);
    let leader = cluster.leader(STEP).await;
    let dir = cluster.certs_dir().expect("certificates");
    let root = certs::create_client(&dir, "root", certs::LEAF_DAYS_DEFAULT).expect("root's");
    let alice = certs::create_client(&dir, "alice", certs::LEAF_DAYS_DEFAULT).expect("alice's");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let follower_address = cluster.node(follower).client.clone();
    let leader_address = cluster.node(leader).client.clone();
    let through = tls_client(&follower_address, &dir, &root).await;
    let at_leader = tls_client(&leader_address, &dir, &root).await;
    until_it_writes(&through).await;

    // A put and a linearizable get.
    led!(through, |c| c.put("k", "v1", None)).expect("a put");
    until_seen(&at_leader, "k", Some(&b"v1"[..])).await;
    let got = led!(through, |c| c.get("k", None)).expect("a linearizable get");
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"v1"[..]));

    // A transaction.
    let txn = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "v1")])
        .and_then([TxnOp::put("k", "v2", None)]);
    let txn = &txn;
    let answer = led!(through, |c| c.txn(txn.clone())).expect("a transaction");
    assert!(answer.succeeded(), "{answer:?}");
    until_seen(&at_leader, "k", Some(&b"v2"[..])).await;

    // A lease granted, then revoked.
    let lease = led!(through, |c| c.lease_grant(60, None))
        .expect("a grant")
        .id();
    let listed = |leases: etcd_client::LeaseLeasesResponse| {
        leases.leases().iter().any(|status| status.id() == lease)
    };
    assert!(listed(led!(at_leader, |c| c.leases()).expect("the leases")));
    led!(through, |c| c.lease_revoke(lease)).expect("a revoke");
    assert!(!listed(
        led!(at_leader, |c| c.leases()).expect("the leases")
    ));

    // The member list.
    let members = led!(through, |c| c.member_list()).expect("the member list");
    assert_eq!(members.members().len(), 3, "{members:?}");
    assert!(
        members
            .members()
            .iter()
            .all(|member| member.client_urls()[0].starts_with("https://")),
        "{members:?}"
    );

    // A lock taken and released.
    let lease = led!(through, |c| c.lease_grant(60, None))
        .expect("a grant")
        .id();
    let lock = led!(through, |c| c
        .lock("jobs", Some(LockOptions::new().with_lease(lease))))
    .expect("a lock");
    let key = lock.key().to_vec();
    let name = String::from_utf8(key.clone()).expect("a UTF-8 key");
    eventually(STEP, "the lock's key on the leader", || {
        let mut client = at_leader.clone();
        let name = name.clone();
        async move { held(&mut client, &name).await.map(drop) }
    })
    .await;
    let key = &key;
    led!(through, |c| c.unlock(key.clone())).expect("an unlock");
    until_seen(&at_leader, &name, None).await;

    // An election campaign.
    let elected =
        led!(through, |c| c.campaign("chair", "from-a-follower", lease)).expect("a campaign");
    assert!(elected.leader().is_some(), "{elected:?}");
    let seen = led!(at_leader, |c| c.leader("chair")).expect("the leader");
    assert_eq!(
        seen.kv().map(|kv| kv.value()),
        Some(&b"from-a-follower"[..])
    );

    // Users set up through the follower, as the certificates name them.
    let no_password = || Some(UserAddOptions::new().with_no_pwd());
    led!(through, |c| c.user_add("root", "", no_password())).expect("root");
    led!(through, |c| c.user_grant_role("root", "root")).expect("root's role");
    led!(through, |c| c.role_add("app")).expect("a role");
    led!(through, |c| c.role_grant_permission(
        "app",
        Permission::read_write("app/").with_prefix()
    ))
    .expect("a grant");
    led!(through, |c| c.user_add("alice", "", no_password())).expect("alice");
    led!(through, |c| c.user_grant_role("alice", "app")).expect("alice's role");
    led!(through, |c| c.auth_enable()).expect("authentication enabled");

    let as_alice = tls_client(&follower_address, &dir, &alice).await;
    eventually(STEP, "alice's put within her grants", || {
        let mut client = as_alice.clone();
        async move { client.put("app/x", "1", None).await.ok().map(drop) }
    })
    .await;
    until_seen(&at_leader, "app/x", Some(&b"1"[..])).await;
    let denied = led!(as_alice, |c| c.put("other", "1", None)).expect_err("outside alice's grants");
    assert_eq!(code_of(denied), tonic::Code::PermissionDenied);
    let denied = led!(as_alice, |c| c.user_list()).expect_err("alice is no admin");
    assert_eq!(code_of(denied), tonic::Code::PermissionDenied);
    led!(through, |c| c.user_list()).expect("root lists the users");

    // Alice claiming to be root in the forwarding marks stays alice, and
    // her call is still forwarded and applied within her grants.
    let raw = raw_tls_kv(&follower_address, &dir, &alice, None).await;
    let refused = led!(raw, |c| c.put(marked_put(
        "other",
        "2",
        leader,
        Some("root")
    )))
    .expect_err("alice is not root");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    led!(raw, |c| c.put(marked_put(
        "app/y",
        "2",
        leader,
        Some("root")
    )))
    .expect("forwarded as alice's");
    until_seen(&at_leader, "app/y", Some(&b"2"[..])).await;
    until_seen(&at_leader, "other", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_serves_etcd_calls_only_to_members_forwarding_them() {
    let _one = exclusive().await;
    let mut cluster = support::start_tls(3, FAST, false);
    let leader = cluster.leader(STEP).await;
    let dir = cluster.certs_dir().expect("certificates");
    let peer = cluster.node(leader).peer.clone();
    let other = (1..=3).find(|id| *id != leader).expect("another member");
    let name = format!("node-{leader}");

    // Plaintext: no TLS, no call.
    let plain = async {
        raw_plain_kv(&peer)
            .await
            .put(marked_put("p", "1", other, None))
            .await
    };
    assert!(plain.await.is_err(), "a plaintext call was served");

    // A client certificate of the cluster's CA, forwarding as a member.
    let alice = certs::create_client(&dir, "alice", certs::LEAF_DAYS_DEFAULT).expect("alice's");
    let mut as_alice = raw_tls_kv(&peer, &dir, &alice, Some(&name)).await;
    let refused = as_alice
        .put(marked_put("p", "1", other, None))
        .await
        .expect_err("a client certificate");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains(&format!("node-{other}")),
        "{refused:?}"
    );

    // A member's certificate without the mark, and speaking for another.
    let member = certs::node_files(&dir, other);
    let mut as_member = raw_tls_kv(&peer, &dir, &member, Some(&name)).await;
    let refused = as_member.put(put("p", "1")).await.expect_err("unmarked");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains(FORWARDED_BY_METADATA),
        "{refused:?}"
    );
    let third = (1..=3)
        .find(|id| *id != leader && *id != other)
        .expect("a third member");
    let refused = as_member
        .put(marked_put("p", "1", third, None))
        .await
        .expect_err("speaking for another member");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // A node certificate of the cluster's CA, of no member.
    let nine = certs::create_node(&dir, 9, &[], certs::LEAF_DAYS_DEFAULT).expect("node-9");
    let mut as_nine = raw_tls_kv(&peer, &dir, &nine, Some(&name)).await;
    let refused = as_nine
        .put(marked_put("p", "1", 9, None))
        .await
        .expect_err("not a member");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("not a member"), "{refused:?}");

    // The member forwarding as itself is served.
    led!(as_member, |c| c.put(marked_put("p", "1", other, None)))
        .expect("a member's forwarded call");
    let leader_address = cluster.node(leader).client.clone();
    let tls =
        TlsOptions::new().ca_certificate(Certificate::from_pem(read(&certs::ca_files(&dir).cert)));
    let at_leader = Client::connect(
        [format!("https://{leader_address}")],
        Some(ConnectOptions::new().with_tls(tls).with_timeout(STEP)),
    )
    .await
    .expect("connect etcd-client over TLS");
    until_seen(&at_leader, "p", Some(&b"1"[..])).await;
    assert!(
        cluster.logs().contains("forwarded etcd call refused"),
        "the refusals are logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_s_own_forwarding_marks_are_not_believed() {
    let _one = exclusive().await;
    let mut cluster = support::start(3, FAST);
    let leader = cluster.leader(STEP).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let follower_address = cluster.node(follower).client.clone();
    let leader_address = cluster.node(leader).client.clone();
    let through = plain_client(&follower_address).await;
    let at_leader = plain_client(&leader_address).await;
    until_it_writes(&through).await;

    // Marked as forwarded by the leader itself, on a follower's client
    // port: forwarded and applied as any other call (a forwarded call
    // would be answered "not leader" there).
    let raw = raw_plain_kv(&follower_address).await;
    led!(raw, |c| c.put(marked_put("marked", "1", leader, None))).expect("forwarded and applied");
    until_seen(&at_leader, "marked", Some(&b"1"[..])).await;

    // The peer port wants the peer token before anything else, and then
    // the forwarding mark.
    let peer = cluster.node(leader).peer.clone();
    let mut on_peer = raw_plain_kv(&peer).await;
    let refused = on_peer
        .put(marked_put("p", "1", follower, None))
        .await
        .expect_err("no peer token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let token =
        PeerToken::load(cluster.peer_token_file().expect("a peer token")).expect("the token");
    let mut unmarked = put("p", "1");
    token.attach(&mut unmarked);
    let refused = on_peer.put(unmarked).await.expect_err("unmarked");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let token = &token;
    led!(on_peer, |c| {
        let mut marked = marked_put("p", "1", follower, None);
        token.attach(&mut marked);
        c.put(marked)
    })
    .expect("a member's forwarded call");

    // With authentication on, a call claiming a certificate user in the
    // marks, on a port that asks for no certificate, names nobody.
    let admin = through.clone();
    led!(admin, |c| c.user_add("root", "secret", None)).expect("root");
    led!(admin, |c| c.user_grant_role("root", "root")).expect("root's role");
    led!(admin, |c| c.auth_enable()).expect("authentication enabled");
    let refused = led!(raw, |c| c.put(marked_put(
        "claimed",
        "1",
        leader,
        Some("root")
    )))
    .expect_err("nobody is authenticated");
    assert_ne!(refused.code(), tonic::Code::Ok);
    assert!(
        refused.message().contains("user name is empty"),
        "{refused:?}"
    );
}
