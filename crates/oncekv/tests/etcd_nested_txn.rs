//! Nested transactions and empty keys through etcd's API, compared with
//! etcd itself over gRPC (`etcdctl` sends neither: its `txn` has no nested
//! form, and it sends `\0` for an empty key with `--prefix` or
//! `--from-key`). The same requests go to a real one-member etcd and to an
//! oncekv node, and what they answer must be equal once revisions are
//! left out:
//!
//! - a transaction nested in a branch, whose compares see the state before
//!   the enclosing transaction's operations ran, three levels deep, with
//!   reads and `prev_kv` inside; a key written by a nested branch and by
//!   its enclosing branch refused as a duplicate, but not by the two
//!   branches of one nested transaction; etcd's operation budget, which a
//!   nested transaction gets what its enclosing one leaves of;
//! - an empty key refused in a Range, a DeleteRange, a compare and a
//!   transaction's Range whatever its end, and `\0` read as the first key;
//!   a watch of an empty key watching `\0` (and with the end `\0`, every
//!   key).
//!
//! Needs `etcd` and `etcdctl` on PATH (scripts/setup.sh installs Debian's
//! etcd-server and etcd-client); without them the test says so (and fails
//! in CI).

mod support;

use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseOp, TxnRequest,
    TxnResponse, WatchCreateRequest, WatchRequest, request_op, response_op,
};
use std::time::{Duration, Instant};
use support::etcdctl::{answering, reference};
use support::{Cluster, FAST, exclusive};
use tonic::transport::Channel;

fn put_op(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            prev_kv: true,
            ..PutRequest::default()
        })),
    }
}

fn get_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        })),
    }
}

fn delete_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..DeleteRangeRequest::default()
            },
        )),
    }
}

fn txn_op(txn: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestTxn(txn)),
    }
}

/// `key`'s version compared with `version`.
fn version_is(key: &str, version: i64) -> Compare {
    Compare {
        key: key.as_bytes().to_vec(),
        result: CompareResult::Equal as i32,
        target: CompareTarget::Version as i32,
        target_union: Some(TargetUnion::Version(version)),
        ..Compare::default()
    }
}

fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

/// A transaction's response without what differs between two servers
/// (headers, revisions): whether each level succeeded, and each
/// operation's keys, values, versions, counts and previous values.
fn shape(response: &TxnResponse) -> String {
    fn op(response: &ResponseOp) -> String {
        match &response.response {
            Some(response_op::Response::ResponseRange(range)) => {
                let kvs: Vec<String> = range
                    .kvs
                    .iter()
                    .map(|kv| {
                        format!(
                            "{}={}@v{}",
                            String::from_utf8_lossy(&kv.key),
                            String::from_utf8_lossy(&kv.value),
                            kv.version
                        )
                    })
                    .collect();
                format!("range[{}] count={}", kvs.join(" "), range.count)
            }
            Some(response_op::Response::ResponsePut(put)) => format!(
                "put prev={:?}",
                put.prev_kv
                    .as_ref()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            ),
            Some(response_op::Response::ResponseDeleteRange(delete)) => {
                format!("delete {}", delete.deleted)
            }
            Some(response_op::Response::ResponseTxn(txn)) => format!("({})", shape(txn)),
            None => "none".to_string(),
        }
    }
    let ops: Vec<String> = response.responses.iter().map(op).collect();
    format!("succeeded={} [{}]", response.succeeded, ops.join("; "))
}

/// A refusal as a comparable pair.
fn refusal(status: &tonic::Status) -> (tonic::Code, String) {
    (status.code(), status.message().to_string())
}

async fn channel(endpoint: &str) -> Channel {
    Channel::from_shared(format!("http://{endpoint}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect")
}

/// Everything the test asks of one server, in order, as text.
async fn nested_transactions(endpoint: &str) -> Vec<String> {
    let mut kv = KvClient::new(channel(endpoint).await);
    let mut answers = Vec::new();
    let mut run = async |request: TxnRequest| match kv.txn(request).await {
        Ok(response) => shape(response.get_ref()),
        Err(status) => format!("refused {:?}", refusal(&status)),
    };
    answers.push(run(txn(vec![], vec![put_op("n/a", "1")], vec![])).await);
    // The nested compare sees "n/b" absent: the enclosing put runs first
    // but the compares were all decided before it.
    let nested = txn(
        vec![version_is("n/b", 0)],
        vec![put_op("n/seen-absent", "1"), get_op("n/b")],
        vec![put_op("n/seen-present", "1")],
    );
    answers.push(
        run(txn(
            vec![version_is("n/a", 1)],
            vec![put_op("n/b", "2"), txn_op(nested), get_op("n/b")],
            vec![],
        ))
        .await,
    );
    // Three levels, on the failure paths, with a delete and a read.
    let innermost = txn(
        vec![version_is("n/a", 7)],
        vec![put_op("n/deep-yes", "1")],
        vec![delete_op("n/seen-absent"), put_op("n/deep-no", "1")],
    );
    let middle = txn(
        vec![version_is("n/b", 9)],
        vec![get_op("n/a")],
        vec![txn_op(innermost), get_op("n/a")],
    );
    answers.push(
        run(txn(
            vec![version_is("n/a", 5)],
            vec![],
            vec![txn_op(middle)],
        ))
        .await,
    );
    // A key written by a nested branch and by its enclosing branch is a
    // duplicate, even on a branch that does not run.
    let writes_c = txn(
        vec![version_is("n/zz", 1)],
        vec![put_op("n/c", "2")],
        vec![],
    );
    answers.push(
        run(txn(
            vec![],
            vec![put_op("n/c", "1"), txn_op(writes_c)],
            vec![],
        ))
        .await,
    );
    // The two branches of one nested transaction never both run.
    let either = txn(
        vec![version_is("n/zz", 1)],
        vec![put_op("n/c", "2")],
        vec![delete_op("n/c"), put_op("n/d", "1")],
    );
    answers.push(run(txn(vec![], vec![txn_op(either.clone())], vec![])).await);
    // Nor do two nested transactions' writes of one key.
    answers.push(
        run(txn(
            vec![],
            vec![txn_op(either.clone()), txn_op(either)],
            vec![],
        ))
        .await,
    );
    // etcd's budget (128 by default on both): 100 operations and the
    // nested transaction leave 27 for it.
    let gets = |count: usize| (0..count).map(|i| get_op(&format!("g{i}"))).collect();
    let within = txn(vec![], gets(27), vec![]);
    let mut ops: Vec<RequestOp> = gets(100);
    ops.push(txn_op(within));
    answers.push(run(txn(vec![], ops, vec![])).await);
    let beyond = txn(vec![], gets(28), vec![]);
    let mut ops: Vec<RequestOp> = gets(100);
    ops.push(txn_op(beyond));
    answers.push(run(txn(vec![], ops, vec![])).await);
    // What is there now.
    let everything = kv
        .range(RangeRequest {
            key: b"n/".to_vec(),
            range_end: b"n0".to_vec(),
            ..RangeRequest::default()
        })
        .await
        .expect("a range")
        .into_inner();
    answers.push(
        everything
            .kvs
            .iter()
            .map(|kv| {
                format!(
                    "{}={}@v{}",
                    String::from_utf8_lossy(&kv.key),
                    String::from_utf8_lossy(&kv.value),
                    kv.version
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
    );
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_transactions_answer_as_on_etcd() {
    let _one = exclusive().await;
    let Some(etcd) = reference("etcd_nested_txn::nested_transactions_answer_as_on_etcd") else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;

    let want = nested_transactions(&etcd.endpoint).await;
    let got = nested_transactions(&oncekv).await;
    assert_eq!(got, want, "oncekv (left), etcd (right)");
    // What etcd answered is what was meant.
    assert!(
        want[1].starts_with("succeeded=true [put prev=None; (succeeded=true [put prev=None; "),
        "{want:?}"
    );
    assert!(
        want[3].contains("etcdserver: duplicate key given in txn request"),
        "{want:?}"
    );
    assert!(want[4].starts_with("succeeded=true"), "{want:?}");
    assert!(
        want[5].contains("etcdserver: duplicate key given in txn request"),
        "{want:?}"
    );
    assert!(want[6].starts_with("succeeded=true"), "{want:?}");
    assert!(
        want[7].contains("etcdserver: too many operations in txn request"),
        "{want:?}"
    );
}

/// Everything the empty-key requests get from one server, as text.
async fn empty_keys(endpoint: &str) -> Vec<String> {
    let channel = channel(endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    let mut answers = Vec::new();
    for (key, value) in [(&b"\0"[..], "zero"), (b"e/a", "1"), (b"e/b", "2")] {
        kv.put(PutRequest {
            key: key.to_vec(),
            value: value.as_bytes().to_vec(),
            ..PutRequest::default()
        })
        .await
        .expect("put");
    }
    let range = |key: &[u8], range_end: &[u8]| RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        keys_only: true,
        ..RangeRequest::default()
    };
    for (key, range_end) in [
        (&b""[..], &b""[..]),
        (b"", b"\0"),
        (b"", b"e/b"),
        (b"\0", b""),
        (b"\0", b"\0"),
        (b"\0", b"e/b"),
    ] {
        answers.push(match kv.range(range(key, range_end)).await {
            Ok(response) => {
                let keys: Vec<String> = response
                    .get_ref()
                    .kvs
                    .iter()
                    .map(|kv| format!("{:?}", String::from_utf8_lossy(&kv.key)))
                    .collect();
                format!("{key:?}..{range_end:?}: {}", keys.join(" "))
            }
            Err(status) => format!("{key:?}..{range_end:?}: refused {:?}", refusal(&status)),
        });
    }
    for range_end in [&b""[..], b"\0"] {
        let refused = kv
            .delete_range(DeleteRangeRequest {
                key: Vec::new(),
                range_end: range_end.to_vec(),
                ..DeleteRangeRequest::default()
            })
            .await
            .expect_err("an empty key");
        answers.push(format!("delete ..{range_end:?}: {:?}", refusal(&refused)));
    }
    let empty_compare = Compare {
        range_end: b"\0".to_vec(),
        ..version_is("", 0)
    };
    let refused = kv
        .txn(txn(vec![empty_compare], vec![], vec![]))
        .await
        .expect_err("an empty compared key");
    answers.push(format!("compare: {:?}", refusal(&refused)));
    let empty_read = RequestOp {
        request: Some(request_op::Request::RequestRange(range(b"", b"\0"))),
    };
    let refused = kv
        .txn(txn(vec![], vec![empty_read], vec![]))
        .await
        .expect_err("an empty key read in a transaction");
    answers.push(format!("txn range: {:?}", refusal(&refused)));
    // Watches of an empty key: `\0` alone, and every key from `\0` on.
    let mut watch = WatchClient::new(channel);
    let (requests, outbox) = tokio::sync::mpsc::channel(4);
    // Sent before the call: a server may answer its headers only with
    // the first response.
    for (id, range_end) in [(1, &b""[..]), (2, b"\0")] {
        requests
            .send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: Vec::new(),
                    range_end: range_end.to_vec(),
                    watch_id: id,
                    ..WatchCreateRequest::default()
                })),
            })
            .await
            .expect("send");
    }
    let mut stream = watch
        .watch(tokio_stream::wrappers::ReceiverStream::new(outbox))
        .await
        .expect("a watch stream")
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next = async || {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, stream.message())
            .await
            .expect("a watch response in time")
            .expect("a watch response")
            .expect("the watch stream still runs")
    };
    for _ in 0..2 {
        let created = next().await;
        answers.push(format!(
            "watch {}: created={} canceled={} {:?}",
            created.watch_id, created.created, created.canceled, created.cancel_reason
        ));
    }
    for key in [&b"e/c"[..], b"\0"] {
        kv.put(PutRequest {
            key: key.to_vec(),
            value: b"w".to_vec(),
            ..PutRequest::default()
        })
        .await
        .expect("put");
    }
    // Watch 2 sees both puts, watch 1 the second: three events.
    let mut events = Vec::new();
    while events.len() < 3 {
        let response = next().await;
        events.extend(response.events.iter().map(|event| {
            let key = event
                .kv
                .as_ref()
                .map(|kv| kv.key.clone())
                .unwrap_or_default();
            (response.watch_id, key)
        }));
    }
    events.sort();
    answers.push(format!("watched {events:?}"));
    drop(requests);
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_keys_answer_as_on_etcd() {
    let _one = exclusive().await;
    let Some(etcd) = reference("etcd_nested_txn::empty_keys_answer_as_on_etcd") else {
        return;
    };
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&etcd.endpoint).await;
    answering(&oncekv).await;

    let want = empty_keys(&etcd.endpoint).await;
    let got = empty_keys(&oncekv).await;
    assert_eq!(got, want, "oncekv (left), etcd (right)");
    // What etcd answered is what was meant.
    let not_provided = "etcdserver: key is not provided";
    for at in [0, 1, 2, 6, 7, 8, 9] {
        assert!(want[at].contains(not_provided), "{at}: {want:?}");
    }
    assert!(want[4].contains("\"e/a\""), "every key from \\0: {want:?}");
    assert!(!want[10].contains("canceled=true"), "{want:?}");
}
