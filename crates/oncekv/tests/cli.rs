//! The command line against a real node: exactly-once across separate
//! invocations, through a session file or an idempotency key.

mod support;

use serde_json::Value;
use std::io::Write as _;
use std::process::{Command as Process, Stdio};
use support::{Cluster, FAST, eventually, exclusive};

struct Cli {
    endpoint: String,
    dir: std::path::PathBuf,
}

impl Cli {
    /// A one-node cluster with a leader, and the command line aimed at it.
    async fn one_node() -> (Cluster, Cli) {
        let mut cluster = Cluster::start(1, FAST);
        cluster.leader(std::time::Duration::from_secs(15)).await;
        let cli = Cli {
            endpoint: cluster.node(1).client.clone(),
            dir: cluster.dir.path().to_path_buf(),
        };
        (cluster, cli)
    }

    /// Runs `oncekv ARGS -o json`; returns (exit code, parsed output).
    fn run(&self, args: &[&str]) -> (i32, Value) {
        self.run_with_input(args, b"")
    }

    /// Runs `oncekv ARGS` with text output; returns (exit code, stdout).
    fn run_text(&self, args: &[&str]) -> (i32, String) {
        let output = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["--endpoints", &self.endpoint])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run oncekv");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        (output.status.code().expect("exit code"), stdout)
    }

    /// Runs `oncekv ARGS -o json` with `input` on its standard input.
    fn run_with_input(&self, args: &[&str], input: &[u8]) -> (i32, Value) {
        let mut child = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["-o", "json", "--endpoints", &self.endpoint])
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run oncekv");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let output = child.wait_with_output().expect("run oncekv");
        writer.join().expect("writer").expect("write stdin");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "not JSON: {stdout:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.code().expect("exit code"), value)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classic_lesson_through_the_command_line() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    let (code, opened) = cli.run(&[
        "session",
        "open",
        "--window",
        "1",
        "--session-file",
        "s.json",
    ]);
    assert_eq!(
        (code, opened["outcome"].as_str()),
        (0, Some("applied")),
        "{opened}"
    );
    let put = [
        "put",
        "x",
        "hello",
        "--session-file",
        "s.json",
        "--seq",
        "1",
    ];
    let (code, first) = cli.run(&put);
    assert_eq!(
        (code, first["outcome"].as_str()),
        (0, Some("applied")),
        "{first}"
    );
    // In text, a replay says it is one: the DUP of the lesson is visible.
    let (code, text) = cli.run_text(&put);
    assert_eq!(
        (code, text.trim()),
        (0, "OK (replayed, original answer)"),
        "{text}"
    );
    for _ in 0..2 {
        let (code, again) = cli.run(&put);
        assert_eq!(
            (code, again["outcome"].as_str()),
            (0, Some("replayed")),
            "{again}"
        );
        assert_eq!(again["previous"], first["previous"]);
        assert_eq!(again["applied_index"], first["applied_index"]);
    }
    let (code, second) = cli.run(&[
        "put",
        "x",
        "world",
        "--session-file",
        "s.json",
        "--seq",
        "2",
    ]);
    assert_eq!(
        (code, second["outcome"].as_str()),
        (0, Some("applied")),
        "{second}"
    );
    let (code, gap) = cli.run(&["put", "x", "jump", "--session-file", "s.json", "--seq", "5"]);
    assert_eq!(code, 4, "{gap}");
    assert_eq!(gap["outcome"], "sequence_gap");
    assert_eq!(gap["expected"], 3);
    // Automatic numbering goes on past the numbers given by hand (and not
    // past the refused one).
    let (code, next) = cli.run(&["put", "x", "world", "--session-file", "s.json"]);
    assert_eq!(
        (code, next["outcome"].as_str()),
        (0, Some("applied")),
        "{next}"
    );
    assert_eq!(next["previous"], "world");
    let (code, value) = cli.run(&["get", "x"]);
    assert_eq!(
        (code, value["value"].as_str()),
        (0, Some("world")),
        "{value}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(cli.dir.join("s.json"))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the session file holds a secret");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_with_the_same_idempotency_key_applies_once() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    let (code, first) = cli.run(&["incr", "c", "--idempotency-key", "k"]);
    assert_eq!((code, first["value"].as_i64()), (0, Some(1)), "{first}");
    let (code, second) = cli.run(&["incr", "c", "--idempotency-key", "k"]);
    assert_eq!((code, second["value"].as_i64()), (0, Some(1)), "{second}");
    assert_eq!(second["outcome"], "replayed");
    let (code, value) = cli.run(&["get", "c"]);
    assert_eq!((code, value["value"].as_str()), (0, Some("1")), "{value}");
    // Automatic sequence numbers from a session file advance per invocation.
    let (code, _) = cli.run(&["session", "open", "--session-file", "auto.json"]);
    assert_eq!(code, 0);
    for expected in 2..=4 {
        let (code, incr) = cli.run(&["incr", "c", "--session-file", "auto.json"]);
        assert_eq!(
            (code, incr["value"].as_i64()),
            (0, Some(expected)),
            "{incr}"
        );
    }
    // A CAS that does not match is a definite rejection (exit 3).
    let (code, cas) = cli.run(&["cas", "c", "999", "0"]);
    assert_eq!(code, 3, "{cas}");
    assert_eq!(cas["swapped"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_too_large_for_an_argument_comes_from_standard_input() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    // Over the 128 KiB a single argument may have.
    let value: String = (0..300_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let (code, put) = cli.run_with_input(&["put", "big"], value.as_bytes());
    assert_eq!(
        (code, put["outcome"].as_str()),
        (0, Some("applied")),
        "{put}"
    );
    let (code, appended) = cli.run_with_input(&["append", "big"], b"!");
    assert_eq!(code, 0, "{appended}");
    let (code, got) = cli.run(&["get", "big"]);
    assert_eq!(code, 0, "{got}");
    assert_eq!(got["value"].as_str(), Some(format!("{value}!").as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_by_hand_of_an_unknown_request_stays_unknown_while_the_cluster_is_down() {
    let _one = exclusive().await;
    let (mut cluster, cli) = Cli::one_node().await;
    let (code, _) = cli.run(&["session", "open", "--session-file", "u.json"]);
    assert_eq!(code, 0);
    let (code, first) = cli.run(&["incr", "c", "--session-file", "u.json"]);
    assert_eq!(
        (code, first["outcome"].as_str()),
        (0, Some("applied")),
        "{first}"
    );
    // The file as a run whose answer was lost leaves it: number 1 pending.
    let path = cli.dir.join("u.json");
    let mut file: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the session file")).expect("JSON");
    file["pending"] = serde_json::json!([1]);
    std::fs::write(&path, file.to_string()).expect("write the session file");

    // Nothing can be reached: the retry cannot know, so it is unknown
    // (exit 5), never "unreachable, not applied" (exit 1).
    cluster.node(1).kill();
    let (code, retry) = cli.run(&[
        "incr",
        "c",
        "--session-file",
        "u.json",
        "--seq",
        "1",
        "--timeout",
        "2s",
    ]);
    assert_eq!(
        (code, retry["outcome"].as_str()),
        (5, Some("unknown")),
        "{retry}"
    );

    // Back up: the original answer, and the number is no longer pending.
    cluster.node(1).spawn();
    cluster.leader(std::time::Duration::from_secs(15)).await;
    let (code, replayed) = cli.run(&["incr", "c", "--session-file", "u.json", "--seq", "1"]);
    assert_eq!(
        (code, replayed["outcome"].as_str()),
        (0, Some("replayed")),
        "{replayed}"
    );
    assert_eq!(replayed["value"], first["value"]);
    let file: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the session file")).expect("JSON");
    assert_eq!(file["pending"], serde_json::json!([]), "{file}");
}

/// The lesson's resend of `--seq 1`, once its session has expired: the
/// first send applied, so the resend cannot be told "not applied"; the
/// session's records are gone, so nothing can tell, and the outcome is
/// unknown (exit 5). A new number on the expired session never reached
/// the cluster before, so it alone is told "session expired" (exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_its_session_expired_is_unknown_not_refused() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    // A short TTL (the cluster allows 100 ms and up by default), long
    // enough for the first send to land within it.
    let (code, opened) = cli.run(&[
        "session",
        "open",
        "--ttl",
        "2s",
        "--window",
        "1",
        "--session-file",
        "s.json",
    ]);
    assert_eq!(code, 0, "{opened}");
    let put = [
        "put",
        "x",
        "hello",
        "--session-file",
        "s.json",
        "--seq",
        "1",
    ];
    let (code, first) = cli.run(&put);
    assert_eq!(
        (code, first["outcome"].as_str()),
        (0, Some("applied")),
        "{first}"
    );
    eventually(
        std::time::Duration::from_secs(30),
        "the session to expire",
        || async {
            let (code, status) = cli.run(&["status"]);
            (code == 0 && status["sessions"] == 0).then_some(())
        },
    )
    .await;

    let (code, resend) = cli.run(&put);
    assert_eq!(
        (code, resend["outcome"].as_str()),
        (5, Some("unknown")),
        "the resend of a number that applied: {resend}"
    );
    let said = resend["error"].as_str().unwrap_or_default();
    assert!(said.contains("outcome unknown"), "{said}");
    assert!(said.contains("may have applied"), "{said}");
    assert!(said.contains("session has expired"), "{said}");
    assert!(!said.contains("not applied"), "{said}");
    assert_eq!(resend["last_answer"], "session_expired", "{resend}");
    // The file still awaits the number: a later resend is unknown too.
    let (code, again) = cli.run(&put);
    assert_eq!(
        (code, again["outcome"].as_str()),
        (5, Some("unknown")),
        "{again}"
    );

    // A number never sent before: nothing of it can have applied.
    let (code, fresh) = cli.run(&["put", "x", "later", "--session-file", "s.json"]);
    assert_eq!(
        (code, fresh["outcome"].as_str()),
        (4, Some("session_expired")),
        "{fresh}"
    );
    let (code, value) = cli.run(&["get", "x"]);
    assert_eq!(
        (code, value["value"].as_str()),
        (0, Some("hello")),
        "{value}"
    );
}

/// `lease grant` takes its time-to-live as `--ttl`, as `lock`, `elect` and
/// `session open` do (the positional form before it still works); without
/// one, or with both, it is a usage error that names the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_granted_with_ttl_as_a_lock_is() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    let (code, granted) = cli.run(&["lease", "grant", "jobs", "--ttl", "30s"]);
    assert_eq!(code, 0, "{granted}");
    assert_eq!(granted["ttl_ms"].as_u64(), Some(30_000), "{granted}");
    let (code, granted) = cli.run(&["lease", "grant", "older", "20s"]);
    assert_eq!(code, 0, "{granted}");
    assert_eq!(granted["ttl_ms"].as_u64(), Some(20_000), "{granted}");
    let (code, listed) = cli.run_text(&["lease", "list"]);
    assert_eq!(code, 0, "{listed}");
    assert!(
        listed.contains("jobs") && listed.contains("older"),
        "{listed}"
    );
    for args in [
        &["lease", "grant", "none"][..],
        &["lease", "grant", "both", "5s", "--ttl", "5s"],
    ] {
        let output = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["--endpoints", &cli.endpoint])
            .output()
            .expect("run oncekv");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--ttl"), "{args:?}: {stderr}");
    }
}

/// An alarm raised by hand holds writes that grow the store, not reads or
/// deletes, until cleared; `alarm list` shows it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_raised_by_hand_holds_writes_until_cleared() {
    let _one = exclusive().await;
    let (_cluster, cli) = Cli::one_node().await;
    assert_eq!(cli.run(&["put", "k", "v"]).0, 0);
    let (code, raised) = cli.run(&["alarm", "raise", "--member", "3"]);
    assert_eq!(
        (code, raised["changed"].as_bool()),
        (0, Some(true)),
        "{raised}"
    );
    let (code, listed) = cli.run_text(&["alarm", "list"]);
    assert!(code == 0 && listed.contains("NOSPACE"), "{code}: {listed}");
    let (code, refused) = cli.run(&["put", "k2", "v"]);
    assert_ne!(code, 0, "{refused}");
    let (code, read) = cli.run_text(&["get", "k"]);
    assert_eq!((code, read.trim()), (0, "v"));
    assert_eq!(cli.run(&["del", "k"]).0, 0);
    let (code, cleared) = cli.run(&["alarm", "clear", "--member", "3"]);
    assert_eq!(
        (code, cleared["changed"].as_bool()),
        (0, Some(true)),
        "{cleared}"
    );
    let (code, listed) = cli.run_text(&["alarm", "list"]);
    assert!(code == 0 && !listed.contains("NOSPACE"), "{code}: {listed}");
    assert_eq!(cli.run(&["put", "k2", "v"]).0, 0);
}
