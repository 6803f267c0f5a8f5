//! [`SegmentLog`]: the durable, crash-safe Raft log.
//!
//! # On disk
//!
//! A directory of numbered segment files (`0000000000.log`, then
//! `0000000001.log`, ...) and a `vote` file. A segment starts with a
//! 1024-byte header: the magic `oncekvL3`, then the two slots of its **end
//! record** (below), one in each of the first two 512-byte sectors. Frames
//! follow, `[body length u32][body crc32 u32][header crc32 u32][postcard
//! records]` (little-endian; the header checksum covers the 8 bytes before
//! it). A writer thread drains every
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
//! the oldest are deleted once every entry in them is purged.
//!
//! The last segment's file is **prepared** ahead of its frames: before a
//! frame would pass the end of the file, the writer writes zeros through
//! 1 MiB beyond it, synced with that frame. The frames after it go into
//! zeros already on disk, so their syncs change no file size and leave
//! the file system no metadata to commit (on ext4, a sync that grows a
//! file waits for a journal commit; measured on this project's disk, one
//! that does not takes about 30% less time). A closing segment is cut to
//! its last frame first. Read back, zeros from where a frame would start
//! to the end of the file are that prepared space, not a frame (no
//! frame's header is zeros: a seal's checksum is not). The vote
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
//! # The end record: the log's end is durable knowledge
//!
//! The seal sits at the end of the file, where a truncation takes it away.
//! So, at the same moment (after the sync, before the callbacks), the
//! writer also writes the segment's end record into its header: `[sequence
//! u64][segment number u64][synced bytes u64][last index u64][flags u8: has
//! an index, closed][zero x3][crc32 of the 36 bytes before]` (40 bytes):
//! "this segment was synced through byte N, where its last synced frame
//! ends, with entries up to index I". Like the seal it is written, not
//! synced: one `pwrite` per batch, no `fdatasync` (the next batch's sync
//! takes the header's page along). Written only after the sync it
//! describes, the record on disk may be older than the frames after a
//! power loss (a batch behind at most, as each sync flushes the one
//! before), never newer; a process crash leaves the newest in the page
//! cache. The sequence number's parity is the slot it goes to, and the
//! newer of the two that check counts, so a torn write of one slot leaves
//! the other, a batch older. A segment is closed (rolled) by creating the
//! next one durably first, then writing and syncing the closing one's
//! record with "closed: the log goes on in the next segment" (one more
//! sync per 64 MiB), so a missing last segment is known from its
//! predecessor. Opening the log syncs the last segment's intact frames and
//! records them; a clean close (the log dropped) syncs the last record.
//!
//! Segments of the earlier format (`oncekvL2`: the magic, then frames; no
//! end record) are read exactly as before. At open, an L2 last segment is
//! synced and closed as it is, and the log goes on in a new L3 segment, so
//! an upgraded node's new writes are covered from its first start. What
//! the L2 segments hold is judged by the frame rules alone (below): they
//! record no end.
//!
//! # Torn tail or damage
//!
//! A crash can only leave incomplete the one write in flight, at the very
//! end of the last segment, beyond what its end record says was synced.
//! Opening the log tells that **torn tail** (cut off, with a warning) from
//! **damage** to what was synced (refused with a [`LogDamage`], carried as
//! an [`io::Error`] of kind `InvalidData`, naming the file and the byte
//! offset of the damaged frame, or what is missing):
//!
//! - Frames before the synced end of a segment's newest end record were
//!   synced: judged as in a segment that is not the last (anything wrong
//!   is damage). A segment whose intact frames end before that synced end
//!   (the file was truncated, at a frame boundary or inside a frame, or
//!   overwritten), or hold a lower last index than the record's, is
//!   refused ([`LogDamage::SyncedEndMissing`]): a torn tail is only ever
//!   cut beyond the synced end. So is an end record that checks in
//!   neither slot, names another segment, or whose synced end is not
//!   where a frame ends ([`LogDamage::Header`]).
//! - Beyond the synced end of the last segment (or anywhere in an L2 last
//!   segment): the file ends inside a frame (fewer bytes than its header,
//!   or its header's length, says): torn.
//! - A complete frame (its header checks and its whole body is there) whose
//!   body checksum does not match is damage if anything follows it in the
//!   file (a seal, another frame, even a torn one: it was synced before any
//!   of them was written), and damage if a single flipped bit explains the
//!   mismatch (CRC-32 locates it from the two checksums). Only the
//!   unsealed last frame of the file (nothing but prepared zeros after
//!   it) whose body holds a sector of zeros
//!   that is not one of its header's sectors (a sector the disk never got
//!   before a power loss) is torn. Such a torn frame is refused instead,
//!   never wrongly cut, if its checksums happen to look like one flipped
//!   bit: odds of about its length in bits in 2^32 (1 in 500 000 for
//!   a 1 KiB frame, 1 in 512 for a 1 MiB frame).
//! - A header whose checksum does not match is damage if flipping one of
//!   its bits back yields a header whose complete frame is intact; beyond
//!   the synced end of the last segment, it is torn if nothing intact
//!   follows it (zeros, or the rest of the frame being written), and
//!   damage if an intact frame or seal does.
//! - Anything wrong in a segment that is not the last is damage.
//! - The last segment ends inside its header (or magic): torn (a crash
//!   while it was created, before anything was written to it), unless it
//!   is known to have been whole and synced: its predecessor's end record
//!   says the log went on in it, or it is the first segment left and the
//!   log has a vote (a log's first segment is created, durably, before the
//!   node ever votes) or a purge deleted the ones before it
//!   ([`LogDamage::Header`]).
//! - The last segment's end record says it is closed: the segment the log
//!   went on in is gone ([`LogDamage::SuccessorMissing`]).
//! - A vote but no segment at all ([`LogDamage::NoSegments`]).
//!
//! The search for intact frames after a bad header is one pass, linear in
//! the bytes searched: a header's checksum is computed only where its length
//! fits in the file, a body's only behind an intact header, and the body
//! bytes checksummed are capped at the length searched (past the cap the
//! damage is refused rather than the bytes rescanned). Numbers read from
//! disk (lengths, end records) are checked, never trusted in arithmetic.
//!
//! A segment that does not start with a magic is refused, as is a gap in
//! the segment numbers, or a first segment missing while nothing was purged
//! that far: nothing is ever silently skipped, and a node whose log cannot
//! be trusted refuses to start rather than rejoin from a snapshot with
//! acknowledged writes missing (`docs/operations.md` says how to rebuild
//! it from its peers). A refused log is left as it is: a torn tail is cut
//! only once the whole log is known to open. Then the last segment is
//! synced (frames a crash left written but unsynced become durable before
//! anything follows them), recorded and sealed.
//!
//! Still not detectable here, for want of anything left to tell:
//!
//! - After a power loss (not a process crash) the end record on disk may
//!   be one batch behind the frames: a truncation of exactly that last
//!   batch, at its frame boundary, made before the node starts again,
//!   passes.
//! - Everything lost together: all segments and the vote file deleted (the
//!   data directory's identity file is no proof of a log: it is written
//!   before the log's first segment is created), or a segment truncated
//!   with its end record rewritten to match.
//! - In L2 segments, which record no end: an L2 segment cut at a frame
//!   boundary, or, right after an upgrade, the L3 segments after the last
//!   L2 one deleted (the L2 segment does not say it was closed).
//! - A damaged newest slot of an end record: the older copy counts, a
//!   batch less protected.
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
/// Frame header: body length, body checksum, checksum of those 8 bytes.
const HEADER_BYTES: usize = 12;
/// How far beyond what a write needs the current segment's file is
/// written with zeros ahead of the frames ([`Segments::prepare`]).
const PREPARED_BYTES: u64 = 1024 * 1024;
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
mod end_record;
mod files;
mod frame;
mod scan;
mod writer;

pub use damage::{DamageKind, LogDamage};
use end_record::*;
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
                // An append past the last entry, the usual case, cuts
                // nothing, and `split_off` would still rebuild the
                // tree's right edge, allocating a node per level.
                let overwrites = self
                    .entries
                    .last_key_value()
                    .is_some_and(|(last, _)| *last >= index);
                let removed = if overwrites {
                    self.entries.split_off(&index)
                } else {
                    BTreeMap::new()
                };
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
        let mut found = Vec::new();
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
            found.push(FoundSegment {
                number,
                end: segment.end,
                frames_end: segment.trailing_seal.unwrap_or(segment.intact_end),
                intact_end: segment.intact_end,
                file_bytes,
                max,
                synced_end_is_frame_end: segment.synced_end_is_frame_end,
            });
            if last {
                tail = Some(Tail {
                    number,
                    max,
                    intact_end: segment.intact_end,
                    trailing_seal: segment.trailing_seal,
                    torn: segment.torn,
                    file_bytes,
                    end: segment.end,
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
        check_ends(dir, &found, memory.vote.is_some())?;
        // The log opens: only now is anything cut.
        if let Some(tail) = &tail {
            cut_torn_tail(dir, tail)?;
        }
        let segments = match tail {
            Some(tail) if tail.intact_end > 0 => Segments::resume(dir, closed, tail)?,
            // Empty, or cut inside its header: it starts again.
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

    /// Opens the log in `dir` for a test of the file's layout: frames are
    /// written with no zeros prepared beyond their seal, so the file is
    /// its header, frames and seal, nothing after.
    fn open_unprepared(dir: &Path, what: &str) -> (Memory, Segments) {
        let (memory, mut segments) = SegmentLog::replay(dir).expect(what);
        segments.prepare_ahead = 0;
        (memory, segments)
    }

    fn entry_indexes(memory: &Memory) -> Vec<u64> {
        memory.entries.keys().copied().collect()
    }

    #[test]
    fn an_entry_at_or_below_the_last_cuts_the_tail_and_one_past_it_cuts_nothing() {
        let mut memory = Memory::default();
        for index in 1..=5 {
            let removed = memory.replay(Record::Entry(blank_ent::<TypeConfig>(1, 1, index)));
            assert!(removed.is_empty());
        }
        // A new leader's entry 3 replaces 3, 4 and 5.
        let removed = memory.replay(Record::Entry(blank_ent::<TypeConfig>(2, 2, 3)));
        assert_eq!(removed.keys().copied().collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
        assert_eq!(memory.entries[&3].log_id.leader_id.term, 2);
        let removed = memory.replay(Record::Entry(blank_ent::<TypeConfig>(2, 2, 4)));
        assert!(removed.is_empty());
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3, 4]);
    }

    #[test]
    fn frames_go_into_prepared_zeros_so_the_file_stops_growing_and_reopens_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        write(&mut segments, 1..=1);
        let prepared = std::fs::metadata(&path).expect("segment").len();
        assert!(prepared >= segments.current_bytes + PREPARED_BYTES);
        assert_eq!(prepared, segments.prepared_end);
        for index in 2..=50 {
            write(&mut segments, index..=index);
        }
        assert_eq!(std::fs::metadata(&path).expect("segment").len(), prepared);
        let frames_end = segments.current_bytes;
        drop(segments);
        let (memory, mut segments) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), (1..=50).collect::<Vec<_>>());
        assert_eq!(segments.current_bytes, frames_end);
        assert_eq!(segments.prepared_end, prepared, "the zeros are kept");
        write(&mut segments, 51..=51);
        drop(segments);
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), (1..=51).collect::<Vec<_>>());
        assert_eq!(std::fs::metadata(&path).expect("segment").len(), prepared);
    }

    #[test]
    fn a_frame_torn_inside_prepared_zeros_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        write(&mut segments, 1..=1);
        let synced = usize::try_from(segments.current_bytes).expect("small");
        drop(segments);
        let whole = frame(
            (2..=400)
                .map(|index| encoded(&Record::Entry(blank_ent::<TypeConfig>(1, 1, index))))
                .collect::<Vec<_>>()
                .iter()
                .map(Vec::as_slice),
        )
        .expect("frame");
        assert!(whole.len() > 3 * SECTOR_BYTES, "the frame spans sectors");
        let mut bytes = std::fs::read(&path).expect("segment");
        let prepared = bytes.len();
        // Its first sectors reached the disk, the rest are still zeros.
        let written = (synced + SECTOR_BYTES).next_multiple_of(SECTOR_BYTES) - synced;
        bytes[synced..synced + written].copy_from_slice(&whole[..written]);
        std::fs::write(&path, &bytes).expect("tear");
        let (memory, segments) = SegmentLog::replay(dir.path()).expect("a torn frame opens");
        assert_eq!(entry_indexes(&memory), vec![1]);
        assert_eq!(segments.current_bytes, synced as u64);
        let opened = std::fs::read(&path).expect("segment");
        assert!(opened.len() < prepared, "cut");
        assert!(opened.ends_with(&seal()));
        // The same frame written whole opens with its entries.
        drop(segments);
        let mut bytes = opened;
        bytes.truncate(synced);
        bytes.extend_from_slice(&whole);
        bytes.resize(prepared, 0);
        std::fs::write(&path, &bytes).expect("whole");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert_eq!(entry_indexes(&memory), (1..=400).collect::<Vec<_>>());
    }

    #[test]
    fn a_closed_segment_keeps_no_prepared_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = SegmentLog::replay(dir.path()).expect("open");
        segments.segment_bytes = FRAMES_START as u64 + 30;
        for index in 1..=3 {
            write(&mut segments, index..=index);
        }
        assert_eq!(segments.current_number, 1, "rolled once");
        let closed = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        let ends: Vec<usize> = frames(&closed).iter().map(|(range, _)| range.end).collect();
        assert_eq!(
            ends.last().copied(),
            Some(closed.len()),
            "ends at its last frame"
        );
        drop(segments);
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
    }

    /// The records of each data frame, in order, and where each frame
    /// (seals included) starts and ends, for a segment written by this
    /// module.
    fn frames(bytes: &[u8]) -> Vec<(std::ops::Range<usize>, usize)> {
        let mut at = Format::of(bytes).expect("a magic").frames_start();
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
        let (_, mut segments) = open_unprepared(dir.path(), "open");
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
        let (_, mut segments) = open_unprepared(dir.path(), "open");
        write(&mut segments, 1..=1);
        write(&mut segments, 2..=3);
        let bytes = std::fs::read(segment_path(dir.path(), 0)).expect("segment");
        let records: Vec<usize> = frames(&bytes).iter().map(|(_, n)| *n).collect();
        assert_eq!(records, vec![1, 2, 0]);
    }

    #[test]
    fn opening_seals_an_unsealed_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = open_unprepared(dir.path(), "open");
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

    /// A segment's bytes after `write`s of one frame per group, with the
    /// frames' extents (the seal excluded). `in_flight`: as a power loss
    /// while the last group was written may leave it: without the seal
    /// after it, and with the end record written before it (the one after
    /// it never reached the disk), so the last frame may be torn.
    fn written_log(
        groups: &[std::ops::RangeInclusive<u64>],
        in_flight: bool,
    ) -> (Vec<u8>, Vec<(std::ops::Range<usize>, usize)>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        let (_, mut segments) = open_unprepared(dir.path(), "open");
        let mut header_before_last = Vec::new();
        for group in groups {
            header_before_last = std::fs::read(&path).expect("segment")[..FRAMES_START].to_vec();
            write(&mut segments, group.clone());
        }
        let mut bytes = std::fs::read(&path).expect("segment");
        assert!(bytes.ends_with(&seal()));
        if in_flight {
            bytes.truncate(bytes.len() - HEADER_BYTES);
            bytes[..FRAMES_START].copy_from_slice(&header_before_last);
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
                for byte in 0..MAGIC_BYTES {
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

    /// The same through real files, for a few cuts of a write in flight
    /// (the end record before it): the file is cut, then sealed, and
    /// appends go on after it.
    #[test]
    fn a_torn_log_is_cut_sealed_and_goes_on() {
        let (bytes, data_frames) = written_log(&seeded_groups(9, 3), true);
        let last = data_frames.last().expect("frames").0.clone();
        for cut in [last.start + 1, last.start + HEADER_BYTES + 1, last.end - 1] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = segment_path(dir.path(), 0);
            std::fs::write(&path, &bytes[..cut]).expect("tear");
            let (memory, mut segments) = open_unprepared(dir.path(), "open torn");
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
        let (_, mut segments) = open_unprepared(dir.path(), "open");
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
        // An L2 segment: frames right after the magic.
        let mut bytes = SEGMENT_MAGIC_L2.to_vec();
        bytes.extend_from_slice(&[0xAB; HEADER_BYTES]); // a damaged header
        while bytes.len() + HEADER_BYTES <= size {
            let body = size - bytes.len() - HEADER_BYTES;
            let body = u32::try_from(body).expect("small");
            bytes.extend_from_slice(&frame_header(body, 0xDEAD_BEEF));
        }
        bytes.resize(size, 0x5A);
        let from = MAGIC_BYTES + 1;
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
        // Beyond the synced end too: the end record before the frame.
        bytes[..FRAMES_START].copy_from_slice(&new_header(0));
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
    fn a_segment_cut_off_inside_its_header_starts_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &SEGMENT_MAGIC[..3]).expect("write");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("open");
        assert!(memory.entries.is_empty());
        // So is one cut inside its end record.
        std::fs::write(segment_path(dir.path(), 0), &new_header(0)[..100]).expect("write");
        let (memory, mut segments) = open_unprepared(dir.path(), "open");
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
        let (_, mut segments) = open_unprepared(dir, "open");
        // The header, then frames of 17 bytes: closed after the second.
        segments.segment_bytes = FRAMES_START as u64 + 30;
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

    /// The refusal an open of `dir` ends with.
    fn refusal(dir: &Path) -> (LogDamage, String) {
        let error = SegmentLog::replay(dir).err().expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        let damage = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<LogDamage>())
            .unwrap_or_else(|| panic!("not a LogDamage: {error}"))
            .clone();
        (damage, error.to_string())
    }

    /// The newest end record in the segment file at `path`.
    fn end_of(path: &Path) -> EndRecord {
        newest_end(&std::fs::read(path).expect("segment")).expect("an end record")
    }

    fn vote(dir: &Path) {
        write_vote(dir, &Vote::new(1, 1)).expect("vote");
    }

    #[test]
    fn every_synced_batch_is_recorded_in_the_segment_and_closing_makes_it_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        let (_, mut segments) = open_unprepared(dir.path(), "open");
        assert_eq!(end_of(&path), EndRecord::created(0));
        write(&mut segments, 1..=2);
        write(&mut segments, 3..=3);
        let bytes = std::fs::read(&path).expect("segment");
        let last = frames(&bytes)
            .into_iter()
            .rfind(|(_, records)| *records > 0)
            .expect("frames")
            .0;
        let end = end_of(&path);
        assert_eq!(
            (end.sequence, end.synced_bytes, end.last_index, end.closed),
            (2, last.end as u64, Some(3), false)
        );
        // Both slots hold a record: the one before it is still whole.
        let older = EndRecord::decode(
            bytes[SLOT_OFFSETS[1]..].first_chunk().expect("slot B"),
            SLOT_OFFSETS[1],
        )
        .expect("slot B checks");
        assert_eq!((older.sequence, older.last_index), (1, Some(2)));
        // A vote alone syncs no frame: no new record.
        let (mut only_vote, mut reply) = pending_write(Vec::new(), None, None);
        only_vote.vote = Some(Vote::new(1, 1));
        assert!(write_and_complete(&mut segments, vec![only_vote]));
        reply.try_recv().expect("completed").expect("durable");
        assert_eq!(end_of(&path), end);
        // Zeros are no record (a slot never written).
        assert!(EndRecord::decode(&[0; SLOT_BYTES], SLOT_OFFSETS[1]).is_none());
        // The wrong slot for its parity is none either.
        assert!(EndRecord::decode(&end.encode(), SLOT_OFFSETS[1]).is_none());
    }

    /// Truncating the last segment below what its end record says was
    /// synced, at a frame boundary or inside a frame, sealed or not, is
    /// refused naming the file and both ends, and cuts nothing.
    #[test]
    fn a_last_segment_truncated_below_its_synced_end_is_refused() {
        let (bytes, data_frames) = written_log(&[1..=2, 3..=3, 4..=6], false);
        let last = data_frames.last().expect("frames").0.clone();
        let middle = data_frames[1].0.clone();
        for (cut, kept_index) in [
            (last.start, Some(3)),
            (last.start + 5, Some(3)),
            (last.end - 1, Some(3)),
            (middle.start, Some(2)),
            (middle.end, Some(3)),
            (FRAMES_START + 3, None),
            (FRAMES_START, None),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = segment_path(dir.path(), 0);
            std::fs::write(&path, &bytes[..cut]).expect("truncate");
            let (damage, message) = refusal(dir.path());
            let frames_end = data_frames
                .iter()
                .map(|(extent, _)| extent.end)
                .filter(|end| *end <= cut)
                .max()
                .unwrap_or(FRAMES_START);
            assert_eq!(
                damage,
                LogDamage::SyncedEndMissing {
                    file: path.clone(),
                    synced_bytes: last.end as u64,
                    synced_index: Some(6),
                    found_bytes: frames_end as u64,
                    found_index: kept_index,
                    file_bytes: cut as u64,
                },
                "cut at {cut}"
            );
            assert!(
                message.contains(&path.display().to_string())
                    && message.contains(&format!("synced through byte {}", last.end))
                    && message.contains(&format!("the file is {cut} bytes long")),
                "{message}"
            );
            assert_eq!(
                std::fs::read(&path).expect("segment"),
                bytes[..cut],
                "a refused log is left as it is"
            );
        }
    }

    /// What lies beyond the recorded synced end is a write in flight: a
    /// torn tail there is still cut.
    #[test]
    fn a_torn_tail_beyond_the_synced_end_is_still_cut() {
        let (bytes, data_frames) = written_log(&[1..=2, 3..=3], false);
        let synced = data_frames.last().expect("frames").0.end;
        let torn_frame = frame(std::iter::once(
            encoded(&Record::Entry(blank_ent::<TypeConfig>(1, 1, 4))).as_slice(),
        ))
        .expect("frame");
        for tail in [
            torn_frame[..torn_frame.len() - 1].to_vec(),
            torn_frame[..5].to_vec(),
            vec![0; 700],
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = segment_path(dir.path(), 0);
            // Over the seal, as the next write goes.
            let mut torn = bytes[..synced].to_vec();
            torn.extend_from_slice(&tail);
            std::fs::write(&path, &torn).expect("tear");
            let (memory, _) = SegmentLog::replay(dir.path()).expect("a torn tail opens");
            assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
            let opened = std::fs::read(&path).expect("segment");
            if tail.iter().all(|byte| *byte == 0) {
                // Zeros are space prepared for frames: sealed, kept.
                assert_eq!(opened.len(), torn.len());
                assert_eq!(&opened[..bytes.len()], bytes.as_slice(), "sealed");
                assert!(opened[bytes.len()..].iter().all(|byte| *byte == 0));
            } else {
                assert_eq!(opened, bytes, "cut, sealed");
            }
        }
    }

    /// Within the synced end, what would be a torn write at the end of the
    /// file is damage: a sector of zeros in a synced frame, a destroyed
    /// header with nothing after it.
    #[test]
    fn within_the_synced_end_nothing_is_taken_for_a_torn_write() {
        let (bytes, data_frames) = written_log(&[1..=1, 2..=400], false);
        let last = data_frames.last().expect("frames").0.clone();
        let unsealed = &bytes[..last.end];
        let sector = (last.start + HEADER_BYTES).next_multiple_of(SECTOR_BYTES);
        let mut zeros = unsealed.to_vec();
        zeros[sector..sector + SECTOR_BYTES].fill(0);
        assert!(matches!(
            scan_segment(&zeros, true),
            Err(SegmentFault::Frame { offset, kind: DamageKind::BodyChecksum }) if offset == last.start
        ));
        let mut header = unsealed.to_vec();
        header[last.start..last.start + HEADER_BYTES].fill(0);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &header).expect("damage");
        assert!(matches!(
            refusal(dir.path()).0,
            LogDamage::Frame { offset, kind: DamageKind::HeaderChecksum, .. } if offset == last.start as u64
        ));
    }

    /// After a power loss the end record on disk may be older than the
    /// frames (it is written after each sync, and synced by the next): the
    /// frames after it are judged as before, and the log opens.
    #[test]
    fn an_older_end_record_after_a_power_loss_opens() {
        // The last batch synced, its record lost; sealed or not.
        let (in_flight, data_frames) = written_log(&[1..=2, 3..=3, 4..=5], true);
        let last = data_frames.last().expect("frames").0.clone();
        for bytes in [in_flight.clone(), [&in_flight[..], &seal()].concat()] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = segment_path(dir.path(), 0);
            std::fs::write(&path, &bytes).expect("write");
            let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
            assert_eq!(entry_indexes(&memory), vec![1, 2, 3, 4, 5]);
            // Opening synced the frames, and records them now.
            let end = end_of(&path);
            assert_eq!(
                (end.synced_bytes, end.last_index),
                (last.end as u64, Some(5))
            );
        }
        // The last batch torn (in flight), the record from before it.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        std::fs::write(&path, &in_flight[..last.end - 3]).expect("tear");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
        // The newest record's slot torn: the other copy, older, counts.
        let (bytes, _) = written_log(&[1..=2, 3..=3], false);
        let newest = newest_end(&bytes).expect("a record");
        let mut torn_slot = bytes.clone();
        torn_slot[newest.offset() + 20] ^= 0xFF;
        let older = newest_end(&torn_slot).expect("the other copy");
        assert_eq!(older.sequence + 1, newest.sequence);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &torn_slot).expect("write");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
        // Neither copy checks: damage.
        let mut both = torn_slot.clone();
        both[older.offset() + 3] ^= 0x01;
        std::fs::write(segment_path(dir.path(), 0), &both).expect("write");
        let (damage, message) = refusal(dir.path());
        assert!(matches!(damage, LogDamage::Header { .. }), "{message}");
        assert!(
            message.contains("neither copy of its end record checks"),
            "{message}"
        );
    }

    /// An end record promising more entries than the frames hold, or
    /// written to another segment, or whose synced end is not where a frame
    /// ends, is refused.
    #[test]
    fn an_end_record_the_frames_contradict_is_refused() {
        let (bytes, _) = written_log(&[1..=2, 3..=3], false);
        let newest = newest_end(&bytes).expect("a record");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 0);
        let rewritten = |record: EndRecord| {
            let mut out = bytes.clone();
            out[record.offset()..record.offset() + SLOT_BYTES].copy_from_slice(&record.encode());
            std::fs::write(&path, &out).expect("write");
        };
        rewritten(
            newest
                .next(newest.synced_bytes, Some(9), false)
                .expect("next"),
        );
        assert!(matches!(
            refusal(dir.path()).0,
            LogDamage::SyncedEndMissing {
                synced_index: Some(9),
                found_index: Some(3),
                ..
            }
        ));
        rewritten(EndRecord {
            segment: 7,
            ..newest
                .next(newest.synced_bytes, Some(3), false)
                .expect("next")
        });
        let (_, message) = refusal(dir.path());
        assert!(message.contains("0000000007.log"), "{message}");
        rewritten(
            newest
                .next(newest.synced_bytes - 1, Some(3), false)
                .expect("next"),
        );
        let (_, message) = refusal(dir.path());
        assert!(message.contains("not where a frame ends"), "{message}");
    }

    #[test]
    fn a_closed_segment_records_it_durably_and_its_lost_successor_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(rolled(dir.path(), 4));
        assert_eq!(
            segment_numbers(dir.path()).expect("segments"),
            vec![0, 1, 2]
        );
        let closed = end_of(&segment_path(dir.path(), 1));
        assert!(closed.closed && closed.last_index == Some(4), "{closed:?}");
        // The last segment deleted.
        let last = segment_path(dir.path(), 2);
        let kept = std::fs::read(&last).expect("segment");
        std::fs::remove_file(&last).expect("delete");
        let (damage, message) = refusal(dir.path());
        assert_eq!(
            damage,
            LogDamage::SuccessorMissing {
                file: segment_path(dir.path(), 1),
                missing: last.clone(),
            }
        );
        assert!(message.contains(&last.display().to_string()), "{message}");
        // The last two.
        std::fs::remove_file(segment_path(dir.path(), 1)).expect("delete");
        assert!(matches!(
            refusal(dir.path()).0,
            LogDamage::SuccessorMissing { missing, .. } if missing == segment_path(dir.path(), 1)
        ));
        // Cut inside its header, after its predecessor was closed on it.
        let dir = tempfile::tempdir().expect("tempdir");
        drop(rolled(dir.path(), 4));
        let last = segment_path(dir.path(), 2);
        std::fs::write(&last, &kept[..40]).expect("truncate");
        let (damage, message) = refusal(dir.path());
        assert!(
            matches!(damage, LogDamage::Header { file, .. } if file == last),
            "{message}"
        );
        assert!(message.contains("0000000001.log was closed"), "{message}");
    }

    /// A crash while a segment is rolled, after the next one was created and
    /// before the closing one said so: the next one may still be torn
    /// inside its header, or deleted, and the log opens.
    #[test]
    fn a_crash_while_rolling_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut segments = rolled(dir.path(), 2);
        write(&mut segments, 3..=3);
        drop(segments);
        let closing = segment_path(dir.path(), 0);
        assert!(end_of(&closing).closed);
        // Segment 0 as it was before it was closed: its record before.
        let mut bytes = std::fs::read(&closing).expect("segment");
        let end = end_of(&closing);
        bytes[end.offset()..end.offset() + SLOT_BYTES].fill(0);
        std::fs::write(&closing, &bytes).expect("unclose");
        assert!(!end_of(&closing).closed);
        std::fs::write(segment_path(dir.path(), 1), &new_header(1)[..50]).expect("torn");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert_eq!(entry_indexes(&memory), vec![1, 2]);
        std::fs::remove_file(segment_path(dir.path(), 1)).expect("delete");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert_eq!(entry_indexes(&memory), vec![1, 2]);
    }

    #[test]
    fn a_vote_without_a_segment_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut segments) = open_unprepared(dir.path(), "open");
        write(&mut segments, 1..=1);
        drop(segments);
        vote(dir.path());
        let only = segment_path(dir.path(), 0);
        let bytes = std::fs::read(&only).expect("segment");
        std::fs::remove_file(&only).expect("delete");
        let (damage, message) = refusal(dir.path());
        assert_eq!(
            damage,
            LogDamage::NoSegments {
                dir: dir.path().to_path_buf()
            }
        );
        assert!(
            message.starts_with(&format!(
                "log segments missing: {} has a vote but no segment",
                dir.path().display()
            )),
            "{message}"
        );
        // Emptied, or cut inside its header: the same, under a vote.
        for cut in [0, 3, 100] {
            std::fs::write(&only, &bytes[..cut]).expect("truncate");
            let (damage, message) = refusal(dir.path());
            assert!(matches!(damage, LogDamage::Header { .. }), "{message}");
            assert!(message.contains("the log has a vote"), "{message}");
        }
        // Without the vote (a crash while the log was first created), it
        // starts again.
        std::fs::remove_file(dir.path().join(VOTE_FILE)).expect("unvote");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("opens");
        assert!(memory.entries.is_empty());
    }

    /// A log written before end records (`oncekvL2`: the magic, then
    /// frames) opens and reads as it did; it goes on in a new L3 segment.
    #[test]
    fn an_l2_log_opens_and_goes_on_in_an_l3_segment() {
        let mut l2 = SEGMENT_MAGIC_L2.to_vec();
        let mut boundaries = Vec::new();
        for group in [1..=2u64, 3..=3, 4..=5] {
            let records: Vec<Vec<u8>> = group
                .map(|index| encoded(&Record::Entry(blank_ent::<TypeConfig>(1, 1, index))))
                .collect();
            l2.extend(frame(records.iter().map(Vec::as_slice)).expect("frame"));
            boundaries.push(l2.len());
        }
        l2.extend_from_slice(&seal());
        let dir = tempfile::tempdir().expect("tempdir");
        let old = segment_path(dir.path(), 0);
        std::fs::write(&old, &l2).expect("write");
        vote(dir.path());
        let (memory, mut segments) = open_unprepared(dir.path(), "open");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3, 4, 5]);
        assert_eq!(segments.current_number, 1, "a new segment");
        assert_eq!(std::fs::read(&old).expect("segment"), l2, "left as it was");
        write(&mut segments, 6..=6);
        drop(segments);
        let (memory, _) = SegmentLog::replay(dir.path()).expect("reopen");
        assert_eq!(entry_indexes(&memory), (1..=6).collect::<Vec<_>>());
        assert!(
            std::fs::read(segment_path(dir.path(), 1))
                .expect("segment")
                .starts_with(SEGMENT_MAGIC)
        );
        // An L2 last segment records no end: cut at a frame boundary, it
        // opens shorter, as before.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 0), &l2[..boundaries[1]]).expect("write");
        let (memory, _) = SegmentLog::replay(dir.path()).expect("open");
        assert_eq!(entry_indexes(&memory), vec![1, 2, 3]);
    }

    /// End records are disk input: whatever numbers a checked one holds,
    /// opening answers (opens or refuses) and never panics or overflows.
    #[test]
    fn end_records_with_any_numbers_never_panic() {
        let (bytes, _) = written_log(&[1..=2, 3..=3], false);
        let newest = newest_end(&bytes).expect("a record");
        let extremes = [
            0,
            1,
            FRAMES_START as u64 - 1,
            bytes.len() as u64,
            u64::MAX - 1,
            u64::MAX,
        ];
        for sequence in [newest.sequence + 1, u64::MAX - 1, u64::MAX] {
            for segment in [0, 1, u64::MAX] {
                for synced_bytes in extremes {
                    for last_index in [None, Some(0), Some(3), Some(u64::MAX)] {
                        for closed in [false, true] {
                            let record = EndRecord {
                                sequence,
                                segment,
                                synced_bytes,
                                last_index,
                                closed,
                            };
                            let mut forged = bytes.clone();
                            let at = record.offset();
                            forged[at..at + SLOT_BYTES].copy_from_slice(&record.encode());
                            let dir = tempfile::tempdir().expect("tempdir");
                            std::fs::write(segment_path(dir.path(), 0), &forged).expect("write");
                            vote(dir.path());
                            if let Ok((memory, mut segments)) = SegmentLog::replay(dir.path()) {
                                assert_eq!(entry_indexes(&memory), vec![1, 2, 3], "{record:?}");
                                write(&mut segments, 4..=4);
                            }
                        }
                    }
                }
            }
        }
    }
}
