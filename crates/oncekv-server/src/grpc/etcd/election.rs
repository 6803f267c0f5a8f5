//! `v3electionpb.Election` as etcd serves it: etcd's own recipe (its
//! client's `concurrency` election), run against this API's KV, in the
//! queue the lock uses (`lock`). Campaign queues `<name>/<lease ID in
//! hex>` with the value (a campaign that finds its key holding another
//! value proclaims its own, as etcd's does) and waits until it is the
//! oldest key under `<name>/`; it answers the leader key (name, key,
//! create revision, lease). Proclaim puts a value at the leader key and
//! Resign deletes it, each only while the key still has the leader key's
//! create revision (else Proclaim answers "election: not leader" and
//! Resign does nothing). Leader reads the oldest key under `<name>/`
//! after a read barrier; Observe streams the leader's pair on every
//! change (a new leader, or a new value) from this replica's applied
//! state, like a watch: the keys under the prefix as of one revision, then
//! every change after it.
//!
//! Campaign, Proclaim, Resign and Leader are carried out by the leader (a
//! follower forwards them); Observe is served by any member.
//!
//! A campaign queues only on a lease its caller owns, checked before it
//! acts, and refuses a key of its name attached to another lease, as a
//! Lock does (`lock`); a Proclaim attaching the key to a lease not the
//! caller's is refused by the state machine ("permission denied").

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::lease::lease_id;
use super::lock::{
    CallerGone, PlaceGuard, Unwaited, call_of, detached, on_create_revision, put_op, queue_key,
    queue_prefix, step_call,
};
use super::{EtcdApi, origin_of, revision_to_wire};
use crate::watch::{PROGRESS_INTERVAL_DEFAULT, WatchMessage, WatchSpec};
use oncekv_proto::etcd::etcdserverpb::{DeleteRangeRequest, ResponseHeader, request_op};
use oncekv_proto::etcd::mvccpb::KeyValue as EtcdKeyValue;
use oncekv_proto::etcd::v3electionpb::election_client::ElectionClient;
use oncekv_proto::etcd::v3electionpb::election_server::Election;
use oncekv_proto::etcd::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use oncekv_state::{Event, Principal, Query, StateMachine, StoredValue};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::codegen::BoxStream;
use tonic::{Response, Status};

/// Leader responses buffered towards one Observe stream.
const OBSERVE_OUTBOX_RESPONSES: usize = 16;

/// Watches of one Observe that may fail to start in a row (their start
/// compacted meanwhile) before the stream ends with an error.
const OBSERVE_STARTS_MAX: u32 = 3;

/// A stored pair as etcd's `KeyValue`.
fn key_value(key: &[u8], stored: &StoredValue) -> EtcdKeyValue {
    EtcdKeyValue {
        key: key.to_vec(),
        create_revision: revision_to_wire(stored.meta.create_revision),
        mod_revision: revision_to_wire(stored.meta.mod_revision),
        version: i64::try_from(stored.meta.version).unwrap_or(i64::MAX),
        value: stored.value.to_vec(),
        lease: stored.lease.as_deref().and_then(lease_id).unwrap_or(0),
    }
}

/// The election's leader in `state`: the oldest key under `prefix`.
fn leader_in(state: &StateMachine, prefix: &[u8]) -> Option<EtcdKeyValue> {
    state
        .kv()
        .iter_prefix(prefix)
        .min_by_key(|(_, stored)| stored.meta.create_revision)
        .map(|(key, stored)| key_value(key, stored))
}

/// The leader key a Proclaim or Resign names.
fn leader_key(leader: Option<LeaderKey>) -> Result<LeaderKey, EtcdError> {
    let leader = leader.ok_or(EtcdError::MissingLeaderKey)?;
    if leader.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    Ok(leader)
}

/// One election as an Observe follows it: the keys under its prefix, as
/// of one revision, with what they hold, and which of them leads.
#[derive(Debug, Default)]
struct Observed {
    keys: BTreeMap<Vec<u8>, Arc<StoredValue>>,
    /// The oldest of `keys` (`None` exactly when there are none).
    leader: Option<Vec<u8>>,
}

impl Observed {
    /// The keys under `prefix` in `state`.
    fn of(state: &StateMachine, prefix: &[u8]) -> Observed {
        let keys: BTreeMap<Vec<u8>, Arc<StoredValue>> = state
            .kv()
            .iter_prefix(prefix)
            .map(|(key, stored)| (key.clone(), Arc::new(stored.clone())))
            .collect();
        let mut observed = Observed { keys, leader: None };
        observed.leader = observed.oldest();
        observed
    }

    fn oldest(&self) -> Option<Vec<u8>> {
        self.keys
            .iter()
            .min_by_key(|(_, stored)| stored.meta.create_revision)
            .map(|(key, _)| key.clone())
    }

    /// The leader's pair.
    fn leader_value(&self) -> Option<EtcdKeyValue> {
        let key = self.leader.as_ref()?;
        self.keys.get(key).map(|stored| key_value(key, stored))
    }

    /// Takes in the next change of a key under the prefix; the leader's
    /// pair if the change is to it (a new value, or a new leader).
    fn apply(&mut self, event: &Event) -> Option<EtcdKeyValue> {
        match &event.value {
            Some(stored) => {
                self.keys.insert(event.key.clone(), Arc::clone(stored));
                // A key created now is the newest: it leads only an
                // election that had no key.
                if self.leader.is_none() {
                    self.leader = Some(event.key.clone());
                }
                (self.leader.as_ref() == Some(&event.key)).then(|| key_value(&event.key, stored))
            }
            None => {
                self.keys.remove(&event.key);
                if self.leader.as_ref() != Some(&event.key) {
                    return None;
                }
                self.leader = self.oldest();
                self.leader_value()
            }
        }
    }
}

/// What an Observe last sent: the key and its mod revision.
type Sent = Option<(Vec<u8>, i64)>;

impl EtcdApi {
    /// An Election client of the leader, over `channel`.
    fn leader_election(
        &self,
        channel: tonic::transport::Channel,
    ) -> ElectionClient<tonic::transport::Channel> {
        ElectionClient::new(channel)
            .max_decoding_message_size(self.message_bytes_max)
            .max_encoding_message_size(self.message_bytes_max)
    }

    /// Puts `value` at `key`, attached to `lease`, if `key` still has
    /// create revision `create_revision`, as `call`'s write; whether it
    /// did, and the response's header.
    async fn proclaim_at(
        &self,
        call: tonic::Request<()>,
        key: &[u8],
        create_revision: u64,
        lease: i64,
        value: Vec<u8>,
    ) -> Result<(bool, Option<ResponseHeader>), Status> {
        let txn = on_create_revision(
            key,
            create_revision,
            vec![put_op(key, value, lease)],
            Vec::new(),
        );
        let answer = self.kv_txn(call, txn).await?;
        Ok((answer.succeeded, answer.header))
    }

    /// The election under `prefix` as this replica holds it now, and a
    /// watch (which `principal` must be allowed) of every change after.
    fn observe_from_now(
        &self,
        prefix: &[u8],
        principal: Option<&Principal>,
    ) -> Result<(Observed, u64, mpsc::Receiver<WatchMessage>), Status> {
        let (observed, revision) = self.node.consensus().with_state(|state| {
            let revision = state.last_applied().map_or(0, |index| index.0);
            (Observed::of(state, prefix), revision)
        });
        let spec = WatchSpec {
            key: prefix.to_vec(),
            scope: oncekv_state::KeyScope::Prefix,
            start_revision: revision.saturating_add(1),
            previous: false,
            progress_interval: PROGRESS_INTERVAL_DEFAULT,
        };
        let changes = self
            .node
            .watch(spec, principal)
            .map_err(|error| Status::from(error_of(error)))?;
        Ok((observed, revision, changes))
    }

    /// Sends `kv` at `revision` on `outbox` unless it is what was sent
    /// last; `Err` once the caller is gone.
    async fn send_leader(
        &self,
        outbox: &mpsc::Sender<Result<LeaderResponse, Status>>,
        sent: &mut Sent,
        revision: u64,
        kv: EtcdKeyValue,
    ) -> Result<(), ()> {
        let this = Some((kv.key.clone(), kv.mod_revision));
        if *sent == this {
            return Ok(());
        }
        *sent = this;
        let response = LeaderResponse {
            header: Some(self.header(revision)),
            kv: Some(kv),
        };
        outbox.send(Ok(response)).await.map_err(drop)
    }

    /// Streams the leader of the election under `prefix` to `outbox`
    /// until the caller goes away: now, then on every change. A watch cut
    /// off (too slow, or a snapshot replaced the state) starts over from
    /// the state then, sending the leader again only if it changed.
    async fn observe_leaders(
        self,
        prefix: Vec<u8>,
        principal: Option<Principal>,
        first: (Observed, u64, mpsc::Receiver<WatchMessage>),
        outbox: mpsc::Sender<Result<LeaderResponse, Status>>,
    ) {
        let mut sent: Sent = None;
        let mut next = Some(first);
        let mut failed_starts = 0u32;
        loop {
            let (mut observed, revision, mut changes) = match next.take() {
                Some(started) => started,
                None => match self.observe_from_now(&prefix, principal.as_ref()) {
                    Ok(started) => started,
                    Err(status) => {
                        let _ = outbox.send(Err(status)).await;
                        return;
                    }
                },
            };
            if let Some(kv) = observed.leader_value()
                && self
                    .send_leader(&outbox, &mut sent, revision, kv)
                    .await
                    .is_err()
            {
                return;
            }
            let mut started = false;
            loop {
                let change = tokio::select! {
                    change = changes.recv() => change,
                    () = outbox.closed() => return,
                };
                match change {
                    Some(WatchMessage::Started { .. }) => {
                        started = true;
                        failed_starts = 0;
                    }
                    Some(WatchMessage::Events(events)) => {
                        for event in &events {
                            if let Some(kv) = observed.apply(event)
                                && self
                                    .send_leader(&outbox, &mut sent, event.revision, kv)
                                    .await
                                    .is_err()
                            {
                                return;
                            }
                        }
                    }
                    Some(WatchMessage::Progress(_)) => {}
                    Some(WatchMessage::Canceled { compacted, .. }) if !started => {
                        failed_starts = failed_starts.saturating_add(1);
                        // Not compacted: refused, the node serves its most
                        // watchers. Compacted: the history moved on between
                        // the look and the watch; look again, a few times.
                        let error = if compacted == 0 {
                            EtcdError::TooManyRequests("watchers")
                        } else if failed_starts >= OBSERVE_STARTS_MAX {
                            EtcdError::Compacted
                        } else {
                            break;
                        };
                        let _ = outbox.send(Err(error.into())).await;
                        return;
                    }
                    Some(WatchMessage::Canceled { .. }) => break,
                    // The node stopped serving watches: the stream ends,
                    // as etcd's does when its watch ends.
                    None => return,
                }
            }
        }
    }
}

impl EtcdApi {
    /// A Campaign, at the leader: the lease (when none is given), the key
    /// queued with the value, then the wait for its turn, while the
    /// caller is there.
    async fn queue_for_election(
        self,
        request: tonic::Request<CampaignRequest>,
        principal: Option<Principal>,
        gone: CallerGone,
    ) -> Result<Response<CampaignResponse>, Status> {
        let asked = request.get_ref();
        let lease = self
            .session_lease(&request, principal.as_ref(), asked.lease, "campaign-lease")
            .await?;
        let prefix = queue_prefix(&asked.name);
        let key = queue_key(&prefix, lease);
        let joined = self
            .join_queue(
                call_of(&request),
                prefix,
                key.clone(),
                lease,
                asked.value.clone(),
            )
            .await?;
        let guard = PlaceGuard::new(&self, &request, &joined.place);
        let create_revision = joined.place.create_revision;
        if joined
            .existing
            .as_ref()
            .is_some_and(|value| *value != asked.value)
        {
            let call = step_call(&request, "campaign-proclaim");
            let (held, _) = self
                .proclaim_at(call, &key, create_revision, lease, asked.value.clone())
                .await?;
            if !held {
                return Err(EtcdError::ElectionNotLeader.into());
            }
        }
        let waited = tokio::select! {
            waited = self.wait_for_turn(&joined.place, principal.as_ref()) => waited,
            // The guard, dropped, gives the place up (etcd's campaign
            // resigns when its caller goes away).
            _ = gone => return Err(Status::cancelled("the caller went away")),
        };
        match waited {
            Ok(_) => {
                guard.keep();
                Ok(Response::new(CampaignResponse {
                    // etcd's: the header of the campaign's transaction.
                    header: Some(self.header(joined.revision)),
                    leader: Some(LeaderKey {
                        name: asked.name.clone(),
                        key,
                        rev: revision_to_wire(create_revision),
                        lease,
                    }),
                }))
            }
            Err(Unwaited::Lost) => {
                guard.keep();
                Err(EtcdError::ElectionNotLeader.into())
            }
            Err(Unwaited::Failed(status)) => Err(status),
        }
    }
}

#[tonic::async_trait]
impl Election for EtcdApi {
    async fn campaign(
        &self,
        request: tonic::Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_election(channel).campaign(request).await);
        }
        // A malformed idempotency key is refused before anything is written.
        origin_of(&request)?;
        let principal = self.principal(&request, true)?;
        let slot = self.waiter_slot(&request, principal.as_ref())?;
        let api = self.clone();
        detached(move |gone| async move {
            let _waiting = slot;
            api.queue_for_election(request, principal, gone).await
        })
        .await
    }

    async fn proclaim(
        &self,
        request: tonic::Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_election(channel).proclaim(request).await);
        }
        let call = call_of(&request);
        let asked = request.into_inner();
        let leader = leader_key(asked.leader)?;
        // No key is created at revision 0 or below: no one leads with it.
        let Some(create_revision) = u64::try_from(leader.rev).ok().filter(|rev| *rev > 0) else {
            return Err(EtcdError::ElectionNotLeader.into());
        };
        if leader.lease < 0 {
            return Err(EtcdError::LeaseNotFound.into());
        }
        let (held, header) = self
            .proclaim_at(
                call,
                &leader.key,
                create_revision,
                leader.lease,
                asked.value,
            )
            .await?;
        if !held {
            return Err(EtcdError::ElectionNotLeader.into());
        }
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: tonic::Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_election(channel).leader(request).await);
        }
        let principal = self.principal(&request, true)?;
        let prefix = queue_prefix(&request.get_ref().name);
        // The scan checks the caller may read the prefix; the leader is
        // found among every key under it.
        let scan = Query::Scan {
            prefix: prefix.clone(),
            limit: 1,
        };
        let (_, revision, leader) = self
            .node
            .read_then(&scan, false, principal.as_ref(), |state, _| {
                leader_in(state, &prefix)
            })
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        let kv = leader.ok_or(EtcdError::ElectionNoLeader)?;
        Ok(Response::new(LeaderResponse {
            header: Some(self.header(revision)),
            kv: Some(kv),
        }))
    }

    async fn observe(
        &self,
        request: tonic::Request<LeaderRequest>,
    ) -> Result<Response<BoxStream<LeaderResponse>>, Status> {
        // Served by any member, from its applied state, as watches are.
        let principal = self.principal(&request, false)?;
        let prefix = queue_prefix(&request.get_ref().name);
        // The first look answers the call: a refusal is its error.
        let first = self.observe_from_now(&prefix, principal.as_ref())?;
        let (outbox, responses) = mpsc::channel(OBSERVE_OUTBOX_RESPONSES);
        tokio::spawn(
            self.clone()
                .observe_leaders(prefix, principal, first, outbox),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(responses),
        )))
    }

    async fn resign(
        &self,
        request: tonic::Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_election(channel).resign(request).await);
        }
        let call = call_of(&request);
        let leader = leader_key(request.into_inner().leader)?;
        // A revision of 0 or below matches only an absent key: nothing is
        // deleted, as on etcd.
        let create_revision = u64::try_from(leader.rev).unwrap_or(0);
        let delete = request_op::Request::RequestDeleteRange(DeleteRangeRequest {
            key: leader.key.clone(),
            ..DeleteRangeRequest::default()
        });
        let txn = on_create_revision(&leader.key, create_revision, vec![delete], Vec::new());
        let answer = self.kv_txn(call, txn).await?;
        Ok(Response::new(ResignResponse {
            header: answer.header,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_state::{ClusterTime, KeyMeta};

    fn stored(value: &str, create_revision: u64, mod_revision: u64) -> Arc<StoredValue> {
        Arc::new(StoredValue {
            value: value.as_bytes().to_vec().into(),
            lease: None,
            meta: KeyMeta {
                create_revision,
                mod_revision,
                version: 1,
            },
        })
    }

    fn put(key: &str, value: &str, create_revision: u64, revision: u64) -> Event {
        Event {
            revision,
            time: ClusterTime(0),
            key: key.as_bytes().to_vec(),
            value: Some(stored(value, create_revision, revision)),
            previous: None,
        }
    }

    fn delete(key: &str, revision: u64) -> Event {
        Event {
            value: None,
            ..put(key, "", 0, revision)
        }
    }

    fn value_of(kv: Option<EtcdKeyValue>) -> Option<String> {
        kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
    }

    #[test]
    fn an_observer_sees_the_oldest_key_and_its_every_value() {
        let mut observed = Observed::default();
        assert_eq!(observed.leader_value(), None);
        // The first campaigner leads; its proclamations are seen.
        assert_eq!(
            value_of(observed.apply(&put("e/a", "a0", 3, 3))),
            Some("a0".into())
        );
        // A second campaigner waits: nothing to tell.
        assert_eq!(observed.apply(&put("e/b", "b0", 5, 5)), None);
        assert_eq!(
            value_of(observed.apply(&put("e/a", "a1", 3, 6))),
            Some("a1".into())
        );
        // A waiter's change is not the leader's.
        assert_eq!(observed.apply(&put("e/b", "b1", 5, 7)), None);
        // The leader resigns: the next oldest leads, with its value now.
        assert_eq!(
            value_of(observed.apply(&delete("e/a", 8))),
            Some("b1".into())
        );
        assert_eq!(observed.leader.as_deref(), Some(&b"e/b"[..]));
        // A waiter leaving changes nothing; the last leaving leaves none.
        assert_eq!(observed.apply(&put("e/c", "c0", 9, 9)), None);
        assert_eq!(observed.apply(&delete("e/c", 10)), None);
        assert_eq!(observed.apply(&delete("e/b", 11)), None);
        assert_eq!(observed.leader, None);
        assert_eq!(
            value_of(observed.apply(&put("e/d", "d0", 12, 12))),
            Some("d0".into())
        );
    }

    #[test]
    fn the_recipes_errors_are_etcds() {
        let answered = |error: EtcdError| {
            let status = Status::from(error);
            (status.code(), status.message().to_string())
        };
        let unknown = |text: &str| (tonic::Code::Unknown, text.to_string());
        assert_eq!(
            answered(EtcdError::ElectionNotLeader),
            unknown("election: not leader")
        );
        assert_eq!(
            answered(EtcdError::ElectionNoLeader),
            unknown("election: no leader")
        );
        assert_eq!(
            answered(EtcdError::SessionExpired),
            unknown("mutex: session is expired")
        );
        assert_eq!(
            answered(EtcdError::MissingLeaderKey),
            unknown("\"leader\" field must be provided")
        );
    }

    #[test]
    fn proclaim_and_resign_need_a_leader_key() {
        assert_eq!(leader_key(None), Err(EtcdError::MissingLeaderKey));
        let empty = LeaderKey::default();
        assert_eq!(leader_key(Some(empty)), Err(EtcdError::EmptyKey));
        let held = LeaderKey {
            key: b"e/1".to_vec(),
            rev: 4,
            ..LeaderKey::default()
        };
        assert_eq!(leader_key(Some(held.clone())), Ok(held));
    }
}
