//! `etcdserverpb.Watch` onto the node's watches: one bidirectional stream
//! multiplexes any number of watches, each a native watch
//! ([`Node::watch`](crate::node::Node::watch)) of one key or a key range
//! (a prefix is one) whose messages are turned into etcd's responses under its watch ID:
//! created, events (with `prev_kv` and the NOPUT / NODELETE filters),
//! progress notices (with `progress_notify`), and cancellation (asked for,
//! or from the node: a compacted start revision answers
//! `compact_revision`, as etcd's does; a range whose end is not above its
//! start is refused as etcd refuses it, created and cancelled at once
//! under watch ID -1).
//!
//! A progress request is answered with the lowest revision every watch of
//! the stream has sent everything up to (watch ID -1), so the promise it
//! makes holds for each of them.

use super::errors::{EtcdError, error_of};
use super::kv::Keys;
use super::lease::lease_id;
use super::{EtcdApi, revision_from_wire, revision_to_wire};
use crate::watch::{PROGRESS_INTERVAL_DEFAULT, WatchMessage, WatchSpec};
use oncekv_proto::etcd::etcdserverpb::watch_create_request::FilterType;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::watch_server::Watch;
use oncekv_proto::etcd::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use oncekv_proto::etcd::mvccpb::event::EventType;
use oncekv_proto::etcd::mvccpb::{Event as EtcdEvent, KeyValue as EtcdKeyValue};
use oncekv_state::{Event, Principal, StoredValue};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::codegen::BoxStream;
use tonic::{Response, Status};

/// Responses buffered towards one stream.
const OUTBOX_RESPONSES: usize = 64;

type Outbox = mpsc::Sender<Result<WatchResponse, Status>>;

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

    /// The revision every watch has sent everything up to.
    fn progress(&self) -> Option<u64> {
        self.running
            .values()
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

fn key_value(key: &[u8], stored: &StoredValue) -> EtcdKeyValue {
    EtcdKeyValue {
        key: key.to_vec(),
        create_revision: revision_to_wire(stored.meta.create_revision),
        mod_revision: revision_to_wire(stored.meta.mod_revision),
        version: i64::try_from(stored.meta.version).unwrap_or(i64::MAX),
        value: stored.value.clone(),
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

impl EtcdApi {
    /// A response of watch `id` at `revision`.
    fn watch_response(&self, id: i64, revision: u64) -> WatchResponse {
        WatchResponse {
            header: Some(self.header(revision)),
            watch_id: id,
            ..WatchResponse::default()
        }
    }

    /// Starts watch `id` of `create` for `principal`, answering on
    /// `outbox`; returns its task and the revision it has sent up to.
    fn start_watch(
        &self,
        id: i64,
        create: WatchCreateRequest,
        principal: Option<&Principal>,
        outbox: Outbox,
    ) -> Result<(JoinHandle<()>, Arc<AtomicU64>), EtcdError> {
        let (key, scope) = Keys::of(&create.key, &create.range_end)?.scoped();
        let spec = WatchSpec {
            key,
            scope,
            start_revision: revision_from_wire(create.start_revision),
            previous: create.prev_kv,
            progress_interval: PROGRESS_INTERVAL_DEFAULT,
        };
        let mut messages = self.node.watch(spec, principal).map_err(error_of)?;
        let sent = Arc::new(AtomicU64::new(0));
        let progress = Arc::clone(&sent);
        let api = self.clone();
        let task = tokio::spawn(async move {
            let mut created = false;
            while let Some(message) = messages.recv().await {
                let (response, last) = match message {
                    WatchMessage::Started { revision } => {
                        created = true;
                        let mut response = api.watch_response(id, revision);
                        response.created = true;
                        (Some(response), false)
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
                            ..api.watch_response(id, revision)
                        });
                        progress.store(revision, Ordering::Relaxed);
                        (response, false)
                    }
                    WatchMessage::Progress(revision) => {
                        progress.store(revision, Ordering::Relaxed);
                        let response = create
                            .progress_notify
                            .then(|| api.watch_response(id, revision));
                        (response, false)
                    }
                    WatchMessage::Canceled { reason, compacted } => {
                        // etcd's clients wait for the creation before
                        // anything else of a watch: a watch cancelled at
                        // once (a compacted start) is created first.
                        if !created {
                            let mut response = api.watch_response(id, compacted);
                            response.created = true;
                            if outbox.send(Ok(response)).await.is_err() {
                                return;
                            }
                        }
                        let mut response = api.watch_response(id, progress.load(Ordering::Relaxed));
                        response.canceled = true;
                        if compacted > 0 {
                            response.compact_revision = revision_to_wire(compacted);
                            response.cancel_reason =
                                "etcdserver: mvcc: required revision has been compacted"
                                    .to_string();
                        } else {
                            response.cancel_reason = reason;
                        }
                        (Some(response), true)
                    }
                };
                if let Some(response) = response
                    && outbox.send(Ok(response)).await.is_err()
                {
                    return;
                }
                if last {
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
        principal: Option<&Principal>,
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
                    return outbox.send(Ok(response)).await.map_err(drop);
                }
                let asked = create.watch_id;
                let id = crate::sync::lock(watches).id_for(asked);
                let Some(id) = id else {
                    let mut response = self.watch_response(asked, 0);
                    response.created = true;
                    response.canceled = true;
                    response.cancel_reason = "etcdserver: duplicate watch ID".to_string();
                    return outbox.send(Ok(response)).await.map_err(drop);
                };
                match self.start_watch(id, create, principal, outbox.clone()) {
                    Ok(running) => {
                        crate::sync::lock(watches).running.insert(id, running);
                        return Ok(());
                    }
                    Err(error) => {
                        let status = tonic::Status::from(error);
                        let mut response = self.watch_response(id, 0);
                        response.created = true;
                        response.canceled = true;
                        response.cancel_reason = status.message().to_string();
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
        outbox.send(Ok(response)).await.map_err(drop)
    }
}

#[tonic::async_trait]
impl Watch for EtcdApi {
    async fn watch(
        &self,
        request: tonic::Request<tonic::Streaming<WatchRequest>>,
    ) -> Result<Response<BoxStream<WatchResponse>>, Status> {
        // Watches are served by any member, from its applied state.
        let principal = self.principal(&request, false)?;
        let mut requests = request.into_inner();
        let (outbox, responses) = mpsc::channel(OUTBOX_RESPONSES);
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
                    .on_watch_request(request, principal.as_ref(), &watches, &outbox)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(responses),
        )))
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
                value: value.as_bytes().to_vec(),
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
