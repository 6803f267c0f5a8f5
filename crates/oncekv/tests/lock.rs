//! Locks and elections against a real node: the client's `Lock` (a retried
//! acquire is the same ownership; a second contender waits its turn), and
//! `oncekv lock` / `oncekv elect` as processes (holders never overlap and
//! their fencing revisions grow; a holder killed with SIGKILL loses the
//! lock after its TTL; a second campaigner is elected when the first
//! resigns, and a listener sees both).

mod support;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv_client::{
    Client, ClientOptions, Command, Compare, CompareOp, CompareTarget, EarlierSends, KeyScope,
    Lock, Reply, SessionOptions, Txn, TxnOp,
};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{Cluster, FAST, eventually, exclusive};

/// A one-node cluster with a leader; its client address.
async fn one_node() -> (Cluster, String) {
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();
    (cluster, endpoint)
}

fn client(endpoint: &str) -> Client {
    let options = ClientOptions::default().with_deadline(Duration::from_secs(15));
    Client::connect([endpoint.to_string()], options).expect("client")
}

/// The keys under `prefix` now.
async fn contenders(client: &Client, prefix: &str) -> usize {
    client.scan(prefix, 0).await.expect("scan").entries.len()
}

/// An `oncekv` process, killed if still running when dropped.
struct Proc {
    child: Child,
    lines: Option<mpsc::Receiver<String>>,
}

impl Proc {
    fn spawn(endpoint: &str, dir: &Path, args: &[&str], capture: bool) -> Proc {
        let mut child = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["--endpoints", endpoint])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(if capture {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("run oncekv");
        let lines = capture.then(|| {
            let stdout = child.stdout.take().expect("stdout");
            let (send, receive) = mpsc::channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if send.send(line).is_err() {
                        return;
                    }
                }
            });
            receive
        });
        Proc { child, lines }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal");
    }

    /// The next line of its output containing `what` (earlier lines are
    /// passed over and returned too).
    fn expect_line(&self, what: &str, timeout: Duration) -> Vec<String> {
        let lines = self.lines.as_ref().expect("captured output");
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(what);
                    seen.push(line);
                    if found {
                        return seen;
                    }
                }
                Err(_) => panic!("no line with {what:?} in time; saw {seen:?}"),
            }
        }
    }

    /// Its exit code, waiting at most `timeout`.
    fn exit_code(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code().expect("an exit code");
            }
            assert!(Instant::now() < deadline, "oncekv did not exit in time");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_is_the_same_ownership_and_a_second_contender_waits() {
    let _one = exclusive().await;
    let (_cluster, endpoint) = one_node().await;
    let client = client(&endpoint);
    let session = client
        .open_session(SessionOptions::default())
        .await
        .expect("session");
    let mut lock = Lock::new(&session, "jobs", Duration::from_secs(5));
    let held = lock.acquire().await.expect("acquire");
    assert!(held.key.starts_with(b"jobs/"), "{held:?}");
    assert_eq!(lock.held(), Some(&held));

    // The very request retried (same sequence number): the original answer.
    let seq = session.next_seq() - 1;
    let txn = Txn {
        compare: vec![Compare {
            key: held.key.clone(),
            scope: KeyScope::Key,
            target: CompareTarget::CreateRevision(0),
            op: CompareOp::Equal,
        }],
        success: vec![
            TxnOp::Put {
                key: held.key.clone(),
                value: Vec::new(),
                lease: Some(lock.lease().to_string()),
            },
            TxnOp::Get {
                key: held.key.clone(),
            },
        ],
        failure: vec![TxnOp::Get {
            key: held.key.clone(),
        }],
    };
    let retried = session
        .execute_seq(seq, None, Command::Txn(txn), EarlierSends::None)
        .await
        .expect("retry");
    assert!(retried.replayed, "{retried:?}");
    assert_eq!(retried.applied_index, held.revision);
    let Reply::Txn { succeeded, results } = retried.reply else {
        panic!("{:?}", retried.reply);
    };
    assert!(succeeded);
    assert!(
        matches!(results.last(), Some(Reply::Get { meta: Some(meta), .. }) if meta.create_revision == held.revision)
    );

    // Acquired again on the same session (a new request, as after a lost
    // reply): the same key and revision, at once.
    assert_eq!(lock.acquire().await.expect("again"), held);
    let mut same_session = Lock::new(&session, "jobs", Duration::from_secs(5));
    assert_eq!(same_session.acquire().await.expect("same session"), held);
    assert_eq!(contenders(&client, "jobs/").await, 1);

    // Another session queues behind it, with a higher revision, and holds
    // the lock only once it is released.
    let other_session = client
        .open_session(SessionOptions::default())
        .await
        .expect("session");
    let mut other = Lock::new(&other_session, "jobs", Duration::from_secs(5));
    let queued = other.queue().await.expect("queue");
    assert!(queued.revision > held.revision, "{queued:?} after {held:?}");
    let waiting = tokio::spawn(async move {
        let owned = other.acquire().await;
        (other, owned)
    });
    // The first contender is still the owner (the oldest key).
    let owner = client.election_leader("jobs").await.expect("owner");
    assert_eq!(owner.map(|o| o.key), Some(held.key.clone()));
    assert!(!waiting.is_finished());
    lock.unlock().await.expect("unlock");
    let (mut other, owned) = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter acquires")
        .expect("task");
    assert_eq!(owned.expect("acquired"), queued);
    other.unlock().await.expect("unlock");
    assert_eq!(contenders(&client, "jobs/").await, 0);
    assert!(
        client
            .read(oncekv_client::Query::LeaseList, false)
            .await
            .is_ok(),
        "leases listed"
    );
}

/// The marks COMMAND wrote: (start or end, revision) per line.
fn marks(path: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let (mark, revision) = line.split_once(' ').expect("a mark");
            (mark.to_string(), revision.parse().expect("a revision"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lock_holders_never_overlap_and_fencing_revisions_grow() {
    let _one = exclusive().await;
    let (cluster, endpoint) = one_node().await;
    let dir = cluster.dir.path().to_path_buf();
    let log: PathBuf = dir.join("marks");
    let script = format!(
        "echo \"start $ONCEKV_LOCK_REVISION\" >> {log}; sleep 0.2; \
         echo \"end $ONCEKV_LOCK_REVISION\" >> {log}; \
         case \"$ONCEKV_LOCK_KEY\" in critical/*) exit 3;; esac",
        log = log.display()
    );
    let holders: Vec<Proc> = (0..4)
        .map(|_| {
            Proc::spawn(
                &endpoint,
                &dir,
                &["lock", "critical", "--", "sh", "-c", &script],
                false,
            )
        })
        .collect();
    for mut holder in holders {
        // COMMAND's exit code (3) is the lock's.
        assert_eq!(holder.exit_code(Duration::from_secs(60)), 3);
    }
    let marks = marks(&log);
    assert_eq!(marks.len(), 8, "{marks:?}");
    let mut last = 0;
    for pair in marks.chunks(2) {
        assert_eq!(pair[0].0, "start", "{marks:?}");
        assert_eq!(pair[1].0, "end", "interleaved: {marks:?}");
        assert_eq!(pair[0].1, pair[1].1, "interleaved: {marks:?}");
        assert!(pair[0].1 > last, "fencing revisions must grow: {marks:?}");
        last = pair[0].1;
    }
    let client = client(&endpoint);
    assert_eq!(contenders(&client, "critical/").await, 0, "all released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_loses_the_lock_after_its_ttl() {
    let _one = exclusive().await;
    let (cluster, endpoint) = one_node().await;
    let dir = cluster.dir.path().to_path_buf();
    let client = client(&endpoint);
    let first_pid = dir.join("first.pid");
    let first_revision = dir.join("first.revision");
    let second_revision = dir.join("second.revision");
    let first_script = format!(
        "echo $ONCEKV_LOCK_REVISION > {}; echo $$ > {}; exec sleep 60",
        first_revision.display(),
        first_pid.display()
    );
    let first = Proc::spawn(
        &endpoint,
        &dir,
        &[
            "lock",
            "--ttl",
            "2s",
            "res",
            "--",
            "sh",
            "-c",
            &first_script,
        ],
        false,
    );
    let sleeper: i32 = eventually(Duration::from_secs(15), "the first holder", || {
        let path = first_pid.clone();
        async move { std::fs::read_to_string(path).ok()?.trim().parse().ok() }
    })
    .await;
    // Whatever happens, the orphaned COMMAND goes too.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
        }
    }
    let _sleeper = KillOnDrop(sleeper);

    let second_script = format!("echo $ONCEKV_LOCK_REVISION > {}", second_revision.display());
    let mut second = Proc::spawn(
        &endpoint,
        &dir,
        &["lock", "res", "--", "sh", "-c", &second_script],
        false,
    );
    eventually(Duration::from_secs(15), "the second to queue", || {
        let client = client.clone();
        async move { (contenders(&client, "res/").await == 2).then_some(()) }
    })
    .await;
    assert!(
        !second_revision.exists(),
        "the second ran while the first held"
    );

    first.signal(Signal::SIGKILL);
    let killed = Instant::now();
    assert_eq!(second.exit_code(Duration::from_secs(30)), 0);
    let waited = killed.elapsed();
    // The lease was renewed at most ttl/3 before the kill.
    assert!(
        waited >= Duration::from_secs(1),
        "the lock was freed {waited:?} after the kill, before the 2s TTL"
    );
    let read = |path: &Path| -> u64 {
        std::fs::read_to_string(path)
            .expect("revision")
            .trim()
            .parse()
            .expect("a number")
    };
    assert!(read(&second_revision) > read(&first_revision));
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_campaigner_is_elected_when_the_first_resigns() {
    let _one = exclusive().await;
    let (cluster, endpoint) = one_node().await;
    let dir = cluster.dir.path().to_path_buf();
    let client = client(&endpoint);
    let listener = Proc::spawn(&endpoint, &dir, &["elect", "--listen", "boss"], true);
    listener.expect_line("no leader", Duration::from_secs(15));

    let mut alice = Proc::spawn(&endpoint, &dir, &["elect", "boss", "alice"], true);
    alice.expect_line("elected alice", Duration::from_secs(15));
    listener.expect_line("leader alice", Duration::from_secs(15));

    let mut bob = Proc::spawn(&endpoint, &dir, &["elect", "boss", "bob"], true);
    eventually(Duration::from_secs(15), "bob to campaign", || {
        let client = client.clone();
        async move { (contenders(&client, "boss/").await == 2).then_some(()) }
    })
    .await;
    let leader = client.election_leader("boss").await.expect("leader");
    assert_eq!(leader.expect("a leader").value, b"alice");

    alice.signal(Signal::SIGTERM);
    alice.expect_line("resigned", Duration::from_secs(15));
    assert_eq!(alice.exit_code(Duration::from_secs(15)), 0);
    bob.expect_line("elected bob", Duration::from_secs(15));
    let seen = listener.expect_line("leader bob", Duration::from_secs(15));
    assert!(
        !seen.iter().any(|line| line.contains("leader alice")),
        "{seen:?}"
    );

    bob.signal(Signal::SIGINT);
    assert_eq!(bob.exit_code(Duration::from_secs(15)), 0);
    listener.expect_line("no leader", Duration::from_secs(15));
    listener.signal(Signal::SIGINT);
    let mut listener = listener;
    assert_eq!(listener.exit_code(Duration::from_secs(15)), 0);
}
