//! Reading one segment back: every frame judged whole, torn (cut) or
//! damaged (refused), in one linear pass.

use super::*;

/// Why the end of the last segment is taken for a torn write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TornTail {
    /// It ends inside the magic: a crash while the segment was created.
    InsideMagic,
    /// It ends inside an L3 segment's header (magic and end record): a
    /// crash while the segment was created.
    InsideHeader,
    /// It ends inside a frame: fewer bytes than a header, or than the
    /// header says.
    ShortFrame,
    /// A header whose checksum does not match, with nothing intact after it.
    BadHeader,
    /// The last frame, never sealed, has a body with a sector of zeros, and
    /// no single flipped bit explains its checksum.
    UnwrittenSector,
}

impl TornTail {
    pub(super) fn describe(self) -> &'static str {
        match self {
            TornTail::InsideMagic => "the file ends inside the segment magic",
            TornTail::InsideHeader => "the file ends inside the segment header",
            TornTail::ShortFrame => "the file ends inside a frame",
            TornTail::BadHeader => {
                "a frame header that does not check, with nothing intact after it"
            }
            TornTail::UnwrittenSector => {
                "the last frame, never sealed, has a sector that never reached the disk"
            }
        }
    }
}

/// A segment's bytes, judged.
pub(super) struct ScannedSegment {
    pub(super) records: Vec<Record>,
    /// Where the intact part (magic, frames, seals) ends: the file is cut
    /// there if the rest is a torn tail. 0 if not even the magic is whole.
    pub(super) intact_end: usize,
    /// Where the seal that ends the intact part starts, if it ends with one.
    pub(super) trailing_seal: Option<usize>,
    /// The torn tail after `intact_end`, if there is one.
    pub(super) torn: Option<TornTail>,
    /// Its newest valid end record (L3, with a whole header).
    pub(super) end: Option<EndRecord>,
    /// Whether a frame ends (or the frames start) exactly at the end
    /// record's synced end: always, in a segment this module wrote.
    pub(super) synced_end_is_frame_end: bool,
}

/// Why a segment's bytes are refused (the file is named by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SegmentFault {
    NoMagic,
    Frame {
        offset: usize,
        kind: DamageKind,
    },
    /// An L3 segment, not the last, that ends inside its header.
    ShortHeader {
        bytes: usize,
    },
    /// An L3 segment whose end record checks in neither slot.
    NoEndRecord,
}

impl SegmentFault {
    pub(super) fn in_file(self, file: &Path) -> LogDamage {
        match self {
            SegmentFault::NoMagic => LogDamage::NoMagic {
                file: file.to_path_buf(),
            },
            SegmentFault::Frame { offset, kind } => LogDamage::Frame {
                file: file.to_path_buf(),
                offset: u64::try_from(offset).unwrap_or(u64::MAX),
                kind,
            },
            SegmentFault::ShortHeader { bytes } => LogDamage::Header {
                file: file.to_path_buf(),
                why: format!(
                    "the file ends inside its header ({bytes} bytes), and this is not the last segment"
                ),
            },
            SegmentFault::NoEndRecord => LogDamage::Header {
                file: file.to_path_buf(),
                why: "neither copy of its end record checks".into(),
            },
        }
    }
}

/// One frame, judged.
pub(super) enum Judged {
    /// Intact (a seal has no records), ending at `end`.
    Intact { records: Vec<Record>, end: usize },
    /// The torn tail starts here.
    Torn(TornTail),
}

/// Replays a segment's bytes; `last` if it is the last segment, the only
/// one that may end in a torn tail, and only beyond its end record's
/// synced end. See the module doc for the rules. Whether that end is
/// there is for the caller to judge ([`check_ends`]): this judges frames.
pub(super) fn scan_segment(bytes: &[u8], last: bool) -> Result<ScannedSegment, SegmentFault> {
    let mut scanned = ScannedSegment {
        records: Vec::new(),
        intact_end: 0,
        trailing_seal: None,
        torn: None,
        end: None,
        synced_end_is_frame_end: false,
    };
    let Some(format) = Format::of(bytes) else {
        let inside_magic = bytes.len() < MAGIC_BYTES
            && (SEGMENT_MAGIC.starts_with(bytes) || SEGMENT_MAGIC_L2.starts_with(bytes));
        if last && inside_magic {
            if !bytes.is_empty() {
                scanned.torn = Some(TornTail::InsideMagic);
            }
            return Ok(scanned);
        }
        return Err(SegmentFault::NoMagic);
    };
    let mut at = format.frames_start();
    // Frames before the synced end were synced: judged as in a segment
    // that is not the last (anything wrong is damage), unless the file is
    // shorter than that end, which the caller refuses anyway (judged
    // leniently here, to say where its intact frames end).
    let mut synced_end = at;
    if format == Format::L3 {
        if bytes.len() < at {
            if last {
                scanned.torn = Some(TornTail::InsideHeader);
                return Ok(scanned);
            }
            return Err(SegmentFault::ShortHeader { bytes: bytes.len() });
        }
        let end = newest_end(bytes).ok_or(SegmentFault::NoEndRecord)?;
        synced_end = usize::try_from(end.synced_bytes).unwrap_or(usize::MAX);
        scanned.end = Some(end);
    }
    let short = bytes.len() < synced_end;
    scanned.intact_end = at;
    scanned.synced_end_is_frame_end = at == synced_end;
    while at < bytes.len() {
        // The zeros the writer prepares ahead of its frames: no frame
        // starts with twelve zero bytes (a seal's header checksum is not
        // zero), so the intact part ends here. Zeros where the end record
        // says frames were synced are refused by the caller, as missing.
        if format == Format::L3 && zeros_from(bytes, at) {
            break;
        }
        let may_tear = last && (short || at >= synced_end);
        match judge_frame(bytes, at, may_tear)? {
            Judged::Intact { records, end } => {
                if records.is_empty() {
                    scanned.trailing_seal = Some(at);
                } else {
                    scanned.trailing_seal = None;
                    scanned.records.extend(records);
                }
                at = end;
                scanned.intact_end = end;
                if at == synced_end {
                    scanned.synced_end_is_frame_end = true;
                }
            }
            Judged::Torn(why) => {
                scanned.torn = Some(why);
                break;
            }
        }
    }
    Ok(scanned)
}

/// Judges the frame starting at `at` (inside `bytes`); `may_tear` if it
/// may be a torn write (in the last segment, beyond the synced end).
pub(super) fn judge_frame(bytes: &[u8], at: usize, may_tear: bool) -> Result<Judged, SegmentFault> {
    let damage = |kind| SegmentFault::Frame { offset: at, kind };
    let short = if may_tear {
        Ok(Judged::Torn(TornTail::ShortFrame))
    } else {
        Err(damage(DamageKind::Truncated))
    };
    let Some(raw) = header_bytes_at(bytes, at) else {
        return short;
    };
    let Some(header) = parse_header(raw) else {
        return judge_bad_header(bytes, at, raw, may_tear);
    };
    let Some(body_at) = body_range(at, header.length).filter(|body| body.end <= bytes.len()) else {
        return short;
    };
    let end = body_at.end;
    let body_start = body_at.start;
    let Some(body) = bytes.get(body_at) else {
        return short;
    };
    let found = crc32fast::hash(body);
    if found == header.body_crc {
        return match decode_records(body) {
            Some(records) => Ok(Judged::Intact { records, end }),
            None => Err(damage(DamageKind::UndecodableRecords)),
        };
    }
    if let Some((byte, bit)) = single_flipped_bit(body.len(), header.body_crc, found) {
        let byte = body_start.saturating_add(byte);
        return Err(damage(DamageKind::FlippedBodyBit {
            byte: u64::try_from(byte).unwrap_or(u64::MAX),
            bit,
        }));
    }
    // Anything after a frame (a seal, a frame, even a torn one) was written
    // after it was synced: only the very last bytes of the file (before
    // the zeros prepared for them) can be a write that never completed.
    if may_tear && zeros_from(bytes, end) && has_zero_sector(bytes, at, end) {
        return Ok(Judged::Torn(TornTail::UnwrittenSector));
    }
    Err(damage(DamageKind::BodyChecksum))
}

/// Whether `bytes` from `at` on are all zeros (none left counts).
fn zeros_from(bytes: &[u8], at: usize) -> bool {
    bytes
        .get(at..)
        .is_none_or(|rest| rest.iter().all(|byte| *byte == 0))
}

/// Judges a frame at `at` whose header `raw` does not check.
pub(super) fn judge_bad_header(
    bytes: &[u8],
    at: usize,
    raw: &[u8; HEADER_BYTES],
    may_tear: bool,
) -> Result<Judged, SegmentFault> {
    let damage = |kind| Err(SegmentFault::Frame { offset: at, kind });
    if let Some((byte, bit)) = flipped_header_bit(bytes, at, raw) {
        let byte = at.saturating_add(byte);
        return damage(DamageKind::FlippedHeaderBit {
            byte: u64::try_from(byte).unwrap_or(u64::MAX),
            bit,
        });
    }
    if !may_tear {
        return damage(DamageKind::HeaderChecksum);
    }
    match search_intact_after(bytes, at.saturating_add(1)).0 {
        Following::Nothing => Ok(Judged::Torn(TornTail::BadHeader)),
        Following::Intact(_) => damage(DamageKind::HeaderChecksum),
        Following::TooManyCandidates => damage(DamageKind::HeaderChecksumUnresolved),
    }
}

/// Reads and judges one segment file; also returns its size. Cuts
/// nothing: that waits until the whole log is known to open.
pub(super) fn read_segment(path: &Path, last: bool) -> io::Result<(ScannedSegment, usize)> {
    let bytes = std::fs::read(path)?;
    let scanned = scan_segment(&bytes, last).map_err(|fault| fault.in_file(path))?;
    Ok((scanned, bytes.len()))
}
