//! A follower that lags the leader's auth changes: a user the leader has
//! already added is unknown to a follower cut off from it. Such a follower
//! sends the user's writes and linearizable reads to the leader (or says
//! it knows none) instead of refusing them as unauthenticated; only a
//! serializable read, which it answers from its own state, is refused
//! there. The leader, which knows the user, judges the write by the
//! user's grants.

mod support;

use oncekv_harness::cluster::{Cluster, NodeProcess};
use oncekv_proto::convert::{self, CallFailure, failure_from_wire};
use oncekv_proto::v1::{self, AuthenticateRequest, ExecuteRequest, ReadRequest};
use oncekv_proto::{AUTHORIZATION_METADATA, BEARER};
use oncekv_state::{ADMIN_ROLE, AuthCommand, Command, Outcome, Query, Reply, Request, TokenKey};
use std::time::Duration;
use support::{FAST, connect, eventually, exclusive};

const ELECTION: Duration = Duration::from_secs(20);

/// `message` with `token` as its bearer.
fn bearing<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("{BEARER}{token}").parse().expect("metadata value");
    request.metadata_mut().insert(AUTHORIZATION_METADATA, value);
    request
}

/// Logs `user` in at `node` (the leader) and returns the token.
async fn login(node: &NodeProcess, user: &str, password: &str) -> String {
    let mut client = connect(&node.client).await.expect("connect");
    let answer = client
        .authenticate(AuthenticateRequest {
            user: user.into(),
            password: password.into(),
        })
        .await
        .expect("authenticate call")
        .into_inner();
    match answer.result {
        Some(v1::authenticate_response::Result::Token(token)) => token.token,
        other => panic!("{user} logs in: {other:?}"),
    }
}

/// Runs `request` on `node` as the bearer of `token`: its outcome, or why
/// the call was not carried out.
async fn execute(
    node: &NodeProcess,
    request: &Request,
    token: &str,
) -> Result<Outcome, CallFailure> {
    let mut client = connect(&node.client).await.expect("connect");
    let wire: ExecuteRequest = convert::request_to_wire(request).expect("to wire");
    let answer = client
        .execute(bearing(wire, token))
        .await
        .expect("execute call")
        .into_inner();
    match answer.result {
        Some(v1::execute_response::Result::Outcome(outcome)) => {
            Ok(convert::outcome_from_wire(outcome).expect("an outcome"))
        }
        Some(v1::execute_response::Result::Failure(failure)) => {
            Err(failure_from_wire(failure).expect("a failure"))
        }
        None => panic!("an empty answer"),
    }
}

/// Reads `key` on `node` as the bearer of `token`: whether it was refused,
/// and how.
async fn read_failure(
    node: &NodeProcess,
    key: &[u8],
    serializable: bool,
    token: &str,
) -> Option<CallFailure> {
    let mut client = connect(&node.client).await.expect("connect");
    let query = convert::query_to_wire(&Query::Get { key: key.to_vec() });
    let answer = client
        .read(bearing(
            ReadRequest {
                query: Some(query),
                serializable,
            },
            token,
        ))
        .await
        .expect("read call")
        .into_inner();
    match answer.result {
        Some(v1::read_response::Result::Failure(failure)) => {
            Some(failure_from_wire(failure).expect("a failure"))
        }
        _ => None,
    }
}

fn auth(command: AuthCommand) -> Request {
    Request::plain(Command::Auth(command))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_sends_an_unknown_user_to_the_leader() {
    let _one = exclusive().await;
    let options = oncekv_harness::testing::options(env!("CARGO_BIN_EXE_oncekv"), 3, FAST);
    let cluster = Cluster::start_partitionable(&options)
        .await
        .expect("a partitionable cluster");
    // The leader, asked before authentication is on (status then needs
    // an admin): cutting a follower off leaves it a quorum to lead.
    let leader_id = cluster.leader(ELECTION).await;
    for command in [
        AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: Some("root-pw".into()),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: ADMIN_ROLE.into(),
        },
        AuthCommand::Enable {
            token_key: TokenKey([0; 32]),
        },
    ] {
        let outcome = cluster.outcome(&auth(command), ELECTION).await;
        assert!(
            matches!(outcome, Outcome::Applied(Reply::AuthChanged)),
            "{outcome:?}"
        );
    }
    let node = |id: u64| cluster.nodes.iter().find(|n| n.id == id).expect("node");
    let leader = node(leader_id);
    let follower_id = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader_id)
        .expect("a follower");
    let follower = node(follower_id);
    let root = login(leader, "root", "root-pw").await;
    // The follower has applied the enabling of authentication before it
    // is cut off (else it would judge bob's reads with it still off): it
    // refuses a serializable read with a token it cannot check.
    eventually(
        ELECTION,
        "the follower to enforce authentication",
        || async {
            let read = read_failure(follower, b"k", true, "not-a-token").await;
            matches!(read, Some(CallFailure::Unauthenticated(_))).then_some(())
        },
    )
    .await;

    // The follower is cut off; the leader and the other follower add bob.
    let others: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| *id != follower_id)
        .collect();
    cluster.partitions().split(&[follower_id], &others);
    let add = auth(AuthCommand::UserAdd {
        name: "bob".into(),
        password_hash: Some("bob-pw".into()),
    });
    let added = execute(leader, &add, &root).await;
    assert!(
        matches!(added, Ok(Outcome::Applied(Reply::AuthChanged))),
        "{added:?}"
    );
    let bob = login(leader, "bob", "bob-pw").await;

    // The follower knows no bob: it sends his write and his linearizable
    // read to the leader (or knows none while cut off), never refuses them.
    let put = Request::plain(Command::Put {
        key: b"k".to_vec(),
        value: b"v".to_vec().into(),
        lease: None,
    });
    let refused = execute(follower, &put, &bob).await;
    assert!(
        matches!(
            refused,
            Err(CallFailure::NotLeader { .. } | CallFailure::NoLeader(_))
        ),
        "a write on the lagging follower: {refused:?}"
    );
    let read = read_failure(follower, b"k", false, &bob).await;
    assert!(
        matches!(
            read,
            Some(CallFailure::NotLeader { .. } | CallFailure::NoLeader(_))
        ),
        "a linearizable read on the lagging follower: {read:?}"
    );
    // Read from its own state, a serializable read is judged by it.
    let read = read_failure(follower, b"k", true, &bob).await;
    assert!(
        matches!(read, Some(CallFailure::Unauthenticated(_))),
        "a serializable read on the lagging follower: {read:?}"
    );
    // The leader knows bob: it judges his write by his grants (none).
    let judged = execute(leader, &put, &bob).await;
    assert!(
        matches!(judged, Ok(Outcome::PermissionDenied { .. })),
        "{judged:?}"
    );
    cluster.partitions().heal();
}
