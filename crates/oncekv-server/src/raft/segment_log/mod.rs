//! [`SegmentLog`]: the durable, crash-safe Raft log.
//!
//! # On disk
//!
//! A directory of numbered segment files (`0000000000.log`, then
//! `0000000001.log`, ...) and a `vote` file. A segment starts with the
//! magic `oncekvL2`, then holds frames, `[body length u32][body crc32
//! u32][header crc32 u32][postcard records]` (little-endian; the header
//! checksum covers the 8 bytes before it). A writer thread drains every
//! queued append, writes them as one frame and issues one `fdatasync`
//! before any of their callbacks fire (group commit; a batch over 16 MiB
//! becomes several frames, each synced before the next is written). A
//! write that finds the writer idle (nothing queued, nothing being
//! written) may instead be written and synced the same way on the
//! caller's thread, under the same lock: a vote, a truncation, a purge,
//! or entries another node leads ([`SegmentLog::set_local_node`]); so
//! the order of writes, and every rule below, is the same either way.
//! Truncation and purge are records too, so replaying the segments in order
//! rebuilds the log exactly. A segment is closed once it passes 64 MiB;
//! the oldest are deleted once every entry in them is purged. The vote
//! lives in its own file, replaced atomically by the writer thread after
//! the appends queued before it, and durable before `save_vote` returns.
//! Entries are also kept in memory, so reads never touch the disk.
//!
//! After a batch is synced, and before its callbacks fire, the writer puts
//! a **seal** after it: a frame with an empty body (12 bytes) that says
//! "everything before me was synced". The seal is written but not synced
//! (it reaches the disk with the next sync, or the kernel's writeback, and
//! survives a process crash in the page cache), and the next batch's first
//! frame is written over it: that frame says the same by being there. So
//! the high-water mark costs one small write per batch and no `fdatasync`.
//!
//! # Torn tail or damage
//!
//! A crash can only leave incomplete the one write in flight, at the very
//! end of the last segment. Opening the log tells that **torn tail** (cut
//! off, with a warning) from **damage** to what was synced (refused with a
//! [`LogDamage`], carried as an [`io::Error`] of kind `InvalidData`, naming
//! the file and the byte offset of the damaged frame):
//!
//! - The file ends inside a frame (fewer bytes than its header, or its
//!   header's length, says) or inside the magic of a segment being created:
//!   torn.
//! - A complete frame (its header checks and its whole body is there) whose
//!   body checksum does not match is damage if anything follows it in the
//!   file (a seal, another frame, even a torn one: it was synced before any
//!   of them was written), and damage if a single flipped bit explains the
//!   mismatch (CRC-32 locates it from the two checksums). Only the
//!   unsealed last frame of the file whose body holds a sector of zeros
//!   that is not one of its header's sectors (a sector the disk never got
//!   before a power loss) is torn. Such a torn frame is refused instead,
//!   never wrongly cut, if its checksums happen to look like one flipped
//!   bit: odds of about its length in bits in 2^32 (1 in 500 000 for
//!   a 1 KiB frame, 1 in 512 for a 1 MiB frame).
//! - A header whose checksum does not match is torn if nothing intact
//!   follows it (zeros, or the rest of the frame being written), and damage
//!   if an intact frame or seal does, or if flipping one of its bits back
//!   yields a header whose complete frame is intact.
//! - Anything wrong in a segment that is not the last is damage.
//!
//! The search for intact frames after a bad header is one pass, linear in
//! the bytes searched: a header's checksum is computed only where its length
//! fits in the file, a body's only behind an intact header, and the body
//! bytes checksummed are capped at the length searched (past the cap the
//! damage is refused rather than the bytes rescanned).
//!
//! A segment that does not start with the magic is refused, as is a gap in
//! the segment numbers, or a first segment missing while nothing was purged
//! that far: nothing is ever silently skipped, and a node whose log cannot
//! be trusted refuses to start rather than rejoin from a snapshot with
//! acknowledged writes missing (`docs/operations.md` says how to rebuild
//! it from its peers). A refused log is left as it is: a torn tail is cut
//! only once the whole log is known to open. Then the last segment is
//! synced (frames a crash left written but unsynced become durable before
//! anything follows them) and sealed. Not detectable here: whole segments
//! lost at the end of the log, or whole frames lost with their seal at the
//! end of the last segment; nothing after them is left to tell.
//!
//! [`SegmentLog::open_inline`] writes on the caller's task instead of a
//! thread (same files, same order, one sync per write), for deterministic
//! simulation, where every step must happen inside the simulated runtime.

use super::storage_failure::StorageFailure;
use super::type_config::TypeConfig;
use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::{self, Debug, Display};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write as _};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, mpsc};

/// Segments are closed once they exceed this size.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// The first bytes of every segment.
const SEGMENT_MAGIC: &[u8; 8] = b"oncekvL2";
/// Frame header: body length, body checksum, checksum of those 8 bytes.
const HEADER_BYTES: usize = 12;
/// A batch is cut into frames of about this size, each synced before the
/// next is written, so no frame outgrows its `u32` length and a torn write
/// can only ever damage the last frame.
const FRAME_BYTES_TARGET: usize = 16 * 1024 * 1024;
/// The smallest unit a disk writes: after a power loss, a sector of a
/// write in flight holds either what was written or, never written, zeros.
const SECTOR_BYTES: usize = 512;
/// CRC-32 (IEEE, reflected), the polynomial `crc32fast` computes with.
const CRC32_POLYNOMIAL: u32 = 0xEDB8_8320;
const VOTE_FILE: &str = "vote";

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

mod damage;
mod files;
mod frame;
mod scan;
mod writer;

pub use damage::{DamageKind, LogDamage};
use files::*;
use frame::*;
use scan::*;
use writer::*;

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
    /// Applies `record` to the entries kept in memory. Returns the entries
    /// it removed, for the caller to drop once it no longer holds the
    /// log's lock (a purge removes a snapshot's worth of entries, and
    /// freeing them under the lock would stall appends and reads).
    #[must_use = "drop the removed entries outside the lock"]
    fn replay(&mut self, record: Record) -> BTreeMap<u64, Entry> {
        match record {
            Record::Entry(entry) => {
                let index = entry.log_id.index;
                let removed = self.entries.split_off(&index);
                self.entries.insert(index, entry);
                removed
            }
            // Indexes come from disk: `checked_add`, where the last possible
            // index has nothing after it.
            Record::TruncateAfter(last) => match last.map(|last| last.index.checked_add(1)) {
                Some(Some(after)) => self.entries.split_off(&after),
                Some(None) => BTreeMap::new(),
                None => std::mem::take(&mut self.entries),
            },
            Record::Purged(log_id) => {
                self.purged = Some(log_id);
                match log_id.index.checked_add(1) {
                    Some(after) => {
                        let kept = self.entries.split_off(&after);
                        std::mem::replace(&mut self.entries, kept)
                    }
                    None => std::mem::take(&mut self.entries),
                }
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
    /// The writer thread, which group-commits everything queued; a write
    /// that finds it idle may be made durable on the caller's thread.
    Thread(Arc<Background>),
    /// On the caller's task; `None` once a write has failed.
    Inline(Arc<Mutex<Option<Segments>>>),
}

/// The durable Raft log of one node.
#[derive(Clone)]
pub struct SegmentLog {
    dir: PathBuf,
    memory: Arc<RwLock<Memory>>,
    writer: Writer,
    failure: StorageFailure,
    /// This node's id, once known ([`SegmentLog::set_local_node`]).
    local_node: Arc<OnceLock<u64>>,
}

impl Debug for SegmentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLog")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, replaying its segments; a
    /// writer thread makes appends durable.
    pub fn open(dir: &Path) -> io::Result<SegmentLog> {
        let (memory, segments) = Self::replay(dir)?;
        let failure = segments.failure.clone();
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            memory: Arc::new(RwLock::new(memory)),
            writer: Writer::Thread(Arc::new(Background::start(segments)?)),
            failure,
            local_node: Arc::default(),
        })
    }

    /// Opens the log like [`SegmentLog::open`], but makes each write durable
    /// on the calling task before it returns, without a thread.
    pub fn open_inline(dir: &Path) -> io::Result<SegmentLog> {
        let (memory, segments) = Self::replay(dir)?;
        let failure = segments.failure.clone();
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            memory: Arc::new(RwLock::new(memory)),
            writer: Writer::Inline(Arc::new(Mutex::new(Some(segments)))),
            failure,
            local_node: Arc::default(),
        })
    }

    /// Tells the log which node it belongs to (once; later calls are
    /// ignored). Entries another node leads (this node follows) are then
    /// made durable on the calling task when the writer thread is idle: the
    /// follower answers only once they are synced, so a hand-off to the
    /// writer thread and back would only add to its answer's latency.
    /// Entries this node leads always go to the writer thread: openraft
    /// sends them to the followers only after `append` returns, so the
    /// leader's sync overlaps the followers' instead of preceding it.
    pub fn set_local_node(&self, id: u64) {
        let _ = self.local_node.set(id);
    }

    /// Why the log stopped accepting writes, once it has.
    pub fn failure(&self) -> StorageFailure {
        self.failure.clone()
    }

    fn replay(dir: &Path) -> io::Result<(Memory, Segments)> {
        crate::private_fs::create_dir(dir)?;
        let numbers = segment_numbers(dir)?;
        check_no_gaps(dir, &numbers)?;
        let mut memory = Memory {
            vote: read_vote(dir)?,
            ..Memory::default()
        };
        let mut closed = Vec::new();
        let mut tail = None;
        for (position, number) in numbers.iter().copied().enumerate() {
            let last = position + 1 == numbers.len();
            let (segment, file_bytes) = read_segment(&segment_path(dir, number), last)?;
            let mut max = None;
            for record in segment.records {
                if let Record::Entry(entry) = &record {
                    max = max.max(Some(entry.log_id.index));
                }
                drop(memory.replay(record));
            }
            if last {
                tail = Some(Tail {
                    number,
                    max,
                    intact_end: segment.intact_end,
                    trailing_seal: segment.trailing_seal,
                    torn: segment.torn,
                    file_bytes,
                });
            } else {
                closed.push((number, max));
            }
        }
        if let Some(&first) = numbers.first()
            && first > 0
        {
            check_nothing_missing_before(dir, first, &memory)?;
        }
        // The log opens: only now is anything cut.
        if let Some(tail) = &tail {
            cut_torn_tail(dir, tail)?;
        }
        let segments = match tail {
            Some(tail) if tail.intact_end > 0 => Segments::resume(dir, closed, tail)?,
            // Empty, or cut inside its magic: it starts again.
            Some(tail) => {
                std::fs::remove_file(segment_path(dir, tail.number))?;
                Segments::create(dir, closed, tail.number)?
            }
            None => Segments::create(dir, closed, 0)?,
        };
        Ok((memory, segments))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Memory> {
        crate::sync::read(&self.memory)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Memory> {
        crate::sync::write(&self.memory)
    }

    /// Makes `write` durable and then completes it; `inline_if_idle`: on
    /// the calling thread if the writer thread has nothing to do.
    fn submit(&self, write: Pending, inline_if_idle: bool) -> io::Result<()> {
        match &self.writer {
            Writer::Thread(background) => background.submit(write, inline_if_idle),
            Writer::Inline(segments) => {
                let mut segments = crate::sync::lock(segments);
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
        // The caller waits for it anyway: no hand-off if the writer is idle.
        self.submit(
            Pending {
                bytes,
                max_index: None,
                purge_through,
                vote: None,
                done: Done::Reply(reply),
            },
            true,
        )?;
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
        // The caller waits for it anyway: no hand-off if the writer is idle.
        self.submit(
            Pending {
                bytes: Vec::new(),
                max_index: None,
                purge_through: None,
                vote: Some(*vote),
                done: Done::Reply(reply),
            },
            true,
        )?;
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
        let mut followed = false;
        {
            let local = self.local_node.get().copied();
            let mut memory = self.write();
            for entry in entries {
                followed = local.is_some_and(|local| entry.log_id.leader_id.node_id != local);
                let record = Record::Entry(entry);
                encode(&record, &mut bytes)?;
                // Removes entries only when a new leader overwrites a
                // conflicting tail: rare and short.
                drop(memory.replay(record));
            }
            if let Some((index, _)) = memory.entries.last_key_value() {
                max_index = Some(*index);
            }
        }
        self.submit(
            Pending {
                bytes,
                max_index,
                purge_through: None,
                vote: None,
                done: Done::Flushed(callback),
            },
            followed,
        )
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let record = Record::TruncateAfter(last_log_id);
        self.write_durably(&record, None).await?;
        let removed = self.write().replay(record);
        drop(removed);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let record = Record::Purged(log_id);
        self.write_durably(&record, Some(log_id.index)).await?;
        let removed = self.write().replay(record);
        drop(removed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{blank_ent, log_id};

    fn encoded(record: &Record) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode(record, &mut bytes).expect("encode");
        bytes
    }

    fn pending_write(
        bytes: Vec<u8>,
        max_index: Option<u64>,
        purge_through: Option<u64>,
    ) -> (Pending, tokio::sync::oneshot::Receiver<io::Result<()>>) {
        let (reply, done) = tokio::sync::oneshot::channel();
        let pending = Pending {
            bytes,
            max_index,
            purge_through,
            vote: None,
            done: Done::Reply(reply),
        };
        (pending, done)
    }

    fn pending(index: u64) -> (Pending, tokio::sync::oneshot::Receiver<io::Result<()>>) {
        let record = Record::Entry(blank_ent::<TypeConfig>(1, 1, index));
        pending_write(encoded(&record), Some(index), None)
    }

    /// Writes `indexes` as one batch (one frame) and checks it is durable.
    fn write(segments: &mut Segments, indexes: std::ops::RangeInclusive<u64>) {
        let (batch, mut replies): (Vec<_>, Vec<_>) = indexes.map(pending).unzip();
        assert!(write_and_complete(segments, batch));
        for reply in &mut replies {
            reply.try_recv().expect("completed").expect("durable");
        }
    }

    fn entry_indexes(memory: &Memory) -> Vec<u64> {
        memory.entries.keys().copied().collect()
    }

    /// The records of each data frame, in order, and where each frame
    /// (seals included) starts and ends, for a segment written by this
    /// module.
    fn frames(bytes: &[u8]) -> Vec<(std::ops::Range<usize>, usize)> {
        assert!(bytes.starts_with(SEGMENT_MAGIC));
        let mut at = SEGMENT_MAGIC.len();
        let mut out = Vec::new();
        while at < bytes.len() {
            let header = parse_header(header_bytes_at(bytes, at).expect("a header"))
                .expect("an intact header");
            let body = body_range(at, header.length).expect("a body");
            let records = decode_records(&bytes[body.clone()]).expect("records");
            out.push((at..body.end, records.len()));
            at = body.end;
        }
        out
    }

    /// Pseudo-random bytes (xorshift), the same for the same seed.
    fn noise(seed: u64, length: usize) -> Vec<u8> {
        let mut state = seed | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn a_batch_larger_than_a_frame_is_written_as_several_frames_then_sealed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        let (batch, mut replies): (Vec<_>, Vec<_>) = (1..=5).map(pending).unzip();
        segments.frame_target = 2 * batch[0].bytes.len();
        assert!(write_and_complete(&mut segments, batch));
        for reply in &mut replies {
            reply.try_recv().expect("completed").expect("durable");
        }
        let bytes = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        let records: Vec<usize> = frames(&bytes).iter().map(|(_, n)| *n).collect();
        assert_eq!(records, vec![2, 2, 1, 0], "three frames, then the seal");
        assert!(bytes.ends_with(&seal()));
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_next_frame_is_written_over_the_seal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        write(&mut segments, 1..=1);
        write(&mut segments, 2..=3);
        let bytes = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        let records: Vec<usize> = frames(&bytes).iter().map(|(_, n)| *n).collect();
        assert_eq!(records, vec![1, 2, 0]);
    }

    #[test]
    fn opening_seals_an_unsealed_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        write(&mut segments, 1..=2);
        drop(segments);
        let path = segment_path(dir.path(), 0);
        let sealed = std::fs::read(&path).expect("segment");
        std::fs::write(&path, &sealed[..sealed.len() - HEADER_BYTES]).expect("unseal");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), vec![1, 2]);
        assert_eq!(std::fs::read(&path).expect("segment"), sealed);
    }

    #[test]
    fn zeroes_are_neither_a_header_nor_a_seal() {
        assert!(parse_header(&[0; HEADER_BYTES]).is_none());
        assert_ne!(seal(), [0; HEADER_BYTES]);
        let seal_header = parse_header(&seal()).expect("a seal is a frame");
        assert_eq!(seal_header.length, 0);
    }

    #[test]
    fn single_flipped_bit_finds_every_bit_and_only_single_bits() {
        let body = noise(7, 97);
        let written = crc32fast::hash(&body);
        for byte in 0..body.len() {
            for bit in 0..8u8 {
                let mut flipped = body.clone();
                flipped[byte] ^= 1 << bit;
                let found = crc32fast::hash(&flipped);
                assert_eq!(
                    single_flipped_bit(body.len(), written, found),
                    Some((byte, bit))
                );
            }
        }
        // Two flipped bits are never taken for one (CRC-32 has a Hamming
        // distance of at least 4 at this length).
        let mut twice = body.clone();
        twice[3] ^= 0x10;
        twice[60] ^= 0x02;
        let found = crc32fast::hash(&twice);
        assert_eq!(single_flipped_bit(body.len(), written, found), None);
    }

    /// A segment's bytes after `write`s of one frame per group, unsealed
    /// if `unsealed`, with the frames' extents (the seal excluded).
    fn written_log(
        groups: &[std::ops::RangeInclusive<u64>],
        unsealed: bool,
    ) -> (Vec<u8>, Vec<(std::ops::Range<usize>, usize)>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        for group in groups {
            write(&mut segments, group.clone());
        }
        let mut bytes = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        assert!(bytes.ends_with(&seal()));
        if unsealed {
            bytes.truncate(bytes.len() - HEADER_BYTES);
        }
        let data_frames = frames(&bytes)
            .into_iter()
            .filter(|(_, records)| *records > 0)
            .collect();
        (bytes, data_frames)
    }

    /// Batches of seeded sizes, so frames of many lengths.
    fn seeded_groups(seed: u64, count: usize) -> Vec<std::ops::RangeInclusive<u64>> {
        let sizes = noise(seed, count);
        let mut next = 1;
        sizes
            .iter()
            .map(|size| {
                let group = next..=next + u64::from(size % 7);
                next = *group.end() + 1;
                group
            })
            .collect()
    }

    /// Truncating a log at any byte never fails to open and never loses a
    /// frame that is still complete; flipping any single bit of a complete
    /// frame (header or body) is always refused as damage, sealed or not.
    #[test]
    fn every_truncation_is_cut_and_every_flipped_bit_is_refused() {
        for seed in 1..=3 {
            for unsealed in [false, true] {
                let groups = seeded_groups(seed, 5);
                let (bytes, data_frames) = written_log(&groups, unsealed);
                for cut in 0..=bytes.len() {
                    let scanned = scan_segment(&bytes[..cut], true).unwrap_or_else(|fault| {
                        panic!("seed {seed}, cut at {cut}: refused with {fault:?}")
                    });
                    let complete: usize = data_frames
                        .iter()
                        .filter(|(extent, _)| extent.end <= cut)
                        .map(|(_, records)| records)
                        .sum();
                    assert_eq!(scanned.records.len(), complete, "seed {seed}, cut {cut}");
                }
                for (extent, _) in &data_frames {
                    for byte in extent.clone() {
                        for bit in 0..8 {
                            let mut damaged = bytes.clone();
                            damaged[byte] ^= 1 << bit;
                            match scan_segment(&damaged, true) {
                                Err(SegmentFault::Frame { offset, .. }) => {
                                    assert_eq!(offset, extent.start, "byte {byte} bit {bit}")
                                }
                                other => panic!(
                                    "seed {seed}, unsealed {unsealed}, byte {byte} bit {bit}: {:?}",
                                    other.map(|s| (s.records.len(), s.torn))
                                ),
                            }
                        }
                    }
                }
                for byte in 0..SEGMENT_MAGIC.len() {
                    let mut damaged = bytes.clone();
                    damaged[byte] ^= 0x04;
                    assert!(matches!(
                        scan_segment(&damaged, true),
                        Err(SegmentFault::NoMagic)
                    ));
                }
            }
        }
    }

    /// The same through real files, for a few cuts: the file is cut, then
    /// sealed, and appends go on after it.
    #[test]
    fn a_torn_log_is_cut_sealed_and_goes_on() {
        let (bytes, data_frames) = written_log(&seeded_groups(9, 3), true);
        let last = data_frames.last().expect("frames").0.clone();
        for cut in [last.start + 1, last.start + HEADER_BYTES + 1, last.end - 1] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = segment_path(dir.path(), 0);
            std::fs::write(&path, &bytes[..cut]).expect("tear");
            let (memory, mut segments) = SegmentLog::replay(dir.path()).expect("open torn");
            let kept = entry_indexes(&memory);
            let mut expected = bytes[..last.start].to_vec();
            expected.extend_from_slice(&seal());
            assert_eq!(std::fs::read(&path).expect("segment"), expected);
            let next = kept.last().copied().unwrap_or(0) + 1;
            write(&mut segments, next..=next + 1);
            drop(segments);
            let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
            let mut all = kept.clone();
            all.extend([next, next + 1]);
            assert_eq!(entry_indexes(&memory), all);
        }
    }

    /// A power loss while the last frame was written can leave it whole in
    /// length but with sectors that never reached the disk (zeros): torn.
    #[test]
    fn an_unsealed_last_frame_with_unwritten_sectors_is_torn() {
        let (bytes, data_frames) = written_log(&[1..=1, 2..=400], true);
        let last = data_frames.last().expect("frames").0.clone();
        assert!(last.len() > 3 * SECTOR_BYTES, "the batch spans sectors");
        let first_whole_sector = (last.start + HEADER_BYTES).next_multiple_of(SECTOR_BYTES);
        let last_sector = (bytes.len() - 1) / SECTOR_BYTES * SECTOR_BYTES;
        for hole in [
            first_whole_sector..first_whole_sector + SECTOR_BYTES,
            last_sector..bytes.len(),
        ] {
            let mut torn = bytes.clone();
            torn[hole.clone()].fill(0);
            let scanned = scan_segment(&torn, true).expect("torn, not damaged");
            assert_eq!(scanned.torn, Some(TornTail::UnwrittenSector), "{hole:?}");
            assert_eq!(scanned.intact_end, last.start);
            // Sealed, it was synced: the same zeros are damage.
            torn.extend_from_slice(&seal());
            assert!(matches!(
                scan_segment(&torn, true),
                Err(SegmentFault::Frame { offset, kind: DamageKind::BodyChecksum }) if offset == last.start
            ));
        }
        // Zeros in the sector of the header are not a hole: that sector
        // reached the disk with the header.
        let mut torn = bytes.clone();
        torn[last.start + HEADER_BYTES..last.start + HEADER_BYTES + 4].fill(0);
        assert!(scan_segment(&torn, true).is_err());
    }

    #[test]
    fn a_damaged_closed_segment_is_refused_even_at_its_end() {
        let (bytes, data_frames) = written_log(&[1..=2, 3..=4], false);
        let last = data_frames.last().expect("frames").0.clone();
        assert!(matches!(
            scan_segment(&bytes[..last.end - 1], false),
            Err(SegmentFault::Frame { kind: DamageKind::Truncated, offset }) if offset == last.start
        ));
        let mut zeroed = bytes.clone();
        zeroed[last.start..last.start + HEADER_BYTES].fill(0);
        assert!(matches!(
            scan_segment(&zeroed, false),
            Err(SegmentFault::Frame {
                kind: DamageKind::HeaderChecksum,
                ..
            })
        ));
        assert!(matches!(
            scan_segment(&bytes[..3], false),
            Err(SegmentFault::NoMagic)
        ));
    }

    /// Recovery looks for intact frames behind damage at every offset; with
    /// the header checksum that is one pass, not a checksum of every
    /// plausible body (minutes for a big torn write of random user data).
    #[test]
    fn a_32_mib_torn_frame_of_random_bytes_is_cut_in_one_pass() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        write(&mut segments, 1..=1);
        drop(segments);
        let path = segment_path(dir.path(), 0);
        let intact = std::fs::read(&path).expect("segment");
        let mut torn = intact.clone();
        torn.extend(noise(0x9e37_79b9_7f4a_7c15, 32 * 1024 * 1024));
        let (following, cost) = search_intact_after(&torn, intact.len() + 1);
        assert_eq!(following, Following::Nothing);
        assert!(cost.body_bytes_checked <= 32 * 1024 * 1024, "{cost:?}");
        std::fs::write(&path, &torn).expect("tear");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("open torn");
        assert_eq!(entry_indexes(&memory), vec![1]);
        assert_eq!(std::fs::read(&path).expect("segment"), intact);
    }

    /// Bytes crafted to hold an intact-looking header every 12 bytes, each
    /// claiming a body up to the end of 32 MiB: checking every body would
    /// hash about 32 MiB * 2.8 million. The search checks at most as many
    /// body bytes as it searches, then refuses.
    #[test]
    fn a_32_mib_segment_of_frame_like_headers_is_judged_in_linear_work() {
        let size = 32 * 1024 * 1024;
        let mut bytes = SEGMENT_MAGIC.to_vec();
        bytes.extend_from_slice(&[0xAB; HEADER_BYTES]); // a damaged header
        while bytes.len() + HEADER_BYTES <= size {
            let body = size - bytes.len() - HEADER_BYTES;
            let body = u32::try_from(body).expect("small");
            bytes.extend_from_slice(&frame_header(body, 0xDEAD_BEEF));
        }
        bytes.resize(size, 0x5A);
        let from = SEGMENT_MAGIC.len() + 1;
        let (following, cost) = search_intact_after(&bytes, from);
        assert_eq!(following, Following::TooManyCandidates);
        assert!(cost.body_bytes_checked <= (size - from) as u64, "{cost:?}");
        assert!(cost.headers_checked <= (size - from) as u64, "{cost:?}");
        assert!(matches!(
            scan_segment(&bytes, true),
            Err(SegmentFault::Frame {
                offset: 8,
                kind: DamageKind::HeaderChecksumUnresolved
            })
        ));
    }

    /// 32 MiB of intact frames with damage near the start: refused at once
    /// (the bit is located; a destroyed header is followed by the next
    /// intact frame).
    #[test]
    fn damage_at_the_start_of_a_32_mib_segment_is_refused() {
        let (mut bytes, data_frames) = written_log(&[1..=1], false);
        bytes.truncate(bytes.len() - HEADER_BYTES);
        let first = data_frames[0].0.clone();
        let body = noise(3, 1024 * 1024);
        while bytes.len() < 32 * 1024 * 1024 {
            bytes.extend_from_slice(&frame(std::iter::once(body.as_slice())).expect("frame"));
        }
        let mut flipped = bytes.clone();
        flipped[first.end - 1] ^= 0x01;
        assert!(matches!(
            scan_segment(&flipped, true),
            Err(SegmentFault::Frame { offset, kind: DamageKind::FlippedBodyBit { bit: 0, .. } }) if offset == first.start
        ));
        let mut destroyed = bytes.clone();
        destroyed[first.start..first.start + HEADER_BYTES].fill(0xFF);
        assert!(matches!(
            scan_segment(&destroyed, true),
            Err(SegmentFault::Frame { offset, kind: DamageKind::HeaderChecksum }) if offset == first.start
        ));
        let (following, _) = search_intact_after(&destroyed, first.start + 1);
        assert_eq!(following, Following::Intact(first.end));
    }

    #[test]
    fn a_segment_cut_off_inside_its_magic_starts_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &SEGMENT_MAGIC[..3]).expect("write");
        let (memory, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        assert!(memory.entries.is_empty());
        write(&mut segments, 1..=1);
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), vec![1]);
    }

    #[test]
    fn a_segment_without_the_magic_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        std::fs::write(&path, b"oncekvL1 and more").expect("write");
        let error = SegmentLog::replay(dir.path()).err().expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let damage = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<LogDamage>())
            .expect("a LogDamage");
        assert_eq!(damage, &LogDamage::NoMagic { file: path.clone() });
        assert!(error.to_string().contains(&path.display().to_string()));
    }

    /// Writes `count` one-entry batches into segments closed after two
    /// entries each; returns the segments.
    fn rolled(dir: &Path, count: u64) -> Segments {
        let (_, mut segments) = SegmentLog::replay(dir).expect("open");
        // The magic, then frames of 17 bytes: closed after the second.
        segments.segment_bytes = 30;
        for index in 1..=count {
            write(&mut segments, index..=index);
        }
        segments
    }

    fn purge(segments: &mut Segments, through: u64) {
        let record = Record::Purged(log_id::<TypeConfig>(1, 1, through));
        let (write, mut reply) = pending_write(encoded(&record), None, Some(through));
        assert!(write_and_complete(segments, vec![write]));
        reply.try_recv().expect("completed").expect("durable");
    }

    fn missing(dir: &Path) -> (u64, u64) {
        let error = SegmentLog::replay(dir).err().expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        match error.get_ref().and_then(|e| e.downcast_ref::<LogDamage>()) {
            Some(LogDamage::MissingSegments { first, last, .. }) => (*first, *last),
            other => panic!("{other:?}: {error}"),
        }
    }

    #[test]
    fn segments_deleted_by_a_purge_are_not_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut segments = rolled(dir.path(), 6);
        purge(&mut segments, 3);
        drop(segments);
        assert!(
            !segment_path(dir.path(), 0).exists(),
            "purged segments are deleted"
        );
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), vec![4, 5, 6]);
    }

    #[test]
    fn a_gap_in_the_segments_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(rolled(dir.path(), 4));
        std::fs::remove_file(segment_path(dir.path(), 1)).expect("delete");
        let error = SegmentLog::replay(dir.path()).err().expect("refused");
        assert!(error.to_string().contains("0000000001.log"), "{error}");
        assert_eq!(missing(dir.path()), (1, 1));
    }

    #[test]
    fn a_missing_first_segment_is_refused_when_nothing_was_purged() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(rolled(dir.path(), 4));
        std::fs::remove_file(segment_path(dir.path(), 0)).expect("delete");
        // A torn tail too: a refused log is left as it is, tail included.
        let last = segment_path(dir.path(), 2);
        let mut torn = std::fs::read(&last).expect("segment");
        torn.extend_from_slice(&[0; 7]);
        std::fs::write(&last, &torn).expect("tear");
        assert_eq!(missing(dir.path()), (0, 0));
        assert_eq!(std::fs::read(&last).expect("segment"), torn);
    }

    #[test]
    fn a_missing_first_segment_is_refused_when_it_held_unpurged_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut segments = rolled(dir.path(), 6);
        purge(&mut segments, 2);
        drop(segments);
        let first = segment_numbers(dir.path()).expect("segments")[0];
        std::fs::remove_file(segment_path(dir.path(), first)).expect("delete");
        assert_eq!(missing(dir.path()), (0, first));
    }
}
