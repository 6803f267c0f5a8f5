//! A transaction's reply is bounded as a whole, on a real node: a small
//! transaction of many reads of a large value is refused with a typed
//! reason instead of building a reply of hundreds of megabytes, and what it
//! wrote is undone; over etcd's API and over the native one. One that only
//! reads, sent plain, is answered (or refused) by the leader before
//! anything is proposed: it costs no log entry.

mod support;

use oncekv_client::{Client, ClientError, ClientOptions, Rejection, Txn, TxnOp};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::{
    PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};
use std::time::Duration;
use support::{Cluster, FAST, exclusive};

/// The default bound: two scans' worth of 2 MiB.
const REPLY_BYTES_MAX: u64 = 4 * 1024 * 1024;
const VALUE_BYTES: usize = 1024 * 1024 - 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_many_large_reads_is_refused_whole() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;

    // etcd's API first, with plain requests only: nothing here can expire
    // (no session, lease or idempotency key), so the leader proposes no
    // tick, and nothing moves the revision but a log entry.
    let mut etcd = KvClient::connect(format!("http://{}", cluster.nodes[0].client))
        .await
        .expect("etcd client")
        .max_decoding_message_size(64 * 1024 * 1024);
    etcd.put(PutRequest {
        key: b"big".to_vec(),
        value: vec![b'v'; VALUE_BYTES],
        ..Default::default()
    })
    .await
    .expect("put");
    let get = || RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: b"big".to_vec(),
            ..Default::default()
        })),
    };
    let reader = etcd.clone();
    let revision = || {
        let mut etcd = reader.clone();
        async move {
            let read = etcd
                .range(RangeRequest {
                    key: b"big".to_vec(),
                    keys_only: true,
                    ..Default::default()
                })
                .await
                .expect("range");
            read.into_inner().header.expect("header").revision
        }
    };
    let before = revision().await;
    let fits = etcd
        .txn(TxnRequest {
            success: (0..3).map(|_| get()).collect(),
            ..Default::default()
        })
        .await
        .expect("three reads fit")
        .into_inner();
    assert_eq!(fits.responses.len(), 3);
    let header = fits.header.expect("header");
    assert_eq!(header.revision, before, "a read-only txn is not proposed");
    let status = etcd
        .txn(TxnRequest {
            success: (0..100).map(|_| get()).collect(),
            ..Default::default()
        })
        .await
        .expect_err("a hundred reads of 1 MiB must be refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("response is too large"),
        "{status:?}"
    );
    assert_eq!(
        revision().await,
        before,
        "a read-only txn is refused before anything is proposed"
    );

    // The native API: a transaction that writes too is refused whole at
    // apply, its write undone; one that only reads is refused too.
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let options = ClientOptions::default().with_deadline(Duration::from_secs(30));
    let client = Client::connect(endpoints, options).expect("client");
    // Three reads fit (3 MiB); a hundred would be 100 MiB.
    let reads = |count: usize| {
        (0..count).fold(
            Txn::new().on_success(TxnOp::put("marker", "1")),
            |txn, _| txn.on_success(TxnOp::get("big")),
        )
    };
    let done = client.txn(reads(3)).await.expect("three reads fit");
    assert_eq!(done.results.len(), 4);
    client.delete("marker").await.expect("delete");
    match client.txn(reads(100)).await {
        Err(ClientError::Rejected(Rejection::ReplyTooLarge { bytes, max })) => {
            assert_eq!(max, REPLY_BYTES_MAX);
            assert!(bytes > max, "{bytes} counted, bound {max}");
        }
        other => panic!("a hundred reads of 1 MiB must be refused, got {other:?}"),
    }
    let marker = client.get("marker").await.expect("get");
    assert_eq!(marker, None, "the refused transaction's put is undone");
    let only_reads = (0..100).fold(Txn::new(), |txn, _| txn.on_success(TxnOp::get("big")));
    match client.txn(only_reads).await {
        Err(ClientError::Rejected(Rejection::ReplyTooLarge { bytes, max })) => {
            assert_eq!(max, REPLY_BYTES_MAX);
            assert!(bytes > max, "{bytes} counted, bound {max}");
        }
        other => panic!("a hundred reads of 1 MiB must be refused, got {other:?}"),
    }
}
