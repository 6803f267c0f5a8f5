//! Resources through etcd's v3 API as Kubernetes keeps its objects there
//! (the shapes kine, the etcd shim Kubernetes distributions run on,
//! accepts): every write one Txn guarded by the key's mod revision, lists
//! paged with a limit and continued at the first page's revision, and a
//! compactor that compacts as the API server's does.
//!
//! * create: `If(mod_revision(key) == 0) Then(Put(key))`;
//! * update: `If(mod_revision(key) == rev) Then(Put(key)) Else(Get(key))`,
//!   `rev` as a linearizable Get just read it;
//! * delete: `If(mod_revision(key) == rev) Then(Delete(key)) Else(Get(key))`;
//! * list: Range over the resources with a small limit; while `more`,
//!   the next page from after the last key, at the first page's revision;
//! * compaction: `If(version(compact_rev_key) == t) Then(Put(compact_rev_key,
//!   rev)) Else(Get(compact_rev_key))`, and on success Compact(rev) of the
//!   revision seen one interval before.
//!
//! Each Txn sent is one operation of the history, recorded as the
//! checkers model it: a mod revision compare becomes a compare of the
//! value read (every value written is unique, so the key still has the
//! mod revision read exactly when it still has the value read), a mod
//! revision of 0 a compare of existence; a whole list is one range read
//! (its pages are one snapshot, at the first page's revision, read while
//! the list ran). Puts and deletes ask for the previous value, so each
//! write's reply says what it replaced and the watch checker can place
//! its change by the revision its answer names.

use crate::etcd_workload::{EtcdWorker, Sent, Write, Written, reason_of};
use oncekv_check::record::{
    self, Bytes, ClientId, Compare, CompareOp, CompareTarget, FailReason, KeyRange, KeyValue, Op,
    Outcome, Reply, RequestIdentity, Txn, TxnOpResult,
};
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::{
    self as etcd, CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, TxnResponse, request_op, response_op,
};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

/// Most keys one page of a list returns.
pub const LIST_PAGE: i64 = 2;

/// How often the compactor runs (Kubernetes' default is 5 minutes; a run
/// is a minute).
pub const COMPACT_INTERVAL: Duration = Duration::from_secs(5);

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_millis(1_000);

/// The first key after every key that starts with `prefix` (etcd's
/// prefix `range_end`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn range_request(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        ..RangeRequest::default()
    }
}

fn op(request: request_op::Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

fn put_op(key: &[u8], value: Vec<u8>) -> RequestOp {
    op(request_op::Request::RequestPut(PutRequest {
        key: key.to_vec(),
        value,
        prev_kv: true,
        ..PutRequest::default()
    }))
}

fn get_op(key: &[u8]) -> RequestOp {
    op(request_op::Request::RequestRange(range_request(key)))
}

fn compare(key: &[u8], target: etcd::compare::CompareTarget, union: TargetUnion) -> etcd::Compare {
    etcd::Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(union),
    }
}

/// The results of `response`'s operations, in the history's terms.
fn results(response: &TxnResponse) -> Vec<TxnOpResult> {
    response
        .responses
        .iter()
        .filter_map(|op| {
            Some(match op.response.as_ref()? {
                response_op::Response::ResponsePut(put) => TxnOpResult::Put {
                    previous: put.prev_kv.as_ref().map(|kv| Bytes(kv.value.clone())),
                },
                response_op::Response::ResponseDeleteRange(delete) => TxnOpResult::Delete {
                    previous: delete.prev_kvs.first().map(|kv| Bytes(kv.value.clone())),
                },
                response_op::Response::ResponseRange(range) => TxnOpResult::Get {
                    value: range.kvs.first().map(|kv| Bytes(kv.value.clone())),
                },
                response_op::Response::ResponseTxn(_) => return None,
            })
        })
        .collect()
}

/// A recorded transaction of one compare on `key` and one operation per
/// branch.
fn recorded(
    key: &[u8],
    target: CompareTarget,
    success: record::TxnOp,
    failure: Option<record::TxnOp>,
) -> Txn {
    Txn {
        compares: vec![Compare {
            range: KeyRange::Key(Bytes(key.to_vec())),
            op: CompareOp::Equal,
            target,
        }],
        success: vec![success],
        failure: failure.into_iter().collect(),
    }
}

impl EtcdWorker {
    /// One resource operation: a list, or a write of one resource as its
    /// state read just before allows (create when absent, else update or
    /// delete).
    pub(crate) async fn resource_step(&mut self) {
        use rand::Rng as _;
        if self.rng.random_range(0..100) < 20 {
            self.list_resources().await;
            return;
        }
        let index = self.rng.random_range(0..self.options.resources.max(1));
        let key = self.options.resource(index);
        let Some((value, revision)) = self.read_recorded(&key).await else {
            return;
        };
        let new = self.resource_value(index);
        let key_bytes = || Bytes(key.clone());
        let (txn, history) = match value {
            None => (
                TxnRequest {
                    compare: vec![compare(
                        &key,
                        etcd::compare::CompareTarget::Mod,
                        TargetUnion::ModRevision(0),
                    )],
                    success: vec![put_op(&key, new.clone())],
                    failure: Vec::new(),
                },
                recorded(
                    &key,
                    CompareTarget::Exists(false),
                    record::TxnOp::Put {
                        key: key_bytes(),
                        value: Bytes(new),
                    },
                    None,
                ),
            ),
            Some(read) => {
                let guard = compare(
                    &key,
                    etcd::compare::CompareTarget::Mod,
                    TargetUnion::ModRevision(revision),
                );
                let delete = self.rng.random_range(0..100) < 30;
                let success = if delete {
                    op(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: key.clone(),
                            prev_kv: true,
                            ..DeleteRangeRequest::default()
                        },
                    ))
                } else {
                    put_op(&key, new.clone())
                };
                let recorded_success = if delete {
                    record::TxnOp::Delete { key: key_bytes() }
                } else {
                    record::TxnOp::Put {
                        key: key_bytes(),
                        value: Bytes(new),
                    }
                };
                (
                    TxnRequest {
                        compare: vec![guard],
                        success: vec![success],
                        failure: vec![get_op(&key)],
                    },
                    recorded(
                        &key,
                        CompareTarget::Value(Bytes(read)),
                        recorded_success,
                        Some(record::TxnOp::Get { key: key_bytes() }),
                    ),
                )
            }
        };
        self.txn_recorded(txn, history).await;
    }

    /// A unique value for resource `index`.
    fn resource_value(&mut self, index: usize) -> Vec<u8> {
        let token = self.token();
        let mut value = format!("pod-{index}|").into_bytes();
        value.extend_from_slice(&token);
        value
    }

    /// A linearizable Get of `key`, recorded as a GET: its value and mod
    /// revision, or `None` when it failed.
    async fn read_recorded(&mut self, key: &[u8]) -> Option<(Option<Vec<u8>>, i64)> {
        let op = Op::Get {
            key: Bytes(key.to_vec()),
        };
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let (outcome, read) = match self.get(key).await {
            Ok((value, revision)) => (
                Outcome::Ok {
                    reply: Reply::Get {
                        value: value.clone().map(Bytes),
                    },
                    canonical: None,
                },
                Some((value, revision)),
            ),
            Err(status) => {
                self.next_endpoint().await;
                (failure(&status), None)
            }
        };
        self.recorder.complete(self.id, op_id, 1, outcome);
        read
    }

    /// Sends `txn` until its outcome is known (under an idempotency key
    /// in session mode) and records it as `history`.
    async fn txn_recorded(&mut self, txn: TxnRequest, history: Txn) {
        let op_id = self
            .recorder
            .invoke(self.id, RequestIdentity::plain(), Op::Txn(history));
        let write_key = self.write_key(1);
        self.attribute(write_key.as_deref(), op_id);
        let (sent, maybe_applied) = self
            .send_until_known(&Write::Txn(txn), write_key.as_deref())
            .await;
        let outcome = match sent {
            Sent::Answered(Written::Txn(response)) => Outcome::Ok {
                reply: Reply::Txn {
                    succeeded: response.succeeded,
                    results: results(&response),
                },
                canonical: None,
            },
            Sent::Answered(Written::Put(_)) => Outcome::Unknown {
                detail: Some("a put's answer to a transaction".to_string()),
            },
            Sent::NotApplied(status) if !maybe_applied => failure(&status),
            Sent::NotApplied(status) | Sent::Unknown(status) => Outcome::Unknown {
                detail: Some(status.message().to_string()),
            },
        };
        self.recorder.complete(self.id, op_id, 1, outcome);
    }

    /// Lists the resources in pages, recorded as one range read.
    async fn list_resources(&mut self) {
        let prefix = self.options.resources_prefix();
        let end = prefix_end(&prefix);
        let op = Op::Txn(Txn {
            compares: Vec::new(),
            success: vec![record::TxnOp::GetRange {
                start: Bytes(prefix.clone()),
                end: Some(Bytes(end.clone())),
            }],
            failure: Vec::new(),
        });
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let mut client = self.client();
        let outcome = match list(&mut client, &prefix).await {
            Ok((entries, _)) => Outcome::Ok {
                reply: Reply::Txn {
                    succeeded: true,
                    results: vec![TxnOpResult::GetPrefix { entries }],
                },
                canonical: None,
            },
            Err(status) => {
                self.next_endpoint().await;
                failure(&status)
            }
        };
        self.recorder.complete(self.id, op_id, 1, outcome);
    }
}

/// A refusal of a read, or of a write that certainly did not apply.
fn failure(status: &Status) -> Outcome {
    Outcome::Failed {
        reason: reason_of(status),
        detail: Some(status.message().to_string()),
    }
}

/// Lists every key under `prefix` in pages of [`LIST_PAGE`], as
/// Kubernetes' lists continue: the entries and the revision of the
/// snapshot they are.
pub(crate) async fn list(
    client: &mut KvClient<Channel>,
    prefix: &[u8],
) -> Result<(Vec<KeyValue>, i64), Status> {
    let end = prefix_end(prefix);
    let mut entries = Vec::new();
    let mut from = prefix.to_vec();
    let mut revision = 0;
    loop {
        let mut request = tonic::Request::new(RangeRequest {
            key: from,
            range_end: end.clone(),
            limit: LIST_PAGE,
            revision,
            ..RangeRequest::default()
        });
        request.set_timeout(CALL_TIMEOUT);
        let page = client.range(request).await?.into_inner();
        if revision == 0 {
            revision = page.header.as_ref().map_or(0, |header| header.revision);
        }
        let last = page.kvs.last().map(|kv| kv.key.clone());
        entries.extend(page.kvs.into_iter().map(|kv| KeyValue {
            key: Bytes(kv.key),
            value: Bytes(kv.value),
        }));
        match last {
            Some(mut last) if page.more => {
                last.push(0);
                from = last;
            }
            _ => return Ok((entries, revision)),
        }
    }
}

/// The compactor: every [`COMPACT_INTERVAL`] until `stop`, the API
/// server's compaction round as client `id`, its Txns recorded and sent
/// under idempotency keys when `keyed`.
pub(crate) async fn compactor(mut worker: EtcdWorker, mut stop: watch::Receiver<bool>) {
    // The compact key's version as last seen, and the revision to compact
    // next round.
    let mut version: i64 = 0;
    let mut revision: i64 = 0;
    let mut next = Instant::now() + COMPACT_INTERVAL;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        next = Instant::now() + COMPACT_INTERVAL;
        if *stop.borrow() {
            return;
        }
        if let Some((seen, current)) = compact_round(&mut worker, version, revision).await {
            version = seen;
            revision = current;
        }
    }
}

/// One round: claims the round through the compact key's version, and on
/// success compacts `revision`; returns the key's version and the store's
/// revision now.
async fn compact_round(worker: &mut EtcdWorker, version: i64, revision: i64) -> Option<(i64, i64)> {
    let key = worker.options.compact_key();
    let value = revision.to_string().into_bytes();
    let txn = TxnRequest {
        compare: vec![compare(
            &key,
            etcd::compare::CompareTarget::Version,
            TargetUnion::Version(version),
        )],
        success: vec![put_op(&key, value.clone())],
        failure: vec![get_op(&key)],
    };
    let history = recorded(
        &key,
        CompareTarget::Version(u64::try_from(version).unwrap_or(0)),
        record::TxnOp::Put {
            key: Bytes(key.clone()),
            value: Bytes(value),
        },
        Some(record::TxnOp::Get {
            key: Bytes(key.clone()),
        }),
    );
    worker.issued += 1;
    let op_id = worker
        .recorder
        .invoke(worker.id, RequestIdentity::plain(), Op::Txn(history));
    let write_key = worker.write_key(1);
    worker.attribute(write_key.as_deref(), op_id);
    let (sent, maybe_applied) = worker
        .send_until_known(&Write::Txn(txn), write_key.as_deref())
        .await;
    let (outcome, answer) = match sent {
        Sent::Answered(Written::Txn(response)) => (
            Outcome::Ok {
                reply: Reply::Txn {
                    succeeded: response.succeeded,
                    results: results(&response),
                },
                canonical: None,
            },
            Some(response),
        ),
        Sent::NotApplied(status) if !maybe_applied => (failure(&status), None),
        Sent::NotApplied(status) | Sent::Unknown(status) => (
            Outcome::Unknown {
                detail: Some(status.message().to_string()),
            },
            None,
        ),
        Sent::Answered(Written::Put(_)) => (
            Outcome::Failed {
                reason: FailReason::Other,
                detail: Some("a put's answer to a transaction".to_string()),
            },
            None,
        ),
    };
    worker.recorder.complete(worker.id, op_id, 1, outcome);
    let response = answer?;
    let current = response.header.as_ref().map_or(0, |header| header.revision);
    if !response.succeeded {
        // Another compactor's round: take its version.
        let seen = response
            .responses
            .first()
            .and_then(|op| match op.response.as_ref()? {
                response_op::Response::ResponseRange(range) => range.kvs.first(),
                _ => None,
            })
            .map_or(0, |kv| kv.version);
        return Some((seen, current));
    }
    if revision > 0 {
        let mut request = tonic::Request::new(CompactionRequest {
            revision,
            physical: false,
        });
        request.set_timeout(CALL_TIMEOUT);
        // Compacted already, or a node away: the next round compacts on.
        let _ = worker.client().compact(request).await;
    }
    Some((version.saturating_add(1), current))
}

/// Client id of the compactor, after the workload's clients.
pub fn compactor_id(clients: usize) -> ClientId {
    clients as ClientId + 1
}
