//! etcd's KV service through the client proxy: [`EtcdForwarder`] relays
//! Range, Put, DeleteRange, Txn and Compact to the node's etcd API (or to
//! a real etcd), metadata included, and puts the proxy's reply faults on
//! the writes: a write's reply dropped after the server answered it, lost
//! with its connection, or delayed. Each write's answer is recorded under
//! its `oncekv-idempotency-key` (the replies checker then holds every
//! answer to one key to one response and one revision); writes without
//! the key are relayed and faulted alike, unrecorded.
//!
//! A recorded answer's canonical bytes are the response with the member
//! id and Raft term zeroed, which name the member that answered and its
//! term rather than the write: what must not differ between a first
//! answer and a replay is everything else, the header revision included.

use super::{Breaker, Shared, UPSTREAM_TIMEOUT, node_not_reached, upstream_status};
use oncekv_check::record::{Answer, Bytes, Reply, RequestIdentity};
use oncekv_proto::IDEMPOTENCY_KEY_METADATA;
use oncekv_proto::etcd::etcdserverpb::kv_server::Kv;
use oncekv_proto::etcd::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse, response_op,
};
use prost::Message;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The proxy's etcd KV service.
pub(super) struct EtcdForwarder(pub(super) Arc<Shared>);

/// `request` as sent on to the node: its metadata (idempotency key,
/// token) kept, the proxy's own timeout set.
fn relayed<T>(request: Request<T>) -> Request<T> {
    let (metadata, _, message) = request.into_parts();
    let mut relayed = Request::new(message);
    *relayed.metadata_mut() = metadata;
    relayed.set_timeout(UPSTREAM_TIMEOUT);
    relayed
}

/// A header without what names the answering member and its term.
fn anonymous(header: &mut Option<ResponseHeader>) {
    if let Some(header) = header {
        header.member_id = 0;
        header.raft_term = 0;
    }
}

/// The revision a response's header reports.
fn revision_of(header: Option<&ResponseHeader>) -> Option<u64> {
    header.and_then(|header| u64::try_from(header.revision).ok())
}

/// A write's etcd response, as the history records it.
trait Recorded: Message + Clone + Sized {
    /// The reply in the history's terms.
    fn reply(&self) -> Reply;
    /// The header revision.
    fn revision(&self) -> Option<u64>;
    /// The response without member id and term, encoded.
    fn canonical(&self) -> Vec<u8>;
}

impl Recorded for PutResponse {
    fn reply(&self) -> Reply {
        Reply::Put {
            previous: self.prev_kv.as_ref().map(|kv| Bytes(kv.value.clone())),
        }
    }
    fn revision(&self) -> Option<u64> {
        revision_of(self.header.as_ref())
    }
    fn canonical(&self) -> Vec<u8> {
        let mut response = self.clone();
        anonymous(&mut response.header);
        response.encode_to_vec()
    }
}

impl Recorded for DeleteRangeResponse {
    fn reply(&self) -> Reply {
        Reply::Delete {
            previous: self.prev_kvs.first().map(|kv| Bytes(kv.value.clone())),
        }
    }
    fn revision(&self) -> Option<u64> {
        revision_of(self.header.as_ref())
    }
    fn canonical(&self) -> Vec<u8> {
        let mut response = self.clone();
        anonymous(&mut response.header);
        response.encode_to_vec()
    }
}

impl Recorded for TxnResponse {
    fn reply(&self) -> Reply {
        Reply::Txn {
            succeeded: self.succeeded,
            results: Vec::new(),
        }
    }
    fn revision(&self) -> Option<u64> {
        revision_of(self.header.as_ref())
    }
    fn canonical(&self) -> Vec<u8> {
        let mut response = self.clone();
        anonymous_txn(&mut response);
        response.encode_to_vec()
    }
}

/// A transaction's response without member ids and terms, nested ones
/// included.
fn anonymous_txn(response: &mut TxnResponse) {
    anonymous(&mut response.header);
    for op in &mut response.responses {
        match &mut op.response {
            Some(response_op::Response::ResponseRange(r)) => anonymous(&mut r.header),
            Some(response_op::Response::ResponsePut(r)) => anonymous(&mut r.header),
            Some(response_op::Response::ResponseDeleteRange(r)) => anonymous(&mut r.header),
            Some(response_op::Response::ResponseTxn(r)) => anonymous_txn(r),
            None => {}
        }
    }
}

impl Shared {
    /// A write's identity: its idempotency key, or none.
    fn etcd_identity<T>(&self, request: &Request<T>) -> (RequestIdentity, u32) {
        match request.metadata().get(IDEMPOTENCY_KEY_METADATA) {
            Some(key) => self.keyed(key.as_bytes().to_vec()),
            None => (RequestIdentity::plain(), 1),
        }
    }

    /// The node's answer to a relayed write, after the reply fault;
    /// recorded under `identity`.
    async fn etcd_answered<R: Recorded>(
        &self,
        identity: (RequestIdentity, u32),
        upstream: Result<Response<R>, Status>,
        connection: Option<&Breaker>,
    ) -> Result<Response<R>, Status> {
        let identities = [identity];
        let response = match upstream {
            Ok(response) => response,
            Err(status) if node_not_reached(&status) => {
                let _ = self.record_failure(&identities, status.clone());
                return Err(Status::unavailable(format!(
                    "node unreachable, nothing sent: {}",
                    status.message()
                )));
            }
            Err(status) => return Err(self.record_failure(&identities, status)),
        };
        let message = response.get_ref();
        let answer = Answer::Applied {
            reply: message.reply(),
            canonical: Some(Bytes(message.canonical())),
            log_index: message.revision(),
        };
        self.answer_fault(&identities, &[(answer, true)], connection)
            .await?;
        Ok(response)
    }
}

#[tonic::async_trait]
impl Kv for EtcdForwarder {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let mut upstream = self.0.etcd_upstream.clone();
        upstream
            .range(relayed(request))
            .await
            .map_err(upstream_status)
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let connection = request.extensions().get::<Breaker>().cloned();
        let identity = self.0.etcd_identity(&request);
        let mut upstream = self.0.etcd_upstream.clone();
        let answered = upstream.put(relayed(request)).await;
        self.0
            .etcd_answered(identity, answered, connection.as_ref())
            .await
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let connection = request.extensions().get::<Breaker>().cloned();
        let identity = self.0.etcd_identity(&request);
        let mut upstream = self.0.etcd_upstream.clone();
        let answered = upstream.delete_range(relayed(request)).await;
        self.0
            .etcd_answered(identity, answered, connection.as_ref())
            .await
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let connection = request.extensions().get::<Breaker>().cloned();
        let identity = self.0.etcd_identity(&request);
        let mut upstream = self.0.etcd_upstream.clone();
        let answered = upstream.txn(relayed(request)).await;
        self.0
            .etcd_answered(identity, answered, connection.as_ref())
            .await
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let mut upstream = self.0.etcd_upstream.clone();
        upstream
            .compact(relayed(request))
            .await
            .map_err(upstream_status)
    }
}
