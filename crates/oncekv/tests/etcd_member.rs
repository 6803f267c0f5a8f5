//! etcd's Cluster and Maintenance services through Debian's `etcdctl`, on
//! oncekv clusters: the members etcdctl lists, adds, promotes and removes,
//! the leader it moves and the hashes it reads, each checked against what
//! the nodes report through oncekv's own API; and etcd's errors for what
//! etcd refuses.
//!
//! Needs `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-client); without it the tests say so (and fail in CI).

mod support;

use oncekv_harness::testing::on_path;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::{HashRequest, MoveLeaderRequest};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{Cluster, Dependency, FAST, connect, eventually, exclusive, free_port};

/// What one `etcdctl` run printed, and its exit code.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Its output as JSON (`-w json`).
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|error| panic!("not JSON ({error}): {self:?}"))
    }

    /// Asserts it failed with `error` in etcdctl's `Error: ...` line
    /// (etcd's errors alone, others after their gRPC code).
    #[track_caller]
    fn assert_refused(&self, error: &str) {
        assert_ne!(self.code, 0, "{self:?}");
        assert!(
            self.stderr
                .lines()
                .any(|line| line.starts_with("Error: ") && line.contains(error)),
            "expected {error:?}: {self:?}"
        );
    }
}

/// Runs `etcdctl ARGS` against `endpoints` (comma-separated).
fn etcdctl(endpoints: &str, args: &[&str]) -> Run {
    let output = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "--command-timeout", "10s"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run etcdctl");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        // The client's retry warnings are JSON log lines; the error it ends
        // with is what is checked.
        stderr: String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|line| !line.starts_with("{\"level\""))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Whether `etcdctl` is there; if not, the test is reported skipped.
fn have_etcdctl(test: &str) -> bool {
    if on_path("etcdctl").is_some() {
        return true;
    }
    support::missing_dependency(test, Dependency::Etcdctl, "no etcdctl binary on PATH");
    false
}

/// Waits until `endpoint` answers `etcdctl get`.
async fn answering(endpoint: &str) {
    eventually(
        Duration::from_secs(30),
        "etcdctl to be answered",
        || async { (etcdctl(endpoint, &["get", "ready"]).code == 0).then_some(()) },
    )
    .await;
}

/// A member as both APIs describe it: id, peer and client addresses,
/// whether it votes.
type Described = (u64, String, String, bool);

/// The members as etcdctl lists them (`member list -w json`).
fn listed_by_etcd(endpoints: &str) -> BTreeSet<Described> {
    let run = etcdctl(endpoints, &["member", "list", "-w", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    members_of(&run.json()["members"])
}

/// etcd's member messages (JSON) as [`Described`].
fn members_of(members: &serde_json::Value) -> BTreeSet<Described> {
    let address = |urls: &serde_json::Value| {
        urls[0]
            .as_str()
            .and_then(|url| url.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("an http URL: {urls}"))
            .to_string()
    };
    members
        .as_array()
        .unwrap_or_else(|| panic!("members: {members}"))
        .iter()
        .map(|member| {
            (
                member["ID"].as_u64().expect("an ID"),
                address(&member["peerURLs"]),
                address(&member["clientURLs"]),
                member["isLearner"] != true,
            )
        })
        .collect()
}

/// The members as node `address` reports them through oncekv's API.
async fn listed_natively(address: &str) -> BTreeSet<Described> {
    let mut client = connect(address).await.expect("connect");
    let status = client
        .status(oncekv_proto::v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    status
        .members
        .into_iter()
        .map(|member| {
            (
                member.id,
                member.peer_address,
                member.client_address,
                member.voter,
            )
        })
        .collect()
}

/// The members node `address` reports through oncekv's API, once they
/// are as `expected` says (it may not have applied a change yet).
async fn members_become(
    address: &str,
    expected: impl Fn(&BTreeSet<Described>) -> bool,
) -> BTreeSet<Described> {
    eventually(
        Duration::from_secs(10),
        "the membership to change",
        || async {
            let members = listed_natively(address).await;
            expected(&members).then_some(members)
        },
    )
    .await
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

/// An `oncekv serve --join` process, killed by PID when dropped.
struct Joiner(Child);

impl Joiner {
    /// Starts node `id` to join a running cluster at these addresses,
    /// whose peers share the token in `token` (a joining node must
    /// authenticate its peers).
    fn start(
        id: u64,
        data: &std::path::Path,
        peer: &str,
        client: &str,
        token: &std::path::Path,
    ) -> Joiner {
        let log = std::fs::File::create(data.with_extension("log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["serve", "--id", &id.to_string(), "--join", "--data-dir"])
            .arg(data)
            .args(["--listen-client", client, "--listen-peer", peer])
            .arg("--peer-token-file")
            .arg(token)
            .args(FAST)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn the joining node");
        Joiner(child)
    }
}

impl Drop for Joiner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A put's header revision.
fn put_revision(endpoints: &str, key: &str, value: &str) -> u64 {
    let run = etcdctl(endpoints, &["put", key, value, "-w", "json"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.json()["header"]["revision"]
        .as_u64()
        .unwrap_or_else(|| panic!("a revision: {run:?}"))
}

/// What `etcdctl endpoint hashkv` answers on `endpoint` at `revision`:
/// the hash and the compacted revision, or the run that failed.
fn hashkv(endpoint: &str, revision: u64) -> Result<(u64, i64), Run> {
    let run = etcdctl(
        endpoint,
        &[
            "endpoint",
            "hashkv",
            "--rev",
            &revision.to_string(),
            "-w",
            "json",
        ],
    );
    if run.code != 0 {
        return Err(run);
    }
    let answer = &run.json()[0]["HashKV"];
    Ok((
        answer["hash"].as_u64().expect("a hash"),
        answer["compact_revision"]
            .as_i64()
            .expect("a compact revision"),
    ))
}

/// The hash every one of `endpoints` answers at `revision`, once they all
/// have applied it (they must agree).
async fn agreed_hash(endpoints: &[String], revision: u64) -> (u64, i64) {
    eventually(Duration::from_secs(20), "every member's hash", || async {
        let hashes: Vec<(u64, i64)> = endpoints
            .iter()
            .map(|endpoint| hashkv(endpoint, revision).ok())
            .collect::<Option<_>>()?;
        assert!(
            hashes.windows(2).all(|pair| pair[0] == pair[1]),
            "members disagree at revision {revision}: {hashes:?}"
        );
        hashes.first().copied()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_changes_membership_and_moves_the_leader_as_the_nodes_report() {
    let _one = exclusive().await;
    if !have_etcdctl(
        "etcd_member::etcdctl_changes_membership_and_moves_the_leader_as_the_nodes_report",
    ) {
        return;
    }
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let clients: Vec<String> = (1..=3).map(|id| cluster.node(id).client.clone()).collect();
    let all = clients.join(",");
    answering(&all).await;
    // Every member knows the leader (a follower that does not yet answers
    // "no leader" to a change).
    for endpoint in &clients {
        eventually(
            Duration::from_secs(10),
            "every member to know the leader",
            || async { (leader_seen_by(endpoint).await == Some(leader)).then_some(()) },
        )
        .await;
    }

    // The list is the nodes' own membership.
    assert_eq!(listed_by_etcd(&all), listed_natively(&clients[0]).await);
    let simple = etcdctl(&clients[1], &["member", "list"]);
    for id in 1..=3u64 {
        let node = cluster.node(id);
        let line = format!(
            "{id:x}, started, node-{id}, http://{}, http://{}, false",
            node.peer, node.client
        );
        assert!(
            simple.stdout.lines().any(|l| l == line),
            "{line}: {simple:?}"
        );
    }

    // etcd's refusals.
    etcdctl(&all, &["member", "remove", "abcdef"]).assert_refused("etcdserver: member not found");
    etcdctl(&all, &["member", "promote", "1"])
        .assert_refused("etcdserver: can only promote a learner member");
    let taken = format!("http://{},http://127.0.0.1:1", cluster.node(2).peer);
    etcdctl(&all, &["member", "add", "x", "--peer-urls", &taken])
        .assert_refused("etcdserver: Peer URLs already exists");
    let peer_only = format!("http://127.0.0.1:{}", free_port());
    etcdctl(&all, &["member", "add", "x", "--peer-urls", &peer_only])
        .assert_refused("oncekv: a member needs its client URL too");
    etcdctl(&all, &["move-leader", "abcdef"]).assert_refused("etcdserver: bad leader transferee");
    // MoveLeader is the leader's (etcdctl finds it; another client may not).
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let mut maintenance =
        MaintenanceClient::connect(format!("http://{}", cluster.node(follower).client))
            .await
            .expect("connect");
    let refused = maintenance
        .move_leader(MoveLeaderRequest {
            target_id: follower,
        })
        .await
        .expect_err("a follower moves no leader");
    assert_eq!(refused.message(), "etcdserver: not leader", "{refused:?}");
    assert_eq!(listed_by_etcd(&all).len(), 3, "nothing was changed");

    // A learner, added, then started: the id etcd's API answered is the
    // node's id.
    assert_eq!(etcdctl(&all, &["put", "k", "v"]).code, 0);
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
            "joiner",
            "--learner",
            "--peer-urls",
            &urls,
        ],
    );
    assert_eq!(added.code, 0, "{added:?}");
    let added = added.json();
    let id = added["member"]["ID"].as_u64().expect("the new member's ID");
    assert!(id > 3, "{added}");
    assert_eq!(added["member"]["name"], format!("node-{id}"), "{added}");
    let expected_learner = (id, peer.clone(), client.clone(), false);
    assert!(
        members_of(&added["members"]).contains(&expected_learner),
        "{added}"
    );
    for endpoint in &clients {
        members_become(endpoint, |members| members.contains(&expected_learner)).await;
    }
    // Not running yet, so not caught up.
    etcdctl(&all, &["member", "promote", &format!("{id:x}")]).assert_refused(
        "etcdserver: can only promote a learner member which is in sync with leader",
    );
    let token = cluster.peer_token_file().expect("a token cluster");
    let _joiner = Joiner::start(
        id,
        &cluster.dir.path().join("joiner"),
        &peer,
        &client,
        token,
    );
    eventually(
        Duration::from_secs(30),
        "the learner to catch up",
        || async {
            let got = etcdctl(&client, &["get", "k", "--consistency", "s"]);
            (got.stdout == "k\nv\n").then_some(())
        },
    )
    .await;

    // Promoted, it votes.
    let promoted = etcdctl(&all, &["member", "promote", &format!("{id:x}")]);
    assert_eq!(promoted.code, 0, "{promoted:?}");
    assert!(
        promoted
            .stdout
            .starts_with(&format!("Member {id:16x} promoted in cluster ")),
        "{promoted:?}"
    );
    let expected_voter = (id, peer.clone(), client.clone(), true);
    let natively = members_become(&clients[2], |members| {
        members.contains(&expected_voter) && members.len() == 4
    })
    .await;
    let everyone: Vec<String> = clients.iter().cloned().chain([client.clone()]).collect();
    let everywhere = everyone.join(",");
    eventually(
        Duration::from_secs(10),
        "every member to list it",
        || async {
            let lists: Vec<BTreeSet<Described>> = everyone
                .iter()
                .map(|endpoint| listed_by_etcd(endpoint))
                .collect();
            lists.iter().all(|list| list == &natively).then_some(())
        },
    )
    .await;
    etcdctl(&all, &["member", "promote", &format!("{id:x}")])
        .assert_refused("etcdserver: can only promote a learner member");

    // HashKV: every member agrees at a revision, and keeps agreeing on it
    // after later writes (the past is rebuilt from the history).
    let first = put_revision(&everywhere, "h", "1");
    let at_first = agreed_hash(&everyone, first).await;
    assert_eq!(at_first.1, -1, "nothing compacted yet");
    let second = put_revision(&everywhere, "h", "2");
    let at_second = agreed_hash(&everyone, second).await;
    assert_ne!(at_first.0, at_second.0, "a write changes the hash");
    assert_eq!(agreed_hash(&everyone, first).await, at_first);
    let future = hashkv(&client, second + 1_000_000).expect_err("a future revision");
    assert!(
        future
            .stderr
            .contains("etcdserver: mvcc: required revision is a future revision"),
        "{future:?}"
    );
    assert_eq!(
        etcdctl(&everywhere, &["compact", &second.to_string()]).code,
        0
    );
    let compacted = eventually(Duration::from_secs(20), "the compaction", || async {
        hashkv(&clients[0], first).err()
    })
    .await;
    assert!(
        compacted
            .stderr
            .contains("etcdserver: mvcc: required revision has been compacted"),
        "{compacted:?}"
    );
    let after = agreed_hash(&everyone, second).await;
    assert_eq!(after.0, at_second.0);
    assert!(
        after.1 >= i64::try_from(second).expect("a revision"),
        "{after:?}"
    );

    // Hash: the node's own state digest, folded to 32 bits, at the same
    // applied index.
    let maintenance = MaintenanceClient::connect(format!("http://{client}"))
        .await
        .expect("connect");
    eventually(Duration::from_secs(20), "a hash at a quiet index", || {
        let mut maintenance = maintenance.clone();
        let client = client.clone();
        async move {
            let hash = maintenance.hash(HashRequest {}).await.ok()?.into_inner();
            let mut native = connect(&client).await.ok()?;
            let digest = native
                .state_digest(oncekv_proto::v1::StateDigestRequest {})
                .await
                .ok()?
                .into_inner();
            let revision = u64::try_from(hash.header?.revision).ok()?;
            if digest.applied_index != Some(revision) {
                return None;
            }
            let folded = (digest.digest >> 32) ^ (digest.digest & 0xffff_ffff);
            assert_eq!(u64::from(hash.hash), folded);
            Some(())
        }
    })
    .await;

    // The leader moves to the new member, back, and to it again: it is
    // removed as the leader below.
    for target in [id, leader, id] {
        let from = eventually(Duration::from_secs(10), "a leader", || async {
            leader_seen_by(&client).await
        })
        .await;
        let moved = etcdctl(&everywhere, &["move-leader", &format!("{target:x}")]);
        assert_eq!(moved.code, 0, "{moved:?}");
        assert_eq!(
            moved.stdout,
            format!("Leadership transferred from {from:x} to {target:x}\n"),
            "{moved:?}"
        );
        for endpoint in &everyone {
            eventually(
                Duration::from_secs(10),
                "every member to follow",
                || async { (leader_seen_by(endpoint).await == Some(target)).then_some(()) },
            )
            .await;
        }
    }

    // Removed while it leads (it hands leadership to another voter first,
    // which removes it: one call), it is gone from both lists.
    let removed = etcdctl(&all, &["member", "remove", &format!("{id:x}")]);
    assert_eq!(removed.code, 0, "{removed:?}");
    assert!(
        removed
            .stdout
            .starts_with(&format!("Member {id:16x} removed from cluster ")),
        "{removed:?}"
    );
    for endpoint in &clients {
        let natively = members_become(endpoint, |members| members.len() == 3).await;
        assert!(natively.iter().all(|member| member.0 != id), "{natively:?}");
        assert_eq!(listed_by_etcd(endpoint), natively);
    }

    // A voter added directly (not running: the three running voters still
    // make a quorum of four), then removed.
    let (peer, client) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let urls = format!("http://{peer},http://{client}");
    let added = etcdctl(
        &all,
        &["-w", "json", "member", "add", "voter", "--peer-urls", &urls],
    );
    assert_eq!(added.code, 0, "{added:?}");
    let voter = added.json()["member"]["ID"].as_u64().expect("an ID");
    assert!(voter > id, "ids are not given twice: {voter} after {id}");
    let expected = (voter, peer, client, true);
    for endpoint in &clients {
        members_become(endpoint, |members| members.contains(&expected)).await;
    }
    let removed = etcdctl(&all, &["member", "remove", &format!("{voter:x}")]);
    assert_eq!(removed.code, 0, "{removed:?}");
    for endpoint in &clients {
        members_become(endpoint, |members| members.len() == 3).await;
    }
    assert_eq!(etcdctl(&all, &["put", "k", "after"]).code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_member_cluster_grows_by_a_learner_not_an_unstarted_voter_and_only_root_changes_it() {
    let _one = exclusive().await;
    if !have_etcdctl(
        "etcd_member::a_one_member_cluster_grows_by_a_learner_not_an_unstarted_voter_and_only_root_changes_it",
    ) {
        return;
    }
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();
    answering(&endpoint).await;
    let urls = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        free_port(),
        free_port()
    );
    // With it, the cluster would need two running voters to commit.
    etcdctl(&endpoint, &["member", "add", "two", "--peer-urls", &urls])
        .assert_refused("etcdserver: re-configuration failed due to not enough started members");
    // The only voter cannot be removed either.
    etcdctl(&endpoint, &["member", "remove", "1"])
        .assert_refused("etcdserver: re-configuration failed due to not enough started members");
    assert_eq!(listed_by_etcd(&endpoint).len(), 1);
    // A learner that never runs is added and removed freely.
    let added = etcdctl(
        &endpoint,
        &[
            "-w",
            "json",
            "member",
            "add",
            "two",
            "--learner",
            "--peer-urls",
            &urls,
        ],
    );
    assert_eq!(added.code, 0, "{added:?}");
    let id = added.json()["member"]["ID"].as_u64().expect("an ID");
    members_become(&endpoint, |members| members.len() == 2).await;
    let removed = etcdctl(&endpoint, &["member", "remove", &format!("{id:x}")]);
    assert_eq!(removed.code, 0, "{removed:?}");
    let natively = members_become(&endpoint, |members| members.len() == 1).await;
    assert_eq!(listed_by_etcd(&endpoint), natively);

    // With authentication enforced, membership, hashes and the leader
    // are root's (the admin role's).
    for args in [
        &[
            "user",
            "add",
            "alice",
            "--new-user-password=pw",
            "--interactive=false",
        ][..],
        &[
            "user",
            "add",
            "root",
            "--new-user-password=rootpw",
            "--interactive=false",
        ],
        &["auth", "enable"],
    ] {
        let run = etcdctl(&endpoint, args);
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
    }
    let (root, alice) = ("--user=root:rootpw", "--user=alice:pw");
    for args in [
        &["member", "add", "two", "--learner", "--peer-urls", &urls][..],
        &["member", "remove", "1"],
        &["member", "promote", "1"],
        &["move-leader", "1"],
        &["endpoint", "hashkv"],
    ] {
        let with_alice: Vec<&str> = [alice].into_iter().chain(args.iter().copied()).collect();
        etcdctl(&endpoint, &with_alice).assert_refused("etcdserver: permission denied");
    }
    let added = etcdctl(
        &endpoint,
        &[
            root,
            "-w",
            "json",
            "member",
            "add",
            "two",
            "--learner",
            "--peer-urls",
            &urls,
        ],
    );
    assert_eq!(added.code, 0, "{added:?}");
    let id = added.json()["member"]["ID"].as_u64().expect("an ID");
    assert!(id > 1, "{added:?}");
    let removed = etcdctl(&endpoint, &[root, "member", "remove", &format!("{id:x}")]);
    assert_eq!(removed.code, 0, "{removed:?}");
    let moved = etcdctl(&endpoint, &[root, "move-leader", "1"]);
    assert_eq!(
        moved.stdout, "Leadership transferred from 1 to 1\n",
        "{moved:?}"
    );
    let hashed = etcdctl(&endpoint, &[root, "endpoint", "hashkv"]);
    assert_eq!(hashed.code, 0, "{hashed:?}");
}
