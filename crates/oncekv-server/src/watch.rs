//! Watches: [`WatchHub`] carries every applied change from the apply loop
//! to the node's watchers, and [`watch`] serves one watcher: the history
//! from its start revision, then live changes, in revision order, whole
//! revisions per message, with progress notices while idle.
//!
//! The hub is a bounded broadcast channel fed under the applied state's
//! lock, so a watcher that subscribes under that lock and reads the
//! history there misses nothing and sees nothing twice. A watcher that
//! falls a channel's length behind is cancelled with a reason (its memory
//! never grows); so is every watcher when the replica installs a snapshot
//! (the history jumps). The client resumes from the next revision.

use oncekv_state::{Event, KeyScope, StateMachine};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// Notices a watcher may be behind by before it is cancelled.
pub const WATCH_BACKLOG_NOTICES: usize = 4096;
/// Most watchers one node serves at once; one more is refused (told to
/// retry later or elsewhere), never served by dropping another.
pub const WATCHERS_MAX: usize = 4096;
/// The shortest progress interval a watcher may ask for.
pub const PROGRESS_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// Messages buffered towards one watcher's connection.
const WATCH_OUTBOX_MESSAGES: usize = 64;
/// Revisions of history sent in one message at most.
const EVENTS_PER_MESSAGE: usize = 1024;
/// How often an idle watcher hears the revision it is up to, by default.
pub const PROGRESS_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

/// What the apply loop tells watchers.
#[derive(Clone, Debug)]
pub enum Notice {
    /// Entry `revision` was applied with these changes (possibly none).
    Applied {
        /// The entry's index.
        revision: u64,
        /// Its changes, in order.
        events: Arc<[Event]>,
    },
    /// The replica's state was replaced by a snapshot at `revision`.
    Reset {
        /// The snapshot's last index.
        revision: u64,
    },
}

/// The sending side, held with the applied state.
#[derive(Clone, Debug)]
pub struct WatchHub {
    sender: broadcast::Sender<Notice>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub::with_capacity(WATCH_BACKLOG_NOTICES)
    }
}

impl WatchHub {
    /// A hub whose watchers may fall `notices` behind.
    pub fn with_capacity(notices: usize) -> WatchHub {
        WatchHub {
            sender: broadcast::channel(notices.max(1)).0,
        }
    }

    /// After `machine` applied entry `revision`: tells watchers, if any,
    /// its changes. Call under the applied state's lock.
    pub fn applied(&self, machine: &StateMachine, revision: u64) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let history = machine.kv().history();
        let events: Arc<[Event]> = if machine.kv().revision() == revision {
            match history.since(revision) {
                Ok(events) => events.cloned().collect(),
                // The change alone passed the history's bounds: watchers
                // cannot be given it, and are told so.
                Err(_) => {
                    let _ = self.sender.send(Notice::Reset { revision });
                    return;
                }
            }
        } else {
            Arc::from(Vec::new())
        };
        let _ = self.sender.send(Notice::Applied { revision, events });
    }

    /// After the state was replaced by a snapshot at `revision`.
    pub fn reset(&self, revision: u64) {
        let _ = self.sender.send(Notice::Reset { revision });
    }

    /// A new receiver (call under the applied state's lock).
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.sender.subscribe()
    }
}

/// A look at the applied state and its hub, run under the state's lock.
pub type Visit<'a> = &'a mut dyn FnMut(&StateMachine, &WatchHub);

/// What a watcher asks for.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// The key, the prefix, or the range's start, as `scope` says.
    pub key: Vec<u8>,
    /// Which keys: `key` alone, every key under it, or a range from it.
    pub scope: KeyScope,
    /// The first revision to send (0: after now).
    pub start_revision: u64,
    /// Whether to send previous values.
    pub previous: bool,
    /// How often to send progress while idle.
    pub progress_interval: Duration,
}

impl WatchSpec {
    fn matches(&self, key: &[u8]) -> bool {
        self.scope.contains(&self.key, key)
    }
}

/// A message to one watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// The watch runs; every change after `revision` will follow.
    Started {
        /// The revision it starts after.
        revision: u64,
    },
    /// Changes of whole revisions, in order.
    Events(Vec<Event>),
    /// Every change up to this revision was sent.
    Progress(u64),
    /// The watch ended.
    Canceled {
        /// Why.
        reason: String,
        /// The compacted revision, when the cause is compaction.
        compacted: u64,
    },
}

/// Starts serving `spec` from `state` (locked by `lock`) and returns the
/// messages for the watcher. The stream ends after `Canceled`, or when the
/// watcher goes away.
pub fn watch<L>(lock: L, spec: WatchSpec) -> mpsc::Receiver<WatchMessage>
where
    L: Fn(Visit<'_>) + Send + Sync + 'static,
{
    let (outbox, messages) = mpsc::channel(WATCH_OUTBOX_MESSAGES);
    // Under the lock: the backlog from the history, and the subscription.
    let mut start = Err(String::new());
    lock(&mut |machine: &StateMachine, hub: &WatchHub| {
        let applied = machine.last_applied().map_or(0, |index| index.0);
        let from = if spec.start_revision == 0 {
            applied.saturating_add(1)
        } else {
            spec.start_revision
        };
        let history = machine.kv().history();
        if hub.sender.receiver_count() >= WATCHERS_MAX {
            let _ = outbox.try_send(WatchMessage::Canceled {
                reason: format!(
                    "this node serves its maximum of {WATCHERS_MAX} watchers; \
                     retry later or on another node"
                ),
                compacted: 0,
            });
            return;
        }
        start = match history.since(from) {
            Ok(events) => {
                let backlog: Vec<Event> = events
                    .filter(|event| event.revision <= applied && spec.matches(&event.key))
                    .cloned()
                    .collect();
                Ok((from.saturating_sub(1), applied, backlog, hub.subscribe()))
            }
            Err(_) => Err(format!(
                "revision {from} is compacted (the history starts after revision {}); \
                 read the current state and watch from its revision",
                history.compacted()
            )),
        };
        if let Err(reason) = &start {
            let compacted = history.compacted();
            let _ = outbox.try_send(WatchMessage::Canceled {
                reason: reason.clone(),
                compacted,
            });
        }
    });
    if let Ok((after, applied, backlog, notices)) = start {
        tokio::spawn(serve(spec, after, applied, backlog, notices, outbox, lock));
    }
    messages
}

async fn serve<L>(
    spec: WatchSpec,
    after: u64,
    applied: u64,
    backlog: Vec<Event>,
    mut notices: broadcast::Receiver<Notice>,
    outbox: mpsc::Sender<WatchMessage>,
    lock: L,
) where
    L: Fn(Visit<'_>) + Send + Sync + 'static,
{
    if outbox
        .send(WatchMessage::Started { revision: after })
        .await
        .is_err()
    {
        return;
    }
    for chunk in whole_revisions(backlog, EVENTS_PER_MESSAGE) {
        if outbox.send(WatchMessage::Events(chunk)).await.is_err() {
            return;
        }
    }
    // Every change up to `sent` went out (or was not asked for).
    let mut sent = applied.max(after);
    let mut ticker = tokio::time::interval(spec.progress_interval.max(PROGRESS_INTERVAL_MIN));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let notice = tokio::select! {
            notice = notices.recv() => notice,
            _ = ticker.tick() => {
                // Notices up to the applied index now were sent before it
                // was read (under the same lock): drain them, then say so.
                let mut now = 0;
                lock(&mut |machine: &StateMachine, _: &WatchHub| {
                    now = machine.last_applied().map_or(0, |index| index.0);
                });
                loop {
                    match notices.try_recv() {
                        Ok(notice) => match deliver(&spec, notice, &mut sent, &outbox).await {
                            Ok(()) => {}
                            Err(()) => return,
                        },
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(broadcast::error::TryRecvError::Lagged(behind)) => {
                            return cancel_slow(&outbox, behind, sent).await;
                        }
                        Err(broadcast::error::TryRecvError::Closed) => return,
                    }
                }
                sent = sent.max(now);
                if outbox.send(WatchMessage::Progress(sent)).await.is_err() {
                    return;
                }
                continue;
            }
            _ = outbox.closed() => return,
        };
        match notice {
            Ok(notice) => {
                if deliver(&spec, notice, &mut sent, &outbox).await.is_err() {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(behind)) => {
                return cancel_slow(&outbox, behind, sent).await;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Sends what `notice` holds for this watcher; `Err` ends the watch.
async fn deliver(
    spec: &WatchSpec,
    notice: Notice,
    sent: &mut u64,
    outbox: &mpsc::Sender<WatchMessage>,
) -> Result<(), ()> {
    match notice {
        Notice::Applied { revision, events } => {
            if revision <= *sent {
                return Ok(());
            }
            let matching: Vec<Event> = events
                .iter()
                .filter(|event| spec.matches(&event.key))
                .cloned()
                .collect();
            *sent = revision;
            if matching.is_empty() {
                return Ok(());
            }
            outbox
                .send(WatchMessage::Events(matching))
                .await
                .map_err(|_| ())
        }
        Notice::Reset { revision } => {
            let reason = format!(
                "this replica's state jumped to revision {revision} (a snapshot was installed, \
                 or one change exceeded the history): resume from revision {}",
                sent.saturating_add(1)
            );
            let _ = outbox
                .send(WatchMessage::Canceled {
                    reason,
                    compacted: 0,
                })
                .await;
            Err(())
        }
    }
}

async fn cancel_slow(outbox: &mpsc::Sender<WatchMessage>, behind: u64, sent: u64) {
    let reason = format!(
        "watcher too slow: {behind} changes behind the node's buffer; resume from revision {}",
        sent.saturating_add(1)
    );
    let _ = outbox
        .send(WatchMessage::Canceled {
            reason,
            compacted: 0,
        })
        .await;
}

/// Splits events into messages of at most about `max` events, never
/// splitting one revision.
fn whole_revisions(events: Vec<Event>, max: usize) -> Vec<Vec<Event>> {
    let mut chunks: Vec<Vec<Event>> = Vec::new();
    for event in events {
        let start_new = match chunks.last() {
            None => true,
            Some(chunk) => {
                chunk.len() >= max && chunk.last().is_some_and(|e| e.revision != event.revision)
            }
        };
        if start_new {
            chunks.push(Vec::new());
        }
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(event);
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_state::{ClusterTime, Command, Entry, Limits, LogIndex, Request};
    use std::sync::Mutex;

    type Shared = Arc<Mutex<(StateMachine, WatchHub)>>;

    fn lock(shared: &Shared) -> impl Fn(Visit<'_>) + Send + Sync + 'static {
        let shared = shared.clone();
        move |f| {
            let guard = shared.lock().expect("not poisoned");
            f(&guard.0, &guard.1)
        }
    }

    fn put(shared: &Shared, index: u64, key: &str) {
        let mut guard = shared.lock().expect("not poisoned");
        let (machine, hub) = &mut *guard;
        let command = Command::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            lease: None,
        };
        machine.apply(&Entry {
            index: LogIndex(index),
            time: ClusterTime(0),
            principal: None,
            request: Request::plain(command),
        });
        hub.applied(machine, index);
    }

    fn spec(start_revision: u64) -> WatchSpec {
        WatchSpec {
            key: b"k".to_vec(),
            scope: KeyScope::Prefix,
            start_revision,
            previous: false,
            progress_interval: Duration::from_secs(60),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_backlog_then_live_changes_each_once_in_order() {
        let shared: Shared = Arc::new(Mutex::new((
            StateMachine::new(Limits::default()),
            WatchHub::default(),
        )));
        put(&shared, 1, "k1");
        put(&shared, 2, "other");
        let mut messages = watch(lock(&shared), spec(1));
        put(&shared, 3, "k2");
        let mut revisions = Vec::new();
        while revisions.len() < 2 {
            match messages.recv().await.expect("a message") {
                WatchMessage::Events(events) => {
                    revisions.extend(events.iter().map(|e| e.revision));
                }
                WatchMessage::Started { revision } => assert_eq!(revision, 0),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(revisions, vec![1, 3]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_watcher_that_falls_behind_is_cancelled_not_buffered() {
        let shared: Shared = Arc::new(Mutex::new((
            StateMachine::new(Limits::default()),
            WatchHub::with_capacity(4),
        )));
        let mut messages = watch(lock(&shared), spec(0));
        // Ten changes before the watcher's task runs at all: it is more
        // than the hub's four notices behind.
        for index in 1..=10 {
            put(&shared, index, &format!("k{index}"));
        }
        let mut last = None;
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(message) = messages.recv().await {
                last = Some(message);
            }
        })
        .await;
        assert!(drained.is_ok(), "the slow watcher was never cancelled");
        match last {
            Some(WatchMessage::Canceled { reason, compacted }) => {
                assert!(reason.contains("too slow"), "{reason}");
                assert!(reason.contains("resume from revision 1"), "{reason}");
                assert_eq!(compacted, 0);
            }
            other => panic!("expected a cancellation, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_watcher_past_the_maximum_is_refused_and_the_others_kept() {
        let shared: Shared = Arc::new(Mutex::new((
            StateMachine::new(Limits::default()),
            WatchHub::default(),
        )));
        let held: Vec<_> = {
            let guard = shared.lock().expect("not poisoned");
            (0..WATCHERS_MAX).map(|_| guard.1.subscribe()).collect()
        };
        let mut messages = watch(lock(&shared), spec(0));
        match messages.recv().await {
            Some(WatchMessage::Canceled { reason, compacted }) => {
                assert!(reason.contains("maximum"), "{reason}");
                assert_eq!(compacted, 0);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(messages.recv().await.is_none());
        let receivers = shared
            .lock()
            .expect("not poisoned")
            .1
            .sender
            .receiver_count();
        assert_eq!(receivers, held.len(), "no watcher was dropped");
        drop(held);
        let mut admitted = watch(lock(&shared), spec(0));
        assert!(matches!(
            admitted.recv().await,
            Some(WatchMessage::Started { .. })
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_compacted_start_is_refused_with_the_compacted_revision() {
        let limits = Limits {
            history_events_max: 1,
            ..Limits::default()
        };
        let shared: Shared = Arc::new(Mutex::new((StateMachine::new(limits), WatchHub::default())));
        put(&shared, 1, "k1");
        put(&shared, 2, "k2");
        let mut messages = watch(lock(&shared), spec(1));
        match messages.recv().await {
            Some(WatchMessage::Canceled { compacted, .. }) => assert_eq!(compacted, 1),
            other => panic!("expected compacted, got {other:?}"),
        }
    }

    fn event(revision: u64) -> Event {
        Event {
            revision,
            time: ClusterTime(0),
            key: b"k".to_vec(),
            value: None,
            previous: None,
        }
    }

    #[test]
    fn messages_never_split_a_revision() {
        let events = vec![event(1), event(2), event(2), event(2), event(3)];
        let chunks = whole_revisions(events, 2);
        let revisions: Vec<Vec<u64>> = chunks
            .iter()
            .map(|c| c.iter().map(|e| e.revision).collect())
            .collect();
        assert_eq!(revisions, vec![vec![1, 2, 2, 2], vec![3]]);
    }
}
