//! etcd's key ranges, compared with etcd itself: Debian's `etcdctl` runs
//! the same range commands against a real one-member etcd and against an
//! oncekv node (`get a c`, `get --from-key`, `del a c`, `del --from-key`,
//! limited reads continued from the next key as Kubernetes' list does,
//! ranges inside a transaction (sorted, limited and at a past revision too), `watch a c` from the past and live, an
//! empty watch range, `put --ignore-value`, `put --ignore-lease`), and
//! their outputs, exit codes and error texts, with ids and revisions
//! normalised, must be equal. Then, over gRPC, what `etcdctl` cannot send:
//! a paged list continued from `last key + \0` with its counts, compares
//! over ranges and on leases, a from-key watch, and the refusals of a put
//! that keeps the value but carries one.
//!
//! Needs `etcd` and `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-server and etcd-client); without them the test says so (and fails
//! in CI).

mod support;

use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use oncekv_proto::etcd::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    Compare, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchRequest, request_op, response_op,
};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::etcdctl::{Normaliser, Run, answering, etcdctl, is_lease_id, reference};
use support::{Cluster, FAST, exclusive};
use tonic::transport::Channel;

/// One step of the script.
enum Step {
    /// `etcdctl` arguments (`{rev}` and `{lease}` are what the script
    /// remembered on this server) and what it reads (`{rev}` there too).
    Etcdctl {
        args: Vec<String>,
        stdin: &'static str,
    },
    /// Remember this server's current revision as `{rev}`.
    RememberRevision,
}

fn step(args: &[&str]) -> Step {
    Step::Etcdctl {
        args: args.iter().map(ToString::to_string).collect(),
        stdin: "",
    }
}

fn txn(stdin: &'static str, json: bool) -> Step {
    let mut args = vec!["txn".to_string()];
    if json {
        args.extend(["-w".to_string(), "json".to_string()]);
    }
    Step::Etcdctl { args, stdin }
}

/// The script both servers run, in order.
fn script() -> Vec<Step> {
    vec![
        step(&["put", "a", "1"]),
        step(&["put", "b", "2"]),
        step(&["put", "b/x", "3"]),
        step(&["put", "c", "4"]),
        step(&["put", "d", "5"]),
        // [a, c): b/x sorts between b and c.
        step(&["get", "a", "c"]),
        step(&["get", "a", "c", "-w", "json"]),
        step(&["get", "a", "c", "--keys-only"]),
        step(&["get", "a", "c", "--count-only", "-w", "json"]),
        step(&["get", "a", "c", "--limit", "2", "-w", "json"]),
        step(&["get", "a", "c", "--sort-by", "VALUE", "--order", "DESCEND"]),
        step(&["get", "--from-key", "b"]),
        step(&["get", "--from-key", "b", "--limit", "2", "-w", "json"]),
        step(&["get", "--from-key", "", "--keys-only"]),
        // A range whose end is not above its start holds nothing.
        step(&["get", "c", "a"]),
        step(&["get", "c", "a", "-w", "json"]),
        // The past.
        Step::RememberRevision,
        step(&["del", "b"]),
        step(&["get", "a", "c", "--rev", "{rev}"]),
        step(&[
            "get", "a", "c", "--rev", "{rev}", "--limit", "1", "-w", "json",
        ]),
        step(&["get", "a", "c"]),
        // The past inside a transaction: a key, a range and a limited
        // one, as they were before the delete.
        txn(
            "\nget b --rev {rev}\nget a c --rev {rev} --limit 1\nget a c --rev {rev} --sort-by VALUE --order DESCEND\nget a c\n\n\n",
            false,
        ),
        txn("\nget a c --rev {rev}\n\n\n", true),
        // A future revision fails the whole transaction, its put too.
        txn("\nput never 2\nget a --rev 99999999\n\n\n", false),
        step(&["get", "never"]),
        // Deletes of ranges.
        step(&["del", "a", "c"]),
        step(&["put", "a", "1"]),
        step(&["put", "b", "2"]),
        step(&["del", "b", "c", "--prev-kv"]),
        step(&["del", "b", "c", "--prev-kv", "-w", "json"]),
        step(&["del", "c", "a"]),
        step(&["del", "--from-key", "c", "--prev-kv"]),
        step(&["get", "--from-key", "", "-w", "json"]),
        // A list in pages, continued from a key after the last one shown
        // up to the prefix's end, as Kubernetes' list does it.
        step(&["put", "/registry/pods/ns/p1", "1"]),
        step(&["put", "/registry/pods/ns/p2", "2"]),
        step(&["put", "/registry/pods/ns/p3", "3"]),
        step(&["put", "/registry/pods/ns/p4", "4"]),
        step(&["put", "/registry/pods/ns/p5", "5"]),
        step(&["put", "/registry/services/s", "6"]),
        step(&[
            "get",
            "/registry/pods/",
            "--prefix",
            "--limit",
            "2",
            "-w",
            "json",
        ]),
        step(&[
            "get",
            "/registry/pods/ns/p2~",
            "/registry/pods0",
            "--limit",
            "2",
            "-w",
            "json",
        ]),
        step(&[
            "get",
            "/registry/pods/ns/p4~",
            "/registry/pods0",
            "--limit",
            "2",
            "-w",
            "json",
        ]),
        // Ranges inside a transaction.
        txn(
            "mod(\"a\") > \"0\"\n\nget a c\nget --from-key /registry/s\ndel /registry/pods/ns/p4 /registry/pods0\n\nput never 1\n\n",
            false,
        ),
        txn(
            "mod(\"a\") > \"0\"\n\nget /registry/pods/ /registry/pods0 --limit 2\n\n\n",
            true,
        ),
        // Sorted and limited inside a transaction (every match is read,
        // sorted, then limited, as at the top level).
        txn(
            "mod(\"a\") > \"0\"\n\nget /registry/pods/ --prefix --sort-by VALUE --order DESCEND --limit 2\nget /registry/ --prefix --sort-by MODIFY --keys-only\n\n\n",
            true,
        ),
        txn(
            "\nget /registry/pods/ --prefix --sort-by CREATE --order DESCEND\n\n\n",
            false,
        ),
        step(&["get", "/registry/", "--prefix", "--keys-only"]),
        // Puts keeping the value or the lease.
        step(&["put", "k", "v"]),
        step(&["put", "k", "--ignore-value"]),
        step(&["get", "k", "-w", "json"]),
        step(&["put", "missing", "--ignore-value"]),
        step(&["lease", "grant", "600"]),
        step(&["put", "lk", "v", "--lease", "{lease}"]),
        step(&["put", "lk", "v2", "--ignore-lease"]),
        step(&["get", "lk", "-w", "json"]),
        step(&["put", "lk", "--ignore-value", "--lease", "{lease}"]),
        step(&["get", "lk", "-w", "json"]),
        // Without --lease or --ignore-lease, a put takes the key off its
        // lease.
        step(&["put", "lk", "--ignore-value"]),
        step(&["get", "lk", "-w", "json"]),
        step(&["put", "nolk", "v", "--ignore-lease"]),
        step(&["put", "lk", "v3", "--ignore-lease", "--lease", "{lease}"]),
        step(&["get", "lk"]),
        step(&["put", "range/end", "sentinel"]),
    ]
}

/// This server's current revision: the header of a read.
fn header_revision(endpoint: &str) -> i64 {
    let run = etcdctl(endpoint, &["get", "any", "-w", "json"], "");
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json");
    json["header"]["revision"]
        .as_i64()
        .expect("a header revision")
}

/// Runs the script against `endpoint`; returns each step's normalised
/// output.
fn transcript(endpoint: &str) -> Vec<(String, Run)> {
    let mut normaliser = Normaliser::default();
    let mut revision = String::new();
    let mut lease = String::new();
    let mut runs = Vec::new();
    for step in script() {
        let (args, stdin) = match step {
            Step::RememberRevision => {
                revision = header_revision(endpoint).to_string();
                continue;
            }
            Step::Etcdctl { args, stdin } => (args, stdin),
        };
        let resolved: Vec<String> = args
            .iter()
            .map(|arg| arg.replace("{rev}", &revision).replace("{lease}", &lease))
            .collect();
        let resolved: Vec<&str> = resolved.iter().map(String::as_str).collect();
        let stdin = stdin.replace("{rev}", &revision);
        let mut run = etcdctl(endpoint, &resolved, &stdin);
        if let Some(granted) = run
            .stdout
            .strip_prefix("lease ")
            .and_then(|rest| rest.split(' ').next())
            .filter(|id| is_lease_id(id) && run.stdout.contains(" granted "))
        {
            lease = granted.to_string();
        }
        run.stdout = normaliser.text(&run.stdout.replace(endpoint, "ENDPOINT"));
        run.stderr = normaliser.text(&run.stderr.replace(endpoint, "ENDPOINT"));
        runs.push((format!("etcdctl {}", args.join(" ")), run));
    }
    runs
}

/// The lines `etcdctl watch ARGS` prints on `endpoint` up to and with the
/// first line equal to `last` (within 30 s); the watch is then stopped.
fn watch_until(endpoint: &str, args: &[&str], last: &str) -> Vec<String> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "watch"])
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
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
        "etcdctl watch {args:?} on {endpoint} printed {seen:?}"
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_ranges_answer_as_on_etcd() {
    let _one = exclusive().await;
    let Some(etcd) = reference("etcd_ranges::etcdctl_ranges_answer_as_on_etcd") else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;

    let expected = transcript(&etcd.endpoint);
    let actual = transcript(&oncekv);
    assert_eq!(expected.len(), actual.len());
    for ((command, want), (_, got)) in expected.iter().zip(&actual) {
        assert_eq!(
            got,
            want,
            "{command}: oncekv (left) differs from etcd (right)\netcd log:\n{}",
            etcd.log()
        );
    }
    // What etcd answered is what the steps mean: the range, from a key on,
    // the deletes of ranges, the refusals.
    let printed = |command: &str| {
        let (_, run) = expected
            .iter()
            .find(|(name, _)| name == command)
            .expect("a step of the script");
        (run.stdout.as_str(), run.stderr.as_str())
    };
    assert_eq!(printed("etcdctl get a c").0, "a\n1\nb\n2\nb/x\n3");
    assert_eq!(
        printed("etcdctl get --from-key b").0,
        "b\n2\nb/x\n3\nc\n4\nd\n5"
    );
    assert_eq!(printed("etcdctl get c a").0, "");
    assert_eq!(printed("etcdctl del a c").0, "2");
    assert_eq!(
        printed("etcdctl del --from-key c --prev-kv").0,
        "2\nc\n4\nd\n5"
    );
    assert_eq!(printed("etcdctl get lk").0, "lk\nv2");
    assert_eq!(
        printed("etcdctl put missing --ignore-value").1,
        "Error: etcdserver: key not found"
    );
    assert_eq!(
        printed("etcdctl put lk v3 --ignore-lease --lease {lease}").1,
        "Error: etcdserver: lease is provided"
    );

    // A range's whole history, with and without previous values: every
    // change of a key from `/registry/pods/` up to `range/end`'s end.
    for args in [
        &["/registry/pods/", "range/f", "--rev", "1"][..],
        &["/registry/pods/", "range/f", "--rev", "1", "--prev-kv"][..],
    ] {
        let want = watch_until(&etcd.endpoint, args, "sentinel");
        let got = watch_until(&oncekv, args, "sentinel");
        assert_eq!(
            got, want,
            "etcdctl watch {args:?}: oncekv (left), etcd (right)"
        );
    }

    // A live watch of [a, c) sees the changes in it made after it started,
    // and none outside it.
    let mut live = Vec::new();
    for endpoint in [etcd.endpoint.clone(), oncekv.clone()] {
        let from = (header_revision(&endpoint) + 1).to_string();
        let watching = endpoint.clone();
        let watcher = std::thread::spawn(move || {
            watch_until(
                &watching,
                &["a", "c", "--rev", &from, "--prev-kv"],
                "live-end",
            )
        });
        for args in [
            &["put", "a", "live"][..],
            &["put", "c", "outside"][..],
            &["put", "0", "outside"][..],
            &["del", "a"][..],
            &["put", "b/live", "live-end"][..],
        ] {
            let run = etcdctl(&endpoint, args, "");
            assert_eq!(run.code, 0, "{endpoint} {args:?}: {run:?}");
        }
        live.push(watcher.join().expect("the watcher"));
    }
    assert_eq!(
        live[1], live[0],
        "a live watch of a range: oncekv (left), etcd (right)"
    );

    // A watch of an empty range is cancelled at once, as etcd does it.
    let empty: Vec<Run> = [&etcd.endpoint, &oncekv]
        .into_iter()
        .map(|endpoint| etcdctl(endpoint, &["watch", "c", "a"], ""))
        .collect();
    assert_eq!(
        empty[1], empty[0],
        "a watch of [c, a): oncekv (left), etcd (right)"
    );
}

/// etcd's end of the range of keys under `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One page of a list: its keys, whether more follow, and the count.
type Page = (Vec<Vec<u8>>, bool, i64);

/// Lists `prefix` in pages of `limit` as Kubernetes' storage does: each
/// page the range from the key after the last one shown (`last + \0`) up
/// to the prefix's end.
async fn pages(kv: &mut KvClient<Channel>, prefix: &[u8], limit: i64) -> Vec<Page> {
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    let mut pages = Vec::new();
    loop {
        let response = kv
            .range(RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit,
                ..RangeRequest::default()
            })
            .await
            .expect("a page")
            .into_inner();
        let keys: Vec<Vec<u8>> = response.kvs.iter().map(|kv| kv.key.clone()).collect();
        let more = response.more;
        pages.push((keys.clone(), more, response.count));
        let Some(last) = keys.last() else { break };
        if !more {
            break;
        }
        from = [last.as_slice(), &[0]].concat();
        assert!(pages.len() < 100, "the pages never end: {pages:?}");
    }
    pages
}

fn put(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        lease,
        ..PutRequest::default()
    }
}

/// A compare of `target` over the keys from `key` up to `range_end`.
fn compare(key: &str, range_end: &[u8], result: CompareResult, target: TargetUnion) -> Compare {
    let kind = match target {
        TargetUnion::Version(_) => CompareTarget::Version,
        TargetUnion::CreateRevision(_) => CompareTarget::Create,
        TargetUnion::ModRevision(_) => CompareTarget::Mod,
        TargetUnion::Value(_) => CompareTarget::Value,
        TargetUnion::Lease(_) => CompareTarget::Lease,
    };
    Compare {
        result: result as i32,
        target: kind as i32,
        key: key.as_bytes().to_vec(),
        range_end: range_end.to_vec(),
        target_union: Some(target),
    }
}

/// What one server answers to the gRPC part: the pages of a list, the
/// refusals of bad puts, whether each compare held, a transaction's range
/// read, and the keys a from-key watch saw.
#[derive(Debug, PartialEq, Eq)]
struct Answers {
    pages: Vec<Page>,
    refusals: Vec<(tonic::Code, String)>,
    compares: Vec<bool>,
    txn_range: (Vec<Vec<u8>>, bool, i64),
    watched: Vec<Vec<u8>>,
}

/// The lease ID both servers grant under, chosen by the test.
const LEASE: i64 = 0x7e57;

async fn grpc_answers(endpoint: &str) -> Answers {
    let channel = Channel::from_shared(format!("http://{endpoint}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    let mut kv = KvClient::new(channel.clone());
    let mut leases = LeaseClient::new(channel.clone());
    leases
        .lease_grant(LeaseGrantRequest {
            ttl: 600,
            id: LEASE,
        })
        .await
        .expect("a lease");
    for (key, value, lease) in [
        ("/registry/pods/ns/p1", "1", 0),
        ("/registry/pods/ns/p2", "2", 0),
        ("/registry/pods/ns/p3", "3", 0),
        ("/registry/pods/ns/p4", "4", 0),
        ("/registry/pods/ns/p5", "5", 0),
        ("/registry/podsx", "outside", 0),
        ("r/a", "1", 0),
        ("r/b", "1", 0),
        ("r/c", "2", 0),
        ("r/l", "leased", LEASE),
    ] {
        kv.put(put(key, value, lease)).await.expect("put");
    }
    let pages = pages(&mut kv, b"/registry/pods/", 2).await;

    let mut refusals = Vec::new();
    for request in [
        PutRequest {
            ignore_value: true,
            ..put("r/a", "a value", 0)
        },
        PutRequest {
            ignore_lease: true,
            ..put("r/a", "1", LEASE)
        },
        PutRequest {
            ignore_value: true,
            ..put("r/absent", "", 0)
        },
        PutRequest {
            ignore_lease: true,
            ..put("r/absent", "x", 0)
        },
    ] {
        let status = kv.put(request).await.expect_err("refused");
        refusals.push((status.code(), status.message().to_string()));
    }

    let from_key = [0u8].as_slice();
    let checks = [
        compare(
            "r/a",
            b"r/c",
            CompareResult::Equal,
            TargetUnion::Value(b"1".to_vec()),
        ),
        compare(
            "r/a",
            b"r/d",
            CompareResult::Equal,
            TargetUnion::Value(b"1".to_vec()),
        ),
        compare(
            "r/",
            from_key,
            CompareResult::Greater,
            TargetUnion::Version(0),
        ),
        compare(
            "r/b",
            from_key,
            CompareResult::Less,
            TargetUnion::Version(2),
        ),
        compare(
            "r/z",
            b"r/a",
            CompareResult::Equal,
            TargetUnion::CreateRevision(0),
        ),
        compare(
            "r/z",
            b"r/a",
            CompareResult::Equal,
            TargetUnion::Value(Vec::new()),
        ),
        compare("r/l", b"", CompareResult::Equal, TargetUnion::Lease(LEASE)),
        compare("r/a", b"", CompareResult::Equal, TargetUnion::Lease(0)),
        compare(
            "r/l",
            b"",
            CompareResult::Greater,
            TargetUnion::Lease(LEASE - 1),
        ),
        compare("r/l", b"", CompareResult::Less, TargetUnion::Lease(LEASE)),
        compare(
            "r/a",
            b"r/m",
            CompareResult::Equal,
            TargetUnion::Lease(LEASE),
        ),
        compare(
            "r/k",
            b"r/m",
            CompareResult::Equal,
            TargetUnion::Lease(LEASE),
        ),
        compare("r/absent", b"", CompareResult::Equal, TargetUnion::Lease(0)),
    ];
    let mut compares = Vec::new();
    for check in checks {
        let response = kv
            .txn(TxnRequest {
                compare: vec![check],
                success: Vec::new(),
                failure: Vec::new(),
            })
            .await
            .expect("a txn")
            .into_inner();
        compares.push(response.succeeded);
    }

    let response = kv
        .txn(TxnRequest {
            compare: vec![compare(
                "r/",
                from_key,
                CompareResult::Greater,
                TargetUnion::ModRevision(0),
            )],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: b"/registry/pods/ns/p2\0".to_vec(),
                    range_end: prefix_end(b"/registry/pods/"),
                    limit: 1,
                    ..RangeRequest::default()
                })),
            }],
            failure: Vec::new(),
        })
        .await
        .expect("a txn")
        .into_inner();
    assert!(response.succeeded, "{response:?}");
    let txn_range = match response.responses.first().and_then(|r| r.response.clone()) {
        Some(response_op::Response::ResponseRange(range)) => (
            range.kvs.iter().map(|kv| kv.key.clone()).collect(),
            range.more,
            range.count,
        ),
        other => panic!("not a range response: {other:?}"),
    };

    // A watch of every key from `w/m` on, from the next revision.
    let start = kv
        .range(RangeRequest {
            key: b"any".to_vec(),
            ..RangeRequest::default()
        })
        .await
        .expect("a read")
        .into_inner()
        .header
        .map_or(0, |header| header.revision)
        + 1;
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"w/m".to_vec(),
                range_end: vec![0],
                start_revision: start,
                ..WatchCreateRequest::default()
            })),
        })
        .await
        .expect("a watch request");
    let mut watch = WatchClient::new(channel)
        .watch(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("a watch")
        .into_inner();
    for key in ["w/a", "w/m", "w/z", "x", "w/l", "zz-end"] {
        kv.put(put(key, "v", 0)).await.expect("put");
    }
    let mut watched = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while watched.last().map(Vec::as_slice) != Some(b"zz-end".as_slice()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let response = tokio::time::timeout(left, watch.message())
            .await
            .expect("the watch's events in time")
            .expect("a watch response")
            .expect("the watch still runs");
        assert!(!response.canceled, "{response:?}");
        watched.extend(
            response
                .events
                .into_iter()
                .filter_map(|event| event.kv.map(|kv| kv.key)),
        );
    }
    drop(requests);
    Answers {
        pages,
        refusals,
        compares,
        txn_range,
        watched,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_lists_range_compares_and_put_refusals_answer_as_on_etcd() {
    let _one = exclusive().await;
    let Some(etcd) =
        reference("etcd_ranges::paged_lists_range_compares_and_put_refusals_answer_as_on_etcd")
    else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;

    let want = grpc_answers(&etcd.endpoint).await;
    let got = grpc_answers(&oncekv).await;
    assert_eq!(got, want, "oncekv (left), etcd (right)");
    // What etcd answered is what was meant: five pods in three pages of
    // two, each counting what is left from where it starts.
    let counts: Vec<(usize, bool, i64)> = want
        .pages
        .iter()
        .map(|(keys, more, count)| (keys.len(), *more, *count))
        .collect();
    assert_eq!(counts, [(2, true, 5), (2, true, 3), (1, false, 1)]);
    assert_eq!(
        want.watched,
        [
            b"w/m".to_vec(),
            b"w/z".to_vec(),
            b"x".to_vec(),
            b"zz-end".to_vec()
        ]
    );
    let invalid = |text: &str| (tonic::Code::InvalidArgument, text.to_string());
    assert_eq!(
        want.refusals,
        [
            invalid("etcdserver: value is provided"),
            invalid("etcdserver: lease is provided"),
            invalid("etcdserver: key not found"),
            invalid("etcdserver: key not found"),
        ]
    );
    assert_eq!(
        want.compares,
        [
            true, false, true, true, true, false, true, true, true, false, false, true, true
        ]
    );
    assert!(want.txn_range.1);
    assert_eq!(want.txn_range.2, 3);

    // A transaction inside a transaction is served (etcd_nested_txn.rs
    // compares them with etcd): an empty one succeeds, with no responses.
    let channel = Channel::from_shared(format!("http://{oncekv}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    let nested = KvClient::new(channel)
        .txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
            }],
            failure: Vec::new(),
        })
        .await
        .expect("served")
        .into_inner();
    assert!(nested.succeeded, "{nested:?}");
    assert!(
        matches!(
            &nested.responses[..],
            [oncekv_proto::etcd::etcdserverpb::ResponseOp {
                response: Some(response_op::Response::ResponseTxn(inner)),
            }] if inner.succeeded && inner.responses.is_empty()
        ),
        "{nested:?}"
    );
}
