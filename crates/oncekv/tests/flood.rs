//! Floods, oversize and forged retries against a real node: full tables
//! refuse instead of evicting what is live, byte budgets hold, status does
//! not stall writes, and the retry rendezvous answers only a caller who
//! could have sent the request. Each test starts its own one-node cluster
//! on loopback and bounds every loop in count and time.

mod support;

use oncekv_proto::convert;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, ExecuteRequest, StatusRequest};
use oncekv_state::{
    Command, IdempotencyKey, Origin, Outcome, Overload, Query, Reply, Request, Secret,
};
use std::time::Duration;
use support::{Cluster, FAST, NodeProcess, TestSession, exclusive, without_meta};
use tonic::transport::Channel;

const ELECTION: Duration = Duration::from_secs(15);

/// Starts one node with `flags` besides the fast-failover ones.
async fn one_node(flags: &[&str]) -> (Cluster, KvClient<Channel>) {
    let extra: Vec<&str> = FAST.iter().chain(flags).copied().collect();
    let cluster = Cluster::start(1, &extra);
    cluster.leader(ELECTION).await;
    let client = cluster.nodes[0].connect().await.expect("connect");
    (cluster, client)
}

/// Sends `request` and returns the outcome the state machine decided.
async fn outcome_of(client: &mut KvClient<Channel>, request: &Request) -> Outcome {
    let wire: ExecuteRequest = convert::request_to_wire(request).expect("encodes");
    let response = client.execute(wire).await.expect("answered").into_inner();
    match response.result {
        Some(v1::execute_response::Result::Outcome(outcome)) => {
            convert::outcome_from_wire(outcome).expect("valid outcome")
        }
        other => panic!("no outcome: {other:?}"),
    }
}

/// The outcome `request` is given at the leader of the moment: a call the
/// node did not carry out for want of a leader (a loaded machine may hold
/// an election mid-test) is sent again, as a client does, to the leader
/// then, at most five times.
async fn settled_outcome(
    cluster: &Cluster,
    client: &KvClient<Channel>,
    request: &Request,
) -> Outcome {
    let mut client = client.clone();
    for _ in 0..5 {
        let wire: ExecuteRequest = convert::request_to_wire(request).expect("encodes");
        let response = client.execute(wire).await.expect("answered").into_inner();
        match response.result {
            Some(v1::execute_response::Result::Outcome(outcome)) => {
                return convert::outcome_from_wire(outcome).expect("valid outcome");
            }
            Some(v1::execute_response::Result::Failure(v1::Failure {
                kind: Some(v1::failure::Kind::NotLeader(_) | v1::failure::Kind::Unavailable(_)),
            })) => {
                let leader = cluster.leader(ELECTION).await;
                client = cluster.nodes[(leader - 1) as usize]
                    .connect()
                    .await
                    .expect("connect");
            }
            other => panic!("no outcome: {other:?}"),
        }
    }
    panic!("no outcome at five leaders in turn")
}

fn keyed(key: &str, command: Command) -> Request {
    Request {
        origin: Origin::Key(IdempotencyKey(key.as_bytes().to_vec())),
        command,
    }
}

fn get(key: &[u8]) -> Command {
    Command::Read(Query::Get { key: key.to_vec() })
}

/// Resident memory of a process, from /proc.
fn rss_bytes(node: &NodeProcess) -> u64 {
    let pid = node.child.as_ref().expect("running").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_cannot_make_an_accepted_keys_retry_apply_twice() {
    let _one = exclusive().await;
    let (cluster, mut client) = one_node(&["--idempotency-keys-max", "300"]).await;
    let payment = keyed(
        "payment-order-42",
        Command::Incr {
            key: b"paid".to_vec(),
            by: 100,
        },
    );
    assert_eq!(
        outcome_of(&mut client, &payment).await,
        Outcome::Applied(Reply::Incr { value: 100 })
    );
    // A flood of one-shot reads under fresh keys fills the table.
    let mut refused = 0;
    for i in 0..400 {
        match outcome_of(&mut client, &keyed(&format!("flood-{i}"), get(b"x"))).await {
            Outcome::Applied(_) => {}
            Outcome::Overloaded(Overload::IdempotencyKeys { max: 300 }) => refused += 1,
            other => panic!("flood request {i}: {other:?}"),
        }
    }
    assert_eq!(
        refused, 101,
        "the table holds 300 keys, the payment's among them"
    );
    // The honest retry is answered from its record, not applied again.
    assert!(matches!(
        outcome_of(&mut client, &payment).await,
        Outcome::Replayed {
            reply: Reply::Incr { value: 100 },
            ..
        }
    ));
    assert_eq!(
        without_meta(
            cluster.nodes[0]
                .read(
                    &Query::Get {
                        key: b"paid".to_vec()
                    },
                    false
                )
                .await
        ),
        Ok(Reply::Get {
            value: Some(b"100".to_vec()),
            meta: None,
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_flood_cannot_evict_a_live_session() {
    let _one = exclusive().await;
    let (cluster, mut client) = one_node(&["--sessions-max", "40"]).await;
    let honest = TestSession::open(&cluster, 60_000, 4).await;
    let incr = Command::Incr {
        key: b"n".to_vec(),
        by: 1,
    };
    assert_eq!(
        outcome_of(&mut client, &honest.request(1, 1, incr.clone())).await,
        Outcome::Applied(Reply::Incr { value: 1 })
    );
    let mut refused = 0;
    for _ in 0..60 {
        let open = Request::plain(Command::OpenSession {
            ttl_ms: 60_000,
            window: 4,
            secret: Secret(0),
        });
        match outcome_of(&mut client, &open).await {
            Outcome::Applied(Reply::SessionOpened { .. }) => {}
            Outcome::Overloaded(Overload::Sessions { max: 40 }) => refused += 1,
            other => panic!("flood open: {other:?}"),
        }
    }
    assert_eq!(refused, 21, "40 sessions fit, the honest one among them");
    // The honest session is still live: its retry replays, its next runs.
    assert!(matches!(
        outcome_of(&mut client, &honest.request(1, 2, incr.clone())).await,
        Outcome::Replayed {
            reply: Reply::Incr { value: 1 },
            ..
        }
    ));
    assert_eq!(
        outcome_of(&mut client, &honest.request(2, 1, incr)).await,
        Outcome::Applied(Reply::Incr { value: 2 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_the_log_under_keys_do_not_grow_memory_past_the_budget() {
    let _one = exclusive().await;
    let (cluster, mut client) = one_node(&[]).await;
    let node = &cluster.nodes[0];
    let big = Request::plain(Command::Put {
        key: b"big".to_vec(),
        value: (vec![7; 1 << 20]).into(),
        lease: None,
    });
    assert!(matches!(
        outcome_of(&mut client, &big).await,
        Outcome::Applied(_)
    ));
    let before = rss_bytes(node);
    for i in 0..1000 {
        let read = keyed(&format!("read-{i}"), get(b"big"));
        match outcome_of(&mut client, &read).await {
            Outcome::Applied(Reply::Get {
                value: Some(value), ..
            }) => {
                assert_eq!(value.len(), 1 << 20)
            }
            other => panic!("read {i}: {other:?}"),
        }
    }
    let status = client
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.idempotency_keys, 1000);
    // A read keeps no value in its record: about 200 bytes a key, where
    // each used to keep the whole 1 MiB reply.
    assert!(
        status.idempotency_bytes < 1000 * 512,
        "idempotency records hold {} bytes",
        status.idempotency_bytes
    );
    let grown = rss_bytes(node).saturating_sub(before);
    assert!(
        grown < 200 << 20,
        "1000 reads of a 1 MiB value through the log grew the node by {} MiB",
        grown >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_status_calls_do_not_stall_writes() {
    let _one = exclusive().await;
    let (_cluster, mut client) = one_node(&[]).await;
    // 64 MiB of state: encoding it (what status used to do for its digest,
    // under the state lock) takes long enough to stall every write.
    for i in 0..64 {
        let put = Request::plain(Command::Put {
            key: format!("fill-{i}").into_bytes(),
            value: (vec![i as u8; 1 << 20]).into(),
            lease: None,
        });
        assert!(matches!(
            outcome_of(&mut client, &put).await,
            Outcome::Applied(_)
        ));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pollers = Vec::new();
    for _ in 0..4 {
        let mut client = client.clone();
        let stop = stop.clone();
        pollers.push(tokio::spawn(async move {
            let mut calls = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && calls < 100_000 {
                client.status(StatusRequest {}).await.expect("status");
                calls += 1;
            }
            calls
        }));
    }
    for i in 0..20 {
        let incr = keyed(
            &format!("w-{i}"),
            Command::Incr {
                key: b"w".to_vec(),
                by: 1,
            },
        );
        assert!(matches!(
            outcome_of(&mut client, &incr).await,
            Outcome::Applied(_)
        ));
    }
    // Every write applied while the status calls still ran (none of them
    // had reached its bound); how fast is the benchmarks' question.
    assert!(
        pollers.iter().all(|poller| !poller.is_finished()),
        "a status poller stopped before the writes were done"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut calls = 0;
    for poller in pollers {
        calls += poller.await.expect("poller");
    }
    assert!(calls > 20, "the status calls ran: {calls}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_callers_never_receive_another_sessions_reply() {
    let _one = exclusive().await;
    // Three nodes, so that a request stays in flight for a replication
    // round while the others arrive.
    let cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(ELECTION).await;
    let client = cluster.nodes[(leader - 1) as usize]
        .connect()
        .await
        .expect("connect");
    let honest = TestSession::open(&cluster, 60_000, 8).await;
    let thief = TestSession {
        id: honest.id,
        secret: Secret(honest.secret.0 ^ 1),
    };
    let mut honest_answers = std::collections::BTreeMap::new();
    for seq in 1..=30u64 {
        let append = Command::Append {
            key: b"log".to_vec(),
            value: format!("<{seq}>").into_bytes(),
        };
        // One burst on one connection: the honest request, its forged
        // copies and the honest retry, all in flight together.
        let mut burst = vec![(true, honest.request(seq, 1, append.clone()))];
        burst.extend((0..6).map(|_| (false, thief.request(seq, 1, append.clone()))));
        burst.push((true, honest.request(seq, 2, append.clone())));
        let answers =
            futures_util::future::join_all(burst.into_iter().map(|(is_honest, request)| {
                let (cluster, client) = (&cluster, &client);
                async move { (is_honest, settled_outcome(cluster, client, &request).await) }
            }))
            .await;
        for (is_honest, outcome) in answers {
            if is_honest {
                assert!(
                    matches!(outcome, Outcome::Applied(_) | Outcome::Replayed { .. }),
                    "seq {seq}: the honest caller got {outcome:?}"
                );
                *honest_answers.entry(outcome.name()).or_insert(0) += 1;
            } else {
                assert_eq!(
                    outcome,
                    Outcome::Unauthorized,
                    "seq {seq}: a forger got a reply"
                );
            }
        }
    }
    let leader = cluster.leader(ELECTION).await;
    let Ok(Reply::Get {
        value: Some(log), ..
    }) = cluster.nodes[(leader - 1) as usize]
        .read(
            &Query::Get {
                key: b"log".to_vec(),
            },
            false,
        )
        .await
    else {
        panic!("no log");
    };
    let expected: String = (1..=30).map(|seq| format!("<{seq}>")).collect();
    assert_eq!(
        String::from_utf8(log).expect("utf8"),
        expected,
        "honest answers: {honest_answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_open_session_under_one_key_returns_the_first_session() {
    let _one = exclusive().await;
    let (_cluster, mut client) = one_node(&[]).await;
    let open = keyed(
        "open-once",
        Command::OpenSession {
            ttl_ms: 60_000,
            window: 4,
            secret: Secret(0),
        },
    );
    let Outcome::Applied(Reply::SessionOpened {
        session, secret, ..
    }) = outcome_of(&mut client, &open).await
    else {
        panic!("not opened");
    };
    // The leader draws a new secret for each attempt; the retry is still
    // the same request and gets the session (and secret) of the first.
    match outcome_of(&mut client, &open).await {
        Outcome::Replayed {
            reply:
                Reply::SessionOpened {
                    session: again,
                    secret: same,
                    ..
                },
            ..
        } => {
            assert_eq!(again, session);
            assert_eq!(same, secret);
        }
        other => panic!("a retried open was not replayed: {other:?}"),
    }
    let status = client
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.sessions, 1, "no session leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_large_values_is_snapshotted_by_bytes() {
    let _one = exclusive().await;
    let (cluster, mut client) = one_node(&[
        "--snapshot-after-entries",
        "100000",
        "--snapshot-after-bytes",
        "2000000",
    ])
    .await;
    for i in 0..5u8 {
        let put = Request::plain(Command::Put {
            key: vec![b'v', i],
            value: (vec![i; 512 * 1024]).into(),
            lease: None,
        });
        assert!(matches!(
            outcome_of(&mut client, &put).await,
            Outcome::Applied(_)
        ));
    }
    // Five entries are far below the entry count, but 2.5 MB passed the
    // byte threshold: a snapshot follows within a few ticks.
    support::eventually(Duration::from_secs(20), "a snapshot by bytes", || {
        let node = &cluster.nodes[0];
        async move {
            let status = node.status().await.ok()?;
            status.snapshot_index.filter(|&index| index >= 5)
        }
    })
    .await;
}
