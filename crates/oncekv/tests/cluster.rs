//! The replicated, durable node under real faults: multi-process clusters
//! on loopback, SIGKILL, SIGSTOP, restarts, and bad input on the wire.

mod support;

use oncekv_proto::v1;
use oncekv_state::{
    Command, IdempotencyKey, Malformed, Origin, Outcome, Query, Reply, Request, Secret, SessionId,
};
use std::time::{Duration, Instant};
use support::{
    CallFailure, Cluster, FAST, TestSession, eventually, exclusive, execute_on, without_meta,
};

const ELECTION: Duration = Duration::from_secs(15);

/// A request under an idempotency key: safe for the harness to retry.
fn keyed(key: String, command: Command) -> Request {
    Request {
        origin: Origin::Key(IdempotencyKey(key.into_bytes())),
        command,
    }
}

fn append(value: &str) -> Command {
    Command::Append {
        key: b"log".to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// The pattern's own scenario: the leader commits a session request and
/// dies before its reply is read; the retry on the new leader is answered
/// from the completion record, and the value holds the append once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_leader_dies_is_replayed_not_reapplied() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let session = TestSession::open(&cluster, 60_000, 8).await;
    let first = session.request(1, 1, append("token-1;"));
    // The reply to this call is never read. If leadership moved before it
    // arrived (a loaded machine), it was not proposed: send it again to
    // the leader of the moment.
    let mut sent = 0;
    let leader = loop {
        sent += 1;
        let leader = cluster.leader(ELECTION).await;
        let address = cluster.node(leader).client.clone();
        let request = first.clone();
        let lost = tokio::spawn(async move { execute_on(&address, &request).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        let reached = loop {
            let followers = cluster.nodes.iter().filter(|n| n.id != leader);
            let mut any = false;
            for node in followers {
                any |= node.local_value(b"log").await.as_deref() == Some(b"token-1;");
            }
            if any || Instant::now() > deadline {
                break any;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if reached {
            lost.abort();
            break leader;
        }
        let answer = tokio::time::timeout(Duration::from_secs(5), lost).await;
        let not_leader = matches!(
            &answer,
            Ok(Ok(Ok(response)))
                if matches!(support::failure(response), Some(CallFailure::NotLeader { .. }))
        );
        assert!(
            not_leader && sent < 3,
            "the append did not reach a follower (attempt {sent}); the leader answered {answer:?}\n{}",
            cluster.logs()
        );
    };
    cluster.node(leader).kill();
    let new_leader = cluster.leader(ELECTION).await;
    assert_ne!(new_leader, leader);
    let retry = session.request(1, 2, append("token-1;"));
    match cluster.outcome(&retry, ELECTION).await {
        Outcome::Replayed {
            reply: Reply::Append { length: 8 },
            ..
        } => {}
        other => panic!("expected the original reply replayed, got {other:?}"),
    }
    let value = cluster
        .node(new_leader)
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
            value: Some(b"token-1;".to_vec()),
            meta: None,
        })
    );
}

/// Every node killed and restarted: acknowledged writes survive, sessions
/// still deduplicate, and replicas agree byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restart_keeps_writes_and_completion_records() {
    let _one = exclusive().await;
    let flags: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--snapshot-after-entries", "16", "--log-entries-kept", "4"])
        .collect();
    let mut cluster = Cluster::start(3, &flags);
    cluster.leader(ELECTION).await;
    let session = TestSession::open(&cluster, 600_000, 8).await;
    let mut last = None;
    for seq in 1..=40u64 {
        let incr = session.request(
            seq,
            1,
            Command::Incr {
                key: b"counter".to_vec(),
                by: 1,
            },
        );
        let outcome = cluster.outcome(&incr, ELECTION).await;
        assert_eq!(outcome, Outcome::Applied(Reply::Incr { value: seq as i64 }));
        last = Some(outcome);
    }
    for node in &mut cluster.nodes {
        node.kill();
    }
    for node in &mut cluster.nodes {
        node.spawn();
    }
    let leader = cluster.leader(ELECTION).await;
    let retry = session.request(
        40,
        2,
        Command::Incr {
            key: b"counter".to_vec(),
            by: 1,
        },
    );
    match (cluster.outcome(&retry, ELECTION).await, last) {
        (Outcome::Replayed { reply, .. }, Some(Outcome::Applied(original))) => {
            assert_eq!(reply, original)
        }
        (other, _) => panic!("expected a replay after restart, got {other:?}"),
    }
    let value = cluster
        .node(leader)
        .read(
            &Query::Get {
                key: b"counter".to_vec(),
            },
            false,
        )
        .await;
    assert_eq!(
        without_meta(value),
        Ok(Reply::Get {
            value: Some(b"40".to_vec()),
            meta: None,
        })
    );
    let statuses = eventually(Duration::from_secs(20), "replicas to converge", || {
        let nodes = &cluster.nodes;
        async move {
            let mut statuses = Vec::new();
            let mut digests = Vec::new();
            for node in nodes {
                statuses.push(node.status().await.ok()?);
                digests.push(node.state_digest().await.ok()?);
            }
            let same = digests.windows(2).all(|pair| pair[0] == pair[1]);
            same.then_some(statuses)
        }
    })
    .await;
    assert!(
        statuses.iter().all(|s| s.snapshot_index.is_some()),
        "snapshots were taken: {statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| s.sessions == 1 && s.completion_records >= 1)
    );
}

/// A follower paused past the log the leader keeps catches up by snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_catches_up_by_snapshot() {
    let _one = exclusive().await;
    let flags: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--snapshot-after-entries", "10", "--log-entries-kept", "2"])
        .collect();
    let mut cluster = Cluster::start(3, &flags);
    let leader = cluster.leader(ELECTION).await;
    let follower = cluster
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .expect("follower")
        .id;
    cluster.node(follower).signal("-STOP");
    for i in 0..60 {
        let put = keyed(
            format!("put-{i}"),
            Command::Put {
                key: format!("k{i}").into_bytes(),
                value: b"v".to_vec().into(),
                lease: None,
            },
        );
        let outcome = cluster.outcome(&put, ELECTION).await;
        assert!(
            matches!(outcome, Outcome::Applied(_) | Outcome::Replayed { .. }),
            "{outcome:?}"
        );
    }
    let leader = cluster.leader(ELECTION).await;
    let leader_status = cluster.node(leader).status().await.expect("leader status");
    cluster.node(follower).signal("-CONT");
    let caught_up = eventually(Duration::from_secs(20), "the follower to catch up", || {
        let node = &cluster.nodes[(follower - 1) as usize];
        let target = leader_status.applied_index;
        async move {
            node.status()
                .await
                .ok()
                .filter(|s| s.applied_index >= target)
        }
    })
    .await;
    assert!(
        caught_up.snapshot_index.is_some(),
        "caught up through a snapshot: {caught_up:?}"
    );
    assert_eq!(
        cluster.node(follower).local_value(b"k59").await,
        Some(b"v".to_vec())
    );
}

/// Expiry is decided on cluster time carried in the log: an idle session
/// is gone on every node, and stays gone after a leader change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_expires_on_every_node_and_after_failover() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    cluster.leader(ELECTION).await;
    let session = TestSession::open(&cluster, 2_000, 4).await;
    let put = session.request(
        1,
        1,
        Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        },
    );
    assert!(matches!(
        cluster.outcome(&put, ELECTION).await,
        Outcome::Applied(_)
    ));
    // The idle leader's ticks carry cluster time past the ttl, and the
    // session expires in the replicated state.
    eventually(Duration::from_secs(30), "the session to expire", || {
        let cluster = &cluster;
        async move {
            let leader = cluster.leader(ELECTION).await;
            cluster.nodes[(leader - 1) as usize]
                .status()
                .await
                .ok()
                .filter(|s| s.sessions == 0)
                .map(|_| ())
        }
    })
    .await;
    let next = session.request(
        2,
        1,
        Command::Put {
            key: b"k".to_vec(),
            value: b"w".to_vec().into(),
            lease: None,
        },
    );
    assert_eq!(
        cluster.outcome(&next, ELECTION).await,
        Outcome::SessionExpired
    );
    let leader = cluster.leader(ELECTION).await;
    // Followers drop it when they learn that the refused request committed
    // (a heartbeat carries the commit index). Generous on a loaded machine;
    // a failure shows what each node had applied.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut statuses = Vec::new();
        for node in &cluster.nodes {
            statuses.push(node.status().await.map(|s| {
                (
                    s.id,
                    s.is_leader,
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    s.sessions,
                )
            }));
        }
        let dropped = statuses.iter().all(|status| matches!(status, Ok((.., 0))));
        if dropped {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a node still holds the expired session (id, leader, term, commit, applied, \
             sessions): {statuses:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.node(leader).kill();
    // Whoever leads now (an election may take two rounds with two nodes
    // left, so follow leadership rather than trust the first leader seen).
    assert_eq!(
        cluster.outcome(&next, ELECTION).await,
        Outcome::SessionExpired
    );
    let value = eventually(ELECTION, "a linearizable read on the new leader", || {
        let cluster = &cluster;
        async move {
            let new_leader = cluster.leader(ELECTION).await;
            let node = cluster.nodes.iter().find(|n| n.id == new_leader)?;
            node.read(&Query::Get { key: b"k".to_vec() }, false)
                .await
                .ok()
        }
    })
    .await;
    assert_eq!(
        without_meta(value),
        Reply::Get {
            value: Some(b"v".to_vec()),
            meta: None,
        }
    );
}

/// Bad input on the wire gets a clear answer and the node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_node_keeps_serving() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    let leader = cluster.leader(ELECTION).await;
    let node = &cluster.nodes[(leader - 1) as usize];
    // Over the 4 MiB message limit: refused by the transport.
    let huge = Request::plain(Command::Put {
        key: b"k".to_vec(),
        value: (vec![0; 5 << 20]).into(),
        lease: None,
    });
    let error = node
        .execute(&huge)
        .await
        .expect_err("oversized message refused");
    assert!(
        error.contains("message") || error.contains("large"),
        "{error}"
    );
    // Unknown session, wrong secret, seq 0, empty key.
    let session = TestSession::open(&cluster, 60_000, 4).await;
    let unknown = TestSession {
        id: SessionId(987_654),
        secret: session.secret,
    };
    let put = |key: &[u8]| Command::Put {
        key: key.to_vec(),
        value: b"v".to_vec().into(),
        lease: None,
    };
    assert_eq!(
        node.outcome(&unknown.request(1, 1, put(b"k"))).await,
        Outcome::SessionExpired
    );
    let thief = TestSession {
        id: session.id,
        secret: Secret(12345),
    };
    assert_eq!(
        node.outcome(&thief.request(1, 1, put(b"k"))).await,
        Outcome::Unauthorized
    );
    // What is wrong whatever the state is refused before proposing: it
    // costs no log entry.
    let log_end = node.status().await.expect("status").last_log_index;
    let refused = |response: Result<v1::ExecuteResponse, String>| {
        let response = response.expect("answered");
        match support::failure(&response) {
            Some(CallFailure::Invalid(why)) => why,
            _ => panic!("not refused before proposing: {response:?}"),
        }
    };
    let seq_zero = refused(node.execute(&session.request(0, 1, put(b"k"))).await);
    assert!(
        seq_zero.contains(&Malformed::SeqZero.to_string()),
        "{seq_zero}"
    );
    let empty_key = refused(node.execute(&Request::plain(put(b""))).await);
    assert!(empty_key.contains("key must be"), "{empty_key}");
    let too_large = Request::plain(Command::Put {
        key: b"k".to_vec(),
        value: (vec![0; 2 << 20]).into(),
        lease: None,
    });
    let too_large = refused(node.execute(&too_large).await);
    assert!(too_large.contains("exceeds the limit"), "{too_large}");
    assert_eq!(
        node.status().await.expect("status").last_log_index,
        log_end,
        "a refusal before proposing appended to the log"
    );
    // Malformed protobuf content: no command, a secret of the wrong size.
    let mut client = node.connect().await.expect("connect");
    let empty = client
        .execute(v1::ExecuteRequest::default())
        .await
        .expect("answered")
        .into_inner();
    assert!(
        matches!(support::failure(&empty), Some(CallFailure::Invalid(_))),
        "{empty:?}"
    );
    let short_secret = v1::ExecuteRequest {
        origin: Some(v1::execute_request::Origin::Session(v1::RequestHeader {
            session_id: session.id.0,
            secret: vec![1, 2, 3],
            seq: 1,
            first_incomplete: 1,
            attempt: 1,
        })),
        command: Some(v1::Command {
            kind: Some(v1::command::Kind::Delete(v1::Delete { key: b"k".to_vec() })),
        }),
    };
    let answer = client
        .execute(short_secret)
        .await
        .expect("answered")
        .into_inner();
    assert!(
        matches!(support::failure(&answer), Some(CallFailure::Invalid(_))),
        "{answer:?}"
    );
    // Still serving, and nothing was applied by the bad requests.
    assert!(matches!(
        node.outcome(&session.request(1, 1, put(b"k"))).await,
        Outcome::Applied(_)
    ));
    assert_eq!(
        without_meta(node.read(&Query::Get { key: b"k".to_vec() }, false).await),
        Ok(Reply::Get {
            value: Some(b"v".to_vec()),
            meta: None,
        })
    );
}

/// A leader killed and restarted at once must not serve a linearizable
/// read before it knows what was committed (no stale read of acknowledged
/// writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_never_serves_a_stale_read() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    for round in 1..=3u64 {
        for i in 0..20 {
            let put = keyed(
                format!("incr-{round}-{i}"),
                Command::Incr {
                    key: b"n".to_vec(),
                    by: 1,
                },
            );
            let outcome = cluster.outcome(&put, ELECTION).await;
            assert!(
                matches!(outcome, Outcome::Applied(_)),
                "round {round} write {i}: {outcome:?}"
            );
        }
        let leader = cluster.leader(ELECTION).await;
        cluster.node(leader).kill();
        cluster.node(leader).spawn();
        let expected = (round * 20).to_string().into_bytes();
        // Whoever answers a linearizable read first must have every write.
        let answer = eventually(Duration::from_secs(15), "a linearizable read", || {
            let nodes = &cluster.nodes;
            async move {
                for node in nodes {
                    if let Ok(reply) = node.read(&Query::Get { key: b"n".to_vec() }, false).await {
                        return Some((node.id, reply));
                    }
                }
                None
            }
        })
        .await;
        assert_eq!(
            without_meta(answer.1),
            Reply::Get {
                value: Some(expected),
                meta: None,
            },
            "stale read from node {} in round {round}",
            answer.0
        );
    }
}

/// The response to `request` sent to `address`: a call the node did not
/// carry out for want of a leader (a loaded machine may hold an election
/// mid-test) is sent again, as a client does, to the leader of the moment,
/// at most five times.
async fn answered_at_a_leader(
    cluster: &Cluster,
    mut address: String,
    request: &Request,
) -> v1::ExecuteResponse {
    for _ in 0..5 {
        let response = execute_on(&address, request).await.expect("answered");
        match &response.result {
            Some(v1::execute_response::Result::Failure(v1::Failure {
                kind: Some(v1::failure::Kind::NotLeader(_) | v1::failure::Kind::Unavailable(_)),
            })) => {
                let leader = cluster.leader(ELECTION).await;
                address = cluster.nodes[(leader - 1) as usize].client.clone();
            }
            _ => return response,
        }
    }
    panic!("no outcome at five leaders in turn")
}

/// Concurrent retries of one in-flight request (joined to it on the leader,
/// or answered from its completion record) all get the original reply,
/// and the command applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_of_one_request_apply_it_once() {
    let _one = exclusive().await;
    let cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(ELECTION).await;
    let session = TestSession::open(&cluster, 60_000, 8).await;
    let address = cluster.nodes[(leader - 1) as usize].client.clone();
    let attempts = (1..=8u32).map(|attempt| {
        let request = session.request(1, attempt, append("once;"));
        let address = address.clone();
        let cluster = &cluster;
        async move { answered_at_a_leader(cluster, address, &request).await }
    });
    let mut replies = Vec::new();
    for response in futures_util::future::join_all(attempts).await {
        match response.result {
            Some(oncekv_proto::v1::execute_response::Result::Outcome(outcome)) => {
                match oncekv_proto::convert::outcome_from_wire(outcome).expect("valid") {
                    Outcome::Applied(reply) => replies.push((reply, response.log_index)),
                    Outcome::Replayed {
                        reply,
                        applied_index,
                    } => replies.push((reply, applied_index.0)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            other => panic!("no outcome: {other:?}"),
        }
    }
    assert!(
        replies.windows(2).all(|pair| pair[0] == pair[1]),
        "{replies:?}"
    );
    let value = cluster
        .outcome(
            &session.request(
                2,
                1,
                Command::Read(Query::Get {
                    key: b"log".to_vec(),
                }),
            ),
            ELECTION,
        )
        .await;
    assert_eq!(
        without_meta(value),
        Outcome::Applied(Reply::Get {
            value: Some(b"once;".to_vec()),
            meta: None,
        })
    );
}

/// After losing its quorum a node says so (no leader, nothing proposed),
/// rather than pointing nowhere, and serves again once a peer is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_a_node_answers_no_leader_and_recovers_with_it() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(ELECTION).await;
    let follower = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .expect("a follower");
    let survivor = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader && *id != follower)
        .expect("a survivor");
    cluster.node(leader).kill();
    cluster.node(follower).kill();
    let request = keyed("no-quorum".into(), append("x;"));
    let address = cluster.node(survivor).client.clone();
    let answer = eventually(ELECTION, "the survivor to know it has no leader", || {
        let address = address.clone();
        let request = request.clone();
        async move {
            let response = execute_on(&address, &request).await.ok()?;
            match support::failure(&response) {
                Some(CallFailure::NoLeader(reason)) => Some(reason),
                _ => None,
            }
        }
    })
    .await;
    assert!(answer.contains("quorum"), "{answer}");
    cluster.restart(follower).expect("restart a follower");
    match cluster.outcome(&request, ELECTION).await {
        Outcome::Applied(Reply::Append { length: 2 }) => {}
        other => panic!("expected the append applied once a quorum is back, got {other:?}"),
    }
}

/// `endpoint health` and `endpoint status` ask every member on its own
/// (the standard gRPC health check, and status); a leader cut off from
/// its quorum is reported unhealthy and the command exits 1, and healthy
/// again once a peer is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_and_status_cover_every_member() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(ELECTION).await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let first = endpoints[0].clone();
    let run = |args: &[&str], endpoints: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["--endpoints", endpoints, "--timeout", "3s"])
            .output()
            .expect("run oncekv");
        (
            output.status.code().expect("exit code"),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let all = endpoints.join(",");
    let (code, text) = eventually(ELECTION, "every member healthy", || {
        let answer = run(&["endpoint", "health"], &all);
        async move { (answer.0 == 0).then_some(answer) }
    })
    .await;
    assert_eq!(code, 0);
    assert_eq!(text.matches(" true ").count(), 3, "{text}");
    let (code, text) = run(&["endpoint", "status", "--cluster"], &first);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        text.lines().count(),
        4,
        "a header and a row per member: {text}"
    );
    assert!(text.contains("(this)"), "the leader says so: {text}");
    let (code, table) = run(&["status"], &all);
    assert_eq!(code, 0, "{table}");
    assert_eq!(
        table.lines().count(),
        4,
        "status over several endpoints: {table}"
    );
    // One follower gone: the leader still hears from a quorum (itself and
    // the other), so it serves.
    let followers: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| *id != leader)
        .collect();
    cluster.node(followers[0]).kill();
    let at_leader = cluster.node(leader).client.clone();
    let (code, text) = eventually(ELECTION, "the leader with a quorum to be healthy", || {
        let answer = run(&["endpoint", "health"], &at_leader);
        async move { (answer.0 == 0).then_some(answer) }
    })
    .await;
    assert_eq!(code, 0, "a leader with a quorum is healthy: {text}");
    // Both gone: the leader is cut off from its quorum. openraft keeps it
    // leader (there is no check-quorum step-down), but it can commit
    // nothing, and says so.
    cluster.node(followers[1]).kill();
    let (code, text) = eventually(
        ELECTION,
        "the lone leader to report itself unhealthy",
        || {
            let answer = run(&["endpoint", "health"], &at_leader);
            async move { (answer.0 == 1).then_some(answer) }
        },
    )
    .await;
    assert_eq!(code, 1);
    assert!(text.contains("false"), "{text}");
    // Healed (a peer is back): serving again.
    cluster.restart(followers[0]).expect("restart a peer");
    let (code, text) = eventually(ELECTION, "the leader to serve again", || {
        let answer = run(&["endpoint", "health"], &at_leader);
        async move { (answer.0 == 0).then_some(answer) }
    })
    .await;
    assert_eq!(code, 0);
    assert!(text.contains("true"), "{text}");
}

/// Server reflection lists the services (so `grpcurl` can call them
/// without the `.proto`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(ELECTION).await;
    let address = format!("http://{}", cluster.node(1).client);
    let channel = tonic::transport::Endpoint::from_shared(address)
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("an answer")
        .expect("one message");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in ["oncekv.v1.Kv", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
}
