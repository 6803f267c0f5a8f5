//! Batches of requests (`ExecuteBatch`) against a real node: each request
//! of a batch is checked, deduplicated and cached on its own (a retry in
//! the same or a later batch is answered from its record, a refusal is
//! that request's alone), answers come in order, an oversized batch is
//! refused whole; and the client library's batching applies a flood of
//! pipelined appends exactly once.

mod support;

use oncekv_client::{Client, ClientOptions, Command, Query, Reply, SessionOptions};
use oncekv_proto::convert;
use oncekv_proto::v1::{self, ExecuteBatchRequest, ExecuteResponse};
use oncekv_state::{IdempotencyKey, Origin, Outcome, Request, RequestHeader, RequestId, Seq};
use std::time::Duration;
use support::{CallFailure, Cluster, FAST, TestSession, connect, eventually, exclusive, free_port};

fn append(token: &str) -> Command {
    Command::Append {
        key: b"log".to_vec(),
        value: token.as_bytes().to_vec(),
    }
}

fn outcome(response: &ExecuteResponse) -> Outcome {
    match &response.result {
        Some(v1::execute_response::Result::Outcome(outcome)) => {
            convert::outcome_from_wire(outcome.clone()).expect("outcome decodes")
        }
        other => panic!("not an outcome: {other:?}"),
    }
}

/// Request `seq` of `session`, acknowledging nothing (so the requests of
/// a batch may apply in any order).
fn on_session(session: &TestSession, seq: u64, attempt: u32, command: Command) -> Request {
    Request {
        origin: Origin::Session(RequestHeader {
            id: RequestId {
                session: session.id,
                seq: Seq(seq),
            },
            secret: session.secret,
            first_incomplete: Seq(1),
            attempt,
        }),
        command,
    }
}

async fn send_batch(address: &str, requests: &[Request]) -> Vec<ExecuteResponse> {
    let mut client = connect(address).await.expect("connect");
    let requests = requests
        .iter()
        .map(|r| convert::request_to_wire(r).expect("to wire"))
        .collect();
    client
        .execute_batch(ExecuteBatchRequest { requests })
        .await
        .expect("batch call")
        .into_inner()
        .responses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_of_a_batch_is_deduplicated_and_answered_on_its_own() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = cluster.node(1).client.clone();
    let session = TestSession::open(&cluster, 60_000, 64).await;

    // Ten appends in one batch: each applied at its own index, in order.
    let first: Vec<Request> = (1..=10)
        .map(|seq| on_session(&session, seq, 1, append(&format!("<{seq}>"))))
        .collect();
    let answers = send_batch(&address, &first).await;
    assert_eq!(answers.len(), 10);
    let mut indexes = Vec::new();
    for answer in &answers {
        assert!(matches!(
            outcome(answer),
            Outcome::Applied(Reply::Append { .. })
        ));
        indexes.push(answer.log_index);
    }
    // The batch is proposed as one write: consecutive entries, in its
    // order.
    assert!(
        indexes.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "one entry per request, consecutive and in order: {indexes:?}"
    );

    // A later batch: a retry of seq 5 (twice), a new seq 11, a gap, an
    // INCR under one idempotency key twice, and a request refused before
    // proposing. Each answer is that request's own.
    let once = || Request {
        origin: Origin::Key(IdempotencyKey(b"incr-once".to_vec())),
        command: Command::Incr {
            key: b"counter".to_vec(),
            by: 1,
        },
    };
    let second = vec![
        on_session(&session, 5, 2, append("<5>")),
        on_session(&session, 11, 1, append("<11>")),
        on_session(&session, 5, 3, append("<5>")),
        on_session(&session, 500, 1, append("<gap>")),
        once(),
        once(),
        Request::plain(Command::Put {
            key: Vec::new(),
            value: b"no key".to_vec().into(),
            lease: None,
        }),
    ];
    let answers = send_batch(&address, &second).await;
    assert_eq!(answers.len(), second.len());
    for retry in [0, 2] {
        match outcome(&answers[retry]) {
            Outcome::Replayed { applied_index, .. } => {
                assert_eq!(applied_index.0, indexes[4], "seq 5's original entry");
            }
            other => panic!("retry of seq 5: {other:?}"),
        }
    }
    assert!(matches!(outcome(&answers[1]), Outcome::Applied(_)));
    assert!(matches!(outcome(&answers[3]), Outcome::SequenceGap { .. }));
    let incr_indexes: Vec<u64> = [4, 5]
        .iter()
        .map(|i| match outcome(&answers[*i]) {
            Outcome::Applied(Reply::Incr { value: 1 }) => answers[*i].log_index,
            Outcome::Replayed {
                reply: Reply::Incr { value: 1 },
                applied_index,
            } => applied_index.0,
            other => panic!("incr under one key: {other:?}"),
        })
        .collect();
    assert_eq!(
        incr_indexes[0], incr_indexes[1],
        "one execution of the INCR"
    );
    assert!(matches!(
        support::failure(&answers[6]),
        Some(CallFailure::Invalid(_))
    ));

    // What the log holds: every token once, the gap never.
    let mut node = connect(&address).await.expect("connect");
    let log = read_value(&mut node, b"log").await;
    let in_order: String = (1..=11).map(|seq| format!("<{seq}>")).collect();
    assert_eq!(log, in_order, "every token once, in order, the gap never");
    assert_eq!(read_value(&mut node, b"counter").await, "1");

    // A batch over the limit is refused whole, nothing applied.
    let too_many: Vec<Request> = (0..257)
        .map(|i| Request::plain(append(&format!("[{i}]"))))
        .collect();
    let requests = too_many
        .iter()
        .map(|r| convert::request_to_wire(r).expect("to wire"))
        .collect();
    let refused = node
        .execute_batch(ExecuteBatchRequest { requests })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    assert!(!read_value(&mut node, b"log").await.contains('['));
}

async fn read_value(
    node: &mut oncekv_proto::v1::kv_client::KvClient<tonic::transport::Channel>,
    key: &[u8],
) -> String {
    let response = node
        .read(v1::ReadRequest {
            query: Some(convert::query_to_wire(&Query::Get { key: key.to_vec() })),
            serializable: false,
        })
        .await
        .expect("read")
        .into_inner();
    match response.result {
        Some(v1::read_response::Result::Reply(reply)) => match convert::reply_from_wire(reply) {
            Ok(Reply::Get { value, .. }) => {
                String::from_utf8(value.unwrap_or_default()).expect("utf8")
            }
            other => panic!("not a get reply: {other:?}"),
        },
        other => panic!("read failed: {other:?}"),
    }
}

/// The client batches what queues behind its calls in flight: 64 tasks
/// appending on one pipelined session, batches used (the node counts
/// them), and every acknowledged token in the log exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_batches_pipelined_requests_and_each_applies_once() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let flags: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--listen-metrics", metrics.as_str()])
        .collect();
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    let options = ClientOptions {
        batch_after_calls: 1,
        ..ClientOptions::default()
    };
    let client = Client::connect([cluster.node(1).client.clone()], options).expect("client");
    let session = client
        .open_session(SessionOptions {
            window: 64,
            ..SessionOptions::default()
        })
        .await
        .expect("session");
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let session = session.clone();
            tokio::spawn(async move {
                for i in 0..5 {
                    let token = format!("<{task}.{i}>");
                    session
                        .execute(append(&token))
                        .await
                        .unwrap_or_else(|e| panic!("append {token}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let Ok(Reply::Get {
        value: Some(log), ..
    }) = client
        .read(
            Query::Get {
                key: b"log".to_vec(),
            },
            false,
        )
        .await
    else {
        panic!("no log");
    };
    let log = String::from_utf8(log).expect("utf8");
    for task in 0..64 {
        for i in 0..5 {
            assert_eq!(log.matches(&format!("<{task}.{i}>")).count(), 1, "{log}");
        }
    }
    assert_eq!(log.matches('<').count(), 320);
    let batched = eventually(Duration::from_secs(10), "the batch counter", || {
        let metrics = metrics.clone();
        async move { batched_requests(&metrics) }
    })
    .await;
    assert!(batched > 0, "no request came in a batch");
}

/// `oncekv_batched_requests_total` from a node's metrics.
fn batched_requests(metrics: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metrics).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|line| line.strip_prefix("oncekv_batched_requests_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
}

/// A batch whose reply is lost after the node committed it (a fault proxy
/// drops it): sent again, each request of it is answered from its own
/// record, with the original index, and nothing applies twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_reply_was_lost_is_answered_from_each_record() {
    use oncekv_harness::client_proxy::{ClientProxy, ProxyListener, ReplyFault};
    use oncekv_harness::recorder::Recorder;
    use std::sync::Arc;

    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let address = cluster.node(1).client.clone();
    let listener = ProxyListener::bind().await.expect("a proxy port");
    let proxy = ClientProxy::start(
        listener,
        Some(1),
        &address,
        Arc::new(Default::default()),
        Arc::new(Recorder::new()),
        3,
    )
    .expect("proxy");
    let session = TestSession::open(&cluster, 60_000, 64).await;
    let batch = |attempt: u32| -> Vec<Request> {
        (1..=8)
            .map(|seq| on_session(&session, seq, attempt, append(&format!("<{seq}>"))))
            .chain([Request {
                origin: Origin::Key(IdempotencyKey(b"lost-incr".to_vec())),
                command: Command::Incr {
                    key: b"counter".to_vec(),
                    by: 1,
                },
            }])
            .collect()
    };
    let wire = |requests: Vec<Request>| ExecuteBatchRequest {
        requests: requests
            .iter()
            .map(|r| convert::request_to_wire(r).expect("to wire"))
            .collect(),
    };
    let mut via_proxy = connect(&proxy.address().to_string())
        .await
        .expect("connect");
    proxy.set_fault(ReplyFault::Drop { probability: 1.0 });
    let mut lost = tonic::Request::new(wire(batch(1)));
    lost.set_timeout(Duration::from_secs(1));
    let status = via_proxy
        .execute_batch(lost)
        .await
        .expect_err("the reply is dropped");
    assert!(
        matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{status}"
    );
    proxy.set_fault(ReplyFault::None);
    // The node committed the batch: wait until the counter shows it.
    let mut node = connect(&address).await.expect("connect");
    eventually(Duration::from_secs(10), "the lost batch applied", || {
        let address = address.clone();
        async move {
            let mut node = connect(&address).await.ok()?;
            (read_value(&mut node, b"counter").await == "1").then_some(())
        }
    })
    .await;
    let answers = via_proxy
        .execute_batch(wire(batch(2)))
        .await
        .expect("retry")
        .into_inner()
        .responses;
    assert_eq!(answers.len(), 9);
    let mut indexes = Vec::new();
    for answer in &answers {
        match outcome(answer) {
            Outcome::Replayed { applied_index, .. } => indexes.push(applied_index.0),
            other => panic!("a retry of a committed request: {other:?}"),
        }
    }
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), 9, "each answered from its own record");
    let log = read_value(&mut node, b"log").await;
    for seq in 1..=8 {
        assert_eq!(log.matches(&format!("<{seq}>")).count(), 1, "{log}");
    }
    assert_eq!(read_value(&mut node, b"counter").await, "1");
}
