//! Watchers through a fault run, and the reference read after it.
//!
//! [`start`] runs watchers of the accounts' prefix through the faults
//! (over the fault proxies, so dropped connections make them resume): odd
//! ones from the run's first revision (1 on a cluster of its own), even
//! ones from the revision current when they start, a moment into the run. Each records every change it is given
//! and, when stopped, the revision through which it was given everything.
//! [`reference()`] then reads the committed change sequence of the prefix
//! from the healed cluster, from that first revision until a progress notice past
//! the highest applied index: the ground truth `oncekv-check`'s watch
//! checker judges the others by.

use crate::recorder::Recorder;
use oncekv_check::record::{Bytes, WatchEnd, WatcherId};
use oncekv_client::{
    Client, ClientError, ClientOptions, EventKind, WatchOptions, WatchUpdate, Watcher,
};
use oncekv_state::Rejection;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often an idle watch hears its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// How long into the run the later watchers start.
const LATE_START: Duration = Duration::from_secs(3);

fn options(start_revision: u64) -> WatchOptions {
    WatchOptions::default()
        .with_prefix()
        .from_revision(start_revision)
        .with_progress_interval(PROGRESS_INTERVAL)
}

/// Records one update; returns the revision through which everything has
/// now been given.
fn take(recorder: &Recorder, id: WatcherId, update: WatchUpdate, through: u64) -> u64 {
    match update {
        WatchUpdate::Changes { revision, events } => {
            for event in events {
                let value = match event.kind {
                    EventKind::Put => Some(Bytes(event.value)),
                    EventKind::Delete => None,
                };
                recorder.watched(id, event.revision, Bytes(event.key), value);
            }
            through.max(revision)
        }
        WatchUpdate::Progress(revision) => through.max(revision),
    }
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

/// Reads the committed changes of `prefix` from `first_revision` through
/// the highest index any of `endpoints` has applied, as watcher `id` with
/// the reference mark; gives up (recording a failed end) after
/// `patience`.
pub async fn reference(
    endpoints: &[String],
    client_options: ClientOptions,
    prefix: Vec<u8>,
    first_revision: u64,
    id: WatcherId,
    recorder: &Recorder,
    patience: Duration,
) -> Result<(), ClientError> {
    let client = Client::connect(endpoints.to_vec(), client_options)?;
    let mut target = 0;
    for endpoint in endpoints {
        if let Ok(status) = client.status(Some(endpoint)).await {
            target = target.max(status.applied_index.unwrap_or(0));
        }
    }
    recorder.watch_started(id, Bytes(prefix.clone()), first_revision, true);
    let mut watcher = client.watch(prefix, options(first_revision));
    let deadline = Instant::now() + patience;
    let mut through = first_revision.saturating_sub(1);
    let end = loop {
        if through >= target {
            break WatchEnd::Stopped;
        }
        match tokio::time::timeout_at(deadline, watcher.next()).await {
            Ok(Ok(update)) => through = take(recorder, id, update, through),
            Ok(Err(error)) => break failed(error),
            Err(_) => {
                break WatchEnd::Failed {
                    detail: format!("not through revision {target} within {patience:?}"),
                };
            }
        }
    };
    recorder.watch_stopped(id, through, end);
    Ok(())
}
