//! The log's files: cutting a torn tail, creating segments, finding
//! missing ones, and the vote file. (A missing end of the log is found
//! from the segments' end records, in `end_record`.)

use super::*;

/// Cuts the last segment's torn tail off, if it has one, durably.
pub(super) fn cut_torn_tail(dir: &Path, tail: &Tail) -> io::Result<()> {
    let Some(torn) = tail.torn else {
        return Ok(());
    };
    let path = segment_path(dir, tail.number);
    tracing::warn!(
        segment = %path.display(),
        offset = tail.intact_end,
        dropped_bytes = tail.file_bytes.saturating_sub(tail.intact_end),
        "torn write at the end of the log ({}): a write that never completed, so never acknowledged; cutting it off",
        torn.describe()
    );
    cut(&path, tail.intact_end as u64)
}

/// Cuts the file at `length` bytes, durably.
pub(super) fn cut(path: &Path, length: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(length)?;
    file.sync_all()
}

/// Creates segment `number` with its header (magic and first end
/// record), durably.
pub(super) fn create_segment(dir: &Path, number: u64) -> io::Result<File> {
    let mut file = crate::private_fs::options()
        .create_new(true)
        .write(true)
        .open(segment_path(dir, number))?;
    file.write_all(&new_header(number))?;
    file.sync_data()?;
    sync_dir(dir)?;
    Ok(file)
}

/// The numbers of the segment files in `dir`, in order.
pub(super) fn segment_numbers(dir: &Path) -> io::Result<Vec<u64>> {
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let number = name.strip_suffix(".log").and_then(|n| n.parse().ok());
        // Only names this module writes: `1.log` is not segment 1.
        if let Some(number) = number.filter(|number| segment_name(*number) == name) {
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// Refuses a gap in the segment numbers: segments are only ever deleted
/// from the front.
pub(super) fn check_no_gaps(dir: &Path, numbers: &[u64]) -> Result<(), LogDamage> {
    for pair in numbers.windows(2) {
        let &[before, after] = pair else {
            continue;
        };
        if after > before.saturating_add(1) {
            return Err(LogDamage::MissingSegments {
                dir: dir.to_path_buf(),
                first: before + 1,
                last: after - 1,
                why: format!(
                    "between {} and {}: segments are only ever deleted from the front",
                    segment_name(before),
                    segment_name(after)
                ),
            });
        }
    }
    Ok(())
}

/// Refuses missing segments before `first`, the first one present, unless
/// a purge deleted them: then a purge is on record, and the entries left
/// start right after the last purged one.
pub(super) fn check_nothing_missing_before(
    dir: &Path,
    first: u64,
    memory: &Memory,
) -> Result<(), LogDamage> {
    let missing = |why: String| LogDamage::MissingSegments {
        dir: dir.to_path_buf(),
        first: 0,
        last: first.saturating_sub(1),
        why,
    };
    let Some(purged) = memory.purged else {
        return Err(missing(format!(
            "the first segment present is {}, but nothing was ever purged, so no segment was ever deleted",
            segment_name(first)
        )));
    };
    let expected = purged.index.checked_add(1);
    match memory.entries.keys().next() {
        Some(&first_entry) if expected.is_some_and(|expected| first_entry > expected) => {
            Err(missing(format!(
                "the first segment present is {}, and log entries {} to {} (after the last purged one, {}) are in no segment left",
                segment_name(first),
                purged.index.saturating_add(1),
                first_entry.saturating_sub(1),
                purged.index
            )))
        }
        _ => Ok(()),
    }
}

pub(super) fn read_vote(dir: &Path) -> io::Result<Option<Vote>> {
    let file = dir.join(VOTE_FILE);
    let damaged = |why: String| LogDamage::Vote {
        file: file.clone(),
        why,
    };
    match std::fs::read(&file) {
        Ok(bytes) => {
            let Some((crc, body)) = bytes.split_first_chunk::<4>() else {
                return Err(damaged("shorter than its checksum".into()).into());
            };
            if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
                return Err(damaged("checksum mismatch".into()).into());
            }
            postcard::from_bytes(body)
                .map(Some)
                .map_err(|e| damaged(format!("does not decode: {e}")).into())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

pub(super) fn write_vote(dir: &Path, vote: &Vote) -> io::Result<()> {
    let body = postcard::to_allocvec(vote).map_err(io::Error::other)?;
    let mut bytes = crc32fast::hash(&body).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let tmp = dir.join(format!("{VOTE_FILE}.tmp"));
    let mut file = crate::private_fs::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(VOTE_FILE))?;
    sync_dir(dir)
}
