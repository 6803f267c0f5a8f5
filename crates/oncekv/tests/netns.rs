//! Five nodes as hosts of their own: each `oncekv serve` in a network
//! namespace with its own address on a private bridge, the test's clients
//! in the clients' namespace beside them (`oncekv_harness::netns`). The
//! cluster elects a leader and serves writes; the leader's link goes down
//! and a new leader is elected while writes go on; its link comes up and
//! it rejoins, catching up. Then a short `oncekv verify --topology netns`
//! run under the network faults passes every checker, and one that
//! changes the membership (members join on hosts of their own, a member
//! is replaced on its host, a joined member's link goes down). Three hosts
//! whose peer links (their peer proxies, in the clients' namespace) each
//! delay 20 ms one way pay a round trip for every write and stay
//! consistent, and slowing one link slows only the node behind it. After
//! each, no namespace of the run is left.
//!
//! Needs root and `ip netns`: without them each test says so through
//! `missing_dependency` (a failure under `CI=true`). No packet goes
//! anywhere but the namespaces the tests create.

use oncekv_harness::cluster::{Cluster, Topology};
use oncekv_harness::netns::{self, Network};
use oncekv_harness::peer_proxy::LinkShape;
use oncekv_harness::testing::{self, Dependency, TestSession, eventually, missing_dependency};
use oncekv_state::{Command, Outcome};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command as Process;
use std::sync::Mutex;
use std::time::Duration;

const BINARY: &str = env!("CARGO_BIN_EXE_oncekv");

/// One cluster at a time: each is five processes on two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Whether namespaces can be made here; if not, says so for `test`.
fn namespaces_available(test: &str) -> bool {
    match netns::available() {
        Ok(()) => true,
        Err(why) => {
            missing_dependency(test, Dependency::NetworkNamespaces, &why);
            false
        }
    }
}

/// The namespaces process `pid` made that are still there.
fn left_by(pid: u32) -> Vec<String> {
    netns::namespaces_of(pid).expect("ip netns list")
}

/// The (device, inode) of a network namespace file.
fn namespace_id(path: impl AsRef<Path>) -> Option<(u64, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// Waits until every node's PID is the `oncekv` binary itself, in the
/// node's own namespace: `ip netns exec` entered it and exec'd.
fn wait_for_processes_in_their_namespaces(cluster: &Cluster) {
    let binary = std::fs::canonicalize(BINARY).expect("the binary");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for node in &cluster.nodes {
        let pid = node.pid().expect("started");
        let namespace = node.namespace().expect("a namespace");
        let own = namespace_id(Path::new("/run/netns").join(namespace));
        loop {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let inside = namespace_id(format!("/proc/{pid}/ns/net"));
            if exe.as_deref() == Some(binary.as_path()) && inside.is_some() && inside == own {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {} (PID {pid}) is {exe:?} in {inside:?}, not the binary in {namespace} \
                 ({own:?})",
                node.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn put(session: &TestSession, seq: u64, key: &str, value: &str) -> oncekv_state::Request {
    session.request(
        seq,
        0,
        Command::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec().into(),
            lease: None,
        },
    )
}

/// The leader node `id` knows, if it answers.
async fn leader_seen_by(cluster: &Cluster, id: u64) -> Option<u64> {
    let node = cluster.nodes.iter().find(|n| n.id == id)?;
    node.status().await.ok()?.leader_id
}

/// The scenario, run in the clients' namespace.
async fn elect_write_lose_the_leader_s_link_and_rejoin(cluster: &Cluster, network: &Network) {
    let patience = Duration::from_secs(60);
    let first = cluster.leader(patience).await;
    let session = TestSession::open(cluster, 120_000, 16).await;
    let outcome = cluster
        .outcome(&put(&session, 1, "before", "1"), patience)
        .await;
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");

    // The leader's link goes down: nobody reaches it, it reaches nobody.
    network.set_link(first, false).expect("link down");
    let others: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&id| id != first)
        .collect();
    let second = eventually(patience, "a leader among the other four", || {
        let others = others.clone();
        async move {
            for &id in &others {
                let node = cluster.nodes.iter().find(|n| n.id == id)?;
                if node.status().await.is_ok_and(|s| s.is_leader) {
                    return Some(id);
                }
            }
            None
        }
    })
    .await;
    assert_ne!(second, first);
    let outcome = cluster
        .outcome(&put(&session, 2, "during", "2"), patience)
        .await;
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");

    // Its link comes up: it follows the new leader and catches up.
    network.set_link(first, true).expect("link up");
    eventually(patience, "the old leader following again", || async {
        let leader = leader_seen_by(cluster, first).await?;
        (leader != first).then_some(())
    })
    .await;
    let outcome = cluster
        .outcome(&put(&session, 3, "after", "3"), patience)
        .await;
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    let rejoined = cluster
        .nodes
        .iter()
        .find(|n| n.id == first)
        .expect("the old leader");
    eventually(patience, "the old leader holding every write", || async {
        let during = rejoined.local_value(b"during").await;
        let after = rejoined.local_value(b"after").await;
        (during.as_deref() == Some(b"2") && after.as_deref() == Some(b"3")).then_some(())
    })
    .await;
}

#[test]
fn five_hosts_elect_serve_and_outlive_the_leader_s_link_going_down() {
    let test = "netns::five_hosts_elect_serve_and_outlive_the_leader_s_link_going_down";
    if !namespaces_available(test) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut options = testing::options(BINARY, 5, testing::FAST);
    options.topology = Topology::Netns;
    let mut cluster = Cluster::start(&options).expect("five hosts");
    let network = cluster.network().expect("a network");
    assert_eq!(cluster.topology(), Topology::Netns);
    // Each node serves on its own address, in its own namespace, and is
    // stopped by the PID the cluster holds.
    for node in &cluster.nodes {
        let own = netns::node_ip(node.id).to_string();
        assert_eq!(node.client, format!("{own}:{}", netns::CLIENT_PORT));
        assert_eq!(node.peer, format!("{own}:{}", netns::PEER_PORT));
    }
    wait_for_processes_in_their_namespaces(&cluster);
    // Nothing of the network in this namespace.
    let root = Process::new("ip")
        .args(["-o", "addr"])
        .output()
        .expect("ip");
    assert!(!String::from_utf8_lossy(&root.stdout).contains("10.77.0."));

    network
        .block_on(elect_write_lose_the_leader_s_link_and_rejoin(
            &cluster, &network,
        ))
        .unwrap_or_else(|e| panic!("the clients' namespace: {e}\n{}", cluster.logs()));

    // Stopping by PID stops the node itself: nothing is left in its
    // namespace.
    let pid = cluster.nodes[0].pid().expect("running");
    let namespace = network.namespace(1);
    cluster.kill(1);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let pids = Process::new("ip")
        .args(["netns", "pids", &namespace])
        .output()
        .expect("ip netns pids");
    assert_eq!(String::from_utf8_lossy(&pids.stdout).trim(), "");
    drop(network);
    drop(cluster);
    assert_eq!(left_by(std::process::id()), Vec::<String>::new());
}

/// Runs `oncekv verify --topology netns` with `args` (and JSON output
/// into a folder of its own); asserts it passed with every checker, no
/// failed nemesis step and nothing skipped. Returns the report, the
/// history's text and the run's PID.
fn verify_between_hosts(args: &[&str]) -> (Value, String, u32) {
    let out = tempfile::tempdir().expect("a temporary folder");
    let child = Process::new(BINARY)
        .args(["verify", "--topology", "netns"])
        .args(args)
        .args(["-o", "json", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("oncekv verify starts");
    let pid = child.id();
    let output = child.wait_with_output().expect("oncekv verify runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!("not one JSON object ({error}):\n{stdout}\nstderr:\n{stderr}")
    });
    assert_eq!(output.status.code(), Some(0), "expected PASS: {json:#}");
    assert_eq!(json["verdict"], "PASS", "{json:#}");
    assert_eq!(json["nemesis_failures"], serde_json::json!([]), "{json:#}");
    assert_eq!(json["skipped"], serde_json::json!([]), "{json:#}");
    for checker in json["checkers"].as_array().expect("checkers") {
        assert_eq!(checker["status"], "pass", "{json:#}");
    }
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    (json, history, pid)
}

#[test]
fn a_short_verify_run_between_five_hosts_passes() {
    let test = "netns::a_short_verify_run_between_five_hosts_passes";
    if !namespaces_available(test) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (json, history, pid) = verify_between_hosts(&[
        "--nodes",
        "5",
        "--duration",
        "20s",
        "--seed",
        "26",
        "--clients",
        "4",
        // The network's faults only: in 20 s each runs at least once
        // (seed 26 starts every kind by 13 s), however few requests a
        // loaded machine completes meanwhile.
        "--faults",
        "link-down,one-way,cut-leader,split,flap,partition",
    ]);
    let faults = &json["coverage"]["faults"];
    // Link downs, one-way cuts, cuts from the leader, splits and
    // partitions are partitions; flapping links are failing links.
    assert!(faults["partition"].as_u64() >= Some(5), "{json:#}");
    assert!(faults["message_loss"].as_u64() >= Some(1), "{json:#}");
    assert!(
        json["coverage"]["leader_changes"].as_u64() >= Some(1),
        "{json:#}"
    );
    for detail in [
        "down\"",
        "flapping\"",
        "one-way:",
        "cut from the leader",
        "split [",
    ] {
        assert!(
            history.contains(detail),
            "no `{detail}` fault in the history"
        );
    }
    let partitioned = (1..=5).any(|n| history.contains(&format!("\"detail\":\"{n} | [")));
    assert!(partitioned, "no partition of one node in the history");
    assert_eq!(left_by(pid), Vec::<String>::new());
}

#[test]
fn membership_changes_between_hosts_pass_verify() {
    let test = "netns::membership_changes_between_hosts_pass_verify";
    if !namespaces_available(test) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (_, history, pid) = verify_between_hosts(&[
        "--nodes",
        "3",
        "--duration",
        "30s",
        "--seed",
        "9603",
        "--clients",
        "2",
        "--faults",
        "grow-shrink,replace,link-down",
    ]);
    for detail in [
        // A member joins on a host of its own, on the bridge.
        "a learner added at 10.77.0.",
        "promoted to voter",
        "replace: node",
        "removed (MemberRemove)",
        "link of node",
    ] {
        assert!(
            history.contains(detail),
            "no `{detail}` in the history:\n{history}"
        );
    }
    assert_eq!(left_by(pid), Vec::<String>::new());
}

/// Every peer link's one-way delay in the shaped test.
const ONE_WAY: Duration = Duration::from_millis(20);

/// The leader's link to one follower, slowed, in the shaped test: far
/// more than the other link's round trip, far less than an election.
const SLOW_ONE_WAY: Duration = Duration::from_millis(300);

/// Writes through the leader, timing each; checks the links' delays show.
async fn writes_pay_a_round_trip_and_a_slow_link_slows_only_its_node(cluster: &Cluster) {
    let patience = Duration::from_secs(30);
    let leader = cluster.leader(patience).await;
    let session = TestSession::open(cluster, 120_000, 16).await;
    let node = |id: u64| cluster.nodes.iter().find(|n| n.id == id).expect("a node");
    let mut seq = 0;
    let mut write = |key: String| {
        seq += 1;
        let request = put(&session, seq, &key, "v");
        async move {
            let sent = std::time::Instant::now();
            let response = node(leader).execute(&request).await.expect("an answer");
            let took = sent.elapsed();
            let outcome = match response.result {
                Some(oncekv_proto::v1::execute_response::Result::Outcome(outcome)) => {
                    oncekv_proto::convert::outcome_from_wire(outcome).expect("an outcome")
                }
                other => panic!("no outcome from the leader {leader}: {other:?}"),
            };
            assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
            (sent, took)
        }
    };
    // Committing needs a follower's copy: a round trip between hosts.
    for n in 0..5 {
        let (_, took) = write(format!("key-{n}")).await;
        assert!(
            took >= ONE_WAY * 2,
            "a write took {took:?}, under a round trip"
        );
    }

    // The leader's link to one follower slows; the other's does not.
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|&id| id != leader).collect();
    let (slowed, other) = (followers[0], followers[1]);
    let shaping = cluster.partitions().shaping();
    shaping.set_link(
        leader,
        slowed,
        LinkShape::delay(SLOW_ONE_WAY).expect("a shape"),
    );
    assert_eq!(shaping.link(leader, other).one_way_delay(), ONE_WAY);
    let (sent, _) = write("after-the-slowdown".into()).await;
    // When each follower first held it.
    let seen = Mutex::new([None::<Duration>; 2]);
    let (slow, fast) = eventually(patience, "both followers holding the write", || {
        let seen = &seen;
        async move {
            let mut now = *seen.lock().unwrap_or_else(|p| p.into_inner());
            for (at, id) in now.iter_mut().zip([slowed, other]) {
                if at.is_none() && node(id).local_value(b"after-the-slowdown").await.is_some() {
                    *at = Some(sent.elapsed());
                }
            }
            *seen.lock().unwrap_or_else(|p| p.into_inner()) = now;
            Some((now[0]?, now[1]?))
        }
    })
    .await;
    assert!(
        slow >= SLOW_ONE_WAY,
        "node {slowed} behind the slow link had it after {slow:?}"
    );
    assert!(
        fast < slow,
        "node {other} ({fast:?}) was no faster than node {slowed} ({slow:?})"
    );

    // Back to every link's delay: all three hold the same state.
    shaping.clear_link(leader, slowed);
    write("last".into()).await;
    eventually(patience, "the same state on every node", || async {
        let mut digests = Vec::new();
        for id in [1, 2, 3] {
            digests.push(node(id).state_digest().await.ok()?);
        }
        let same = digests.windows(2).all(|pair| pair[0] == pair[1]);
        (same && digests[0].0.is_some()).then_some(())
    })
    .await;
    for id in [1, 2, 3] {
        for key in ["key-0", "key-4", "after-the-slowdown", "last"] {
            assert_eq!(
                node(id).local_value(key.as_bytes()).await.as_deref(),
                Some(&b"v"[..]),
                "{key} on node {id}"
            );
        }
    }
}

#[test]
fn three_hosts_with_delayed_peer_links_pay_a_round_trip_per_write_and_one_slow_link_slows_one_node()
{
    let test = "netns::three_hosts_with_delayed_peer_links_pay_a_round_trip_per_write_and_one_\
                slow_link_slows_one_node";
    if !namespaces_available(test) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut options = testing::options(BINARY, 3, testing::FAST);
    options.topology = Topology::Netns;
    options.link_shape = LinkShape::delay(ONE_WAY).expect("a shape");
    let cluster = Cluster::start(&options).expect("three hosts");
    let network = cluster.network().expect("a network");
    network
        .block_on(writes_pay_a_round_trip_and_a_slow_link_slows_only_its_node(
            &cluster,
        ))
        .unwrap_or_else(|e| panic!("the clients' namespace: {e}\n{}", cluster.logs()));
    drop(network);
    drop(cluster);
    assert_eq!(left_by(std::process::id()), Vec::<String>::new());
}
