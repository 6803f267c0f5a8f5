//! Per-user quotas against a real node enforcing authentication. The
//! findings that made them: one user could fill the cluster-wide budgets
//! of idempotency keys and completion records, refusing every other
//! user's keyed requests, session opens and session writes, even an
//! admin's `user delete`; and deleting that user freed nothing. Now a
//! user at its share is refused alone, the admin reserve keeps an admin's
//! commands working when the users fill the rest, and `oncekv user purge`
//! and `user delete` free what the user held. Sessions likewise: a user
//! at its share of live sessions is refused alone, and the users together
//! are refused before the admin reserve, which an admin still opens from.

mod support;

use oncekv_client::{Client, ClientError, ClientOptions, Command, Credentials, Reply};
use oncekv_state::{ADMIN_ROLE, Access, AuthCommand, Overload, Permission, TokenKey};
use std::time::Duration;
use support::{Cluster, FAST, exclusive, oncekv_cli};

const ELECTION: Duration = Duration::from_secs(20);

/// 40 idempotency keys, of which a user may keep 10 and the users
/// together 30; 40 sessions (10 a user, 30 the users); 4 MiB of
/// completion records (1 MiB a user, 3 MiB the users).
const LIMITS: &[&str] = &[
    "--idempotency-keys-max",
    "40",
    "--sessions-max",
    "40",
    "--record-bytes-max",
    "4194304",
    "--user-share-percent",
    "25",
    "--admin-reserve-percent",
    "25",
];

/// A client of `user` (its password is `USER-pw`), whose calls give up
/// after `deadline` (a refused request is retried until then).
fn client(cluster: &Cluster, user: Option<&str>, deadline: Duration) -> Client {
    let options = ClientOptions {
        deadline,
        credentials: user.map(|user| Credentials::Password {
            user: user.into(),
            password: format!("{user}-pw"),
        }),
        ..cluster.client_options()
    };
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    Client::connect(endpoints, options).expect("a client")
}

/// root (admin); mallory, alice and bob, each with readwrite on the
/// prefix of their initial; then authentication enforced.
async fn secure(cluster: &Cluster) {
    let anyone = client(cluster, None, Duration::from_secs(20));
    let mut setup = vec![
        AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: Some("root-pw".into()),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
    ];
    for user in ["mallory", "alice", "bob"] {
        let role = format!("{user}-keys");
        setup.extend([
            AuthCommand::RoleAdd { name: role.clone() },
            AuthCommand::RoleGrant {
                role: role.clone(),
                permission: Permission {
                    access: Access::ReadWrite,
                    key: user.as_bytes()[..1].to_vec(),
                    prefix: true,
                },
            },
            AuthCommand::UserAdd {
                name: user.into(),
                password_hash: Some(format!("{user}-pw")),
            },
            AuthCommand::UserGrantRole {
                user: user.into(),
                role,
            },
        ]);
    }
    setup.push(AuthCommand::Enable {
        token_key: TokenKey([9; 32]),
    });
    for change in setup {
        let done = anyone
            .execute_once(Command::Auth(change.clone()), None)
            .await
            .unwrap_or_else(|e| panic!("{change:?}: {e}"));
        assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
    }
}

fn put(key: String, bytes: usize) -> Command {
    Command::Put {
        key: key.into_bytes(),
        value: vec![b'v'; bytes].into(),
        lease: None,
    }
}

/// Keyed puts of `client` under its prefix `prefix` until one is refused:
/// how many applied, and the refusal.
async fn keyed_until_refused(client: &Client, prefix: &str) -> (usize, Overload) {
    for i in 0..32 {
        match client
            .execute_once(put(format!("{prefix}/k{i}"), 16), None)
            .await
        {
            Ok(done) => assert!(matches!(done.reply, Reply::Put { .. }), "{done:?}"),
            Err(ClientError::Overloaded(full)) => return (i, full),
            Err(other) => panic!("keyed put {i} of {prefix}: {other}"),
        }
    }
    panic!("{prefix}: 32 keyed puts were never refused");
}

/// Runs `oncekv --user root ARGS...`: its exit code and output.
fn as_root(endpoint: &str, args: &[&str]) -> (i32, String) {
    oncekv_cli(
        &[&["--endpoints", endpoint, "--user", "root"][..], args].concat(),
        &[("ONCEKV_PASSWORD", "root-pw")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_its_share_is_refused_alone_and_purging_or_deleting_it_frees_what_it_held() {
    let _one = exclusive().await;
    let extra: Vec<&str> = FAST.iter().chain(LIMITS).copied().collect();
    let mut cluster = Cluster::start(1, &extra);
    cluster.leader(ELECTION).await;
    secure(&cluster).await;
    let endpoint = cluster.node(1).client.clone();
    // A refused request is retried until the deadline: keep it short.
    let refused_soon = Duration::from_secs(2);
    let mallory = client(&cluster, Some("mallory"), refused_soon);
    let alice = client(&cluster, Some("alice"), Duration::from_secs(20));
    let bob = client(&cluster, Some("bob"), refused_soon);
    let root = client(&cluster, Some("root"), Duration::from_secs(20));

    // The 15 changes that set up the users were sent under keys of
    // nobody's (authentication was off), which are kept.
    //
    // Idempotency keys: mallory keeps her share (10 of 40) and is refused;
    // alice's keyed requests still apply.
    let (kept, refusal) = keyed_until_refused(&mallory, "m").await;
    assert_eq!(
        (kept, refusal),
        (10, Overload::UserIdempotencyKeys { max: 10 })
    );
    alice
        .execute_once(put("a/once".into(), 16), None)
        .await
        .expect("alice's keyed put while mallory is at her share");
    // Bob's keys take the table to 30, what the admin reserve leaves: the
    // users are refused, root is not.
    let (kept, refusal) = keyed_until_refused(&bob, "b").await;
    assert_eq!((kept, refusal), (4, Overload::IdempotencyKeys { max: 30 }));
    // root purges mallory with a keyed request of its own, from the reserve.
    let (code, text) = as_root(&endpoint, &["user", "purge", "mallory"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("closed 0 sessions, forgot 10 idempotency keys"),
        "{text}"
    );
    let (code, text) = as_root(&endpoint, &["-o", "json", "user", "purge", "mallory"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("\"keys_forgotten\":0"), "{text}");

    // Completion records: three sessions of mallory's each hold a reply
    // with a 600 KiB previous value; past her share of 1 MiB her next
    // request is refused, alice's are not.
    let value = 600 * 1024;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(mallory.open_session(Default::default()).await.unwrap());
    }
    for (i, session) in sessions.iter().enumerate() {
        let done = session.execute(put("m/big".into(), value)).await;
        assert!(done.is_ok(), "mallory's put {i}: {done:?}");
    }
    let over = sessions[0].execute(put("m/small".into(), 1)).await;
    assert!(
        matches!(
            over,
            Err(ClientError::Overloaded(Overload::UserRecordBytes {
                max: 1_048_576
            }))
        ),
        "mallory holds 1.2 MiB of replies: {over:?}"
    );
    let alice_session = alice.open_session(Default::default()).await.unwrap();
    for _ in 0..2 {
        alice_session
            .execute(put("a/big".into(), value))
            .await
            .expect("alice's records are hers");
    }
    let status = root.status(None).await.expect("root's status");
    assert_eq!(status.sessions, 4, "{status:?}");
    assert!(
        status.completion_record_bytes > 2 * value as u64,
        "{status:?}"
    );

    // Deleting mallory closes her sessions and frees her records.
    let (code, text) = as_root(&endpoint, &["user", "delete", "mallory"]);
    assert_eq!(code, 0, "{text}");
    let status = root.status(None).await.expect("root's status");
    assert_eq!(
        status.sessions, 1,
        "only alice's session is left: {status:?}"
    );
    assert!(
        status.completion_record_bytes < 2 * value as u64,
        "{status:?}"
    );
    alice_session
        .execute(put("a/after".into(), 1))
        .await
        .expect("alice's session lives on");
    cluster.stop_all();
}

/// Sessions `client` opens until one is refused: the sessions (kept open
/// by the caller) and the refusal.
async fn sessions_until_refused(client: &Client) -> (Vec<oncekv_client::Session>, Overload) {
    let mut sessions = Vec::new();
    for _ in 0..48 {
        match client.open_session(Default::default()).await {
            Ok(session) => sessions.push(session),
            Err(ClientError::Overloaded(full)) => return (sessions, full),
            Err(other) => panic!("session {}: {other}", sessions.len()),
        }
    }
    panic!("48 sessions were never refused");
}

/// 40 sessions, of which a user may hold 10 and the users together 20
/// (half is kept for admins).
const SESSION_LIMITS: &[&str] = &[
    "--sessions-max",
    "40",
    "--user-share-percent",
    "25",
    "--admin-reserve-percent",
    "50",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_at_its_share_of_sessions_is_refused_alone_and_an_admin_opens_from_the_reserve() {
    let _one = exclusive().await;
    let extra: Vec<&str> = FAST.iter().chain(SESSION_LIMITS).copied().collect();
    let mut cluster = Cluster::start(1, &extra);
    cluster.leader(ELECTION).await;
    secure(&cluster).await;
    let refused_soon = Duration::from_secs(2);
    let mallory = client(&cluster, Some("mallory"), refused_soon);
    let alice = client(&cluster, Some("alice"), refused_soon);
    let bob = client(&cluster, Some("bob"), refused_soon);
    let root = client(&cluster, Some("root"), Duration::from_secs(20));

    // mallory opens her share and is refused; alice still opens hers.
    let (mut mallorys, refusal) = sessions_until_refused(&mallory).await;
    assert_eq!(
        (mallorys.len(), refusal),
        (10, Overload::UserSessions { max: 10 })
    );
    let mut alices = Vec::new();
    for i in 0..5 {
        let opened = alice.open_session(Default::default()).await;
        alices.push(opened.unwrap_or_else(|e| panic!("alice's session {i}: {e}")));
    }
    // bob's take the users' sessions to 20, what the admin reserve leaves:
    // he is refused below his share, and root is not.
    let (mut bobs, refusal) = sessions_until_refused(&bob).await;
    assert_eq!((bobs.len(), refusal), (5, Overload::Sessions { max: 20 }));
    let roots = root
        .open_session(Default::default())
        .await
        .expect("root opens from the reserve");
    roots
        .execute(put("r/k".into(), 1))
        .await
        .expect("root writes on it");

    // Root's session is in the table too (21 now): two of mallory's
    // closed, bob opens one in the room they made.
    for _ in 0..2 {
        mallorys.pop().expect("one").close().await.expect("closes");
    }
    bobs.push(
        bob.open_session(Default::default())
            .await
            .expect("bob opens once mallory closed one"),
    );
    let status = root.status(None).await.expect("root's status");
    assert_eq!(status.sessions, 20, "{status:?}");
    drop((mallorys, alices, bobs));
    cluster.stop_all();
}
