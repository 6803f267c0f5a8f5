//! Why a log refuses to open ([`LogDamage`], [`DamageKind`]): its files are
//! not what this module wrote, or not all of them are there.

use super::*;

/// Why the log refuses to open: its files are not what this module wrote,
/// or not all of them are there. Never a torn tail, which is cut instead.
/// Carried as an [`io::Error`] of kind [`io::ErrorKind::InvalidData`]
/// (`error.get_ref()` downcasts to it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogDamage {
    /// A frame of a segment is damaged.
    #[error(
        "log segment {} is damaged: the frame at byte {offset} {kind}. That is not what a crash leaves (a torn write), so nothing was cut and the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display()
    )]
    Frame {
        /// The segment file.
        file: PathBuf,
        /// Where the damaged frame starts in it.
        offset: u64,
        /// What is wrong with it.
        kind: DamageKind,
    },
    /// A segment does not start with a segment magic.
    #[error(
        "log segment {} does not start with the log segment magic \"oncekvL3\" (or \"oncekvL2\", of earlier versions): it is damaged or not a log segment, and the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display()
    )]
    NoMagic {
        /// The segment file.
        file: PathBuf,
    },
    /// A segment's header (its magic and end record) is damaged or
    /// missing, or its end record contradicts the file.
    #[error(
        "log segment {} has a damaged or missing header: {why}. The log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display()
    )]
    Header {
        /// The segment file.
        file: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A segment ends before the end its end record says was synced:
    /// synced, acknowledged writes are gone (the file was truncated or
    /// overwritten). Never a torn write, which only ever lies beyond it.
    #[error(
        "log segment {} ends before its synced end: its end record says it was synced through byte {synced_bytes} ({}), but its intact frames end at byte {found_bytes} ({}; the file is {file_bytes} bytes long). Synced, acknowledged writes are gone (the file was truncated or overwritten): that is not what a crash leaves, so nothing was cut and the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display(),
        entries_through(*synced_index),
        entries_through(*found_index)
    )]
    SyncedEndMissing {
        /// The segment file.
        file: PathBuf,
        /// The end record's synced end.
        synced_bytes: u64,
        /// The end record's last index.
        synced_index: Option<u64>,
        /// Where the segment's intact frames end.
        found_bytes: u64,
        /// The highest entry index in them.
        found_index: Option<u64>,
        /// The size of the file.
        file_bytes: u64,
    },
    /// The last segment is closed: the log went on in a segment that is
    /// gone.
    #[error(
        "log segment {} was closed and continued in {} (its end record says so, durably), but {} is missing: the end of the log is gone, with acknowledged entries, so the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display(),
        missing.display(),
        missing.display()
    )]
    SuccessorMissing {
        /// The closed segment, the last one present.
        file: PathBuf,
        /// The segment it continued in.
        missing: PathBuf,
    },
    /// The log directory holds a vote but no segment: a node that voted
    /// always has a log.
    #[error(
        "log segments missing: {} has a vote but no segment (a log's first segment is created before the node ever votes): acknowledged entries may be gone, so the log does not open: rebuild this node from its peers (docs/operations.md)",
        dir.display()
    )]
    NoSegments {
        /// The log directory.
        dir: PathBuf,
    },
    /// Segments are missing between or before the ones present.
    #[error(
        "log segments {} to {} are missing from {} ({why}): acknowledged entries may be gone, so the log does not open: rebuild this node from its peers (docs/operations.md)",
        segment_name(*first),
        segment_name(*last),
        dir.display()
    )]
    MissingSegments {
        /// The log directory.
        dir: PathBuf,
        /// The first missing segment number.
        first: u64,
        /// The last missing segment number.
        last: u64,
        /// How that is known.
        why: String,
    },
    /// The vote file is damaged.
    #[error(
        "vote file {} is damaged ({why}), so the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display()
    )]
    Vote {
        /// The vote file.
        file: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// "entries up to index N", or "no entry".
fn entries_through(index: Option<u64>) -> String {
    match index {
        Some(index) => format!("entries up to index {index}"),
        None => "no entry".to_string(),
    }
}

impl From<LogDamage> for io::Error {
    fn from(damage: LogDamage) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, damage)
    }
}

/// What is wrong with a damaged frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageKind {
    /// Its length and header checksum are intact and its whole body is
    /// there, but the body checksum does not match.
    BodyChecksum,
    /// As [`DamageKind::BodyChecksum`], and one flipped bit explains the
    /// mismatch: bit `bit` (0 the least significant) of the byte at file
    /// offset `byte`.
    FlippedBodyBit {
        /// File offset of the byte.
        byte: u64,
        /// The bit in it.
        bit: u8,
    },
    /// Its header checksum does not match, and intact log data follows.
    HeaderChecksum,
    /// Its header checksum does not match, but flipping bit `bit` of the
    /// byte at file offset `byte` back makes it match and the frame it then
    /// describes is intact.
    FlippedHeaderBit {
        /// File offset of the byte.
        byte: u64,
        /// The bit in it.
        bit: u8,
    },
    /// Its header checksum does not match, and the bytes after it hold too
    /// many frame-like headers to prove that none is intact within a
    /// linear search.
    HeaderChecksumUnresolved,
    /// Both checksums match, but its records do not decode.
    UndecodableRecords,
    /// The segment ends inside it, and it is not the last segment.
    Truncated,
}

impl Display for DamageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DamageKind::BodyChecksum => write!(
                f,
                "is complete (its length and header checksum are intact, the whole body is there) but its body checksum does not match"
            ),
            DamageKind::FlippedBodyBit { byte, bit } => write!(
                f,
                "is complete (its length and header checksum are intact, the whole body is there) but its body checksum does not match: bit {bit} of byte {byte} is flipped"
            ),
            DamageKind::HeaderChecksum => write!(
                f,
                "has a header whose checksum does not match, and intact log data follows it"
            ),
            DamageKind::FlippedHeaderBit { byte, bit } => write!(
                f,
                "has a header whose checksum does not match: bit {bit} of byte {byte} is flipped (flipped back, the frame is intact)"
            ),
            DamageKind::HeaderChecksumUnresolved => write!(
                f,
                "has a header whose checksum does not match, followed by too many frame-like bytes to prove it is a torn write"
            ),
            DamageKind::UndecodableRecords => {
                write!(f, "has matching checksums but records that do not decode")
            }
            DamageKind::Truncated => write!(
                f,
                "is cut short by the end of the file, and this is not the last segment"
            ),
        }
    }
}
