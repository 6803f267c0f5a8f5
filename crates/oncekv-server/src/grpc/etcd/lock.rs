//! `v3lockpb.Lock` as etcd serves it: etcd's own recipe (its client's
//! `concurrency` mutex), run by the leader against this API's KV. Lock
//! puts `<name>/<lease ID in hex>` attached to the lease unless that key
//! exists (one transaction), then waits until no key under `<name>/` was
//! created before it, and answers the key; Unlock deletes a key. A Lock
//! without a lease gets one of etcd's default session TTL (60 s), which
//! nothing keeps alive.
//!
//! This module also owns the queue both recipes wait in (the election's,
//! `election`, too): a [`Place`] is a key under a prefix, and its turn
//! comes when it is the oldest key there. The wait is a watch of the
//! prefix on this replica's applied state; each change re-reads who is
//! ahead. A place whose key is deleted first (its lease expired or was
//! revoked) ends the wait with an error, never a hang. The writes of a
//! call run to their end in a task of its own ([`detached`]), so a call
//! dropped meanwhile still knows its key: it ends its watch and deletes
//! its key (if still the one it queued), as etcd's recipe does, unless the
//! call carries the idempotency metadata: then the key is left for its
//! resend, which finds it (the key follows from the lease) and waits on.
//!
//! A call with the idempotency metadata is deduplicated write by write:
//! the queueing transaction under the caller's key, a lease granted for
//! it under a key derived from it ([`step_call`]), so a resend queues the
//! same key once and waits for the same turn.
//!
//! Both recipes queue only on a lease their caller owns, and check it
//! before acting ([`EtcdApi::session_lease`]): a lease given must be the
//! caller's (or the caller an admin), else the call is refused
//! ("permission denied") before anything is written, and the state
//! machine refuses to attach the key to it all the same; a lease granted
//! for the call is the caller's by the grant (a grant of an ID another
//! user holds is refused, never taken as this caller's). A queue key found
//! existing must be attached to that same lease ([`EtcdApi::join_queue`]),
//! else the call is refused: a key on a lease the caller does not hold
//! would be freed whenever that lease's owner lets it go, making two
//! holders.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered, caller_address};
use super::{EtcdApi, origin_of, revision_from_wire, revision_to_wire};
use crate::watch::{PROGRESS_INTERVAL_DEFAULT, WatchMessage, WatchSpec};
use oncekv_proto::IDEMPOTENCY_KEY_METADATA;
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_server::Kv;
use oncekv_proto::etcd::etcdserverpb::lease_server::Lease;
use oncekv_proto::etcd::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, TxnResponse, request_op, response_op,
};
use oncekv_proto::etcd::v3lockpb::lock_client::LockClient;
use oncekv_proto::etcd::v3lockpb::lock_server::Lock;
use oncekv_proto::etcd::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use oncekv_state::Principal;
use sha2::{Digest, Sha256};
use std::future::Future;
use tokio::sync::oneshot;
use tonic::metadata::MetadataValue;
use tonic::{Response, Status};

/// The TTL, in seconds, of the lease a Lock or Campaign without one is
/// given: etcd's default for its concurrency sessions.
pub(super) const SESSION_TTL_SECONDS: i64 = 60;

/// The prefix of the queue named `name`: `name/`, as etcd's recipes
/// name it.
pub(super) fn queue_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The key a holder of `lease` queues with under `prefix`: the prefix and
/// the lease ID in lowercase hex, without padding (etcd's `%x`).
pub(super) fn queue_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// `request`'s metadata and extensions (who calls, and how the call is
/// deduplicated), for a write made on its behalf.
pub(super) fn call_of<T>(request: &tonic::Request<T>) -> tonic::Request<()> {
    tonic::Request::from_parts(request.metadata().clone(), request.extensions().clone(), ())
}

/// [`call_of`] for one more write of a call that writes more than once:
/// its idempotency key, if it has one, is replaced by one derived from it
/// and `step` (`<step>:<SHA-256 of the key, in hex>`, within the key's
/// length limit), so each write is deduplicated on its own and a resend
/// of the call repeats none.
pub(super) fn step_call<T>(request: &tonic::Request<T>, step: &str) -> tonic::Request<()> {
    let mut call = call_of(request);
    let metadata = call.metadata_mut();
    if let Some(key) = metadata.get(IDEMPOTENCY_KEY_METADATA) {
        let derived = format!("{step}:{}", hex::encode(Sha256::digest(key.as_bytes())));
        match derived.parse::<MetadataValue<_>>() {
            Ok(value) => {
                metadata.insert(IDEMPOTENCY_KEY_METADATA, value);
            }
            // Hex is always a valid value; were it not, the step would be
            // a plain write rather than one under the caller's key.
            Err(_) => {
                metadata.remove(IDEMPOTENCY_KEY_METADATA);
            }
        }
    }
    call
}

/// A transaction of one compare of `key`'s create revision with
/// `create_revision` (0: the key is absent), then `success` or `failure`.
pub(super) fn on_create_revision(
    key: &[u8],
    create_revision: u64,
    success: Vec<request_op::Request>,
    failure: Vec<request_op::Request>,
) -> TxnRequest {
    let ops = |requests: Vec<request_op::Request>| {
        requests
            .into_iter()
            .map(|request| RequestOp {
                request: Some(request),
            })
            .collect()
    };
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: key.to_vec(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::CreateRevision(revision_to_wire(
                create_revision,
            ))),
        }],
        success: ops(success),
        failure: ops(failure),
    }
}

/// A put of `value` at `key`, attached to `lease` (0: none).
pub(super) fn put_op(key: &[u8], value: Vec<u8>, lease: i64) -> request_op::Request {
    request_op::Request::RequestPut(PutRequest {
        key: key.to_vec(),
        value,
        lease,
        ..PutRequest::default()
    })
}

/// A key in a queue of keys under a prefix: its turn comes when no key
/// under the prefix was created before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Place {
    /// The queue's prefix.
    pub(super) prefix: Vec<u8>,
    /// The key.
    pub(super) key: Vec<u8>,
    /// The key's create revision: its rank in the queue.
    pub(super) create_revision: u64,
    /// The revision of the write that queued it (or found it queued): a
    /// replica that has not applied it yet cannot tell where it stands.
    pub(super) queued_at: u64,
}

/// What queueing found.
#[derive(Clone, Debug)]
pub(super) struct Joined {
    /// The place held.
    pub(super) place: Place,
    /// The revision the queueing transaction was applied at.
    pub(super) revision: u64,
    /// The value the key held already, if it existed (then it was kept,
    /// and so was its place).
    pub(super) existing: Option<Vec<u8>>,
}

/// Where a place stands in its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// First: no key under the prefix is older (as of this revision).
    First(u64),
    /// Behind an older key.
    Behind,
    /// Not known yet: this replica has not applied the queueing write.
    Unknown,
    /// Its key is gone, or was created again (another place).
    Lost,
}

/// How a wait for a turn ended without it.
#[derive(Debug)]
pub(super) enum Unwaited {
    /// The place's key was deleted first (its lease expired or was
    /// revoked, or someone deleted it).
    Lost,
    /// The wait could not go on (the error to answer).
    Failed(Status),
}

/// Resolves once the caller of a call run by [`detached`] has gone away
/// (it dropped the call).
pub(super) type CallerGone = oneshot::Receiver<()>;

/// Most Lock and Campaign calls one user (with authentication off: one
/// source address) has waiting on a node at once: a quarter of the client
/// port's default in-flight cap, so one caller's waits never hold every
/// slot. One more is refused with `etcdserver: too many requests`
/// before anything is written.
pub const WAITERS_PER_USER_MAX: usize = 256;

/// The Lock and Campaign calls waiting on this node, by caller.
#[derive(Debug, Default)]
pub(super) struct Waiters(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl Waiters {
    /// A place for one more waiting call of `caller`, unless it has
    /// [`WAITERS_PER_USER_MAX`] already.
    fn take(waiters: &std::sync::Arc<Waiters>, caller: String) -> Option<WaiterSlot> {
        let mut counts = crate::sync::lock(&waiters.0);
        let count = counts.entry(caller.clone()).or_insert(0);
        if *count >= WAITERS_PER_USER_MAX {
            return None;
        }
        *count += 1;
        Some(WaiterSlot {
            waiters: std::sync::Arc::clone(waiters),
            caller,
        })
    }
}

/// One waiting call's place in [`Waiters`], given back when dropped.
pub(super) struct WaiterSlot {
    waiters: std::sync::Arc<Waiters>,
    caller: String,
}

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        let mut counts = crate::sync::lock(&self.waiters.0);
        if let Some(count) = counts.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.caller);
            }
        }
    }
}

impl EtcdApi {
    /// A place for `request`'s wait among its caller's (`principal`, or
    /// with authentication off its source address: for a call a member
    /// forwarded, the address it names), or the refusal once the caller
    /// has [`WAITERS_PER_USER_MAX`] waiting.
    pub(super) fn waiter_slot<T>(
        &self,
        request: &tonic::Request<T>,
        principal: Option<&Principal>,
    ) -> Result<WaiterSlot, Status> {
        Waiters::take(&self.waiters, waiting_caller(request, principal))
            .ok_or_else(|| EtcdError::TooManyRequests("lock and campaign waiters").into())
    }
}

/// Whose waits `request` counts among: `principal`'s, or with
/// authentication off its source address (for a call a member forwarded,
/// the address the member names).
fn waiting_caller<T>(request: &tonic::Request<T>, principal: Option<&Principal>) -> String {
    match (principal, caller_address(request)) {
        (Some(principal), _) => format!("user {}", principal.0),
        (None, Some(address)) => format!("address {address}"),
        (None, None) => "unknown".to_string(),
    }
}

/// Runs `work` in a task of its own and answers with its result. A caller
/// that goes away does not cut `work` short in the middle of a write
/// (its outcome would be lost, and with it what to clean up): `work` runs
/// its writes to their end, learns of it through its [`CallerGone`] and
/// ends.
pub(super) async fn detached<T, F>(work: impl FnOnce(CallerGone) -> F) -> Result<T, Status>
where
    F: Future<Output = Result<T, Status>> + Send + 'static,
    T: Send + 'static,
{
    // Held here, so dropped with this future: then `gone` resolves.
    let (_present, gone) = oneshot::channel::<()>();
    match tokio::spawn(work(gone)).await {
        Ok(result) => result,
        // The task panicked or the runtime is shutting down: what it did
        // is not known.
        Err(_) => Err(EtcdError::Timeout.into()),
    }
}

/// A place whose call may still end without its turn. Dropped while
/// armed (the caller went away, or the wait failed), it deletes its key
/// if the key is still the one queued, as etcd's recipes do; [`keep`]
/// disarms it.
///
/// [`keep`]: PlaceGuard::keep
pub(super) struct PlaceGuard {
    api: EtcdApi,
    /// The call to delete with (its credentials; an armed guard's call
    /// has no idempotency key); `None` once disarmed.
    call: Option<tonic::Request<()>>,
    place: Place,
}

impl PlaceGuard {
    /// A guard of `place`, queued by `request`: armed unless the call
    /// carries the idempotency metadata (its resend will want the place).
    pub(super) fn new<T>(api: &EtcdApi, request: &tonic::Request<T>, place: &Place) -> PlaceGuard {
        let keyed = request.metadata().contains_key(IDEMPOTENCY_KEY_METADATA);
        PlaceGuard {
            api: api.clone(),
            call: (!keyed).then(|| call_of(request)),
            place: place.clone(),
        }
    }

    /// Disarms it: the place is the caller's to release.
    pub(super) fn keep(mut self) {
        self.call = None;
    }
}

impl Drop for PlaceGuard {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Dropped outside a runtime (never, in the server): the lease
        // frees the key.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let api = self.api.clone();
        let delete = on_create_revision(
            &self.place.key,
            self.place.create_revision,
            vec![request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: self.place.key.clone(),
                    ..DeleteRangeRequest::default()
                },
            )],
            Vec::new(),
        );
        let key = String::from_utf8_lossy(&self.place.key).into_owned();
        runtime.spawn(async move {
            if let Err(status) = Kv::txn(&api, call.map(|()| delete)).await {
                tracing::debug!(
                    %key,
                    %status,
                    "an abandoned waiter's key was not deleted; its lease will free it"
                );
            }
        });
    }
}

impl EtcdApi {
    /// A Lock client of the leader, over `channel`.
    fn leader_lock(
        &self,
        channel: tonic::transport::Channel,
    ) -> LockClient<tonic::transport::Channel> {
        LockClient::new(channel)
            .max_decoding_message_size(self.message_bytes_max)
            .max_encoding_message_size(self.message_bytes_max)
    }

    /// The lease a Lock or Campaign of `request` (by `principal`) queues
    /// with: `asked`, unless this leader's state shows it is not the
    /// caller's to use (another user's; an admin may use any), which the
    /// state machine checks again, and decides, when the key is attached
    /// to it; or, when `asked` is 0, a lease of [`SESSION_TTL_SECONDS`]
    /// granted as its write `step` (see [`step_call`]), the caller's by
    /// that grant. A negative ID names no lease.
    pub(super) async fn session_lease<T>(
        &self,
        request: &tonic::Request<T>,
        principal: Option<&Principal>,
        asked: i64,
        step: &str,
    ) -> Result<i64, Status> {
        if asked > 0 {
            let name = super::lease::lease_name(asked);
            self.node.consensus().with_state(|state| {
                // A lease this state does not hold yet (a new leader that
                // has not applied its grant) is left to the state machine,
                // which refuses the queueing put if it is unknown there too.
                match state.leases().get(&name) {
                    Some(lease) if !state.auth().may_use_lease(principal, lease.owner.as_ref()) => {
                        Err(EtcdError::PermissionDenied)
                    }
                    _ => Ok(()),
                }
            })?;
            return Ok(asked);
        }
        if asked < 0 {
            return Err(EtcdError::LeaseNotFound.into());
        }
        let grant = step_call(request, step).map(|()| LeaseGrantRequest {
            ttl: SESSION_TTL_SECONDS,
            id: 0,
        });
        // Granted (or this very grant answered again): the caller's. An ID
        // that exists is refused, never taken.
        Ok(Lease::lease_grant(self, grant).await?.into_inner().id)
    }

    /// Runs `txn` as `call`'s write, through this API's KV.
    pub(super) async fn kv_txn(
        &self,
        call: tonic::Request<()>,
        txn: TxnRequest,
    ) -> Result<TxnResponse, Status> {
        Ok(Kv::txn(self, call.map(|()| txn)).await?.into_inner())
    }

    /// Queues `key` under `prefix`: puts it with `value`, attached to
    /// `lease`, unless it exists (then it keeps its value and place), in
    /// one transaction as `call`'s write. A key that exists attached to
    /// another lease than `lease` is refused: it is not this caller's
    /// place.
    pub(super) async fn join_queue(
        &self,
        call: tonic::Request<()>,
        prefix: Vec<u8>,
        key: Vec<u8>,
        lease: i64,
        value: Vec<u8>,
    ) -> Result<Joined, Status> {
        let read = request_op::Request::RequestRange(RangeRequest {
            key: key.clone(),
            ..RangeRequest::default()
        });
        let txn = on_create_revision(&key, 0, vec![put_op(&key, value, lease)], vec![read]);
        let answer = self.kv_txn(call, txn).await?;
        let revision = answer
            .header
            .map(|header| revision_from_wire(header.revision))
            .unwrap_or(0);
        let (create_revision, existing) = if answer.succeeded {
            // Created by this transaction: at its revision.
            (revision, None)
        } else {
            let found = answer
                .responses
                .into_iter()
                .find_map(|op| match op.response {
                    Some(response_op::Response::ResponseRange(range)) => {
                        range.kvs.into_iter().next()
                    }
                    _ => None,
                })
                .ok_or_else(|| {
                    EtcdError::Invalid("a queued key that is neither new nor found".to_string())
                })?;
            let create_revision = revision_from_wire(found.create_revision);
            self.check_queued_on(&key, create_revision, lease)?;
            (create_revision, Some(found.value))
        };
        if create_revision == 0 {
            return Err(EtcdError::Invalid("a queued key without a revision".to_string()).into());
        }
        Ok(Joined {
            place: Place {
                prefix,
                key,
                create_revision,
                queued_at: revision,
            },
            revision,
            existing,
        })
    }

    /// Checks that `key`, found queued with `create_revision`, is attached
    /// to `lease`, on this leader's applied state (which holds the
    /// queueing transaction it answered; a range inside a transaction does
    /// not show etcd lease IDs). A key gone or created again since is left
    /// to the wait, which finds it lost.
    fn check_queued_on(&self, key: &[u8], create_revision: u64, lease: i64) -> Result<(), Status> {
        let name = super::lease::lease_name(lease);
        let foreign = self.node.consensus().with_state(|state| {
            state.kv().get(key).is_some_and(|stored| {
                stored.meta.create_revision == create_revision
                    && stored.lease.as_deref() != Some(name.as_str())
            })
        });
        if foreign {
            return Err(EtcdError::Invalid(format!(
                "queue key {:?} exists attached to another lease than {lease:x}: it is not this caller's",
                String::from_utf8_lossy(key)
            ))
            .into());
        }
        Ok(())
    }

    /// Where `place` stands, on this replica's applied state now.
    fn turn(&self, place: &Place) -> Turn {
        self.node.consensus().with_state(|state| {
            let applied = state.last_applied().map_or(0, |index| index.0);
            if applied < place.queued_at {
                return Turn::Unknown;
            }
            let kv = state.kv();
            let held = kv
                .get(&place.key)
                .is_some_and(|stored| stored.meta.create_revision == place.create_revision);
            if !held {
                return Turn::Lost;
            }
            let behind = kv
                .iter_prefix(&place.prefix)
                .any(|(_, stored)| stored.meta.create_revision < place.create_revision);
            if behind {
                Turn::Behind
            } else {
                Turn::First(applied)
            }
        })
    }

    /// Waits until `place` is the oldest key under its prefix, watching the
    /// prefix (which `principal` must be allowed to read); returns the
    /// revision it was seen first at. Keys are only ever created after
    /// `place`'s, so once no older key is left, none comes back: each
    /// change re-reads the state, and the watch delivers every change
    /// after the one it started at.
    pub(super) async fn wait_for_turn(
        &self,
        place: &Place,
        principal: Option<&Principal>,
    ) -> Result<u64, Unwaited> {
        let spec = WatchSpec {
            key: place.prefix.clone(),
            scope: oncekv_state::KeyScope::Prefix,
            start_revision: 0,
            previous: false,
            progress_interval: PROGRESS_INTERVAL_DEFAULT,
        };
        loop {
            let mut changes = self
                .node
                .watch(spec.clone(), principal)
                .map_err(|error| Unwaited::Failed(error_of(error).into()))?;
            let mut started = false;
            loop {
                match changes.recv().await {
                    // Every message is a fresh look: a progress notice
                    // too, for a replica that was behind the queueing.
                    Some(
                        WatchMessage::Started { .. }
                        | WatchMessage::Events(_)
                        | WatchMessage::Progress(_),
                    ) => {
                        started = true;
                        match self.turn(place) {
                            Turn::First(revision) => return Ok(revision),
                            Turn::Lost => return Err(Unwaited::Lost),
                            Turn::Behind | Turn::Unknown => {}
                        }
                    }
                    // Refused at once: the node serves its most watchers.
                    Some(WatchMessage::Canceled { .. }) if !started => {
                        return Err(Unwaited::Failed(
                            EtcdError::TooManyRequests("watchers").into(),
                        ));
                    }
                    // Cut off (too slow, or a snapshot replaced the
                    // state): a new watch from now, and a fresh look.
                    Some(WatchMessage::Canceled { .. }) => break,
                    // The node stopped serving watches (it is stopping);
                    // the place was queued and stays.
                    None => return Err(Unwaited::Failed(EtcdError::Timeout.into())),
                }
            }
        }
    }
}

impl EtcdApi {
    /// A Lock, at the leader: the lease (when none is given), the key
    /// queued, then the wait for its turn, while the caller is there.
    async fn queue_for_lock(
        self,
        request: tonic::Request<LockRequest>,
        principal: Option<Principal>,
        gone: CallerGone,
    ) -> Result<Response<LockResponse>, Status> {
        let asked = request.get_ref();
        let lease = self
            .session_lease(&request, principal.as_ref(), asked.lease, "lock-lease")
            .await?;
        let prefix = queue_prefix(&asked.name);
        let key = queue_key(&prefix, lease);
        let joined = self
            .join_queue(call_of(&request), prefix, key.clone(), lease, Vec::new())
            .await?;
        let guard = PlaceGuard::new(&self, &request, &joined.place);
        let waited = tokio::select! {
            waited = self.wait_for_turn(&joined.place, principal.as_ref()) => waited,
            // The guard, dropped, gives the place up.
            _ = gone => return Err(Status::cancelled("the caller went away")),
        };
        match waited {
            Ok(revision) => {
                guard.keep();
                Ok(Response::new(LockResponse {
                    header: Some(self.header(revision)),
                    key,
                }))
            }
            Err(Unwaited::Lost) => {
                guard.keep();
                Err(EtcdError::SessionExpired.into())
            }
            Err(Unwaited::Failed(status)) => Err(status),
        }
    }
}

#[tonic::async_trait]
impl Lock for EtcdApi {
    async fn lock(
        &self,
        request: tonic::Request<LockRequest>,
    ) -> Result<Response<LockResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lock(channel).lock(request).await);
        }
        // A malformed idempotency key is refused before anything is written.
        origin_of(&request)?;
        let principal = self.principal(&request, true)?;
        let slot = self.waiter_slot(&request, principal.as_ref())?;
        let api = self.clone();
        detached(move |gone| async move {
            let _waiting = slot;
            api.queue_for_lock(request, principal, gone).await
        })
        .await
    }

    async fn unlock(
        &self,
        request: tonic::Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lock(channel).unlock(request).await);
        }
        let (metadata, extensions, unlock) = request.into_parts();
        let delete = DeleteRangeRequest {
            key: unlock.key,
            ..DeleteRangeRequest::default()
        };
        let deleted = Kv::delete_range(
            self,
            tonic::Request::from_parts(metadata, extensions, delete),
        )
        .await?
        .into_inner();
        Ok(Response::new(UnlockResponse {
            header: deleted.header,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_waits_in_at_most_its_share_of_places() {
        let waiters = std::sync::Arc::new(Waiters::default());
        let mut held: Vec<WaiterSlot> = (0..WAITERS_PER_USER_MAX)
            .map(|_| Waiters::take(&waiters, "user alice".into()).expect("a place"))
            .collect();
        assert!(Waiters::take(&waiters, "user alice".into()).is_none());
        // Another caller is not held up by alice's waits.
        let bob = Waiters::take(&waiters, "user bob".into()).expect("bob's place");
        // A wait that ends gives its place back.
        held.pop();
        assert!(Waiters::take(&waiters, "user alice".into()).is_some());
        drop(held);
        drop(bob);
        assert!(crate::sync::lock(&waiters.0).is_empty());
    }

    #[test]
    fn a_forwarded_wait_counts_against_the_caller_the_member_names() {
        use super::super::forward::{FORWARDED_BY_METADATA, FORWARDED_FOR_METADATA, Forwarded};
        let mut direct = tonic::Request::new(());
        direct
            .metadata_mut()
            .insert(FORWARDED_FOR_METADATA, "10.0.0.7".parse().unwrap());
        direct
            .metadata_mut()
            .insert(FORWARDED_BY_METADATA, "2".parse().unwrap());
        // Named by a caller itself, not by a member the peer port
        // authenticated: not heeded.
        assert_eq!(waiting_caller(&direct, None), "unknown");
        let mut forwarded = direct;
        forwarded.extensions_mut().insert(Forwarded {
            by: 2,
            caller: "10.0.0.7".parse().ok(),
            certificate_user: None,
            certificate_serial: None,
        });
        assert_eq!(waiting_caller(&forwarded, None), "address 10.0.0.7");
        let alice = Principal("alice".into());
        assert_eq!(waiting_caller(&forwarded, Some(&alice)), "user alice");
    }

    #[test]
    fn queue_keys_are_etcds() {
        let prefix = queue_prefix(b"jobs");
        assert_eq!(prefix, b"jobs/");
        assert_eq!(
            queue_key(&prefix, 0x694d_7ccb_0b35_a10b),
            b"jobs/694d7ccb0b35a10b"
        );
        assert_eq!(queue_key(&prefix, 10), b"jobs/a");
        assert_eq!(queue_key(&queue_prefix(b""), 1), b"/1");
    }

    #[test]
    fn each_step_of_a_keyed_call_has_a_key_of_its_own() {
        let keyed = |key: &str| {
            let mut request = tonic::Request::new(());
            request
                .metadata_mut()
                .insert(IDEMPOTENCY_KEY_METADATA, key.parse().expect("metadata"));
            request
        };
        let key_of = |call: &tonic::Request<()>| {
            call.metadata()
                .get(IDEMPOTENCY_KEY_METADATA)
                .map(|value| value.as_bytes().to_vec())
        };
        let long = "k".repeat(128);
        let first = step_call(&keyed(&long), "lock-lease");
        let again = step_call(&keyed(&long), "lock-lease");
        let other = step_call(&keyed(&long), "campaign-lease");
        let derived = key_of(&first).expect("a derived key");
        assert_eq!(Some(derived.clone()), key_of(&again));
        assert_ne!(Some(derived.clone()), key_of(&other));
        assert!(derived.len() <= oncekv_state::IdempotencyKey::BYTES_MAX);
        assert_ne!(
            key_of(&step_call(&keyed("a"), "s")),
            key_of(&step_call(&keyed("b"), "s"))
        );
        // The call's own write keeps the caller's key; a plain call stays
        // plain.
        assert_eq!(key_of(&call_of(&keyed("a"))), Some(b"a".to_vec()));
        assert_eq!(key_of(&step_call(&tonic::Request::new(()), "s")), None);
    }

    #[test]
    fn queueing_compares_the_create_revision() {
        let txn = on_create_revision(
            b"q/1",
            0,
            vec![put_op(b"q/1", b"v".to_vec(), 1)],
            Vec::new(),
        );
        assert_eq!(txn.compare.len(), 1);
        assert_eq!(
            txn.compare[0].target_union,
            Some(TargetUnion::CreateRevision(0))
        );
        assert_eq!(txn.compare[0].target, CompareTarget::Create as i32);
        assert_eq!(txn.success.len(), 1);
        assert!(txn.failure.is_empty());
    }
}
