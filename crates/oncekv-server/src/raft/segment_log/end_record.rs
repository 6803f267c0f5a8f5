//! The segment header of the current format (`oncekvL3`) and its **end
//! record**: how far the segment was synced, so that opening the log tells
//! a torn write from synced data that is gone (see the module doc).

use super::*;
use std::os::unix::fs::FileExt as _;

/// Bytes of either segment magic.
pub(super) const MAGIC_BYTES: usize = 8;
/// The first bytes of every segment this version writes.
pub(super) const SEGMENT_MAGIC: &[u8; MAGIC_BYTES] = b"oncekvL3";
/// The first bytes of a segment of the earlier format: the magic, then
/// frames. Still read, never written.
pub(super) const SEGMENT_MAGIC_L2: &[u8; MAGIC_BYTES] = b"oncekvL2";
/// Bytes of one copy of the end record.
pub(super) const SLOT_BYTES: usize = 40;
/// Where the two copies (slots A and B) of the end record lie: A after the
/// magic in the first sector, B in the second, so that no write of one
/// sector can touch both.
pub(super) const SLOT_OFFSETS: [usize; 2] = [MAGIC_BYTES, SECTOR_BYTES];
/// Where an L3 segment's first frame starts: after the header (magic and
/// both slots), in a sector of its own.
pub(super) const FRAMES_START: usize = 2 * SECTOR_BYTES;
/// End record flags: it names a last index; the segment is closed.
const HAS_INDEX: u8 = 1;
const CLOSED: u8 = 2;

/// The format of a segment, from its magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// `oncekvL2`: the magic, then frames; no end record.
    L2,
    /// `oncekvL3`: the magic and the end record's two slots, then frames
    /// from [`FRAMES_START`].
    L3,
}

impl Format {
    /// The format whose magic `bytes` starts with.
    pub(super) fn of(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(SEGMENT_MAGIC) {
            Some(Format::L3)
        } else if bytes.starts_with(SEGMENT_MAGIC_L2) {
            Some(Format::L2)
        } else {
            None
        }
    }

    /// Where the first frame starts.
    pub(super) fn frames_start(self) -> usize {
        match self {
            Format::L2 => MAGIC_BYTES,
            Format::L3 => FRAMES_START,
        }
    }
}

/// What a segment says of its own end: written after each synced batch
/// (not synced itself), and synced when the segment is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EndRecord {
    /// Counts the records written to this segment; its parity is its slot
    /// (even A, odd B), and the valid slot with the higher one is newer.
    pub(super) sequence: u64,
    /// The number of the segment it was written to.
    pub(super) segment: u64,
    /// The segment was synced through this byte: where its last synced
    /// frame ends.
    pub(super) synced_bytes: u64,
    /// The highest entry index in the frames synced, if any.
    pub(super) last_index: Option<u64>,
    /// The segment is closed: the log goes on in the next segment number.
    pub(super) closed: bool,
}

impl EndRecord {
    /// The record a new segment `number` is created with: nothing synced
    /// after its header.
    pub(super) fn created(number: u64) -> EndRecord {
        EndRecord {
            sequence: 0,
            segment: number,
            synced_bytes: FRAMES_START as u64,
            last_index: None,
            closed: false,
        }
    }

    /// The record that follows this one, for the same segment.
    pub(super) fn next(
        &self,
        synced_bytes: u64,
        last_index: Option<u64>,
        closed: bool,
    ) -> io::Result<EndRecord> {
        let sequence = self.sequence.checked_add(1).ok_or_else(|| {
            io::Error::other("the end record's sequence number is the last possible")
        })?;
        Ok(EndRecord {
            sequence,
            segment: self.segment,
            synced_bytes,
            last_index,
            closed,
        })
    }

    /// Where this record goes in the segment: slot A or B by its parity.
    pub(super) fn offset(&self) -> usize {
        SLOT_OFFSETS[usize::from(self.sequence % 2 == 1)]
    }

    /// `[sequence u64][segment u64][synced bytes u64][last index u64]
    /// [flags u8][zero u8 x3][crc32 of the 36 bytes before it]`,
    /// little-endian.
    pub(super) fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut slot = [0; SLOT_BYTES];
        slot[..8].copy_from_slice(&self.sequence.to_le_bytes());
        slot[8..16].copy_from_slice(&self.segment.to_le_bytes());
        slot[16..24].copy_from_slice(&self.synced_bytes.to_le_bytes());
        slot[24..32].copy_from_slice(&self.last_index.unwrap_or(0).to_le_bytes());
        let mut flags = 0;
        if self.last_index.is_some() {
            flags |= HAS_INDEX;
        }
        if self.closed {
            flags |= CLOSED;
        }
        slot[32] = flags;
        let crc = crc32fast::hash(&slot[..36]);
        slot[36..].copy_from_slice(&crc.to_le_bytes());
        slot
    }

    /// The record in slot `raw` found at `offset`, if it is one: its
    /// checksum matches, unused bits are zero, and its parity is the
    /// slot's.
    pub(super) fn decode(raw: &[u8; SLOT_BYTES], offset: usize) -> Option<EndRecord> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(*raw.get(at..)?.first_chunk::<8>()?))
        };
        let crc = u32::from_le_bytes(*raw.get(36..)?.first_chunk::<4>()?);
        if crc32fast::hash(&raw[..36]) != crc || raw[33..36] != [0; 3] {
            return None;
        }
        let flags = raw[32];
        if flags & !(HAS_INDEX | CLOSED) != 0 {
            return None;
        }
        let index = word(24)?;
        let last_index = if flags & HAS_INDEX != 0 {
            Some(index)
        } else if index == 0 {
            None
        } else {
            return None;
        };
        let record = EndRecord {
            sequence: word(0)?,
            segment: word(8)?,
            synced_bytes: word(16)?,
            last_index,
            closed: flags & CLOSED != 0,
        };
        (record.offset() == offset).then_some(record)
    }

    /// Writes this record into its slot of `file`, not synced.
    pub(super) fn write_to(&self, file: &File) -> io::Result<()> {
        file.write_all_at(&self.encode(), self.offset() as u64)
    }
}

/// The newest valid end record in an L3 segment's header (`bytes` holds
/// at least [`FRAMES_START`] bytes): a torn write of one slot leaves the
/// other, older one.
pub(super) fn newest_end(bytes: &[u8]) -> Option<EndRecord> {
    SLOT_OFFSETS
        .iter()
        .filter_map(|&offset| {
            let raw = bytes.get(offset..)?.first_chunk::<SLOT_BYTES>()?;
            EndRecord::decode(raw, offset)
        })
        .max_by_key(|record| record.sequence)
}

/// The header segment `number` is created with: the magic, then its first
/// end record in slot A, zeros up to [`FRAMES_START`].
pub(super) fn new_header(number: u64) -> Vec<u8> {
    let mut header = vec![0; FRAMES_START];
    header[..MAGIC_BYTES].copy_from_slice(SEGMENT_MAGIC);
    let record = EndRecord::created(number);
    let at = record.offset();
    header[at..at + SLOT_BYTES].copy_from_slice(&record.encode());
    header
}

/// What the replay found in one segment, for [`check_ends`].
pub(super) struct FoundSegment {
    pub(super) number: u64,
    /// Its newest valid end record (an L3 segment with a whole header).
    pub(super) end: Option<EndRecord>,
    /// Where its frames end (the intact part, a trailing seal excluded).
    pub(super) frames_end: usize,
    /// Where its intact part ends: 0 if not even its header is whole.
    pub(super) intact_end: usize,
    pub(super) file_bytes: usize,
    /// The highest entry index in its frames.
    pub(super) max: Option<u64>,
    /// Whether a frame ends (or the frames start) exactly at the end
    /// record's synced end.
    pub(super) synced_end_is_frame_end: bool,
}

fn bytes_u64(bytes: usize) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// Refuses a log whose end is not where its end records, or its vote,
/// say it is: a segment shorter than it was synced, a closed last segment
/// (its successor is gone), a last segment without even its header that
/// was made durable once, or no segment at all under a vote. `segments`
/// in order, as read; `has_vote` if the log holds a vote.
pub(super) fn check_ends(
    dir: &Path,
    segments: &[FoundSegment],
    has_vote: bool,
) -> Result<(), LogDamage> {
    let Some(last) = segments.last() else {
        // Segment 0 is created, durably, when a log is first opened: before
        // the node can ever vote.
        return match has_vote {
            true => Err(LogDamage::NoSegments {
                dir: dir.to_path_buf(),
            }),
            false => Ok(()),
        };
    };
    let header = |number: u64, why: String| LogDamage::Header {
        file: segment_path(dir, number),
        why,
    };
    for (position, found) in segments.iter().enumerate() {
        let Some(end) = found.end else {
            continue;
        };
        if end.segment != found.number {
            return Err(header(
                found.number,
                format!(
                    "its end record was written to segment {}: the file is a copy of another segment",
                    segment_name(end.segment)
                ),
            ));
        }
        if end.synced_bytes < FRAMES_START as u64 {
            return Err(header(
                found.number,
                format!(
                    "its end record says it was synced through byte {}, inside its header",
                    end.synced_bytes
                ),
            ));
        }
        if bytes_u64(found.frames_end) < end.synced_bytes || found.max < end.last_index {
            return Err(LogDamage::SyncedEndMissing {
                file: segment_path(dir, found.number),
                synced_bytes: end.synced_bytes,
                synced_index: end.last_index,
                found_bytes: bytes_u64(found.frames_end),
                found_index: found.max,
                file_bytes: bytes_u64(found.file_bytes),
            });
        }
        if !found.synced_end_is_frame_end {
            return Err(header(
                found.number,
                format!(
                    "its end record says it was synced through byte {}, which is not where a frame ends",
                    end.synced_bytes
                ),
            ));
        }
        let is_last = position + 1 == segments.len();
        if is_last && end.closed {
            return Err(match found.number.checked_add(1) {
                Some(next) => LogDamage::SuccessorMissing {
                    file: segment_path(dir, found.number),
                    missing: segment_path(dir, next),
                },
                None => header(
                    found.number,
                    "its end record says it is closed, but no segment number can follow it".into(),
                ),
            });
        }
        if is_last && end.sequence == u64::MAX {
            return Err(header(
                found.number,
                "its end record's sequence number is the last possible".into(),
            ));
        }
    }
    if last.intact_end > 0 {
        return Ok(());
    }
    // Not even the last segment's header is whole: a crash while it was
    // created, unless it is known to have been made durable since.
    let why = |since: String| {
        header(
            last.number,
            format!(
                "the file ends inside its header ({} bytes), but {since}, so it was whole and synced once",
                last.file_bytes
            ),
        )
    };
    let before = segments
        .len()
        .checked_sub(2)
        .and_then(|at| segments.get(at));
    match before {
        Some(before) if before.end.is_some_and(|end| end.closed) => Err(why(format!(
            "segment {} was closed and continued in it, after it was created",
            segment_name(before.number)
        ))),
        Some(_) => Ok(()),
        None if last.number > 0 => Err(why(
            "the segments before it were deleted by a purge, which is done only once the next segment is created"
                .into(),
        )),
        None if has_vote => Err(why(
            "the log has a vote, and a log's first segment is created before the node ever votes"
                .into(),
        )),
        None => Ok(()),
    }
}
