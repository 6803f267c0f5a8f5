//! `etcdserverpb.Watch` onto the node's watches: one bidirectional stream
//! multiplexes any number of watches, each a native watch
//! ([`Node::watch_as`](crate::node::Node::watch_as)) of one key or a key
//! range (a prefix is one) whose messages are turned into etcd's responses
//! under its watch ID: created, events (with `prev_kv` and the NOPUT /
//! NODELETE filters), progress notices (with `progress_notify`), and
//! cancellation (asked for, or from the node: a compacted start revision
//! answers `compact_revision`, as etcd's does; a range whose end is not
//! above its start is refused as etcd refuses it, created and cancelled at
//! once under watch ID -1).
//!
//! A progress request is answered with the lowest revision every running
//! watch of the stream has sent everything up to (watch ID -1), so the
//! promise it makes holds for each of them.
//!
//! Bounds ([`crate::watch`]): the stream's unsent responses are counted in
//! bytes (their keys and values, and an overhead per event and response)
//! against [`WATCH_STREAM_BYTES_MAX`], with the user's other streams
//! against the user's share of the node's
//! ([`WatchBounds::user_bytes_max`](crate::watch::WatchBounds::user_bytes_max)),
//! and with every client's against the node's. A watch whose response
//! would pass any while the stream holds unsent ones is cancelled: its
//! own unsent events are dropped (their memory freed) and it is
//! `canceled` with a `cancel_reason` naming the bound and the revision to
//! resume from; the stream's other watches go on. A stream multiplexes at
//! most [`WATCHES_PER_STREAM_MAX`](crate::watch::WATCHES_PER_STREAM_MAX)
//! watches, a user holds at most its share of the node's watchers
//! ([`WatchBounds::user_watchers_max`](crate::watch::WatchBounds::user_watchers_max)):
//! one more is created and cancelled at once, the reason naming the cap.
//! A watch whose user loses the right to it is cancelled with the
//! text etcd refuses such a call with: `etcdserver: permission denied`
//! (a revoked role or permission), or `etcdserver: invalid auth token`
//! (a changed password, a deleted user, an expired token: etcd's clients
//! log in again on it).

use super::errors::{EtcdError, error_of};
use super::kv::Keys;
use super::lease::lease_id;
use super::{EtcdApi, credentials_of, revision_from_wire, revision_to_wire};
use crate::auth::Credentials;
use crate::watch::{
    Bound, Holder, MESSAGE_OVERHEAD_BYTES, PROGRESS_INTERVAL_DEFAULT, Refused,
    WATCH_STREAM_BYTES_MAX, WatchError, WatchMessage, WatchOwner, WatchSpec,
};
use futures_util::StreamExt;
use oncekv_proto::etcd::etcdserverpb::watch_create_request::FilterType;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::watch_server::Watch;
use oncekv_proto::etcd::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use oncekv_proto::etcd::mvccpb::event::EventType;
use oncekv_proto::etcd::mvccpb::{Event as EtcdEvent, KeyValue as EtcdKeyValue};
use oncekv_state::{Event, StoredValue};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;
use tonic::codegen::BoxStream;
use tonic::{Response, Status};

/// The responses queued towards one stream, bounded in bytes.
type Outbox = crate::watch::Outbox<WatchResponse>;

/// Numbers the watch streams of this node (each one's cap is its own).
static STREAMS: AtomicU64 = AtomicU64::new(0);

/// The watches of one stream: each one's task, and the revision it has
/// sent everything up to.
#[derive(Default)]
struct Watches {
    running: BTreeMap<i64, (JoinHandle<()>, Arc<AtomicU64>)>,
    next_id: i64,
}

impl Watches {
    /// The ID a new watch gets: the one asked for if free, else the next
    /// free one from 0.
    fn id_for(&mut self, asked: i64) -> Option<i64> {
        if asked != 0 {
            return (!self.running.contains_key(&asked)).then_some(asked);
        }
        while self.running.contains_key(&self.next_id) {
            self.next_id = self.next_id.checked_add(1)?;
        }
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1)?;
        Some(id)
    }

    /// Forgets the watches that ended (cancelled by the node): their IDs
    /// are free again, as on etcd.
    fn forget_ended(&mut self) {
        self.running.retain(|_, (task, _)| !task.is_finished());
    }

    /// The revision every running watch has sent everything up to.
    fn progress(&self) -> Option<u64> {
        self.running
            .values()
            .filter(|(task, _)| !task.is_finished())
            .map(|(_, sent)| sent.load(Ordering::Relaxed))
            .min()
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for (task, _) in self.running.values() {
            task.abort();
        }
    }
}

/// What a response weighs in the stream's queue.
fn response_bytes(response: &WatchResponse) -> usize {
    let kv = |kv: &Option<EtcdKeyValue>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len());
    MESSAGE_OVERHEAD_BYTES
        + response.cancel_reason.len()
        + response
            .events
            .iter()
            .map(|event| MESSAGE_OVERHEAD_BYTES + kv(&event.kv) + kv(&event.prev_kv))
            .sum::<usize>()
}

/// The revision of a response's first event, if it has any.
fn first_revision(response: &WatchResponse) -> Option<u64> {
    let kv = response.events.first()?.kv.as_ref()?;
    Some(revision_from_wire(kv.mod_revision))
}

/// Queues `response` once the stream has room; `Err` once the client is
/// gone.
async fn reply(outbox: &Outbox, response: WatchResponse) -> Result<(), ()> {
    let bytes = response_bytes(&response);
    outbox.send(response, bytes).await.map_err(drop)
}

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

/// One change as etcd's event, if the watch's filters let it through.
fn event_of(event: &Event, create: &WatchCreateRequest) -> Option<EtcdEvent> {
    let filtered = |filter: FilterType| create.filters.contains(&(filter as i32));
    let (kind, kv) = match &event.value {
        Some(stored) => {
            if filtered(FilterType::Noput) {
                return None;
            }
            (EventType::Put, key_value(&event.key, stored))
        }
        None => {
            if filtered(FilterType::Nodelete) {
                return None;
            }
            let kv = EtcdKeyValue {
                key: event.key.clone(),
                mod_revision: revision_to_wire(event.revision),
                ..EtcdKeyValue::default()
            };
            (EventType::Delete, kv)
        }
    };
    let prev_kv = if create.prev_kv {
        event
            .previous
            .as_deref()
            .map(|stored| key_value(&event.key, stored))
    } else {
        None
    };
    Some(EtcdEvent {
        r#type: kind as i32,
        kv: Some(kv),
        prev_kv,
    })
}

/// One watch's side of the stream: what it queued, and how it ends.
struct Sending {
    api: EtcdApi,
    id: i64,
    outbox: Outbox,
    /// Whether its `created` response was queued.
    created: bool,
    /// The revision it has sent everything up to.
    progress: Arc<AtomicU64>,
}

impl Sending {
    /// Queues `response` if the stream has room; a full stream cancels
    /// this watch. `Err` once the watch ends.
    fn send(&mut self, response: WatchResponse) -> Result<(), ()> {
        let bytes = response_bytes(&response);
        let first = first_revision(&response);
        match self.outbox.try_send(response, bytes) {
            Ok(()) => Ok(()),
            Err(Refused::Gone) => Err(()),
            Err(Refused::Full(bound)) => {
                self.cancel_full(&bound, first);
                Err(())
            }
        }
    }

    /// Cancels this watch at a bound: its unsent events are dropped, and
    /// the reason names the bound and the first revision it did not get
    /// (`first`: that of the response that did not fit, if any).
    fn cancel_full(&mut self, bound: &Bound, first: Option<u64>) {
        let id = self.id;
        let dropped = self
            .outbox
            .take_where(|response| response.watch_id == id && !response.events.is_empty());
        let next = dropped
            .iter()
            .filter_map(first_revision)
            .chain(first)
            .min()
            .unwrap_or_else(|| self.progress.load(Ordering::Relaxed).saturating_add(1));
        self.progress
            .store(next.saturating_sub(1), Ordering::Relaxed);
        metrics::counter!("oncekv_watches_canceled_total", "reason" => "unread").increment(1);
        let reason = format!("{}; resume from revision {next}", bound.reason());
        self.last(next.saturating_sub(1), reason, 0);
    }

    /// Queues the watch's cancellation whatever the bounds (its `created`
    /// first, if it was not: etcd's clients wait for it before anything
    /// else of a watch).
    fn last(&mut self, revision: u64, reason: String, compacted: u64) {
        if !self.created {
            let mut response = self.api.watch_response(self.id, compacted);
            response.created = true;
            let bytes = response_bytes(&response);
            if self.outbox.force(response, bytes).is_err() {
                return;
            }
            self.created = true;
        }
        let mut response = self.api.watch_response(self.id, revision);
        response.canceled = true;
        if compacted > 0 {
            response.compact_revision = revision_to_wire(super::etcd_compaction(compacted));
        }
        response.cancel_reason = reason;
        let bytes = response_bytes(&response);
        let _ = self.outbox.force(response, bytes);
    }
}

impl EtcdApi {
    /// A response of watch `id` at `revision`.
    fn watch_response(&self, id: i64, revision: u64) -> WatchResponse {
        WatchResponse {
            header: Some(self.header(revision)),
            watch_id: id,
            ..WatchResponse::default()
        }
    }

    /// Starts watch `id` of `create` for `owner` (calling with
    /// `credentials`), answering on `outbox`; returns its task and the
    /// revision it has sent up to, or why it was refused (the
    /// cancellation's reason).
    async fn start_watch(
        &self,
        id: i64,
        create: WatchCreateRequest,
        credentials: &Credentials,
        owner: &WatchOwner,
        outbox: Outbox,
    ) -> Result<(JoinHandle<()>, Arc<AtomicU64>), String> {
        let refused = |error: EtcdError| Status::from(error).message().to_string();
        let (key, scope) = Keys::of(&create.key, &create.range_end)
            .map_err(refused)?
            .scoped();
        let spec = WatchSpec {
            key,
            scope,
            start_revision: revision_from_wire(create.start_revision),
            previous: create.prev_kv,
            progress_interval: PROGRESS_INTERVAL_DEFAULT,
        };
        let mut messages = match self.node.watch_as(spec, credentials, owner) {
            Ok(messages) => messages,
            Err(WatchError::Refused(error)) => return Err(refused(error_of(error))),
            Err(WatchError::Capped(cap)) => return Err(cap.to_string()),
        };
        let sent = Arc::new(AtomicU64::new(0));
        let mut sending = Sending {
            api: self.clone(),
            id,
            outbox,
            created: false,
            progress: Arc::clone(&sent),
        };
        // As etcd: a stream's watches answer "created" in the order they
        // were asked (a client that lets the server choose the ids matches
        // them so), so this one's is sent before the next request is read.
        let mut first = messages.recv().await;
        let mut gone = false;
        if let Some(WatchMessage::Started { revision }) = first {
            first = None;
            let mut response = sending.api.watch_response(id, revision);
            response.created = true;
            gone = sending.send(response).is_err();
            sending.created = !gone;
        }
        let task = tokio::spawn(async move {
            if gone {
                return;
            }
            while let Some(message) = match first.take() {
                Some(message) => Some(message),
                None => messages.recv().await,
            } {
                let response = match message {
                    WatchMessage::Started { revision } => {
                        let mut response = sending.api.watch_response(id, revision);
                        response.created = true;
                        if sending.send(response).is_err() {
                            return;
                        }
                        sending.created = true;
                        continue;
                    }
                    WatchMessage::Events(events) => {
                        let Some(revision) = events.last().map(|event| event.revision) else {
                            continue;
                        };
                        let events: Vec<EtcdEvent> = events
                            .iter()
                            .filter_map(|event| event_of(event, &create))
                            .collect();
                        let response = (!events.is_empty()).then(|| WatchResponse {
                            events,
                            ..sending.api.watch_response(id, revision)
                        });
                        sending.progress.store(revision, Ordering::Relaxed);
                        response
                    }
                    WatchMessage::Progress(revision) => {
                        sending.progress.store(revision, Ordering::Relaxed);
                        create
                            .progress_notify
                            .then(|| sending.api.watch_response(id, revision))
                    }
                    WatchMessage::Canceled {
                        reason,
                        compacted,
                        denied,
                    } => {
                        let reason = match denied {
                            // As etcd refuses a call of a user without the
                            // right: its clients match the text.
                            Some(error) => refused(error_of(error)),
                            None if compacted > 0 => {
                                "etcdserver: mvcc: required revision has been compacted".to_string()
                            }
                            None => reason,
                        };
                        let revision = sending.progress.load(Ordering::Relaxed);
                        sending.last(revision, reason, compacted);
                        return;
                    }
                };
                if let Some(response) = response
                    && sending.send(response).is_err()
                {
                    return;
                }
            }
        });
        Ok((task, sent))
    }

    /// Serves one request of a watch stream.
    async fn on_watch_request(
        &self,
        request: WatchRequest,
        credentials: &Credentials,
        owner: &WatchOwner,
        watches: &Mutex<Watches>,
        outbox: &Outbox,
    ) -> Result<(), ()> {
        let response = match request.request_union {
            Some(RequestUnion::CreateRequest(mut create)) => {
                if create.key.is_empty() {
                    // As etcd: `\0`, the first key (a Range refuses an
                    // empty key; a watch does not).
                    create.key = vec![0];
                }
                if let Ok(Keys::Range(range)) = Keys::of(&create.key, &create.range_end)
                    && range.is_empty()
                {
                    // etcd refuses an empty range before it picks an ID.
                    let status = tonic::Status::from(EtcdError::EmptyWatchRange);
                    let mut response = self.watch_response(-1, 0);
                    response.created = true;
                    response.canceled = true;
                    response.cancel_reason = status.message().to_string();
                    return reply(outbox, response).await;
                }
                let asked = create.watch_id;
                let id = {
                    let mut watches = crate::sync::lock(watches);
                    watches.forget_ended();
                    watches.id_for(asked)
                };
                let Some(id) = id else {
                    let mut response = self.watch_response(asked, 0);
                    response.created = true;
                    response.canceled = true;
                    response.cancel_reason = "etcdserver: duplicate watch ID".to_string();
                    return reply(outbox, response).await;
                };
                match self
                    .start_watch(id, create, credentials, owner, outbox.clone())
                    .await
                {
                    Ok(running) => {
                        crate::sync::lock(watches).running.insert(id, running);
                        return Ok(());
                    }
                    Err(reason) => {
                        let mut response = self.watch_response(id, 0);
                        response.created = true;
                        response.canceled = true;
                        response.cancel_reason = reason;
                        response
                    }
                }
            }
            Some(RequestUnion::CancelRequest(cancel)) => {
                let removed = crate::sync::lock(watches).running.remove(&cancel.watch_id);
                let Some((task, sent)) = removed else {
                    return Ok(());
                };
                task.abort();
                let mut response =
                    self.watch_response(cancel.watch_id, sent.load(Ordering::Relaxed));
                response.canceled = true;
                response
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                let applied = self.node.status().raft.applied_index.unwrap_or(0);
                let revision = crate::sync::lock(watches).progress().unwrap_or(applied);
                self.watch_response(-1, revision)
            }
            None => return Ok(()),
        };
        reply(outbox, response).await
    }
}

#[tonic::async_trait]
impl Watch for EtcdApi {
    async fn watch(
        &self,
        request: tonic::Request<tonic::Streaming<WatchRequest>>,
    ) -> Result<Response<BoxStream<WatchResponse>>, Status> {
        // Watches are served by any member, from its applied state; they
        // count against the stream's cap and its user's (with
        // authentication off, its source address's).
        let credentials = credentials_of(&request);
        let address = request.remote_addr();
        let stream = Holder::Stream(STREAMS.fetch_add(1, Ordering::Relaxed));
        let owner = self
            .node
            .watch_owner(&credentials, address, Some(stream))
            .map_err(super::errors::status_of)?;
        let mut requests = request.into_inner();
        let (outbox, responses) = crate::watch::queue(WATCH_STREAM_BYTES_MAX, owner.user.clone());
        let api = self.clone();
        tokio::spawn(async move {
            let watches = Mutex::new(Watches::default());
            loop {
                let request = tokio::select! {
                    request = requests.message() => request,
                    () = outbox.closed() => return,
                };
                let request = match request {
                    Ok(Some(request)) => request,
                    // The client is done: its watches end with the stream.
                    Ok(None) | Err(_) => return,
                };
                if api
                    .on_watch_request(request, &credentials, &owner, &watches, &outbox)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(responses.into_stream().map(Ok))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watch_ids_are_the_asked_one_or_the_next_free() {
        let mut watches = Watches::default();
        let running = || (tokio::spawn(async {}), Arc::default());
        assert_eq!(watches.id_for(0), Some(0));
        watches.running.insert(0, running());
        watches.running.insert(1, running());
        assert_eq!(watches.id_for(0), Some(2));
        assert_eq!(watches.id_for(7), Some(7));
        watches.running.insert(7, running());
        // An ID in use is refused.
        assert_eq!(watches.id_for(7), None);
    }

    #[test]
    fn filters_and_prev_kv_shape_events() {
        let stored = |value: &str| {
            Arc::new(StoredValue {
                value: value.as_bytes().to_vec().into(),
                lease: None,
                meta: oncekv_state::KeyMeta {
                    create_revision: 2,
                    mod_revision: 5,
                    version: 2,
                },
            })
        };
        let put = Event {
            revision: 5,
            time: oncekv_state::ClusterTime(0),
            key: b"k".to_vec(),
            value: Some(stored("new")),
            previous: Some(stored("old")),
        };
        let delete = Event {
            revision: 6,
            value: None,
            ..put.clone()
        };
        let plain = WatchCreateRequest::default();
        let event = event_of(&put, &plain).expect("a put");
        assert_eq!(event.r#type, EventType::Put as i32);
        assert_eq!(event.prev_kv, None);
        let event = event_of(&delete, &plain).expect("a delete");
        assert_eq!(event.r#type, EventType::Delete as i32);
        assert_eq!(event.kv.map(|kv| kv.mod_revision), Some(6));
        let with_prev = WatchCreateRequest {
            prev_kv: true,
            ..WatchCreateRequest::default()
        };
        let event = event_of(&put, &with_prev).expect("a put");
        assert_eq!(event.prev_kv.map(|kv| kv.value), Some(b"old".to_vec()));
        let no_put = WatchCreateRequest {
            filters: vec![FilterType::Noput as i32],
            ..WatchCreateRequest::default()
        };
        assert!(event_of(&put, &no_put).is_none());
        assert!(event_of(&delete, &no_put).is_some());
    }
}
