//! Leases have owners, against a real node enforcing authentication: a
//! lease is the user's that granted it. Another user cannot keep it alive,
//! revoke it, attach a key to it, grant its name again or see it listed
//! (natively, on the command line, which exits 13, and through the etcd
//! API, whose TimeToLive and Lock refuse it too); an admin manages any
//! lease. And the finding that made it so: another user granting, first
//! and with a short TTL, the lease names `oncekv lock` holders would use
//! cannot make two holders of one lock run at once; nor can a key put,
//! on another user's lease, where a campaigner would queue make it lead
//! on a lease it does not keep (natively and through etcd's Election).

mod support;

use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Credentials, Election, Lock, Query, Reply,
    SessionOptions, Txn, TxnOp,
};
use oncekv_proto::etcd::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use oncekv_proto::etcd::etcdserverpb::{
    AuthenticateRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest,
};
use oncekv_proto::etcd::v3electionpb::election_client::ElectionClient;
use oncekv_proto::etcd::v3electionpb::{CampaignRequest, LeaderRequest};
use oncekv_proto::etcd::v3lockpb::LockRequest;
use oncekv_proto::etcd::v3lockpb::lock_client::LockClient;
use oncekv_state::{ADMIN_ROLE, Access, AuthCommand, Permission, TokenKey};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};
use support::{Cluster, FAST, eventually, exclusive, oncekv_cli};

const ELECTION: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(60);

fn client(cluster: &Cluster, user: Option<(&str, &str)>) -> Client {
    let options = ClientOptions {
        deadline: Duration::from_secs(20),
        credentials: user.map(|(user, password)| Credentials::Password {
            user: user.into(),
            password: password.into(),
        }),
        ..cluster.client_options()
    };
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    Client::connect(endpoints, options).expect("a client")
}

/// root (admin), alice (readwrite under `jobs/` and `alice/`) and bob
/// (readwrite under `bob/`), then authentication enforced.
async fn secure(cluster: &Cluster) {
    let anyone = client(cluster, None);
    let grant = |role: &str, prefix: &str| AuthCommand::RoleGrant {
        role: role.into(),
        permission: Permission {
            access: Access::ReadWrite,
            key: prefix.as_bytes().to_vec(),
            prefix: true,
        },
    };
    let user = |name: &str, password: &str| AuthCommand::UserAdd {
        name: name.into(),
        password_hash: Some(password.into()),
    };
    let role = |user: &str, role: &str| AuthCommand::UserGrantRole {
        user: user.into(),
        role: role.into(),
    };
    let setup = [
        user("root", "root-pw"),
        role("root", ADMIN_ROLE),
        AuthCommand::RoleAdd { name: "a".into() },
        grant("a", "jobs/"),
        grant("a", "alice/"),
        user("alice", "alice-pw"),
        role("alice", "a"),
        AuthCommand::RoleAdd { name: "b".into() },
        grant("b", "bob/"),
        user("bob", "bob-pw"),
        role("bob", "b"),
        AuthCommand::Enable {
            token_key: TokenKey([5; 32]),
        },
    ];
    for change in setup {
        let done = anyone
            .execute_once(Command::Auth(change.clone()), None)
            .await
            .unwrap_or_else(|e| panic!("{change:?}: {e}"));
        assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
    }
}

/// A one-node cluster enforcing authentication, and its clients as root,
/// alice and bob.
async fn secured() -> (Cluster, Client, Client, Client) {
    let cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    secure(&cluster).await;
    let root = client(&cluster, Some(("root", "root-pw")));
    let alice = client(&cluster, Some(("alice", "alice-pw")));
    let bob = client(&cluster, Some(("bob", "bob-pw")));
    (cluster, root, alice, bob)
}

/// The names of the leases `client`'s user is shown.
async fn listed(client: &Client) -> Vec<String> {
    match client.read(Query::LeaseList, false).await {
        Ok(Reply::Leases { leases }) => leases.into_iter().map(|l| l.name).collect(),
        other => panic!("a lease list: {other:?}"),
    }
}

fn put(key: &str, lease: Option<&str>) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec().into(),
        lease: lease.map(str::to_string),
    }
}

fn denied<T: std::fmt::Debug>(what: &str, result: Result<T, ClientError>) {
    assert!(
        matches!(result, Err(ClientError::PermissionDenied(_))),
        "{what}: {result:?}"
    );
}

/// Runs `oncekv --user USER ARGS...` to its end: its exit code and output.
fn cli(endpoint: &str, user: &str, args: &[&str]) -> (i32, String) {
    oncekv_cli(
        &[&["--endpoints", endpoint, "--user", user][..], args].concat(),
        &[],
    )
}

/// A request with etcd's `token` metadata.
fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().expect("metadata value"));
    request
}

/// An etcd API token of `user`.
async fn etcd_token(address: &str, user: &str, password: &str) -> String {
    AuthClient::connect(address.to_string())
        .await
        .expect("connect")
        .authenticate(AuthenticateRequest {
            name: user.into(),
            password: password.into(),
        })
        .await
        .expect("a login")
        .into_inner()
        .token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_lease_is_not_theirs_to_renew_revoke_attach_to_or_see_and_an_admin_manages_any()
 {
    let _one = exclusive().await;
    let (mut cluster, root, alice, bob) = secured().await;
    let endpoint = cluster.node(1).client.clone();

    let granted = alice
        .lease_grant("alices", Duration::from_secs(60))
        .await
        .expect("alice grants");
    assert!(matches!(granted, Reply::LeaseGranted { .. }), "{granted:?}");
    alice
        .execute_once(put("alice/k", Some("alices")), None)
        .await
        .expect("alice attaches her key");
    assert_eq!(listed(&alice).await, vec!["alices".to_string()]);

    // Bob may write under bob/, yet alice's lease is none of his.
    denied("bob renews", bob.lease_keep_alive("alices").await);
    denied("bob revokes", bob.lease_revoke("alices").await);
    denied(
        "bob grants its name",
        bob.lease_grant("alices", Duration::from_secs(1)).await,
    );
    denied(
        "bob attaches a key",
        bob.execute_once(put("bob/k", Some("alices")), None).await,
    );
    let txn = Txn {
        compare: Vec::new(),
        success: vec![TxnOp::Put {
            key: b"bob/t".to_vec(),
            value: b"v".to_vec(),
            lease: Some("alices".into()),
        }],
        failure: Vec::new(),
    };
    denied("bob attaches a key in a transaction", bob.txn(txn).await);
    assert!(listed(&bob).await.is_empty(), "bob sees alice's lease");
    assert_eq!(bob.get("bob/k").await, Ok(None));
    assert_eq!(bob.get("bob/t").await, Ok(None));

    // The command line says so, exiting 13.
    let bob_login = "bob:bob-pw";
    for args in [
        &["lease", "keepalive", "alices"][..],
        &["lease", "revoke", "alices"],
        &["lease", "grant", "alices", "10s"],
        &["put", "bob/c", "v", "--lease", "alices"],
    ] {
        let (code, text) = cli(&endpoint, bob_login, args);
        assert_eq!(code, 13, "{args:?}: {text}");
        assert!(text.contains("permission"), "{args:?}: {text}");
    }
    let (code, text) = cli(&endpoint, bob_login, &["lease", "grant", "bobs", "60s"]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = cli(&endpoint, bob_login, &["lease", "list"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("bobs") && !text.contains("alices"),
        "bob lists his own only: {text}"
    );
    assert_eq!(listed(&alice).await, vec!["alices".to_string()]);

    // Alice's lease is hers, and lived on.
    let renewed = alice
        .lease_keep_alive("alices")
        .await
        .expect("alice renews");
    assert!(
        matches!(renewed, Reply::LeaseKeptAlive { .. }),
        "{renewed:?}"
    );
    assert_eq!(alice.get("alice/k").await, Ok(Some(b"v".to_vec())));

    // The etcd API: the same lease rule.
    let address = format!("http://{endpoint}");
    let alice_token = etcd_token(&address, "alice", "alice-pw").await;
    let bob_token = etcd_token(&address, "bob", "bob-pw").await;
    let root_token = etcd_token(&address, "root", "root-pw").await;
    let mut leases = LeaseClient::connect(address.clone())
        .await
        .expect("connect");
    let id = 0x7a11_ce00_0000_0001;
    leases
        .lease_grant(with_token(LeaseGrantRequest { ttl: 60, id }, &alice_token))
        .await
        .expect("alice grants an etcd lease");
    let code = |status: tonic::Status| status.code();
    let refused = leases
        .lease_revoke(with_token(LeaseRevokeRequest { id }, &bob_token))
        .await
        .map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::PermissionDenied),
        "bob revokes"
    );
    let refused = leases
        .lease_time_to_live(with_token(
            LeaseTimeToLiveRequest { id, keys: true },
            &bob_token,
        ))
        .await
        .map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::PermissionDenied),
        "bob asks"
    );
    let again = LeaseGrantRequest { ttl: 60, id };
    let refused = leases
        .lease_grant(with_token(again, &bob_token))
        .await
        .map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::PermissionDenied),
        "bob grants"
    );
    let keep = tokio_stream::iter(vec![LeaseKeepAliveRequest { id }]);
    let renewal = match leases.lease_keep_alive(with_token(keep, &bob_token)).await {
        Ok(answers) => {
            use futures_util::StreamExt as _;
            answers.into_inner().next().await.expect("an answer")
        }
        Err(status) => Err(status),
    };
    assert_eq!(
        renewal.map_err(code).err(),
        Some(tonic::Code::PermissionDenied),
        "bob renews"
    );
    let mut kv = KvClient::connect(address.clone()).await.expect("connect");
    let attach = PutRequest {
        key: b"bob/e".to_vec(),
        value: b"v".to_vec(),
        lease: id,
        ..PutRequest::default()
    };
    let refused = kv.put(with_token(attach, &bob_token)).await.map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::PermissionDenied),
        "bob attaches"
    );
    let mut locks = LockClient::connect(address.clone()).await.expect("connect");
    let lock = LockRequest {
        name: b"bob/l".to_vec(),
        lease: id,
    };
    let refused = locks.lock(with_token(lock, &bob_token)).await.map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::PermissionDenied),
        "bob locks on it"
    );
    // A queue key found on another lease than the one locked with is not
    // the caller's place, even among one user's own leases.
    let (other, mine) = (0x0b0b_0000_0000_0001, 0x0b0b_0000_0000_0002);
    for id in [other, mine] {
        leases
            .lease_grant(with_token(LeaseGrantRequest { ttl: 60, id }, &bob_token))
            .await
            .expect("bob grants");
    }
    let squat = PutRequest {
        key: format!("bob/q/{mine:x}").into_bytes(),
        value: Vec::new(),
        lease: other,
        ..PutRequest::default()
    };
    kv.put(with_token(squat, &bob_token))
        .await
        .expect("bob puts");
    let lock = LockRequest {
        name: b"bob/q".to_vec(),
        lease: mine,
    };
    let refused = locks.lock(with_token(lock, &bob_token)).await.map_err(code);
    assert_eq!(
        refused.err(),
        Some(tonic::Code::InvalidArgument),
        "a key on another lease"
    );
    for id in [other, mine] {
        leases
            .lease_revoke(with_token(LeaseRevokeRequest { id }, &bob_token))
            .await
            .expect("bob revokes his own");
    }
    let bobs = leases
        .lease_leases(with_token(LeaseLeasesRequest {}, &bob_token))
        .await
        .expect("bob lists")
        .into_inner();
    assert!(bobs.leases.is_empty(), "{bobs:?}");
    let alices = leases
        .lease_leases(with_token(LeaseLeasesRequest {}, &alice_token))
        .await
        .expect("alice lists")
        .into_inner();
    assert_eq!(
        alices.leases.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![id]
    );
    let ttl = leases
        .lease_time_to_live(with_token(
            LeaseTimeToLiveRequest { id, keys: false },
            &root_token,
        ))
        .await
        .expect("root asks")
        .into_inner();
    assert_eq!(ttl.granted_ttl, 60);
    leases
        .lease_revoke(with_token(LeaseRevokeRequest { id }, &root_token))
        .await
        .expect("root revokes an etcd lease of alice's");

    // The native lock recipe likewise: a holder's key found on a lease
    // other than the holder's own is refused, never held.
    alice
        .execute_once(put("jobs/w1", Some("alices")), None)
        .await
        .expect("alice puts a key on her lease");
    let session = alice
        .open_session(SessionOptions::default())
        .await
        .expect("a session");
    let mut lock = Lock::new(&session, "jobs", Duration::from_secs(10)).with_owner("w1");
    let refused = lock.acquire().await;
    assert!(
        matches!(&refused, Err(ClientError::Invalid(why)) if why.contains("another lease")),
        "{refused:?}"
    );
    lock.unlock().await.expect("leaves");
    assert_eq!(
        alice.get("jobs/w1").await,
        Ok(Some(b"v".to_vec())),
        "not its key"
    );

    // An admin sees and manages every lease.
    let all = listed(&root).await;
    assert!(
        all.contains(&"alices".to_string()) && all.contains(&"bobs".to_string()),
        "{all:?}"
    );
    root.lease_keep_alive("alices")
        .await
        .expect("root renews alice's");
    root.execute_once(put("alice/root", Some("alices")), None)
        .await
        .expect("root attaches to alice's");
    let revoked = root.lease_revoke("alices").await.expect("root revokes");
    assert!(
        matches!(
            revoked,
            Reply::LeaseRevoked {
                keys_deleted: 3,
                ..
            }
        ),
        "{revoked:?}"
    );
    assert_eq!(alice.get("alice/k").await, Ok(None));
    let (code, text) = cli(&endpoint, "root:root-pw", &["lease", "revoke", "bobs"]);
    assert_eq!(code, 0, "{text}");
    assert!(listed(&root).await.is_empty());
}

/// FNV-1a 64, as the lock recipe named its leases before they had owners.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The lease name a holder of lock `name` on session `session` had, before
/// leases had owners: a function of the session's id, the log index that
/// opened it, so anyone could compute it ahead.
fn predictable_lease(name: &str, session: u64) -> String {
    format!(
        "contend-{:016x}",
        fnv64(format!("{name}/{session:016x}").as_bytes())
    )
}

/// An `oncekv lock` holder, killed if still running when dropped.
struct Holder(Child);

impl Holder {
    fn spawn(endpoint: &str, dir: &Path, script: &str) -> Holder {
        let child = Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(["--endpoints", endpoint, "--user", "alice:alice-pw"])
            .args(["lock", "jobs", "--ttl", "60s", "--", "sh", "-c", script])
            .env_remove("ONCEKV_USER")
            .env_remove("ONCEKV_PASSWORD")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("run oncekv lock");
        Holder(child)
    }

    fn exit_code(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status.code().expect("an exit code");
            }
            assert!(
                Instant::now() < deadline,
                "oncekv lock did not exit in time"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The marks the holders' COMMANDs wrote, one per line.
fn marks(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_squatting_the_lock_lease_names_cannot_make_two_holders() {
    let _one = exclusive().await;
    let (mut cluster, root, alice, bob) = secured().await;
    let endpoint = cluster.node(1).client.clone();
    let dir = cluster.dir.path().to_path_buf();
    let log: PathBuf = dir.join("marks");
    let release = dir.join("release");

    // Bob learns where the log is, and grants, with a short TTL, the lease
    // names of the next sessions to open after his grants: each grant is
    // one entry, so WINDOW grants cover the WINDOW indexes after them.
    const WINDOW: u64 = 80;
    let now = bob.put("bob/mark", "x").await.expect("bob writes").revision;
    let squatted: Vec<String> = (now + WINDOW + 1..=now + 2 * WINDOW)
        .map(|session| predictable_lease("jobs", session))
        .collect();
    for name in &squatted {
        let granted = bob
            .lease_grant(name, Duration::from_secs(10))
            .await
            .expect("bob squats");
        assert!(matches!(granted, Reply::LeaseGranted { .. }), "{granted:?}");
    }

    // Alice's first holder starts at once (its session opens within the
    // squatted window) and holds the lock until told to let go.
    let first_script = format!(
        "echo \"start $ONCEKV_LOCK_REVISION\" >> {log}; i=0; \
         while [ ! -e {release} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; \
         echo \"end $ONCEKV_LOCK_REVISION\" >> {log}",
        log = log.display(),
        release = release.display()
    );
    let mut first = Holder::spawn(&endpoint, &dir, &first_script);
    eventually(WAIT, "the first holder to run", || {
        let log = log.clone();
        async move { (!marks(&log).is_empty()).then_some(()) }
    })
    .await;

    // The second holder's session opens past the squatted window.
    let padding = Instant::now();
    while alice.put("alice/pad", "x").await.expect("a pad").revision <= now + 2 * WINDOW {
        assert!(padding.elapsed() < WAIT, "the log past the squatted window");
    }
    let second_script = format!(
        "echo \"start $ONCEKV_LOCK_REVISION\" >> {log}; echo \"end $ONCEKV_LOCK_REVISION\" >> {log}",
        log = log.display()
    );
    let mut second = Holder::spawn(&endpoint, &dir, &second_script);

    // Every squatted lease ends (nobody else may keep it alive), and the
    // second holder queues (or, were a squatted lease the first's, runs).
    eventually(WAIT, "the squatted leases to end", || {
        let (root, squatted, log) = (root.clone(), squatted.clone(), log.clone());
        async move {
            let all = listed(&root).await;
            if all.iter().any(|name| squatted.contains(name)) {
                return None;
            }
            let queued = root.scan("jobs/", 0).await.ok()?.entries.len() == 2;
            (queued || marks(&log).len() > 1).then_some(())
        }
    })
    .await;
    assert_eq!(
        marks(&log).len(),
        1,
        "two holders of lock jobs ran at once: {:?}",
        marks(&log)
    );

    // The holders' leases are alice's: bob can neither see nor touch them.
    let holders: Vec<String> = listed(&root)
        .await
        .into_iter()
        .filter(|name| name.starts_with("contend-"))
        .collect();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_eq!(listed(&alice).await, holders);
    assert!(listed(&bob).await.is_empty());
    for name in &holders {
        assert!(!squatted.contains(name), "{name} was squatted");
        denied(
            "bob renews a holder's lease",
            bob.lease_keep_alive(name).await,
        );
        denied("bob revokes a holder's lease", bob.lease_revoke(name).await);
    }

    std::fs::write(&release, b"").expect("release");
    assert_eq!(first.exit_code(WAIT), 0);
    assert_eq!(second.exit_code(WAIT), 0);
    let marks = marks(&log);
    assert_eq!(marks.len(), 4, "{marks:?}");
    let revision = |line: &String| -> u64 {
        line.split_once(' ')
            .and_then(|(_, revision)| revision.parse().ok())
            .unwrap_or_else(|| panic!("a mark: {line}"))
    };
    assert!(
        marks[0].starts_with("start")
            && marks[1].starts_with("end")
            && marks[2].starts_with("start")
            && marks[3].starts_with("end"),
        "interleaved: {marks:?}"
    );
    assert_eq!(revision(&marks[0]), revision(&marks[1]), "{marks:?}");
    assert_eq!(revision(&marks[2]), revision(&marks[3]), "{marks:?}");
    assert!(
        revision(&marks[2]) > revision(&marks[1]),
        "fencing revisions grow: {marks:?}"
    );
    assert!(
        root.scan("jobs/", 0)
            .await
            .expect("scan")
            .entries
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_squatting_an_election_key_cannot_make_two_leaders() {
    let _one = exclusive().await;
    let (mut cluster, root, alice, bob) = secured().await;
    let address = format!("http://{}", cluster.node(1).client);
    // Both may write the elections' keys.
    let shared = [
        AuthCommand::RoleAdd {
            name: "elections".into(),
        },
        AuthCommand::RoleGrant {
            role: "elections".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"boss/".to_vec(),
                prefix: true,
            },
        },
        AuthCommand::RoleGrant {
            role: "elections".into(),
            permission: Permission {
                access: Access::ReadWrite,
                key: b"vote/".to_vec(),
                prefix: true,
            },
        },
        AuthCommand::UserGrantRole {
            user: "alice".into(),
            role: "elections".into(),
        },
        AuthCommand::UserGrantRole {
            user: "bob".into(),
            role: "elections".into(),
        },
    ];
    for change in shared {
        let done = root
            .execute_once(Command::Auth(change.clone()), None)
            .await
            .unwrap_or_else(|e| panic!("{change:?}: {e}"));
        assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
    }

    // Bob puts, on a short lease of his, the key Alice's campaigner would
    // queue at. Were it taken as hers, she would lead on Bob's lease: once
    // he let it end, a second campaigner would lead while she still did.
    // (Six seconds: long past her campaign on a loaded machine.)
    let granted = bob
        .lease_grant("bob-squats", Duration::from_secs(6))
        .await
        .expect("bob grants");
    assert!(matches!(granted, Reply::LeaseGranted { .. }), "{granted:?}");
    bob.execute_once(put("boss/w1", Some("bob-squats")), None)
        .await
        .expect("bob squats");
    let session = alice
        .open_session(SessionOptions::default())
        .await
        .expect("a session");
    let mut election = Election::new(&session, "boss", Duration::from_secs(10)).with_owner("w1");
    let refused = election.campaign("alice").await;
    assert!(
        matches!(&refused, Err(ClientError::Invalid(why)) if why.contains("another lease")),
        "{refused:?}"
    );
    assert_eq!(election.held(), None, "not elected on bob's key");

    // Once Bob's lease has ended, she campaigns on a lease only she (and
    // an admin) may renew or revoke, and leads.
    eventually(WAIT, "bob's squatting key to go with his lease", || {
        let root = root.clone();
        async move { root.get("boss/w1").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let mut election = Election::new(&session, "boss", Duration::from_secs(10)).with_owner("w1");
    let elected = election.campaign("alice").await.expect("alice is elected");
    let leader = root.election_leader("boss").await.expect("leader");
    assert_eq!(
        leader.map(|leader| (leader.key, leader.value)),
        Some((elected.key.clone(), b"alice".to_vec()))
    );
    let hers: Vec<String> = listed(&alice).await;
    assert_eq!(hers.len(), 1, "{hers:?}");
    assert!(listed(&bob).await.is_empty());
    denied("bob renews her lease", bob.lease_keep_alive(&hers[0]).await);
    denied("bob revokes her lease", bob.lease_revoke(&hers[0]).await);
    election.resign().await.expect("resigns");

    // etcd's Election likewise: a Campaign on Alice's lease refuses the
    // key of its name that Bob put on his own.
    let alice_token = etcd_token(&address, "alice", "alice-pw").await;
    let bob_token = etcd_token(&address, "bob", "bob-pw").await;
    let mut leases = LeaseClient::connect(address.clone())
        .await
        .expect("connect");
    let (hers, his) = (0x0a11_ce00_0000_0e1e, 0x0b0b_0000_0000_0e1e);
    leases
        .lease_grant(with_token(
            LeaseGrantRequest { ttl: 60, id: hers },
            &alice_token,
        ))
        .await
        .expect("alice grants");
    leases
        .lease_grant(with_token(
            LeaseGrantRequest { ttl: 60, id: his },
            &bob_token,
        ))
        .await
        .expect("bob grants");
    let mut kv = KvClient::connect(address.clone()).await.expect("connect");
    let squat = PutRequest {
        key: format!("vote/{hers:x}").into_bytes(),
        value: b"bob".to_vec(),
        lease: his,
        ..PutRequest::default()
    };
    kv.put(with_token(squat, &bob_token))
        .await
        .expect("bob squats");
    let mut elections = ElectionClient::connect(address).await.expect("connect");
    let campaign = CampaignRequest {
        name: b"vote".to_vec(),
        lease: hers,
        value: b"alice".to_vec(),
    };
    let refused = elections
        .campaign(with_token(campaign, &alice_token))
        .await
        .map_err(|status| status.code());
    assert_eq!(
        refused.err(),
        Some(tonic::Code::InvalidArgument),
        "a key of its name on another user's lease"
    );
    let leader = elections
        .leader(with_token(
            LeaderRequest {
                name: b"vote".to_vec(),
            },
            &alice_token,
        ))
        .await
        .map(|answer| answer.into_inner().kv.map(|kv| kv.value));
    assert_ne!(
        leader.ok().flatten(),
        Some(b"alice".to_vec()),
        "alice does not lead on bob's key"
    );
}
