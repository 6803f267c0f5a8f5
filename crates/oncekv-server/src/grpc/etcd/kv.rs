//! `etcdserverpb.KV` onto the node: Range as a get or a read of a key
//! range with its count (past revisions through the history), Put,
//! DeleteRange, Txn and Compact as the node's commands, proposed and
//! deduplicated as native ones are. A write whose etcd response needs what
//! the key held before (`prev_kv`) reads it in the same transaction, so the
//! answer is exact and a retry replays it whole; a put that keeps the key's
//! value or lease (`ignore_value`, `ignore_lease`) takes them from the
//! state when it applies.
//!
//! Keys are addressed as etcd addresses them, by `key` and `range_end`:
//! one key (`range_end` empty), every key from `key` up to `range_end`
//! (a prefix is the range up to its successor), or every key from `key` on
//! (`range_end` `\0`). A transaction nested in a branch is the node's
//! nested transaction: its compares are evaluated with its enclosing
//! transaction's, before any operation runs, as etcd does.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::lease::{lease_id, lease_name};
use super::{EtcdApi, origin_of, revision_from_wire, revision_to_wire};
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::kv_server::Kv;
use oncekv_proto::etcd::etcdserverpb::range_request::{SortOrder, SortTarget};
use oncekv_proto::etcd::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare as EtcdCompare, DeleteRangeRequest,
    DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, TxnRequest, TxnResponse, request_op, response_op,
};
use oncekv_proto::etcd::mvccpb::KeyValue as EtcdKeyValue;
use oncekv_state::{
    Command, KeyMeta, KeyRange, KeyScope, Outcome, Query, Reply, Request, prefix_end,
};
use oncekv_state::{Compare, CompareOp, CompareTarget as Target, Txn, TxnOp, Update};
use std::collections::BTreeMap;
use tonic::{Response, Status};

/// Which keys a request addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Keys {
    /// One key.
    One(Vec<u8>),
    /// Every key under a prefix (empty: every key): the range up to the
    /// prefix's successor, as `--prefix` sends it.
    Prefix(Vec<u8>),
    /// Every key in any other range.
    Range(KeyRange),
}

impl Keys {
    /// The keys `key` and `range_end` address, as etcd reads them: one key
    /// without an end; a prefix when the end is the key's successor as a
    /// prefix (or `key` and `range_end` are both `\0`: every key); every
    /// key from `key` on with the end `\0`; else every key from `key` up
    /// to the end (none if it is not above `key`). An empty key is refused
    /// whatever the end, as etcd refuses it in a Range, a DeleteRange and a
    /// compare (its clients send `\0` for "from the first key"; a watch
    /// takes an empty key as `\0`, see `watch`).
    pub(super) fn of(key: &[u8], range_end: &[u8]) -> Result<Keys, EtcdError> {
        if key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        if range_end.is_empty() {
            return Ok(Keys::One(key.to_vec()));
        }
        if key == [0] && range_end == [0] {
            return Ok(Keys::Prefix(Vec::new()));
        }
        let successor = prefix_end(key);
        if successor.as_deref().unwrap_or(&[0]) == range_end {
            return Ok(Keys::Prefix(key.to_vec()));
        }
        if range_end == [0] {
            return Ok(Keys::Range(KeyRange::from_key(key)));
        }
        Ok(Keys::Range(KeyRange::new(key, range_end)))
    }

    /// The keys as a range.
    fn range(&self) -> KeyRange {
        match self {
            Keys::One(key) => KeyRange::one(key.as_slice()),
            Keys::Prefix(prefix) => KeyRange::prefix(prefix.as_slice()),
            Keys::Range(range) => range.clone(),
        }
    }

    /// The first key and the scope from it, as compares and watches name
    /// keys.
    pub(super) fn scoped(self) -> (Vec<u8>, KeyScope) {
        match self {
            Keys::One(key) => (key, KeyScope::Key),
            Keys::Prefix(prefix) => (prefix, KeyScope::Prefix),
            Keys::Range(KeyRange { start, end }) => (start, KeyScope::Range { end }),
        }
    }

    /// The read of them (a range answers its count too).
    fn query(&self, limit: u32) -> Query {
        match self {
            Keys::One(key) => Query::Get { key: key.clone() },
            Keys::Prefix(_) | Keys::Range(_) => Query::Range {
                range: self.range(),
                limit,
            },
        }
    }

    fn read_op(&self, limit: u32) -> TxnOp {
        match self {
            Keys::One(key) => TxnOp::Get { key: key.clone() },
            Keys::Prefix(_) | Keys::Range(_) => TxnOp::Range {
                range: self.range(),
                limit,
            },
        }
    }

    fn delete_op(&self) -> TxnOp {
        match self {
            Keys::One(key) => TxnOp::Delete { key: key.clone() },
            Keys::Prefix(prefix) => TxnOp::DeletePrefix {
                prefix: prefix.clone(),
            },
            Keys::Range(range) => TxnOp::DeleteRange {
                range: range.clone(),
            },
        }
    }
}

/// What a Range asks of each returned pair.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    keys_only: bool,
    count_only: bool,
}

/// How a Range orders and filters what matches, beyond key order: done
/// here, on every matching pair (as etcd does it), so only within the
/// node's scan maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Arrange {
    /// Sort by this, if not by key ascending.
    sort: Option<(SortTarget, SortOrder)>,
    min_mod: i64,
    max_mod: i64,
    min_create: i64,
    max_create: i64,
}

impl Arrange {
    fn of(request: &RangeRequest) -> Arrange {
        let (target, mut order) = (request.sort_target(), request.sort_order());
        // etcd: a target without an order sorts ascending.
        if order == SortOrder::None && target != SortTarget::Key {
            order = SortOrder::Ascend;
        }
        let by_key_ascending =
            target == SortTarget::Key && matches!(order, SortOrder::None | SortOrder::Ascend);
        Arrange {
            sort: (!by_key_ascending).then_some((target, order)),
            min_mod: request.min_mod_revision,
            max_mod: request.max_mod_revision,
            min_create: request.min_create_revision,
            max_create: request.max_create_revision,
        }
    }

    /// Whether it needs every matching pair.
    fn needs_all(&self) -> bool {
        *self != Arrange::default()
    }

    fn keeps(&self, kv: &EtcdKeyValue) -> bool {
        let at_least = |bound: i64, value: i64| bound == 0 || value >= bound;
        let at_most = |bound: i64, value: i64| bound == 0 || value <= bound;
        at_least(self.min_mod, kv.mod_revision)
            && at_most(self.max_mod, kv.mod_revision)
            && at_least(self.min_create, kv.create_revision)
            && at_most(self.max_create, kv.create_revision)
    }

    /// Filters and sorts `kvs` (in key order), stably.
    fn apply(&self, kvs: &mut Vec<EtcdKeyValue>) {
        kvs.retain(|kv| self.keeps(kv));
        let Some((target, order)) = self.sort else {
            return;
        };
        match target {
            SortTarget::Key => {}
            SortTarget::Version => kvs.sort_by_key(|kv| kv.version),
            SortTarget::Create => kvs.sort_by_key(|kv| kv.create_revision),
            SortTarget::Mod => kvs.sort_by_key(|kv| kv.mod_revision),
            SortTarget::Value => kvs.sort_by(|a, b| a.value.cmp(&b.value)),
        }
        if order == SortOrder::Descend {
            kvs.reverse();
        }
    }
}

/// The parts of a Range oncekv serves: which keys, how many, in what
/// shape and order, and at what revision (0: now).
pub(super) struct RangeParts {
    keys: Keys,
    limit: u32,
    shape: Shape,
    arrange: Arrange,
    revision: u64,
}

impl RangeParts {
    pub(super) fn of(request: &RangeRequest) -> Result<RangeParts, EtcdError> {
        Ok(RangeParts {
            keys: Keys::of(&request.key, &request.range_end)?,
            // 0 and below: no limit (the node's scan maximum).
            limit: u32::try_from(request.limit).unwrap_or(0),
            shape: Shape {
                keys_only: request.keys_only,
                count_only: request.count_only,
            },
            arrange: Arrange::of(request),
            revision: revision_from_wire(request.revision),
        })
    }

    /// How many pairs the node reads for it: every match (up to the scan
    /// maximum) when it must sort or filter them, its limit otherwise.
    fn read_limit(&self) -> u32 {
        if self.arrange.needs_all() {
            0
        } else {
            self.limit
        }
    }

    /// The node's query for it: every match when it must arrange them.
    pub(super) fn query(&self) -> Query {
        let query = self.keys.query(self.read_limit());
        if self.revision == 0 {
            return query;
        }
        Query::At {
            revision: self.revision,
            query: Box::new(query),
        }
    }
}

fn key_value(key: Vec<u8>, value: Vec<u8>, meta: KeyMeta, shape: Shape) -> EtcdKeyValue {
    EtcdKeyValue {
        key,
        create_revision: revision_to_wire(meta.create_revision),
        mod_revision: revision_to_wire(meta.mod_revision),
        version: i64::try_from(meta.version).unwrap_or(i64::MAX),
        value: if shape.keys_only { Vec::new() } else { value },
        lease: 0,
    }
}

/// The pairs a read answered, in etcd's terms.
struct Pairs {
    kvs: Vec<EtcdKeyValue>,
    /// Whether more match beyond the limit.
    more: bool,
    /// How many match in all.
    count: u64,
}

/// The pairs a get or range reply holds.
fn pairs_of(reply: Reply, shape: Shape) -> Result<Pairs, EtcdError> {
    match reply {
        Reply::Get { value, meta } => {
            let kvs: Vec<EtcdKeyValue> = value
                .zip(meta)
                .map(|(value, meta)| key_value(Vec::new(), value, meta, shape))
                .into_iter()
                .collect();
            Ok(Pairs {
                count: kvs.len() as u64,
                kvs,
                more: false,
            })
        }
        Reply::Range {
            entries,
            more,
            count,
        } => Ok(Pairs {
            kvs: entries
                .into_iter()
                .map(|kv| key_value(kv.key, kv.value, kv.meta, shape))
                .collect(),
            more,
            count,
        }),
        Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection)),
        other => Err(EtcdError::Invalid(format!("unexpected reply {other:?}"))),
    }
}

/// The etcd lease of each key `reply` read that has one, from `state`
/// (the node's replies carry no lease).
fn leases_of(
    state: &oncekv_state::StateMachine,
    reply: &Reply,
    asked: &Keys,
) -> BTreeMap<Vec<u8>, i64> {
    let keys: Vec<&[u8]> = match (reply, asked) {
        (Reply::Range { entries, .. }, _) => entries.iter().map(|kv| kv.key.as_slice()).collect(),
        (Reply::Get { value: Some(_), .. }, Keys::One(key)) => vec![key.as_slice()],
        _ => Vec::new(),
    };
    let lease = |key: &[u8]| {
        state
            .kv()
            .get(key)
            .and_then(|stored| stored.lease.as_deref())
            .and_then(lease_id)
    };
    keys.into_iter()
        .filter_map(|key| lease(key).map(|id| (key.to_vec(), id)))
        .collect()
}

/// A Range response from a reply to `parts`' query.
pub(super) fn range_response(reply: Reply, parts: &RangeParts) -> Result<RangeResponse, EtcdError> {
    let Pairs {
        mut kvs,
        mut more,
        count,
    } = pairs_of(reply, parts.shape)?;
    if let Keys::One(key) = &parts.keys {
        for kv in &mut kvs {
            kv.key.clone_from(key);
        }
    }
    // etcd counts every key in the range, before filters and the limit.
    if parts.arrange.needs_all() {
        if more {
            return Err(EtcdError::Unsupported(format!(
                "sorting or filtering more keys than the node's scan maximum ({} of {count})",
                kvs.len()
            )));
        }
        parts.arrange.apply(&mut kvs);
        let limit = usize::try_from(parts.limit).unwrap_or(usize::MAX);
        more = limit > 0 && kvs.len() > limit;
        if more {
            kvs.truncate(limit);
        }
    }
    if parts.shape.count_only {
        kvs.clear();
    }
    Ok(RangeResponse {
        header: None,
        kvs,
        more,
        count: i64::try_from(count).unwrap_or(i64::MAX),
    })
}

/// A compare in the node's terms.
fn compare_of(compare: &EtcdCompare) -> Result<Compare, EtcdError> {
    let (key, scope) = Keys::of(&compare.key, &compare.range_end)?.scoped();
    let op = match compare.result() {
        CompareResult::Equal => CompareOp::Equal,
        CompareResult::NotEqual => CompareOp::NotEqual,
        CompareResult::Less => CompareOp::Less,
        CompareResult::Greater => CompareOp::Greater,
    };
    let number =
        |n: i64| u64::try_from(n).map_err(|_| EtcdError::Invalid(format!("a compare against {n}")));
    let target = match (compare.target(), compare.target_union.clone()) {
        (CompareTarget::Version, Some(TargetUnion::Version(n))) => Target::Version(number(n)?),
        (CompareTarget::Create, Some(TargetUnion::CreateRevision(n))) => {
            Target::CreateRevision(number(n)?)
        }
        (CompareTarget::Mod, Some(TargetUnion::ModRevision(n))) => Target::ModRevision(number(n)?),
        (CompareTarget::Value, Some(TargetUnion::Value(value))) => Target::Value(value),
        // A key's lease is its lease's name, whose order is its etcd ID's
        // (16 hex digits); 0 is no lease.
        (CompareTarget::Lease, Some(TargetUnion::Lease(id))) => match id {
            0 => Target::Lease(None),
            id if id > 0 => Target::Lease(Some(lease_name(id))),
            id => {
                return Err(EtcdError::Invalid(format!(
                    "a compare against lease ID {id}"
                )));
            }
        },
        // An unset target compares against its zero value, as etcd does.
        (CompareTarget::Version, None) => Target::Version(0),
        (CompareTarget::Create, None) => Target::CreateRevision(0),
        (CompareTarget::Mod, None) => Target::ModRevision(0),
        (CompareTarget::Value, None) => Target::Value(Vec::new()),
        (CompareTarget::Lease, None) => Target::Lease(None),
        (target, Some(_)) => {
            return Err(EtcdError::Invalid(format!(
                "a {} compare with a value of another kind",
                target.as_str_name()
            )));
        }
    };
    Ok(Compare {
        key,
        scope,
        target,
        op,
    })
}

/// How one etcd operation of a transaction is carried out: which node
/// operations it became, and how their replies make its response.
enum OpPlan {
    /// A read (one op).
    Range(RangeParts),
    /// A put, after a read of the key when `prev_kv` is asked (1 or 2 ops).
    Put { prev_kv: bool, key: Vec<u8> },
    /// A delete, after a read of the keys when `prev_kv` is asked (1 or 2).
    Delete { prev_kv: bool, keys: Keys },
    /// A nested transaction (one op: the node's nested transaction), and
    /// how to answer each operation of its branches.
    Txn {
        success: Vec<OpPlan>,
        failure: Vec<OpPlan>,
    },
}

impl OpPlan {
    /// Plans `op`, appending its node operations to `ops`.
    fn of(op: &RequestOp, ops: &mut Vec<TxnOp>) -> Result<OpPlan, EtcdError> {
        match &op.request {
            Some(request_op::Request::RequestRange(range)) => {
                let parts = RangeParts::of(range)?;
                ops.push(if parts.revision == 0 {
                    parts.keys.read_op(parts.read_limit())
                } else {
                    TxnOp::RangeAt {
                        range: parts.keys.range(),
                        limit: parts.read_limit(),
                        revision: parts.revision,
                    }
                });
                Ok(OpPlan::Range(parts))
            }
            Some(request_op::Request::RequestPut(put)) => {
                check_put(put)?;
                if put.prev_kv {
                    ops.push(TxnOp::Get {
                        key: put.key.clone(),
                    });
                }
                ops.push(put_op(put));
                Ok(OpPlan::Put {
                    prev_kv: put.prev_kv,
                    key: put.key.clone(),
                })
            }
            Some(request_op::Request::RequestDeleteRange(delete)) => {
                let keys = Keys::of(&delete.key, &delete.range_end)?;
                if delete.prev_kv {
                    ops.push(keys.read_op(0));
                }
                ops.push(keys.delete_op());
                Ok(OpPlan::Delete {
                    prev_kv: delete.prev_kv,
                    keys,
                })
            }
            Some(request_op::Request::RequestTxn(nested)) => {
                let Planned {
                    txn,
                    success,
                    failure,
                } = Planned::of(nested)?;
                ops.push(TxnOp::Txn(txn));
                Ok(OpPlan::Txn { success, failure })
            }
            None => Err(EtcdError::Invalid(
                "a transaction operation with no request".to_string(),
            )),
        }
    }

    /// Its response, from the replies of its node operations.
    fn response(
        &self,
        replies: &mut impl Iterator<Item = Reply>,
    ) -> Result<response_op::Response, EtcdError> {
        let mut next = || {
            replies.next().ok_or_else(|| {
                EtcdError::Invalid("a transaction reply with too few results".to_string())
            })
        };
        Ok(match self {
            OpPlan::Range(parts) => {
                response_op::Response::ResponseRange(range_response(next()?, parts)?)
            }
            OpPlan::Put { prev_kv, key } => {
                let prev_kv = if *prev_kv {
                    let Pairs { mut kvs, .. } = pairs_of(next()?, Shape::default())?;
                    kvs.pop().map(|mut kv| {
                        kv.key.clone_from(key);
                        kv
                    })
                } else {
                    None
                };
                rejected(next()?)?;
                response_op::Response::ResponsePut(PutResponse {
                    header: None,
                    prev_kv,
                })
            }
            OpPlan::Delete { prev_kv, keys } => {
                let mut prev_kvs = Vec::new();
                if *prev_kv {
                    prev_kvs = pairs_of(next()?, Shape::default())?.kvs;
                    if let Keys::One(key) = keys {
                        for kv in &mut prev_kvs {
                            kv.key.clone_from(key);
                        }
                    }
                }
                let deleted = match next()? {
                    Reply::Delete { previous } => u64::from(previous.is_some()),
                    Reply::DeletePrefix { deleted } => deleted,
                    other => return Err(unexpected(other)),
                };
                response_op::Response::ResponseDeleteRange(DeleteRangeResponse {
                    header: None,
                    deleted: i64::try_from(deleted).unwrap_or(i64::MAX),
                    prev_kvs,
                })
            }
            OpPlan::Txn { success, failure } => {
                let (succeeded, responses) = branch_responses(success, failure, next()?)?;
                response_op::Response::ResponseTxn(TxnResponse {
                    header: None,
                    succeeded,
                    responses,
                })
            }
        })
    }
}

/// The etcd responses of the branch of a transaction that ran, from the
/// node's reply to it.
fn branch_responses(
    success: &[OpPlan],
    failure: &[OpPlan],
    reply: Reply,
) -> Result<(bool, Vec<ResponseOp>), EtcdError> {
    let (succeeded, results) = match rejected(reply)? {
        Reply::Txn { succeeded, results } => (succeeded, results),
        other => return Err(unexpected(other)),
    };
    let plans = if succeeded { success } else { failure };
    let mut results = results.into_iter();
    let responses = plans
        .iter()
        .map(|plan| {
            plan.response(&mut results).map(|response| ResponseOp {
                response: Some(response),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((succeeded, responses))
}

/// Puts `header` on every response of a transaction, those of nested
/// transactions' responses included.
fn fill_headers(responses: &mut [ResponseOp], header: ResponseHeader) {
    for response in responses {
        match &mut response.response {
            Some(response_op::Response::ResponseRange(r)) => r.header = Some(header),
            Some(response_op::Response::ResponsePut(r)) => r.header = Some(header),
            Some(response_op::Response::ResponseDeleteRange(r)) => r.header = Some(header),
            Some(response_op::Response::ResponseTxn(r)) => {
                r.header = Some(header);
                fill_headers(&mut r.responses, header);
            }
            None => {}
        }
    }
}

/// The checks etcd makes of a put before proposing it, in its order.
pub(super) fn check_put(put: &PutRequest) -> Result<(), EtcdError> {
    if put.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if put.ignore_value && !put.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if put.ignore_lease && put.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    if put.lease < 0 {
        return Err(EtcdError::Invalid(format!(
            "lease ID {} is negative",
            put.lease
        )));
    }
    Ok(())
}

/// The node's operation a put is: a plain put, or one of an existing key
/// keeping its value or its lease (refused when the key is absent).
fn put_op(put: &PutRequest) -> TxnOp {
    if !(put.ignore_value || put.ignore_lease) {
        return TxnOp::Put {
            key: put.key.clone(),
            value: put.value.clone(),
            lease: lease_of(put),
        };
    }
    TxnOp::PutExisting {
        key: put.key.clone(),
        value: if put.ignore_value {
            Update::Keep
        } else {
            Update::Set(put.value.clone())
        },
        lease: if put.ignore_lease {
            Update::Keep
        } else {
            Update::Set(lease_of(put))
        },
    }
}

/// The node's lease a put attaches its key to.
pub(super) fn lease_of(put: &PutRequest) -> Option<String> {
    (put.lease > 0).then(|| lease_name(put.lease))
}

/// An error if `reply` is a rejection.
pub(super) fn rejected(reply: Reply) -> Result<Reply, EtcdError> {
    match reply {
        Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection)),
        reply => Ok(reply),
    }
}

fn unexpected(reply: Reply) -> EtcdError {
    EtcdError::Invalid(format!("unexpected reply {reply:?}"))
}

/// A transaction of etcd operations, planned: the node's transaction and
/// how to answer each operation of the branch that runs.
pub(super) struct Planned {
    pub(super) txn: Txn,
    success: Vec<OpPlan>,
    failure: Vec<OpPlan>,
}

impl Planned {
    pub(super) fn of(request: &TxnRequest) -> Result<Planned, EtcdError> {
        let mut txn = Txn {
            compare: request
                .compare
                .iter()
                .map(compare_of)
                .collect::<Result<_, _>>()?,
            ..Txn::default()
        };
        let success = request
            .success
            .iter()
            .map(|op| OpPlan::of(op, &mut txn.success))
            .collect::<Result<_, _>>()?;
        let failure = request
            .failure
            .iter()
            .map(|op| OpPlan::of(op, &mut txn.failure))
            .collect::<Result<_, _>>()?;
        Ok(Planned {
            txn,
            success,
            failure,
        })
    }

    /// The etcd responses of the branch that ran, from the node's reply.
    pub(super) fn responses(&self, reply: Reply) -> Result<(bool, Vec<ResponseOp>), EtcdError> {
        branch_responses(&self.success, &self.failure, reply)
    }
}

impl EtcdApi {
    /// Proposes `command` from `request`'s caller and returns its reply
    /// and the revision it was (first) applied at.
    pub(super) async fn write<T>(
        &self,
        request: &tonic::Request<T>,
        command: Command,
    ) -> Result<(Reply, u64), Status> {
        let origin = origin_of(request)?;
        let principal = self.principal(request, true)?;
        let executed = self
            .node
            .execute(Request { origin, command }, principal)
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        match executed.outcome {
            Outcome::Applied(reply) => Ok((reply, executed.index.0)),
            Outcome::Replayed {
                reply,
                applied_index,
            } => Ok((reply, applied_index.0)),
            other => Err(EtcdError::of_outcome(&other).into()),
        }
    }

    /// A KV client of the leader, over `channel`.
    fn leader_kv(&self, channel: tonic::transport::Channel) -> KvClient<tonic::transport::Channel> {
        KvClient::new(channel)
            .max_decoding_message_size(self.message_bytes_max)
            .max_encoding_message_size(self.message_bytes_max)
    }

    /// Carries out `op` alone, as a transaction of the node's operations
    /// (it may need more than one: a read of what it replaces); returns
    /// its response and the revision it was (first) applied at.
    async fn one_op<T>(
        &self,
        request: &tonic::Request<T>,
        op: request_op::Request,
    ) -> Result<(response_op::Response, u64), Status> {
        let planned = Planned::of(&TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp { request: Some(op) }],
            failure: Vec::new(),
        })?;
        let (reply, revision) = self
            .write(request, Command::Txn(planned.txn.clone()))
            .await?;
        let (_, mut responses) = planned.responses(reply)?;
        match responses.pop() {
            Some(ResponseOp {
                response: Some(response),
            }) => Ok((response, revision)),
            _ => Err(EtcdError::Invalid("a transaction without its response".to_string()).into()),
        }
    }

    /// Reads `query` for `request`'s caller; returns the reply and the
    /// revision read at.
    pub(super) async fn read<T>(
        &self,
        request: &tonic::Request<T>,
        query: &Query,
        serializable: bool,
    ) -> Result<(Reply, u64), Status> {
        let principal = self.principal(request, !serializable)?;
        self.node
            .read_at(query, serializable, principal.as_ref())
            .await
            .map_err(|error| error_of(error).into())
    }
}

#[tonic::async_trait]
impl Kv for EtcdApi {
    async fn range(
        &self,
        request: tonic::Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let parts = RangeParts::of(request.get_ref())?;
        let serializable = request.get_ref().serializable;
        if !serializable && let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_kv(channel).range(request).await);
        }
        let query = parts.query();
        let principal = self.principal(&request, !serializable)?;
        let past = parts.revision != 0;
        // etcd refuses a read below its compaction revision, one above the
        // node's (whose own check refuses the rest).
        let compacted = self
            .node
            .consensus()
            .with_state(|state| state.kv().history().compacted());
        if past && parts.revision < super::etcd_compaction(compacted) {
            return Err(EtcdError::Compacted.into());
        }
        let (reply, revision, leases) = self
            .node
            .read_then(&query, serializable, principal.as_ref(), |state, reply| {
                if past {
                    return BTreeMap::new();
                }
                leases_of(state, reply, &parts.keys)
            })
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        let mut response = range_response(reply, &parts)?;
        for kv in &mut response.kvs {
            kv.lease = leases.get(&kv.key).copied().unwrap_or(0);
        }
        response.header = Some(self.header(revision));
        Ok(Response::new(response))
    }

    async fn put(
        &self,
        request: tonic::Request<PutRequest>,
    ) -> Result<Response<PutResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_kv(channel).put(request).await);
        }
        let put = request.get_ref();
        check_put(put)?;
        let (key, value, lease) = (put.key.clone(), put.value.clone(), lease_of(put));
        // A put that needs the key's previous pair, value or lease runs as
        // a transaction that reads or keeps them when it applies.
        if put.prev_kv || put.ignore_value || put.ignore_lease {
            let op = request_op::Request::RequestPut(put.clone());
            let (response, revision) = self.one_op(&request, op).await?;
            let response_op::Response::ResponsePut(mut response) = response else {
                return Err(EtcdError::Invalid("no put response".to_string()).into());
            };
            response.header = Some(self.header(revision));
            return Ok(Response::new(response));
        }
        let (reply, revision) = self
            .write(
                &request,
                Command::Put {
                    key,
                    value: value.into(),
                    lease,
                },
            )
            .await?;
        rejected(reply)?;
        Ok(Response::new(PutResponse {
            header: Some(self.header(revision)),
            prev_kv: None,
        }))
    }

    async fn delete_range(
        &self,
        request: tonic::Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_kv(channel).delete_range(request).await);
        }
        // The previous pairs of a range come from one read, so a delete of
        // more keys than a read holds could not answer them all: refused
        // before anything is proposed.
        let delete = request.get_ref();
        if delete.prev_kv
            && let keys @ (Keys::Prefix(_) | Keys::Range(_)) =
                Keys::of(&delete.key, &delete.range_end)?
        {
            let read = keys.query(0);
            let (reply, _) = self.read(&request, &read, false).await?;
            if matches!(reply, Reply::Range { more: true, .. }) {
                return Err(EtcdError::Unsupported(
                    "prev_kv on a delete of more keys than the node's scan maximum".to_string(),
                )
                .into());
            }
        }
        let op = request_op::Request::RequestDeleteRange(request.get_ref().clone());
        let (response, revision) = self.one_op(&request, op).await?;
        let response_op::Response::ResponseDeleteRange(mut response) = response else {
            return Err(EtcdError::Invalid("no delete response".to_string()).into());
        };
        response.header = Some(self.header(revision));
        Ok(Response::new(response))
    }

    async fn txn(
        &self,
        request: tonic::Request<TxnRequest>,
    ) -> Result<Response<TxnResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_kv(channel).txn(request).await);
        }
        let planned = Planned::of(request.get_ref())?;
        let (reply, revision) = self
            .write(&request, Command::Txn(planned.txn.clone()))
            .await?;
        let (succeeded, mut responses) = planned.responses(reply)?;
        let header = self.header(revision);
        fill_headers(&mut responses, header);
        Ok(Response::new(TxnResponse {
            header: Some(header),
            succeeded,
            responses,
        }))
    }

    async fn compact(
        &self,
        request: tonic::Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_kv(channel).compact(request).await);
        }
        let revision = revision_from_wire(request.get_ref().revision);
        // The node refuses a compaction beyond its revision at apply; etcd's
        // R is the node's R - 1, so R itself must not be beyond it either.
        let current = self.node.status().raft.applied_index.unwrap_or(0);
        if revision > current {
            return Err(EtcdError::FutureRevision.into());
        }
        let compact = Command::Compact {
            revision: super::compaction_to(revision),
        };
        let (reply, applied) = self.write(&request, compact).await?;
        rejected(reply)?;
        Ok(Response::new(CompactionResponse {
            header: Some(self.header(applied)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_a_prefix_or_a_range() {
        assert_eq!(Keys::of(b"a", b""), Ok(Keys::One(b"a".to_vec())));
        assert_eq!(Keys::of(b"a", b"b"), Ok(Keys::Prefix(b"a".to_vec())));
        assert_eq!(
            Keys::of(b"a\xff", b"b"),
            Ok(Keys::Prefix(b"a\xff".to_vec()))
        );
        assert_eq!(Keys::of(b"\0", b"\0"), Ok(Keys::Prefix(Vec::new())));
        assert_eq!(Keys::of(b"\xff", b"\0"), Ok(Keys::Prefix(b"\xff".to_vec())));
        assert_eq!(
            Keys::of(b"b", b"\0"),
            Ok(Keys::Range(KeyRange::from_key(b"b".to_vec())))
        );
        assert_eq!(
            Keys::of(b"a", b"c"),
            Ok(Keys::Range(KeyRange::new(b"a".to_vec(), b"c".to_vec())))
        );
        assert_eq!(Keys::of(b"", b""), Err(EtcdError::EmptyKey));
        // etcd refuses an empty key with an end too (`--from-key ""` and
        // `--prefix ""` send `\0`).
        assert_eq!(Keys::of(b"", b"\0"), Err(EtcdError::EmptyKey));
        assert_eq!(Keys::of(b"", b"c"), Err(EtcdError::EmptyKey));
    }

    #[test]
    fn puts_keeping_value_or_lease_are_checked_as_etcd_checks_them() {
        let put = |value: &[u8], lease, ignore_value, ignore_lease| PutRequest {
            key: b"k".to_vec(),
            value: value.to_vec(),
            lease,
            ignore_value,
            ignore_lease,
            ..PutRequest::default()
        };
        assert_eq!(
            check_put(&put(b"v", 0, true, false)),
            Err(EtcdError::ValueProvided)
        );
        assert_eq!(
            check_put(&put(b"", 7, false, true)),
            Err(EtcdError::LeaseProvided)
        );
        assert_eq!(check_put(&put(b"", 0, true, true)), Ok(()));
        assert_eq!(
            put_op(&put(b"", 7, true, false)),
            TxnOp::PutExisting {
                key: b"k".to_vec(),
                value: Update::Keep,
                lease: Update::Set(Some(lease_name(7))),
            }
        );
        assert_eq!(
            put_op(&put(b"v", 0, false, true)),
            TxnOp::PutExisting {
                key: b"k".to_vec(),
                value: Update::Set(b"v".to_vec()),
                lease: Update::Keep,
            }
        );
    }

    #[test]
    fn lease_compares_name_the_lease() {
        let compare = |id| EtcdCompare {
            key: b"k".to_vec(),
            target: CompareTarget::Lease as i32,
            target_union: Some(TargetUnion::Lease(id)),
            ..EtcdCompare::default()
        };
        let target = |id| compare_of(&compare(id)).map(|c| c.target);
        assert_eq!(target(0), Ok(Target::Lease(None)));
        assert_eq!(target(9), Ok(Target::Lease(Some(lease_name(9)))));
        assert!(matches!(target(-1), Err(EtcdError::Invalid(_))));
        // The names order as the IDs do.
        assert!(lease_name(0x0f) < lease_name(0x10));
        assert!(lease_name(0x10) < lease_name(i64::MAX));
    }

    #[test]
    fn a_nested_transaction_is_the_nodes_nested_transaction() {
        let put = |key: &[u8], prev_kv| RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.to_vec(),
                value: b"v".to_vec(),
                prev_kv,
                ..PutRequest::default()
            })),
        };
        let nested = TxnRequest {
            compare: vec![EtcdCompare {
                key: b"a".to_vec(),
                target: CompareTarget::Version as i32,
                target_union: Some(TargetUnion::Version(0)),
                ..EtcdCompare::default()
            }],
            success: vec![put(b"b", true)],
            failure: vec![put(b"c", false)],
        };
        let planned = Planned::of(&TxnRequest {
            compare: Vec::new(),
            success: vec![
                put(b"a", false),
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(nested)),
                },
            ],
            failure: Vec::new(),
        })
        .unwrap();
        let TxnOp::Txn(inner) = &planned.txn.success[1] else {
            panic!("{:?}", planned.txn);
        };
        // The nested put with prev_kv reads the key in its own branch.
        assert_eq!(inner.success.len(), 2);
        assert_eq!(inner.failure.len(), 1);
        let (succeeded, responses) = planned
            .responses(Reply::Txn {
                succeeded: true,
                results: vec![
                    Reply::Put { previous: None },
                    Reply::Txn {
                        succeeded: true,
                        results: vec![
                            Reply::Get {
                                value: None,
                                meta: None,
                            },
                            Reply::Put { previous: None },
                        ],
                    },
                ],
            })
            .unwrap();
        assert!(succeeded);
        let Some(response_op::Response::ResponseTxn(inner)) = &responses[1].response else {
            panic!("{responses:?}");
        };
        assert!(inner.succeeded);
        assert!(matches!(
            inner.responses[..],
            [ResponseOp {
                response: Some(response_op::Response::ResponsePut(PutResponse {
                    prev_kv: None,
                    ..
                }))
            }]
        ));
    }

    #[test]
    fn a_put_with_prev_kv_reads_the_key_in_the_same_transaction() {
        let planned = Planned::of(&TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    prev_kv: true,
                    ..PutRequest::default()
                })),
            }],
            failure: Vec::new(),
        })
        .unwrap();
        assert_eq!(
            planned.txn.success,
            vec![
                TxnOp::Get { key: b"k".to_vec() },
                TxnOp::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: None
                }
            ]
        );
        let meta = KeyMeta {
            create_revision: 3,
            mod_revision: 5,
            version: 2,
        };
        let (succeeded, responses) = planned
            .responses(Reply::Txn {
                succeeded: true,
                results: vec![
                    Reply::Get {
                        value: Some(b"old".to_vec()),
                        meta: Some(meta),
                    },
                    Reply::Put {
                        previous: Some(b"old".to_vec()),
                    },
                ],
            })
            .unwrap();
        assert!(succeeded);
        let Some(response_op::Response::ResponsePut(put)) = &responses[0].response else {
            panic!("{responses:?}");
        };
        let prev = put.prev_kv.as_ref().unwrap();
        assert_eq!(
            (
                prev.key.as_slice(),
                prev.value.as_slice(),
                prev.mod_revision,
                prev.version
            ),
            (&b"k"[..], &b"old"[..], 5, 2)
        );
    }
}
