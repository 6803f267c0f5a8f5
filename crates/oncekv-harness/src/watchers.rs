//! Watchers through a fault run, and the reference read after it.
//!
//! [`start`] runs watchers of the accounts' prefix through the faults
//! (over the fault proxies, so dropped connections make them resume): odd
//! ones from the run's first revision (1 on a cluster of its own), even
//! ones from the revision current when they start, a moment into the run.
//! Each records every change it is given and, when stopped, the revision
//! through which it was given everything.
//!
//! [`reference()`] then reads the committed change sequence of the prefix
//! from the healed cluster, from that first revision until a progress
//! notice past the highest index any node has applied: one of the two
//! references `oncekv-check`'s watch checker judges the others by (the
//! other is the acknowledged writes of the record). The read goes in
//! tries, each a watch over connections of its own, starting at the next
//! node in turn, from the revision after the last one it was given
//! everything through: a try that fails or hears nothing (an idle watch
//! hears progress every 200 ms) for [`REFERENCE_STALL`] gives way to the
//! next, until the target, [`REFERENCE_TRIES`] tries or the time budget.
//! A history compacted past the first revision before anything was read
//! is read from where it starts; compacted under a read already begun, the
//! read ends there. Whatever it got is recorded, with the revision through
//! which it is complete: a read cut short still covers that much, and the
//! checker takes the rest from the acknowledged writes.

use crate::recorder::Recorder;
use oncekv_check::record::{Bytes, WatchEnd, WatcherId};
use oncekv_client::{
    Client, ClientError, ClientOptions, EventKind, WatchOptions, WatchUpdate, Watcher,
};
use oncekv_state::Rejection;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often an idle watch hears its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// How long into the run the later watchers start.
const LATE_START: Duration = Duration::from_secs(3);

/// How long a try of the reference read may go without an update before
/// it gives way to a fresh one.
pub const REFERENCE_STALL: Duration = Duration::from_secs(5);

/// Most tries of the reference read.
pub const REFERENCE_TRIES: u32 = 64;

fn options(start_revision: u64) -> WatchOptions {
    WatchOptions::default()
        .with_prefix()
        .from_revision(start_revision)
        .with_progress_interval(PROGRESS_INTERVAL)
}

/// One change given: revision, key, value (`None` for a delete).
pub(crate) type Given = (u64, Bytes, Option<Bytes>);

/// The changes `update` gives, and the revision through which it says
/// everything has been given.
pub(crate) fn unpack(update: WatchUpdate) -> (Vec<Given>, u64) {
    match update {
        WatchUpdate::Changes { revision, events } => {
            let given = events
                .into_iter()
                .map(|event| {
                    let value = match event.kind {
                        EventKind::Put => Some(Bytes(event.value)),
                        EventKind::Delete => None,
                    };
                    (event.revision, Bytes(event.key), value)
                })
                .collect();
            (given, revision)
        }
        WatchUpdate::Progress(revision) => (Vec::new(), revision),
    }
}

/// Records one update; returns the revision through which everything has
/// now been given.
fn take(recorder: &Recorder, id: WatcherId, update: WatchUpdate, through: u64) -> u64 {
    let (given, revision) = unpack(update);
    for (revision, key, value) in given {
        recorder.watched(id, revision, key, value);
    }
    through.max(revision)
}

/// How a failed watch ended.
fn failed(error: ClientError) -> WatchEnd {
    match error {
        ClientError::Rejected(Rejection::Compacted { compacted, .. }) => {
            WatchEnd::Compacted { compacted }
        }
        other => WatchEnd::Failed {
            detail: other.to_string(),
        },
    }
}

/// Runs `watcher` until `stop` is set (or the watch fails), recording
/// everything it is given.
async fn follow(
    recorder: Arc<Recorder>,
    id: WatcherId,
    mut watcher: Watcher,
    start_revision: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut through = start_revision.saturating_sub(1);
    let end = loop {
        if *stop.borrow() {
            break WatchEnd::Stopped;
        }
        tokio::select! {
            biased;
            _ = stop.changed() => break WatchEnd::Stopped,
            update = watcher.next() => match update {
                Ok(update) => through = take(&recorder, id, update, through),
                Err(error) => break failed(error),
            },
        }
    };
    recorder.watch_stopped(id, through, end);
}

/// The revision the cluster has applied, as one node reports it (0 if
/// none answers).
pub async fn current_revision(client: &Client) -> u64 {
    match client.status(None).await {
        Ok(status) => status.applied_index.unwrap_or(0),
        Err(_) => 0,
    }
}

/// Starts `count` watchers of `prefix` through `endpoints`, numbered from
/// 1, until `stop` is set; odd ones start at `first_revision`.
pub fn start(
    endpoints: &[String],
    client_options: ClientOptions,
    prefix: Vec<u8>,
    first_revision: u64,
    count: usize,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, ClientError> {
    let mut tasks = Vec::new();
    for index in 0..count {
        let id = index as WatcherId + 1;
        let client = Client::connect(endpoints.to_vec(), client_options.clone())?;
        let recorder = recorder.clone();
        let prefix = prefix.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let start_revision = if id % 2 == 1 {
                first_revision
            } else {
                tokio::time::sleep(LATE_START).await;
                current_revision(&client).await.saturating_add(1)
            };
            recorder.watch_started(id, Bytes(prefix.clone()), start_revision, false);
            let watcher = client.watch(prefix, options(start_revision));
            follow(recorder, id, watcher, start_revision, stop).await;
        }));
    }
    Ok(tasks)
}

/// One try's updates.
pub(crate) trait Updates {
    /// The next update; an error ends the try.
    fn next(&mut self) -> impl Future<Output = Result<WatchUpdate, ClientError>> + Send;
}

impl Updates for Watcher {
    fn next(&mut self) -> impl Future<Output = Result<WatchUpdate, ClientError>> + Send {
        Watcher::next(self)
    }
}

/// What the reference read got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReferenceRead {
    /// The revision it read from.
    pub(crate) start: u64,
    /// Every change from `start` through `through`, in the order given.
    pub(crate) given: Vec<Given>,
    /// The revision through which it was given everything.
    pub(crate) through: u64,
    /// How it ended: `Stopped` at the target.
    pub(crate) end: WatchEnd,
    /// Tries made.
    pub(crate) tries: u32,
}

impl ReferenceRead {
    /// Whether nothing has been read yet (not even a progress notice).
    fn unread(&self) -> bool {
        self.through < self.start
    }
}

/// Reads the changes from `first_revision` through `target` in tries:
/// `open(from, try)` starts a try at revision `from`. A try ends at an
/// error or after `stall` without an update; the read ends at the target,
/// after [`REFERENCE_TRIES`] tries, when `budget` has passed, when
/// permission is refused, or when the history is compacted under it.
pub(crate) async fn read_reference<U: Updates>(
    mut open: impl FnMut(u64, u32) -> Result<U, ClientError>,
    first_revision: u64,
    target: u64,
    budget: Duration,
    stall: Duration,
) -> ReferenceRead {
    let deadline = Instant::now() + budget;
    let mut read = ReferenceRead {
        start: first_revision,
        given: Vec::new(),
        through: first_revision.saturating_sub(1),
        end: WatchEnd::Stopped,
        tries: 0,
    };
    let mut problem = String::new();
    read.end = 'read: loop {
        if read.through >= target {
            break WatchEnd::Stopped;
        }
        if read.tries >= REFERENCE_TRIES || Instant::now() >= deadline {
            break WatchEnd::Failed {
                detail: format!(
                    "through revision {} of {target} after {} tries within {budget:?}: {problem}",
                    read.through, read.tries
                ),
            };
        }
        if read.tries > 0 {
            // A pause growing with the tries, up to a second.
            let pause = Duration::from_millis(50 * u64::from(read.tries.min(20)));
            tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
        }
        read.tries += 1;
        let mut updates = match open(read.through.saturating_add(1), read.tries) {
            Ok(updates) => updates,
            Err(error) => {
                break WatchEnd::Failed {
                    detail: error.to_string(),
                };
            }
        };
        while read.through < target {
            let until = (Instant::now() + stall).min(deadline);
            match tokio::time::timeout_at(until, updates.next()).await {
                Ok(Ok(update)) => {
                    let (given, revision) = unpack(update);
                    read.given.extend(given);
                    read.through = read.through.max(revision);
                }
                Ok(Err(ClientError::Rejected(Rejection::Compacted { compacted, .. })))
                    if read.unread() && compacted >= read.start =>
                {
                    // The history no longer reaches the start: read from
                    // where it does.
                    read.start = compacted.saturating_add(1);
                    read.through = compacted;
                    problem = format!("the history is compacted through {compacted}");
                    break;
                }
                Ok(Err(ClientError::Rejected(Rejection::Compacted { compacted, .. }))) => {
                    break 'read WatchEnd::Compacted { compacted };
                }
                Ok(Err(
                    error @ (ClientError::PermissionDenied(_) | ClientError::Unauthenticated(_)),
                )) => {
                    break 'read WatchEnd::Failed {
                        detail: error.to_string(),
                    };
                }
                Ok(Err(error)) => {
                    problem = error.to_string();
                    break;
                }
                Err(_) => {
                    problem = format!("no update for {stall:?}");
                    break;
                }
            }
        }
    };
    read
}

/// The highest index any of `endpoints` has applied, asked until one
/// answers or `deadline` passes (`None`: none answered).
async fn applied_target(client: &Client, endpoints: &[String], deadline: Instant) -> Option<u64> {
    loop {
        let mut target = None;
        for endpoint in endpoints {
            if let Ok(status) = client.status(Some(endpoint)).await {
                target = target.max(Some(status.applied_index.unwrap_or(0)));
            }
        }
        if target.is_some() || Instant::now() >= deadline {
            return target;
        }
        tokio::time::sleep_until((Instant::now() + Duration::from_millis(200)).min(deadline)).await;
    }
}

/// Reads the committed changes of `prefix` from `first_revision` through
/// the highest index any of `endpoints` has applied, as watcher `id` with
/// the reference mark, in tries of fresh connections within `budget`, and
/// records what it got (complete through the revision it records, whether
/// or not it got to the end).
pub async fn reference(
    endpoints: &[String],
    client_options: ClientOptions,
    prefix: Vec<u8>,
    first_revision: u64,
    id: WatcherId,
    recorder: &Recorder,
    budget: Duration,
) -> Result<(), ClientError> {
    let deadline = Instant::now() + budget;
    let client = Client::connect(endpoints.to_vec(), client_options.clone())?;
    let read = match applied_target(&client, endpoints, deadline).await {
        Some(target) => {
            let open = |from: u64, attempt: u32| {
                // A fresh client, so fresh connections, starting at the
                // next node each try (the first try at the first).
                let mut rotated = endpoints.to_vec();
                if !rotated.is_empty() {
                    let turn = attempt.saturating_sub(1) as usize % rotated.len();
                    rotated.rotate_left(turn);
                }
                let client = Client::connect(rotated, client_options.clone())?;
                Ok(client.watch(prefix.clone(), options(from)))
            };
            let left = deadline.saturating_duration_since(Instant::now());
            read_reference(open, first_revision, target, left, REFERENCE_STALL).await
        }
        None => ReferenceRead {
            start: first_revision,
            given: Vec::new(),
            through: first_revision.saturating_sub(1),
            end: WatchEnd::Failed {
                detail: format!("no node answered its status within {budget:?}"),
            },
            tries: 0,
        },
    };
    record_reference(recorder, id, prefix, read);
    Ok(())
}

/// Records what the reference read of `prefix` got, as watcher `id`.
pub(crate) fn record_reference(
    recorder: &Recorder,
    id: WatcherId,
    prefix: Vec<u8>,
    read: ReferenceRead,
) {
    recorder.watch_started(id, Bytes(prefix), read.start, true);
    for (revision, key, value) in read.given {
        recorder.watched(id, revision, key, value);
    }
    recorder.watch_stopped(id, read.through, read.end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_client::Event;
    use oncekv_state::KeyMeta;
    use std::collections::VecDeque;

    /// A try that answers what it was scripted to, then waits forever.
    struct Scripted(VecDeque<Result<WatchUpdate, ClientError>>);

    impl Updates for Scripted {
        fn next(&mut self) -> impl Future<Output = Result<WatchUpdate, ClientError>> + Send {
            let next = self.0.pop_front();
            async move {
                match next {
                    Some(update) => update,
                    None => std::future::pending().await,
                }
            }
        }
    }

    /// The change of `acct/0` at `revision`, as a watch gives it.
    fn changed(revision: u64) -> Result<WatchUpdate, ClientError> {
        Ok(WatchUpdate::Changes {
            revision,
            events: vec![Event {
                kind: EventKind::Put,
                key: b"acct/0".to_vec(),
                value: revision.to_string().into_bytes(),
                meta: KeyMeta::default(),
                previous: None,
                revision,
            }],
        })
    }

    fn revisions(read: &ReferenceRead) -> Vec<u64> {
        read.given
            .iter()
            .map(|(revision, _, _)| *revision)
            .collect()
    }

    const BUDGET: Duration = Duration::from_secs(30);
    const STALL: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn the_reference_read_resumes_after_an_interruption() {
        // The first try breaks after revision 3, the second goes silent
        // after revision 6; the third reaches the target.
        let mut opened = Vec::new();
        let open = |from: u64, attempt: u32| {
            opened.push((from, attempt));
            let script: Vec<_> = match attempt {
                1 => vec![
                    changed(from),
                    changed(from + 1),
                    changed(from + 2),
                    Err(ClientError::Unreachable("connection reset".into())),
                ],
                2 => vec![changed(from), changed(from + 1), changed(from + 2)],
                _ => (from..=10)
                    .map(changed)
                    .chain([Ok(WatchUpdate::Progress(12))])
                    .collect(),
            };
            Ok(Scripted(script.into()))
        };
        let read = read_reference(open, 1, 12, BUDGET, STALL).await;
        assert_eq!(read.end, WatchEnd::Stopped);
        assert_eq!(read.start, 1);
        assert_eq!(read.through, 12);
        assert_eq!(revisions(&read), (1..=10).collect::<Vec<_>>());
        assert_eq!(read.tries, 3);
        assert_eq!(opened, vec![(1, 1), (4, 2), (7, 3)]);
    }

    #[tokio::test]
    async fn a_history_compacted_before_the_read_is_read_from_where_it_starts() {
        let open = |from: u64, _attempt: u32| {
            let script: Vec<_> = if from <= 4 {
                vec![Err(ClientError::Rejected(Rejection::Compacted {
                    revision: from,
                    compacted: 4,
                }))]
            } else {
                (from..=6).map(changed).collect()
            };
            Ok(Scripted(script.into()))
        };
        let read = read_reference(open, 1, 6, BUDGET, STALL).await;
        assert_eq!(read.end, WatchEnd::Stopped);
        assert_eq!((read.start, read.through), (5, 6));
        assert_eq!(revisions(&read), vec![5, 6]);
    }

    #[tokio::test]
    async fn a_history_compacted_under_the_read_ends_it_complete_so_far() {
        let open = |from: u64, attempt: u32| {
            let script = if attempt == 1 {
                vec![
                    changed(from),
                    changed(from + 1),
                    Err(ClientError::Unreachable("reset".into())),
                ]
            } else {
                vec![Err(ClientError::Rejected(Rejection::Compacted {
                    revision: from,
                    compacted: 5,
                }))]
            };
            Ok(Scripted(script.into()))
        };
        let read = read_reference(open, 1, 9, BUDGET, STALL).await;
        assert_eq!(read.end, WatchEnd::Compacted { compacted: 5 });
        assert_eq!((read.start, read.through), (1, 2));
        assert_eq!(revisions(&read), vec![1, 2]);
    }

    #[tokio::test]
    async fn a_read_that_never_gets_there_ends_within_its_budget() {
        let open = |from: u64, _attempt: u32| Ok(Scripted(vec![changed(from)].into()));
        let budget = Duration::from_millis(400);
        let started = Instant::now();
        let read = read_reference(open, 1, 1_000, budget, STALL).await;
        assert!(
            matches!(&read.end, WatchEnd::Failed { detail } if detail.contains("of 1000")),
            "{:?}",
            read.end
        );
        // Whatever it got is contiguous from the start.
        assert_eq!(revisions(&read), (1..=read.through).collect::<Vec<_>>());
        assert!(read.tries >= 1);
        assert!(started.elapsed() < budget + STALL + Duration::from_secs(2));
    }
}
