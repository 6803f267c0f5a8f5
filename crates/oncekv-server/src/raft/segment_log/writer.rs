//! The writer's view of the segment files ([`Segments`]): group-committed
//! frames, the seal after the last synced one, the end record (how far the
//! segment was synced, and whether it is closed), rolling and purging, and
//! the writer thread ([`Background`]), which group-commits what is queued
//! while a caller that finds it idle writes on its own thread.

use super::*;
use crate::raft::gradual_release::release_gradually;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The writer's view of the segment files.
pub(super) struct Segments {
    pub(super) dir: PathBuf,
    /// Segment number and the highest entry index ever written to it.
    pub(super) closed: Vec<(u64, Option<u64>)>,
    pub(super) current: File,
    pub(super) current_number: u64,
    pub(super) current_max: Option<u64>,
    /// Where the next frame goes: the end of the last frame. A seal after
    /// it is written over.
    pub(super) current_bytes: u64,
    /// Whether a seal follows the last frame.
    pub(super) sealed: bool,
    /// Where the current segment's file ends: zeros, written and synced
    /// along with the frames, from the last frame (or seal) to here.
    pub(super) prepared_end: u64,
    /// How far beyond what a frame needs zeros are prepared
    /// ([`PREPARED_BYTES`]).
    pub(super) prepare_ahead: u64,
    /// Frame size a batch is cut at ([`FRAME_BYTES_TARGET`]).
    pub(super) frame_target: usize,
    /// Where the first failed write is recorded.
    pub(super) failure: StorageFailure,
    /// Size a segment is closed at ([`SEGMENT_BYTES`]).
    pub(super) segment_bytes: u64,
    /// The end record last written to the current segment.
    pub(super) end: EndRecord,
}

/// The last segment as replayed, which the writer goes on with.
pub(super) struct Tail {
    pub(super) number: u64,
    /// The highest entry index written to it.
    pub(super) max: Option<u64>,
    /// See [`ScannedSegment`].
    pub(super) intact_end: usize,
    pub(super) trailing_seal: Option<usize>,
    pub(super) torn: Option<TornTail>,
    /// The size of the file as found.
    pub(super) file_bytes: usize,
    /// Its newest end record; `None` for an L2 segment.
    pub(super) end: Option<EndRecord>,
}

impl Segments {
    /// Goes on with the replayed last segment, which holds at least its
    /// header: syncs it, records its end, then seals it. An L2 segment
    /// (no end record) is synced and closed instead, and the log goes on
    /// in a new L3 segment after it.
    pub(super) fn resume(
        dir: &Path,
        mut closed: Vec<(u64, Option<u64>)>,
        tail: Tail,
    ) -> io::Result<Segments> {
        let current = OpenOptions::new()
            .write(true)
            .open(segment_path(dir, tail.number))?;
        // Frames intact in the page cache but never synced (the process
        // stopped between a write and its sync) become durable before
        // anything is written after them.
        current.sync_data()?;
        let Some(recorded) = tail.end else {
            drop(current);
            let number = next_number(tail.number)?;
            closed.push((tail.number, tail.max));
            return Segments::create(dir, closed, number);
        };
        let (end, sealed) = match tail.trailing_seal {
            Some(seal_at) => (seal_at, true),
            None => (tail.intact_end, false),
        };
        // A torn tail was cut at the intact end; anything else after it is
        // zeros prepared before.
        let prepared_end = match tail.torn {
            Some(_) => tail.intact_end,
            None => tail.file_bytes,
        };
        let mut segments = Segments {
            dir: dir.to_path_buf(),
            closed,
            current,
            current_number: tail.number,
            current_max: tail.max,
            current_bytes: end as u64,
            sealed,
            prepared_end: prepared_end as u64,
            prepare_ahead: PREPARED_BYTES,
            frame_target: FRAME_BYTES_TARGET,
            segment_bytes: SEGMENT_BYTES,
            failure: StorageFailure::default(),
            end: recorded,
        };
        // Everything intact is synced now: the end record says so.
        segments.record_end(false)?;
        segments.seal()?;
        Ok(segments)
    }

    /// Starts segment `number` afresh.
    pub(super) fn create(
        dir: &Path,
        closed: Vec<(u64, Option<u64>)>,
        number: u64,
    ) -> io::Result<Segments> {
        Ok(Segments {
            dir: dir.to_path_buf(),
            closed,
            current: create_segment(dir, number)?,
            current_number: number,
            current_max: None,
            current_bytes: FRAMES_START as u64,
            sealed: false,
            prepared_end: FRAMES_START as u64,
            prepare_ahead: PREPARED_BYTES,
            frame_target: FRAME_BYTES_TARGET,
            segment_bytes: SEGMENT_BYTES,
            failure: StorageFailure::default(),
            end: EndRecord::created(number),
        })
    }

    /// Writes a frame after the last one (over the seal, if any), into
    /// prepared zeros.
    pub(super) fn write_frame(&mut self, framed: &[u8]) -> io::Result<()> {
        let end = self
            .current_bytes
            .checked_add(framed.len() as u64)
            .and_then(|end| end.checked_add(HEADER_BYTES as u64))
            .ok_or_else(|| io::Error::other("a segment offset overflows"))?;
        self.prepare(end)?;
        self.current.seek(SeekFrom::Start(self.current_bytes))?;
        self.sealed = false;
        self.current.write_all(framed)?;
        self.current_bytes += framed.len() as u64;
        Ok(())
    }

    /// Makes sure the file holds at least `end` bytes, by writing zeros
    /// from where it ends through `prepare_ahead` beyond `end`. They
    /// are synced with the frame written into them; the frames after it
    /// go into zeros already on disk, so their syncs change no file size
    /// and leave the file system no metadata to commit (on ext4 a sync
    /// that grows the file waits for a journal commit; one that does not,
    /// measured on this project's disk, takes about 30% less time).
    fn prepare(&mut self, end: u64) -> io::Result<()> {
        if end <= self.prepared_end {
            return Ok(());
        }
        let target = end
            .checked_add(self.prepare_ahead)
            .ok_or_else(|| io::Error::other("a segment offset overflows"))?;
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        self.current.seek(SeekFrom::Start(self.prepared_end))?;
        let mut left = target - self.prepared_end;
        while left > 0 {
            let now = left.min(ZEROS.len() as u64);
            // `now` is at most the buffer's length.
            self.current.write_all(&ZEROS[..now as usize])?;
            left -= now;
        }
        self.prepared_end = target;
        Ok(())
    }

    /// Puts a seal after the last frame, written but not synced: everything
    /// before it is synced. Not in a segment without a frame, nor twice.
    pub(super) fn seal(&mut self) -> io::Result<()> {
        if self.sealed || self.current_bytes <= FRAMES_START as u64 {
            return Ok(());
        }
        self.current.seek(SeekFrom::Start(self.current_bytes))?;
        self.current.write_all(&seal())?;
        self.sealed = true;
        Ok(())
    }

    /// Writes the current segment's end record into its next slot, not
    /// synced: everything up to the last frame is synced, and the highest
    /// entry index in it is `current_max`; `closed` if the log goes on in
    /// the next segment. Nothing if that is what the last record says.
    /// Written only after the sync it describes, it reaches the disk with
    /// the next sync (or the kernel's writeback): after a power loss the
    /// record there may be older than the frames, never newer.
    pub(super) fn record_end(&mut self, closed: bool) -> io::Result<()> {
        let unchanged = self.end.synced_bytes == self.current_bytes
            && self.end.last_index == self.current_max
            && self.end.closed == closed;
        if unchanged {
            return Ok(());
        }
        let next = self
            .end
            .next(self.current_bytes, self.current_max, closed)?;
        next.write_to(&self.current)?;
        self.end = next;
        Ok(())
    }

    pub(super) fn write_batch(&mut self, batch: &[Pending]) -> io::Result<()> {
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
            self.write_frame(&framed)?;
            let syncing = std::time::Instant::now();
            self.current.sync_data()?;
            metrics::histogram!("oncekv_log_fsync_duration_seconds")
                .record(syncing.elapsed().as_secs_f64());
        }
        // One small write, no sync: how far this segment is synced.
        self.record_end(false)?;
        // Votes go through the same queue as appends, so a vote never
        // becomes durable before appends submitted ahead of it.
        if let Some(vote) = batch.iter().rev().find_map(|write| write.vote) {
            write_vote(&self.dir, &vote)?;
        }
        if self.current_bytes >= self.segment_bytes {
            self.roll()?;
        }
        if let Some(through) = purge_through {
            self.delete_purged(through)?;
        }
        // Before any callback fires: an acknowledged write is followed by
        // a seal (or a frame) whenever the process stops.
        self.seal()
    }

    pub(super) fn roll(&mut self) -> io::Result<()> {
        // The closing segment keeps no prepared zeros: it ends where its
        // last frame does (synced below, with its closing record).
        self.current.set_len(self.current_bytes)?;
        self.prepared_end = self.current_bytes;
        let number = next_number(self.current_number)?;
        let file = create_segment(&self.dir, number)?;
        // The next segment is durable: only now does the closing one say
        // the log goes on there, durably, so that losing it is refused.
        self.record_end(true)?;
        self.current.sync_data()?;
        self.closed.push((self.current_number, self.current_max));
        self.current = file;
        self.current_number = number;
        self.current_max = None;
        self.current_bytes = FRAMES_START as u64;
        self.sealed = false;
        self.prepared_end = FRAMES_START as u64;
        self.end = EndRecord::created(number);
        Ok(())
    }

    /// Deletes the oldest segments while every entry they hold is purged.
    /// Their blocks go back to the file system gradually, on a thread of
    /// their own: freed here, all at once, they would hold up the next
    /// sync of the log ([`release_gradually`]).
    pub(super) fn delete_purged(&mut self, through: u64) -> io::Result<()> {
        let mut deleted = 0;
        let mut removed = Vec::new();
        for (number, max) in &self.closed {
            if max.is_some_and(|max| max > through) {
                break;
            }
            let path = segment_path(&self.dir, *number);
            // Held open, the file keeps its blocks past its removal.
            removed.extend(std::fs::OpenOptions::new().write(true).open(&path).ok());
            std::fs::remove_file(&path)?;
            deleted += 1;
        }
        if deleted > 0 {
            self.closed.drain(..deleted);
            sync_dir(&self.dir)?;
        }
        release_gradually(removed);
        Ok(())
    }
}

impl Drop for Segments {
    /// A clean stop makes the last end record durable, rather than leave
    /// it to the kernel's writeback. Not after a failed write or sync: the
    /// file is in an unknown state, and nothing more is claimed of it.
    fn drop(&mut self) {
        if self.failure.kind().is_none()
            && let Err(error) = self.current.sync_data()
        {
            tracing::warn!(%error, "syncing the log's last segment on close failed");
        }
    }
}

/// The segment number after `number` (which comes from a file name on
/// disk).
fn next_number(number: u64) -> io::Result<u64> {
    number.checked_add(1).ok_or_else(|| {
        io::Error::other(format!(
            "segment number {number} is the last possible: no segment can follow it"
        ))
    })
}

impl Done {
    pub(super) fn complete(self, outcome: io::Result<()>) {
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
pub(super) fn write_and_complete(segments: &mut Segments, batch: Vec<Pending>) -> bool {
    let result = segments.write_batch(&batch);
    if let Err(error) = &result {
        segments.failure.record(error);
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

pub(super) fn failed_log() -> io::Error {
    io::Error::other("the log is failed after a write error")
}

/// The writer thread's side of the log: its queue, and the segments it
/// shares with callers that find it idle.
pub(super) struct Background {
    sender: mpsc::Sender<Pending>,
    /// `None` once a write has failed: nothing is written after it.
    segments: Arc<Mutex<Option<Segments>>>,
    /// Writes sent to the thread and not yet written; changed to zero only
    /// under the `segments` lock.
    queued: Arc<AtomicUsize>,
}

impl Background {
    /// Starts the writer thread over `segments`.
    pub(super) fn start(segments: Segments) -> io::Result<Background> {
        let (sender, requests) = mpsc::channel();
        let segments = Arc::new(Mutex::new(Some(segments)));
        let queued = Arc::new(AtomicUsize::new(0));
        let thread_segments = Arc::clone(&segments);
        let thread_queued = Arc::clone(&queued);
        std::thread::Builder::new()
            .name("oncekv-log-writer".into())
            .spawn(move || run_writer(&thread_segments, &thread_queued, &requests))?;
        Ok(Background {
            sender,
            segments,
            queued,
        })
    }

    /// Makes `write` durable: on the calling thread if `inline_if_idle`
    /// and nothing is queued or being written (no hand-off to the writer
    /// thread and back), otherwise queued for the writer thread, which
    /// group-commits whatever is queued.
    pub(super) fn submit(&self, write: Pending, inline_if_idle: bool) -> io::Result<()> {
        let write = if inline_if_idle {
            match self.try_inline(write) {
                None => return Ok(()),
                Some(write) => write,
            }
        } else {
            write
        };
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.sender.send(write).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            io::Error::other("the log writer has stopped after a write error")
        })
    }

    /// Writes `write` here and now if the writer is idle (its lock free and
    /// nothing queued: everything submitted earlier is written), completing
    /// it; otherwise gives it back.
    fn try_inline(&self, write: Pending) -> Option<Pending> {
        let Ok(mut guard) = self.segments.try_lock() else {
            return Some(write);
        };
        // Checked under the lock: the thread empties the queue only under
        // it, so nothing submitted before this write is left unwritten.
        if self.queued.load(Ordering::SeqCst) != 0 {
            return Some(write);
        }
        let outcome = match guard.as_mut() {
            Some(segments) => {
                let result = segments.write_batch(std::slice::from_ref(&write));
                if let Err(error) = &result {
                    segments.failure.record(error);
                    tracing::error!(%error, "log write failed: this node stops acknowledging");
                    *guard = None;
                }
                result
            }
            None => Err(failed_log()),
        };
        drop(guard);
        write.done.complete(outcome);
        None
    }
}

pub(super) fn run_writer(
    segments: &Mutex<Option<Segments>>,
    queued: &AtomicUsize,
    requests: &mpsc::Receiver<Pending>,
) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        let mut guard = crate::sync::lock(segments);
        let result = match guard.as_mut() {
            Some(open) => {
                let result = open.write_batch(&batch);
                if let Err(error) = &result {
                    open.failure.record(error);
                    tracing::error!(%error, "log write failed: this node stops acknowledging");
                    // A failed fsync leaves the file in an unknown state:
                    // never write to it again. Later requests fail until
                    // restart.
                    *guard = None;
                }
                result
            }
            None => Err(failed_log()),
        };
        queued.fetch_sub(batch.len(), Ordering::SeqCst);
        drop(guard);
        for write in batch {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
            };
            write.done.complete(outcome);
        }
    }
}
