//! [`LogStore`]: the durable, crash-safe Raft log of a node, generic over the
//! openraft type configuration. It owns the log directory: append-only
//! segment files of checksummed frames ([`segment`]), written by one writer
//! thread that batches every queued request into one frame and one
//! `fdatasync` (group commit, [`writer`]). Entries, truncations, purges,
//! votes and the committed log id are all records of that one ordered
//! stream, so they take effect in submission order and replaying the
//! segments rebuilds the log exactly. The whole live log is also kept in
//! memory, so reads never touch the disk; purging after a snapshot bounds it.
//!
//! Durability: an append's callback fires, and `save_vote`, `truncate_after`
//! and `purge` return, only after their frame is fsynced. The committed log
//! id is lazily durable: it rides along with the next frame, or is flushed
//! after a short idle period or when the store is dropped.

mod segment;
mod writer;

use openraft::alias::{LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftTypeConfig};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::{self, Debug};
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, mpsc};
use std::thread::JoinHandle;

/// Why the log store failed.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    /// A file-system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A segment is damaged somewhere other than a torn tail, or holds
    /// records that contradict each other. The node must not start on it.
    #[error("log segment {path} is damaged at byte {offset}: {reason}")]
    Corrupt {
        /// The segment file (or the log directory).
        path: PathBuf,
        /// Byte offset of the damage in that file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Another process (or another store in this process) has the log open.
    #[error("the log in {0} is already open elsewhere")]
    Locked(PathBuf),
    /// A record could not be encoded.
    #[error("a log record does not encode: {0}")]
    Encode(#[source] postcard::Error),
    /// One append is larger than a frame may be.
    #[error("a log write of {0} bytes exceeds the frame limit")]
    TooLarge(usize),
    /// An appended entry would leave a hole in the log or rewrite a purged
    /// entry.
    #[error("entry {index} does not continue the log, whose next index is {next}")]
    NotContiguous {
        /// The entry's index.
        index: u64,
        /// The index the log expected.
        next: u64,
    },
    /// An earlier write or fsync failed; the log accepts no more writes
    /// until the node restarts (a failed fsync leaves the file's state
    /// unknown, so it is never retried).
    #[error("log write failed: {message}")]
    WriteFailed {
        /// The kind of the underlying I/O error.
        kind: io::ErrorKind,
        /// The underlying error.
        message: String,
    },
}

impl LogStoreError {
    fn io<'a>(
        action: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(io::Error) -> LogStoreError + 'a {
        move |source| LogStoreError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The same failure, for reporting to every request of a failed batch.
    fn to_write_failed(&self) -> LogStoreError {
        match self {
            LogStoreError::WriteFailed { kind, message } => LogStoreError::WriteFailed {
                kind: *kind,
                message: message.clone(),
            },
            other => LogStoreError::WriteFailed {
                kind: io::ErrorKind::from(other),
                message: other.to_string(),
            },
        }
    }
}

impl From<&LogStoreError> for io::ErrorKind {
    fn from(error: &LogStoreError) -> io::ErrorKind {
        match error {
            LogStoreError::Io { source, .. } => source.kind(),
            LogStoreError::Corrupt { .. } | LogStoreError::Encode(_) => io::ErrorKind::InvalidData,
            LogStoreError::Locked(_) => io::ErrorKind::ResourceBusy,
            LogStoreError::TooLarge(_) | LogStoreError::NotContiguous { .. } => {
                io::ErrorKind::InvalidInput
            }
            LogStoreError::WriteFailed { kind, .. } => *kind,
        }
    }
}

impl From<LogStoreError> for io::Error {
    fn from(error: LogStoreError) -> io::Error {
        io::Error::new(io::ErrorKind::from(&error), error)
    }
}

/// Tuning of a [`LogStore`].
#[derive(Clone, Debug)]
pub struct LogStoreOptions {
    /// A segment is closed and a new one started once it holds this many
    /// bytes. Purging deletes whole closed segments.
    pub segment_bytes: u64,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            segment_bytes: 64 * 1024 * 1024,
        }
    }
}

/// What every segment starts with: the state that records in older
/// segments established, so that older segments can be deleted.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
struct Checkpoint<C: RaftTypeConfig> {
    purged: Option<LogIdOf<C>>,
    committed: Option<LogIdOf<C>>,
    vote: Option<VoteOf<C>>,
}

impl<C: RaftTypeConfig> Clone for Checkpoint<C> {
    fn clone(&self) -> Self {
        Checkpoint {
            purged: self.purged.clone(),
            committed: self.committed.clone(),
            vote: self.vote.clone(),
        }
    }
}

/// One record of the log, as read back. Written through [`RecordRef`],
/// which must list the same variants in the same order.
#[derive(Deserialize)]
#[serde(bound = "")]
enum Record<C: RaftTypeConfig> {
    Checkpoint(Checkpoint<C>),
    Entry(C::Entry),
    /// Every entry after this log id (all of them, for `None`) is removed.
    TruncateAfter(Option<LogIdOf<C>>),
    /// Every entry up to and including this log id is removed.
    Purge(LogIdOf<C>),
    Vote(VoteOf<C>),
    Committed(Option<LogIdOf<C>>),
}

/// A record to write, borrowing its content.
#[derive(Serialize)]
#[serde(bound = "")]
enum RecordRef<'a, C: RaftTypeConfig> {
    Checkpoint(&'a Checkpoint<C>),
    Entry(&'a C::Entry),
    TruncateAfter(&'a Option<LogIdOf<C>>),
    Purge(&'a LogIdOf<C>),
    Vote(&'a VoteOf<C>),
    Committed(&'a Option<LogIdOf<C>>),
}

/// Appends the postcard encoding of `record` to `out`.
fn encode<C: RaftTypeConfig>(
    record: &RecordRef<'_, C>,
    out: &mut Vec<u8>,
) -> Result<(), LogStoreError> {
    let buffer = std::mem::take(out);
    *out = postcard::to_extend(record, buffer).map_err(LogStoreError::Encode)?;
    Ok(())
}

/// Whether entries are being appended now (strict) or replayed from disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Live,
    Replay,
}

/// The log as it is in memory: the live entries, consecutive, and the
/// small state around them.
struct Memory<C: RaftTypeConfig> {
    entries: VecDeque<C::Entry>,
    /// Index of `entries[0]`; meaningless while `entries` is empty.
    first: u64,
    purged: Option<LogIdOf<C>>,
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
}

impl<C: RaftTypeConfig> Memory<C> {
    fn new() -> Self {
        Memory {
            entries: VecDeque::new(),
            first: 0,
            purged: None,
            vote: None,
            committed: None,
        }
    }

    fn last_index(&self) -> Option<u64> {
        (self.entries.len() as u64)
            .checked_sub(1)
            .map(|offset| self.first + offset)
    }

    fn purged_index(&self) -> Option<u64> {
        self.purged.as_ref().map(|log_id| log_id.index)
    }

    /// Checks that an entry at `index` may be appended now.
    fn check_next(&self, index: u64) -> Result<(), LogStoreError> {
        let next = match (self.last_index(), self.purged_index()) {
            (Some(last), _) => last + 1,
            (None, Some(purged)) => purged + 1,
            (None, None) => return Ok(()),
        };
        // An entry may also replace a suffix of the live entries.
        let replaces = !self.entries.is_empty() && index >= self.first && index < next;
        if index == next || replaces {
            Ok(())
        } else {
            Err(LogStoreError::NotContiguous { index, next })
        }
    }

    /// Adds an entry at the end, replacing any entries from its index on.
    /// Replay skips entries already purged and accepts any index into an
    /// empty log (older segments may have been deleted after a purge;
    /// [`Memory::validate`] checks the result).
    fn push(&mut self, entry: C::Entry, mode: Mode) -> Result<(), LogStoreError> {
        let index = entry.index();
        if mode == Mode::Replay {
            if self.purged_index().is_some_and(|purged| index <= purged) {
                return Ok(());
            }
            if self.entries.is_empty() {
                self.first = index;
                self.entries.push_back(entry);
                return Ok(());
            }
        }
        self.check_next(index)?;
        if self.entries.is_empty() {
            self.first = index;
        } else {
            let keep = (index - self.first) as usize;
            self.entries.truncate(keep);
        }
        self.entries.push_back(entry);
        Ok(())
    }

    fn truncate_after(&mut self, last: Option<&LogIdOf<C>>) {
        match last {
            Some(last) if last.index >= self.first => {
                let keep = (last.index - self.first + 1) as usize;
                self.entries.truncate(keep);
            }
            _ => self.entries.clear(),
        }
    }

    fn purge(&mut self, upto: &LogIdOf<C>) {
        if self
            .purged_index()
            .is_some_and(|purged| purged >= upto.index)
        {
            return;
        }
        if !self.entries.is_empty() && upto.index >= self.first {
            let drop = ((upto.index - self.first + 1) as usize).min(self.entries.len());
            self.entries.drain(..drop);
            self.first = upto.index + 1;
        }
        self.purged = Some(upto.clone());
    }

    fn apply_checkpoint(&mut self, checkpoint: Checkpoint<C>) {
        if let Some(purged) = &checkpoint.purged {
            self.purge(purged);
        }
        if checkpoint.vote.is_some() {
            self.vote = checkpoint.vote;
        }
        if checkpoint.committed.is_some() {
            self.committed = checkpoint.committed;
        }
    }

    fn replay(&mut self, record: Record<C>) -> Result<(), LogStoreError> {
        match record {
            Record::Checkpoint(checkpoint) => self.apply_checkpoint(checkpoint),
            Record::Entry(entry) => self.push(entry, Mode::Replay)?,
            Record::TruncateAfter(last) => self.truncate_after(last.as_ref()),
            Record::Purge(upto) => self.purge(&upto),
            Record::Vote(vote) => self.vote = Some(vote),
            Record::Committed(committed) => self.committed = committed,
        }
        Ok(())
    }

    /// After replay: the live entries must start right after the purged
    /// ones, or entries in between are missing.
    fn validate(&self, dir: &Path) -> Result<(), LogStoreError> {
        if let (Some(purged), false) = (self.purged_index(), self.entries.is_empty())
            && self.first != purged + 1
        {
            return Err(LogStoreError::Corrupt {
                path: dir.to_path_buf(),
                offset: 0,
                reason: format!(
                    "entries {}..{} are missing between the purged prefix and the live log",
                    purged + 1,
                    self.first
                ),
            });
        }
        Ok(())
    }

    fn checkpoint(&self) -> Checkpoint<C> {
        Checkpoint {
            purged: self.purged.clone(),
            committed: self.committed.clone(),
            vote: self.vote.clone(),
        }
    }

    fn log_state(&self) -> LogState<C> {
        let last = self.entries.back().map(|entry| entry.log_id());
        LogState {
            last_purged_log_id: self.purged.clone(),
            last_log_id: last.or_else(|| self.purged.clone()),
        }
    }

    fn range<RB: RangeBounds<u64>>(&self, range: &RB) -> Vec<C::Entry>
    where
        C::Entry: Clone,
    {
        let start = match range.start_bound() {
            Bound::Included(start) => *start,
            Bound::Excluded(start) => start.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(end) => end.saturating_add(1),
            Bound::Excluded(end) => *end,
            Bound::Unbounded => u64::MAX,
        };
        let live_end = self.first + self.entries.len() as u64;
        let start = start.max(self.first);
        let end = end.min(live_end);
        if start >= end {
            return Vec::new();
        }
        let from = (start - self.first) as usize;
        let to = (end - self.first) as usize;
        self.entries.range(from..to).cloned().collect()
    }
}

type Shared<C> = Arc<RwLock<Memory<C>>>;

fn read<C: RaftTypeConfig>(memory: &Shared<C>) -> RwLockReadGuard<'_, Memory<C>> {
    // No code panics while holding the lock, so a poisoned lock still
    // guards consistent data.
    memory
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<C: RaftTypeConfig>(memory: &Shared<C>) -> RwLockWriteGuard<'_, Memory<C>> {
    memory
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The durable Raft log of one node. See the module documentation.
pub struct LogStore<C: RaftTypeConfig> {
    dir: PathBuf,
    memory: Shared<C>,
    ops: Option<mpsc::Sender<writer::Op<C>>>,
    writer: Option<JoinHandle<()>>,
    /// Held (and locked) for the lifetime of the store.
    _lock: File,
}

impl<C: RaftTypeConfig> Debug for LogStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// A reader of a [`LogStore`]'s entries and vote, for replication tasks.
pub struct LogReader<C: RaftTypeConfig> {
    memory: Shared<C>,
}

impl<C: RaftTypeConfig> Clone for LogReader<C> {
    fn clone(&self) -> Self {
        LogReader {
            memory: Arc::clone(&self.memory),
        }
    }
}

impl<C: RaftTypeConfig> Debug for LogReader<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogReader").finish_non_exhaustive()
    }
}

const LOCK_FILE: &str = "LOCK";

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (or creates) the log in `dir` with default options.
    pub fn open(dir: &Path) -> Result<LogStore<C>, LogStoreError> {
        LogStore::open_with(dir, LogStoreOptions::default())
    }

    /// Opens (or creates) the log in `dir`: replays its segments, cuts off
    /// a torn tail, refuses other damage, and starts a fresh segment.
    pub fn open_with(dir: &Path, options: LogStoreOptions) -> Result<LogStore<C>, LogStoreError> {
        std::fs::create_dir_all(dir).map_err(LogStoreError::io("creating", dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(LogStoreError::io("opening", &lock_path))?;
        lock.try_lock().map_err(|error| match error {
            std::fs::TryLockError::WouldBlock => LogStoreError::Locked(dir.to_path_buf()),
            std::fs::TryLockError::Error(source) => LogStoreError::Io {
                action: "locking",
                path: lock_path.clone(),
                source,
            },
        })?;

        let numbers = segment::list(dir)?;
        let mut memory = Memory::new();
        let mut closed = VecDeque::new();
        for (position, number) in numbers.iter().enumerate() {
            let last = position + 1 == numbers.len();
            if let Some(scan) = segment::read::<C>(dir, *number, last)? {
                let path = segment::path(dir, *number);
                for record in scan.records {
                    memory
                        .replay(record)
                        .map_err(|error| LogStoreError::Corrupt {
                            path: path.clone(),
                            offset: 0,
                            reason: format!("records contradict each other: {error}"),
                        })?;
                }
                closed.push_back(writer::Closed {
                    number: *number,
                    max_index: scan.max_index,
                });
            }
        }
        memory.validate(dir)?;
        // Segments are deleted oldest first and only once purged: without a
        // purge, the log must still start at the first segment.
        if memory.purged.is_none()
            && let Some(oldest) = closed.front()
            && oldest.number != segment::FIRST_NUMBER
        {
            return Err(LogStoreError::Corrupt {
                path: dir.to_path_buf(),
                offset: 0,
                reason: format!(
                    "segments before {} are missing and nothing was purged",
                    oldest.number
                ),
            });
        }

        let next_number = closed
            .back()
            .map_or(segment::FIRST_NUMBER, |segment| segment.number + 1);
        let current = segment::Active::create(dir, next_number, &memory.checkpoint())?;
        let (ops, requests) = mpsc::channel();
        let state = writer::Writer::new(
            dir.to_path_buf(),
            options,
            current,
            closed,
            memory.checkpoint(),
        );
        let handle = std::thread::Builder::new()
            .name("oncekv-log-writer".into())
            .spawn(move || state.run(requests))
            .map_err(LogStoreError::io("starting the writer for", dir))?;
        Ok(LogStore {
            dir: dir.to_path_buf(),
            memory: Arc::new(RwLock::new(memory)),
            ops: Some(ops),
            writer: Some(handle),
            _lock: lock,
        })
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn submit(&self, op: writer::Op<C>) -> Result<(), LogStoreError> {
        let stopped = || LogStoreError::WriteFailed {
            kind: io::ErrorKind::BrokenPipe,
            message: "the log writer has stopped".into(),
        };
        self.ops
            .as_ref()
            .ok_or_else(stopped)?
            .send(op)
            .map_err(|_| stopped())
    }

    /// Writes one record and waits until it is durable.
    async fn write_durably(
        &self,
        record: RecordRef<'_, C>,
        effect: writer::Effect<C>,
    ) -> Result<(), LogStoreError> {
        let mut bytes = Vec::new();
        encode(&record, &mut bytes)?;
        let (reply, done) = tokio::sync::oneshot::channel();
        self.submit(writer::Op::Write {
            bytes,
            effect,
            reply,
        })?;
        done.await.map_err(|_| LogStoreError::WriteFailed {
            kind: io::ErrorKind::BrokenPipe,
            message: "the log writer stopped before answering".into(),
        })?
    }

    async fn append_entries(
        &mut self,
        entries: Vec<C::Entry>,
        callback: IOFlushed<C>,
    ) -> Result<(), LogStoreError> {
        let mut bytes = Vec::new();
        for entry in &entries {
            encode(&RecordRef::<C>::Entry(entry), &mut bytes)?;
        }
        let last_index = entries.last().map(|entry| entry.index());
        {
            let mut memory = write(&self.memory);
            // Check the whole batch before changing anything.
            if let Some(first) = entries.first() {
                memory.check_next(first.index())?;
            }
            for (pair, offset) in entries.windows(2).zip(1u64..) {
                let expected = pair[0].index() + 1;
                if pair[1].index() != expected {
                    return Err(LogStoreError::NotContiguous {
                        index: entries[0].index() + offset,
                        next: expected,
                    });
                }
            }
            for entry in entries {
                memory.push(entry, Mode::Live)?;
            }
        }
        self.submit(writer::Op::Append {
            bytes,
            last_index,
            done: callback,
        })
    }
}

impl<C: RaftTypeConfig> Drop for LogStore<C> {
    fn drop(&mut self) {
        // Closing the channel lets the writer flush what it holds and stop;
        // waiting for it means a reopen never races a last write.
        drop(self.ops.take());
        if let Some(handle) = self.writer.take()
            && handle.join().is_err()
        {
            tracing::error!(dir = %self.dir.display(), "the log writer panicked");
        }
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C>
where
    C::Entry: Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        Ok(read(&self.memory).range(&range))
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(read(&self.memory).vote.clone())
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C>
where
    C::Entry: Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        Ok(read(&self.memory).range(&range))
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(read(&self.memory).vote.clone())
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C>
where
    C::Entry: Clone,
{
    type LogReader = LogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        Ok(read(&self.memory).log_state())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            memory: Arc::clone(&self.memory),
        }
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        self.write_durably(RecordRef::Vote(vote), writer::Effect::Vote(vote.clone()))
            .await?;
        write(&self.memory).vote = Some(vote.clone());
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        write(&self.memory).committed = committed.clone();
        self.submit(writer::Op::Committed(committed))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        Ok(read(&self.memory).committed.clone())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<C::Entry> = entries.into_iter().collect();
        Ok(self.append_entries(entries, callback).await?)
    }

    async fn truncate_after(&mut self, last: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        self.write_durably(RecordRef::TruncateAfter(&last), writer::Effect::None)
            .await?;
        write(&self.memory).truncate_after(last.as_ref());
        Ok(())
    }

    async fn purge(&mut self, upto: LogIdOf<C>) -> Result<(), io::Error> {
        if read(&self.memory)
            .purged_index()
            .is_some_and(|purged| purged >= upto.index)
        {
            return Ok(());
        }
        self.write_durably(RecordRef::Purge(&upto), writer::Effect::Purge(upto.clone()))
            .await?;
        write(&self.memory).purge(&upto);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::type_config::TypeConfig;
    use openraft::testing::{blank_ent, log_id};

    type C = TypeConfig;

    /// `RecordRef` writes what `Record` reads, variant for variant.
    #[test]
    fn every_record_round_trips() {
        let checkpoint = Checkpoint::<C> {
            purged: Some(log_id::<C>(1, 2, 3)),
            committed: Some(log_id::<C>(1, 2, 5)),
            vote: Some(VoteOf::<C>::new(4, 2)),
        };
        let entry = blank_ent::<C>(2, 1, 7);
        let truncate = Some(log_id::<C>(2, 1, 6));
        let purge = log_id::<C>(1, 2, 3);
        let vote = VoteOf::<C>::new(9, 1);
        let committed = Some(log_id::<C>(2, 1, 6));
        let mut bytes = Vec::new();
        for record in [
            RecordRef::Checkpoint(&checkpoint),
            RecordRef::Entry(&entry),
            RecordRef::TruncateAfter(&truncate),
            RecordRef::Purge(&purge),
            RecordRef::Vote(&vote),
            RecordRef::Committed(&committed),
        ] {
            encode::<C>(&record, &mut bytes).expect("encode");
        }
        let mut rest = bytes.as_slice();
        let mut decoded = Vec::new();
        while !rest.is_empty() {
            let (record, tail) = postcard::take_from_bytes::<Record<C>>(rest).expect("decode");
            decoded.push(record);
            rest = tail;
        }
        assert!(matches!(
            &decoded[..],
            [
                Record::Checkpoint(c),
                Record::Entry(e),
                Record::TruncateAfter(t),
                Record::Purge(p),
                Record::Vote(v),
                Record::Committed(m),
            ] if c.purged == checkpoint.purged && c.committed == checkpoint.committed
                && c.vote == checkpoint.vote && e.log_id == entry.log_id && *t == truncate
                && *p == purge && *v == vote && *m == committed
        ));
    }

    #[test]
    fn memory_refuses_holes_and_purged_rewrites() {
        let mut memory = Memory::<C>::new();
        memory
            .push(blank_ent::<C>(1, 1, 5), Mode::Live)
            .expect("any first index");
        memory
            .push(blank_ent::<C>(1, 1, 6), Mode::Live)
            .expect("next");
        assert!(matches!(
            memory.push(blank_ent::<C>(1, 1, 8), Mode::Live),
            Err(LogStoreError::NotContiguous { index: 8, next: 7 })
        ));
        memory
            .push(blank_ent::<C>(2, 1, 6), Mode::Live)
            .expect("replaces the suffix");
        assert_eq!(memory.last_index(), Some(6));
        memory.purge(&log_id::<C>(2, 1, 6));
        assert!(memory.entries.is_empty());
        assert!(matches!(
            memory.push(blank_ent::<C>(2, 1, 6), Mode::Live),
            Err(LogStoreError::NotContiguous { index: 6, next: 7 })
        ));
        memory
            .push(blank_ent::<C>(2, 1, 7), Mode::Live)
            .expect("after the purged prefix");
        assert_eq!(memory.range(&(0..100)).len(), 1);
    }
}
