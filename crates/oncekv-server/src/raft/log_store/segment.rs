//! The on-disk format of the log: segment files and the frames in them,
//! reading a segment back (with torn-tail detection) and writing to the
//! active one.
//!
//! ```text
//! segment  = header frame*                      file "<number:020>.seg"
//! header   = "OKVLOG01" salt:u32le crc32(magic ++ salt):u32le
//! frame    = len:u32le crc:u32le payload[len]   crc = crc32(salt ++ len ++ payload)
//! payload  = record+                            postcard-encoded `Record`s
//! ```
//!
//! One frame is one write batch and is fsynced before the next frame is
//! written. So after a crash only the last frame of the last segment can be
//! damaged (pages of one unsynced write may reach the disk in any order, but
//! they all belong to that frame). Reading therefore cuts off a damaged
//! frame at the end of the last segment and refuses damage anywhere else:
//! if any intact frame follows the damage, it is not a torn write. The
//! random per-segment salt makes a frame from an older segment, or one
//! embedded in an entry's payload, invalid at any other place.
//!
//! Every segment's first record is a checkpoint of the state that older
//! segments established, so any suffix of the segments replays correctly.

use super::{Checkpoint, LogStoreError, Record, RecordRef, encode};
use openraft::RaftTypeConfig;
use openraft::entry::RaftEntry;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"OKVLOG01";
const HEADER_BYTES: usize = 16;
const FRAME_HEADER_BYTES: usize = 8;
/// Largest frame payload; a longer length field is damage.
pub(super) const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;
/// The number of the first segment of a new log.
pub(super) const FIRST_NUMBER: u64 = 1;
const SUFFIX: &str = ".seg";

pub(super) fn path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:020}{SUFFIX}"))
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), LogStoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LogStoreError::io("syncing directory", dir))
}

/// The segment numbers in `dir`, ascending and without gaps.
pub(super) fn list(dir: &Path) -> Result<Vec<u64>, LogStoreError> {
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(LogStoreError::io("listing", dir))? {
        let entry = entry.map_err(LogStoreError::io("listing", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(SUFFIX)
            && stem.len() == 20
            && let Ok(number) = stem.parse::<u64>()
        {
            numbers.push(number);
        } else if name.ends_with(".log") || name == "vote" {
            return Err(LogStoreError::Corrupt {
                path: entry.path(),
                offset: 0,
                reason: "a file of an older log format: refusing to start on it".into(),
            });
        }
    }
    numbers.sort_unstable();
    if let Some(pair) = numbers.windows(2).find(|pair| pair[1] != pair[0] + 1) {
        return Err(LogStoreError::Corrupt {
            path: path(dir, pair[0] + 1),
            offset: 0,
            reason: "segment is missing".into(),
        });
    }
    Ok(numbers)
}

fn frame_crc(salt: u32, length: u32, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(&length.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

fn header(salt: u32) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32fast::hash(&header[..12]);
    header[12..].copy_from_slice(&crc.to_le_bytes());
    header
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let field = bytes.get(at..at + 4)?;
    Some(u32::from_le_bytes([field[0], field[1], field[2], field[3]]))
}

/// The intact frame starting at `at`, if there is one: its payload.
fn frame_at(bytes: &[u8], at: usize, salt: u32) -> Option<&[u8]> {
    let length = u32_at(bytes, at)?;
    let crc = u32_at(bytes, at + 4)?;
    let size = length as usize;
    if size == 0 || size > FRAME_BYTES_MAX {
        return None;
    }
    let start = at + FRAME_HEADER_BYTES;
    let payload = bytes.get(start..start.checked_add(size)?)?;
    (frame_crc(salt, length, payload) == crc).then_some(payload)
}

/// What one segment holds.
pub(super) struct Scan<C: RaftTypeConfig> {
    pub(super) records: Vec<Record<C>>,
    /// The highest entry index written to the segment.
    pub(super) max_index: Option<u64>,
}

/// Reads segment `number`. In the last segment a damaged final frame is a
/// torn write and is cut off (the file is truncated); a last segment left
/// without any intact frame was torn while being created and is deleted
/// (`None`). Any other damage is an error.
pub(super) fn read<C: RaftTypeConfig>(
    dir: &Path,
    number: u64,
    last: bool,
) -> Result<Option<Scan<C>>, LogStoreError> {
    let path = path(dir, number);
    let bytes = std::fs::read(&path).map_err(LogStoreError::io("reading", &path))?;
    let corrupt = |offset: usize, reason: String| LogStoreError::Corrupt {
        path: path.clone(),
        offset: offset as u64,
        reason,
    };
    let discard = || -> Result<Option<Scan<C>>, LogStoreError> {
        tracing::warn!(segment = %path.display(), "deleting a log segment torn while being created");
        std::fs::remove_file(&path).map_err(LogStoreError::io("deleting", &path))?;
        sync_dir(dir)?;
        Ok(None)
    };

    // A crash while the segment was being created leaves a prefix of the
    // header, or zeros; the segment was never used.
    let torn_creation = (bytes.len() < HEADER_BYTES
        && bytes
            .iter()
            .zip(MAGIC.iter())
            .all(|(got, want)| got == want))
        || bytes.iter().all(|b| *b == 0);
    let salt = match bytes.get(..HEADER_BYTES) {
        Some(head) if head[..8] == MAGIC[..] => {
            let salt = u32_at(head, 8).unwrap_or_default();
            if head != header(salt).as_slice() {
                return Err(corrupt(0, "segment header checksum mismatch".into()));
            }
            salt
        }
        _ if last && torn_creation => return discard(),
        _ => return Err(corrupt(0, "not a log segment (bad header)".into())),
    };

    let mut records = Vec::new();
    let mut max_index = None;
    let mut offset = HEADER_BYTES;
    while offset < bytes.len() {
        let Some(payload) = frame_at(&bytes, offset, salt) else {
            let later_intact =
                (offset + 1..bytes.len()).any(|at| frame_at(&bytes, at, salt).is_some());
            if !last || later_intact {
                return Err(corrupt(
                    offset,
                    "damaged frame before intact data (not a torn tail): refusing to start".into(),
                ));
            }
            tracing::warn!(
                segment = %path.display(),
                offset,
                dropped_bytes = bytes.len() - offset,
                "torn write at the end of the log: cutting it off"
            );
            if records.is_empty() {
                return discard();
            }
            let file = File::options()
                .write(true)
                .open(&path)
                .map_err(LogStoreError::io("opening", &path))?;
            file.set_len(offset as u64)
                .and_then(|()| file.sync_all())
                .map_err(LogStoreError::io("truncating the torn tail of", &path))?;
            break;
        };
        let mut rest = payload;
        while !rest.is_empty() {
            let (record, tail) = postcard::take_from_bytes::<Record<C>>(rest)
                .map_err(|e| corrupt(offset, format!("intact frame does not decode: {e}")))?;
            if records.is_empty() && !matches!(record, Record::Checkpoint(_)) {
                return Err(corrupt(
                    offset,
                    "segment does not start with a checkpoint".into(),
                ));
            }
            if let Record::Entry(entry) = &record {
                max_index = max_index.max(Some(entry.index()));
            }
            records.push(record);
            rest = tail;
        }
        offset += FRAME_HEADER_BYTES + payload.len();
    }
    if records.is_empty() {
        // Only the header made it to disk.
        return if last {
            discard()
        } else {
            Err(corrupt(offset, "segment has no checkpoint".into()))
        };
    }
    Ok(Some(Scan { records, max_index }))
}

/// A frame being assembled: room for the frame header, then records.
pub(super) struct FrameBuf {
    bytes: Vec<u8>,
}

impl FrameBuf {
    pub(super) fn new() -> FrameBuf {
        FrameBuf {
            bytes: vec![0; FRAME_HEADER_BYTES],
        }
    }

    pub(super) fn payload_len(&self) -> usize {
        self.bytes.len() - FRAME_HEADER_BYTES
    }

    pub(super) fn is_empty(&self) -> bool {
        self.payload_len() == 0
    }

    pub(super) fn extend(&mut self, record_bytes: &[u8]) {
        self.bytes.extend_from_slice(record_bytes);
    }

    pub(super) fn push<C: RaftTypeConfig>(
        &mut self,
        record: &RecordRef<'_, C>,
    ) -> Result<(), LogStoreError> {
        encode(record, &mut self.bytes)
    }

    /// Fills in the header; the bytes are then ready to be written.
    fn seal(&mut self, salt: u32) -> Result<&[u8], LogStoreError> {
        let size = self.payload_len();
        if size > FRAME_BYTES_MAX {
            return Err(LogStoreError::TooLarge(size));
        }
        let length = size as u32;
        let crc = frame_crc(salt, length, &self.bytes[FRAME_HEADER_BYTES..]);
        self.bytes[..4].copy_from_slice(&length.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        Ok(&self.bytes)
    }

    pub(super) fn clear(&mut self) {
        self.bytes.truncate(FRAME_HEADER_BYTES);
    }
}

/// The segment being written.
pub(super) struct Active {
    file: File,
    path: PathBuf,
    pub(super) number: u64,
    salt: u32,
    /// Bytes in the file.
    pub(super) bytes: u64,
    /// The highest entry index written to it.
    pub(super) max_index: Option<u64>,
}

impl Active {
    /// Creates segment `number` holding `checkpoint`, durably (file and
    /// directory entry) before it is used.
    pub(super) fn create<C: RaftTypeConfig>(
        dir: &Path,
        number: u64,
        checkpoint: &Checkpoint<C>,
    ) -> Result<Active, LogStoreError> {
        let path = path(dir, number);
        let salt = rand::random::<u32>();
        let mut frame = FrameBuf::new();
        frame.push(&RecordRef::<C>::Checkpoint(checkpoint))?;
        let mut bytes = header(salt).to_vec();
        bytes.extend_from_slice(frame.seal(salt)?);
        let mut file = File::options()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(LogStoreError::io("creating", &path))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(LogStoreError::io("writing", &path))?;
        sync_dir(dir)?;
        Ok(Active {
            file,
            path,
            number,
            salt,
            bytes: bytes.len() as u64,
            max_index: None,
        })
    }

    /// Writes one frame and makes it durable (`fdatasync`).
    pub(super) fn write_frame(&mut self, frame: &mut FrameBuf) -> Result<(), LogStoreError> {
        let bytes = frame.seal(self.salt)?;
        self.file
            .write_all(bytes)
            .and_then(|()| self.file.sync_data())
            .map_err(LogStoreError::io("writing", &self.path))?;
        self.bytes += bytes.len() as u64;
        frame.clear();
        Ok(())
    }
}
