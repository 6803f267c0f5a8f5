//! [`SegmentLog`]: the durable, crash-safe Raft log. A segment file starts
//! with the magic `oncekvL2`; a writer thread drains every queued append and
//! writes them as one frame, `[length u32][body crc32 u32][header crc32
//! u32][postcard records]`, then issues one `fdatasync` (group commit)
//! before any of their callbacks fire. One checksum covers the whole body,
//! so whatever order the disk persisted its pages in, a frame is either
//! whole or torn; the header's own checksum lets recovery look for intact
//! frames after damage in one cheap pass. Segments without the magic, from
//! before frames had a header checksum, are read as they were written and
//! never appended to. Truncation and purge are records too, so replaying
//! the segments in order rebuilds the log exactly. A torn tail (a crash or
//! power loss in the middle of a write) is detected by length and checksum
//! and cut off on open; damage anywhere else is an error, never silently
//! skipped. The vote lives in its own file, replaced atomically by the
//! writer thread after the appends queued before it, and durable before
//! `save_vote` returns. Entries are also kept in memory, so reads never
//! touch the disk. [`SegmentLog::open_inline`] writes on the caller's task
//! instead of a thread (same files, same order, one sync per write), for
//! deterministic simulation, where every step must happen inside the
//! simulated runtime.

use super::type_config::TypeConfig;
use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, mpsc};

/// Segments are rolled once they exceed this size.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// The first bytes of every segment written in the current format.
const SEGMENT_MAGIC: &[u8; 8] = b"oncekvL2";
/// Frame header: body length, body checksum, checksum of those 8 bytes.
const HEADER_BYTES: usize = 12;
/// Frame header of segments without the magic: length and body checksum.
const LEGACY_HEADER_BYTES: usize = 8;
/// A batch is cut into frames of about this size, each synced before the
/// next is written, so no frame outgrows its `u32` length and a torn write
/// can only ever damage the last frame.
const FRAME_BYTES_TARGET: usize = 16 * 1024 * 1024;
const VOTE_FILE: &str = "vote";

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry),
    /// Every entry after this log id (or every entry, for `None`) is gone.
    TruncateAfter(Option<LogId>),
    /// Every entry up to and including this log id is purged.
    Purged(LogId),
}

#[derive(Default)]
struct Memory {
    entries: BTreeMap<u64, Entry>,
    purged: Option<LogId>,
    vote: Option<Vote>,
}

impl Memory {
    fn replay(&mut self, record: Record) {
        match record {
            Record::Entry(entry) => {
                let index = entry.log_id.index;
                self.entries.split_off(&index);
                self.entries.insert(index, entry);
            }
            Record::TruncateAfter(last) => match last {
                Some(last) => {
                    self.entries.split_off(&(last.index + 1));
                }
                None => self.entries.clear(),
            },
            Record::Purged(log_id) => {
                self.entries = self.entries.split_off(&(log_id.index + 1));
                self.purged = Some(log_id);
            }
        }
    }
}

enum Done {
    Flushed(IOFlushed<TypeConfig>),
    Reply(tokio::sync::oneshot::Sender<io::Result<()>>),
}

struct Pending {
    /// Encoded records, without framing.
    bytes: Vec<u8>,
    max_index: Option<u64>,
    purge_through: Option<u64>,
    /// A vote to make durable after everything queued before it.
    vote: Option<Vote>,
    done: Done,
}

/// Where writes are made durable.
#[derive(Clone)]
enum Writer {
    /// The writer thread, which group-commits everything queued.
    Thread(mpsc::Sender<Pending>),
    /// On the caller's task; `None` once a write has failed.
    Inline(Arc<Mutex<Option<Segments>>>),
}

/// The durable Raft log of one node.
#[derive(Clone)]
pub struct SegmentLog {
    dir: PathBuf,
    memory: Arc<RwLock<Memory>>,
    writer: Writer,
}

impl Debug for SegmentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLog")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn corrupt(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn encode(record: &Record, out: &mut Vec<u8>) -> io::Result<()> {
    let taken = std::mem::take(out);
    *out = postcard::to_extend(record, taken)
        .map_err(|e| io::Error::other(format!("log record does not encode: {e}")))?;
    Ok(())
}

/// Frames `records` (encoded, concatenated) behind its length and checksum.
fn frame<'a>(records: impl Iterator<Item = &'a [u8]> + Clone) -> io::Result<Vec<u8>> {
    let length: usize = records.clone().map(<[u8]>::len).sum();
    let length = u32::try_from(length)
        .map_err(|_| io::Error::other("log write larger than 4 GiB in one frame"))?;
    let mut crc = crc32fast::Hasher::new();
    records.clone().for_each(|bytes| crc.update(bytes));
    let mut out = Vec::with_capacity(HEADER_BYTES + length as usize);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    records.for_each(|bytes| out.extend_from_slice(bytes));
    Ok(out)
}

fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:010}.log"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// How a segment's frames are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// Behind [`SEGMENT_MAGIC`], headers with their own checksum.
    Current,
    /// No magic, no header checksum (segments of earlier versions).
    Legacy,
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Parses the frame at the start of `bytes`: its records and its size.
fn parse_frame(bytes: &[u8], format: Format) -> Option<(Vec<Record>, usize)> {
    let header_bytes = match format {
        Format::Current => HEADER_BYTES,
        Format::Legacy => LEGACY_HEADER_BYTES,
    };
    let header = bytes.get(..header_bytes)?;
    if format == Format::Current && crc32fast::hash(&header[..8]) != le_u32(&header[8..]) {
        return None;
    }
    let length = le_u32(header) as usize;
    let body = bytes.get(header_bytes..header_bytes.checked_add(length)?)?;
    if body.is_empty() || crc32fast::hash(body) != le_u32(&header[4..]) {
        return None;
    }
    let mut records = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (record, after) = postcard::take_from_bytes(rest).ok()?;
        records.push(record);
        rest = after;
    }
    Some((records, header_bytes + length))
}

/// Whether an intact frame starts anywhere in `bytes`. Linear for the
/// current format: a body is checksummed only behind an intact header.
fn any_frame_in(bytes: &[u8], format: Format) -> bool {
    (0..bytes.len()).any(|at| parse_frame(&bytes[at..], format).is_some())
}

/// A segment as read on start.
struct ReadSegment {
    records: Vec<Record>,
    /// Bytes of the file that hold intact frames (with the magic).
    bytes: u64,
    format: Format,
}

/// Reads every record of one segment. A bad frame at the end of the last
/// segment is a torn write: the file is cut there. Anywhere else it is an
/// error. A last segment that is empty or holds only part of the magic (a
/// crash as it was created) is cut to nothing.
fn read_segment(path: &Path, last: bool) -> io::Result<ReadSegment> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let (format, mut offset) = if bytes.starts_with(SEGMENT_MAGIC) {
        (Format::Current, SEGMENT_MAGIC.len())
    } else if last && bytes.len() < SEGMENT_MAGIC.len() && SEGMENT_MAGIC.starts_with(&bytes) {
        cut(path, 0)?;
        return Ok(ReadSegment {
            records: Vec::new(),
            bytes: 0,
            format: Format::Current,
        });
    } else {
        (Format::Legacy, 0)
    };
    let mut records = Vec::new();
    while offset < bytes.len() {
        match parse_frame(&bytes[offset..], format) {
            Some((frame, size)) => {
                records.extend(frame);
                offset += size;
            }
            // A torn write can only damage the very end of the log: if any
            // intact frame follows the damage, it is not a torn write.
            None if last && !any_frame_in(&bytes[offset + 1..], format) => {
                tracing::warn!(
                    segment = %path.display(),
                    offset,
                    dropped_bytes = bytes.len() - offset,
                    "torn write at the end of the log: cutting it off"
                );
                cut(path, offset as u64)?;
                break;
            }
            None => {
                return Err(corrupt(format!(
                    "log segment {} is damaged at byte {offset} (not a torn tail): refusing to start",
                    path.display()
                )));
            }
        }
    }
    Ok(ReadSegment {
        records,
        bytes: offset as u64,
        format,
    })
}

/// Cuts the file at `length` bytes, durably.
fn cut(path: &Path, length: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(length)?;
    file.sync_all()
}

/// Creates segment `number` with its magic, durably.
fn create_segment(dir: &Path, number: u64) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(segment_path(dir, number))?;
    file.write_all(SEGMENT_MAGIC)?;
    file.sync_data()?;
    sync_dir(dir)?;
    Ok(file)
}

fn read_vote(dir: &Path) -> io::Result<Option<Vote>> {
    match std::fs::read(dir.join(VOTE_FILE)) {
        Ok(bytes) => {
            if bytes.len() < 4 {
                return Err(corrupt("vote file truncated".into()));
            }
            let (crc, body) = bytes.split_at(4);
            if crc32fast::hash(body).to_le_bytes() != crc {
                return Err(corrupt("vote file checksum mismatch".into()));
            }
            postcard::from_bytes(body)
                .map(Some)
                .map_err(|e| corrupt(format!("vote file does not decode: {e}")))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

fn write_vote(dir: &Path, vote: &Vote) -> io::Result<()> {
    let body = postcard::to_allocvec(vote).map_err(io::Error::other)?;
    let mut bytes = crc32fast::hash(&body).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let tmp = dir.join(format!("{VOTE_FILE}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(VOTE_FILE))?;
    sync_dir(dir)
}

/// The writer's view of the segment files.
struct Segments {
    dir: PathBuf,
    /// Segment number and the highest entry index ever written to it.
    closed: Vec<(u64, Option<u64>)>,
    current: File,
    current_number: u64,
    current_max: Option<u64>,
    current_bytes: u64,
    /// Frame size a batch is cut at ([`FRAME_BYTES_TARGET`]).
    frame_target: usize,
}

impl Segments {
    fn write_batch(&mut self, batch: &[Pending]) -> io::Result<()> {
        let mut purge_through = None;
        let mut start = 0;
        while start < batch.len() {
            // Writes batch[start..end] as one frame; at least one write.
            let mut end = start + 1;
            let mut size = batch[start].bytes.len();
            while end < batch.len() && size + batch[end].bytes.len() <= self.frame_target {
                size += batch[end].bytes.len();
                end += 1;
            }
            let writes = &batch[start..end];
            start = end;
            for write in writes {
                self.current_max = self.current_max.max(write.max_index);
                purge_through = purge_through.max(write.purge_through);
            }
            if size == 0 {
                continue;
            }
            let framed = frame(writes.iter().map(|write| write.bytes.as_slice()))?;
            self.current.write_all(&framed)?;
            self.current_bytes += framed.len() as u64;
            self.current.sync_data()?;
        }
        // Votes go through the same queue as appends, so a vote never
        // becomes durable before appends submitted ahead of it.
        if let Some(vote) = batch.iter().rev().find_map(|write| write.vote) {
            write_vote(&self.dir, &vote)?;
        }
        if self.current_bytes >= SEGMENT_BYTES {
            self.roll()?;
        }
        if let Some(through) = purge_through {
            self.delete_purged(through)?;
        }
        Ok(())
    }

    fn roll(&mut self) -> io::Result<()> {
        let number = self.current_number + 1;
        let file = create_segment(&self.dir, number)?;
        self.closed.push((self.current_number, self.current_max));
        self.current = file;
        self.current_number = number;
        self.current_max = None;
        self.current_bytes = SEGMENT_MAGIC.len() as u64;
        Ok(())
    }

    /// Deletes the oldest segments while every entry they hold is purged.
    fn delete_purged(&mut self, through: u64) -> io::Result<()> {
        let mut deleted = 0;
        for (number, max) in &self.closed {
            if max.is_some_and(|max| max > through) {
                break;
            }
            std::fs::remove_file(segment_path(&self.dir, *number))?;
            deleted += 1;
        }
        if deleted > 0 {
            self.closed.drain(..deleted);
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

impl Done {
    fn complete(self, outcome: io::Result<()>) {
        match self {
            Done::Flushed(callback) => callback.io_completed(outcome),
            Done::Reply(reply) => {
                let _ = reply.send(outcome);
            }
        }
    }
}

/// Writes and syncs one batch, then completes each of its writes; whether
/// it succeeded.
fn write_and_complete(segments: &mut Segments, batch: Vec<Pending>) -> bool {
    let result = segments.write_batch(&batch);
    if let Err(error) = &result {
        tracing::error!(%error, "log write failed: this node stops acknowledging");
    }
    for write in batch {
        let outcome = match &result {
            Ok(()) => Ok(()),
            Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
        };
        write.done.complete(outcome);
    }
    result.is_ok()
}

fn failed_log() -> io::Error {
    io::Error::other("the log is failed after a write error")
}

fn run_writer(mut segments: Segments, requests: mpsc::Receiver<Pending>) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        if !write_and_complete(&mut segments, batch) {
            // A failed fsync leaves the file in an unknown state: never
            // write to it again. Later requests fail until restart.
            for write in requests.iter() {
                write.done.complete(Err(failed_log()));
            }
            return;
        }
    }
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, replaying its segments; a
    /// writer thread makes appends durable.
    pub fn open(dir: &Path) -> io::Result<SegmentLog> {
        let (memory, segments) = Self::replay(dir)?;
        let (writer, requests) = mpsc::channel();
        std::thread::Builder::new()
            .name("oncekv-log-writer".into())
            .spawn(move || run_writer(segments, requests))?;
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            memory: Arc::new(RwLock::new(memory)),
            writer: Writer::Thread(writer),
        })
    }

    /// Opens the log like [`SegmentLog::open`], but makes each write durable
    /// on the calling task before it returns, without a thread.
    pub fn open_inline(dir: &Path) -> io::Result<SegmentLog> {
        let (memory, segments) = Self::replay(dir)?;
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            memory: Arc::new(RwLock::new(memory)),
            writer: Writer::Inline(Arc::new(Mutex::new(Some(segments)))),
        })
    }

    fn replay(dir: &Path) -> io::Result<(Memory, Segments)> {
        std::fs::create_dir_all(dir)?;
        let mut numbers: Vec<u64> = std::fs::read_dir(dir)?
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                name.to_str()?.strip_suffix(".log")?.parse().ok()
            })
            .collect();
        numbers.sort_unstable();
        let mut memory = Memory {
            vote: read_vote(dir)?,
            ..Memory::default()
        };
        let mut closed = Vec::new();
        let mut tail = None;
        for (position, number) in numbers.iter().enumerate() {
            let last = position + 1 == numbers.len();
            let segment = read_segment(&segment_path(dir, *number), last)?;
            let mut max = None;
            for record in segment.records {
                if let Record::Entry(entry) = &record {
                    max = max.max(Some(entry.log_id.index));
                }
                memory.replay(record);
            }
            if last {
                tail = Some((*number, max, segment.bytes, segment.format));
            } else {
                closed.push((*number, max));
            }
        }
        let magic = SEGMENT_MAGIC.len() as u64;
        let (current, current_number, current_max, current_bytes) = match tail {
            // The last segment goes on.
            Some((number, max, bytes, Format::Current)) if bytes > 0 => {
                let file = OpenOptions::new()
                    .append(true)
                    .open(segment_path(dir, number))?;
                (file, number, max, bytes)
            }
            // Nothing intact in it: it starts again.
            Some((number, _, 0, _)) => {
                std::fs::remove_file(segment_path(dir, number))?;
                (create_segment(dir, number)?, number, None, magic)
            }
            // An earlier version's segment is never appended to.
            Some((number, max, _, _)) => {
                closed.push((number, max));
                (create_segment(dir, number + 1)?, number + 1, None, magic)
            }
            None => (create_segment(dir, 0)?, 0, None, magic),
        };
        let segments = Segments {
            dir: dir.to_path_buf(),
            closed,
            current,
            current_number,
            current_max,
            current_bytes,
            frame_target: FRAME_BYTES_TARGET,
        };
        Ok((memory, segments))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Memory> {
        self.memory.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Memory> {
        self.memory.write().unwrap_or_else(|p| p.into_inner())
    }

    fn submit(&self, write: Pending) -> io::Result<()> {
        match &self.writer {
            Writer::Thread(sender) => sender
                .send(write)
                .map_err(|_| io::Error::other("the log writer has stopped after a write error")),
            Writer::Inline(segments) => {
                let mut segments = segments.lock().unwrap_or_else(|p| p.into_inner());
                match segments.as_mut() {
                    Some(open) => {
                        if !write_and_complete(open, vec![write]) {
                            *segments = None;
                        }
                    }
                    None => write.done.complete(Err(failed_log())),
                }
                Ok(())
            }
        }
    }

    /// Writes one record and waits until it is durable.
    async fn write_durably(&self, record: &Record, purge_through: Option<u64>) -> io::Result<()> {
        let mut bytes = Vec::new();
        encode(record, &mut bytes)?;
        let (reply, done) = tokio::sync::oneshot::channel();
        self.submit(Pending {
            bytes,
            max_index: None,
            purge_through,
            vote: None,
            done: Done::Reply(reply),
        })?;
        done.await
            .map_err(|_| io::Error::other("the log writer has stopped"))?
    }
}

impl RaftLogReader<TypeConfig> for SegmentLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .read()
            .entries
            .range(range)
            .map(|(_, entry)| entry.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.read().vote)
    }
}

impl RaftLogStorage<TypeConfig> for SegmentLog {
    type LogReader = SegmentLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let memory = self.read();
        let last = memory
            .entries
            .last_key_value()
            .map(|(_, entry)| entry.log_id);
        Ok(LogState {
            last_purged_log_id: memory.purged,
            last_log_id: last.or_else(|| memory.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let (reply, done) = tokio::sync::oneshot::channel();
        self.submit(Pending {
            bytes: Vec::new(),
            max_index: None,
            purge_through: None,
            vote: Some(*vote),
            done: Done::Reply(reply),
        })?;
        done.await
            .map_err(|_| io::Error::other("the log writer has stopped"))??;
        self.write().vote = Some(*vote);
        Ok(())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut bytes = Vec::new();
        let mut max_index = None;
        {
            let mut memory = self.write();
            for entry in entries {
                let record = Record::Entry(entry);
                encode(&record, &mut bytes)?;
                memory.replay(record);
            }
            if let Some((index, _)) = memory.entries.last_key_value() {
                max_index = Some(*index);
            }
        }
        self.submit(Pending {
            bytes,
            max_index,
            purge_through: None,
            vote: None,
            done: Done::Flushed(callback),
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let record = Record::TruncateAfter(last_log_id);
        self.write_durably(&record, None).await?;
        self.write().replay(record);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let record = Record::Purged(log_id);
        self.write_durably(&record, Some(log_id.index)).await?;
        self.write().replay(record);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::blank_ent;

    fn pending(index: u64) -> (Pending, tokio::sync::oneshot::Receiver<io::Result<()>>) {
        let mut bytes = Vec::new();
        encode(
            &Record::Entry(blank_ent::<TypeConfig>(1, 1, index)),
            &mut bytes,
        )
        .expect("encode");
        let (reply, done) = tokio::sync::oneshot::channel();
        let pending = Pending {
            bytes,
            max_index: Some(index),
            purge_through: None,
            vote: None,
            done: Done::Reply(reply),
        };
        (pending, done)
    }

    #[test]
    fn a_batch_larger_than_a_frame_is_written_as_several_frames() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        let (batch, mut replies): (Vec<_>, Vec<_>) = (1..=5).map(pending).unzip();
        segments.frame_target = 2 * batch[0].bytes.len();
        assert!(write_and_complete(&mut segments, batch));
        for reply in &mut replies {
            reply.try_recv().expect("completed").expect("durable");
        }
        let bytes = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        let mut frames = Vec::new();
        assert!(bytes.starts_with(SEGMENT_MAGIC));
        let mut offset = SEGMENT_MAGIC.len();
        while offset < bytes.len() {
            let (records, size) =
                parse_frame(&bytes[offset..], Format::Current).expect("an intact frame");
            frames.push(records.len());
            offset += size;
        }
        assert_eq!(frames, vec![2, 2, 1]);
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(
            memory.entries.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn zeroes_are_not_a_frame() {
        assert!(parse_frame(&[0; 64], Format::Current).is_none());
        assert!(parse_frame(&[0; 64], Format::Legacy).is_none());
    }

    /// A segment as earlier versions wrote it: no magic, one record per
    /// `[length][crc32]` frame.
    fn legacy_segment(indexes: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        for index in indexes {
            let mut body = Vec::new();
            encode(
                &Record::Entry(blank_ent::<TypeConfig>(1, 1, index)),
                &mut body,
            )
            .expect("encode");
            out.extend_from_slice(&(body.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
            out.extend_from_slice(&body);
        }
        out
    }

    #[test]
    fn an_earlier_versions_segment_is_read_and_the_log_goes_on_in_a_new_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut legacy = legacy_segment(1..=3);
        legacy.extend_from_slice(&[0xee; 5]); // a torn tail
        std::fs::write(segment_path(dir.path(), 0), &legacy).expect("write");
        let (memory, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        assert_eq!(
            memory.entries.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(segments.current_number, 1, "appends go to a new segment");
        let (write, _reply) = pending(4);
        assert!(write_and_complete(&mut segments, vec![write]));
        assert_eq!(
            std::fs::read(segment_path(dir.path(), 0))
                .expect("legacy")
                .len(),
            legacy.len() - 5,
            "the legacy segment was only cut"
        );
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(
            memory.entries.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
    }

    /// Recovery looks for intact frames behind damage at every offset; with
    /// the header checksum that is one pass, not a checksum of every
    /// plausible body (minutes for a big torn write of random user data).
    #[test]
    fn a_big_torn_frame_of_random_bytes_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        let (write, _reply) = pending(1);
        assert!(write_and_complete(&mut segments, vec![write]));
        drop(segments);
        let path = segment_path(dir.path(), 0);
        let intact = std::fs::read(&path).expect("segment");
        let mut torn = intact.clone();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        torn.extend((0..4 * 1024 * 1024).map(|_| {
            // xorshift: bytes that look like user data, not like zeroes.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        }));
        std::fs::write(&path, &torn).expect("tear");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("open torn");
        assert_eq!(memory.entries.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(std::fs::read(&path).expect("segment"), intact);
    }

    #[test]
    fn a_segment_cut_off_inside_its_magic_starts_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &SEGMENT_MAGIC[..3]).expect("write");
        let (memory, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        assert!(memory.entries.is_empty());
        let (write, _reply) = pending(1);
        assert!(write_and_complete(&mut segments, vec![write]));
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(memory.entries.keys().copied().collect::<Vec<_>>(), vec![1]);
    }
}
