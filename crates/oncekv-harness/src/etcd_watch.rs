//! Watchers through etcd's v3 API, as Kubernetes' reflectors run them,
//! and the reference read of the committed changes over etcd's Watch.
//!
//! A reflector lists the resources (in pages, at one revision), then
//! watches their prefix from the revision after the list's, with
//! `progress_notify` and a progress request every second. A stream that
//! breaks is opened again, at the next member, from the revision after
//! the last one it was given everything through; a start revision
//! compacted away ends the watcher (`Compacted`) and the reflector lists
//! again, as a new watcher. Each records what it is given, as the native
//! watchers do (`watchers`), for the watch checker.
//!
//! What a response promises: a response with events, everything through
//! its last event's revision (an etcd catching up a watcher may send
//! events of several revisions under a later header revision); a response
//! without events that neither creates nor cancels (a progress notice),
//! everything through its header revision.

use crate::etcd_resources::{list, prefix_end};
use crate::etcd_workload::channel;
use crate::recorder::Recorder;
use crate::watchers::{
    REFERENCE_STALL, ReferenceRead, Updates, read_reference, record_reference, unpack,
};
use oncekv_check::record::{Bytes, WatchEnd, WatcherId};
use oncekv_client::{ClientError, Event, EventKind, WatchUpdate};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    StatusRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use oncekv_proto::etcd::mvccpb::event::EventType;
use oncekv_state::{KeyMeta, Rejection};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// How often a reflector asks for progress.
const REFLECTOR_PROGRESS: Duration = Duration::from_secs(1);

/// How often the reference read asks for progress.
const REFERENCE_PROGRESS: Duration = Duration::from_millis(200);

/// The pause before a watch is opened again after it broke.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// One watch stream of etcd's API, opened on its first read.
pub(crate) struct EtcdUpdates {
    address: String,
    create: WatchCreateRequest,
    every: Duration,
    open: Option<Open>,
}

/// An open stream.
struct Open {
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
    progress: tokio::time::Interval,
}

impl EtcdUpdates {
    /// A watch of every key under `prefix` from revision `from`, through
    /// the member at `address`, asking for progress every `every`.
    pub(crate) fn new(address: &str, prefix: &[u8], from: u64, every: Duration) -> Self {
        EtcdUpdates {
            address: address.to_string(),
            create: WatchCreateRequest {
                key: prefix.to_vec(),
                range_end: prefix_end(prefix),
                start_revision: i64::try_from(from).unwrap_or(i64::MAX),
                progress_notify: true,
                ..WatchCreateRequest::default()
            },
            every,
            open: None,
        }
    }

    async fn open(&self) -> Result<Open, ClientError> {
        let channel = channel(&self.address).map_err(ClientError::Unreachable)?;
        let (requests, outgoing) = mpsc::channel(8);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(self.create.clone())),
        };
        requests
            .send(create)
            .await
            .map_err(|_| ClientError::Unreachable("the watch stream closed".into()))?;
        let responses = WatchClient::new(channel)
            .watch(ReceiverStream::new(outgoing))
            .await
            .map_err(|status| ClientError::Unreachable(status.message().to_string()))?
            .into_inner();
        let mut progress = tokio::time::interval(self.every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Open {
            requests,
            responses,
            progress,
        })
    }

    /// What `response` gives, if anything.
    fn update(&self, response: WatchResponse) -> Result<Option<WatchUpdate>, ClientError> {
        if response.canceled {
            let reason = response.cancel_reason;
            if response.compact_revision > 0 {
                // etcd's compaction revision is the lowest one kept; the
                // record's, the highest one dropped.
                let lowest_kept = u64::try_from(response.compact_revision).unwrap_or(0);
                return Err(ClientError::Rejected(Rejection::Compacted {
                    revision: u64::try_from(self.create.start_revision).unwrap_or(0),
                    compacted: lowest_kept.saturating_sub(1),
                }));
            }
            if reason.contains("permission denied") {
                return Err(ClientError::PermissionDenied(reason));
            }
            return Err(ClientError::Unreachable(format!(
                "watch cancelled: {reason}"
            )));
        }
        if response.created {
            return Ok(None);
        }
        let revision_of = |revision: i64| u64::try_from(revision).unwrap_or(0);
        if response.events.is_empty() {
            let revision = response
                .header
                .map_or(0, |header| revision_of(header.revision));
            return Ok(Some(WatchUpdate::Progress(revision)));
        }
        let events: Vec<Event> = response
            .events
            .into_iter()
            .filter_map(|event| {
                let kind = match EventType::try_from(event.r#type).ok()? {
                    EventType::Put => EventKind::Put,
                    EventType::Delete => EventKind::Delete,
                };
                let kv = event.kv?;
                let revision = revision_of(kv.mod_revision);
                Some(Event {
                    kind,
                    key: kv.key,
                    value: kv.value,
                    meta: KeyMeta::default(),
                    previous: None,
                    revision,
                })
            })
            .collect();
        let revision = events.last().map_or(0, |event| event.revision);
        Ok(Some(WatchUpdate::Changes { revision, events }))
    }
}

impl Updates for EtcdUpdates {
    async fn next(&mut self) -> Result<WatchUpdate, ClientError> {
        if self.open.is_none() {
            self.open = Some(self.open().await?);
        }
        loop {
            let Some(open) = self.open.as_mut() else {
                return Err(ClientError::Unreachable("no stream".into()));
            };
            let message = tokio::select! {
                _ = open.progress.tick() => {
                    let progress = WatchRequest {
                        request_union: Some(RequestUnion::ProgressRequest(
                            WatchProgressRequest {},
                        )),
                    };
                    let _ = open.requests.try_send(progress);
                    continue;
                }
                message = open.responses.message() => message,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Err(ClientError::Unreachable("the watch ended".into())),
                Err(status) => {
                    return Err(ClientError::Unreachable(status.message().to_string()));
                }
            };
            if let Some(update) = self.update(response)? {
                return Ok(update);
            }
        }
    }
}

/// Starts `count` reflectors of `prefix` through `endpoints` until `stop`
/// is set; each watcher takes its id from `ids`.
pub fn start(
    endpoints: &[String],
    prefix: Vec<u8>,
    count: usize,
    ids: Arc<AtomicU64>,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|turn| {
            let reflector = Reflector {
                endpoints: endpoints.to_vec(),
                turn,
                prefix: prefix.clone(),
                ids: ids.clone(),
                recorder: recorder.clone(),
                stop: stop.clone(),
            };
            tokio::spawn(reflector.run())
        })
        .collect()
}

/// One reflector.
struct Reflector {
    endpoints: Vec<String>,
    /// The member in use (an index into `endpoints`, modulo its length).
    turn: usize,
    prefix: Vec<u8>,
    ids: Arc<AtomicU64>,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
}

impl Reflector {
    fn address(&self) -> &str {
        &self.endpoints[self.turn % self.endpoints.len()]
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Moves on to the next member after a failure.
    async fn next_member(&mut self) {
        self.turn = self.turn.wrapping_add(1);
        tokio::time::sleep(REOPEN_PAUSE).await;
    }

    /// Lists, then watches from after the list, until stopped; lists
    /// again when its watch is compacted away.
    async fn run(mut self) {
        if self.endpoints.is_empty() {
            return;
        }
        while !self.stopped() {
            let Some(listed) = self.list().await else {
                return;
            };
            let end = self.watch(listed).await;
            if !matches!(end, WatchEnd::Compacted { .. }) {
                return;
            }
        }
    }

    /// The revision of a list that succeeded, or `None` once stopped.
    async fn list(&mut self) -> Option<u64> {
        loop {
            if self.stopped() {
                return None;
            }
            let listed = match channel(self.address()) {
                Ok(channel) => list(&mut KvClient::new(channel), &self.prefix).await,
                Err(error) => Err(tonic::Status::unavailable(error)),
            };
            match listed {
                Ok((_, revision)) => return Some(u64::try_from(revision).unwrap_or(0)),
                Err(_) => self.next_member().await,
            }
        }
    }

    /// Watches from after `listed` as a new watcher until stopped, its
    /// start compacted, or refused; returns how it ended.
    async fn watch(&mut self, listed: u64) -> WatchEnd {
        let id: WatcherId = self.ids.fetch_add(1, Ordering::Relaxed);
        let start = listed.saturating_add(1);
        self.recorder
            .watch_started(id, Bytes(self.prefix.clone()), start, false);
        let mut through = listed;
        let mut stop = self.stop.clone();
        let end = 'watch: loop {
            if self.stopped() {
                break WatchEnd::Stopped;
            }
            let from = through.saturating_add(1);
            let mut updates =
                EtcdUpdates::new(self.address(), &self.prefix, from, REFLECTOR_PROGRESS);
            loop {
                let update = tokio::select! {
                    biased;
                    _ = stop.changed() => break 'watch WatchEnd::Stopped,
                    update = updates.next() => update,
                };
                match update {
                    Ok(update) => {
                        let (given, revision) = unpack(update);
                        for (revision, key, value) in given {
                            self.recorder.watched(id, revision, key, value);
                        }
                        through = through.max(revision);
                    }
                    Err(ClientError::Rejected(Rejection::Compacted { compacted, .. })) => {
                        break 'watch WatchEnd::Compacted { compacted };
                    }
                    Err(error @ ClientError::PermissionDenied(_)) => {
                        break 'watch WatchEnd::Failed {
                            detail: error.to_string(),
                        };
                    }
                    Err(_) => {
                        self.next_member().await;
                        break;
                    }
                }
            }
        };
        self.recorder.watch_stopped(id, through, end.clone());
        end
    }
}

/// The highest header revision any of `endpoints` reports, asked until
/// one answers or `deadline` passes.
async fn revision_target(endpoints: &[String], deadline: Instant) -> Option<u64> {
    loop {
        let mut target = None;
        for address in endpoints {
            let Ok(channel) = channel(address) else {
                continue;
            };
            let mut request = tonic::Request::new(StatusRequest {});
            request.set_timeout(Duration::from_millis(500));
            if let Ok(status) = MaintenanceClient::new(channel).status(request).await {
                let revision = status.into_inner().header.map_or(0, |h| h.revision);
                target = target.max(Some(u64::try_from(revision).unwrap_or(0)));
            }
        }
        if target.is_some() || Instant::now() >= deadline {
            return target;
        }
        tokio::time::sleep_until((Instant::now() + Duration::from_millis(200)).min(deadline)).await;
    }
}

/// Reads the committed changes of `prefix` from `first_revision` through
/// the highest revision any of `endpoints` reports, over etcd's Watch, as
/// watcher `id` with the reference mark, in tries at each member in turn
/// within `budget`, and records what it got.
pub async fn reference(
    endpoints: &[String],
    prefix: Vec<u8>,
    first_revision: u64,
    id: WatcherId,
    recorder: &Recorder,
    budget: Duration,
) {
    let deadline = Instant::now() + budget;
    let read = match revision_target(endpoints, deadline).await {
        Some(target) if !endpoints.is_empty() => {
            let open = |from: u64, attempt: u32| {
                let turn = attempt.saturating_sub(1) as usize % endpoints.len();
                Ok(EtcdUpdates::new(
                    &endpoints[turn],
                    &prefix,
                    from,
                    REFERENCE_PROGRESS,
                ))
            };
            let left = deadline.saturating_duration_since(Instant::now());
            read_reference(open, first_revision, target, left, REFERENCE_STALL).await
        }
        _ => ReferenceRead {
            start: first_revision,
            given: Vec::new(),
            through: first_revision.saturating_sub(1),
            end: WatchEnd::Failed {
                detail: format!("no member answered its status within {budget:?}"),
            },
            tries: 0,
        },
    };
    record_reference(recorder, id, prefix, read);
}
