//! The frame format: records encoded and framed under one checksum, the
//! frame header with its own checksum, the seal, and the checks that locate
//! a single flipped bit or find intact frames after damage.

use super::*;

pub(super) fn encode(record: &Record, out: &mut Vec<u8>) -> io::Result<()> {
    let taken = std::mem::take(out);
    *out = postcard::to_extend(record, taken)
        .map_err(|e| io::Error::other(format!("log record does not encode: {e}")))?;
    Ok(())
}

/// Frames `records` (encoded, concatenated) behind their header.
pub(super) fn frame<'a>(records: impl Iterator<Item = &'a [u8]> + Clone) -> io::Result<Vec<u8>> {
    let length: usize = records.clone().map(<[u8]>::len).sum();
    let length = u32::try_from(length)
        .map_err(|_| io::Error::other("log write larger than 4 GiB in one frame"))?;
    let mut crc = crc32fast::Hasher::new();
    records.clone().for_each(|bytes| crc.update(bytes));
    let mut out = Vec::with_capacity(HEADER_BYTES + length as usize);
    out.extend_from_slice(&frame_header(length, crc.finalize()));
    records.for_each(|bytes| out.extend_from_slice(bytes));
    Ok(out)
}

/// The header of a frame whose body has `length` bytes and checksum `crc`.
pub(super) fn frame_header(length: u32, crc: u32) -> [u8; HEADER_BYTES] {
    let mut header = [0; HEADER_BYTES];
    header[..4].copy_from_slice(&length.to_le_bytes());
    header[4..8].copy_from_slice(&crc.to_le_bytes());
    let header_crc = crc32fast::hash(&header[..8]);
    header[8..].copy_from_slice(&header_crc.to_le_bytes());
    header
}

/// The seal: a frame with an empty body, put after the last synced frame.
pub(super) fn seal() -> [u8; HEADER_BYTES] {
    frame_header(0, crc32fast::hash(&[]))
}

/// The name of segment `number`'s file.
pub(super) fn segment_name(number: u64) -> String {
    format!("{number:010}.log")
}

pub(super) fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(segment_name(number))
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A frame header whose checksum matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    /// Length of the body.
    pub(super) length: u32,
    /// Checksum of the body.
    pub(super) body_crc: u32,
}

/// The header `raw`, if its checksum matches.
pub(super) fn parse_header(raw: &[u8; HEADER_BYTES]) -> Option<Header> {
    let [l0, l1, l2, l3, c0, c1, c2, c3, h0, h1, h2, h3] = *raw;
    let header_crc = u32::from_le_bytes([h0, h1, h2, h3]);
    (crc32fast::hash(&raw[..8]) == header_crc).then_some(Header {
        length: u32::from_le_bytes([l0, l1, l2, l3]),
        body_crc: u32::from_le_bytes([c0, c1, c2, c3]),
    })
}

/// The 12 bytes at `at`, if the file holds that many there.
pub(super) fn header_bytes_at(bytes: &[u8], at: usize) -> Option<&[u8; HEADER_BYTES]> {
    bytes.get(at..)?.first_chunk::<HEADER_BYTES>()
}

/// Where the body of a frame starting at `at` with a body of `length`
/// bytes lies; `None` if that overflows (lengths come from disk).
pub(super) fn body_range(at: usize, length: u32) -> Option<std::ops::Range<usize>> {
    let start = at.checked_add(HEADER_BYTES)?;
    let end = start.checked_add(usize::try_from(length).ok()?)?;
    Some(start..end)
}

/// Decodes a body's records; `None` if they do not decode.
pub(super) fn decode_records(body: &[u8]) -> Option<Vec<Record>> {
    let mut records = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (record, after) = postcard::take_from_bytes(rest).ok()?;
        records.push(record);
        rest = after;
    }
    Some(records)
}

/// If exactly one flipped bit turns a body of `length` bytes whose checksum
/// was `written` into one whose checksum is `found`, where that bit is: its
/// byte in the body, and the bit in that byte (0 the least significant).
///
/// CRC-32 is linear: for two messages of the same length, the checksums
/// differ by the checksum (without initial value or final xor) of the
/// messages' difference. For a single bit that is `n` register steps from
/// the end of the message, that checksum is the register `1` stepped `n`
/// times, so walking `n` over the body's bits finds the bit, if any. Linear
/// in the length, and run only on a frame that failed its checksum.
pub(super) fn single_flipped_bit(length: usize, written: u32, found: u32) -> Option<(usize, u8)> {
    let syndrome = written ^ found;
    let bits = length.checked_mul(8)?;
    let mut register = 1u32;
    for steps in 1..=bits {
        register = if register & 1 == 1 {
            (register >> 1) ^ CRC32_POLYNOMIAL
        } else {
            register >> 1
        };
        if register == syndrome {
            // `steps` = 8 * (bytes from this one to the end) - bit.
            let bytes_to_end = steps.div_ceil(8);
            let bit = u8::try_from(bytes_to_end * 8 - steps).ok()?;
            return Some((length.checked_sub(bytes_to_end)?, bit));
        }
    }
    None
}

/// Whether the body of the frame `at..end` holds a sector (by file offset)
/// of nothing but zeros, other than the sectors its header is in (the
/// header is intact, so those reached the disk): a sector that never did.
pub(super) fn has_zero_sector(bytes: &[u8], at: usize, end: usize) -> bool {
    let Some(mut sector) = at
        .checked_add(HEADER_BYTES)
        .and_then(|header_end| header_end.checked_next_multiple_of(SECTOR_BYTES))
    else {
        return false;
    };
    while sector < end {
        let stop = sector.saturating_add(SECTOR_BYTES).min(end);
        if bytes
            .get(sector..stop)
            .is_some_and(|sector| sector.iter().all(|byte| *byte == 0))
        {
            return true;
        }
        sector = stop;
    }
    false
}

/// What follows a header whose checksum does not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Following {
    /// No intact frame or seal starts anywhere after it.
    Nothing,
    /// An intact frame or seal starts at this offset.
    Intact(usize),
    /// More frame-like headers than the search may check bodies for.
    TooManyCandidates,
}

/// What a search for intact frames cost, for the tests that hold it to
/// linear.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SearchCost {
    /// Offsets at which a header checksum was computed.
    pub(super) headers_checked: u64,
    /// Body bytes checksummed.
    pub(super) body_bytes_checked: u64,
}

/// Looks for an intact frame or seal starting anywhere in `bytes[from..]`.
/// One pass: a header's checksum is computed only where its length fits
/// in the file, a body's only behind an intact header, and the body bytes
/// checksummed are capped at the number of bytes searched; past the cap the
/// answer is [`Following::TooManyCandidates`] (and the damage is refused)
/// instead of a rescan. So the work is linear in the bytes searched, even
/// for bytes crafted to hold a frame-like header at every offset.
pub(super) fn search_intact_after(bytes: &[u8], from: usize) -> (Following, SearchCost) {
    let seal = seal();
    let cap = u64::try_from(bytes.len().saturating_sub(from)).unwrap_or(u64::MAX);
    let mut cost = SearchCost::default();
    for at in from..bytes.len() {
        // Fewer than a header's bytes left: nothing starts here or later.
        let Some(raw) = header_bytes_at(bytes, at) else {
            break;
        };
        let length = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if length == 0 {
            if *raw == seal {
                return (Following::Intact(at), cost);
            }
            continue;
        }
        let Some(body) = body_range(at, length).filter(|body| body.end <= bytes.len()) else {
            continue;
        };
        cost.headers_checked += 1;
        let Some(header) = parse_header(raw) else {
            continue;
        };
        let body_bytes = u64::try_from(body.len()).unwrap_or(u64::MAX);
        match cost.body_bytes_checked.checked_add(body_bytes) {
            Some(total) if total <= cap => cost.body_bytes_checked = total,
            _ => return (Following::TooManyCandidates, cost),
        }
        if bytes
            .get(body)
            .is_some_and(|body| crc32fast::hash(body) == header.body_crc)
        {
            return (Following::Intact(at), cost);
        }
    }
    (Following::Nothing, cost)
}

/// If flipping one bit of the header `raw` of the frame at `at` gives a
/// header that checks and describes a complete frame whose body checks
/// (and is not a seal's, which holds nothing): where that bit is in the
/// header, and which bit of the byte.
pub(super) fn flipped_header_bit(
    bytes: &[u8],
    at: usize,
    raw: &[u8; HEADER_BYTES],
) -> Option<(usize, u8)> {
    for byte in 0..HEADER_BYTES {
        for bit in 0..8u8 {
            let mut repaired = *raw;
            repaired[byte] ^= 1 << bit;
            let Some(header) = parse_header(&repaired) else {
                continue;
            };
            if header.length == 0 {
                continue;
            }
            let intact = body_range(at, header.length)
                .and_then(|body| bytes.get(body))
                .is_some_and(|body| crc32fast::hash(body) == header.body_crc);
            if intact {
                return Some((byte, bit));
            }
        }
    }
    None
}
