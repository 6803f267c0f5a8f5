//! [`Watcher`]: every change to a key or prefix, from a start revision on,
//! in revision order, each exactly once. A watch is served by any node
//! from its applied state; when the stream breaks (a node stops, a leader
//! changes, the node cancels a slow watcher) the watcher resumes on the
//! next endpoint from the revision after the last one it delivered, so no
//! change is lost or repeated. A start revision the history no longer
//! reaches is `Rejected(Compacted)`.
//!
//! This module owns the stream: its messages, the next revision, what is
//! delivered. Its starts and breaks are retried by the client's one retry
//! engine ([`crate::retry::Retrier`], route `Stream`, no deadline): the
//! same reading of a start's error and of a `Failure` as every call's,
//! the injected backoff between failed starts (back to the shortest once
//! a stream starts or delivers changes), and the login.
//!
//! A node ends a watch whose user loses the right to it: a revoked role or
//! permission is `PermissionDenied`; a token the node no longer accepts
//! (expired, or its user's password changed) is logged in again once
//! (once more after changes or progress were heard) when the client holds
//! a password, and `Unauthenticated` otherwise (or when that login fails).
//! A node refuses a watch past a cap on watchers (per connection, per
//! user) as `Invalid`, naming the cap; a node serving its most watchers
//! sheds the start, which is tried again on that node, over the same
//! connection, after a pause.

use crate::client::Client;
use crate::error::ClientError;
use crate::retry::{Attempt, Policy, Retrier, Route, Step, call_failed, failed};
use oncekv_proto::convert;
use oncekv_proto::v1::{self, watch_response};
use oncekv_state::{KeyMeta, Rejection};
use std::collections::VecDeque;
use std::time::Duration;

/// What to watch.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    /// Watch every key under the key, as a prefix.
    pub prefix: bool,
    /// The first revision to deliver (0: changes after the watch starts).
    pub start_revision: u64,
    /// Deliver each change's previous value too.
    pub previous: bool,
    /// How often an idle watch hears its progress (0: the node's default).
    pub progress_interval: Duration,
}

impl WatchOptions {
    /// Every key under the watched key.
    pub fn with_prefix(mut self) -> WatchOptions {
        self.prefix = true;
        self
    }

    /// From `revision` on.
    pub fn from_revision(mut self, revision: u64) -> WatchOptions {
        self.start_revision = revision;
        self
    }

    /// With previous values.
    pub fn with_previous(mut self) -> WatchOptions {
        self.previous = true;
        self
    }

    /// With progress notices this often while idle.
    pub fn with_progress_interval(mut self, interval: Duration) -> WatchOptions {
        self.progress_interval = interval;
        self
    }
}

/// Whether a change set or removed a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was set.
    Put,
    /// The key was removed.
    Delete,
}

/// One change of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key.
    pub key: Vec<u8>,
    /// The value after a put (empty after a delete).
    pub value: Vec<u8>,
    /// The key's revisions after a put.
    pub meta: KeyMeta,
    /// The value before, if asked for and the key existed.
    pub previous: Option<Vec<u8>>,
    /// The revision of the change.
    pub revision: u64,
}

/// What a watcher yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchUpdate {
    /// The changes of one revision (a transaction may change several keys).
    Changes {
        /// The revision.
        revision: u64,
        /// Its changes to watched keys, in order.
        events: Vec<Event>,
    },
    /// Every change up to this revision has been delivered.
    Progress(u64),
}

/// A running watch.
#[derive(Debug)]
pub struct Watcher {
    client: Client,
    key: Vec<u8>,
    options: WatchOptions,
    /// The next revision to deliver; 0 until the first start.
    next: u64,
    stream: Option<tonic::Streaming<v1::WatchResponse>>,
    pending: VecDeque<WatchUpdate>,
    /// The client's retry engine for the starts: the node the stream runs
    /// on, the pause after consecutive failed starts, and whether it
    /// logged in again since it last heard of a change (a token refused
    /// once more is the caller's to know).
    retrier: Retrier,
}

impl Client {
    /// Watches `key` (or every key under it, with
    /// [`WatchOptions::prefix`]).
    pub fn watch(&self, key: impl Into<Vec<u8>>, options: WatchOptions) -> Watcher {
        Watcher {
            client: self.clone(),
            key: key.into(),
            next: options.start_revision,
            options,
            stream: None,
            pending: VecDeque::new(),
            retrier: Retrier::new(self, Policy::read(Route::Stream), None),
        }
    }
}

impl Watcher {
    /// The revision the next change will have at least.
    pub fn next_revision(&self) -> u64 {
        self.next
    }

    /// The next update. Waits as long as it takes; it fails only when the
    /// watch cannot go on: the history no longer holds the next revision
    /// (`Rejected(Compacted)`), the user may not read the keys (any more),
    /// its credentials no longer hold, or it holds its most watchers.
    pub async fn next(&mut self) -> Result<WatchUpdate, ClientError> {
        loop {
            if let Some(update) = self.pending.pop_front() {
                return Ok(update);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.start().await?;
                continue;
            };
            let step = match stream.message().await {
                Ok(Some(message)) => {
                    self.take(message).await?;
                    continue;
                }
                // The stream broke (a node stopped, a leader changed):
                // resumed on the next endpoint after a pause. Never a
                // refusal: the node had accepted the watch.
                Ok(None) => Attempt::<()>::MaybeSent("the watch stream ended".to_string()),
                Err(status) => {
                    Attempt::MaybeSent(format!("the watch stream broke: {}", status.message()))
                }
            };
            self.stream = None;
            self.step(step).await?;
        }
    }

    /// Starts (or resumes) the stream on the retrier's target.
    async fn start(&mut self) -> Result<(), ClientError> {
        self.retrier.log_in_if_needed(&self.client).await?;
        let request = v1::WatchRequest {
            key: self.key.clone(),
            prefix: self.options.prefix,
            start_revision: self.next,
            previous: self.options.previous,
            progress_interval_ms: u32::try_from(self.options.progress_interval.as_millis())
                .unwrap_or(u32::MAX),
            range_end: None,
        };
        // A start is an attempt as any call's: refused for good (a cap on
        // the caller's own watchers) ends the watch; a node that shed it
        // is asked again after a pause, over the same connection; one
        // that cannot be reached is skipped.
        let started = match self.client.rpc(self.retrier.target()) {
            Ok(mut rpc) => match rpc.watch(request).await {
                Ok(response) => Attempt::Done(response.into_inner()),
                Err(status) => failed(status),
            },
            Err(error) => Attempt::NotSent(error),
        };
        if let Some(stream) = self.step(started).await? {
            self.stream = Some(stream);
        }
        Ok(())
    }

    /// Hands an attempt's lesson to the retrier: its value when done,
    /// `None` to try again (it paused, moved on or logged in as needed).
    async fn step<T>(&mut self, attempt: Attempt<T>) -> Result<Option<T>, ClientError> {
        match self.retrier.step(&self.client, attempt).await {
            Step::Done(value) => Ok(Some(value)),
            Step::Again => Ok(None),
            Step::Stop(error) => Err(error),
        }
    }

    /// Handles one message from the node.
    async fn take(&mut self, message: v1::WatchResponse) -> Result<(), ClientError> {
        use watch_response::Kind;
        match message.kind {
            Some(Kind::Started(started)) => {
                self.retrier.served();
                self.next = self.next.max(started.revision.saturating_add(1));
            }
            Some(Kind::Events(events)) => {
                self.retrier.served();
                self.retrier.heard();
                let mut current: Option<(u64, Vec<Event>)> = None;
                for wire in events.events {
                    // A revision already delivered (never expected) is
                    // skipped rather than repeated.
                    if wire.revision < self.next {
                        continue;
                    }
                    let event = event_from_wire(wire);
                    match &mut current {
                        Some((revision, events)) if *revision == event.revision => {
                            events.push(event)
                        }
                        _ => {
                            if let Some((revision, events)) = current.take() {
                                self.pending
                                    .push_back(WatchUpdate::Changes { revision, events });
                            }
                            current = Some((event.revision, vec![event]));
                        }
                    }
                }
                if let Some((revision, events)) = current {
                    self.pending
                        .push_back(WatchUpdate::Changes { revision, events });
                }
                if let Some(WatchUpdate::Changes { revision, .. }) = self.pending.back() {
                    self.next = self.next.max(revision.saturating_add(1));
                }
            }
            Some(Kind::Progress(revision)) => {
                self.retrier.heard();
                if revision.saturating_add(1) > self.next {
                    self.next = revision.saturating_add(1);
                }
                self.pending.push_back(WatchUpdate::Progress(revision));
            }
            Some(Kind::Canceled(canceled)) => {
                self.stream = None;
                if canceled.compacted > 0 {
                    return Err(ClientError::Rejected(Rejection::Compacted {
                        revision: self.next,
                        compacted: canceled.compacted,
                    }));
                }
                // Resumed from `next` at once, on the next endpoint.
                self.retrier.move_on(&self.client)?;
            }
            Some(Kind::Failure(failure)) => {
                self.stream = None;
                // Read as every call's failure is, and retried as every
                // call is: refused for good (the user may not read the
                // keys, or the watch is invalid) ends the watch; a refused
                // token is logged in again once and the watch resumed on
                // the same node; shed, the same node after a pause; any
                // other, elsewhere.
                self.step(call_failed::<()>(failure)).await?;
            }
            None => {}
        }
        Ok(())
    }
}

fn event_from_wire(wire: v1::Event) -> Event {
    let kind = match v1::EventType::try_from(wire.r#type) {
        Ok(v1::EventType::Delete) => EventKind::Delete,
        _ => EventKind::Put,
    };
    Event {
        kind,
        key: wire.key,
        value: wire.value,
        meta: wire.meta.map(convert::meta_from_wire).unwrap_or_default(),
        previous: wire.previous,
        revision: wire.revision,
    }
}
