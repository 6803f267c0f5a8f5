//! etcd's API as the Rust `etcd-client` crate drives it: the Lock and
//! Election services (etcd's server-side recipes: holders and
//! campaigners take turns in creation order, a lease that ends ends a
//! wait, leadership is proclaimed, observed and handed over), Maintenance
//! (status, alarms, defragment, a snapshot streamed to its end) and
//! Cluster (the member list), against oncekv nodes this test starts; on
//! three nodes, the same through followers. Waits are on conditions, each
//! bounded. Here, with the `etcd` feature that builds the etcd client
//! (`--target etcd`), so that the `oncekv` package needs none.

#![cfg(feature = "etcd")]

mod support;

use etcd_client::{
    AlarmAction, AlarmType, Client, Error, GetOptions, LockOptions, ObserveStream, ProclaimOptions,
    ResignOptions,
};
use oncekv_proto::etcd::v3lockpb::LockRequest;
use oncekv_proto::etcd::v3lockpb::lock_client::LockClient as RawLockClient;
use std::future::Future;
use std::time::Duration;
use support::{FAST, eventually, exclusive};

/// The longest any one step may take before the test fails.
const STEP: Duration = Duration::from_secs(20);

/// An etcd client of the node at `address` (host:port).
async fn client(address: &str) -> Client {
    Client::connect([format!("http://{address}")], None)
        .await
        .expect("connect etcd-client")
}

/// `future`, or a failure naming `what` after [`STEP`].
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// How many keys are under `prefix`.
async fn keys_under(client: &mut Client, prefix: &str) -> usize {
    client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get a prefix")
        .kvs()
        .len()
}

/// Waits until `count` keys are under `prefix`.
async fn until_keys_under(client: &Client, prefix: &str, count: usize) {
    eventually(STEP, &format!("{count} keys under {prefix}"), || {
        let mut client = client.clone();
        async move { (keys_under(&mut client, prefix).await == count).then_some(()) }
    })
    .await;
}

/// The gRPC status of an etcd-client error.
fn status_of(error: Error) -> tonic::Status {
    match error {
        Error::GRpcStatus(status) => status,
        other => panic!("not a gRPC status: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holders_take_turns_and_an_ended_lease_ends_a_wait() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let mut etcd = client(&cluster.node(1).client).await;

    let first_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let second_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let first = etcd
        .lock("jobs", Some(LockOptions::new().with_lease(first_lease)))
        .await
        .expect("the first lock");
    assert_eq!(first.key(), format!("jobs/{first_lease:x}").as_bytes());

    // The second holder waits for the first.
    let mut waiter = etcd.clone();
    let second = tokio::spawn(async move {
        waiter
            .lock("jobs", Some(LockOptions::new().with_lease(second_lease)))
            .await
    });
    until_keys_under(&etcd, "jobs/", 2).await;
    assert!(!second.is_finished(), "locked while another holds the lock");
    etcd.unlock(first.key()).await.expect("unlock");
    let second = within("the second lock", second)
        .await
        .expect("the waiter's task")
        .expect("the second lock");
    assert_eq!(second.key(), format!("jobs/{second_lease:x}").as_bytes());
    let revision = |response: &etcd_client::LockResponse| {
        response.header().map_or(0, |header| header.revision())
    };
    assert!(revision(&second) > revision(&first));

    // A third holder waits for the second, until its lease is revoked.
    let third_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let mut waiter = etcd.clone();
    let third = tokio::spawn(async move {
        waiter
            .lock("jobs", Some(LockOptions::new().with_lease(third_lease)))
            .await
    });
    until_keys_under(&etcd, "jobs/", 2).await;
    assert!(!third.is_finished(), "locked while another holds the lock");
    etcd.lease_revoke(second_lease).await.expect("revoke");
    let third = within("the third lock", third)
        .await
        .expect("the waiter's task")
        .expect("the third lock");
    assert_eq!(third.key(), format!("jobs/{third_lease:x}").as_bytes());
    // Locking again with the lease that holds the lock is the same hold.
    let again = etcd
        .lock("jobs", Some(LockOptions::new().with_lease(third_lease)))
        .await
        .expect("the lock again");
    assert_eq!(again.key(), third.key());
    assert_eq!(keys_under(&mut etcd, "jobs/").await, 1);

    // A waiter whose lease expires while it waits is told so; its key is
    // gone with the lease.
    let short_lease = etcd.lease_grant(1, None).await.expect("grant").id();
    let expired = within(
        "a wait whose lease expires",
        etcd.lock("jobs", Some(LockOptions::new().with_lease(short_lease))),
    )
    .await
    .map(|_| ())
    .expect_err("a lock on an expired lease");
    let status = status_of(expired);
    assert_eq!(status.message(), "mutex: session is expired", "{status:?}");
    assert_eq!(keys_under(&mut etcd, "jobs/").await, 1);

    // A lock on no lease gets one (etcd's 60 s session), named in its key.
    let unleased = etcd
        .lock("solo", None)
        .await
        .expect("a lock without a lease");
    let key = String::from_utf8_lossy(unleased.key()).into_owned();
    let hex = key.strip_prefix("solo/").expect("the lock's prefix");
    let lease = i64::from_str_radix(hex, 16).expect("a lease ID in hex");
    let ttl = etcd
        .lease_time_to_live(lease, None)
        .await
        .expect("time to live");
    assert!(ttl.ttl() > 0 && ttl.ttl() <= 60, "{ttl:?}");

    // A lease that does not exist is etcd's error.
    let unknown = etcd
        .lock("jobs", Some(LockOptions::new().with_lease(0x7777)))
        .await
        .map(|_| ())
        .expect_err("a lock on an unknown lease");
    let status = status_of(unknown);
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(status.message(), "etcdserver: requested lease not found");
}

/// A Lock request on `lease` (0: none), with the idempotency metadata
/// `key` if given.
fn lock_request(name: &str, lease: i64, key: Option<&str>) -> tonic::Request<LockRequest> {
    let mut request = tonic::Request::new(LockRequest {
        name: name.as_bytes().to_vec(),
        lease,
    });
    if let Some(key) = key {
        request.metadata_mut().insert(
            oncekv_proto::IDEMPOTENCY_KEY_METADATA,
            key.parse().expect("metadata value"),
        );
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_leaves_no_waiter_and_a_keyed_resend_waits_on_in_its_place() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = cluster.node(1).client.clone();
    let mut etcd = client(&address).await;
    let raw = RawLockClient::connect(format!("http://{address}"))
        .await
        .expect("connect");

    let holder_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let holder = etcd
        .lock("queue", Some(LockOptions::new().with_lease(holder_lease)))
        .await
        .expect("the holder's lock");

    // A waiter that goes away takes its key with it, as on etcd.
    let waiter_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let mut plain = raw.clone();
    let dropped =
        tokio::spawn(async move { plain.lock(lock_request("queue", waiter_lease, None)).await });
    until_keys_under(&etcd, "queue/", 2).await;
    dropped.abort();
    until_keys_under(&etcd, "queue/", 1).await;

    // A waiter with the idempotency metadata (and no lease: one is granted
    // for it) leaves its key for its resend when it goes away...
    let leases_before = etcd.leases().await.expect("leases").leases().len();
    let mut keyed = raw.clone();
    let dropped = tokio::spawn(async move {
        keyed
            .lock(lock_request("queue", 0, Some("take-the-queue-lock")))
            .await
    });
    until_keys_under(&etcd, "queue/", 2).await;
    dropped.abort();
    // ...and the resend finds it and waits in its place: one key, one
    // lease, whichever send got there first.
    let mut keyed = raw.clone();
    let resent = tokio::spawn(async move {
        keyed
            .lock(lock_request("queue", 0, Some("take-the-queue-lock")))
            .await
    });
    let holder_key = holder.key().to_vec();
    let waiting = etcd
        .get("queue/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .kvs()
        .iter()
        .map(|kv| kv.key().to_vec())
        .find(|key| *key != holder_key)
        .expect("the keyed waiter's key");
    assert!(!resent.is_finished(), "locked while another holds the lock");
    etcd.unlock(holder.key()).await.expect("unlock");
    let acquired = within("the resent lock", resent)
        .await
        .expect("the resend's task")
        .expect("the resent lock")
        .into_inner();
    assert_eq!(acquired.key, waiting);
    assert_eq!(keys_under(&mut etcd, "queue/").await, 1);
    let leases_after = etcd.leases().await.expect("leases").leases().len();
    assert_eq!(leases_after, leases_before + 1);
    // Sent again once held, it answers the same key.
    let again = raw
        .clone()
        .lock(lock_request("queue", 0, Some("take-the-queue-lock")))
        .await
        .expect("the lock sent again")
        .into_inner();
    assert_eq!(again.key, waiting);
}

/// The value of the next leader `observer` sees.
async fn next_value(observer: &mut ObserveStream) -> String {
    let seen = within("an observed leader", observer.message())
        .await
        .expect("observe")
        .expect("the observe stream ended");
    let kv = seen.kv().expect("the leader's pair");
    String::from_utf8_lossy(kv.value()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigners_lead_in_turn_and_observers_see_every_proclamation() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let mut etcd = client(&cluster.node(1).client).await;

    // No one leads yet.
    let none = etcd
        .leader("jobs")
        .await
        .map(|_| ())
        .expect_err("no leader");
    assert_eq!(status_of(none).message(), "election: no leader");

    let mut observer = etcd.observe("jobs").await.expect("observe");
    let first_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let elected = etcd
        .campaign("jobs", "first", first_lease)
        .await
        .expect("campaign");
    let first = elected.leader().expect("a leader key").clone();
    assert_eq!(first.name(), b"jobs");
    assert_eq!(first.key(), format!("jobs/{first_lease:x}").as_bytes());
    assert_eq!(first.lease(), first_lease);
    assert_eq!(next_value(&mut observer).await, "first");
    // Campaigning again on the same lease keeps the leadership and, with
    // another value, proclaims it.
    let again = etcd
        .campaign("jobs", "first, again", first_lease)
        .await
        .expect("campaign again");
    assert_eq!(again.leader().map(|key| key.rev()), Some(first.rev()));
    assert_eq!(next_value(&mut observer).await, "first, again");
    let leader = etcd.leader("jobs").await.expect("leader");
    let kv = leader.kv().expect("the leader's pair");
    assert_eq!(kv.value(), b"first, again");
    assert_eq!(kv.create_revision(), first.rev());
    assert_eq!(kv.lease(), first_lease);

    // Proclaiming changes the value every observer sees.
    etcd.proclaim(
        "first, proclaimed",
        Some(ProclaimOptions::new().with_leader(first.clone())),
    )
    .await
    .expect("proclaim");
    assert_eq!(next_value(&mut observer).await, "first, proclaimed");

    // A second campaigner waits until the first resigns, then leads.
    let second_lease = etcd.lease_grant(60, None).await.expect("grant").id();
    let mut campaigner = etcd.clone();
    let second =
        tokio::spawn(async move { campaigner.campaign("jobs", "second", second_lease).await });
    until_keys_under(&etcd, "jobs/", 2).await;
    assert!(!second.is_finished(), "elected while another leads");
    etcd.resign(Some(ResignOptions::new().with_leader(first.clone())))
        .await
        .expect("resign");
    let second = within("the second campaign", second)
        .await
        .expect("the campaigner's task")
        .expect("the second campaign");
    let second_key = second.leader().expect("a leader key").clone();
    assert!(second_key.rev() > first.rev());
    assert_eq!(next_value(&mut observer).await, "second");
    let leader = etcd.leader("jobs").await.expect("leader");
    assert_eq!(leader.kv().map(|kv| kv.value()), Some(&b"second"[..]));

    // The first leader's key no longer leads: its proclamations are
    // refused, and its resignation changes nothing.
    let stale = etcd
        .proclaim(
            "first, late",
            Some(ProclaimOptions::new().with_leader(first.clone())),
        )
        .await
        .map(|_| ())
        .expect_err("a stale proclamation");
    assert_eq!(status_of(stale).message(), "election: not leader");
    etcd.resign(Some(ResignOptions::new().with_leader(first)))
        .await
        .expect("a stale resignation");
    let leader = etcd.leader("jobs").await.expect("leader");
    assert_eq!(leader.kv().map(|kv| kv.value()), Some(&b"second"[..]));

    // A proclamation without a leader key is etcd's error.
    let missing = etcd
        .proclaim("nobody", None)
        .await
        .map(|_| ())
        .expect_err("a proclamation without a leader key");
    assert_eq!(
        status_of(missing).message(),
        "\"leader\" field must be provided"
    );

    // The last leader resigns: no one leads.
    etcd.resign(Some(ResignOptions::new().with_leader(second_key)))
        .await
        .expect("resign");
    let none = etcd
        .leader("jobs")
        .await
        .map(|_| ())
        .expect_err("no leader");
    assert_eq!(status_of(none).message(), "election: no leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_cluster_answer_etcd_client() {
    let _one = exclusive().await;
    let mut cluster = support::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = cluster.node(1).client.clone();
    let mut etcd = client(&address).await;
    etcd.put("k", "v", None).await.expect("put");

    let status = etcd.status().await.expect("status");
    assert_eq!(status.version(), "3.4.0");
    assert_eq!(status.leader(), 1);
    assert!(status.raft_applied_index() > 0);
    assert!(status.errors().is_empty(), "{:?}", status.errors());

    let alarms = etcd
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarm list");
    assert!(alarms.alarms().is_empty());
    etcd.defragment().await.expect("defragment");

    // The snapshot streams to its end: remaining bytes count down to 0,
    // and the whole is a backup oncekv restores from.
    let mut stream = etcd.snapshot().await.expect("snapshot");
    let mut bytes = Vec::new();
    let mut remaining = None;
    while let Some(chunk) = within("a snapshot chunk", stream.message())
        .await
        .expect("snapshot chunk")
    {
        bytes.extend_from_slice(chunk.blob());
        remaining = Some(chunk.remaining_bytes());
    }
    assert_eq!(remaining, Some(0));
    assert_eq!(bytes.len() % 512, 32, "whole pages and a SHA-256");
    let backup = oncekv_server::backup::Backup::decode(&bytes).expect("a backup");
    assert!(backup.applied_index.0 > 0);

    let members = etcd.member_list().await.expect("member list");
    let members = members.members();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].id(), 1);
    assert_eq!(members[0].client_urls(), [format!("http://{address}")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_work_through_followers() {
    let _one = exclusive().await;
    let mut cluster = support::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let followers: Vec<String> = (1..=3)
        .filter(|id| *id != leader)
        .map(|id| cluster.node(id).client.clone())
        .collect();
    let mut one = client(&followers[0]).await;
    let mut other = client(&followers[1]).await;
    // Each follower answers once it knows the leader.
    for follower in [&one, &other] {
        eventually(STEP, "a follower to know the leader", || {
            let mut follower = follower.clone();
            async move { follower.get("any", None).await.ok().map(drop) }
        })
        .await;
    }

    // Locks through followers: carried out by the leader, in turn.
    let first_lease = one.lease_grant(60, None).await.expect("grant").id();
    let second_lease = other.lease_grant(60, None).await.expect("grant").id();
    let first = one
        .lock("shared", Some(LockOptions::new().with_lease(first_lease)))
        .await
        .expect("a lock through a follower");
    let mut waiter = other.clone();
    let second = tokio::spawn(async move {
        waiter
            .lock("shared", Some(LockOptions::new().with_lease(second_lease)))
            .await
    });
    until_keys_under(&one, "shared/", 2).await;
    assert!(!second.is_finished(), "locked while another holds the lock");
    one.unlock(first.key())
        .await
        .expect("unlock through a follower");
    let second = within("the lock through the other follower", second)
        .await
        .expect("the waiter's task")
        .expect("the second lock");
    assert_eq!(second.key(), format!("shared/{second_lease:x}").as_bytes());

    // An election observed on one follower, campaigned on the other.
    let mut observer = one.observe("chair").await.expect("observe on a follower");
    let elected = other
        .campaign("chair", "other", second_lease)
        .await
        .expect("campaign through a follower");
    let seen = within("an observed leader", observer.message())
        .await
        .expect("observe")
        .expect("the observe stream ended");
    assert_eq!(seen.kv().map(|kv| kv.value()), Some(&b"other"[..]));
    let leader_key = elected.leader().expect("a leader key").clone();
    one.proclaim(
        "proclaimed",
        Some(ProclaimOptions::new().with_leader(leader_key.clone())),
    )
    .await
    .expect("proclaim through a follower");
    let seen = within("an observed proclamation", observer.message())
        .await
        .expect("observe")
        .expect("the observe stream ended");
    assert_eq!(seen.kv().map(|kv| kv.value()), Some(&b"proclaimed"[..]));
    let leader = one
        .leader("chair")
        .await
        .expect("leader through a follower");
    assert_eq!(leader.kv().map(|kv| kv.value()), Some(&b"proclaimed"[..]));
    one.resign(Some(ResignOptions::new().with_leader(leader_key)))
        .await
        .expect("resign through a follower");
    let none = other
        .leader("chair")
        .await
        .map(|_| ())
        .expect_err("no leader");
    assert_eq!(status_of(none).message(), "election: no leader");
}
