//! Users, roles and permissions on a real 3-node cluster with TLS on both
//! ports and client certificates required: once authentication is enabled
//! every call needs a user (a password's token, or a client certificate
//! naming one), keys outside a user's grants are refused, membership and
//! status need the admin role, a session belongs to its user (its secret
//! is not enough), and the exactly-once guarantee still holds across a
//! leader kill.

mod support;

use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Credentials, EarlierSends, Query, Reply,
    SessionOptions,
};
use oncekv_state::{ADMIN_ROLE, Access, AuthCommand, Permission, TokenKey};
use std::process::{Command as Process, Stdio};
use std::time::Duration;
use support::{Cluster, FAST, eventually, exclusive};

const ELECTION: Duration = Duration::from_secs(20);

fn client(cluster: &Cluster, credentials: Option<Credentials>) -> Client {
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let options = ClientOptions {
        deadline: Duration::from_secs(20),
        credentials,
        ..cluster.client_options()
    };
    Client::connect(endpoints, options).expect("a client")
}

fn password(user: &str, password: &str) -> Option<Credentials> {
    Some(Credentials::Password {
        user: user.into(),
        password: password.into(),
    })
}

async fn change(client: &Client, change: AuthCommand) {
    let done = client
        .execute_once(Command::Auth(change.clone()), None)
        .await
        .unwrap_or_else(|e| panic!("{change:?}: {e}"));
    assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
}

/// The leader's id, asked as `admin` (status needs the role once
/// authentication is enabled).
async fn leader(cluster: &Cluster, admin: &Client) -> u64 {
    let addresses: Vec<(u64, String)> = cluster
        .nodes
        .iter()
        .filter(|n| n.child.is_some())
        .map(|n| (n.id, n.client.clone()))
        .collect();
    eventually(ELECTION, "a leader", || {
        let addresses = addresses.clone();
        async move {
            for (id, address) in addresses {
                if let Ok(status) = admin.status(Some(&address)).await
                    && status.is_leader
                {
                    return Some(id);
                }
            }
            None
        }
    })
    .await
}

/// Sets up root (admin), alice (readwrite on `app/`) and mallory
/// (readwrite on `other/`), then enables authentication.
async fn secure(cluster: &Cluster) {
    let anyone = client(cluster, None);
    let hash = |p: &str| Some(p.to_string());
    let setup = [
        AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: hash("root-pw"),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
        AuthCommand::RoleAdd { name: "app".into() },
        AuthCommand::RoleGrant {
            role: "app".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"app/".to_vec(),
                prefix: true,
            },
        },
        AuthCommand::UserAdd {
            name: "alice".into(),
            password_hash: hash("alice-pw"),
        },
        AuthCommand::UserGrantRole {
            user: "alice".into(),
            role: "app".into(),
        },
        AuthCommand::RoleAdd {
            name: "other".into(),
        },
        AuthCommand::RoleGrant {
            role: "other".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"other/".to_vec(),
                prefix: true,
            },
        },
        AuthCommand::UserAdd {
            name: "mallory".into(),
            password_hash: hash("mallory-pw"),
        },
        AuthCommand::UserGrantRole {
            user: "mallory".into(),
            role: "other".into(),
        },
        AuthCommand::Enable {
            token_key: TokenKey([0; 32]),
        },
    ];
    for command in setup {
        change(&anyone, command).await;
    }
    // A follower enforces authentication once it has applied the enable:
    // until then it still serves anyone (its state lags the leader's).
    // Wait for every node, so what follows is judged the same anywhere.
    eventually(ELECTION, "every node enforcing authentication", || async {
        for node in cluster.nodes.iter().filter(|n| n.child.is_some()) {
            // The harness's certificate names no user: refused once on.
            if node.status().await.is_ok() {
                return None;
            }
        }
        Some(())
    })
    .await;
}

fn incr(key: &str) -> Command {
    Command::Incr {
        key: key.as_bytes().to_vec(),
        by: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_and_auth_on_users_reach_only_their_keys_and_retries_still_replay() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start_tls(3, FAST, true);
    cluster.leader(ELECTION).await;
    secure(&cluster).await;
    let root = client(&cluster, password("root", "root-pw"));
    let alice = client(&cluster, password("alice", "alice-pw"));
    let mallory = client(&cluster, password("mallory", "mallory-pw"));

    // The harness's client certificate names a user that does not exist
    // (yet): with no token either, the call is refused, not applied.
    let anyone = client(&cluster, None);
    let refused = anyone.execute_once(incr("app/n"), None).await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "{refused:?}"
    );
    let wrong = client(&cluster, password("alice", "guess"));
    let refused = wrong
        .read(
            Query::Get {
                key: b"app/n".to_vec(),
            },
            false,
        )
        .await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "{refused:?}"
    );

    // The lesson on alice's session: a retried INCR is replayed.
    let session = alice
        .open_session(SessionOptions::default())
        .await
        .expect("alice opens a session");
    for expected in 1..=3 {
        assert_eq!(
            session.execute(incr("app/n")).await,
            Ok(Reply::Incr { value: expected })
        );
    }
    let retry = session
        .execute_seq(3, Some(1), incr("app/n"), EarlierSends::None)
        .await;
    assert!(
        matches!(&retry, Ok(done) if done.replayed && done.reply == Reply::Incr { value: 3 }),
        "{retry:?}"
    );

    // Outside her grants, alice is refused; membership and status need admin.
    let denied = alice
        .execute_once(
            Command::Put {
                key: b"other/x".to_vec(),
                value: b"1".to_vec().into(),
                lease: None,
            },
            None,
        )
        .await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );
    let denied = alice
        .read(
            Query::Get {
                key: b"other/x".to_vec(),
            },
            false,
        )
        .await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );
    let denied = alice
        .read(
            Query::Scan {
                prefix: Vec::new(),
                limit: 0,
            },
            false,
        )
        .await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );
    let denied = alice.add_member(9, "127.0.0.1:1", "127.0.0.1:2").await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );
    let denied = alice.status(None).await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );
    let denied = alice
        .execute_once(
            Command::Auth(AuthCommand::UserAdd {
                name: "eve".into(),
                password_hash: Some("x".into()),
            }),
            None,
        )
        .await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );

    // Mallory knows alice's session id and secret: still not hers.
    let stolen = oncekv_client::Session::resume(
        mallory.clone(),
        session.id(),
        session.secret(),
        SessionOptions::default(),
        4,
    );
    let refused = stolen.execute(incr("app/n")).await;
    assert_eq!(refused, Err(ClientError::Unauthorized));
    let refused = stolen.keep_alive().await;
    assert_eq!(refused, Err(ClientError::Unauthorized));
    // Idempotency keys are scoped per user: mallory's key does not squat
    // alice's.
    let key = Some(b"shared-key".to_vec());
    let mine = mallory
        .execute_once(incr("other/n"), key.clone())
        .await
        .expect("mallory's own key");
    assert!(!mine.replayed);
    let hers = alice
        .execute_once(incr("app/m"), key.clone())
        .await
        .expect("alice's key is her own");
    assert_eq!(hers.reply, Reply::Incr { value: 1 });
    assert!(!hers.replayed);

    // A client certificate is the other way in: once its Common Name is a
    // user, a client presenting it needs no password.
    change(
        &root,
        AuthCommand::UserAdd {
            name: oncekv_harness::cluster::HARNESS_USER.into(),
            password_hash: None,
        },
    )
    .await;
    change(
        &root,
        AuthCommand::UserGrantRole {
            user: oncekv_harness::cluster::HARNESS_USER.into(),
            role: "app".into(),
        },
    )
    .await;
    let by_certificate = anyone
        .execute_once(
            Command::Put {
                key: b"app/cert".to_vec(),
                value: b"1".to_vec().into(),
                lease: None,
            },
            None,
        )
        .await;
    assert!(by_certificate.is_ok(), "{by_certificate:?}");
    let denied = anyone
        .read(
            Query::Get {
                key: b"other/x".to_vec(),
            },
            false,
        )
        .await;
    assert!(
        matches!(denied, Err(ClientError::PermissionDenied(_))),
        "{denied:?}"
    );

    // A leader kill: alice's retry on the new leader is still replayed.
    let old = leader(&cluster, &root).await;
    cluster.node(old).kill();
    let new = leader(&cluster, &root).await;
    assert_ne!(new, old);
    let retry = session
        .execute_seq(3, Some(1), incr("app/n"), EarlierSends::None)
        .await;
    assert!(
        matches!(&retry, Ok(done) if done.replayed && done.reply == Reply::Incr { value: 3 }),
        "{retry:?}"
    );
    assert_eq!(alice.get("app/n").await, Ok(Some(b"3".to_vec())));

    // A new password voids the old one's tokens: alice logs in again only
    // with the new one.
    change(
        &root,
        AuthCommand::UserPasswd {
            name: "alice".into(),
            password_hash: Some("alice-pw-2".into()),
        },
    )
    .await;
    let refused = alice
        .read(
            Query::Get {
                key: b"app/n".to_vec(),
            },
            false,
        )
        .await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "the old token and password no longer work: {refused:?}"
    );
    let renewed = client(&cluster, password("alice", "alice-pw-2"));
    assert_eq!(renewed.get("app/n").await, Ok(Some(b"3".to_vec())));
}

/// The command line: `user`, `role` and `auth` set a cluster up, `--user`
/// logs in, and a refusal exits 13.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_manages_users_and_roles_and_exits_13_when_denied() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    let endpoint = cluster.node(1).client.clone();
    let run = |args: &[&str], input: &str| {
        let mut child = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["--endpoints", &endpoint])
            .env_remove("ONCEKV_USER")
            .env_remove("ONCEKV_PASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run oncekv");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
        let output = child.wait_with_output().expect("run oncekv");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code().expect("exit code"), text)
    };
    let ok = |(code, text): (i32, String)| {
        assert_eq!(code, 0, "{text}");
        text
    };
    ok(run(&["user", "add", "root"], "root-pw\n"));
    ok(run(&["user", "grant-role", "root", "admin"], ""));
    ok(run(&["role", "add", "app"], ""));
    ok(run(
        &["role", "grant", "app", "readwrite", "app/", "--prefix"],
        "",
    ));
    ok(run(&["user", "add", "alice", "--password", "alice-pw"], ""));
    ok(run(&["user", "grant-role", "alice", "app"], ""));
    let (code, text) = run(
        &[
            "member",
            "add",
            "9",
            "--peer",
            "nonsense",
            "--client",
            "127.0.0.1:1",
        ],
        "",
    );
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("not host:port"), "{text}");
    let roles = ok(run(&["role", "list"], ""));
    assert!(roles.contains("app: readwrite app/*"), "{roles}");
    let role = ok(run(&["role", "get", "app"], ""));
    assert_eq!(role.trim(), "app: readwrite app/*");
    let (code, text) = run(&["role", "get", "nobody"], "");
    assert_eq!(code, 3, "no such role: {text}");
    assert!(text.contains("nobody"), "{text}");
    let user = ok(run(&["user", "get", "alice"], ""));
    assert_eq!(user.trim(), "alice roles=app");
    let (code, text) = run(&["user", "get", "nobody"], "");
    assert_eq!(code, 3, "no such user: {text}");
    ok(run(&["auth", "enable"], ""));

    let (code, text) = run(&["put", "app/x", "1"], "");
    assert_eq!(code, 13, "no user: {text}");
    assert!(text.contains("unauthenticated"), "{text}");
    ok(run(&["put", "app/x", "1", "--user", "alice:alice-pw"], ""));
    let value = ok(run(&["get", "app/x", "--user", "alice:alice-pw"], ""));
    assert_eq!(value.trim(), "1");
    let (code, text) = run(&["put", "other/x", "1", "--user", "alice:alice-pw"], "");
    assert_eq!(code, 13, "outside her grants: {text}");
    assert!(text.contains("permission"), "{text}");
    let (code, text) = run(&["user", "list", "--user", "alice:alice-pw"], "");
    assert_eq!(code, 13, "listing users needs admin: {text}");
    let users = ok(run(&["user", "list", "--user", "root:root-pw"], ""));
    assert!(users.contains("alice roles=app"), "{users}");
    let (code, text) = run(&["status", "--user", "alice:alice-pw"], "");
    assert_eq!(code, 13, "the status needs admin: {text}");
    let status = ok(run(&["auth", "status", "--user", "root:root-pw"], ""));
    assert!(status.contains("enabled"), "{status}");
    ok(run(&["auth", "disable", "--user", "root:root-pw"], ""));
    ok(run(&["put", "other/x", "1"], ""));
}

/// A permission refusal exits 13 however many endpoints are asked: a
/// non-admin's `status` with several endpoints (a table, as `endpoint
/// status`) and `endpoint status`, with `--cluster` too, are refused by
/// every node, so they exit 13 as a single refused call does. A failure of
/// another kind among them (a node down) makes it 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_of_several_endpoints_refused_to_a_non_admin_exits_13() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    cluster.leader(ELECTION).await;
    let addresses: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let all = addresses.join(",");
    let two = addresses[..2].join(",");
    let run = |args: &[&str], endpoints: &str| {
        let mut full = args.to_vec();
        full.extend(["--endpoints", endpoints, "--timeout", "5s"]);
        support::oncekv_cli(&full, &[])
    };
    let ok = |(code, text): (i32, String)| {
        assert_eq!(code, 0, "{text}");
        text
    };
    ok(run(&["user", "add", "root", "--password", "root-pw"], &all));
    ok(run(&["user", "grant-role", "root", "admin"], &all));
    ok(run(
        &["user", "add", "alice", "--password", "alice-pw"],
        &all,
    ));
    ok(run(&["auth", "enable"], &all));
    // Each node enforces authentication once it has applied the enable.
    for address in &addresses {
        eventually(ELECTION, "every node enforcing authentication", || async {
            (run(&["status"], address).0 == 13).then_some(())
        })
        .await;
    }

    let alice = ["--user", "alice:alice-pw"];
    for (args, endpoints) in [
        (&["status"][..], all.as_str()),
        (&["status"], two.as_str()),
        (&["endpoint", "status"], all.as_str()),
        (&["endpoint", "status", "--cluster"], two.as_str()),
    ] {
        let args = [args, &alice[..]].concat();
        let (code, text) = run(&args, endpoints);
        assert_eq!(code, 13, "{args:?} at {endpoints}: {text}");
        assert!(text.contains("permission denied"), "{text}");
    }
    // No user at all: unauthenticated, 13 as well.
    let (code, text) = run(&["endpoint", "status"], &all);
    assert_eq!(code, 13, "{text}");
    assert!(text.contains("unauthenticated"), "{text}");
    // The admin is answered by each.
    let table = ok(run(&["status", "--user", "root:root-pw"], &all));
    assert_eq!(table.lines().count(), 4, "a header and a row each: {table}");

    // A node down: its failure is not a refusal, so the table exits 1.
    cluster.node(3).kill();
    let (code, text) = run(&["status", "--user", "alice:alice-pw"], &all);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("permission denied"), "{text}");
}
