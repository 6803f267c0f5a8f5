//! Revisions, transactions and watches on real clusters: a transaction
//! applies whole and its retry returns the original result (library and
//! command line); a watch sees every change once, in revision order,
//! across a leader kill; reads of the past and compaction.

mod support;

use oncekv_client::{
    Client, ClientError, ClientOptions, Compare, CompareOp, EventKind, Rejection, Reply,
    SessionOptions, Txn, TxnOp, WatchOptions, WatchUpdate,
};
use std::io::Write as _;
use std::process::{Command as Process, Stdio};
use std::time::Duration;
use support::{Cluster, FAST, exclusive};

fn client(cluster: &Cluster) -> Client {
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let options = ClientOptions::default().with_deadline(Duration::from_secs(30));
    Client::connect(endpoints, options).expect("client")
}

/// Runs `oncekv ARGS` with `stdin`; returns its exit code and stdout.
fn oncekv(args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oncekv");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("oncekv ends");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (
        output.status.code().expect("exit code"),
        format!("{stdout}{stderr}"),
    )
}

fn number(reply: &Reply) -> i64 {
    match reply {
        Reply::Get {
            value: Some(value), ..
        } => String::from_utf8_lossy(value).parse().expect("a number"),
        Reply::Get { value: None, .. } => 0,
        other => panic!("not a get: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_applies_whole_and_its_retry_returns_the_original_result() {
    let _one = exclusive().await;
    let cluster = Cluster::start(3, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let client = client(&cluster);
    client.put("acct/a", "100").await.expect("put");
    client.put("acct/b", "0").await.expect("put");

    // Transfers on a session: both accounts move at one revision.
    let session = client
        .open_session(SessionOptions::default())
        .await
        .expect("session");
    let transfer = || {
        Txn::new()
            .compare(Compare::exists("acct/a"))
            .on_success(TxnOp::incr("acct/a", -1))
            .on_success(TxnOp::incr("acct/b", 1))
    };
    for _ in 0..20 {
        let done = session.txn(transfer()).await.expect("transfer");
        assert!(done.succeeded);
        assert_eq!(done.results.len(), 2);
    }
    let read = Txn::new()
        .on_success(TxnOp::get("acct/a"))
        .on_success(TxnOp::get("acct/b"));
    let balances = client.txn(read.clone()).await.expect("read");
    let (a, b) = (number(&balances.results[0]), number(&balances.results[1]));
    assert_eq!((a, b), (80, 20));

    // One refused operation undoes the transaction: nothing changed.
    client.put("text", "x").await.expect("put");
    let refused = client
        .txn(
            Txn::new()
                .on_success(TxnOp::incr("acct/a", -50))
                .on_success(TxnOp::incr("text", 1)),
        )
        .await;
    assert!(
        matches!(refused, Err(ClientError::Rejected(Rejection::NotAnInteger))),
        "{refused:?}"
    );
    let after = client.txn(read).await.expect("read");
    assert_eq!(number(&after.results[0]), 80, "the refused txn changed a");

    // The command line: a txn on a session file, retried by hand with the
    // same number, answers the original result and applies once.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("s.json");
    let file = file.to_str().expect("utf-8 path");
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let endpoints = endpoints.join(",");
    let (code, out) = oncekv(
        &[
            "session",
            "open",
            "--session-file",
            file,
            "--endpoints",
            &endpoints,
        ],
        "",
    );
    assert_eq!(code, 0, "{out}");
    let text = "value(\"acct/b\") = \"20\"\n\nincr acct/a -5\nincr acct/b 5\n\nget acct/b\n";
    let run = |seq: &str| {
        oncekv(
            &[
                "txn",
                "--session-file",
                file,
                "--seq",
                seq,
                "--endpoints",
                &endpoints,
            ],
            text,
        )
    };
    let (code, first) = run("1");
    assert_eq!(code, 0, "{first}");
    assert!(first.starts_with("SUCCESS\n75\n25"), "{first}");
    let (code, retry) = run("1");
    assert_eq!(code, 0, "{retry}");
    assert!(
        retry.contains("SUCCESS") && retry.contains("replayed"),
        "{retry}"
    );
    assert_eq!(
        client.get("acct/b").await.expect("get"),
        Some(b"25".to_vec())
    );
    // A compare that fails runs the failure branch and exits 3.
    let (code, failed) = run("2");
    assert_eq!(code, 3, "{failed}");
    assert!(failed.starts_with("FAILURE\n25"), "{failed}");
    // A mistake in the text names its line and sends nothing.
    let (code, bad) = oncekv(
        &["txn", "--endpoints", &endpoints],
        "bogus(\"k\") = \"1\"\n",
    );
    assert_ne!(code, 0);
    assert!(bad.contains("line 1"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_every_change_once_in_order_across_a_leader_kill() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let client = client(&cluster);
    let start = client.put("w/start", "0").await.expect("put").revision;
    let stored = client.get_kv("w/start", None).await.expect("get");
    assert_eq!(stored.map(|kv| kv.meta.mod_revision), Some(start));
    let watch_options = WatchOptions::default()
        .with_prefix()
        .from_revision(start)
        .with_progress_interval(Duration::from_millis(200));
    let mut watcher = client.watch("w/", watch_options.clone());
    // A watch served by a follower alone, from its applied state.
    let follower = cluster
        .nodes
        .iter()
        .find(|node| node.id != leader)
        .expect("a follower")
        .client
        .clone();
    let follower_client = Client::connect(
        [follower],
        ClientOptions::default().with_deadline(Duration::from_secs(30)),
    )
    .expect("client");
    let mut follower_watcher = follower_client.watch("w/", watch_options.clone());

    let session = client
        .open_session(SessionOptions::default())
        .await
        .expect("session");
    let writes = 60;
    let (killed_tx, killed_rx) = tokio::sync::oneshot::channel::<()>();
    let (halfway_tx, halfway_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let mut halfway = Some(halfway_tx);
        let mut killed = Some(killed_rx);
        for i in 0..writes {
            if i == writes / 2 {
                if let Some(halfway) = halfway.take() {
                    let _ = halfway.send(());
                }
                if let Some(killed) = killed.take() {
                    let _ = killed.await;
                }
            }
            let key = format!("w/{:03}", i % 7);
            if i % 5 == 4 {
                session.delete(key).await.expect("delete");
            } else {
                session.put(key, format!("v{i}")).await.expect("put");
            }
        }
    });
    halfway_rx.await.expect("writer halfway");
    cluster.node(leader).kill();
    let _ = killed_tx.send(());
    writer.await.expect("writer");
    let last = client
        .txn(Txn::new().on_success(TxnOp::put("w/end", "done")))
        .await
        .expect("last write")
        .revision;

    // What the watcher saw, until it saw the last write.
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|(revision, _, _, _)| *revision == last) {
        let update = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .expect("the watcher reaches the last write in time")
            .expect("the watch goes on");
        if let WatchUpdate::Changes { revision, events } = update {
            for event in events {
                assert_eq!(event.revision, revision);
                seen.push((event.revision, event.kind, event.key, event.value));
            }
        }
    }

    // The truth: a fresh watch on a surviving node, from the same start.
    let mut fresh = client.watch("w/", watch_options);
    let truth = changes_until(&mut fresh, last, deadline).await;
    assert_eq!(seen, truth, "the watcher saw other changes than committed");
    let on_follower = changes_until(&mut follower_watcher, last, deadline).await;
    assert_eq!(on_follower, truth, "the follower's watch differs");
    // Every write is there once, in revision order.
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "revision order");
    let puts = seen.iter().filter(|e| e.1 == EventKind::Put).count();
    let deletes = seen.iter().filter(|e| e.1 == EventKind::Delete).count();
    // The start put, the writer's puts, and the end put; deletes of keys
    // that existed.
    assert_eq!(puts, 1 + (writes - writes / 5) + 1, "{seen:?}");
    assert!(deletes <= writes / 5 && deletes > 0, "{seen:?}");
}

type Change = (u64, EventKind, Vec<u8>, Vec<u8>);

/// What `watcher` delivers until it delivered revision `last`.
async fn changes_until(
    watcher: &mut oncekv_client::Watcher,
    last: u64,
    deadline: tokio::time::Instant,
) -> Vec<Change> {
    let mut changes: Vec<Change> = Vec::new();
    while !changes.iter().any(|(revision, _, _, _)| *revision == last) {
        let update = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .expect("the watch reaches the last write in time")
            .expect("the watch goes on");
        if let WatchUpdate::Changes { events, .. } = update {
            for event in events {
                changes.push((event.revision, event.kind, event.key, event.value));
            }
        }
    }
    changes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_the_past_and_compaction() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let client = client(&cluster);
    let endpoints = cluster.nodes[0].client.clone();
    client.put("k", "one").await.expect("put");
    let one = client.get_kv("k", None).await.expect("get").expect("k");
    client.put("k", "two").await.expect("put");
    let two = client.get_kv("k", None).await.expect("get").expect("k");
    assert_eq!(one.meta.version, 1);
    assert_eq!(two.meta.version, 2);
    assert_eq!(two.meta.create_revision, one.meta.mod_revision);
    let past = client
        .get_kv("k", Some(one.meta.mod_revision))
        .await
        .expect("get at")
        .expect("k");
    assert_eq!(past.value, b"one".to_vec());
    let rev = one.meta.mod_revision.to_string();
    let (code, out) = oncekv(&["get", "k", "--rev", &rev, "--endpoints", &endpoints], "");
    assert_eq!((code, out.trim()), (0, "one"));
    let (code, out) = oncekv(&["get", "k", "-o", "json", "--endpoints", &endpoints], "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"version\":2"), "{out}");

    // A watch from the past replays the changes since.
    let (code, out) = oncekv(
        &[
            "watch",
            "k",
            "--rev",
            &rev,
            "--count",
            "2",
            "--endpoints",
            &endpoints,
        ],
        "",
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("{} PUT k one", one.meta.mod_revision),
            format!("{} PUT k two", two.meta.mod_revision)
        ]
    );

    // Compaction: reads and watches below it are refused, typed.
    let compact = two.meta.mod_revision.to_string();
    let (code, out) = oncekv(&["compact", &compact, "--endpoints", &endpoints], "");
    assert_eq!(code, 0, "{out}");
    let below = client.get_kv("k", Some(one.meta.mod_revision)).await;
    assert!(
        matches!(
            below,
            Err(ClientError::Rejected(Rejection::Compacted { .. }))
        ),
        "{below:?}"
    );
    let (code, out) = oncekv(&["get", "k", "--rev", &rev, "--endpoints", &endpoints], "");
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("compacted"), "{out}");
    let mut watcher = client.watch("k", WatchOptions::default().from_revision(1));
    let refused = watcher.next().await;
    assert!(
        matches!(
            refused,
            Err(ClientError::Rejected(Rejection::Compacted { .. }))
        ),
        "{refused:?}"
    );
    let (code, out) = oncekv(&["watch", "k", "--rev", "1", "--endpoints", &endpoints], "");
    assert_eq!(code, 3, "{out}");
    // A compare on a mod revision guards a write (optimistic concurrency).
    let guarded = client
        .txn(
            Txn::new()
                .compare(Compare::mod_revision(
                    "k",
                    CompareOp::Equal,
                    two.meta.mod_revision,
                ))
                .on_success(TxnOp::put("k", "three")),
        )
        .await
        .expect("txn");
    assert!(guarded.succeeded);
    let stale = client
        .txn(
            Txn::new()
                .compare(Compare::mod_revision(
                    "k",
                    CompareOp::Equal,
                    two.meta.mod_revision,
                ))
                .on_success(TxnOp::put("k", "four")),
        )
        .await
        .expect("txn");
    assert!(!stale.succeeded);
    assert_eq!(client.get("k").await.expect("get"), Some(b"three".to_vec()));
}
