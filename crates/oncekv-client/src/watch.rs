//! [`Watcher`]: every change to a key or prefix, from a start revision on,
//! in revision order, each exactly once. A watch is served by any node
//! from its applied state; when the stream breaks (a node stops, a leader
//! changes, the node cancels a slow watcher) the watcher resumes on the
//! next endpoint from the revision after the last one it delivered, so no
//! change is lost or repeated. A start revision the history no longer
//! reaches is `Rejected(Compacted)`.
//!
//! A node ends a watch whose user loses the right to it: a revoked role or
//! permission is `PermissionDenied`; a token the node no longer accepts
//! (expired, or its user's password changed) is logged in again once when
//! the client holds a password, and `Unauthenticated` otherwise (or when
//! that login fails). A node refuses a watch past a cap on watchers (per
//! connection, per user) as `Invalid`, naming the cap; a node serving its
//! most watchers is tried again later, or another one.

use crate::client::Client;
use crate::error::ClientError;
use crate::retry::Attempt;
use oncekv_proto::convert;
use oncekv_proto::v1::{self, watch_response};
use oncekv_state::{KeyMeta, Rejection};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

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
    target: String,
    stream: Option<tonic::Streaming<v1::WatchResponse>>,
    pending: VecDeque<WatchUpdate>,
    /// Consecutive failed starts, for the pause between them.
    failures: u32,
    /// Whether it logged in again since it last heard of a change (a
    /// token refused once more is the caller's to know).
    logged_in_again: bool,
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
            target: self.first_target(),
            stream: None,
            pending: VecDeque::new(),
            failures: 0,
            logged_in_again: false,
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
            match stream.message().await {
                Ok(Some(message)) => self.take(message)?,
                Ok(None) | Err(_) => self.broken().await,
            }
        }
    }

    /// Starts (or resumes) the stream on the current target.
    async fn start(&mut self) -> Result<(), ClientError> {
        if self.client.needs_login() {
            let deadline = Instant::now() + self.client.options().deadline;
            self.client.login(deadline).await?;
        }
        let request = v1::WatchRequest {
            key: self.key.clone(),
            prefix: self.options.prefix,
            start_revision: self.next,
            previous: self.options.previous,
            progress_interval_ms: u32::try_from(self.options.progress_interval.as_millis())
                .unwrap_or(u32::MAX),
            range_end: None,
        };
        let mut rpc = match self.client.rpc(&self.target) {
            Ok(rpc) => rpc,
            Err(_) => {
                self.broken().await;
                return Ok(());
            }
        };
        match rpc.watch(request).await {
            Ok(response) => {
                self.stream = Some(response.into_inner());
                Ok(())
            }
            // Refused, not shed: a cap on the caller's own watchers.
            Err(status) => match crate::retry::refused_by_transport(&status) {
                Some(error) => Err(error),
                None => {
                    self.broken().await;
                    Ok(())
                }
            },
        }
    }

    /// Handles one message from the node.
    fn take(&mut self, message: v1::WatchResponse) -> Result<(), ClientError> {
        use watch_response::Kind;
        match message.kind {
            Some(Kind::Started(started)) => {
                self.failures = 0;
                self.next = self.next.max(started.revision.saturating_add(1));
            }
            Some(Kind::Events(events)) => {
                self.failures = 0;
                self.logged_in_again = false;
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
                self.logged_in_again = false;
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
                self.target = self.client.next_target(&self.target);
            }
            Some(Kind::Failure(failure)) => {
                self.stream = None;
                // Read as every call's failure is: refused for good (the
                // user may not read the keys, or the watch is invalid)
                // ends the watch; anything else resumes elsewhere.
                match crate::retry::call_failed::<()>(failure) {
                    Attempt::Refused(error) => return Err(error),
                    Attempt::Unauthenticated(reason) => {
                        let password = matches!(
                            self.client.options().credentials,
                            Some(crate::auth::Credentials::Password { .. })
                        );
                        if !password || self.logged_in_again {
                            return Err(ClientError::Unauthenticated(reason));
                        }
                        // The token expired (or was voided): log in again
                        // and resume, on the same node.
                        self.client.forget_token();
                        self.logged_in_again = true;
                    }
                    _ => self.target = self.client.next_target(&self.target),
                }
            }
            None => {}
        }
        Ok(())
    }

    /// The stream broke or could not start: the next endpoint, after a
    /// pause that grows with consecutive failures.
    async fn broken(&mut self) {
        self.stream = None;
        self.client.forget_channel(&self.target);
        self.target = self.client.next_target(&self.target);
        self.failures = self.failures.saturating_add(1);
        let pause = Duration::from_millis(50u64.saturating_mul(u64::from(self.failures.min(20))));
        tokio::time::sleep(pause).await;
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
