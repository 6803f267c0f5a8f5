//! etcd's Auth service, compared with etcd itself: Debian's `etcdctl`
//! runs the same user, role and permission commands against a real
//! one-member etcd and against an oncekv node (adding users and roles,
//! granting key and prefix permissions, enabling authentication through
//! etcdctl's own root-role steps, reads and writes as users allowed and
//! refused, listings, password changes, revocations, deletions, the root
//! user's protections and the error cases), and their outputs and exit
//! codes must be equal once the response headers are dropped. Then what
//! only oncekv does or refuses: a watch and a lease's keys under
//! authentication, permission ranges the native model cannot hold, and on
//! three nodes the whole service through followers, AuthStatus and an
//! idempotent role creation.
//!
//! Needs `etcd` and `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-server and etcd-client); without them the test says so (and fails
//! in CI).

mod support;

use oncekv_harness::testing::{EtcdProcess, on_path};
use oncekv_proto::etcd::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcd::etcdserverpb::{
    AuthRoleAddRequest, AuthStatusRequest, AuthenticateRequest,
};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::etcdctl::{Run, answering, etcdctl};
use support::{Cluster, Dependency, FAST, eventually, exclusive, missing_dependency};

/// `text` with the response header of each JSON line dropped (its ids,
/// term and revision differ between two servers) and `endpoint` named
/// alike.
fn without_headers(text: &str, endpoint: &str) -> String {
    text.replace(endpoint, "ENDPOINT")
        .lines()
        .map(
            |line| match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::Object(mut map)) => {
                    map.remove("header");
                    serde_json::Value::Object(map).to_string()
                }
                _ => line.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// One step of the script: `etcdctl` arguments and what it reads.
struct Step {
    args: Vec<&'static str>,
    stdin: &'static str,
}

/// The script both servers run, in order: `root` logs in with `rootpw`,
/// `alice` (role `app`) and `carol` (role `reader`) with theirs.
fn script() -> Vec<Step> {
    const ROOT: &str = "--user=root:rootpw";
    const ALICE: &str = "--user=alice:alicepw";
    const NO_PROMPT: &str = "--interactive=false";
    let step = |args: &[&'static str]| Step {
        args: args.to_vec(),
        stdin: "",
    };
    let root = |args: &[&'static str]| {
        let mut all = vec![ROOT];
        all.extend_from_slice(args);
        Step {
            args: all,
            stdin: "",
        }
    };
    let alice = |args: &[&'static str]| {
        let mut all = vec![ALICE];
        all.extend_from_slice(args);
        Step {
            args: all,
            stdin: "",
        }
    };
    vec![
        // No root user yet.
        step(&["auth", "enable"]),
        step(&[
            "user",
            "add",
            "root",
            "--new-user-password=rootpw",
            NO_PROMPT,
        ]),
        step(&[
            "user",
            "add",
            "root",
            "--new-user-password=other",
            NO_PROMPT,
        ]),
        step(&["user", "get", "root"]),
        // etcdctl adds the root role and grants it to root itself.
        step(&["auth", "enable"]),
        step(&["user", "get", "root"]),
        step(&["put", "k", "v"]),
        step(&["--user=root:wrong", "get", "k"]),
        step(&["--user=nobody:pw", "get", "k"]),
        root(&["user", "get", "root"]),
        root(&["auth", "enable"]),
        root(&["role", "add", "app"]),
        root(&["role", "add", "app"]),
        root(&["role", "add", ""]),
        root(&["role", "add", "reader"]),
        root(&[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "app/",
            "--prefix",
        ]),
        root(&["role", "grant-permission", "app", "read", "cfg"]),
        root(&["role", "grant-permission", "app", "write", "out"]),
        root(&["role", "grant-permission", "reader", "read", "", "--prefix"]),
        root(&["role", "grant-permission", "nope", "read", "x"]),
        root(&["role", "get", "app"]),
        root(&["role", "get", "app", "-w", "json"]),
        root(&["role", "get", "reader", "-w", "json"]),
        root(&["role", "get", "root"]),
        root(&["role", "get", "nope"]),
        root(&["role", "list"]),
        root(&[
            "user",
            "add",
            "alice",
            "--new-user-password=alicepw",
            NO_PROMPT,
        ]),
        root(&["user", "add", "bob", "--no-password"]),
        root(&["user", "add", "carol:carolpw"]),
        root(&["user", "add", "", "--new-user-password=pw", NO_PROMPT]),
        root(&["user", "grant-role", "alice", "app"]),
        root(&["user", "grant-role", "alice", "app"]),
        root(&["user", "grant-role", "alice", "nope"]),
        root(&["user", "grant-role", "nobody", "app"]),
        root(&["user", "grant-role", "carol", "reader"]),
        root(&["user", "get", "alice"]),
        root(&["user", "get", "alice", "--detail"]),
        root(&["user", "get", "bob"]),
        root(&["user", "get", "bob", "-w", "json"]),
        root(&["user", "get", "nobody"]),
        root(&["user", "list"]),
        root(&["user", "list", "-w", "json"]),
        root(&["put", "cfg", "v"]),
        // What alice may and may not do.
        alice(&["get", "cfg"]),
        alice(&["put", "cfg", "x"]),
        alice(&["put", "app/x", "1"]),
        alice(&["get", "app/", "--prefix"]),
        alice(&["get", "app", "--prefix"]),
        alice(&["put", "out", "v"]),
        alice(&["get", "out"]),
        alice(&["get", "other"]),
        alice(&["del", "app/x"]),
        alice(&["put", "app/x", "2"]),
        step(&["--user=carol:carolpw", "get", "", "--prefix", "--keys-only"]),
        step(&["--user=carol:carolpw", "put", "z", "1"]),
        alice(&["user", "list"]),
        alice(&["user", "get", "alice"]),
        alice(&["user", "get", "root"]),
        alice(&["role", "get", "app"]),
        alice(&["role", "get", "reader"]),
        alice(&["role", "list"]),
        alice(&["auth", "disable"]),
        alice(&[
            "user",
            "add",
            "mallory",
            "--new-user-password=pw",
            NO_PROMPT,
        ]),
        // A new password voids the old one.
        Step {
            args: vec![ROOT, "user", "passwd", "alice", NO_PROMPT],
            stdin: "alicepw2\n",
        },
        alice(&["get", "cfg"]),
        step(&["--user=alice:alicepw2", "get", "cfg"]),
        // Revocations and deletions.
        root(&["role", "revoke-permission", "app", "cfg"]),
        root(&["role", "revoke-permission", "app", "cfg"]),
        root(&["role", "revoke-permission", "app", "app/", "--prefix"]),
        root(&["role", "revoke-permission", "nope", "x"]),
        root(&["role", "get", "app"]),
        step(&["--user=alice:alicepw2", "get", "cfg"]),
        root(&["user", "revoke-role", "alice", "app"]),
        root(&["user", "revoke-role", "alice", "app"]),
        root(&["user", "revoke-role", "root", "root"]),
        root(&["user", "delete", "root"]),
        root(&["role", "delete", "root"]),
        root(&["role", "delete", "reader"]),
        root(&["user", "get", "carol"]),
        root(&["role", "delete", "reader"]),
        root(&["user", "delete", "bob"]),
        root(&["user", "delete", "bob"]),
        root(&["auth", "disable"]),
        // Open again: no user needed, and a login is not refused.
        step(&["get", "cfg"]),
        root(&["get", "cfg"]),
        step(&["user", "list"]),
        step(&["role", "list"]),
        root(&["auth", "disable"]),
    ]
}

/// Runs the script against `endpoint`; returns each step's output, its
/// headers dropped.
fn transcript(endpoint: &str) -> Vec<(String, Run)> {
    script()
        .into_iter()
        .map(|step| {
            let mut run = etcdctl(endpoint, &step.args, step.stdin);
            run.stdout = without_headers(&run.stdout, endpoint);
            run.stderr = without_headers(&run.stderr, endpoint);
            (format!("etcdctl {}", step.args.join(" ")), run)
        })
        .collect()
}

/// The lines `etcdctl ARGS` prints on `endpoint` up to and with the first
/// line equal to `last` (within 30 s); the command is then stopped.
fn lines_until(endpoint: &str, args: &[&str], last: &str) -> Vec<String> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl");
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
        "etcdctl {args:?} on {endpoint} printed {seen:?}"
    );
    seen
}

/// Whether `etcdctl` is on PATH; reports its absence for `test`.
fn have_etcdctl(test: &str) -> bool {
    if on_path("etcdctl").is_some() {
        return true;
    }
    missing_dependency(test, Dependency::Etcdctl, "no etcdctl binary on PATH");
    false
}

/// Asserts `run` succeeded and printed `stdout`.
#[track_caller]
fn printed(run: &Run, stdout: &str) {
    assert_eq!((run.code, run.stdout.as_str()), (0, stdout), "{run:?}");
}

/// Asserts `run` failed with etcdctl's `Error: <error>`.
#[track_caller]
fn failed(run: &Run, error: &str) {
    assert_eq!(
        (run.code, run.stderr.trim()),
        (1, format!("Error: {error}").as_str()),
        "{run:?}"
    );
}

/// Adds `root` (password `rootpw`) and enables authentication through
/// `endpoint`, as etcdctl does it (adding and granting the root role).
fn enable_with_root(endpoint: &str) {
    let added = etcdctl(
        endpoint,
        &[
            "user",
            "add",
            "root",
            "--new-user-password=rootpw",
            "--interactive=false",
        ],
        "",
    );
    printed(&added, "User root created\n");
    printed(
        &etcdctl(endpoint, &["auth", "enable"], ""),
        "Authentication Enabled\n",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_manages_users_and_roles_on_oncekv_as_on_etcd() {
    const TEST: &str = "etcd_auth::etcdctl_manages_users_and_roles_on_oncekv_as_on_etcd";
    let _one = exclusive().await;
    if !have_etcdctl(TEST) {
        return;
    }
    let Some(etcd) = EtcdProcess::start() else {
        missing_dependency(TEST, Dependency::Etcd, "no etcd binary on PATH");
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

    // Ranges the native model cannot hold are refused, saying so; every
    // key from the empty key on is every key.
    let root = "--user=root:rootpw";
    enable_again(&oncekv);
    for (args, what) in [
        (
            &[root, "role", "grant-permission", "app", "read", "a", "c"][..],
            "a range other than one key or a prefix",
        ),
        (
            &[
                root,
                "role",
                "grant-permission",
                "app",
                "read",
                "f",
                "--from-key",
            ][..],
            "every key from a key on (--from-key)",
        ),
    ] {
        failed(
            &etcdctl(&oncekv, args, ""),
            &format!(
                "rpc error: code = Unimplemented desc = oncekv: a permission on {what} is not \
                 served (see docs/etcd-compatibility.md)"
            ),
        );
    }
    let added = etcdctl(&oncekv, &[root, "role", "add", "all"], "");
    printed(&added, "Role all created\n");
    let every = etcdctl(
        &oncekv,
        &[
            root,
            "role",
            "grant-permission",
            "all",
            "read",
            "",
            "--from-key",
        ],
        "",
    );
    printed(&every, "Role all updated\n");
    let listed = etcdctl(&oncekv, &[root, "role", "get", "all", "-w", "json"], "");
    assert_eq!(
        without_headers(&listed.stdout, &oncekv),
        r#"{"perm":[{"key":"AA==","range_end":"AA=="}]}"#,
        "{listed:?}"
    );
    // A password the node cannot store is refused before anything is
    // proposed (etcd takes an empty one).
    let empty = etcdctl(
        &oncekv,
        &[root, "user", "add", "dave", "--interactive=false"],
        "\n",
    );
    assert_eq!(empty.code, 1, "{empty:?}");
    assert!(
        empty.stderr.contains("oncekv: a password may not be empty"),
        "{empty:?}"
    );
}

/// Enables authentication again on a node whose root user exists.
fn enable_again(endpoint: &str) {
    printed(
        &etcdctl(endpoint, &["auth", "enable"], ""),
        "Authentication Enabled\n",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_authentication_a_watch_and_a_leases_keys_show_only_what_the_user_may_read() {
    let _one = exclusive().await;
    if !have_etcdctl(
        "etcd_auth::under_authentication_a_watch_and_a_leases_keys_show_only_what_the_user_may_read",
    ) {
        return;
    }
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let node = cluster.node(1).client.clone();
    answering(&node).await;
    let root = "--user=root:rootpw";
    let alice = "--user=alice:pw";
    for args in [
        &["role", "add", "app"][..],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "app/",
            "--prefix",
        ],
        &[
            "user",
            "add",
            "alice",
            "--new-user-password=pw",
            "--interactive=false",
        ],
        &["user", "grant-role", "alice", "app"],
    ] {
        let run = etcdctl(&node, args, "");
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
    }
    enable_with_root(&node);

    // Her lease, holding a key she may read and one she may not (root, an
    // admin, attaches both): she is told of hers only. Another user's
    // lease is not hers to ask about.
    let granted = etcdctl(&node, &[alice, "lease", "grant", "100"], "");
    let lease = granted
        .stdout
        .split(' ')
        .nth(1)
        .filter(|id| id.len() == 16)
        .unwrap_or_else(|| panic!("{granted:?}"))
        .to_string();
    for key in ["app/leased", "secret"] {
        let put = etcdctl(&node, &[root, "put", key, "v", "--lease", &lease], "");
        printed(&put, "OK\n");
    }
    let mine = etcdctl(&node, &[alice, "lease", "timetolive", &lease, "--keys"], "");
    assert!(
        mine.code == 0
            && mine
                .stdout
                .trim_end()
                .ends_with("attached keys([app/leased])"),
        "{mine:?}"
    );
    let all = etcdctl(&node, &[root, "lease", "timetolive", &lease, "--keys"], "");
    assert!(
        all.stdout.contains("app/leased") && all.stdout.contains("secret"),
        "{all:?}"
    );
    let roots = etcdctl(&node, &[root, "lease", "grant", "100"], "");
    let roots = roots
        .stdout
        .split(' ')
        .nth(1)
        .filter(|id| id.len() == 16)
        .unwrap_or_else(|| panic!("{roots:?}"))
        .to_string();
    let refused = etcdctl(&node, &[alice, "lease", "timetolive", &roots], "");
    assert!(
        refused.code != 0 && refused.stderr.contains("permission denied"),
        "{refused:?}"
    );

    // A watch of her prefix sees its changes; one of keys she may not
    // read is cancelled, saying why.
    printed(&etcdctl(&node, &[root, "put", "app/w", "done"], ""), "OK\n");
    let seen = lines_until(
        &node,
        &[alice, "watch", "app/", "--prefix", "--rev", "1"],
        "done",
    );
    assert!(seen.iter().all(|line| !line.contains("secret")), "{seen:?}");
    let refused = etcdctl(&node, &[alice, "watch", "secret"], "");
    assert_eq!(refused.code, 5, "{refused:?}");
    assert!(
        refused.stderr.contains("watch was canceled")
            && refused.stderr.contains("etcdserver: permission denied"),
        "{refused:?}"
    );
}

/// A request carrying `token` in etcd's `token` metadata, and the
/// idempotency key `key` if given.
fn with_metadata<T>(message: T, token: Option<&str>, key: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("token", token.parse().expect("metadata value"));
    }
    if let Some(key) = key {
        request.metadata_mut().insert(
            oncekv_proto::IDEMPOTENCY_KEY_METADATA,
            key.parse().expect("metadata value"),
        );
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_serve_the_auth_service_through_the_leader() {
    let _one = exclusive().await;
    if !have_etcdctl("etcd_auth::followers_serve_the_auth_service_through_the_leader") {
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

    // Every change and login through followers.
    enable_with_root(one);
    let root = "--user=root:rootpw";
    printed(&etcdctl(other, &[root, "put", "k", "v"], ""), "OK\n");
    printed(&etcdctl(one, &[root, "get", "k"], ""), "k\nv\n");
    printed(&etcdctl(other, &[root, "role", "list"], ""), "root\n");
    failed(
        &etcdctl(one, &["get", "k"], ""),
        "etcdserver: user name is empty",
    );
    // A serializable read on a follower checks the token there.
    let serializable = [root, "get", "k", "--consistency", "s"];
    eventually(Duration::from_secs(10), "a serializable read", || async {
        (etcdctl(other, &serializable, "").stdout == "k\nv\n").then_some(())
    })
    .await;

    // AuthStatus (etcdctl 3.4 has no command for it), as root only.
    let mut auth = AuthClient::connect(format!("http://{one}"))
        .await
        .expect("connect");
    let token = auth
        .authenticate(AuthenticateRequest {
            name: "root".into(),
            password: "rootpw".into(),
        })
        .await
        .expect("a login")
        .into_inner()
        .token;
    let status = auth
        .auth_status(with_metadata(AuthStatusRequest {}, Some(&token), None))
        .await
        .expect("auth status")
        .into_inner();
    assert!(status.enabled, "{status:?}");
    assert!(status.auth_revision > 0, "{status:?}");
    let anonymous = auth
        .auth_status(AuthStatusRequest {})
        .await
        .expect_err("no user");
    assert_eq!(
        (anonymous.code(), anonymous.message()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty"
        )
    );

    // A role creation resent with the idempotency metadata is answered
    // as the first was; without it, the resend is refused as on etcd.
    let add = |name: &str, key: Option<&str>| {
        let message = AuthRoleAddRequest { name: name.into() };
        with_metadata(message, Some(&token), key)
    };
    let first = auth
        .role_add(add("ops", Some("add-ops")))
        .await
        .expect("role add")
        .into_inner();
    let again = auth
        .role_add(add("ops", Some("add-ops")))
        .await
        .expect("role add resent")
        .into_inner();
    assert_eq!(again, first);
    let plain = auth
        .role_add(add("ops", None))
        .await
        .expect_err("a second role add");
    assert_eq!(
        (plain.code(), plain.message()),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: role name already exists"
        )
    );
    let wrong = auth
        .authenticate(AuthenticateRequest {
            name: "root".into(),
            password: "wrong".into(),
        })
        .await
        .expect_err("a wrong password");
    assert_eq!(
        (wrong.code(), wrong.message()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password"
        )
    );
}
