//! etcd's MemberUpdate and cluster id, through Debian's `etcdctl` and
//! etcd's gRPC API.
//!
//! Compared with etcd itself: the same `etcdctl member update` commands
//! run against a real one-member etcd and against a one-member oncekv
//! cluster (the member's peer URL updated, plain and as JSON, the same URL
//! again, an unknown member, URLs that do not parse, a learner's peer URL,
//! and `member list` after the update and after the learner is removed),
//! and their outputs, exit codes and error texts must be equal once ids,
//! names, cluster ids and client URLs are normalised.
//!
//! On oncekv clusters alone:
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
//! Needs `etcdctl` on PATH, and `etcd` for the comparison
//! (scripts/setup.sh installs Debian's etcd-client and etcd-server);
//! without them the tests say so (and fail in CI).

mod support;

use oncekv_harness::testing::on_path;
use oncekv_proto::etcd::etcdserverpb::RangeRequest;
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::etcdctl::{Run, answering, etcdctl, reference};
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

/// The URLs both servers are given, the same on each: nothing listens at
/// them (a one-member cluster whose member records a new peer URL keeps
/// serving where it runs, and an added learner is never started).
struct Urls {
    moved: String,
    learner_peer: String,
    learner_client: String,
}

/// The members of one server's transcript, in the order it met them, with
/// their names, and its cluster id and client URL: what legitimately
/// differs between etcd and oncekv (etcd draws ids at random, oncekv
/// counts them; etcd's member is named by its `--name`, oncekv's
/// `node-<id>`), written the same for both.
struct Ids {
    members: Vec<(u64, String)>,
    cluster: u64,
    client: String,
}

impl Ids {
    /// The placeholder for member `id` and for its name, if it is known.
    fn label(&self, id: u64) -> Option<(String, &str)> {
        let at = self.members.iter().position(|(known, _)| *known == id)?;
        Some((format!("member-{}", at + 1), &self.members[at].1))
    }

    /// `run` with ids, names and the client URL written alike.
    fn run(&self, run: Run) -> Run {
        Run {
            code: run.code,
            stdout: self.text(&run.stdout),
            stderr: self.text(&run.stderr),
        }
    }

    fn text(&self, text: &str) -> String {
        let mut lines: Vec<String> = text.lines().map(|line| self.line(line)).collect();
        if text.ends_with('\n') {
            lines.push(String::new());
        }
        lines.join("\n")
    }

    fn line(&self, line: &str) -> String {
        if let Ok(mut value) = serde_json::from_str::<serde_json::Value>(line) {
            if let serde_json::Value::Object(map) = &mut value {
                map.remove("header");
                if let Some(serde_json::Value::Array(members)) = map.get_mut("members") {
                    members.iter_mut().for_each(|member| self.member(member));
                }
            }
            return value.to_string();
        }
        // `member list`: ID, status, name, peer URLs, client URLs, learner.
        let mut fields: Vec<String> = line.split(", ").map(ToString::to_string).collect();
        if fields.len() == 6
            && let Some((label, name)) = u64::from_str_radix(&fields[0], 16)
                .ok()
                .and_then(|id| self.label(id))
        {
            if fields[2] == name {
                fields[2] = format!("name-of-{label}");
            }
            fields[0] = label;
            if fields[4] == self.client {
                fields[4] = "CLIENT-URL".to_string();
            }
            return fields.join(", ");
        }
        // `Member ID updated in cluster ID`, `... removed from cluster ID`:
        // etcdctl pads both to 16 hex digits.
        let mut line = line.replace(&format!("cluster {:16x}", self.cluster), "cluster CLUSTER");
        for (id, _) in &self.members {
            if let Some((label, _)) = self.label(*id) {
                line = line.replace(&format!("Member {id:16x} "), &format!("Member {label} "));
            }
        }
        line
    }

    /// A member in etcd's JSON.
    fn member(&self, member: &mut serde_json::Value) {
        let Some((label, name)) = member["ID"].as_u64().and_then(|id| self.label(id)) else {
            return;
        };
        if member["name"] == name {
            member["name"] = format!("name-of-{label}").into();
        }
        member["ID"] = label.into();
        if let Some(urls) = member["clientURLs"].as_array_mut() {
            for url in urls.iter_mut().filter(|url| **url == *self.client) {
                *url = "CLIENT-URL".into();
            }
        }
    }
}

/// The members `endpoint` lists (`member list -w json`), once `expected`
/// holds for them (a change is answered before every view shows it).
async fn members_become(
    endpoint: &str,
    what: &str,
    expected: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    eventually(Duration::from_secs(10), what, || async {
        let run = etcdctl(endpoint, &["-w", "json", "member", "list"], "");
        let listed: serde_json::Value = serde_json::from_str(run.stdout.trim()).ok()?;
        let members = listed["members"].as_array()?;
        expected(members).then(|| members.clone())
    })
    .await
}

/// The peer URLs `member` (etcd's JSON) has.
fn peer_urls(member: &serde_json::Value) -> Vec<&str> {
    member["peerURLs"]
        .as_array()
        .map(|urls| urls.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default()
}

/// What `etcdctl` prints on the one-member cluster at `endpoint` for each
/// step of the script, normalised ([`Ids`]), with the step as shown
/// (`ID` for the member's id, `LEARNER` for the learner's): its member's
/// peer URL updated to `urls.moved` (plain and as JSON, twice), an
/// unknown member, URLs that do not parse, the listing and a write after
/// it, the URL of a learner added for the purpose, the learner removed,
/// and the listing again.
async fn update_transcript(endpoint: &str, urls: &Urls) -> Vec<(String, Run)> {
    let listed = etcdctl(endpoint, &["-w", "json", "member", "list"], "");
    assert_eq!(listed.code, 0, "{listed:?}");
    let listed: serde_json::Value = serde_json::from_str(listed.stdout.trim()).expect("JSON");
    let [member] = listed["members"].as_array().expect("members").as_slice() else {
        panic!("one member: {listed}");
    };
    let own = member["ID"].as_u64().expect("an ID");
    let mut ids = Ids {
        members: vec![(own, member["name"].as_str().unwrap_or_default().to_string())],
        cluster: listed["header"]["cluster_id"]
            .as_u64()
            .expect("a cluster id"),
        client: format!("http://{endpoint}"),
    };
    let id = format!("{own:x}");
    let mut transcript = Vec::new();
    let mut step = |args: &[&str], ids: &Ids, learner: &str| {
        let shown = args
            .iter()
            .map(|arg| match *arg {
                arg if arg == id => "ID",
                arg if arg == learner => "LEARNER",
                arg => arg,
            })
            .collect::<Vec<_>>()
            .join(" ");
        transcript.push((shown, ids.run(etcdctl(endpoint, args, ""))));
    };
    let moved = urls.moved.as_str();
    let own_moved = |members: &[serde_json::Value]| {
        members
            .iter()
            .any(|member| member["ID"] == own && peer_urls(member) == [moved])
    };

    step(&["member", "update", &id, "--peer-urls", moved], &ids, "");
    members_become(endpoint, "the new peer URL listed", own_moved).await;
    // The same URL again.
    step(&["member", "update", &id, "--peer-urls", moved], &ids, "");
    step(
        &["-w", "json", "member", "update", &id, "--peer-urls", moved],
        &ids,
        "",
    );
    step(
        &[
            "member",
            "update",
            "abcdef",
            "--peer-urls",
            "http://127.0.0.1:1",
        ],
        &ids,
        "",
    );
    // URLs that do not parse (etcdctl itself refuses them, as etcd does).
    // Not among them: a URL without a host (`http://:1`), which etcd
    // records and oncekv refuses (a member's address needs a host).
    for bad in [
        "not a url",
        "127.0.0.1:5",
        "http://127.0.0.1",
        "ftp://127.0.0.1:5",
        "http://%zz",
    ] {
        step(&["member", "update", &id, "--peer-urls", bad], &ids, "");
    }
    step(&["member", "list"], &ids, "");
    step(&["-w", "json", "member", "list"], &ids, "");
    step(&["put", "after-the-update", "1"], &ids, "");

    // Another member's peer URL: a learner's, added for it (not compared:
    // etcd reads both URLs as the learner's peer URLs, oncekv the second
    // as its client URL, and etcd lists it unstarted and unnamed).
    let both = format!("{},{}", urls.learner_peer, urls.learner_client);
    let added = etcdctl(
        endpoint,
        &[
            "-w",
            "json",
            "member",
            "add",
            "learner",
            "--learner",
            "--peer-urls",
            &both,
        ],
        "",
    );
    assert_eq!(added.code, 0, "{added:?}");
    let added: serde_json::Value = serde_json::from_str(added.stdout.trim()).expect("JSON");
    let learner_id = added["member"]["ID"].as_u64().expect("the learner's ID");
    ids.members.push((
        learner_id,
        added["member"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ));
    let learner = format!("{learner_id:x}");
    members_become(endpoint, "the learner listed", |members| members.len() == 2).await;
    let taken = urls.learner_peer.as_str();
    step(
        &["member", "update", &id, "--peer-urls", taken],
        &ids,
        &learner,
    );
    step(&["member", "remove", &learner], &ids, &learner);
    members_become(endpoint, "the learner gone", |members| members.len() == 1).await;
    step(&["member", "list"], &ids, &learner);
    step(&["-w", "json", "member", "list"], &ids, &learner);
    transcript
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_updates_a_members_peer_url_on_oncekv_as_on_etcd() {
    let _one = exclusive().await;
    let Some(etcd) =
        reference("etcd_member_update::etcdctl_updates_a_members_peer_url_on_oncekv_as_on_etcd")
    else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;
    let url = || format!("http://127.0.0.1:{}", free_port());
    let urls = Urls {
        moved: url(),
        learner_peer: url(),
        learner_client: url(),
    };

    let expected = update_transcript(&etcd.endpoint, &urls).await;
    let actual = update_transcript(&oncekv, &urls).await;
    assert_eq!(expected.len(), actual.len());
    for ((command, want), (_, got)) in expected.iter().zip(&actual) {
        assert_eq!(
            got,
            want,
            "{command}: oncekv (left) differs from etcd (right)\netcd log:\n{}",
            etcd.log()
        );
    }
    // What both printed is what was meant: the update made and listed,
    // each refusal etcd's.
    let printed = |shown: &str| {
        actual
            .iter()
            .filter(|(command, _)| command == shown)
            .map(|(_, run)| run)
            .collect::<Vec<_>>()
    };
    let updated = format!("member update ID --peer-urls {}", urls.moved);
    for run in printed(&updated) {
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (0, "Member member-1 updated in cluster CLUSTER\n"),
            "{run:?}"
        );
    }
    let listed = format!(
        "member-1, started, name-of-member-1, {}, CLIENT-URL, false\n",
        urls.moved
    );
    let lists = printed("member list");
    assert_eq!(lists.len(), 2);
    for run in lists {
        assert_eq!(run.stdout, listed, "{run:?}");
    }
    let refusals = [
        (
            "member update abcdef --peer-urls http://127.0.0.1:1".to_string(),
            "Error: etcdserver: member not found",
        ),
        (
            format!("member update ID --peer-urls {}", urls.learner_peer),
            "Error: etcdserver: Peer URLs already exists",
        ),
        (
            "member update ID --peer-urls not a url".to_string(),
            "Error: URL scheme must be http, https, unix, or unixs: not a url",
        ),
    ];
    for (shown, error) in refusals {
        let runs = printed(&shown);
        assert_eq!(runs.len(), 1, "{shown}");
        assert_eq!(
            (runs[0].code, runs[0].stderr.as_str()),
            (1, error),
            "{shown}"
        );
    }
}
