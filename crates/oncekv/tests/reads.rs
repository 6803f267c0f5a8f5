//! Reads against real processes: an old leader reading under its lease,
//! paused (SIGSTOP) or cut off from its peers while a new leader commits a
//! write, never answers the old value afterwards; serializable reads of
//! the Rust client are answered by a follower when no leader can serve.

mod support;

use oncekv_client::{Client, ClientOptions};
use oncekv_harness::cluster::ClusterOptions;
use oncekv_proto::{convert, v1};
use oncekv_state::{Command, IdempotencyKey, Origin, Outcome, Query, Reply, Request};
use std::time::{Duration, Instant};
use support::{Cluster, FAST, NodeProcess, eventually, exclusive, without_meta};

const ELECTION: Duration = Duration::from_secs(15);
const KEY: &[u8] = b"k";

fn put(round: u64, value: &[u8]) -> Request {
    Request {
        origin: Origin::Key(IdempotencyKey(format!("put-{round}").into_bytes())),
        command: Command::Put {
            key: KEY.to_vec(),
            value: value.to_vec().into(),
            lease: None,
        },
    }
}

/// Node `id` of `cluster`, to talk to.
fn node(cluster: &oncekv_harness::cluster::Cluster, id: u64) -> &NodeProcess {
    cluster.nodes.iter().find(|n| n.id == id).expect("a node")
}

fn get() -> Query {
    Query::Get { key: KEY.to_vec() }
}

fn got(value: &[u8]) -> Reply {
    Reply::Get {
        value: Some(value.to_vec()),
        meta: None,
    }
}

/// Reads `KEY` linearizably on `node` until one answer comes, for a
/// bounded time (the lease path, once the node leads and holds its lease).
async fn read_until_answered(node: &NodeProcess) -> Reply {
    eventually(Duration::from_secs(10), "a linearizable read", || async {
        node.read(&get(), false).await.ok().map(without_meta)
    })
    .await
}

/// Reads `KEY` linearizably on `node` `times` times: each read must be
/// refused or answer `fresh`, never the `stale` value.
async fn never_stale(node: &NodeProcess, times: u32, stale: &[u8], fresh: &[u8], what: &str) {
    let mut answered = 0;
    let mut refusal = None;
    for attempt in 0..times {
        match node.read(&get(), false).await {
            Ok(reply) => {
                let reply = without_meta(reply);
                assert_ne!(reply, got(stale), "{what}: stale read on attempt {attempt}");
                assert_eq!(reply, got(fresh), "{what}: attempt {attempt}");
                answered += 1;
            }
            Err(refused) => refusal = Some(refused),
        }
    }
    eprintln!("{what}: {answered} of {times} reads answered (all fresh); refused: {refusal:?}");
}

/// Waits for a leader other than `old`, asking only the other nodes.
async fn new_leader(cluster: &Cluster, old: u64) -> u64 {
    eventually(ELECTION, "a new leader", || async {
        for node in cluster.nodes.iter().filter(|n| n.id != old) {
            if let Ok(status) = node.status().await
                && status.is_leader
            {
                return Some(node.id);
            }
        }
        None
    })
    .await
}

/// The old leader, paused while the others elect a new leader that
/// commits a write, then resumed: its lease ran out on its own monotonic
/// clock during the pause, so it falls back to read-index, which finds the
/// new term; no read it answers is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_old_leader_never_serves_a_stale_lease_read() {
    let _one = exclusive().await;
    let mut flags = FAST.to_vec();
    flags.extend(["--read-policy", "lease"]);
    let mut cluster = Cluster::start(3, &flags);
    for round in 1..=3u64 {
        let old_value = format!("old-{round}").into_bytes();
        let new_value = format!("new-{round}").into_bytes();
        let written = cluster.outcome(&put(2 * round, &old_value), ELECTION).await;
        assert!(matches!(written, Outcome::Applied(_)), "{written:?}");
        let old = cluster.leader(ELECTION).await;
        assert_eq!(
            read_until_answered(cluster.node(old)).await,
            got(&old_value),
            "round {round}: the leader's own read"
        );
        assert!(cluster.node(old).pause(), "SIGSTOP node {old}");
        let leader = new_leader(&cluster, old).await;
        let written = cluster
            .outcome(&put(2 * round + 1, &new_value), ELECTION)
            .await;
        assert!(matches!(written, Outcome::Applied(_)), "{written:?}");
        cluster.node(old).resume();
        never_stale(
            cluster.node(old),
            20,
            &old_value,
            &new_value,
            &format!("round {round}: old leader {old} after SIGCONT (new leader {leader})"),
        )
        .await;
        // Every node can be the old leader of the next round.
        let caught_up = node(&cluster, old);
        eventually(ELECTION, "the old leader caught up", || async {
            (caught_up.local_value(KEY).await == Some(new_value.clone())).then_some(())
        })
        .await;
    }
}

/// The old leader, cut off from both followers (it keeps running and
/// believes it leads): once the others elect a new leader and commit a
/// write, its reads are refused, never answered with the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_old_leader_never_serves_a_stale_lease_read() {
    let _one = exclusive().await;
    let mut options: ClusterOptions =
        oncekv_harness::testing::options(env!("CARGO_BIN_EXE_oncekv"), 3, FAST);
    options
        .extra_args
        .extend(["--read-policy".to_string(), "lease".to_string()]);
    let cluster = oncekv_harness::cluster::Cluster::start_partitionable(&options)
        .await
        .expect("a partitionable cluster");
    let old_value = b"before".to_vec();
    let new_value = b"after".to_vec();
    let written = cluster.outcome(&put(1, &old_value), ELECTION).await;
    assert!(matches!(written, Outcome::Applied(_)), "{written:?}");
    let old = cluster.leader(ELECTION).await;
    let old_node = cluster.nodes.iter().find(|n| n.id == old).expect("node");
    assert_eq!(read_until_answered(old_node).await, got(&old_value));
    let others: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| *id != old)
        .collect();
    cluster.partitions().split(&[old], &others);
    let leader = eventually(ELECTION, "a new leader", || async {
        for node in cluster.nodes.iter().filter(|n| n.id != old) {
            if let Ok(status) = node.status().await
                && status.is_leader
            {
                return Some(node.id);
            }
        }
        None
    })
    .await;
    let new_node = cluster.nodes.iter().find(|n| n.id == leader).expect("node");
    let written = eventually(ELECTION, "the write on the new leader", || async {
        let answer = new_node.execute(&put(2, &new_value)).await.ok()?.result;
        match answer {
            Some(v1::execute_response::Result::Outcome(outcome)) => {
                match convert::outcome_from_wire(outcome).ok()? {
                    outcome @ (Outcome::Applied(_) | Outcome::Replayed { .. }) => Some(outcome),
                    _ => None,
                }
            }
            _ => None,
        }
    })
    .await;
    eprintln!("written on node {leader}: {written:?}");
    let old_node = cluster.nodes.iter().find(|n| n.id == old).expect("node");
    never_stale(
        old_node,
        5,
        &old_value,
        &new_value,
        &format!("isolated old leader {old} (new leader {leader})"),
    )
    .await;
    cluster.partitions().heal();
}

/// With the leader and one follower stopped (no quorum: no leader can
/// serve), a serializable read of the Rust client is still answered, by
/// the remaining follower, with the last write; a linearizable one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_a_serializable_read_without_a_leader() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let client = Client::connect(
        endpoints,
        ClientOptions {
            attempt_timeout: Duration::from_millis(500),
            deadline: Duration::from_secs(5),
            ..cluster.client_options()
        },
    )
    .expect("a client");
    let written = client
        .execute_request(put(1, b"v1"))
        .await
        .expect("the write");
    assert!(matches!(written.0, Outcome::Applied(_)), "{written:?}");
    let leader = cluster.leader(ELECTION).await;
    let follower = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .expect("a follower");
    let survivor = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader && *id != follower)
        .expect("another follower");
    let survivor_node = node(&cluster, survivor);
    eventually(ELECTION, "the survivor applied the write", || async {
        (survivor_node.local_value(KEY).await == Some(b"v1".to_vec())).then_some(())
    })
    .await;
    assert!(cluster.node(leader).pause(), "SIGSTOP the leader");
    assert!(cluster.node(follower).pause(), "SIGSTOP a follower");
    let started = Instant::now();
    let reply = client.read(get(), true).await.expect("a serializable read");
    eprintln!("serializable read answered in {:?}", started.elapsed());
    assert_eq!(without_meta(reply), got(b"v1"));
    // Again: the client goes back to the node that answered.
    let reply = client.read(get(), true).await.expect("a serializable read");
    assert_eq!(without_meta(reply), got(b"v1"));
    if let Ok(reply) = client.read(get(), false).await {
        panic!("a linearizable read without a quorum answered {reply:?}");
    }
    cluster.node(leader).resume();
    cluster.node(follower).resume();
}
