//! Backup and restore end to end: `snapshot save` from a running cluster
//! under load, `snapshot restore` into every node of a new one, and the new
//! cluster holds every write acknowledged before the save and answers a
//! retry of a request made before the backup from its completion record.

mod support;

use oncekv_state::{Command, Outcome, Query, Reply};
use std::time::Duration;
use support::{Cluster, FAST, TestSession, exclusive, without_meta};

const ELECTION: Duration = Duration::from_secs(20);

fn append(value: &str) -> Command {
    Command::Append {
        key: b"log".to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

fn oncekv(args: &[&str]) -> (i32, String) {
    support::oncekv_cli(args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_keeps_data_and_replays_retries() {
    let _one = exclusive().await;
    let mut old = Cluster::start(3, FAST);
    old.leader(ELECTION).await;
    let session = TestSession::open(&old, 600_000, 8).await;
    for (seq, value) in [(1, "a;"), (2, "b;")] {
        let outcome = old
            .outcome(&session.request(seq, 1, append(value)), ELECTION)
            .await;
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    }
    let file = old.dir.path().join("backup.okv");
    let file = file.to_str().expect("a UTF-8 path");
    let endpoints: Vec<String> = old.nodes.iter().map(|n| n.client.clone()).collect();
    // The backup is taken under load: a writer keeps incrementing a
    // counter (each increment once, under its own key) while it is saved.
    let writer_client =
        oncekv_client::Client::connect(endpoints.clone(), oncekv_client::ClientOptions::default())
            .expect("a client");
    let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        tokio::spawn(async move {
            for _ in 0..2_000 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let incr = Command::Incr {
                    key: b"n".to_vec(),
                    by: 1,
                };
                if let Ok(done) = writer_client.execute_once(incr, None).await
                    && let Reply::Incr { value } = done.reply
                {
                    acknowledged.fetch_max(value, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    support::eventually(ELECTION, "the writer to get going", || {
        let seen = acknowledged.load(std::sync::atomic::Ordering::SeqCst);
        async move { (seen >= 5).then_some(()) }
    })
    .await;
    let acknowledged_before = acknowledged.load(std::sync::atomic::Ordering::SeqCst);
    let save = {
        let (file, endpoints) = (file.to_string(), endpoints.join(","));
        tokio::task::spawn_blocking(move || {
            oncekv(&["snapshot", "save", &file, "--endpoints", &endpoints])
        })
    };
    let (code, text) = save.await.expect("the save ran");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.expect("the writer ran");
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("sha256"), "{text}");
    let (code, text) = oncekv(&[
        "snapshot",
        "save",
        file,
        "--endpoints",
        &endpoints.join(","),
    ]);
    assert_ne!(code, 0, "an existing file is not overwritten: {text}");
    old.stop_all();

    // A damaged backup is refused, naming the problem.
    let mut damaged = std::fs::read(file).expect("the backup");
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let bad = old.dir.path().join("damaged.okv");
    std::fs::write(&bad, &damaged).expect("write");

    let mut new = Cluster::new(3, FAST);
    let initial: Vec<String> = new
        .nodes
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.peer, n.client))
        .collect();
    let initial = initial.join(",");
    let first = new.nodes[0].data_dir.to_str().expect("UTF-8").to_string();
    let (code, text) = oncekv(&[
        "snapshot",
        "restore",
        bad.to_str().expect("UTF-8"),
        "--data-dir",
        &first,
        "--id",
        "1",
        "--initial-cluster",
        &initial,
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("SHA-256"), "{text}");
    for node in &new.nodes {
        let dir = node.data_dir.to_str().expect("UTF-8");
        let id = node.id.to_string();
        let (code, text) = oncekv(&[
            "snapshot",
            "restore",
            file,
            "--data-dir",
            dir,
            "--id",
            &id,
            "--initial-cluster",
            &initial,
        ]);
        assert_eq!(code, 0, "{text}");
    }
    let (code, text) = oncekv(&[
        "snapshot",
        "restore",
        file,
        "--data-dir",
        &first,
        "--id",
        "1",
        "--initial-cluster",
        &initial,
    ]);
    assert_eq!(code, 1, "a used data directory is refused: {text}");
    new.start_all().expect("start the restored cluster");
    new.leader(ELECTION).await;
    let retry = new
        .outcome(&session.request(2, 2, append("b;")), ELECTION)
        .await;
    assert!(
        matches!(
            retry,
            Outcome::Replayed {
                reply: Reply::Append { length: 4 },
                ..
            }
        ),
        "a retry after the restore is replayed: {retry:?}"
    );
    let next = new
        .outcome(&session.request(3, 1, append("c;")), ELECTION)
        .await;
    assert_eq!(next, Outcome::Applied(Reply::Append { length: 6 }));
    let leader = new.leader(ELECTION).await;
    let value = new
        .node(leader)
        .read(
            &Query::Get {
                key: b"log".to_vec(),
            },
            false,
        )
        .await;
    assert_eq!(
        without_meta(value),
        Ok(Reply::Get {
            value: Some(b"a;b;c;".to_vec()),
            meta: None,
        })
    );
    // Every increment acknowledged before the save began is in the backup.
    let counter = new
        .node(leader)
        .read(&Query::Get { key: b"n".to_vec() }, false)
        .await;
    let Ok(Reply::Get {
        value: Some(counter),
        ..
    }) = counter
    else {
        panic!("the counter is missing: {counter:?}");
    };
    let counter: i64 = String::from_utf8_lossy(&counter).parse().expect("a number");
    assert!(
        counter >= acknowledged_before,
        "the backup lost acknowledged increments: {counter} < {acknowledged_before}"
    );
}
