//! The client library against real clusters: pipelined exactly-once
//! appends, batched, across a leader kill and restart, and an expired session that
//! is reported, never silently re-executed.

mod support;

use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Query, Reply, SessionOptions, WatchOptions,
};
use std::collections::BTreeSet;
use std::time::Duration;
use support::{Cluster, FAST, exclusive};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_appends_apply_exactly_once_across_a_leader_kill() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    // Batches behind any call in flight: the kill finds batches in flight.
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        batch_after_calls: 1,
        ..ClientOptions::default()
    };
    let client = Client::connect(endpoints, options).expect("client");
    let session = client
        .open_session(SessionOptions {
            window: 16,
            ..SessionOptions::default()
        })
        .await
        .expect("session");
    let mut tasks = Vec::new();
    for task in 0..8 {
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..25 {
                let token = format!("<{task}.{i}>");
                let append = Command::Append {
                    key: b"log".to_vec(),
                    value: token.clone().into_bytes(),
                };
                match session.execute(append).await {
                    Ok(_) => acknowledged.push(token),
                    Err(error) => panic!("append {token}: {error}"),
                }
            }
            acknowledged
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.node(leader).kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.node(leader).spawn();
    let mut acknowledged = BTreeSet::new();
    for task in tasks {
        acknowledged.extend(task.await.expect("task"));
    }
    assert_eq!(acknowledged.len(), 200);
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
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|t| log.matches(t.as_str()).count() != 1)
        .collect();
    if !missing.is_empty() {
        let mut statuses = Vec::new();
        for node in &cluster.nodes {
            statuses.push(
                node.status()
                    .await
                    .map(|s| (s.id, s.is_leader, s.term, s.applied_index)),
            );
        }
        panic!(
            "acknowledged tokens not exactly once: {missing:?}\ntokens in log: {}\nstatuses: {statuses:?}\nlog: {log}\n{}",
            log.matches('<').count(),
            cluster.logs()
        );
    }
    assert_eq!(
        log.matches('<').count(),
        200,
        "no token twice, none unknown"
    );
}

/// Waits until the one node of `cluster` holds no session (`what` names
/// what that means, for the failure).
async fn no_sessions_left(cluster: &Cluster, what: &str) {
    support::eventually(Duration::from_secs(15), what, || {
        let node = &cluster.nodes[0];
        async move {
            node.status()
                .await
                .ok()
                .filter(|s| s.sessions == 0)
                .map(|_| ())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_reported_not_reexecuted() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let client = Client::connect([cluster.node(1).client.clone()], ClientOptions::default())
        .expect("client");
    let options = SessionOptions {
        ttl: Duration::from_millis(500),
        window: 4,
        keep_alive: false,
    };
    let session = client.open_session(options).await.expect("session");
    let incr = || Command::Incr {
        key: b"n".to_vec(),
        by: 1,
    };
    assert_eq!(session.execute(incr()).await, Ok(Reply::Incr { value: 1 }));
    // The idle leader's ticks carry cluster time past the ttl: the session
    // expires in the replicated state, with no request sent meanwhile.
    no_sessions_left(&cluster, "the unkept session to expire").await;
    assert_eq!(
        session.execute(incr()).await,
        Err(ClientError::SessionExpired)
    );
    assert!(session.is_expired());
    let value = client
        .read(Query::Get { key: b"n".to_vec() }, false)
        .await
        .map(value_of);
    assert_eq!(value, Ok(Some(b"1".to_vec())));
    // Kept alive (every ttl/4: a margin of 4x), a session outlives its
    // ttl.
    let kept = client
        .open_session(SessionOptions {
            ttl: Duration::from_millis(1_500),
            window: 4,
            keep_alive: true,
        })
        .await
        .expect("session");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(kept.execute(incr()).await, Ok(Reply::Incr { value: 2 }));
    // Dropping the last handle closes the session.
    drop(kept);
    no_sessions_left(&cluster, "the dropped session to close").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_holds_its_keys_and_a_dropped_one_deletes_them() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let client = Client::connect([cluster.node(1).client.clone()], ClientOptions::default())
        .expect("client");
    let ttl = Duration::from_millis(1_500);
    assert!(matches!(
        client.lease_grant("web", ttl).await,
        Ok(Reply::LeaseGranted { .. })
    ));
    assert!(matches!(
        client.lease_grant("web", ttl).await,
        Err(ClientError::Rejected(
            oncekv_client::Rejection::LeaseExists { .. }
        ))
    ));
    let put = Command::Put {
        key: b"svc/web".to_vec(),
        value: b"up".to_vec().into(),
        lease: Some("web".into()),
    };
    client.execute_once(put, None).await.expect("put");
    let keeper = client.keep_lease_alive("web", ttl);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let get = || async {
        client
            .read(
                Query::Get {
                    key: b"svc/web".to_vec(),
                },
                false,
            )
            .await
            .map(value_of)
    };
    assert_eq!(get().await, Ok(Some(b"up".to_vec())));
    drop(keeper);
    support::eventually(
        Duration::from_secs(15),
        "the dropped lease to expire with its key",
        || async { (get().await == Ok(None)).then_some(()) },
    )
    .await;
}

/// The leader asked to remove itself hands leadership to another voter
/// and answers "not leader" naming it; the client asks the new leader,
/// which removes the old one: one call, and the old leader never leads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_hands_leadership_over_then_removes_it() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let client = Client::connect(endpoints, ClientOptions::default()).expect("client");
    let members = client
        .remove_member(leader)
        .await
        .expect("the leader removed");
    let ids: Vec<u64> = members.iter().map(|member| member.id).collect();
    assert_eq!(ids.len(), 2, "{members:?}");
    assert!(!ids.contains(&leader), "{members:?}");
    let put = Command::Put {
        key: b"after".to_vec(),
        value: b"removal".to_vec().into(),
        lease: None,
    };
    client.execute_once(put, None).await.expect("a write after");
    // The removed node, still running, does not lead.
    let status = support::connect(&cluster.node(leader).client)
        .await
        .expect("a connection to the removed node")
        .status(oncekv_proto::v1::StatusRequest::default())
        .await
        .expect("its status")
        .into_inner();
    assert!(!status.is_leader, "{status:?}");
}

/// A leader stopped by SIGTERM while a watch is open on it (and its
/// append streams to the followers run): it hands leadership over, gives
/// the calls that never end a grace period, and exits 0; the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_asked_to_stop_exits_though_streams_are_open_and_the_rest_go_on() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(3, FAST);
    let leader = cluster.leader(Duration::from_secs(15)).await;
    let on_leader = Client::connect(
        [cluster.node(leader).client.clone()],
        ClientOptions::default(),
    )
    .expect("client");
    let mut watcher = on_leader.watch("w/", WatchOptions::default().with_prefix());
    on_leader.put("w/first", "1").await.expect("put");
    watcher.next().await.expect("the watch is open");
    assert!(cluster.node_mut(leader).expect("the leader").terminate());
    let asked = std::time::Instant::now();
    let status = loop {
        if let Some(status) = cluster.node_mut(leader).expect("the leader").collect() {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the leader still runs 30 s after SIGTERM\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}\n{}", cluster.logs());
    drop(watcher);
    let others: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != leader)
        .map(|node| node.client.clone())
        .collect();
    let rest = Client::connect(others, ClientOptions::default()).expect("client");
    rest.put("w/after", "2").await.expect("the others go on");
}

/// A lease expires at its deadline on an idle cluster: the leader proposes
/// a tick once its clock passes the earliest deadline, not only at its
/// (here half-minute) tick interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leader_expires_a_lease_at_its_deadline_not_its_tick_interval() {
    let _one = exclusive().await;
    let flags = [
        "--heartbeat",
        "50ms",
        "--election-timeout",
        "800ms",
        "--tick-interval",
        "30s",
    ];
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    let client = Client::connect([cluster.node(1).client.clone()], ClientOptions::default())
        .expect("client");
    assert!(matches!(
        client.lease_grant("job", Duration::from_secs(1)).await,
        Ok(Reply::LeaseGranted { .. })
    ));
    let put = Command::Put {
        key: b"job/owner".to_vec(),
        value: b"me".to_vec().into(),
        lease: Some("job".into()),
    };
    client.execute_once(put, None).await.expect("put");
    let get = || async {
        client
            .read(
                Query::Get {
                    key: b"job/owner".to_vec(),
                },
                false,
            )
            .await
            .map(value_of)
    };
    // Well inside the tick interval, however loaded the machine.
    support::eventually(
        Duration::from_secs(15),
        "the 1 s lease to expire with its key",
        || async { (get().await == Ok(None)).then_some(()) },
    )
    .await;
}

/// The bug `oncekv verify` found: a request applied, its reply dropped, and
/// its session expired before the retry. The retry is refused as expired,
/// but that refusal cannot speak for the first send: the outcome must be
/// unknown, never "not applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_refused_as_expired_after_a_lost_reply_is_unknown_not_failed() {
    use oncekv_harness::client_proxy::{ClientProxy, ProxyListener, ReplyFault};
    use oncekv_harness::recorder::Recorder;
    use std::sync::Arc;

    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let node = cluster.node(1).client.clone();
    let listener = ProxyListener::bind().await.expect("a proxy port");
    let proxy = ClientProxy::start(
        listener,
        Some(1),
        &node,
        Arc::new(Default::default()),
        Arc::new(Recorder::new()),
        7,
    )
    .expect("proxy");
    let options = ClientOptions {
        attempt_timeout: Duration::from_millis(1_500),
        deadline: Duration::from_secs(6),
        ..ClientOptions::default()
    };
    let client = Client::connect([proxy.address().to_string()], options).expect("client");
    let session = client
        .open_session(SessionOptions {
            ttl: Duration::from_millis(500),
            window: 4,
            keep_alive: false,
        })
        .await
        .expect("session");
    // Only the first reply is lost: the retry, 1.5 s later and past the
    // session's ttl, hears the refusal.
    proxy.set_fault(ReplyFault::Drop { probability: 1.0 });
    let healer = proxy.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        healer.set_fault(ReplyFault::None);
    });
    let append = Command::Append {
        key: b"log".to_vec(),
        value: b"once;".to_vec(),
    };
    let result = session.execute(append).await;
    assert!(
        matches!(result, Err(ClientError::OutcomeUnknown { .. })),
        "expected an unknown outcome, got {result:?}"
    );
    let direct = Client::connect([node], ClientOptions::default()).expect("client");
    let value = direct
        .read(
            Query::Get {
                key: b"log".to_vec(),
            },
            false,
        )
        .await
        .map(value_of);
    assert_eq!(value, Ok(Some(b"once;".to_vec())), "the first send applied");
}

/// The value a GET reply carries.
fn value_of(reply: Reply) -> Option<Vec<u8>> {
    match reply {
        Reply::Get { value, .. } => value,
        other => panic!("not a get reply: {other:?}"),
    }
}

/// A write refused for want of space (the store's quota, or an alarm
/// raised by hand) is reported at once, not retried to the deadline: only
/// an operator lifts the alarm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_for_space_is_reported_at_once() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let deadline = Duration::from_secs(120);
    let client = Client::connect(
        [cluster.node(1).client.clone()],
        ClientOptions::default().with_deadline(deadline),
    )
    .expect("client");
    let raise = Command::AlarmSet {
        member: 7,
        raise: true,
    };
    client
        .execute_once(raise, None)
        .await
        .expect("alarm raised");
    let started = std::time::Instant::now();
    let refused = client.put("k", "v").await;
    assert!(
        matches!(
            refused,
            Err(ClientError::Overloaded(
                oncekv_client::Overload::NoSpace { .. }
            ))
        ),
        "{refused:?}"
    );
    // Retried, it would have taken the whole deadline.
    assert!(
        started.elapsed() < deadline / 2,
        "answered after {:?}",
        started.elapsed()
    );
}
