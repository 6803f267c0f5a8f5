//! Bounded watch streams on real nodes, natively and through etcd's API:
//! a watcher that does not read is cancelled once the events waiting
//! unsent on its stream reach their bound (the reason names it), while a
//! reader on the same node gets every change; one connection, one user
//! (and one etcd stream) hold a bounded number of watchers, one more is
//! refused naming the cap while another user still watches; a user's
//! share of the node's watchers and unsent bytes follows
//! `--user-share-percent` of `--watchers-max` and `--watch-bytes-max`
//! (its streams together are cancelled at its share while another user's
//! watch gets every change); and a watch ends when its user loses the
//! right to it: a revoked role or permission (permission denied), a
//! changed password, a deleted user or an expired token (the credentials
//! no longer hold; etcd's "invalid auth token").

mod support;

use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Credentials, Reply, WatchOptions, WatchUpdate,
};
use oncekv_proto::convert::{self, CallFailure};
use oncekv_proto::etcd::etcdserverpb::watch_client::WatchClient as EtcdWatchClient;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    WatchCreateRequest, WatchRequest as EtcdWatchRequest, WatchResponse as EtcdWatchResponse,
};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, watch_response::Kind};
use oncekv_proto::{AUTHORIZATION_METADATA, BEARER};
use oncekv_state::{ADMIN_ROLE, Access, AuthCommand, Permission, TokenKey};
use std::time::Duration;
use support::{Cluster, FAST, eventually, exclusive, free_port};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const ELECTION: Duration = Duration::from_secs(20);
/// How long any one thing may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);
/// The bound on a stream's unsent events (`WATCH_STREAM_BYTES_MAX`).
const STREAM_BYTES_MAX: &str = "4194304";

/// A connection of its own to `address`.
async fn connection(address: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("an endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("a connection")
}

fn native(channel: Channel) -> KvClient<Channel> {
    KvClient::new(channel).max_decoding_message_size(64 << 20)
}

/// A request carrying `token` as oncekv's bearer token and etcd's `token`.
fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let metadata = request.metadata_mut();
        let bearer = format!("{BEARER}{token}");
        metadata.insert(AUTHORIZATION_METADATA, bearer.parse().expect("metadata"));
        metadata.insert("token", token.parse().expect("metadata"));
    }
    request
}

fn prefix_watch(prefix: &str) -> v1::WatchRequest {
    v1::WatchRequest {
        key: prefix.as_bytes().to_vec(),
        prefix: true,
        ..v1::WatchRequest::default()
    }
}

/// Opens a native watch of `prefix`; its stream once started.
async fn native_watch(
    client: &mut KvClient<Channel>,
    prefix: &str,
    token: Option<&str>,
) -> Result<tonic::Streaming<v1::WatchResponse>, tonic::Status> {
    let mut stream = client
        .watch(with_token(prefix_watch(prefix), token))
        .await?
        .into_inner();
    match next_native(&mut stream).await {
        Some(Kind::Started(_)) => Ok(stream),
        other => panic!("expected the watch to start, got {other:?}"),
    }
}

/// Reads `watch` on a task of its own until it is aborted, reporting the
/// revisions of the changes read so far; `who` names the reader if the
/// watch ends.
fn keep_reading(
    mut watch: tonic::Streaming<v1::WatchResponse>,
    who: &'static str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<Vec<u64>>,
) {
    let (read_tx, read) = tokio::sync::watch::channel(Vec::<u64>::new());
    let reading = tokio::spawn(async move {
        loop {
            match next_native(&mut watch).await {
                Some(Kind::Events(events)) => read_tx.send_modify(|read| {
                    read.extend(events.events.iter().map(|event| event.revision));
                }),
                Some(Kind::Progress(_)) => {}
                other => panic!("{who}'s watch ended: {other:?}"),
            }
        }
    });
    (reading, read)
}

/// The next message of a native watch (`None` when it ended).
async fn next_native(stream: &mut tonic::Streaming<v1::WatchResponse>) -> Option<Kind> {
    let message = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a watch message in time")
        .expect("the watch stream holds");
    message.map(|message| message.kind.expect("a kind"))
}

/// The end of the keys under `prefix`, as etcd's range_end.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("a prefix") += 1;
    end
}

/// One etcd watch stream.
struct EtcdStream {
    requests: mpsc::Sender<EtcdWatchRequest>,
    responses: tonic::Streaming<EtcdWatchResponse>,
}

impl EtcdStream {
    async fn open(address: &str, token: Option<&str>) -> EtcdStream {
        let (requests, receiver) = mpsc::channel(1024);
        let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
        let responses = EtcdWatchClient::new(connection(address).await)
            .max_decoding_message_size(64 << 20)
            .watch(with_token(stream, token))
            .await
            .expect("an etcd watch stream")
            .into_inner();
        EtcdStream {
            requests,
            responses,
        }
    }

    /// Asks for a watch of `prefix` from `start_revision`.
    async fn create(&self, prefix: &str, start_revision: u64) {
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            start_revision: i64::try_from(start_revision).expect("a revision"),
            ..WatchCreateRequest::default()
        };
        self.requests
            .send(EtcdWatchRequest {
                request_union: Some(RequestUnion::CreateRequest(create)),
            })
            .await
            .expect("the stream takes requests");
    }

    async fn next(&mut self) -> EtcdWatchResponse {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("an etcd watch response in time")
            .expect("the etcd stream holds")
            .expect("the etcd stream goes on")
    }

    /// The response that cancels a watch, after any events; returns it
    /// and the revisions of the events before it.
    async fn until_canceled(&mut self) -> (EtcdWatchResponse, Vec<u64>) {
        let mut revisions = Vec::new();
        loop {
            let response = self.next().await;
            if response.canceled {
                return (response, revisions);
            }
            revisions.extend(
                response
                    .events
                    .iter()
                    .filter_map(|event| event.kv.as_ref())
                    .map(|kv| u64::try_from(kv.mod_revision).expect("a revision")),
            );
        }
    }
}

/// `oncekv_watches_canceled_total{reason}` from a node's metrics.
fn canceled(metrics: &str, reason: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metrics).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    let series = format!("oncekv_watches_canceled_total{{reason=\"{reason}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
}

fn client(address: &str, credentials: Option<Credentials>) -> Client {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        credentials,
        ..ClientOptions::default()
    };
    Client::connect([address.to_string()], options).expect("a client")
}

fn password(user: &str) -> Option<Credentials> {
    Some(Credentials::Password {
        user: user.into(),
        password: format!("{user}-pw"),
    })
}

async fn change(client: &Client, change: AuthCommand) {
    let done = client
        .execute_once(Command::Auth(change.clone()), None)
        .await
        .unwrap_or_else(|e| panic!("{change:?}: {e}"));
    assert_eq!(done.reply, Reply::AuthChanged, "{change:?}");
}

/// Sets up `root` (admin) and, for each user, a role of its own granting
/// readwrite on the prefix `<user>/`; then enables authentication. Each
/// user's password is `<user>-pw`. Returns root's client.
async fn secure(address: &str, users: &[&str]) -> Client {
    let anyone = client(address, None);
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
    for user in users {
        setup.extend([
            AuthCommand::RoleAdd {
                name: format!("{user}-role"),
            },
            AuthCommand::RoleGrant {
                role: format!("{user}-role"),
                permission: Permission {
                    access: Access::ReadWrite,
                    key: format!("{user}/").into_bytes(),
                    prefix: true,
                },
            },
            AuthCommand::UserAdd {
                name: (*user).into(),
                password_hash: Some(format!("{user}-pw")),
            },
            AuthCommand::UserGrantRole {
                user: (*user).into(),
                role: format!("{user}-role"),
            },
        ]);
    }
    setup.push(AuthCommand::Enable {
        token_key: TokenKey([0; 32]),
    });
    for command in setup {
        change(&anyone, command).await;
    }
    client(address, password("root"))
}

/// A login token of `user`.
async fn token(address: &str, user: &str) -> String {
    let response = native(connection(address).await)
        .authenticate(v1::AuthenticateRequest {
            user: user.into(),
            password: format!("{user}-pw"),
        })
        .await
        .expect("an answer")
        .into_inner();
    match response.result {
        Some(v1::authenticate_response::Result::Token(token)) => token.token,
        other => panic!("{user} did not log in: {other:?}"),
    }
}

/// Puts `key` as `writer`; returns its revision.
async fn put(writer: &Client, key: &str, value: Vec<u8>) -> u64 {
    writer
        .put(key, value)
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e}"))
        .revision
}

/// Waits for the error that ends `watcher`, skipping progress; panics on
/// a change at or after `forbidden`.
async fn watch_error(watcher: &mut oncekv_client::Watcher, forbidden: u64) -> ClientError {
    loop {
        let update = tokio::time::timeout(WAIT, watcher.next())
            .await
            .expect("the watch ends in time");
        match update {
            Ok(WatchUpdate::Progress(_)) => {}
            Ok(WatchUpdate::Changes { revision, .. }) => {
                assert!(
                    revision < forbidden,
                    "revision {revision}, after the right was lost, was delivered"
                );
            }
            Err(error) => return error,
        }
    }
}

/// Starts `watcher` and waits for the change at `revision`.
async fn until_change(watcher: &mut oncekv_client::Watcher, revision: u64) {
    loop {
        let update = tokio::time::timeout(WAIT, watcher.next())
            .await
            .expect("a change in time")
            .expect("the watch goes on");
        if let WatchUpdate::Changes { revision: at, .. } = update
            && at >= revision
        {
            assert_eq!(at, revision);
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_does_not_read_is_cancelled_at_its_byte_bound_while_a_reader_gets_all() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let flags: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--listen-metrics", metrics.as_str()])
        .collect();
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(ELECTION).await;
    let address = cluster.node(1).client.clone();

    // Two watchers that never read past their start, each on a connection
    // of its own: a native one and an etcd one.
    let mut idle_client = native(connection(&address).await);
    let mut idle = native_watch(&mut idle_client, "big/", None)
        .await
        .expect("the idle native watch");
    let mut idle_etcd = EtcdStream::open(&address, None).await;
    idle_etcd.create("big/", 0).await;
    assert!(idle_etcd.next().await.created);
    // A reader, which reports how far it has read.
    let mut reader_client = native(connection(&address).await);
    let reader = native_watch(&mut reader_client, "big/", None)
        .await
        .expect("the reader's watch");
    let (reading, mut read) = keep_reading(reader, "the reader");

    // 48 changes of 512 KiB: 24 MiB, far over what the idle watchers'
    // connections and the stream's bound hold. The writer never runs more
    // than two changes ahead of the reader, however loaded the machine.
    const WRITES: usize = 48;
    let writer = client(&address, None);
    let mut written = Vec::new();
    for n in 0..WRITES {
        let caught_up = n.saturating_sub(2);
        tokio::time::timeout(WAIT, read.wait_for(|read| read.len() >= caught_up))
            .await
            .expect("the reader keeps up in time")
            .expect("the reader runs");
        written.push(put(&writer, "big/k", vec![n as u8; 512 * 1024]).await);
    }
    tokio::time::timeout(WAIT, read.wait_for(|read| read.len() >= WRITES))
        .await
        .expect("the reader reads every change in time")
        .expect("the reader runs");
    assert_eq!(*read.borrow(), written, "the reader got every change once");
    reading.abort();

    // The node cancelled both idle watchers...
    eventually(WAIT, "the idle watchers cancelled", || {
        let metrics = metrics.clone();
        async move { canceled(&metrics, "unread").filter(|n| *n >= 2) }
    })
    .await;
    // ... and each hears why once it reads: some changes, then the bound.
    let mut events = 0;
    let reason = loop {
        match next_native(&mut idle).await {
            Some(Kind::Events(batch)) => events += batch.events.len(),
            Some(Kind::Progress(_)) => {}
            Some(Kind::Canceled(canceled)) => break canceled.reason,
            other => panic!("expected the bound's cancellation, got {other:?}"),
        }
    };
    assert!(events < WRITES, "{events} changes reached the idle watcher");
    assert!(
        reason.contains(STREAM_BYTES_MAX) && reason.contains("bytes per stream"),
        "{reason}"
    );
    let resume = written[events];
    assert!(
        reason.contains(&format!("resume from revision {resume}")),
        "{reason}"
    );
    assert_eq!(next_native(&mut idle).await, None, "the stream ends");

    let (canceled, revisions) = idle_etcd.until_canceled().await;
    assert!(revisions.len() < WRITES, "{revisions:?}");
    assert_eq!(revisions, written[..revisions.len()]);
    assert!(
        canceled.cancel_reason.contains(STREAM_BYTES_MAX),
        "{canceled:?}"
    );
    let resume = written[revisions.len()];
    assert!(
        canceled
            .cancel_reason
            .contains(&format!("resume from revision {resume}")),
        "{canceled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_are_capped_per_connection_and_per_user_and_another_user_still_watches() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    let address = cluster.node(1).client.clone();
    let _root = secure(&address, &["alice", "carol"]).await;
    let alice = token(&address, "alice").await;

    // One connection: 200 watchers, then a refusal naming that cap.
    let mut first = native(connection(&address).await);
    let mut held = Vec::new();
    for _ in 0..200 {
        let stream = first
            .watch(with_token(prefix_watch("alice/"), Some(&alice)))
            .await
            .expect("a watcher within the connection's cap");
        held.push(stream.into_inner());
    }
    let refused = first
        .watch(with_token(prefix_watch("alice/"), Some(&alice)))
        .await
        .expect_err("one over the connection's cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("maximum of 200")
            && refused.message().contains("per connection"),
        "{refused:?}"
    );

    // Her etcd stream takes her up to her cap (200 + 824 = 1024)...
    let mut stream = EtcdStream::open(&address, Some(&alice)).await;
    for _ in 0..824 {
        stream.create("alice/", 0).await;
    }
    for _ in 0..824 {
        let response = stream.next().await;
        assert!(response.created && !response.canceled, "{response:?}");
    }
    // ... and one more is refused, there and on another connection.
    stream.create("alice/", 0).await;
    let response = stream.next().await;
    assert!(response.created && response.canceled, "{response:?}");
    assert!(
        response.cancel_reason.contains("\"alice\"")
            && response.cancel_reason.contains("maximum of 1024")
            && response.cancel_reason.contains("per user"),
        "{response:?}"
    );
    let mut other = native(connection(&address).await);
    let refused = other
        .watch(with_token(prefix_watch("alice/"), Some(&alice)))
        .await
        .expect_err("one over the user's cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("maximum of 1024") && refused.message().contains("per user"),
        "{refused:?}"
    );
    // Through the Rust client, the refusal is the caller's to know.
    let mut watcher =
        client(&address, password("alice")).watch("alice/", WatchOptions::default().with_prefix());
    let error = tokio::time::timeout(WAIT, watcher.next())
        .await
        .expect("an answer in time")
        .expect_err("refused");
    assert!(
        matches!(&error, ClientError::Invalid(message) if message.contains("per user")),
        "{error:?}"
    );

    // Another user still watches, natively and through etcd.
    let carol = token(&address, "carol").await;
    native_watch(&mut other, "carol/", Some(&carol))
        .await
        .expect("carol watches");
    let mut carols = EtcdStream::open(&address, Some(&carol)).await;
    carols.create("carol/", 0).await;
    let response = carols.next().await;
    assert!(response.created && !response.canceled, "{response:?}");

    // One of alice's ends: she may watch again.
    held.pop();
    eventually(WAIT, "alice watching again", || {
        let mut other = other.clone();
        let alice = alice.clone();
        async move {
            other
                .watch(with_token(prefix_watch("alice/"), Some(&alice)))
                .await
                .ok()
        }
    })
    .await;
}

/// A cluster with authentication on for `users`: root's client and the
/// node's address.
async fn secured(users: &[&str], extra: &[&str]) -> (Cluster, Client, String) {
    let flags: Vec<&str> = FAST.iter().chain(extra).copied().collect();
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(ELECTION).await;
    let address = cluster.node(1).client.clone();
    let root = secure(&address, users).await;
    (cluster, root, address)
}

/// A watch of `<user>/` natively (the Rust client, with the user's
/// password) and through etcd (with a token), both past the change at
/// the revision returned.
async fn watching(
    root: &Client,
    address: &str,
    user: &str,
) -> (oncekv_client::Watcher, EtcdStream, u64) {
    let prefix = format!("{user}/");
    let first = put(root, &format!("{prefix}1"), b"v".to_vec()).await;
    let mut watcher = client(address, password(user)).watch(
        prefix.clone(),
        WatchOptions::default().with_prefix().from_revision(first),
    );
    until_change(&mut watcher, first).await;
    let token = token(address, user).await;
    let mut stream = EtcdStream::open(address, Some(&token)).await;
    stream.create(&prefix, first).await;
    assert!(stream.next().await.created);
    let events = stream.next().await;
    assert_eq!(events.events.len(), 1, "{events:?}");
    (watcher, stream, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_users_role_or_permission_is_revoked() {
    let _one = exclusive().await;
    let (_cluster, root, address) = secured(&["alice", "bob"], &[]).await;

    let (mut watcher, mut stream, _) = watching(&root, &address, "alice").await;
    change(
        &root,
        AuthCommand::UserRevokeRole {
            user: "alice".into(),
            role: "alice-role".into(),
        },
    )
    .await;
    // A change after the revocation never reaches her.
    let after = put(&root, "alice/2", b"v".to_vec()).await;
    let error = watch_error(&mut watcher, after).await;
    assert!(
        matches!(error, ClientError::PermissionDenied(_)),
        "{error:?}"
    );
    let (canceled, revisions) = stream.until_canceled().await;
    assert!(revisions.iter().all(|r| *r < after), "{revisions:?}");
    assert_eq!(canceled.cancel_reason, "etcdserver: permission denied");

    // The permission taken from the role (the role kept) does it too.
    let (mut watcher, mut stream, _) = watching(&root, &address, "bob").await;
    change(
        &root,
        AuthCommand::RoleRevoke {
            role: "bob-role".into(),
            key: b"bob/".to_vec(),
            prefix: true,
        },
    )
    .await;
    let after = put(&root, "bob/2", b"v".to_vec()).await;
    let error = watch_error(&mut watcher, after).await;
    assert!(
        matches!(error, ClientError::PermissionDenied(_)),
        "{error:?}"
    );
    let (canceled, _) = stream.until_canceled().await;
    assert_eq!(canceled.cancel_reason, "etcdserver: permission denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_users_password_changes_or_the_user_is_deleted() {
    let _one = exclusive().await;
    let (_cluster, root, address) = secured(&["carol", "dave"], &[]).await;

    let (mut watcher, mut stream, _) = watching(&root, &address, "carol").await;
    change(
        &root,
        AuthCommand::UserPasswd {
            name: "carol".into(),
            password_hash: Some("another-pw".into()),
        },
    )
    .await;
    let after = put(&root, "carol/2", b"v".to_vec()).await;
    // The client logs in again with the password it has: refused.
    let error = watch_error(&mut watcher, after).await;
    assert!(
        matches!(error, ClientError::Unauthenticated(_)),
        "{error:?}"
    );
    let (canceled, revisions) = stream.until_canceled().await;
    assert!(revisions.iter().all(|r| *r < after), "{revisions:?}");
    assert_eq!(canceled.cancel_reason, "etcdserver: invalid auth token");

    let (mut watcher, mut stream, _) = watching(&root, &address, "dave").await;
    change(
        &root,
        AuthCommand::UserDelete {
            name: "dave".into(),
        },
    )
    .await;
    let after = put(&root, "dave/2", b"v".to_vec()).await;
    let error = watch_error(&mut watcher, after).await;
    assert!(
        matches!(error, ClientError::Unauthenticated(_)),
        "{error:?}"
    );
    let (canceled, revisions) = stream.until_canceled().await;
    assert!(revisions.iter().all(|r| *r < after), "{revisions:?}");
    assert_eq!(canceled.cancel_reason, "etcdserver: invalid auth token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_token_expires_and_the_client_logs_in_again() {
    let _one = exclusive().await;
    let (_cluster, root, address) = secured(&["erin"], &["--auth-token-ttl", "3s"]).await;
    let first = put(&root, "erin/1", b"v".to_vec()).await;
    // The Rust client's watch (it logs in with the password now), then a
    // raw one with a token taken after: the first to expire is the
    // client's.
    let mut watcher = client(&address, password("erin")).watch(
        "erin/",
        WatchOptions::default().with_prefix().from_revision(first),
    );
    until_change(&mut watcher, first).await;
    let erin = token(&address, "erin").await;
    let mut raw_client = native(connection(&address).await);
    let mut raw = native_watch(&mut raw_client, "erin/", Some(&erin))
        .await
        .expect("erin watches");

    // Cluster time moves with the writes: the token expires.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut n = 0;
    let failure = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never ended"
        );
        let message = tokio::time::timeout(Duration::from_millis(300), raw.message()).await;
        match message {
            Err(_) => {
                n += 1;
                put(&root, &format!("other/{n}"), b"tick".to_vec()).await;
            }
            Ok(Ok(Some(v1::WatchResponse {
                kind: Some(Kind::Failure(failure)),
            }))) => break failure,
            Ok(Ok(Some(_))) => {}
            Ok(other) => panic!("the watch ended without a reason: {other:?}"),
        }
    };
    match convert::failure_from_wire(failure) {
        Ok(CallFailure::Unauthenticated(reason)) => {
            assert!(reason.contains("expired"), "{reason}");
        }
        other => panic!("expected unauthenticated, got {other:?}"),
    }
    // The Rust client's watch was ended too; it logged in again and goes
    // on from where it was.
    let later = put(&root, "erin/2", b"v".to_vec()).await;
    until_change(&mut watcher, later).await;
}

/// The node's bound on unsent watch bytes in the test below: 16 MiB.
const NODE_WATCH_BYTES: u64 = 16 << 20;
/// A user's share of it, in percent: 40% of 16 MiB is between one
/// stream's bound (4 MiB) and two streams' (8 MiB).
const USER_SHARE_PERCENT: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_share_of_the_nodes_watch_bounds_follows_the_user_share_while_another_user_watches()
{
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let bytes_max = NODE_WATCH_BYTES.to_string();
    let share = USER_SHARE_PERCENT.to_string();
    let flags = [
        "--listen-metrics",
        metrics.as_str(),
        "--watchers-max",
        "10",
        "--watch-bytes-max",
        bytes_max.as_str(),
        "--user-share-percent",
        share.as_str(),
    ];
    let (_cluster, root, address) = secured(&["alice", "bob", "carol"], &flags).await;
    // A user's share, rounded up: 4 of 10 watchers, 6710887 bytes.
    let user_watchers = 4;
    let user_bytes = (NODE_WATCH_BYTES * USER_SHARE_PERCENT).div_ceil(100);
    assert!(user_bytes > 4 << 20 && user_bytes < 8 << 20);
    // alice and bob may both read `big/`.
    change(
        &root,
        AuthCommand::RoleAdd {
            name: "big-reader".into(),
        },
    )
    .await;
    change(
        &root,
        AuthCommand::RoleGrant {
            role: "big-reader".into(),
            permission: Permission {
                access: Access::Read,
                key: b"big/".to_vec(),
                prefix: true,
            },
        },
    )
    .await;
    for user in ["alice", "bob"] {
        change(
            &root,
            AuthCommand::UserGrantRole {
                user: user.into(),
                role: "big-reader".into(),
            },
        )
        .await;
    }

    // carol holds her share of the node's watchers, and one more is
    // refused naming it...
    let carol = token(&address, "carol").await;
    let mut carols = native(connection(&address).await);
    let mut held = Vec::new();
    for _ in 0..user_watchers {
        held.push(
            native_watch(&mut carols, "carol/", Some(&carol))
                .await
                .expect("a watcher within her share"),
        );
    }
    let refused = carols
        .watch(with_token(prefix_watch("carol/"), Some(&carol)))
        .await
        .expect_err("one over her share");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("\"carol\"")
            && refused
                .message()
                .contains(&format!("maximum of {user_watchers} watchers"))
            && refused.message().contains("per user"),
        "{refused:?}"
    );
    // ... while bob still watches: his watch reads every change below.
    let bob = token(&address, "bob").await;
    let mut reader_client = native(connection(&address).await);
    let reader = native_watch(&mut reader_client, "big/", Some(&bob))
        .await
        .expect("bob watches");

    // Two watch streams of alice that never read past their start, each
    // on a connection of its own: each holds less than a stream's bound
    // when the two together reach her share.
    let alice = token(&address, "alice").await;
    let mut idle_clients = Vec::new();
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut idle_client = native(connection(&address).await);
        idle.push(
            native_watch(&mut idle_client, "big/", Some(&alice))
                .await
                .expect("alice watches"),
        );
        idle_clients.push(idle_client);
    }
    let (reading, mut read) = keep_reading(reader, "bob");

    // Changes of 256 KiB until the node has cancelled both of alice's
    // streams, the writer never more than two changes ahead of bob.
    const WRITES_MAX: usize = 160;
    let mut written = Vec::new();
    while canceled(&metrics, "unread").is_none_or(|n| n < 2) {
        assert!(
            written.len() < WRITES_MAX,
            "alice's idle streams were not both cancelled after {WRITES_MAX} changes"
        );
        let caught_up = written.len().saturating_sub(2);
        tokio::time::timeout(WAIT, read.wait_for(|read| read.len() >= caught_up))
            .await
            .expect("bob keeps up in time")
            .expect("bob's reader runs");
        let n = written.len();
        written.push(put(&root, "big/k", vec![n as u8; 256 * 1024]).await);
    }
    let total = written.len();
    tokio::time::timeout(WAIT, read.wait_for(|read| read.len() >= total))
        .await
        .expect("bob reads every change in time")
        .expect("bob's reader runs");
    assert_eq!(*read.borrow(), written, "bob got every change once");
    reading.abort();

    // Each of alice's streams hears why once it reads: some changes, then
    // the bound. The first to reach a bound reached hers, across both
    // streams (the other, alone after it, may then reach its stream's).
    let per_user = format!("the bound is {user_bytes} bytes per user");
    let per_stream = format!("the bound is {STREAM_BYTES_MAX} bytes per stream");
    let mut reasons = Vec::new();
    for stream in &mut idle {
        let mut events = 0;
        let reason = loop {
            match next_native(stream).await {
                Some(Kind::Events(batch)) => events += batch.events.len(),
                Some(Kind::Progress(_)) => {}
                Some(Kind::Canceled(canceled)) => break canceled.reason,
                other => panic!("expected a bound's cancellation, got {other:?}"),
            }
        };
        assert!(events < total, "{events} changes reached an idle stream");
        assert!(
            reason.contains(&per_user) || reason.contains(&per_stream),
            "{reason}"
        );
        let resume = written[events];
        assert!(
            reason.contains(&format!("resume from revision {resume}")),
            "{reason}"
        );
        assert_eq!(next_native(stream).await, None, "the stream ends");
        reasons.push(reason);
    }
    assert!(
        reasons.iter().any(|reason| reason.contains(&per_user)),
        "neither of alice's streams was cancelled at her share: {reasons:?}"
    );
    drop(held);
}
