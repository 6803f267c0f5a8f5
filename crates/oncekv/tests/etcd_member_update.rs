//! etcd's MemberUpdate and cluster id on oncekv clusters, through Debian's
//! `etcdctl` and etcd's gRPC API:
//!
//! - `etcdctl member update` gives a voter a new peer URL (every member
//!   lists it, natively too); the member, restarted listening there, is
//!   reached there and catches up with later writes; the same URL again
//!   changes nothing; etcd's refusals (an unknown member, another member's
//!   URL, a URL that does not parse);
//! - a member that joined later (here a learner, added through etcd's API,
//!   joining from a snapshot: the log before it is purged) reports the
//!   founders' cluster id in its headers, also after a restart; given a
//!   new peer URL (a learner is removed and added back there) and
//!   restarted there, it catches up again.
//!
//! Needs `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-client); without it the tests say so (and fail in CI).

mod support;

use oncekv_harness::testing::on_path;
use oncekv_proto::etcd::etcdserverpb::RangeRequest;
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::etcdctl::{Run, answering, etcdctl};
use support::{Cluster, Dependency, FAST, connect, eventually, exclusive, free_port};

/// Whether `etcdctl` is there; if not, the test is reported skipped.
fn have_etcdctl(test: &str) -> bool {
    if on_path("etcdctl").is_some() {
        return true;
    }
    support::missing_dependency(test, Dependency::Etcdctl, "no etcdctl binary on PATH");
    false
}

/// Asserts `run` failed with `error` in etcdctl's `Error: ...` line.
#[track_caller]
fn assert_refused(run: &Run, error: &str) {
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stderr
            .lines()
            .any(|line| line.starts_with("Error: ") && line.contains(error)),
        "expected {error:?}: {run:?}"
    );
}

/// The peer address node `address` lists for member `id` through oncekv's
/// API, and whether it votes.
async fn listed_natively(address: &str, id: u64) -> Option<(String, bool)> {
    let mut client = connect(address).await.ok()?;
    let status = client
        .status(oncekv_proto::v1::StatusRequest {})
        .await
        .ok()?
        .into_inner();
    status
        .members
        .into_iter()
        .find(|member| member.id == id)
        .map(|member| (member.peer_address, member.voter))
}

/// Who node `address` says leads, through oncekv's API.
async fn leader_seen_by(address: &str) -> Option<u64> {
    let mut client = connect(address).await.ok()?;
    let status = client
        .status(oncekv_proto::v1::StatusRequest {})
        .await
        .ok()?
        .into_inner();
    status.leader_id
}

/// Waits until each of `endpoints` knows the leader (a follower that does
/// not yet answers "no leader" to a change, which etcdctl does not resend).
async fn all_know_a_leader(endpoints: &[String]) {
    for endpoint in endpoints {
        eventually(
            Duration::from_secs(15),
            "every member to know the leader",
            || async { leader_seen_by(endpoint).await.map(|_| ()) },
        )
        .await;
    }
}

/// A `oncekv serve` started by the test (not by the harness), killed by
/// PID when dropped.
struct Started(Child);

impl Started {
    /// Node `id` on `data`, at these addresses, with `flags` (how it
    /// finds its cluster), the test's timings and the cluster's peer
    /// token, if it has one.
    fn serve(
        id: u64,
        data: &Path,
        peer: &str,
        client: &str,
        flags: &[String],
        token: Option<&Path>,
    ) -> Started {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(data.with_extension("by-test.log"))
            .expect("log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_oncekv"));
        command
            .args(["serve", "--id", &id.to_string(), "--data-dir"])
            .arg(data)
            .args(["--listen-client", client, "--listen-peer", peer])
            .args(flags)
            .args(FAST);
        if let Some(token) = token {
            command.arg("--peer-token-file").arg(token);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn a node");
        Started(child)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `etcdctl get KEY --consistency s` prints on `endpoint`, once it
/// is `expected`.
async fn reads_locally(endpoint: &str, key: &str, expected: &str) {
    let wanted = format!("{key}\n{expected}\n");
    eventually(
        Duration::from_secs(30),
        &format!("{endpoint} to read {key}={expected}"),
        || async {
            let got = etcdctl(endpoint, &["get", key, "--consistency", "s"], "");
            (got.stdout == wanted).then_some(())
        },
    )
    .await;
}

/// The cluster id in the header of a serializable Range answered by
/// `endpoint` itself.
async fn cluster_id_of(endpoint: &str) -> u64 {
    let mut kv = KvClient::connect(format!("http://{endpoint}"))
        .await
        .expect("connect");
    let response = kv
        .range(RangeRequest {
            key: b"any".to_vec(),
            serializable: true,
            ..RangeRequest::default()
        })
        .await
        .expect("a serializable range")
        .into_inner();
    response.header.expect("a header").cluster_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_gives_a_voter_a_new_peer_url_where_it_is_then_reached() {
    let _one = exclusive().await;
    let test = "etcd_member_update::etcdctl_gives_a_voter_a_new_peer_url_where_it_is_then_reached";
    if !have_etcdctl(test) {
        return;
    }
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let nodes: Vec<(String, String)> = (1..=3)
        .map(|id| {
            (
                cluster.node(id).peer.clone(),
                cluster.node(id).client.clone(),
            )
        })
        .collect();
    let all = nodes
        .iter()
        .map(|(_, client)| client.as_str())
        .collect::<Vec<_>>()
        .join(",");
    answering(&all).await;
    let clients: Vec<String> = nodes.iter().map(|(_, client)| client.clone()).collect();
    all_know_a_leader(&clients).await;
    let updated = (1..=3u64).find(|id| *id != leader).expect("a follower");
    let other = (1..=3u64)
        .find(|id| *id != leader && *id != updated)
        .expect("another follower");
    let hex = format!("{updated:x}");

    // etcd's refusals, and nothing changed.
    assert_refused(
        &etcdctl(
            &all,
            &[
                "member",
                "update",
                "abcdef",
                "--peer-urls",
                "http://127.0.0.1:1",
            ],
            "",
        ),
        "etcdserver: member not found",
    );
    let taken = format!("http://{}", nodes[other as usize - 1].0);
    assert_refused(
        &etcdctl(&all, &["member", "update", &hex, "--peer-urls", &taken], ""),
        "etcdserver: Peer URLs already exists",
    );
    assert_refused(
        &etcdctl(
            &all,
            &["member", "update", &hex, "--peer-urls", "http://:1"],
            "",
        ),
        "etcdserver: given member URLs are invalid",
    );
    let (old_peer, client) = nodes[updated as usize - 1].clone();
    assert_eq!(
        listed_natively(&client, updated).await,
        Some((old_peer.clone(), true))
    );
    // Its own URL again changes nothing.
    let same = format!("http://{old_peer}");
    let run = etcdctl(&all, &["member", "update", &hex, "--peer-urls", &same], "");
    assert_eq!(run.code, 0, "{run:?}");

    // A new peer URL, in etcd's order: updated first, then restarted there.
    let new_peer = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{new_peer}");
    let run = etcdctl(&all, &["member", "update", &hex, "--peer-urls", &url], "");
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .starts_with(&format!("Member {updated:16x} updated in cluster ")),
        "{run:?}"
    );
    for (_, endpoint) in &nodes {
        eventually(
            Duration::from_secs(10),
            "every member to list the new peer URL",
            || async {
                (listed_natively(endpoint, updated).await == Some((new_peer.clone(), true)))
                    .then_some(())
            },
        )
        .await;
    }
    let listed = etcdctl(&all, &["member", "list"], "");
    assert!(
        listed.stdout.lines().any(|line| line
            == format!(
                "{hex}, started, node-{updated}, http://{new_peer}, http://{client}, false"
            )),
        "{listed:?}"
    );

    // Restarted listening there (the same data, the same initial cluster),
    // it is reached there: later writes reach it.
    let initial = nodes
        .iter()
        .enumerate()
        .map(|(at, (peer, client))| format!("{}={peer}/{client}", at + 1))
        .collect::<Vec<_>>()
        .join(",");
    let data = cluster.node(updated).data_dir.clone();
    let token = cluster.peer_token_file().map(Path::to_path_buf);
    cluster.kill(updated);
    let _moved = Started::serve(
        updated,
        &data,
        &new_peer,
        &client,
        &["--initial-cluster".to_string(), initial],
        token.as_deref(),
    );
    let survivors: String = [leader, other]
        .iter()
        .map(|id| nodes[*id as usize - 1].1.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let put = etcdctl(&survivors, &["put", "after-the-move", "1"], "");
    assert_eq!(put.code, 0, "{put:?}");
    reads_locally(&client, "after-the-move", "1").await;
    // And it still votes where it is: with one of the others stopped, the
    // two left (it among them) make a quorum.
    let stopped = (1..=3u64)
        .find(|id| *id != updated && cluster.node(*id).child.is_some())
        .expect("another running node");
    cluster.kill(stopped);
    let left = (1..=3u64)
        .find(|id| *id != updated && *id != stopped)
        .expect("the third node");
    let both = format!("{},{client}", nodes[left as usize - 1].1);
    eventually(
        Duration::from_secs(30),
        "a write with two of three, the moved member one of them",
        || async { (etcdctl(&both, &["put", "with-two", "1"], "").code == 0).then_some(()) },
    )
    .await;
    reads_locally(&client, "with-two", "1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_joined_later_reports_the_founders_cluster_id() {
    let _one = exclusive().await;
    let test = "etcd_member_update::a_member_that_joined_later_reports_the_founders_cluster_id";
    if !have_etcdctl(test) {
        return;
    }
    // Snapshots after every few entries, and no log kept behind them: a
    // member joining later is sent a snapshot, not the founding entry.
    let mut flags: Vec<&str> = FAST.to_vec();
    flags.extend(["--snapshot-after-entries", "4", "--log-entries-kept", "0"]);
    let mut cluster = Cluster::start(3, &flags);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let founders: Vec<String> = (1..=3).map(|id| cluster.node(id).client.clone()).collect();
    let all = founders.join(",");
    answering(&all).await;
    all_know_a_leader(&founders).await;
    for i in 0..12 {
        let run = etcdctl(&all, &["put", &format!("k{i}"), "v"], "");
        assert_eq!(run.code, 0, "{run:?}");
    }
    let founded = cluster_id_of(&founders[leader as usize - 1]).await;
    for endpoint in &founders {
        assert_eq!(cluster_id_of(endpoint).await, founded, "{endpoint}");
    }

    // A learner, added through etcd's API, then started to join.
    let (peer, client) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let urls = format!("http://{peer},http://{client}");
    let added = etcdctl(
        &all,
        &[
            "-w",
            "json",
            "member",
            "add",
            "late",
            "--learner",
            "--peer-urls",
            &urls,
        ],
        "",
    );
    assert_eq!(added.code, 0, "{added:?}");
    let added: serde_json::Value = serde_json::from_str(added.stdout.trim()).expect("JSON");
    assert_eq!(
        added["header"]["cluster_id"].as_u64(),
        Some(founded),
        "{added}"
    );
    let id = added["member"]["ID"].as_u64().expect("the new member's ID");
    let data = cluster.dir.path().join("late");
    let token = cluster.peer_token_file().map(Path::to_path_buf);
    let join = ["--join".to_string()];
    let mut late = Started::serve(id, &data, &peer, &client, &join, token.as_deref());
    reads_locally(&client, "k11", "v").await;
    assert_eq!(cluster_id_of(&client).await, founded);
    // The id was in the snapshot it was sent, and stays in its own.
    drop(late);
    late = Started::serve(id, &data, &peer, &client, &join, token.as_deref());
    answering(&client).await;
    assert_eq!(cluster_id_of(&client).await, founded);

    // A learner's new peer URL: removed and added back there, restarted
    // there, it catches up again (and still reports the founders' id).
    let new_peer = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{new_peer}");
    let run = etcdctl(
        &all,
        &["member", "update", &format!("{id:x}"), "--peer-urls", &url],
        "",
    );
    assert_eq!(run.code, 0, "{run:?}");
    for endpoint in &founders {
        eventually(
            Duration::from_secs(10),
            "every founder to list the learner at its new peer URL",
            || async {
                (listed_natively(endpoint, id).await == Some((new_peer.clone(), false)))
                    .then_some(())
            },
        )
        .await;
    }
    drop(late);
    let _late = Started::serve(id, &data, &new_peer, &client, &join, token.as_deref());
    let run = etcdctl(&all, &["put", "after-the-move", "2"], "");
    assert_eq!(run.code, 0, "{run:?}");
    reads_locally(&client, "after-the-move", "2").await;
    assert_eq!(cluster_id_of(&client).await, founded);
}
