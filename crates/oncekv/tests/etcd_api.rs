//! etcd's v3 API, compared with etcd itself: Debian's `etcdctl` runs the
//! same commands against a real one-member etcd and against an oncekv
//! node, and their outputs, with ids, terms and revisions normalised, must
//! be equal (and so must exit codes and error texts). Then the one thing
//! etcd cannot do: a transaction resent with the `oncekv-idempotency-key`
//! metadata is applied once and answered with its first response.
//!
//! Needs `etcd` and `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-server and etcd-client); without them the test says so (and fails
//! in CI).

mod support;

use oncekv_harness::testing::on_path;
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::etcdctl::{Normaliser, Run, answering, etcdctl, is_lease_id, reference};
use support::{Cluster, Dependency, FAST, eventually, exclusive, missing_dependency};

/// One step of the script: `etcdctl` arguments and what it reads.
struct Step {
    args: Vec<String>,
    stdin: &'static str,
}

fn step(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(ToString::to_string).collect(),
        stdin: "",
    }
}

/// The script both servers run, in order.
fn script() -> Vec<Step> {
    let txn = |stdin: &'static str, json: bool| Step {
        args: if json {
            vec!["txn".into(), "-w".into(), "json".into()]
        } else {
            vec!["txn".into()]
        },
        stdin,
    };
    vec![
        step(&["put", "a", "1"]),
        step(&["put", "a", "2", "--prev-kv"]),
        step(&["put", "a", "3", "--prev-kv", "-w", "json"]),
        step(&["get", "a"]),
        step(&["get", "a", "-w", "json"]),
        step(&["get", "a", "-w", "fields"]),
        step(&["get", "a", "--print-value-only"]),
        step(&["get", "a", "--hex"]),
        step(&["get", "a", "--consistency", "s"]),
        step(&["put", "ab", "x"]),
        step(&["put", "abc", "y"]),
        step(&["put", "b", "z"]),
        step(&["get", "a", "--prefix"]),
        step(&["get", "a", "--prefix", "-w", "json"]),
        step(&["get", "a", "--prefix", "--keys-only"]),
        step(&["get", "a", "--prefix", "--limit", "2", "-w", "json"]),
        step(&[
            "get",
            "a",
            "--prefix",
            "--order",
            "ASCEND",
            "--sort-by",
            "KEY",
        ]),
        step(&["get", "", "--prefix", "--print-value-only"]),
        step(&["get", "", "--prefix", "--limit", "1", "-w", "json"]),
        step(&["get", "missing"]),
        step(&["get", "missing", "-w", "json"]),
        step(&["del", "missing"]),
        step(&["del", "ab", "--prev-kv"]),
        step(&["del", "ab", "--prev-kv", "-w", "json"]),
        step(&["put", "ab", "again"]),
        step(&["del", "a", "--prefix", "--prev-kv", "-w", "json"]),
        step(&["get", "", "--prefix", "-w", "json"]),
        txn(
            "value(\"b\") = \"z\"\n\nput t1 yes\nget b\n\nput t1 no\n\n",
            false,
        ),
        txn(
            "value(\"b\") = \"other\"\n\nput t2 yes\n\nput t2 no\nget t1\n\n",
            true,
        ),
        txn(
            "version(\"b\") = \"1\"\nmod(\"t1\") > \"0\"\n\ndel t2\n\n\n",
            false,
        ),
        txn("create(\"missing\") = \"0\"\n\nput c 1\n\n\n", true),
        txn("value(\"b\") != \"z\"\n\n\nget b --prefix\n\n", true),
        step(&["lease", "grant", "60"]),
        step(&["put", "leased", "v", "--lease", "{lease}"]),
        step(&["get", "leased", "-w", "json"]),
        step(&["get", "lease", "--prefix", "-w", "json"]),
        step(&["lease", "timetolive", "{lease}"]),
        step(&["lease", "timetolive", "{lease}", "--keys"]),
        step(&["lease", "list"]),
        step(&["lease", "keep-alive", "--once", "{lease}"]),
        step(&["lease", "revoke", "{lease}"]),
        step(&["get", "leased"]),
        step(&["lease", "timetolive", "{lease}"]),
        step(&["lease", "revoke", "{lease}"]),
        step(&["put", "orphan", "v", "--lease", "1234"]),
        step(&["lease", "list"]),
        step(&["alarm", "list"]),
        step(&["alarm", "disarm"]),
        step(&["defrag"]),
        step(&["put", "", "empty"]),
        step(&["put", "a-end", "sentinel"]),
        step(&["get", "", "-w", "json"]),
        step(&["get", "", "--prefix", "--keys-only"]),
    ]
}

/// Runs the script against `endpoint`; returns each step's normalised
/// output.
fn transcript(endpoint: &str) -> Vec<(String, Run)> {
    let mut normaliser = Normaliser::default();
    // The lease the script granted last, in this server's IDs.
    let mut lease = String::new();
    script()
        .into_iter()
        .map(|step| {
            let args: Vec<String> = step
                .args
                .iter()
                .map(|arg| arg.replace("{lease}", &lease))
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut run = etcdctl(endpoint, &args, step.stdin);
            if let Some(granted) = run
                .stdout
                .strip_prefix("lease ")
                .and_then(|rest| rest.split(' ').next())
                .filter(|id| is_lease_id(id) && run.stdout.contains(" granted "))
            {
                lease = granted.to_string();
            }
            run.stdout = normaliser.text(&run.stdout.replace(endpoint, "ENDPOINT"));
            run.stderr = normaliser.words(&run.stderr.replace(endpoint, "ENDPOINT"));
            (format!("etcdctl {}", step.args.join(" ")), run)
        })
        .collect()
}

/// The lines `etcdctl watch ARGS` prints on `endpoint` up to and with the
/// first line equal to `last` (within 30 s); the watch is then stopped.
fn watch_until(endpoint: &str, args: &[&str], last: &str) -> Vec<String> {
    let mut command = vec!["watch"];
    command.extend_from_slice(args);
    run_until(endpoint, &command, last)
}

/// The lines `etcdctl ARGS` prints on `endpoint` up to and with the first
/// line equal to `last` (within 30 s); the command is then stopped.
fn run_until(endpoint: &str, args: &[&str], last: &str) -> Vec<String> {
    use std::io::BufRead;
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl watch");
    let stdout = child.stdout.take().expect("stdout");
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        let Ok(line) = lines.recv_timeout(left) else {
            break;
        };
        let done = line == last;
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        seen.last().map(String::as_str),
        Some(last),
        "etcdctl {args:?} on {endpoint} printed {seen:?}"
    );
    seen
}

/// The header revision of a read of `key` (everything up to it applied).
fn header_revision(endpoint: &str, key: &str) -> i64 {
    let run = etcdctl(endpoint, &["get", key, "-w", "json"], "");
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json");
    json["header"]["revision"]
        .as_i64()
        .expect("a header revision")
}

/// The mod revision of `key`, as `etcdctl get -w json` shows it.
fn mod_revision(endpoint: &str, key: &str) -> i64 {
    let run = etcdctl(endpoint, &["get", key, "-w", "json"], "");
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json");
    json["kvs"][0]["mod_revision"]
        .as_i64()
        .expect("a mod revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_sees_the_same_answers_from_oncekv_as_from_etcd() {
    let _one = exclusive().await;
    let Some(etcd) = reference("etcd_api::etcdctl_sees_the_same_answers_from_oncekv_as_from_etcd")
    else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;

    let expected = transcript(&etcd.endpoint);
    let actual = transcript(&oncekv);
    for ((command, want), (_, got)) in expected.iter().zip(&actual) {
        assert_eq!(
            got,
            want,
            "{command}: oncekv (left) differs from etcd (right)\netcd log:\n{}",
            etcd.log()
        );
    }

    // Watches: the whole history of a prefix (with and without the
    // previous values), and a watch from the next revision that sees a
    // put and a delete made after it started.
    for args in [
        &["a", "--prefix", "--rev", "1"][..],
        &["a", "--prefix", "--rev", "1", "--prev-kv"][..],
    ] {
        let want = watch_until(&etcd.endpoint, args, "sentinel");
        let got = watch_until(&oncekv, args, "sentinel");
        assert_eq!(
            got, want,
            "etcdctl watch {args:?}: oncekv (left), etcd (right)"
        );
    }
    let mut live = Vec::new();
    for endpoint in [etcd.endpoint.clone(), oncekv.clone()] {
        let from = (header_revision(&endpoint, "live") + 1).to_string();
        let watching = endpoint.clone();
        let watcher = std::thread::spawn(move || {
            watch_until(&watching, &["live", "--rev", &from, "--prev-kv"], "gone")
        });
        for args in [["put", "live", "here"], ["put", "live", "gone"]] {
            etcdctl(&endpoint, &args, "");
        }
        live.push(watcher.join().expect("the watcher"));
    }
    assert_eq!(
        live[1], live[0],
        "a live watch: oncekv (left), etcd (right)"
    );

    // Compaction: revisions differ between the two, so each compacts at
    // its own current revision of `b`, and a read below it is refused
    // with etcd's error.
    let mut compacted_watches = Vec::new();
    for endpoint in [&etcd.endpoint, &oncekv] {
        let before = mod_revision(endpoint, "b");
        etcdctl(endpoint, &["put", "b", "later"], "");
        let now = mod_revision(endpoint, "b");
        let compacted = etcdctl(endpoint, &["compaction", &now.to_string()], "");
        assert_eq!(compacted.code, 0, "{endpoint}: {compacted:?}");
        assert_eq!(compacted.stdout.trim(), format!("compacted revision {now}"));
        let old = etcdctl(endpoint, &["get", "b", "--rev", &before.to_string()], "");
        assert_eq!(
            (old.code, old.stderr.trim()),
            (
                1,
                "Error: etcdserver: mvcc: required revision has been compacted"
            ),
            "{endpoint}"
        );
        let current = etcdctl(endpoint, &["get", "b", "--rev", &now.to_string()], "");
        assert_eq!(current.stdout, "b\nlater\n", "{endpoint}");
        // The compaction revision itself is kept: just below it is
        // refused, and a watch from it replays the change made at it.
        let below = etcdctl(endpoint, &["get", "b", "--rev", &(now - 1).to_string()], "");
        assert_eq!(
            (below.code, below.stderr.trim()),
            (
                1,
                "Error: etcdserver: mvcc: required revision has been compacted"
            ),
            "{endpoint}"
        );
        let replayed = watch_until(endpoint, &["b", "--rev", &now.to_string()], "later");
        assert_eq!(replayed, ["PUT", "b", "later"], "{endpoint}");
        // A watch from a compacted revision is cancelled, saying so.
        compacted_watches.push(etcdctl(
            endpoint,
            &["watch", "b", "--rev", &before.to_string()],
            "",
        ));
    }
    assert_eq!(
        compacted_watches[1], compacted_watches[0],
        "a watch from a compacted revision: oncekv (left), etcd (right)"
    );

    // Status: the fields etcdctl shows are there, and say who leads.
    let status = etcdctl(&oncekv, &["endpoint", "status", "-w", "json"], "");
    let status: serde_json::Value = serde_json::from_str(status.stdout.trim()).expect("json");
    let status = &status[0]["Status"];
    assert_eq!(status["leader"], status["header"]["member_id"], "{status}");
    assert!(status["raftAppliedIndex"].as_u64() > Some(0), "{status}");
    assert!(status["version"].as_str().is_some(), "{status}");
}

/// A guarded transaction: if `key` holds `expected`, put `new`.
fn swap(key: &str, expected: &str, new: &str) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::Value(expected.as_bytes().to_vec())),
        }],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.as_bytes().to_vec(),
                value: new.as_bytes().to_vec(),
                ..PutRequest::default()
            })),
        }],
        failure: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_txn_resent_with_an_idempotency_key_applies_once() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = format!("http://{}", cluster.node(1).client);
    let mut kv = KvClient::connect(address).await.expect("connect");
    kv.put(PutRequest {
        key: b"counter".to_vec(),
        value: b"1".to_vec(),
        ..PutRequest::default()
    })
    .await
    .expect("put");

    let keyed = |txn: TxnRequest, key: &str| {
        let mut request = tonic::Request::new(txn);
        request.metadata_mut().insert(
            oncekv_proto::IDEMPOTENCY_KEY_METADATA,
            key.parse().expect("metadata value"),
        );
        request
    };
    // The first send applies; the resend (its reply lost, say) is answered
    // with the first response, header revision included, and applies
    // nothing.
    let first = kv
        .txn(keyed(swap("counter", "1", "2"), "swap-1-to-2"))
        .await
        .expect("txn")
        .into_inner();
    assert!(first.succeeded);
    let resent = kv
        .txn(keyed(swap("counter", "1", "2"), "swap-1-to-2"))
        .await
        .expect("txn")
        .into_inner();
    assert_eq!(resent, first);
    // Meanwhile another writer moves it on; the resend still answers the
    // original success and does not put 2 back.
    kv.put(PutRequest {
        key: b"counter".to_vec(),
        value: b"3".to_vec(),
        ..PutRequest::default()
    })
    .await
    .expect("put");
    let late = kv
        .txn(keyed(swap("counter", "1", "2"), "swap-1-to-2"))
        .await
        .expect("txn")
        .into_inner();
    assert_eq!(late, first);
    let value = kv
        .range(RangeRequest {
            key: b"counter".to_vec(),
            ..RangeRequest::default()
        })
        .await
        .expect("range")
        .into_inner();
    assert_eq!(value.kvs[0].value, b"3");

    // Without the key a resend is a new transaction, as on etcd: it runs
    // again (and here fails its compare).
    let plain = kv
        .txn(swap("counter", "3", "4"))
        .await
        .expect("txn")
        .into_inner();
    assert!(plain.succeeded);
    let again = kv
        .txn(swap("counter", "3", "4"))
        .await
        .expect("txn")
        .into_inner();
    assert!(!again.succeeded);

    // The same key for another request is refused, not applied.
    let reused = kv
        .txn(keyed(swap("counter", "4", "5"), "swap-1-to-2"))
        .await
        .expect_err("a reused key");
    assert_eq!(reused.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_lease_grant_resent_with_an_idempotency_key_grants_one_lease() {
    use oncekv_proto::etcd::etcdserverpb::lease_client::LeaseClient;
    use oncekv_proto::etcd::etcdserverpb::{LeaseGrantRequest, LeaseLeasesRequest};
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = format!("http://{}", cluster.node(1).client);
    let mut leases = LeaseClient::connect(address).await.expect("connect");
    let grant = |key: Option<&str>| {
        let mut request = tonic::Request::new(LeaseGrantRequest { ttl: 60, id: 0 });
        if let Some(key) = key {
            request.metadata_mut().insert(
                oncekv_proto::IDEMPOTENCY_KEY_METADATA,
                key.parse().expect("metadata value"),
            );
        }
        request
    };
    // The classic double grant: the reply to the first is lost and the
    // client sends it again. With the key, one lease, one answer.
    let first = leases
        .lease_grant(grant(Some("job-7")))
        .await
        .expect("grant");
    let again = leases
        .lease_grant(grant(Some("job-7")))
        .await
        .expect("grant");
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(first.get_ref().ttl, 60);
    let listed = leases
        .lease_leases(LeaseLeasesRequest {})
        .await
        .expect("leases")
        .into_inner();
    assert_eq!(listed.leases.len(), 1, "{listed:?}");
    // Without it, each send is a grant of its own, as on etcd.
    leases.lease_grant(grant(None)).await.expect("grant");
    leases.lease_grant(grant(None)).await.expect("grant");
    let listed = leases
        .lease_leases(LeaseLeasesRequest {})
        .await
        .expect("leases")
        .into_inner();
    assert_eq!(listed.leases.len(), 3, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_accepts_every_etcd_call() {
    let _one = exclusive().await;
    if on_path("etcdctl").is_none() {
        missing_dependency(
            "etcd_api::every_member_accepts_every_etcd_call",
            Dependency::Etcdctl,
            "no etcdctl binary on PATH",
        );
        return;
    }
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let followers: Vec<String> = (1..=3)
        .filter(|id| *id != leader)
        .map(|id| cluster.node(id).client.clone())
        .collect();
    let (one, other) = (&followers[0], &followers[1]);
    answering(one).await;

    // Writes and linearizable reads through followers: forwarded to the
    // leader, answered as it answers.
    let put = etcdctl(one, &["put", "k", "v1"], "");
    assert_eq!((put.code, put.stdout.as_str()), (0, "OK\n"), "{put:?}");
    let got = etcdctl(other, &["get", "k"], "");
    assert_eq!(got.stdout, "k\nv1\n", "{got:?}");
    let txn = etcdctl(other, &["txn"], "value(\"k\") = \"v1\"\n\nput k v2\n\n\n");
    assert_eq!(txn.stdout, "SUCCESS\n\nOK\n", "{txn:?}");
    let granted = etcdctl(one, &["lease", "grant", "60"], "");
    let id = granted
        .stdout
        .split(' ')
        .nth(1)
        .filter(|id| is_lease_id(id))
        .unwrap_or_else(|| panic!("{granted:?}"))
        .to_string();
    let kept = etcdctl(other, &["lease", "keep-alive", "--once", &id], "");
    assert_eq!(
        kept.stdout,
        format!("lease {id} keepalived with TTL(60)\n"),
        "{kept:?}"
    );
    let put = etcdctl(other, &["put", "leased", "x", "--lease", &id], "");
    assert_eq!(put.code, 0, "{put:?}");
    // A watch on a follower sees what was written through the other one.
    let from = header_revision(one, "k").to_string();
    let watching = one.clone();
    let watcher = std::thread::spawn(move || watch_until(&watching, &["k", "--rev", &from], "v3"));
    let put = etcdctl(other, &["put", "k", "v3"], "");
    assert_eq!(put.code, 0, "{put:?}");
    let seen = watcher.join().expect("the watcher");
    assert_eq!(seen.last().map(String::as_str), Some("v3"), "{seen:?}");
    // Every member lists every member, with the addresses to reach it.
    let members = etcdctl(other, &["member", "list", "-w", "json"], "");
    let members: serde_json::Value =
        serde_json::from_str(members.stdout.trim()).expect("member list json");
    let mut listed: Vec<String> = members["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|member| member["clientURLs"][0].as_str())
        .map(|url| url.trim_start_matches("http://").to_string())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = (1..=3).map(|id| cluster.node(id).client.clone()).collect();
    expected.sort();
    assert_eq!(listed, expected, "{members}");
    let revoked = etcdctl(one, &["lease", "revoke", &id], "");
    assert_eq!(
        revoked.stdout,
        format!("lease {id} revoked\n"),
        "{revoked:?}"
    );
    let gone = etcdctl(other, &["get", "leased"], "");
    assert_eq!((gone.code, gone.stdout.as_str()), (0, ""), "{gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_etcd_serves_etcds_api_on_a_port_of_its_own() {
    let _one = exclusive().await;
    if on_path("etcdctl").is_none() {
        missing_dependency(
            "etcd_api::listen_etcd_serves_etcds_api_on_a_port_of_its_own",
            Dependency::Etcdctl,
            "no etcdctl binary on PATH",
        );
        return;
    }
    let etcd_port = format!("127.0.0.1:{}", support::free_port());
    let mut flags = FAST.to_vec();
    flags.extend([
        "--listen-etcd",
        etcd_port.as_str(),
        "--etcd-version",
        "3.5.13",
    ]);
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    answering(&etcd_port).await;
    let put = etcdctl(&etcd_port, &["put", "k", "on the etcd port"], "");
    assert_eq!((put.code, put.stdout.as_str()), (0, "OK\n"), "{put:?}");
    // The version clients gate features on, as configured.
    let status = etcdctl(&etcd_port, &["endpoint", "status", "-w", "json"], "");
    let status: serde_json::Value = serde_json::from_str(status.stdout.trim()).expect("json");
    assert_eq!(status[0]["Status"]["version"], "3.5.13", "{status}");
    // The same store behind both ports.
    let got = etcdctl(
        &cluster.node(1).client,
        &["get", "k", "--print-value-only"],
        "",
    );
    assert_eq!(got.stdout, "on the etcd port\n", "{got:?}");

    // A version that is not one is a usage error.
    let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--etcd-version", "3.5"])
        .stdin(Stdio::null())
        .output()
        .expect("run oncekv serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MAJOR.MINOR.PATCH"), "{stderr}");

    // An address already taken: the documented exit code, saying which.
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .args([
            "--listen-peer",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .args(["--listen-etcd", &etcd_port])
        .stdin(Stdio::null())
        .output()
        .expect("run oncekv serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(11), "{stderr}");
    assert!(stderr.contains("cannot listen for etcd's API"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_snapshot_save_makes_a_backup_oncekv_restores() {
    let _one = exclusive().await;
    if on_path("etcdctl").is_none() {
        missing_dependency(
            "etcd_api::etcdctl_snapshot_save_makes_a_backup_oncekv_restores",
            Dependency::Etcdctl,
            "no etcdctl binary on PATH",
        );
        return;
    }
    let mut old = Cluster::start(3, FAST);
    let leader = old.leader(Duration::from_secs(15)).await;
    // Through a follower: the backup is taken on the leader.
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let endpoint = old.node(follower).client.clone();
    answering(&endpoint).await;
    // A follower that has not heard from the new leader yet answers "no
    // leader" (nothing proposed), which etcdctl does not retry: the put is
    // sent again until the follower knows where to forward it.
    eventually(
        Duration::from_secs(30),
        "a put through the follower",
        || {
            let put = etcdctl(&endpoint, &["put", "kept", "in the backup"], "");
            async move {
                if put.code != 0 {
                    assert!(put.stderr.contains("no leader"), "{put:?}");
                }
                (put.code == 0).then_some(())
            }
        },
    )
    .await;
    let file = old.dir.path().join("etcd.db");
    let file = file.to_str().expect("UTF-8");
    let saved = etcdctl(&endpoint, &["snapshot", "save", file], "");
    assert_eq!(
        (saved.code, saved.stdout.as_str()),
        (0, format!("Snapshot saved at {file}\n").as_str()),
        "{saved:?}"
    );
    old.stop_all();

    let mut new = Cluster::new(1, FAST);
    let node = &new.nodes[0];
    let initial = format!("{}={}/{}", node.id, node.peer, node.client);
    let restored = Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["snapshot", "restore", file, "--data-dir"])
        .arg(&node.data_dir)
        .args(["--id", "1", "--initial-cluster", &initial])
        .stdin(Stdio::null())
        .output()
        .expect("run oncekv snapshot restore");
    assert_eq!(
        restored.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    new.start_all().expect("start the restored node");
    new.leader(Duration::from_secs(15)).await;
    let endpoint = new.node(1).client.clone();
    answering(&endpoint).await;
    let got = etcdctl(&endpoint, &["get", "kept", "--print-value-only"], "");
    assert_eq!(got.stdout, "in the backup\n", "{got:?}");
}
