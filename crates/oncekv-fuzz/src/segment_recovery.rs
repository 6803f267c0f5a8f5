//! Target `segment_recovery`: the durable log's recovery from whatever its
//! directory holds. The input becomes segment files (and a vote file) in a
//! fresh directory, then `SegmentLog::open_inline` replays them (the same
//! replay as `SegmentLog::open`, writing on the caller's task).
//!
//! Input: `[flags u8][content]`. `flags`:
//!
//! - bit 0: every segment starts with the magic `oncekvL2`;
//! - bit 1: `content` is a list of items (below) instead of one segment's
//!   raw bytes;
//! - bit 2: a vote file, from `[length u8][body]` read first, behind its
//!   CRC-32, which bit 3 leaves unfixed (raw bytes);
//! - bits 4-5: the number of the first segment (0, 1, 2 or 9; segments
//!   deleted from the front after a purge);
//! - bit 6: stray files with names that are not segments.
//!
//! Items, by tag byte (`tag % 8`), so that the fuzzer gets past the
//! checksums to the records and the torn-tail rules:
//! 0 a frame `[length u16][body]` with correct checksums; 1 raw bytes
//! `[length u8][bytes]`; 2 a seal; 3 the next segment (at most 4); 4 a
//! frame with one body bit flipped after its checksum (`[bit u16][length
//! u16][body]`); 5 the same with a header bit flipped (`[bit u8]...`); 6 a
//! frame cut short (`[kept u16][length u16][body]`); 7 zeros (`[length
//! u8]`).
//!
//! Checked: `open` returns `Ok` or an error (a typed `LogDamage` or an I/O
//! error), never panics, in time linear in the bytes (libFuzzer's
//! `-timeout` and slow-unit report watch the time). A log that opens:
//!
//! - reads back: entries in increasing index order, each readable on its
//!   own, and a log state that names the last entry (or the last purged);
//! - reopens with the same entries, vote and log state (recovery cut any
//!   torn tail and sealed what it kept, durably);
//! - takes an append, a vote and a truncation, each there after a reopen.

use crate::input::Input;
use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::type_config::TypeConfig;
use openraft::alias::{EntryOf, LogIdOf, OneshotOf, VoteOf};
use openraft::async_runtime::Oneshot;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::testing::blank_ent;
use openraft::vote::RaftLeaderId;
use std::path::Path;

/// The first bytes of every segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"oncekvL2";
/// Most segment files an input makes.
const SEGMENTS_MAX: usize = 4;

/// A frame header for a body of `length` bytes with checksum `crc`.
pub fn frame_header(length: u32, crc: u32) -> [u8; 12] {
    let mut header = [0; 12];
    header[..4].copy_from_slice(&length.to_le_bytes());
    header[4..8].copy_from_slice(&crc.to_le_bytes());
    let header_crc = crc32fast::hash(&header[..8]);
    header[8..].copy_from_slice(&header_crc.to_le_bytes());
    header
}

/// A frame holding `body`, with correct checksums.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let length = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = frame_header(length, crc32fast::hash(body)).to_vec();
    out.extend_from_slice(body);
    out
}

/// The segment files and vote file an input describes.
#[derive(Debug, Default)]
struct Files {
    first_number: u64,
    segments: Vec<Vec<u8>>,
    vote: Option<Vec<u8>>,
    strays: bool,
}

fn files(data: &[u8]) -> Files {
    let mut input = Input::new(data);
    let flags = input.byte().unwrap_or(0);
    let magic = flags & 1 != 0;
    let start = || {
        if magic {
            SEGMENT_MAGIC.to_vec()
        } else {
            Vec::new()
        }
    };
    let mut files = Files {
        first_number: [0, 1, 2, 9][usize::from((flags >> 4) & 3)],
        strays: flags & 0x40 != 0,
        ..Files::default()
    };
    if flags & 4 != 0 {
        let length = input.byte().unwrap_or(0);
        let body = input.take(usize::from(length));
        files.vote = Some(if flags & 8 != 0 {
            body.to_vec()
        } else {
            let mut vote = crc32fast::hash(body).to_le_bytes().to_vec();
            vote.extend_from_slice(body);
            vote
        });
    }
    let mut segment = start();
    if flags & 2 == 0 {
        segment.extend_from_slice(input.rest());
        files.segments.push(segment);
        return files;
    }
    while let Some(tag) = input.byte() {
        match tag % 8 {
            0 => {
                let length = input.u16().unwrap_or(0);
                segment.extend(frame(input.take(usize::from(length))));
            }
            1 => {
                let length = input.byte().unwrap_or(0);
                segment.extend_from_slice(input.take(usize::from(length)));
            }
            2 => segment.extend(frame(&[])),
            3 => {
                if files.segments.len() + 1 < SEGMENTS_MAX {
                    files
                        .segments
                        .push(std::mem::replace(&mut segment, start()));
                }
            }
            4 => {
                let bit = usize::from(input.u16().unwrap_or(0));
                let length = input.u16().unwrap_or(0);
                let mut framed = frame(input.take(usize::from(length)));
                let body_bits = (framed.len() - 12) * 8;
                if body_bits > 0 {
                    let bit = bit % body_bits;
                    framed[12 + bit / 8] ^= 1 << (bit % 8);
                }
                segment.extend(framed);
            }
            5 => {
                let bit = usize::from(input.byte().unwrap_or(0)) % (12 * 8);
                let length = input.u16().unwrap_or(0);
                let mut framed = frame(input.take(usize::from(length)));
                framed[bit / 8] ^= 1 << (bit % 8);
                segment.extend(framed);
            }
            6 => {
                let kept = usize::from(input.u16().unwrap_or(0));
                let length = input.u16().unwrap_or(0);
                let framed = frame(input.take(usize::from(length)));
                segment.extend_from_slice(&framed[..kept.min(framed.len())]);
            }
            _ => {
                let length = input.byte().unwrap_or(0);
                segment.extend(std::iter::repeat_n(0, usize::from(length)));
            }
        }
    }
    files.segments.push(segment);
    files
}

fn segment_name(number: u64) -> String {
    format!("{number:010}.log")
}

fn write_files(dir: &Path, files: &Files) {
    std::fs::create_dir_all(dir).expect("log dir");
    for (offset, bytes) in files.segments.iter().enumerate() {
        let number = files.first_number + offset as u64;
        std::fs::write(dir.join(segment_name(number)), bytes).expect("segment file");
    }
    if let Some(vote) = &files.vote {
        std::fs::write(dir.join("vote"), vote).expect("vote file");
    }
    if files.strays {
        for name in ["1.log", "0000000000.log.tmp", "vote.tmp", "00000000000.log"] {
            std::fs::write(dir.join(name), b"not a segment").expect("stray file");
        }
    }
}

/// What a log holds, as read through its API.
#[derive(Debug, PartialEq)]
struct Contents {
    entries: Vec<EntryOf<TypeConfig>>,
    vote: Option<VoteOf<TypeConfig>>,
    state: LogState<TypeConfig>,
}

/// Reads everything back, checking that reads agree with each other.
async fn read_back(log: &mut SegmentLog) -> Contents {
    let entries = log.try_get_log_entries(..).await.expect("read the log");
    for pair in entries.windows(2) {
        assert!(
            pair[0].log_id.index < pair[1].log_id.index,
            "entries out of order: {} then {}",
            pair[0].log_id,
            pair[1].log_id
        );
    }
    for entry in &entries {
        let index = entry.log_id.index;
        let one = log
            .try_get_log_entries(index..=index)
            .await
            .expect("read one entry");
        assert!(
            one.len() == 1 && one[0] == *entry,
            "entry {index} reads back as {one:?}"
        );
    }
    let vote = log.read_vote().await.expect("read the vote");
    let state = log.get_log_state().await.expect("log state");
    let last = entries
        .last()
        .map(|entry| entry.log_id)
        .or(state.last_purged_log_id);
    assert_eq!(
        state.last_log_id, last,
        "log state names another last entry"
    );
    Contents {
        entries,
        vote,
        state,
    }
}

fn reopen(dir: &Path, before: &str) -> SegmentLog {
    SegmentLog::open_inline(dir)
        .unwrap_or_else(|e| panic!("a log that opened does not reopen {before}: {e}"))
}

async fn append(log: &mut SegmentLog, entry: EntryOf<TypeConfig>) {
    let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
    log.append([entry], IOFlushed::signal(tx))
        .await
        .expect("append to a recovered log");
    rx.await
        .expect("append callback fired")
        .expect("append durable");
}

/// Opens the log, and checks one that opens; whether it opened.
async fn recover(dir: &Path) -> bool {
    let Ok(mut log) = SegmentLog::open_inline(dir) else {
        return false;
    };
    let first = read_back(&mut log).await;
    drop(log);
    let mut log = reopen(dir, "unchanged");
    let again = read_back(&mut log).await;
    assert_eq!(first, again, "reopening changed the log");

    // An append after the last entry, in its term (or the first).
    let last = first.state.last_log_id;
    let Some(index) = last.map_or(Some(0), |id: LogIdOf<TypeConfig>| id.index.checked_add(1))
    else {
        return true;
    };
    let term = last.map_or(1, |id| id.leader_id.term().max(1));
    append(&mut log, blank_ent::<TypeConfig>(term, 1, index)).await;
    let term_voted = first.vote.map_or(0, |vote| vote.leader_id().term());
    let vote = VoteOf::<TypeConfig>::new(term_voted.saturating_add(1), 1);
    log.save_vote(&vote).await.expect("save a vote");
    let appended = read_back(&mut log).await;
    drop(log);
    let mut log = reopen(dir, "after an append and a vote");
    let after = read_back(&mut log).await;
    assert_eq!(appended, after, "the append or vote did not survive");
    assert_eq!(after.vote, Some(vote), "the vote did not survive");
    assert_eq!(
        after.entries.len(),
        first.entries.len() + 1,
        "the append did not add one entry"
    );

    // Truncated back to where it was.
    log.truncate_after(last).await.expect("truncate");
    drop(log);
    let mut log = reopen(dir, "after a truncation");
    let truncated = read_back(&mut log).await;
    assert_eq!(
        truncated.entries, first.entries,
        "the truncation did not restore the entries"
    );
    true
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
}

/// Runs one input; panics when a property breaks.
pub fn segment_recovery(data: &[u8]) {
    opens(data);
}

/// Runs one input and returns whether the log opened; panics when a
/// property breaks.
pub fn opens(data: &[u8]) -> bool {
    let files = files(data);
    let dir = crate::scratch_dir("oncekv-fuzz-segments");
    let log_dir = dir.path().join("log");
    write_files(&log_dir, &files);
    RUNTIME.with(|runtime| runtime.block_on(recover(&log_dir)))
}
