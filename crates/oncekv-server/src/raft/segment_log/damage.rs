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
    /// A segment does not start with the segment magic.
    #[error(
        "log segment {} does not start with the log segment magic \"oncekvL2\": it is damaged or not a log segment, and the log does not open: rebuild this node from its peers (docs/operations.md)",
        file.display()
    )]
    NoMagic {
        /// The segment file.
        file: PathBuf,
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
