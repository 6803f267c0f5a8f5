//! A new member whose snapshot is older than its leader's joining catches
//! up. Node 2 joins a one-node cluster from node 1's snapshot and takes
//! over when node 1 is removed, holding no snapshot of its own yet: the one
//! it sends node 3 names node 1 as the only member. Node 3 must accept node
//! 2's entries after it all the same (they carry the membership of now);
//! refusing a leader outside the membership it knows, it never caught up.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{Cluster, FAST, eventually, exclusive, free_port, oncekv_cli};

/// Snapshot after this many entries, and keep none after a snapshot, so a
/// new member is sent a snapshot, and the joiner builds none of its own
/// during the test (it applies fewer entries than this after its own).
const SNAPSHOT_FLAGS: &[&str] = &["--snapshot-after-entries", "30", "--log-entries-kept", "0"];

/// A joining node, killed when dropped.
struct Joiner(Child);

impl Drop for Joiner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts node `id` with `--join`, as the cluster's nodes are configured;
/// its client and peer addresses.
fn join(cluster: &Cluster, id: u64) -> (Joiner, String, String) {
    let (client, peer) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let data = cluster.dir.path().join(format!("joiner-{id}"));
    let token = cluster.peer_token_file().expect("a token cluster");
    let log = std::fs::File::create(cluster.dir.path().join(format!("joiner-{id}.log")))
        .expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--id", &id.to_string(), "--join", "--data-dir"])
        .arg(&data)
        .args(["--listen-client", &client, "--listen-peer", &peer])
        .arg("--peer-token-file")
        .arg(token)
        .args(FAST)
        .args(SNAPSHOT_FLAGS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn joiner");
    (Joiner(child), client, peer)
}

/// `oncekv status -o json` of the node at `endpoint`.
fn status(endpoint: &str) -> Option<serde_json::Value> {
    let (code, out) = oncekv_cli(&["status", "--endpoints", endpoint, "-o", "json"], &[]);
    if code != 0 {
        return None;
    }
    serde_json::from_str(out.trim()).ok()
}

/// A number in a status reply.
fn field(status: &serde_json::Value, field: &str) -> Option<u64> {
    status.get(field).and_then(serde_json::Value::as_u64)
}

/// Runs `oncekv` against `endpoint`, asserting success; what it printed.
fn ok(endpoint: &str, args: &[&str]) -> String {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--endpoints", endpoint]);
    let (code, out) = oncekv_cli(&all, &[]);
    assert_eq!(code, 0, "oncekv {args:?}: {out}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_sent_a_snapshot_older_than_its_leader_catches_up() {
    let _one = exclusive().await;
    let flags: Vec<&str> = FAST.iter().chain(SNAPSHOT_FLAGS).copied().collect();
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    let first = cluster.node(1).client.clone();
    for i in 0..40 {
        ok(&first, &["put", &format!("k{i}"), &format!("v{i}")]);
    }
    let snapshot = eventually(Duration::from_secs(30), "node 1's snapshot", || {
        let first = first.clone();
        async move { status(&first).and_then(|s| field(&s, "snapshot_index")) }
    })
    .await;

    // Node 2 joins from that snapshot (whose only member is node 1).
    let (_second, second, peer) = join(&cluster, 2);
    ok(
        &first,
        &["member", "add", "2", "--peer", &peer, "--client", &second],
    );
    let held = status(&second).and_then(|s| field(&s, "snapshot_index"));
    assert_eq!(held, Some(snapshot), "node 2 was sent node 1's snapshot");

    // Node 1 leaves; node 2 leads, and still holds only that snapshot.
    ok(&first, &["member", "remove", "1"]);
    eventually(Duration::from_secs(30), "node 2 leading", || {
        let second = second.clone();
        async move {
            status(&second)
                .filter(|s| field(s, "leader_id") == Some(2))
                .map(|_| ())
        }
    })
    .await;
    cluster.kill(1);
    let held = status(&second).and_then(|s| field(&s, "snapshot_index"));
    assert_eq!(held, Some(snapshot), "node 2 built no snapshot of its own");

    // Node 3 is sent that snapshot, then node 2's entries after it.
    let (_third, third, peer) = join(&cluster, 3);
    ok(
        &second,
        &["member", "add", "3", "--peer", &peer, "--client", &third],
    );
    ok(&second, &["put", "after", "3"]);
    let value = eventually(Duration::from_secs(30), "node 3 caught up", || {
        let third = third.clone();
        async move {
            let (code, out) = oncekv_cli(
                &["get", "after", "--serializable", "--endpoints", &third],
                &[],
            );
            (code == 0 && !out.trim().is_empty()).then(|| out.trim().to_string())
        }
    })
    .await;
    assert_eq!(value, "3");
    let (code, out) = oncekv_cli(&["get", "k0", "--serializable", "--endpoints", &third], &[]);
    assert_eq!((code, out.trim()), (0, "v0"));
}
