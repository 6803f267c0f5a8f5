//! The log's writer thread: the only code that writes segments. It waits
//! for a request, drains every other request queued meanwhile, writes them
//! all as one frame with one `fdatasync`, and only then answers them (group
//! commit: appends that arrive while an fsync is in flight share the next
//! one). It also rolls segments and deletes purged ones. After a failed
//! write it fails every later request: a failed fsync leaves the file in an
//! unknown state, so it is never retried.

use super::segment::{self, Active, FRAME_BYTES_MAX, FrameBuf};
use super::{Checkpoint, LogStoreError, LogStoreOptions, RecordRef};
use openraft::RaftTypeConfig;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::storage::IOFlushed;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// At most this many requests share one frame.
const BATCH_OPS_MAX: usize = 4096;
/// A committed log id not carried by any other write is flushed alone
/// after this idle time.
const COMMITTED_FLUSH_DELAY: Duration = Duration::from_millis(100);

/// A request to the writer.
pub(super) enum Op<C: RaftTypeConfig> {
    /// Encoded entries; `done` fires once they are durable.
    Append {
        bytes: Vec<u8>,
        last_index: Option<u64>,
        done: IOFlushed<C>,
    },
    /// One encoded record (truncation, purge, vote) and its effect on the
    /// writer's state; `reply` answers once it is durable.
    Write {
        bytes: Vec<u8>,
        effect: Effect<C>,
        reply: tokio::sync::oneshot::Sender<Result<(), LogStoreError>>,
    },
    /// The newest committed log id, written lazily.
    Committed(Option<LogIdOf<C>>),
}

/// What a [`Op::Write`] changes in the state checkpointed into new segments.
pub(super) enum Effect<C: RaftTypeConfig> {
    None,
    Purge(LogIdOf<C>),
    Vote(VoteOf<C>),
}

/// A segment no longer written to.
pub(super) struct Closed {
    pub(super) number: u64,
    /// The highest entry index ever written to it.
    pub(super) max_index: Option<u64>,
}

pub(super) struct Writer<C: RaftTypeConfig> {
    dir: PathBuf,
    options: LogStoreOptions,
    current: Active,
    closed: VecDeque<Closed>,
    /// Purged log id, vote and committed log id as of the last request.
    state: Checkpoint<C>,
    /// The committed log id as last written.
    committed_written: Option<LogIdOf<C>>,
    failure: Option<LogStoreError>,
}

impl<C: RaftTypeConfig> Writer<C> {
    pub(super) fn new(
        dir: PathBuf,
        options: LogStoreOptions,
        current: Active,
        closed: VecDeque<Closed>,
        state: Checkpoint<C>,
    ) -> Writer<C> {
        Writer {
            dir,
            options,
            current,
            closed,
            committed_written: state.committed.clone(),
            state,
            failure: None,
        }
    }

    pub(super) fn run(mut self, requests: Receiver<Op<C>>) {
        loop {
            let first = if self.committed_pending() {
                match requests.recv_timeout(COMMITTED_FLUSH_DELAY) {
                    Ok(op) => op,
                    Err(RecvTimeoutError::Timeout) => {
                        self.flush(Vec::new());
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        self.flush(Vec::new());
                        return;
                    }
                }
            } else {
                match requests.recv() {
                    Ok(op) => op,
                    Err(_) => return,
                }
            };
            let mut batch = vec![first];
            while batch.len() < BATCH_OPS_MAX {
                match requests.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.flush(batch);
        }
    }

    fn committed_pending(&self) -> bool {
        self.failure.is_none() && self.state.committed != self.committed_written
    }

    /// Writes a batch durably, then answers each of its requests.
    fn flush(&mut self, batch: Vec<Op<C>>) {
        let result = match &self.failure {
            Some(failure) => Err(failure.to_write_failed()),
            None => self.write(&batch),
        };
        if let Err(error) = &result
            && self.failure.is_none()
        {
            tracing::error!(%error, dir = %self.dir.display(), "log write failed: the log accepts no more writes");
            self.failure = Some(error.to_write_failed());
        }
        for op in batch {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(error.to_write_failed()),
            };
            match op {
                Op::Append { done, .. } => done.io_completed(outcome.map_err(io::Error::from)),
                Op::Write { reply, .. } => {
                    // The requester may have gone away; nothing to tell.
                    let _ = reply.send(outcome);
                }
                Op::Committed(_) => {}
            }
        }
    }

    fn write(&mut self, batch: &[Op<C>]) -> Result<(), LogStoreError> {
        let mut frame = FrameBuf::new();
        let mut purge_upto = None;
        for op in batch {
            let bytes = match op {
                Op::Append {
                    bytes, last_index, ..
                } => {
                    self.current.max_index = self.current.max_index.max(*last_index);
                    bytes
                }
                Op::Write { bytes, effect, .. } => {
                    match effect {
                        Effect::None => {}
                        Effect::Purge(upto) => {
                            purge_upto = Some(upto.index);
                            self.state.purged = Some(upto.clone());
                        }
                        Effect::Vote(vote) => self.state.vote = Some(vote.clone()),
                    }
                    bytes
                }
                Op::Committed(committed) => {
                    self.state.committed = committed.clone();
                    continue;
                }
            };
            if bytes.len() > FRAME_BYTES_MAX {
                return Err(LogStoreError::TooLarge(bytes.len()));
            }
            if frame.payload_len() + bytes.len() > FRAME_BYTES_MAX {
                self.current.write_frame(&mut frame)?;
            }
            frame.extend(bytes);
        }
        if self.state.committed != self.committed_written {
            frame.push(&RecordRef::<C>::Committed(&self.state.committed))?;
        }
        if !frame.is_empty() {
            self.current.write_frame(&mut frame)?;
            self.committed_written = self.state.committed.clone();
        }
        if let Some(upto) = purge_upto {
            self.delete_purged(upto)?;
        }
        if self.current.bytes >= self.options.segment_bytes {
            self.roll()?;
        }
        Ok(())
    }

    /// Closes the active segment and starts the next one.
    fn roll(&mut self) -> Result<(), LogStoreError> {
        let next = Active::create(&self.dir, self.current.number + 1, &self.state)?;
        let old = std::mem::replace(&mut self.current, next);
        self.closed.push_back(Closed {
            number: old.number,
            max_index: old.max_index,
        });
        self.committed_written = self.state.committed.clone();
        Ok(())
    }

    /// Deletes the oldest closed segments while every entry they hold is
    /// purged. Newer segments start with a checkpoint, so nothing else is
    /// lost with them.
    fn delete_purged(&mut self, upto: u64) -> Result<(), LogStoreError> {
        let mut deleted = false;
        while let Some(oldest) = self.closed.front() {
            if oldest.max_index.is_some_and(|max| max > upto) {
                break;
            }
            let path = segment::path(&self.dir, oldest.number);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(LogStoreError::Io {
                        action: "deleting",
                        path,
                        source,
                    });
                }
            }
            self.closed.pop_front();
            deleted = true;
        }
        if deleted {
            segment::sync_dir(&self.dir)?;
        }
        Ok(())
    }
}
